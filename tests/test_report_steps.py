"""The report's step-time figure (each phase against its physical ideal, per (L, B), one PNG per run) and its
kernel tables: the fastest launch per kernel, uniform against mixed prefix lengths (CPU)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from benchmarks import report, step_analysis
from benchmarks.qwen3_shapes import SHAPES
from benchmarks.report.steps_plot import OVER_IDEAL, IdealBar, ideal_panels, ideal_plot_name, informative, plot_ideal

PILLAR_CONFIG = {
    "num_steps": 8,
    "budget_ratio": 0.05,
    "boost_ratio": 0.0,
    "min_budget": 128,
    "recent_window": 64,
    "sink_tokens": 4,
    "policy": "pillar",
    "timing_every": 10,
    "verify_kernel": "split",
    "select_every": 4,
    "score_rows": "all",
    "draft_candidates": 64,
    "adaptive_steps": "off",
    "force_steps": -1,
    "floor_quantile": 0.1,
    "spec_premium": 0.15,
    "draft_grid": "static",
    "plain_path": "decode",
    "cost_cache": "off",
    "offload_host_gb": 0.0,
}


def _pillar_row(context: int, verify_ms: float) -> dict[str, Any]:
    return {
        "context": context,
        "batch": 16,
        "draft_ms": 55.0,
        "verify_ms": verify_ms,
        "accept_ms": 4.0,
        "select_ms": 0.09,
        "gap_ms": 0.22,
        "round_ms": 55.0 + verify_ms + 4.0 + 0.09,
        "timed_rounds": 160,
    }


def _doc(file: str = "steps_a.json") -> dict[str, Any]:
    """A Qwen3-8B-shaped run on an H100: stock and PILLAR at L = 128 and 4096, B = 16."""
    return {
        "kind": "step_times",
        "_file": file,
        "meta": {
            "run_id": "20261126-112324",
            "device": "NVIDIA H100 80GB HBM3, 81559 MiB, 580.159.04",
            "git_commit": "b3825e8aaaaaaaa",
        },
        "settings": {
            "shape": "qwen3-8b",
            "decode_tokens": [32, 160],
            "accept_assumed": None,
            "model": {"layers": 36, "kv_heads": 8, "head_dim": 128, "vocab": 151936},
        },
        "servers": {
            "stock": {
                "status": "ok",
                "flags": [],
                "env": {},
                "rows": [
                    {"context": 128, "batch": 16, "step_ms": 7.0},
                    {"context": 4096, "batch": 16, "step_ms": 11.0},
                ],
            },
            "pillar": {
                "status": "ok",
                "flags": ["--speculative-num-steps", "8"],
                "env": {},
                "pillar_config": PILLAR_CONFIG,
                "rows": [_pillar_row(128, 8.3), _pillar_row(4096, 12.3)],
            },
        },
    }


def _without_ideal(file: str = "steps_b.json") -> dict[str, Any]:
    """A run recorded before the model shape was: no ideal rows, so no figure."""
    d = _doc(file)
    del d["settings"]["model"]
    return d


def test_the_panels_hold_each_phase_measured_next_to_its_ideal() -> None:
    rows = step_analysis.ideal_breakdown(_doc())
    panels = ideal_panels(rows)
    assert [(p.context, p.batch) for p in panels] == [(128, 16), (4096, 16)]
    low, high = panels
    assert [phase for phase, _ in high.groups()] == ["step", "draft", "verify", "accept", "select", "gap", "round"]
    bars = {(b.phase, b.config): b for b in high.bars}
    expected = {r["config"]: r["phases"] for r in rows if r["context"] == 4096}
    for (phase, config), bar in bars.items():
        assert (bar.measured_ms, bar.ideal_ms) == expected[config][phase]
    assert bars[("round", "pillar")].measured_ms == pytest.approx(_pillar_row(4096, 12.3)["round_ms"] + 0.22)
    # A forward's fixed cost is one read of its weights (Qwen3-8B: 15.1 GB at 3.35 TB/s), not a stock step.
    weights_ms = 1e3 * step_analysis.forward_weight_bytes(SHAPES["qwen3-8b"]) / 3.35e12
    assert 15.0e9 < step_analysis.forward_weight_bytes(SHAPES["qwen3-8b"]) < 15.2e9
    assert all(r["fixed_ms"] == pytest.approx(weights_ms) for r in rows)
    assert {(b.phase, b.config): b for b in low.bars}[("step", "stock")].ratio > 1.0
    # A shape the harness does not know: calibrated on stock's step at the smallest L (that bar its own ideal).
    custom = _doc()
    custom["settings"]["shape"] = "/models/custom"
    calibrated = ideal_panels(step_analysis.ideal_breakdown(custom))[0]
    assert {(b.phase, b.config): b for b in calibrated.bars}[("step", "stock")].ratio == pytest.approx(1.0)
    accept = bars[("accept", "pillar")]  # 4 ms against one read of 9 x 16 fp32 logit rows
    assert accept.over and accept.ratio > 100 and accept.label() == f"{accept.ratio:.0f}x"
    gap = bars[("gap", "pillar")]  # no host time is the ideal: no ratio, the time itself is written
    assert gap.ratio is None and not gap.over and gap.label() == "0.22 ms, ideal 0"
    assert IdealBar("verify", "pillar", OVER_IDEAL * 2.0, 2.0).over is False
    assert IdealBar("verify", "pillar", 3.1, 2.0).label() == "1.55x"
    assert informative(panels)
    # Stock alone at one L per batch: every bar is the calibration itself, nothing to show.
    stock_only = _doc()
    stock_only["servers"] = {
        "stock": {**stock_only["servers"]["stock"], "rows": stock_only["servers"]["stock"]["rows"][:1]}
    }
    assert not informative(ideal_panels(step_analysis.ideal_breakdown(stock_only)))


class _Recorder:
    """Stands in for a matplotlib figure or axes: records bars and texts, ignores layout calls."""

    def __init__(self, calls: list[tuple[Any, ...]]) -> None:
        self.calls = calls

    def bar(self, x: float, height: float, **kw: Any) -> None:
        self.calls.append(("bar", self, x, height, kw.get("hatch")))

    def text(self, x: float, y: float, s: str, **kw: Any) -> None:
        self.calls.append(("text", self, s, kw.get("color")))

    def savefig(self, path: Path, **kw: Any) -> None:
        Path(path).write_bytes(b"fake png")

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: None


def _fake_matplotlib(calls: list[tuple[Any, ...]]) -> dict[str, types.ModuleType]:
    mpl, plt, patches = (types.ModuleType(n) for n in ("matplotlib", "matplotlib.pyplot", "matplotlib.patches"))
    mpl.use = lambda backend: None  # type: ignore[attr-defined]

    def subplots(rows: int, cols: int, **kw: Any) -> tuple[_Recorder, list[list[_Recorder]]]:
        return _Recorder(calls), [[_Recorder(calls) for _ in range(cols)] for _ in range(rows)]

    plt.subplots = subplots  # type: ignore[attr-defined]
    plt.close = lambda fig: None  # type: ignore[attr-defined]
    patches.Patch = lambda **kw: kw  # type: ignore[attr-defined]
    return {"matplotlib": mpl, "matplotlib.pyplot": plt, "matplotlib.patches": patches}


def test_each_panel_draws_measured_then_ideal_bars_and_flags_the_phases_past_the_bar(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[Any, ...]] = []
    for name, module in _fake_matplotlib(calls).items():
        monkeypatch.setitem(sys.modules, name, module)
    assert plot_ideal([_doc(), _without_ideal()], tmp_path) == [tmp_path / "ideal_steps_a.png"]
    assert (tmp_path / "ideal_steps_a.png").read_bytes() == b"fake png" and not (
        tmp_path / "ideal_steps_b.png"
    ).exists()
    panels = ideal_panels(step_analysis.ideal_breakdown(_doc()))
    axes = list(dict.fromkeys(c[1] for c in calls if c[0] == "bar"))
    assert len(axes) == 2  # one panel per (L, B)
    for ax, panel in zip(axes, panels):
        drawn = [(c[3], c[4]) for c in calls if c[0] == "bar" and c[1] is ax]
        assert drawn == [v for b in panel.bars for v in ((b.measured_ms, None), (b.ideal_ms, "///"))]
        labels = [(c[2], c[3]) for c in calls if c[0] == "text" and c[1] is ax]
        assert labels == [(b.label(), "red" if b.over else "black") for b in panel.bars]


def test_the_report_writes_a_png_per_run_and_links_it_from_the_summary(tmp_path: Path) -> None:
    pytest.importorskip(
        "matplotlib",
        reason="matplotlib is not installed: the real PNG is not drawn (the drawing "
        "itself is tested against a stand-in above)",
    )
    from PIL import Image

    for d in (_doc(), _without_ideal()):
        (tmp_path / d["_file"]).write_text(json.dumps({k: v for k, v in d.items() if k != "_file"}), encoding="utf-8")
    assert report.main(["--results-dir", str(tmp_path)]) == 0
    png = tmp_path / ideal_plot_name(_doc())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with Image.open(png) as im:
        im.verify()
    assert not (tmp_path / ideal_plot_name(_without_ideal())).exists()
    summary = (tmp_path / "SUMMARY.md").read_text(encoding="utf-8")
    assert "- plot: ![ideal_steps_a](ideal_steps_a.png)" in summary and "ideal_steps_b" not in summary


def test_without_matplotlib_the_summary_says_so_and_no_plots_skips_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    note = plot_ideal([_doc()], tmp_path)
    assert isinstance(note, str) and "matplotlib is not installed" in note
    assert plot_ideal([_without_ideal()], tmp_path) == []  # nothing to draw: no note either
    doc = _doc()
    (tmp_path / doc.pop("_file")).write_text(json.dumps(doc), encoding="utf-8")
    assert report.main(["--results-dir", str(tmp_path)]) == 0
    assert f"- {note}" in (tmp_path / "SUMMARY.md").read_text(encoding="utf-8")
    assert report.main(["--results-dir", str(tmp_path), "--no-plots"]) == 0
    assert "step-time ideal plots skipped" not in (tmp_path / "SUMMARY.md").read_text(encoding="utf-8")
    assert not list(tmp_path.glob("*.png"))


def test_tune_table_keeps_each_kernels_fastest_launch_static_and_planned():
    from benchmarks.report import tune_table

    base = dict(shape="smollm2-135m", bs=32, seq_len=2048)
    rows = [
        dict(base, kernel="sglang_decode", us=20.0),
        dict(base, kernel="dense", splits=3, block_n=32, warps=4, stages=3, us=40.0, GBps=1200.0),
        dict(base, kernel="dense", splits=8, block_n=32, warps=4, stages=3, us=25.0, GBps=1900.0),
        dict(base, kernel="dense_planned", chunk=256, programs_per_request=8, us=22.0, GBps=2200.0),
        dict(base, kernel="dense_planned", chunk=512, programs_per_request=4, us=30.0, GBps=1600.0),
    ]
    table = tune_table(rows)
    assert "| dense | smollm2-135m | 32 | 2048 | splits 8, tile 32, 4 warps, 3 stages | 25.0 | 20.0 | 1900 |" in table
    assert (
        "| dense_planned | smollm2-135m | 32 | 2048 | chunk 256, 8 programs / request | 22.0 | 20.0 | 2200 |" in table
    )
    assert "splits 3" not in table and "chunk 512" not in table


def test_mixed_prefix_tables_pair_uniform_and_mixed_runs():
    from benchmarks.report.kernels import mixed_lengths_table, mixed_tune_table

    base = dict(shape="smollm2-135m", bs=256, seq_len=2048)
    rows = [dict(base, kernel="sglang_decode", us=180.0)] + [
        dict(base, kernel=f"{k}_{kind}", splits=1, cap=cap, us=us)
        for cap, k, kind, us in (
            (2, "verify", "uniform", 190.0),
            (2, "verify", "mixed", 209.0),
            (2, "capture", "uniform", 100.0),
            (2, "capture", "mixed", 110.0),
            (1, "verify", "uniform", 188.0),
        )
    ]
    table = mixed_tune_table(rows)
    assert "| smollm2-135m | 256 | 2048 | 1 | 2 | 190.0 | 209.0 | 100.0 | 110.0 | 1.10x |" in table
    assert "| smollm2-135m | 256 | 2048 | 1 | 1 | 188.0 | - | - | - | - |" in table  # a grid measured on one kind only
    assert mixed_tune_table([dict(base, kernel="verify", splits=1, block_n=128, warps=4, us=1.0)]) == ""
    doc = dict(
        _file="k.json",
        device="GPU",
        git_commit="abc",
        mixed_lengths=[
            dict(
                base,
                mixed_min=256,
                mixed_max=3840,
                verify_uniform_us=200.0,
                verify_mixed_us=220.0,
                capture_uniform_us=100.0,
                capture_mixed_us=101.0,
                plain_verify_uniform_us=50.0,
                plain_verify_mixed_us=50.0,
                draft_static_uniform_us=30.0,
                draft_static_mixed_us=45.0,  # a run without the planned grid's columns
                sglang_decode_uniform_us="not run",
                sglang_decode_mixed_us="not run",
            )
        ],
    )
    line = (
        "| smollm2-135m | 256 | 2048 | 256-3840 | 200.0 / 220.0 | 100.0 / 101.0 | 50.0 / 50.0 | 30.0 / 45.0 | - / - | "
        "- / - | 1.10x | 1.01x | 1.00x | 1.50x | - | - |"
    )
    assert line in mixed_lengths_table(doc)
