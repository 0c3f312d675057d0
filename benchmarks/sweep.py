"""The whole serving matrix on this machine's GPU, then the report: the one command a user runs.

    python -m benchmarks.sweep --data-dir D [--model M] [--out DIR] [--tag T] [--configs C,..]
        [--output-len 2048,4096,7000] [--concurrency 1,8,32,64,128,256] [--waves 2]
        [--temperature 0.6] [--top-p 0.95] [--resume [DIR]] [--time-budget S] [--no-plots]

Every config starts one server that runs every output length and concurrency (benchmarks.throughput,
run id ``sweep-<tag>-<len>``: each length is one comparison against its own stock rows), then
benchmarks.report writes ``DIR/SUMMARY.md`` (and plots, with matplotlib). Without ``--model`` the
SmolLM2-135M-Instruct test model is built (``pip install ".[test]"``). ``--resume`` keeps the ok runs of
result files of the same name and settings (in DIR, or the folder given) and runs only the rest, so a
sweep cut short, by ``--time-budget`` or a dead machine, is finished by the same command again.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from benchmarks import report, throughput
from benchmarks.configs import CONFIGS_HELP
from benchmarks.meta import git_commit

CONFIGS = ("stock", "stock-flashinfer", "ngram", "pillar", "pillar-coarse", "pillar-streaming")
OUTPUT_LENS = "2048,4096,7000"  # SmolLM2's context is 8192: 7000 + the longest prompt fits
CONCURRENCY = "1,8,32,64,128,256"
NO_BUDGET_S = 1e9  # throughput always counts down a budget; without --time-budget it never runs out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data-dir", type=Path, required=True, help="folder with aime24.jsonl / amc23.jsonl")
    p.add_argument("--model", default=None, help="model folder (default: build the SmolLM2 test model)")
    p.add_argument("--out", type=Path, default=Path("sweep_results"), help="result folder (default: ./sweep_results)")
    p.add_argument("--tag", default=None, help="names the measured code in every run id (default: short commit)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=CONFIGS_HELP)
    p.add_argument("--output-len", default=OUTPUT_LENS, help="output tokens per request (comma list)")
    p.add_argument("--concurrency", default=CONCURRENCY, help="requests in flight (comma list)")
    p.add_argument("--waves", type=int, default=2, help="requests per concurrency: max(waves*concurrency, 4)")
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--env", action="append", default=[], metavar="KEY=VAL", help="server environment (repeatable)")
    p.add_argument("--resume", type=Path, nargs="?", const=True, default=None, metavar="DIR",
                   help="keep the ok runs of same-named result files (in --out, or DIR) and run the rest")
    p.add_argument("--time-budget", type=float, default=None, help="seconds; runs that no longer fit are skipped")
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    args.tag = args.tag or git_commit()[:7]
    if not all(ch.isalnum() or ch in "._-" for ch in args.tag):
        p.error(f"--tag must be letters, digits, '.', '_' or '-' (it is part of file names), got {args.tag!r}")
    if args.resume is True:
        args.resume = args.out
    return args


def throughput_argv(args: argparse.Namespace, model: str) -> list[str]:
    """The benchmarks.throughput command line of the whole sweep."""
    argv = ["--model", model, "--data-dir", str(args.data_dir), "--out", str(args.out),
            "--configs", args.configs, "--output-len", args.output_len, "--concurrency", args.concurrency,
            "--waves", str(args.waves), "--temperature", str(args.temperature), "--top-p", str(args.top_p),
            "--run-id", f"sweep-{args.tag}-{{output_len}}", "--time-budget", str(args.time_budget or NO_BUDGET_S)]  # fmt: skip
    argv += [f"--env={item}" for item in args.env]
    if args.resume is not None:
        argv += ["--resume", str(args.resume)]
    return argv


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model is None:
        from sglang_sparsespec.models.smollm2 import build_smollm2

        args.model = str(build_smollm2())
    args.out.mkdir(parents=True, exist_ok=True)  # --resume reads it before anything is written
    code = throughput.main(throughput_argv(args, args.model))
    report.main(["--results-dir", str(args.out)] + (["--no-plots"] if args.no_plots else []))
    return code


if __name__ == "__main__":
    sys.exit(main())
