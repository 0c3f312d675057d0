"""The report's headline figure: which sweep it draws, what it draws, where it writes (CPU, no GPU)."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from benchmarks import report
from benchmarks.report.common import load_results
from benchmarks.report.figure import FIGURE_NAME, choose_headline, plot_headline


def _doc(
    run_id: str,
    config: str,
    out_len: int,
    tok_s: dict[int, float],
    *,
    temperature: float = 0.6,
    top_p: float | None = 0.95,
    interval: int = 8,
    date: str = "2026-01-01T00:00:00Z",
) -> dict[str, Any]:
    return {
        "kind": "throughput",
        "meta": {
            "run_id": run_id,
            "date_utc": date,
            "device": "NVIDIA H100 80GB HBM3, 81559 MiB, 580",
            "git_commit": "abc1234",
            "sglang_version": "0.5.17",
        },
        "config": {"name": config, "flags": ["--stream-interval", str(interval)]},
        "workload": {
            "kind": "aime",
            "output_len": out_len,
            "input_len": None,
            "temperature": temperature,
            "top_p": top_p,
            "request_rate": "inf",
        },
        "server": {"command": ["python", "-m", "sglang.launch_server", "--model-path", "/models/Tiny-1B"]},
        "runs": [
            {"concurrency": c, "num_prompts": 2 * c, "status": "ok", "metrics": {"output_throughput": t}}
            for c, t in tok_s.items()
        ],
    }


def _sweep(tag: str, *, points: dict[int, float], **kw: Any) -> list[dict[str, Any]]:
    docs = []
    for out_len in (2048, 7000):
        docs.append(_doc(f"{tag}-{out_len}", "stock", out_len, points, **kw))
        docs.append(_doc(f"{tag}-{out_len}", "pillar", out_len, {c: 1.5 * t for c, t in points.items()}, **kw))
    return docs


def test_the_sampled_sweep_with_the_most_shared_points_is_drawn() -> None:
    greedy = _sweep("sweep-greedy", points={1: 100.0, 8: 800.0, 64: 5000.0, 256: 9000.0}, temperature=0.0, top_p=None)
    streamed = _sweep("sweep-streamed", points={1: 1.0, 8: 8.0, 64: 64.0, 256: 256.0}, interval=1)
    small = _sweep("sweep-small", points={1: 100.0, 8: 800.0}, date="2026-06-01T00:00:00Z")
    wide = _sweep("sweep-wide", points={1: 100.0, 8: 800.0, 64: 5000.0})
    single = [
        _doc("tput-x", "stock", 2048, {1: 1.0, 8: 2.0, 64: 3.0, 256: 4.0}),
        _doc("tput-x", "pillar", 2048, {1: 1.0, 8: 2.0, 64: 3.0, 256: 4.0}),
    ]
    stock_only = [_doc("sweep-lonely-2048", "stock", 2048, {c: 1.0 for c in (1, 2, 4, 8, 16)})]
    h = choose_headline(greedy + streamed + small + wide + single + stock_only)
    assert h is not None and h.tag == "sweep-wide"
    assert h.output_lens == [2048, 7000]
    assert h.series(7000, "stock") == [(1, 100.0), (8, 800.0), (64, 5000.0)]
    assert h.series(7000, "pillar") == [(1, 150.0), (8, 1200.0), (64, 7500.0)]
    title = h.title()
    for part in (
        "Tiny-1B",
        "NVIDIA H100 80GB HBM3",
        "temperature 0.6 / top-p 0.95",
        "2 waves",
        "sweep-wide",
        "commit abc1234",
    ):
        assert part in title, (part, title)
    # Equal point counts: the later sweep wins.
    later = _sweep("sweep-later", points={1: 1.0, 8: 2.0, 64: 3.0}, date="2026-02-01T00:00:00Z")
    assert choose_headline(wide + later).tag == "sweep-later"
    assert choose_headline(greedy + streamed + single) is None


class _FakeAxes:
    def __init__(self, calls: list[tuple[str, Any]]) -> None:
        self.calls = calls

    def plot(self, xs: list[int], ys: list[float], **kw: Any) -> None:
        self.calls.append(("plot", (kw["label"], list(xs), list(ys))))

    def annotate(self, text: str, xy: tuple[int, float], **kw: Any) -> None:
        self.calls.append(("annotate", (text, xy)))

    def set(self, **kw: Any) -> None:
        self.calls.append(("set", kw.get("title")))

    def __getattr__(self, name: str) -> Any:
        return lambda *a, **kw: None  # scales, ticks, grid, legend: layout only


def _fake_matplotlib(calls: list[tuple[str, Any]]) -> tuple[types.ModuleType, types.ModuleType]:
    mpl, plt = types.ModuleType("matplotlib"), types.ModuleType("matplotlib.pyplot")
    mpl.use = lambda backend: calls.append(("use", backend))  # type: ignore[attr-defined]

    def subplots(rows: int, cols: int, **kw: Any) -> tuple[Any, list[list[_FakeAxes]]]:
        fig = types.SimpleNamespace(
            suptitle=lambda text, **k: calls.append(("suptitle", text)),
            tight_layout=lambda: None,
            savefig=lambda path, **k: Path(path).write_bytes(b"fake png"),
        )
        return fig, [[_FakeAxes(calls) for _ in range(cols)]]

    plt.subplots = subplots  # type: ignore[attr-defined]
    plt.close = lambda fig: None  # type: ignore[attr-defined]
    mpl.pyplot = plt  # type: ignore[attr-defined]
    return mpl, plt


def test_the_figure_draws_stock_and_pillar_per_output_length_with_their_ratios(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[tuple[str, Any]] = []
    mpl, plt = _fake_matplotlib(calls)
    monkeypatch.setitem(sys.modules, "matplotlib", mpl)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", plt)
    out = tmp_path / "figs" / "f.png"
    assert plot_headline(_sweep("sweep-a", points={1: 100.0, 64: 4000.0}), out) == out
    assert out.read_bytes() == b"fake png"
    assert ("use", "Agg") in calls
    plots = [c[1] for c in calls if c[0] == "plot"]
    assert (
        plots
        == [("stock SGLang", [1, 64], [100.0, 4000.0]), ("PILLAR (labels: x stock)", [1, 64], [150.0, 6000.0])] * 2
    )
    assert [c[1][0] for c in calls if c[0] == "annotate"] == ["1.50x"] * 4
    titles = [c[1] for c in calls if c[0] == "set"]
    assert titles == ["2048 output tokens per request", "7000 output tokens per request"]
    assert "Tiny-1B" in next(c[1] for c in calls if c[0] == "suptitle")


def test_without_matplotlib_or_a_sweep_the_figure_is_skipped_with_a_note(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    note = plot_headline(_sweep("sweep-a", points={1: 1.0, 8: 2.0}), tmp_path / "f.png")
    assert isinstance(note, str) and "matplotlib is not installed" in note and not (tmp_path / "f.png").exists()
    assert "no sampled sweep" in str(plot_headline([], tmp_path / "f.png"))


def test_the_report_writes_the_figure_beside_a_scratch_summary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    calls: list[tuple[str, Any]] = []
    mpl, plt = _fake_matplotlib(calls)
    monkeypatch.setitem(sys.modules, "matplotlib", mpl)
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", plt)
    monkeypatch.setattr(report, "plot_throughput", lambda docs, out_dir: [])  # the per-run plots are not under test
    import json

    for i, d in enumerate(_sweep("sweep-a", points={1: 1.0, 8: 2.0})):
        (tmp_path / f"t{i}.json").write_text(json.dumps(d), encoding="utf-8")
    assert report.main(["--results-dir", str(tmp_path)]) == 0
    assert (tmp_path / FIGURE_NAME).read_bytes() == b"fake png"
    assert report.main(["--results-dir", str(tmp_path), "--figure", str(tmp_path / "x.png")]) == 0
    assert (tmp_path / "x.png").is_file()


def test_the_checked_in_results_hold_a_headline_sweep_naming_its_model() -> None:
    h = choose_headline(load_results(report.DEFAULT_RESULTS)[0])
    assert h is not None and h.model != "model not recorded"
    assert len(h.series(h.output_lens[-1], "pillar")) >= 4


def test_a_real_matplotlib_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = plot_headline(_sweep("sweep-a", points={1: 100.0, 8: 800.0}), tmp_path / "f.png")
    assert out == tmp_path / "f.png" and out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
