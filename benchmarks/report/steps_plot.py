"""Step-time figures: each PILLAR phase and stock's decode step against its physical ideal, one PNG per step_times
run that has ideal rows (``step_analysis.ideal_breakdown``), drawn beside the run's measured / ideal table.

One panel per measured (context L, batch B), rows of panels by B and columns by L, panels of one B on one
millisecond scale. In a panel each phase is a group of bars, per config a solid bar (measured) next to a
hatched one (ideal) in the config's colour, with measured / ideal written above the measured bar (red past
``OVER_IDEAL``). Linear milliseconds on purpose: a phase that is far over its ideal but costs a few
microseconds (select) stays small, one that costs the round its time (accept, verify) shows as such.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import step_analysis

# Over this measured / ideal a phase is flagged, in the table and the figure.
OVER_IDEAL = 1.5

PHASE_ORDER = ("step", *step_analysis.PHASES, step_analysis.GAP, "round")  # "step" is stock's decode step


@dataclass(frozen=True)
class IdealBar:
    """One config's measured and ideal ms of one phase at one (L, B)."""

    phase: str
    config: str
    measured_ms: float
    ideal_ms: float

    @property
    def ratio(self) -> float | None:
        """measured / ideal; None where the ideal is 0 (the gap: no work is the ideal)."""
        return self.measured_ms / self.ideal_ms if self.ideal_ms > 0 else None

    @property
    def over(self) -> bool:
        return self.ratio is not None and self.ratio > OVER_IDEAL

    def label(self) -> str:
        """What is written above the measured bar."""
        ratio = self.ratio
        if ratio is None:
            return f"{self.measured_ms:.2f} ms, ideal 0"
        return f"{ratio:.2f}x" if ratio < 10 else f"{ratio:.0f}x"


@dataclass(frozen=True)
class IdealPanel:
    """The bars of one (L, B), in phase order and, within a phase, in the configs' order."""

    context: int
    batch: int
    fixed_ms: float
    bars: tuple[IdealBar, ...]

    def groups(self) -> list[tuple[str, list[IdealBar]]]:
        return [(p, bars) for p in PHASE_ORDER if (bars := [b for b in self.bars if b.phase == p])]


def ideal_panels(rows: Sequence[dict[str, Any]]) -> list[IdealPanel]:
    """``ideal_breakdown`` rows as one panel per (L, B), sorted by B then L; unmeasured phases are left out."""
    points: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in rows:
        points.setdefault((r["batch"], r["context"]), []).append(r)
    panels = []
    for (batch, context), here in sorted(points.items()):
        bars = [
            IdealBar(p, r["config"], m, i)
            for p in PHASE_ORDER
            for r in here
            for m, i in [r["phases"].get(p, (None, None))]
            if m is not None and i is not None
        ]
        panels.append(IdealPanel(context, batch, here[0]["fixed_ms"], tuple(bars)))
    return panels


def informative(panels: Sequence[IdealPanel]) -> bool:
    """Whether a bar is more than the calibration: the fixed cost is stock's step at a batch's smallest L less
    its KV read, so that step equals its ideal by construction; a run of only such steps shows nothing."""
    smallest = {b: min(p.context for p in panels if p.batch == b) for b in {p.batch for p in panels}}
    return any(bar.config != "stock" or p.context > smallest[p.batch] for p in panels for bar in p.bars)


def ideal_plot_name(doc: dict[str, Any]) -> str:
    """The PNG of a step_times file: named by the file (several files share a run id)."""
    return f"ideal_{Path(doc['_file']).stem}.png"


def _title(d: dict[str, Any]) -> str:
    meta, s = d["meta"], d["settings"]
    model = s["model"]
    device = str(meta.get("device")).split(",")[0]
    tbps = next((v for name, v in step_analysis.HBM_TBPS.items() if name in device), None)
    m1, m2 = s["decode_tokens"]
    return (
        f"{Path(str(s['shape'])).name} ({model['layers']} layers, {model['kv_heads']} KV heads x "
        f"{model['head_dim']}, vocab {model['vocab']}) on {device}, commit {str(meta.get('git_commit'))[:12]}\n"
        f"run {meta['run_id']} ({d['_file']}), M1/M2 = {m1}/{m2} output tokens\n"
        f"measured (solid) vs ideal (hatched) ms per round (stock: per decode step); ideal = bytes / "
        f"{tbps:g} TB/s peak HBM + a fixed per-forward cost (stock's step at the batch's smallest L less its KV "
        f"read: that step is 1.00x by construction); labels: measured / ideal, red past {OVER_IDEAL:g}x"
    )


