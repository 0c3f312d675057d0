"""Merge result JSONs into markdown tables (and PNG plots when matplotlib is installed).

    python -m benchmarks.report [--results-dir benchmarks/results] [--out SUMMARY.md] [--readme docs/results.md]
                                [--front-page README.md] [--figure PNG] [--no-plots]

With matplotlib installed it also draws the headline figure (output tok/s against concurrency, stock and
PILLAR, from the sampled sweep with the most shared points): from the checked-in results into
docs/figures/throughput_vs_concurrency.png, from any other results dir beside its SUMMARY.md. Beside SUMMARY.md
go a plot per throughput run and workload and, per step_times run with ideal rows, its phases against their
ideal (ideal_<file>.png); SUMMARY.md links each.

--readme docs/results.md also writes one page of tables per result kind into docs/results/, their index
between the page's results markers and the headline (``headline``: the best sampled point against the best stock
backend, the files and command behind it, the figure) between its headline markers; --front-page README.md
writes the same headline between the README's. The text around the markers is left as is. Together the pages
hold every table of SUMMARY.md but the runs bounded by per-token streaming, so the checked-in results keep no
SUMMARY.md (it is written on demand, and for every other results dir).

Ratios compare a config with the ``stock`` config of the same run id (one GPU),
the same workload and the same concurrency; across runs the hardware state differs
(clocks, neighbours), so no cross-run ratio is ever printed.

One module per part: ``common`` (loading, cells, ratios), ``serving`` (throughput, plain rounds, spread, offload,
plots), ``headline`` (the headline point and block), ``figure`` (the headline figure), ``correctness`` (lossless,
acceptance, exactness, the CPU reference), ``kernels`` (verify kernels, launch sweeps), ``steps`` (step times),
``steps_plot`` (step times against their ideal, drawn) and ``pages`` (the summary and the docs pages).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from .common import DEFAULT_RESULTS, REPEATS_DIR, describe_workload, load_results
from .correctness import lossless_markdown
from .figure import CHECKED_IN_FIGURE, FIGURE_NAME, plot_headline
from .headline import HEADLINE_BEGIN, HEADLINE_END, headline_markdown
from .pages import (
    PAGE_NOTE,
    README_BEGIN,
    README_END,
    results_pages,
    summary_markdown,
    write_front_page,
    write_results_pages,
)
from .serving import plain_vs_stock_markdown, plot_throughput, throughput_rows, throughput_table
from .kernels import tune_table
from .steps_plot import plot_ideal

__all__ = [
    "DEFAULT_RESULTS",
    "HEADLINE_BEGIN",
    "HEADLINE_END",
    "PAGE_NOTE",
    "README_BEGIN",
    "README_END",
    "describe_workload",
    "headline_markdown",
    "load_results",
    "lossless_markdown",
    "main",
    "plain_vs_stock_markdown",
    "results_pages",
    "summary_markdown",
    "throughput_rows",
    "throughput_table",
    "tune_table",
]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS)
    p.add_argument("--out", type=Path, default=None, help="default: <results-dir>/SUMMARY.md")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--figure",
        type=Path,
        default=None,
        help=f"headline PNG (default: {CHECKED_IN_FIGURE.relative_to(CHECKED_IN_FIGURE.parents[2])} for "
        f"the checked-in results, <results-dir>/{FIGURE_NAME} for others)",
    )
    p.add_argument(
        "--readme",
        type=Path,
        default=None,
        help="also write the table pages into this file's folder of its name (docs/results.md -> "
        "docs/results/), their index and the headline into its generated blocks",
    )
    p.add_argument(
        "--front-page",
        type=Path,
        default=None,
        help="also write the headline into this file's headline block (README.md, at the repository root)",
    )
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
        figure = args.figure or (
            CHECKED_IN_FIGURE if args.results_dir.resolve() == DEFAULT_RESULTS else args.results_dir / FIGURE_NAME
        )
        drawn = plot_headline(docs, figure)
        print(f"wrote {drawn}" if isinstance(drawn, Path) else drawn)
    out = args.out or args.results_dir / "SUMMARY.md"
    out.write_text(summary_markdown(docs, notes, repeats), encoding="utf-8")
    print(f"wrote {out} ({len(docs)} result files)")
    if args.readme is not None:
        pages = write_results_pages(args.readme, docs, repeats)
        print(f"rewrote the results index of {args.readme} and {len(pages)} pages in {args.readme.with_suffix('')}")
    if args.front_page is not None:
        write_front_page(args.front_page, docs)
        print(f"rewrote the headline of {args.front_page}")
    return 0
