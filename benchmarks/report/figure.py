"""The headline figure: output tok/s against concurrency, stock and PILLAR, from one sampled sweep.

The figure is drawn from the checked-in sweep whose stock and PILLAR runs share the most (output length,
concurrency) points, sampled (temperature > 0 with top-p) and streamed at an interval above 1 (at interval
1 SGLang's per-token streaming caps what reaches the client). Stock and PILLAR of a point come from one run
id, so one GPU and one hardware state; the figure names the model, the GPU, the commits and the sampling.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .common import REPO_ROOT, commits_text, model_name, sampled
from .serving import throughput_rows

FIGURE_NAME = "throughput_vs_concurrency.png"

# The checked-in figure the README shows; drawn from the checked-in results only (other results dirs get
# theirs beside their SUMMARY.md, so a scratch run never overwrites it).
CHECKED_IN_FIGURE = REPO_ROOT / "docs" / "figures" / FIGURE_NAME

SWEEP_ID = re.compile(r"^(sweep-.+)-(\d+)$")  # benchmarks.sweep names its runs sweep-<tag>-<output len>


@dataclass(frozen=True)
class Headline:
    """The chosen sweep: ``rows`` are its ok stock and PILLAR throughput rows at the shared points."""

    tag: str  # the run ids' common prefix, sweep-<tag>
    model: str
    device: str
    sampling: str
    rows: tuple[dict[str, Any], ...]

    @property
    def output_lens(self) -> list[int]:
        return sorted({r["workload"][1] for r in self.rows})

    def series(self, output_len: int, config: str) -> list[tuple[int, float]]:
        return sorted(
            (r["concurrency"], r["tok_s"])
            for r in self.rows
            if r["workload"][1] == output_len and r["config"] == config
        )

    def title(self) -> str:
        return (
            f"{self.model} on {self.device}, {self.sampling}, {self.waves_text()}\n"
            f"run {self.tag}, {commits_text(list(self.rows))}"
        )

    def waves_text(self) -> str:
        """Requests per concurrency slot: the usual count, and the concurrencies that ran another."""
        waves = {r["concurrency"]: r["num_prompts"] // r["concurrency"] for r in self.rows if r["num_prompts"]}
        if not waves:
            return "waves not recorded"
        counts = sorted(set(waves.values()), key=lambda w: (-list(waves.values()).count(w), w))
        usual = counts[0]
        others = ", ".join(f"{w} at concurrency {c}" for c, w in sorted(waves.items()) if w != usual)
        return f"{usual} wave{'' if usual == 1 else 's'}" + (f" ({others})" if others else "")


def choose_headline(docs: Sequence[dict[str, Any]]) -> Headline | None:
    """The sampled sweep with the most points where stock and PILLAR both ran ok (ties: the latest), or None."""
    models: dict[str, str] = {}
    dates: dict[str, str] = {}
    for d in (d for d in docs if d.get("kind") == "throughput"):
        run_id = d["meta"]["run_id"]
        dates[run_id] = max(dates.get(run_id, ""), str(d["meta"].get("date_utc", "")))
        if name := model_name(d):
            models.setdefault(run_id, name)
    by_tag: dict[str, list[dict[str, Any]]] = {}
    for r in throughput_rows(docs):
        m = SWEEP_ID.match(str(r["run_id"]))
        if (
            m
            and r["tok_s"]
            and r["config"] in ("stock", "pillar")
            and sampled(r["workload"])
            and r["stream_interval"] > 1
            and int(m.group(2)) == r["workload"][1]
        ):
            by_tag.setdefault(m.group(1), []).append(r)
    best: tuple[tuple[int, str], Headline] | None = None
    for tag, rows in by_tag.items():
        points = {(r["workload"], r["concurrency"]) for r in rows if r["config"] == "stock"}
        points &= {(r["workload"], r["concurrency"]) for r in rows if r["config"] == "pillar"}
        kept = tuple(r for r in rows if (r["workload"], r["concurrency"]) in points)
        devices = {r["device"] for r in kept}
        if len(points) < 2 or len(devices) != 1:
            continue  # one point is not a curve; a sweep split over GPU kinds is not one figure
        temps = sorted({(r["workload"][3], r["workload"][4]) for r in kept})
        headline = Headline(
            tag=tag,
            model=next((models[r["run_id"]] for r in kept if r["run_id"] in models), "model not recorded"),
            device=str(next(iter(devices))).split(",")[0],
            sampling=", ".join(f"temperature {t:g} / top-p {p:g}" for t, p in temps),
            rows=kept,
        )
        key = (len(points), max(dates.get(r["run_id"], "") for r in kept))
        if best is None or key > best[0]:
            best = (key, headline)
    return best[1] if best else None


def plot_headline(docs: Sequence[dict[str, Any]], path: Path) -> Path | str:
    """Draw the headline figure into ``path``; a note instead when matplotlib or a sampled sweep is missing."""
    headline = choose_headline(docs)
    if headline is None:
        return "no sampled sweep with stock and PILLAR at two or more points; headline figure skipped."
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed; headline figure skipped (pip install matplotlib)."
    lens = headline.output_lens
    fig, axes = plt.subplots(1, len(lens), figsize=(5.2 * len(lens), 4.2), squeeze=False)
    for ax, out_len in zip(axes[0], lens):
        stock, pillar = headline.series(out_len, "stock"), headline.series(out_len, "pillar")
        ax.plot([c for c, _ in stock], [t for _, t in stock], marker="o", color="tab:gray", label="stock SGLang")
        ax.plot(
            [c for c, _ in pillar],
            [t for _, t in pillar],
            marker="o",
            color="tab:blue",
            label="PILLAR (labels: x stock)",
        )
        base = dict(stock)
        for c, t in pillar:
            ax.annotate(
                f"{t / base[c]:.2f}x",
                (c, t),
                textcoords="offset points",
                xytext=(0, 7),
                ha="center",
                fontsize=8,
                color="tab:blue",
            )
        concs = sorted(base)
        ax.set_xscale("log", base=2)
        ax.set_xticks(concs, [str(c) for c in concs])
        ax.set(xlabel="concurrent requests", ylabel="output tokens/s", title=f"{out_len} output tokens per request")
        ax.set_ylim(0, 1.12 * max(t for _, t in stock + pillar))  # room for the labels above the top point
        ax.grid(True, alpha=0.3)
        ax.legend(loc="upper left")
    fig.suptitle(headline.title(), fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
