"""The whole serving matrix on this machine's GPU, then the report: the one command a user runs.

    python -m benchmarks.sweep --data-dir D [--model M] [--out DIR] [--tag T] [--configs C,..]
        [--output-len 2048,4096,7000] [--concurrency 1,8,32,64,128,256] [--waves 2]
        [--temperature 0.6] [--top-p 0.95] [--resume [DIR]] [--time-budget S] [--no-plots] [--gpus 0,1,..]

Every config starts one server that runs every output length and concurrency (benchmarks.throughput,
run id ``sweep-<tag>-<len>``: each length is one comparison against its own stock rows), then
benchmarks.report writes ``DIR/SUMMARY.md`` (and plots, with matplotlib). Without ``--model`` the
SmolLM2-135M-Instruct test model is built (``pip install ".[test]"``). ``--resume`` keeps the ok runs of
result files of the same name and settings (in DIR, or the folder given) and runs only the rest, so a
sweep cut short, by ``--time-budget`` or a dead machine, is finished by the same command again.

``--gpus`` spreads the output lengths over several GPUs of the host, one process per GPU running its
lengths (round-robin) for every config, at the same time. Each comparison (one length: stock and the
others) still runs on one card; the cards share the host's CPUs, which the host-bound points (few
requests) may feel. Each process logs to ``DIR/sweep_gpu<N>.log``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
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
    p.add_argument(
        "--resume",
        type=Path,
        nargs="?",
        const=True,
        default=None,
        metavar="DIR",
        help="keep the ok runs of same-named result files (in --out, or DIR) and run the rest",
    )
    p.add_argument("--time-budget", type=float, default=None, help="seconds; runs that no longer fit are skipped")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument(
        "--gpus",
        default=None,
        help="comma list of GPU indices: output lengths run in parallel, one "
        "group per GPU (each comparison stays on one GPU)",
    )
    args = p.parse_args(argv)
    args.gpu_list = [g.strip() for g in args.gpus.split(",")] if args.gpus else []
    if not all(g.isdigit() for g in args.gpu_list) or len(set(args.gpu_list)) != len(args.gpu_list):
        p.error(f"--gpus must list distinct GPU indices like 0,1,2, got {args.gpus!r}")
    args.tag = args.tag or git_commit()[:7]
    if not all(ch.isalnum() or ch in "._-" for ch in args.tag):
        p.error(f"--tag must be letters, digits, '.', '_' or '-' (it is part of file names), got {args.tag!r}")
    if args.resume is True:
        args.resume = args.out
    return args


def throughput_argv(args: argparse.Namespace, model: str, output_len: str | None = None) -> list[str]:
    """The benchmarks.throughput command line of the whole sweep (or of the lengths ``output_len``)."""
    argv = [
        "--model",
        model,
        "--data-dir",
        str(args.data_dir),
        "--out",
        str(args.out),
        "--configs",
        args.configs,
        "--output-len",
        output_len or args.output_len,
        "--concurrency",
        args.concurrency,
        "--waves",
        str(args.waves),
        "--temperature",
        str(args.temperature),
        "--top-p",
        str(args.top_p),
        "--run-id",
        f"sweep-{args.tag}-{{output_len}}",
        "--time-budget",
        str(args.time_budget or NO_BUDGET_S),
    ]
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
    if args.gpu_list:
        code = run_on_gpus(args, args.model)
    else:
        code = throughput.main(throughput_argv(args, args.model))
    report.main(["--results-dir", str(args.out)] + (["--no-plots"] if args.no_plots else []))
    return code


def run_on_gpus(args: argparse.Namespace, model: str) -> int:
    """One forked process per GPU (CUDA_VISIBLE_DEVICES), each running benchmarks.throughput over its share
    of the output lengths; the worst exit code. Forked, so each child is this process as configured."""
    lens = [n for n in args.output_len.split(",") if n]
    groups = [(gpu, ",".join(lens[i :: len(args.gpu_list)])) for i, gpu in enumerate(args.gpu_list) if i < len(lens)]
    ctx = multiprocessing.get_context("fork")
    procs = [
        ctx.Process(
            target=_gpu_child, args=(gpu, throughput_argv(args, model, group), args.out / f"sweep_gpu{gpu}.log")
        )
        for gpu, group in groups
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    codes = [proc.exitcode for proc in procs]
    print(f"sweep: {', '.join(f'GPU {g} lengths {grp} exit {c}' for (g, grp), c in zip(groups, codes))}", flush=True)
    return 0 if all(c == 0 for c in codes) else 1


def _gpu_child(gpu: str, argv: list[str], log: Path) -> None:
    os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    with open(log, "a", buffering=1) as f:
        # Both levels: Python's writes, and those of anything that writes to the inherited descriptors.
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        sys.stdout = sys.stderr = f
        sys.exit(throughput.main(argv))


if __name__ == "__main__":
    sys.exit(main())
