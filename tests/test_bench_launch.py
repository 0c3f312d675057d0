"""CPU tests of how the benchmark harness launches things: the configs' flags as SGLang 0.5.17 parses them, the
bench driver against the real bench_serving and a fake one, the server lifecycle (early death, timeouts, signals),
the start-time guess and the knobs recorded with a server."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# benchmarks/ is a folder at the repository root, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import bench_driver, configs, run_clock, server, serving_run, workload
from benchmarks.client import generate_all
from bench_fakes import data_dir, fake_bench, tiny_tokenizer_dir  # noqa: F401  (pytest fixtures)
from bench_fakes import FAKE_SERVER, fake_server, wait_dead


def test_config_flags_parse_with_sglang_cli_and_bad_names_fail_early() -> None:
    """Every flag we pass exists in launch_server's parser; a bad config name or knob fails at argument parsing."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    from sglang_sparsespec.patches.spec_algo import route_attention

    def parse(cfg: configs.ServerConfig) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        return parser.parse_args(["--model-path", "m", *cfg.flags])

    # Every PILLAR config has a FlashInfer twin: the same flags but the backend, which PILLAR's validator
    # routes (prefill on FlashInfer, decode and verify on Triton).
    for name in ("pillar-flashinfer", "pillar-k4-coarse-flashinfer:recent_window=16"):
        twin = configs.resolve_config(name.replace("-flashinfer", ""))
        ns = parse(cfg := configs.resolve_config(name))
        assert [f for f in cfg.flags if f != "flashinfer"] == [f for f in twin.flags if f != "triton"]
        assert cfg.env == twin.env
        ns.get_attention_backends = lambda ns=ns: ServerArgs.get_attention_backends(ns)
        assert ns.attention_backend == "flashinfer" and route_attention(ns) is None
        routed = (ns.prefill_attention_backend, ns.decode_attention_backend, ns.speculative_attention_mode)
        assert routed == ("flashinfer", "triton", "decode")
    on = configs.with_radix_cache(configs.resolve_config("stock", ("--chunked-prefill-size", "512")))
    ns = parse(on)
    assert not ns.disable_radix_cache and ns.chunked_prefill_size == 512
    assert configs.flag_value(on.flags, "--page-size") == "1"
    for name in ("stock", "stock-flashinfer", "ngram", "pillar-k4-streaming:recent_window=16"):
        ns = parse(cfg := configs.resolve_config(name))
        assert ns.disable_radix_cache and ns.cuda_graph_max_bs_decode == 256 and ns.page_size == 1
    assert ns.speculative_algorithm == "PILLAR" and ns.speculative_num_steps == 4
    assert dict(cfg.env) == {"SPARSESPEC_POLICY": "streaming", "SPARSESPEC_RECENT_WINDOW": "16"}
    assert cfg.pillar_config({})["recent_window"] == 16
    assert configs.file_stem(cfg.name) == "pillar-k4-streaming.recent_window-16"
    bad = {
        "eagle": "unknown config",
        "pillar-k0": "at least 1",
        "stock:recent_window=16": "'stock' takes none",
        "pillar:foo=1": "unknown PILLAR knob 'foo'",
        "pillar:budget_ratio=2": "BUDGET_RATIO must be in",
        "pillar-streaming:policy=pillar": "the -streaming suffix already sets the policy",
        "pillar:sink_tokens=1:sink_tokens=2": "sink_tokens given twice",
        "pillar-flashinfer-k4": "unknown config",
    }
    for name, message in bad.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            configs.resolve_config(name)