def _draw(plt: Any, patch: Any, d: dict[str, Any], panels: list[IdealPanel], path: Path) -> None:
    configs = list(dict.fromkeys(b.config for p in panels for b in p.bars))
    color = {c: f"C{i}" for i, c in enumerate(configs)}
    contexts = sorted({p.context for p in panels})
    batches = sorted({p.batch for p in panels})
    most_bars = max(len(p.bars) for p in panels)
    panel_w = max(4.0, 0.22 * 2 * most_bars + 1.2)
    fig_w = max(9.0, panel_w * len(contexts))
    title = "\n".join(textwrap.fill(line, width=int(13 * fig_w)) for line in _title(d).split("\n"))
    fig_h = 3.8 * len(batches) + 0.6 + 0.18 * title.count("\n")  # the title's lines above the panels
    fig, axes = plt.subplots(len(batches), len(contexts), figsize=(fig_w, fig_h), squeeze=False)
    by_point = {(p.batch, p.context): p for p in panels}
    for row, batch in enumerate(batches):
        top = 1.3 * max(max(b.measured_ms, b.ideal_ms) for p in panels if p.batch == batch for b in p.bars)
        for col, context in enumerate(contexts):
            ax = axes[row][col]
            panel = by_point.get((batch, context))
            if panel is None:
                ax.set_axis_off()
                ax.text(
                    0.5,
                    0.5,
                    f"L = {context}, B = {batch}\nnot measured",
                    ha="center",
                    va="center",
                    transform=ax.transAxes,
                    color="gray",
                )
                continue
            x, ticks = 0.0, []
            for phase, bars in panel.groups():
                start = x
                for b in bars:
                    ax.bar(x, b.measured_ms, width=1.0, color=color[b.config], edgecolor=color[b.config])
                    ax.bar(x + 1, b.ideal_ms, width=1.0, color="white", hatch="///", edgecolor=color[b.config])
                    ax.text(
                        x,
                        b.measured_ms + 0.01 * top,
                        b.label(),
                        rotation=90,
                        ha="center",
                        va="bottom",
                        fontsize=7,
                        color="red" if b.over else "black",
                        fontweight="bold" if b.over else "normal",
                    )
                    x += 2
                ticks.append(((start + x - 1) / 2, phase))
                x += 0.8  # space between phases
            ax.set_xticks([t for t, _ in ticks], [name for _, name in ticks])
            ax.set_ylim(0, top)
            ax.set_title(f"L = {context}, B = {batch} (fixed {panel.fixed_ms:.2f} ms / forward)", fontsize=9)
            ax.set_xlabel("phase")
            if col == 0:
                ax.set_ylabel("ms per round (stock: per step)")
            ax.grid(True, axis="y", alpha=0.3)
    handles = [patch(facecolor=color[c], edgecolor=color[c], label=f"{c} measured") for c in configs]
    handles.append(patch(facecolor="white", edgecolor="gray", hatch="///", label="ideal (config's colour)"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_ideal(docs: Sequence[dict[str, Any]], out_dir: Path) -> list[Path] | str:
    """One PNG per step_times run with ideal rows beyond the calibration (``informative``), into ``out_dir``;
    a note when matplotlib is missing. Nothing to draw is no note: runs without the model shape or a known
    device have no ideal."""
    runs = [
        (d, panels)
        for d in sorted(
            (d for d in docs if d.get("kind") == "step_times"), key=lambda d: (d["meta"]["run_id"], d["_file"])
        )
        if (panels := ideal_panels(step_analysis.ideal_breakdown(d))) and informative(panels)
    ]
    if not runs:
        return []
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        return "matplotlib is not installed; step-time ideal plots skipped (pip install matplotlib)."
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for d, panels in runs:
        paths.append(out_dir / ideal_plot_name(d))
        _draw(plt, Patch, d, panels, paths[-1])
    return paths
