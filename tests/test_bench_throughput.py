"""CPU tests of the serving benchmarks end to end against the fake SGLang server and bench_serving: throughput,
the offload runs, the sweep over lengths and GPUs, and what the report makes of stock's decode steps and waves."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

# benchmarks/ is a folder at the repository root, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report, sweep, throughput
from benchmarks.checks import offload
from bench_fakes import data_dir, fake_bench, fake_sglang, tiny_tokenizer_dir  # noqa: F401  (pytest fixtures)
from bench_fakes import cli


def test_throughput_end_to_end(
    fake_sglang: Path,
    fake_bench: str,
    tiny_tokenizer_dir: Path,
    data_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out"
    flags = dict(
        model=tiny_tokenizer_dir,
        data_dir=data_dir,
        out=out,
        configs="stock,pillar",
        concurrency="1,2",
        output_len="16,24",
        run_id="R-{output_len}",
        work_dir=tmp_path / "work",
    )
    args = cli(**flags)
    assert throughput.main(args) == 0
    assert "| pillar | 2 | 4 | 200 | 1.00x |" in capsys.readouterr().out
    stock, pillar = (json.loads((out / f"throughput_R-16_{c}.json").read_text()) for c in ("stock", "pillar"))
    assert [r["status"] for r in stock["runs"]] == ["ok", "ok"] and stock["runs"][0]["num_prompts"] == 4
    assert pillar["runs"][1]["metrics"]["accept_length"] == 2.5 and pillar["meta"]["run_id"] == "R-16"
    # Each request's latencies (TTFT + its ITLs = end to end), the texts and ITL lists themselves not kept.
    assert stock["runs"][0]["per_request"] == {
        "ttft_s": [0.25] * 4,
        "e2e_s": [0.75, 1.0, 1.25, 1.5],
        "output_len": [16] * 4,
    }
    assert stock["config"]["pillar_config"] is None and pillar["config"]["pillar_config"]["policy"] == "pillar"
    # PILLAR's /server_info numbers after each run; the server-level record keeps none of the per-step state.
    assert "pillar_state" not in stock["runs"][0] and pillar["runs"][0]["pillar_state"] == {"rounds_by_k": {"8": 3}}
    assert "internal_states" not in pillar["server"]["server_info"]
    # Every length ran on one server start per config: one JSON per length, each its own run id.
    d24 = json.loads((out / "throughput_R-24_pillar.json").read_text())
    assert d24["server"] == pillar["server"] and d24["runs"][0]["metrics"]["total_output_tokens"] == 4 * 24
    assert (tmp_path / "work" / "pillar.server.log").read_text().count("fake server starting") == 1
    for bad in (
        ["--run-id", "R5"],
        ["--output-len", "16,16"],
        ["--run-id", "R-{x}"],
        ["--resume", str(tmp_path / "no")],
    ):
        with pytest.raises(SystemExit):
            throughput.parse_args([*args, *bad])
    # The same run id again (another concurrency): refused before any server starts, the first files untouched.
    with pytest.raises(SystemExit):
        throughput.parse_args([*args, "--concurrency", "3"])
    assert "exists (an earlier command's results)" in capsys.readouterr().err

    # --resume keeps the ok runs of same-named files, with the provenance of the command that ran them.
    stock["runs"][1]["status"] = "failed"  # stock c=2 failed in the earlier command: it runs again
    (out / "throughput_R-16_stock.json").write_text(json.dumps(stock))
    out5 = tmp_path / "out5"
    args5 = cli(**flags | dict(out=out5, concurrency="1,2,3", resume=out, work_dir=tmp_path / "w5"))
    assert throughput.main(args5) == 0
    s5, p5 = (json.loads((out5 / f"throughput_R-16_{c}.json").read_text()) for c in ("stock", "pillar"))
    assert [("measured" in r) for r in s5["runs"]] == [True, False, False] and s5["runs"][1]["status"] == "ok"
    assert [("measured" in r) for r in p5["runs"]] == [True, True, False]
    assert p5["runs"][0]["measured"]["server"] == pillar["server"]
    assert p5["runs"][0]["metrics"] == pillar["runs"][0]["metrics"]
    # Other server flags: nothing is resumed.
    assert throughput.main([*args5, "--extra-server-args=--mem-fraction-static 0.5", "--configs", "stock"]) == 0
    assert "nothing resumed (throughput_R-16_stock.json: config.flags differs)" in capsys.readouterr().out
    # Poisson arrivals are another workload: recorded, passed on, never resumed from closed-loop runs.
    assert throughput.main([*args5, "--request-rate", "2.5", "--configs", "stock"]) == 0
    assert "nothing resumed (throughput_R-16_stock.json: workload.request_rate differs)" in capsys.readouterr().out
    rated = json.loads((out5 / "throughput_R-16_stock.json").read_text())
    assert rated["workload"]["request_rate"] == 2.5 and s5["workload"]["request_rate"] == "inf"
    (row,) = [r for r in report.throughput_rows([rated]) if r["concurrency"] == 2]
    assert row["full_tok_s"] is None  # requests do not start as others end: no closed-loop schedule to rebuild
    assert report.describe_workload(row["workload"]).endswith(", Poisson arrivals at 2.5 requests/s")
    with pytest.raises(SystemExit):
        throughput.parse_args([*args, "--request-rate", "0"])

    # A server that never becomes healthy fails its runs; too little budget skips them, which is not a failure.
    monkeypatch.setenv("FAKE_MODE", "never_healthy")
    args2 = cli(**flags | dict(out=tmp_path / "o2", configs="stock", startup_timeout=2, work_dir=tmp_path / "w2"))
    assert throughput.main(args2) == 1
    assert json.loads((tmp_path / "o2" / "throughput_R-16_stock.json").read_text())["server"]["status"] == "failed"
    monkeypatch.delenv("FAKE_MODE")
    args3 = cli(
        **flags | dict(out=tmp_path / "o3", configs="pillar:recent_window=16", time_budget=30, work_dir=tmp_path / "w3")
    )
    assert throughput.main(args3) == 0
    assert "SKIPPED 4 runs for the time budget" in (tmp_path / "o3" / "throughput_R-16-24.log").read_text()
    assert (tmp_path / "o3" / "throughput_R-16_pillar.recent_window-16.json").is_file()  # a name that comes back


def test_offload_runs_split_over_commands_with_resume(
    fake_sglang: Path, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offload, "IDLE_SETTLE_S", 0.0)  # the fake server has no idle check to wait for
    out = tmp_path / "res" / "offload_x.json"
    flags = dict(model=tiny_tokenizer_dir, data_dir=data_dir, out=out, num_prompts=4, max_new_tokens=20, host_gb=1)
    argv = cli(**flags)
    for bad in (["--runs", "stock,nope"], ["--resume", str(tmp_path / "no")]):
        with pytest.raises(SystemExit):
            offload.main([*argv, *bad])
    # First command: the reference and stock; the JSON and the reference's outputs file suffice to resume.
    assert offload.main([*argv, "--runs", "reference,stock"]) == 0
    first = json.loads(out.read_text())
    assert sorted(first["runs"]) == ["reference", "stock"] and first["runs"]["stock"]["outputs_identical"] is True
    assert offload.reference_path(out).is_file() and first["ratio_vs_stock"] is None
    # Second command, into another folder: nothing but the offload runs starts; identity against the kept reference.
    out2 = tmp_path / "res2" / out.name
    argv2 = cli(**flags | dict(out=out2, runs="stock_offload,pillar_offload,stock", resume=out.parent))
    assert offload.main(argv2) == 0
    doc = json.loads(out2.read_text())
    assert sorted(doc["runs"]) == ["pillar_offload", "reference", "stock", "stock_offload"]
    assert doc["runs"]["stock"]["measured"]["run_id"] == first["meta"]["run_id"]
    pillar = doc["runs"]["pillar_offload"]
    assert "measured" not in pillar and pillar["outputs_identical"] is True
    assert pillar["leak_free_at_idle"] is True and pillar["idle"]["alive"] and doc["leak_free_at_idle"] is True
    assert doc["ratio_vs_stock"] is not None and offload.reference_path(out2).is_file()
    assert not (out2.parent / f"{out2.stem}_stock.server.log").exists()  # kept: not run again
    # Other workload settings: nothing is resumed.
    assert offload.main([*argv, "--max-new-tokens", "21", "--runs", "stock", "--resume", str(out.parent)]) == 0
    assert "nothing resumed (offload_x.json: settings.max_new_tokens differs)" in out.with_suffix(".log").read_text()


def test_sweep_runs_the_matrix_writes_the_report_and_resumes(
    fake_sglang: Path,
    fake_bench: str,
    tiny_tokenizer_dir: Path,
    data_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "sweep"
    argv = cli(
        model=tiny_tokenizer_dir,
        data_dir=data_dir,
        out=out,
        tag="t1",
        configs="stock,pillar",
        output_len="16,24",
        concurrency="1,2",
        no_plots=True,
    )
    assert sweep.main(argv) == 0
    summary = (out / "SUMMARY.md").read_text()
    for n in (16, 24):
        assert f"### Throughput, run sweep-t1-{n}" in summary
        assert f"{n} output tokens (ignore_eos), temperature 0.6" in summary
    assert "| pillar | 2 | 4 | 200 | 1.00x |" in summary
    doc = json.loads((out / "throughput_sweep-t1-24_pillar.json").read_text())
    assert doc["workload"]["top_p"] == 0.95 and doc["workload"]["num_prompts"] == {"1": 4, "2": 4}
    capsys.readouterr()
    assert sweep.main([*argv, "--resume"]) == 0  # everything measured: no server starts
    assert capsys.readouterr().out.count("every run resumed, no server start") == 2
    with pytest.raises(SystemExit):
        sweep.main([*argv, "--tag", "a/b"])


def test_sweep_on_two_gpus_runs_each_length_on_its_own_card(
    fake_sglang: Path, fake_bench: str, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sweep"
    flags = dict(
        model=tiny_tokenizer_dir,
        data_dir=data_dir,
        out=out,
        tag="t2",
        configs="stock,pillar",
        output_len="16,24,32",
        concurrency=2,
        no_plots=True,
    )
    assert sweep.main(cli(**flags, gpus="0,1")) == 0
    # Lengths round-robin over the GPUs: 16 and 32 on GPU 0, 24 on GPU 1; every config of a length on its GPU.
    for n, gpu in ((16, "0"), (24, "1"), (32, "0")):
        for config in ("stock", "pillar"):
            doc = json.loads((out / f"throughput_sweep-t2-{n}_{config}.json").read_text())
            assert doc["meta"]["cuda_visible_devices"] == gpu and doc["runs"][0]["status"] == "ok"
    # One throughput run (and log) per GPU, over its lengths; each child's output in its own log.
    assert (out / "throughput_sweep-t2-16-32.log").is_file() and (out / "throughput_sweep-t2-24.log").is_file()
    assert "done: 4 ok" in (out / "sweep_gpu0.log").read_text() and "done: 2 ok" in (out / "sweep_gpu1.log").read_text()
    assert "### Throughput, run sweep-t2-32" in (out / "SUMMARY.md").read_text()
    with pytest.raises(SystemExit):
        sweep.main(cli(**flags, gpus="0,0"))


def test_stock_decode_steps_from_its_log_meet_pillars_plain_rounds_in_the_report() -> None:
    """benchmarks.throughput reads stock's step time off SGLang's own "Decode batch" lines into the cells of
    PILLAR's adaptive policy; the report sets PILLAR's plain rounds against them (same run, concurrency,
    cell). Intervals after a prefill or at a run's start hold more than decode steps and are left out."""
    from benchmarks.serving_run import decode_step_cells

    def decode(running: int, tokens: int, tok_s: float) -> str:
        return (
            f"[2026-11-25 13:39:29] Decode batch, #running-req: {running}, #token: {tokens}, token usage: 0.03, "
            f"cuda graph: True, gen throughput (token/s): {tok_s}, #queue-req: 0"
        )

    log = "\n".join(
        [
            decode(64, 64 * 4000, 100.0),  # the first interval: idle time in it
            decode(64, 64 * 4000, 16000.0),
            decode(64, 64 * 4100, 20000.0),
            decode(64, 64 * 4200, 12800.0),
            "[2026-11-25 13:39:30] Prefill batch, #new-seq: 1, #new-token: 500",
            decode(64, 64 * 4000, 1000.0),  # had a prefill in it
            decode(40, 40 * 6000, 16000.0),  # another cell: batch bucket 64, context 2^12.5
        ]
    )
    cells = decode_step_cells(log)
    assert cells == {"64x4096": {"ms": 4.0, "lines": 3}, "64x5793": {"ms": 2.5, "lines": 1}}

    def doc(config: str, run: dict) -> dict:
        return {
            "kind": "throughput",
            "meta": {"run_id": "r1"},
            "config": {"name": config},
            "workload": {"output_len": 2048},
            "runs": [{"concurrency": 64, **run}],
        }

    pillar_cells = {"64x4096": {"plain": 4.6, "gap": 0.2}, "64x5793": {"plain": 3.0}}
    docs = [doc("stock", {"decode_step_ms": cells}), doc("pillar", {"pillar_state": {"cells": pillar_cells}})]
    text = report.plain_vs_stock_markdown(docs)
    assert "| r1 | pillar | 64 | 64x4096 | 3 | 4.00 | 4.80 | 1.20x |" in text
    assert "64x5793" not in text  # one clean interval: too few to read
    assert report.plain_vs_stock_markdown([docs[1]]) == ""  # no stock in the run: nothing to compare


def test_wave_pace_lines_show_each_waves_batch_context():
    from benchmarks.report.serving import wave_pace_lines

    rows = [
        dict(config="pillar", concurrency=2, wave_ms=[(5.25, 2911.4), (5.75, 3422.0)]),
        dict(config="x", wave_ms=None),
    ]
    assert wave_pace_lines(rows).endswith("\n\n- pillar c=2: 5.25 (2,911) / 5.75 (3,422)\n")
    assert wave_pace_lines(rows[1:]) == ""