def test_bench_driver_with_the_real_bench_serving(tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    """SGLang's bench module imports in the driver and knows every flag the harness passes; the prompt file
    loads through its own ``custom`` dataset reader."""
    from sglang.benchmark.datasets.custom import sample_custom_requests

    tok = workload.load_tokenizer(str(tiny_tokenizer_dir))
    prompts = workload.build_prompts(tok, data_dir, 6)
    assert [p.source for p in prompts] == ["aime24:0", "aime24:1", "aime24:2", "amc23:0", "aime24:0", "aime24:1"]
    assert prompts[0].text.startswith("<|user|> w0 w1\nPlease reason step by step")
    path = tmp_path / "bench.jsonl"
    workload.write_bench_serving_file(path, prompts)
    rows = sample_custom_requests(str(path), 6, tok, fixed_output_len=64)
    assert {r.output_len for r in rows} == {64} and sorted(r.prompt for r in rows) == sorted(p.text for p in prompts)

    argv = serving_run.bench_argv(
        "http://h:1", "/m", serving_run.Workload(16, 0.6, 0.95, {1: path}), 1, 1, tmp_path / "o"
    )
    assert argv[argv.index("--request-rate") + 1] == "inf"  # bench_serving's own default, spelled out
    with bench_driver.BenchDriver(tmp_path / "driver.log") as driver:
        assert driver.run(["--help"], tmp_path / "help.log", 300, lambda: None) == 0
    text = (tmp_path / "help.log").read_text()
    assert "Benchmark the online serving throughput" in text
    assert not [f for f in argv if f.startswith("--") and f not in text]


def test_bench_driver_reports_and_recovers(fake_bench: str, tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    with bench_driver.BenchDriver(tmp_path / "driver.log") as driver:
        assert driver.run(["--fake-mode", "exit"], log, 60, lambda: None) == 3
        pid = driver.proc.pid if driver.proc else None
        assert driver.run(["--fake-mode", "raise"], log, 60, lambda: None) == 1
        assert driver.proc is not None and driver.proc.pid == pid  # one import served both runs
        assert "ValueError: fake bench failure" in log.read_text()
        assert "fake bench module imported" in (tmp_path / "driver.log").read_text()
        with pytest.raises(TimeoutError):
            driver.run(["--fake-mode", "hang"], log, 1.5, lambda: None)
        assert driver.proc is None and wait_dead(pid)  # type: ignore[arg-type]

        def server_died() -> None:
            raise server.ServerError("server exited with code 9")

        with pytest.raises(server.ServerError):
            driver.run(["--fake-mode", "hang"], log, 60, server_died)
        assert driver.run(["--fake-mode", "exit"], log, 60, lambda: None) == 3  # a fresh driver
    broken = bench_driver.BenchDriver(tmp_path / "broken.log", module="no_such_module_here")
    with pytest.raises(bench_driver.DriverError, match="exited with code 1"):
        broken.run([], log, 60, lambda: None)


def test_server_early_death_and_startup_timeout(tmp_path: Path) -> None:
    srv = fake_server(tmp_path, FAKE_MODE="exit_early")
    with pytest.raises(server.ServerError, match="exited with code 3") as e, srv:
        srv.start(timeout_s=60, poll_s=0.1)
    assert "CUDA out of memory (fake)" in str(e.value) and srv.proc is None
    pidfile = tmp_path / "child.pid"
    srv = fake_server(tmp_path, FAKE_MODE="never_healthy", FAKE_CHILD_PIDFILE=str(pidfile))
    with pytest.raises(server.ServerError, match="not healthy after"):
        srv.start(timeout_s=2, poll_s=0.2)
    assert srv.proc is None and wait_dead(int(pidfile.read_text()))


def test_server_stop_kills_children_and_death_mid_run_is_detected(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    srv = fake_server(tmp_path, FAKE_CHILD_PIDFILE=str(pidfile), FAKE_MODE="die_on_second_generate")
    with srv:
        srv.start(timeout_s=30, poll_s=0.1)
        leader, child = srv.proc.pid, int(pidfile.read_text())
        out = generate_all(srv, [[2, 3]], {"max_new_tokens": 5}, concurrency=1, timeout_s=20)
        assert out[0].output_ids == [5, 12, 19, 26, 33]
        with pytest.raises(server.ServerError, match="exited with code 9"):
            generate_all(srv, [[2, 3]] * 3, {"max_new_tokens": 5}, concurrency=1, timeout_s=20)
    assert wait_dead(leader) and wait_dead(child)
    srv.stop()  # idempotent


def test_sigterm_to_harness_stops_server(tmp_path: Path) -> None:
    """A harness killed with SIGTERM (a tool's timeout) takes its server group down with it."""
    pidfile, ready = tmp_path / "child.pid", tmp_path / "ready"
    harness = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from pathlib import Path
        from benchmarks import server
        server.install_signal_handlers()
        port = server.free_port()
        s = server.Server([sys.executable, {str(FAKE_SERVER)!r}, "--port", str(port)], port=port,
                          log_path=Path({str(tmp_path / "h.log")!r}), env={{"FAKE_CHILD_PIDFILE": {str(pidfile)!r}}})
        with s:
            s.start(timeout_s=30, poll_s=0.1)
            Path({str(ready)!r}).write_text(str(s.proc.pid))
            time.sleep(120)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", harness])
    try:
        end = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < end:
            time.sleep(0.1)
        leader = int(ready.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert wait_dead(leader) and wait_dead(int(pidfile.read_text()))
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_server_start_guess_comes_from_the_same_config_family():
    """A slow stock start (FlashInfer's JIT on a fresh node) must not make the PILLAR start after it
    look too slow to fit the budget (flashinfer-ce113f5-2048 skipped one that took 94 s)."""
    clock = run_clock.RunClock()
    assert clock.startup_guess("pillar-flashinfer") == run_clock.START_GUESS_FLOOR_S
    clock.record_start("stock-flashinfer", 245.0)
    assert clock.startup_guess("stock") == 245.0
    assert clock.startup_guess("pillar-flashinfer") == run_clock.START_GUESS_FLOOR_S
    clock.record_start("pillar:adaptive_steps=off", 300.0)
    clock.record_start("pillar-coarse", 120.0)
    assert clock.startup_guess("pillar-flashinfer") == 300.0  # the family's slowest
    clock.record_start("stock", 30.0)
    assert clock.startup_guess("stock-flashinfer") == 245.0


def test_knobs_the_caller_exported_are_recorded_with_the_server(monkeypatch) -> None:
    """A SPARSESPEC_* variable of the benchmark's own environment reaches the server (it inherits it),
    so the recorded environment and resolved knobs carry it; ``--env`` and the config still win."""
    from benchmarks.configs import resolve_config

    monkeypatch.setenv("SPARSESPEC_BATCH_PHASES", "mixed")
    monkeypatch.setenv("SPARSESPEC_COST_CACHE", "auto")
    pillar = resolve_config("pillar")
    assert pillar.pillar_config({})["batch_phases"] == "mixed"
    assert pillar.environment({})["SPARSESPEC_COST_CACHE"] == "off"  # measured from a cold start
    assert resolve_config("pillar:batch_phases=split").pillar_config({})["batch_phases"] == "split"
    assert pillar.pillar_config({"SPARSESPEC_BATCH_PHASES": "split"})["batch_phases"] == "split"


def test_run_guesses_come_from_the_same_gpu_model_when_it_has_any():
    """An H100's slower stock run must not plan an H200's (h200-e8410c8-7000 skipped a ~150 s stock run with
    320 s left); a GPU with no results of its own plans with everyone's."""

    def doc(device: str, tok_s: float) -> dict:
        run = {
            "status": "ok",
            "concurrency": 256,
            "metrics": {"duration": 7000 * 256 / tok_s, "total_output_tokens": 7000 * 256},
        }
        return {
            "kind": "throughput",
            "meta": {"device": device},
            "config": {"name": "stock", "flags": ["--stream-interval", "8"]},
            "workload": {"output_len": 7000},
            "runs": [run],
        }

    docs = [
        doc("NVIDIA H100 80GB HBM3, 81559 MiB, 570.1", 12000.0),
        doc("NVIDIA H200, 143771 MiB, 580.159.04", 24000.0),
    ]
    assert run_clock.RunClock.seeded(docs, device="NVIDIA H200, 143771 MiB, 580.1").rate("stock", 256, 7000) == 24000.0
    assert run_clock.RunClock.seeded(docs, device="NVIDIA B200, 183359 MiB, 580.1").rate("stock", 256, 7000) == 12000.0
    assert run_clock.RunClock.seeded(docs).rate("stock", 256, 7000) == 12000.0  # the slowest of all
