"""CPU tests of the step-time benchmark end to end against the fake SGLang server (phase times, profiled
windows) and of the mixed-round bound its projection uses."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

# benchmarks/ is a folder at the repository root, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import report, step_analysis, step_times
from bench_fakes import fake_sglang  # noqa: F401  (pytest fixtures)
from bench_fakes import cli


def test_step_times_end_to_end_and_its_report(
    fake_sglang: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # B x (L + M2 + 16): 2 x (8 + 60 + 16) = 168 tokens fit a 170-token pool, 2 x (16 + 60 + 16) = 184 do not.
    monkeypatch.setenv("FAKE_POOL_TOKENS", "170")
    results = tmp_path / "results"
    out = results / "steps.json"
    names = "stock,pillar:verify_kernel=sglang,pillar-streaming:verify_kernel=sglang"
    flags = dict(
        shape="qwen3-1.7b",
        out=out,
        contexts="8,16",
        batches=2,
        accept="6.0",
        decode_tokens="10,60",
        work_dir=tmp_path / "w",
        env="SPARSESPEC_MIN_BUDGET=64",
    )
    assert step_times.main(cli(**flags, configs=names)) == 0
    doc = json.loads(out.read_text())
    servers = doc["servers"]
    stock, pillar = servers["stock"], servers["pillar:verify_kernel=sglang"]
    assert "--load-format" in stock["flags"] and json.loads((tmp_path / "w" / "qwen3-1.7b" / "config.json").read_text())
    assert pillar["pillar_config"]["min_budget"] == 64 and pillar["pillar_config"]["verify_kernel"] == "sglang"
    for rec in servers.values():
        assert [r.get("skipped") for r in rec["rows"]] == [None, "KV pool: 2 x (16 + 60 + 16) = 184 tokens > 170"]
    # The fake sleeps 2 ms per output token: the M1/M2 difference recovers a step of a few ms.
    assert 1.0 < stock["rows"][0]["step_ms"] < 10.0
    # ... and the M2 pass's log lines (two per request here, the pass's first one left out) give it exactly;
    # the ratios and projections use that one.
    assert (stock["rows"][0]["log_step_ms"], stock["rows"][0]["log_intervals"]) == (pytest.approx(2.0), 3)
    # draft 1.5 + verify 2.0 + accept 0.25 + select 0.5 per round; the streaming twin verifies 0.5 ms faster.
    assert pillar["rows"][0]["round_ms"] == pytest.approx(4.25)
    (cap,) = doc["capture_overhead"]
    assert cap["twin"] == "pillar-streaming:verify_kernel=sglang" and cap["capture_ms"] == pytest.approx(0.5)
    assert doc["projection"][0]["projected_speedup"] == pytest.approx(6.0 * 2.0 / 4.25)
    # The mixed bound hides what the fake's 2.0 ms verify costs above its stock step: nothing here.
    assert doc["projection"][0]["mixed_round_ms"] == pytest.approx(4.25)
    assert report.main(["--results-dir", str(results), "--no-plots"]) == 0
    md = (results / "SUMMARY.md").read_text()
    assert "shape qwen3-1.7b; M1/M2 = 10/60 output tokens; weights dummy (random): times only" in md
    assert "| pillar:verify_kernel=sglang | 8 | 2 | 0.500 | 0.500 | 40% |" in md  # (0.5 + 0.5) / (2.0 + 0.5)
    assert "- not measured: stock L=16 B=2: KV pool" in md
    # Too little budget for a server start: skipped and listed, never started.
    assert step_times.main(cli(**flags | dict(out=tmp_path / "short.json"), time_budget=80)) == 0
    assert {r["status"] for r in json.loads((tmp_path / "short.json").read_text())["servers"].values()} == {"skipped"}


def test_step_times_profiles_a_window_of_each_point(fake_sglang: Path, tmp_path: Path) -> None:
    """--profile-steps: a third pass per point, profiled through /start_profile (plain-text reply; a
    leftover profile is stopped first, which answers 400 when there is none); the trace's GPU time per step
    lands in the row, and the server's context covers the longer profiled pass."""
    out = tmp_path / "steps.json"
    argv = cli(
        shape="qwen3-1.7b",
        out=out,
        contexts=8,
        batches=2,
        configs="stock",
        decode_tokens="10,60",
        profile_steps=3,
        work_dir=tmp_path / "w",
    )
    assert step_times.main(argv) == 0
    (row,) = json.loads(out.read_text())["servers"]["stock"]["rows"]
    prof = row["profile"]
    assert prof["steps"] == 3 and [k["name"] for k in prof["kernels"]] == ["attn", "gemm"]
    # attn 900 us + gemm 100 us busy in a 1300 us window, over 3 steps
    assert prof["busy_ms_per_step"] == pytest.approx(1.0 / 3) and prof["idle_ms_per_step"] == pytest.approx(0.1)
    flags = json.loads(out.read_text())["servers"]["stock"]["flags"]
    assert int(flags[flags.index("--context-length") + 1]) >= 8 + 60 + 10 * 3
    assert "submits_per_step" not in prof  # the GPU alone was profiled
    # --profile-host: the CPU too; the host's submissions per step land in the row and in the report's table.
    assert step_times.main([*argv, "--profile-host"]) == 0
    doc = json.loads(out.read_text())
    prof = doc["servers"]["stock"]["rows"][0]["profile"]
    assert prof["submits_per_step"] == 1.0 and prof["graph_launches_per_step"] == 1.0
    assert doc["settings"]["profile_host"]
    doc["_file"] = out.name
    table = report.steps.step_times_markdown([doc]).split("Profiled steps")[1]
    assert "| stock | 8 | 2 | 0.43 | 0.33 | 0.10 | 1 | 1.0 | attn (0.30 ms) |" in table
    assert "by caller" not in table
    # --profile-stack: Python frames too; the report names the code calling the most host operators.
    assert step_times.main([*argv, "--profile-host", "--profile-stack"]) == 0
    doc = json.loads(out.read_text())
    callers = doc["servers"]["stock"]["rows"][0]["profile"]["host_callers"]
    assert callers[0]["caller"] == "worker.py(7): loop" and callers[0]["calls_per_step"] == 4.0
    doc["_file"] = out.name
    assert "- stock L=8 B=2: worker.py(7): loop -> aten::item x4" in report.steps.step_times_markdown([doc])
    with pytest.raises(SystemExit):  # stacks need the host profile
        step_times.main([*argv, "--profile-stack"])
    with pytest.raises(SystemExit):  # a host profile needs a profiled window
        step_times.main([a for a in argv if a not in ("--profile-steps", "3")] + ["--profile-host"])


