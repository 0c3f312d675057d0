"""Merge result JSONs into markdown tables (and PNG plots when matplotlib is installed).

    python -m benchmarks.report [--results-dir benchmarks/results] [--out SUMMARY.md] [--readme docs/results.md]
                                [--figure PNG] [--no-plots]

With matplotlib installed it also draws the headline figure (output tok/s against concurrency, stock and
PILLAR, from the sampled sweep with the most shared points): from the checked-in results into
docs/figures/throughput_vs_concurrency.png, from any other results dir beside its SUMMARY.md. Beside SUMMARY.md
go a plot per throughput run and workload and, per step_times run with ideal rows, its phases against their
ideal (ideal_<file>.png); SUMMARY.md links each.

--readme docs/results.md also writes one page of tables per result kind into docs/results/ and their
index between the page's results markers; the text around the markers is left as is.

Ratios compare a config with the ``stock`` config of the same run id (one GPU),
the same workload and the same concurrency; across runs the hardware state differs
(clocks, neighbours), so no cross-run ratio is ever printed.

One module per part: ``common`` (loading, cells, ratios), ``serving`` (throughput, plain rounds, spread,
offload, plots), ``figure`` (the headline figure), ``correctness`` (lossless, acceptance, exactness, the CPU reference), ``steps`` (kernels,
step times), ``steps_plot`` (step times against their ideal, drawn) and ``pages`` (the summary and the docs pages).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from .common import DEFAULT_RESULTS, describe_workload, load_results, stream_interval
from .correctness import lossless_markdown
from .figure import CHECKED_IN_FIGURE, FIGURE_NAME, plot_headline
from .pages import PAGE_NOTE, README_BEGIN, README_END, results_pages, summary_markdown, write_results_pages
from .serving import REPEATS_DIR, plain_vs_stock_markdown, plot_throughput, throughput_rows, throughput_table
from .steps import tune_table
from .steps_plot import plot_ideal

__all__ = [
    "DEFAULT_RESULTS", "PAGE_NOTE", "README_BEGIN", "README_END", "describe_workload", "load_results",
    "lossless_markdown", "main", "plain_vs_stock_markdown", "results_pages", "stream_interval", "summary_markdown",
    "throughput_rows", "throughput_table", "tune_table",
]  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS)
    p.add_argument("--out", type=Path, default=None, help="default: <results-dir>/SUMMARY.md")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--figure", type=Path, default=None,
                   help=f"headline PNG (default: {CHECKED_IN_FIGURE.relative_to(CHECKED_IN_FIGURE.parents[2])} for "
                        f"the checked-in results, <results-dir>/{FIGURE_NAME} for others)")
    p.add_argument("--readme", type=Path, default=None,
                   help="also write the table pages into this file's folder of its name (docs/results.md -> "
                        "docs/results/) and their index into its generated block")
    args = p.parse_args(argv)
    if not args.results_dir.is_dir():
        p.error(f"results dir not found: {args.results_dir}")
    docs, notes = load_results(args.results_dir)
    notes = list(notes)
    repeats_dir = args.results_dir / REPEATS_DIR
    repeats = load_results(repeats_dir)[0] if repeats_dir.is_dir() else []
    if not args.no_plots:
        for plots in (plot_throughput(docs, args.results_dir), plot_ideal(docs, args.results_dir)):
            if isinstance(plots, str):
                notes.append(plots)
            else:
                notes += [f"plot: ![{q.stem}]({q.name})" for q in plots]
        figure = args.figure or (CHECKED_IN_FIGURE if args.results_dir.resolve() == DEFAULT_RESULTS
                                 else args.results_dir / FIGURE_NAME)  # fmt: skip
        drawn = plot_headline(docs, figure)
        print(f"wrote {drawn}" if isinstance(drawn, Path) else drawn)
    out = args.out or args.results_dir / "SUMMARY.md"
    out.write_text(summary_markdown(docs, notes, repeats), encoding="utf-8")
    print(f"wrote {out} ({len(docs)} result files)")
    if args.readme is not None:
        pages = write_results_pages(args.readme, docs, repeats)
        print(f"rewrote the results index of {args.readme} and {len(pages)} pages in {args.readme.with_suffix('')}")
    return 0