def test_the_mixed_round_bound_hides_the_verify_pass_above_a_decode_forward() -> None:
    # Qwen3-8B at 4K x 64 (steps_qwen3-8b_h100.json): verify 31.88 ms against stock's 24.61 ms step, so at most
    # 7.27 ms of the 96.27 ms round is the verify's own pass that mixed forwards could hide.
    row = {"context": 4096, "batch": 64, "verify_ms": 31.88, "round_ms": 96.27}
    assert step_analysis.mixed_round_bound(row, 24.61) == pytest.approx(89.0)
    # A verify faster than stock's step (GPU events against wall time) hides nothing, never a negative.
    assert step_analysis.mixed_round_bound({**row, "verify_ms": 20.0}, 24.61) == 96.27
    servers = {"stock": {"rows": [{"context": 4096, "batch": 64, "step_ms": 24.61}]}, "pillar": {"rows": [row]}}
    (p,) = step_analysis.projections(servers, 6.0)
    assert p["mixed_round_ms"] == pytest.approx(89.0)
    assert p["projected_speedup_mixed"] == pytest.approx(6.0 * 24.61 / 89.0)


def test_projections_and_the_report_use_the_fastest_stock_backend_of_the_run() -> None:
    # Qwen3-1.7B at 4K x 64 on an H200 (steps_qwen3-1.7b_h200_6c8d415.json): stock Triton 14.54 ms, stock
    # FlashInfer 9.88 ms, PILLAR's round 35.37 ms; the projection is against FlashInfer's step.
    row = {"context": 4096, "batch": 64, "draft_ms": 20.79, "verify_ms": 13.11, "select_ms": 0.21, "round_ms": 35.37}
    servers = {
        "stock": {"rows": [{"context": 4096, "batch": 64, "log_step_ms": 14.54}], "flags": []},
        "stock-flashinfer": {"rows": [{"context": 4096, "batch": 64, "log_step_ms": 9.88}], "flags": []},
        "pillar": {"rows": [row], "flags": ["--speculative-num-steps", "8"]},
    }
    assert step_analysis.best_stock_steps(servers) == {(4096, 64): (9.88, "stock-flashinfer")}
    (p,) = step_analysis.projections(servers, 5.5)
    assert p["stock_config"] == "stock-flashinfer" and p["projected_speedup"] == pytest.approx(5.5 * 9.88 / 35.37)
    (cells,) = report.steps._step_rows({"servers": servers, "settings": {}})
    assert cells[3] == "9.880 (`stock-flashinfer`)" and cells[7] == "1.33x"


def test_no_server_is_started_with_less_budget_than_its_kind_needs(
    fake_sglang: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config of a kind not started yet gets the fastest first start of any kind; one of a kind started before
    (warm caches) its kind's fastest later start, else MIN_START_S; never below MIN_START_S."""
    given: list[float] = []

    def fake_run_config(config, model, args, deadline, log, min_start_s):
        given.append(min_start_s)
        return {"status": "ok", "rows": [], "startup_s": {"stock": 300.0, "pillar": 140.0}.get(config.name)}

    monkeypatch.setattr(step_times, "run_config", fake_run_config)
    flags = dict(shape="qwen3-1.7b", out=tmp_path / "s.json", contexts="8", batches=2, work_dir=tmp_path / "w")
    assert step_times.main(cli(**flags, configs="stock,pillar,stock-flashinfer,pillar-streaming")) == 0
    # stock (cold: the floor), pillar (a new kind: stock's 300 s), stock-flashinfer (a new kind: the fastest
    # first start, pillar's 140), pillar-streaming (pillar's kind, warm, no later start yet: the floor)
    assert given == [step_times.MIN_START_S, 300.0, 140.0, step_times.MIN_START_S]


def test_start_bound_by_kind() -> None:
    pillar, stock_fi = (True, "triton"), (False, "flashinfer")
    floor = step_times.MIN_START_S
    assert step_times.start_bound(pillar, []) == floor
    # the e837f22 run: a cold 335 s PILLAR start; a second PILLAR config starts warm, FlashInfer compiles its own
    assert step_times.start_bound(pillar, [(pillar, 335.0)]) == floor
    assert step_times.start_bound(stock_fi, [(pillar, 335.0)]) == 335.0
    assert step_times.start_bound(pillar, [(pillar, 335.0), (pillar, 78.0), (pillar, 90.0)]) == 78.0
    assert step_times.start_bound(stock_fi, [(pillar, 335.0), (pillar, 78.0), ((False, "triton"), 180.0)]) == 180.0
    assert step_times.start_bound(pillar, [(pillar, 335.0), (pillar, 20.0)]) == floor  # never below the floor
