"""The full serving sweep (real model, AIME24+AMC23 prompts), cut into chunks that fit one GPU command.

    python -m benchmarks.sweep status --tag T [--results-dir benchmarks/results] [--lens 7000] [--configs C,..]
    python -m benchmarks.sweep run --tag T --model M --data-dir D --out $OUT \\
        (--chunks 0,1 | --next N) [--lens 7000] [--configs C,..] [--time-budget 560]

The matrix is ``CONFIGS`` x ``OUTPUT_LENS`` x ``CONCURRENCY``. A chunk is one (config, output length):
one run per concurrency. Chunks are ordered config first, and ``run`` hands consecutive chunks of one
config to one throughput invocation, so one server start serves all of them (a start costs 60-190 s,
as much as the runs of a 2K chunk). All chunks of one output length share the run id
``sweep-<tag>-<len>`` (a tag names one measured commit, e.g. its short hash), so the report prints
every config's ratio against the stock chunk of that run id. Chunks of one length may come from
different device commands, even different nodes of the same kind (each JSON keeps its own date and
device). ``status`` reads the result JSONs and marks each chunk done (every concurrency ok), partial
or missing; ``run --next N`` runs the first N chunks that are not done, reading the same JSONs from
the tree it runs in (the checked-in results travel with it), so successive device commands walk the
matrix. There a partial chunk runs only its missing concurrencies (throughput ``--resume``: the ok
runs are kept in the rewritten JSON, each with the provenance of the command that measured it);
``--chunks`` measures the named chunks whole, done or not (e.g. to repeat a measurement). One
wave of requests per concurrency (outputs have a fixed length, so the batch stays full without a
second wave, at half the time). A server group whose expected time (server start + its chunks'
missing runs, from the slowest earlier run of each shape in the results and in this command) does
not fit the budget left is cut to the chunks that fit whole, or not started. ``--lens`` / ``--configs``
restrict the matrix (status and ``--next``) to a slice, e.g. one output length measured on another
device kind under its own tag, whose stock chunk then sits in the same run id as the configs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import throughput
from benchmarks.configs import file_stem
from benchmarks.report import DEFAULT_RESULTS
from benchmarks.runlog import Deadline

OUTPUT_LENS = (2048, 4096, 7000)  # SmolLM2's context is 8192: 7000 + the longest prompt fits
CONFIGS = ("stock", "stock-flashinfer", "ngram", "pillar", "pillar-coarse", "pillar-streaming")
CONCURRENCY = (1, 8, 32, 64, 128, 256)
WAVES = 1


@dataclass(frozen=True)
class Chunk:
    """One (output length, config) of the matrix; ``index`` is its place in ``chunks()``."""

    index: int
    output_len: int
    config: str

    def run_id(self, tag: str) -> str:
        return f"sweep-{tag}-{self.output_len}"

    def result_file(self, tag: str, results_dir: Path) -> Path:
        return results_dir / f"throughput_{self.run_id(tag)}_{file_stem(self.config)}.json"


def chunks() -> list[Chunk]:
    """Config outer (one server start per config), length inner; stock runs before the configs compared with it."""
    pairs = [(n, c) for c in CONFIGS for n in OUTPUT_LENS]
    return [Chunk(i, n, c) for i, (n, c) in enumerate(pairs)]


def selected(lens: Sequence[int] | None, configs: Sequence[str] | None) -> list[Chunk]:
    """The chunks of the matrix slice: output lengths in ``lens`` and configs in ``configs`` (None: all)."""
    return [ch for ch in chunks() if (lens is None or ch.output_len in lens) and (configs is None or ch.config in configs)]


def chunk_state(chunk: Chunk, tag: str, results_dir: Path) -> tuple[str, list[int]]:
    """('done' | 'partial' | 'missing', concurrencies that ran ok)."""
    path = chunk.result_file(tag, results_dir)
    if not path.is_file():
        return "missing", []
    doc = json.loads(path.read_text())
    ok = sorted(r["concurrency"] for r in doc.get("runs", []) if r.get("status") == "ok")
    return ("done" if set(CONCURRENCY) <= set(ok) else "partial"), ok


def status_table(tag: str, results_dir: Path, table: Sequence[Chunk] | None = None) -> str:
    """One row per chunk; the expected seconds of its runs (a config's server start comes on top) come
    from the results' run times (RunClock.seeded), for planning."""
    clock = throughput.RunClock.seeded(results_dir)
    lines = ["| chunk | output len | config | state | concurrencies ok | expected run s |", "|---|---|---|---|---|---|"]
    todo: list[tuple[Chunk, list[int]]] = []
    for ch in chunks() if table is None else table:
        state, ok = chunk_state(ch, tag, results_dir)
        need = chunk_s(clock, ch, missing(ok))
        lines.append(f"| {ch.index} | {ch.output_len} | {ch.config} | {state} | {' '.join(map(str, ok)) or '-'} "
                     f"| {'?' if need is None else f'{need:.0f}'} |")  # fmt: skip
        if state != "done":
            todo.append((ch, missing(ok)))
    runs = [chunk_s(clock, ch, left) for ch, left in todo]
    known = sum(r for r in runs if r is not None)
    configs = len({ch.config for ch, _ in todo})
    lines.append(f"\n{len(todo)} chunks to go over {configs} configs: about {known:.0f} s of runs"
                 + (f" ({runs.count(None)} chunks not estimated)" if None in runs else "")
                 + ", plus at least one server start (60-225 s) per config and per command")  # fmt: skip
    return "\n".join(lines)


def pick(args: argparse.Namespace) -> list[Chunk]:
    """The chunks named by --chunks, or the first --next ones of the --lens/--configs slice not done in
    --results-dir."""
    if args.chunks is not None:
        table = chunks()
        return [table[i] for i in args.chunks]
    todo = [ch for ch in selected(args.lens, args.configs) if chunk_state(ch, args.tag, args.results_dir)[0] != "done"]
    return todo[: args.next]


def missing(ok: Sequence[int]) -> list[int]:
    """The concurrencies of the matrix not among ``ok``: what a chunk still has to run."""
    return [c for c in CONCURRENCY if c not in ok]


def chunk_s(clock: throughput.RunClock, chunk: Chunk, concurrencies: Sequence[int] = CONCURRENCY) -> float | None:
    """Expected seconds of a chunk's runs at ``concurrencies``; None while a run shape has no history."""
    runs = [clock.run_s(chunk.config, c, chunk.output_len, throughput.default_num_prompts(c, WAVES)) for c in concurrencies]
    return None if None in runs else sum(r for r in runs if r is not None)


def server_groups(todo: Sequence[Chunk]) -> list[list[Chunk]]:
    """Runs of consecutive chunks with the same config: each is served by one server start."""
    groups: list[list[Chunk]] = []
    for ch in todo:
        if groups and groups[-1][-1].config == ch.config:
            groups[-1].append(ch)
        else:
            groups.append([ch])
    return groups


def fitting_prefix(clock: throughput.RunClock, group: Sequence[Chunk], left_s: float,
                   todo: dict[int, list[int]] | None = None) -> list[Chunk]:
    """The longest prefix of ``group`` whose server start + runs (``todo``: each chunk's concurrencies still
    to run, default all) fit ``left_s``. A chunk without history counts only the start and is taken only
    first (throughput then skips its runs that cannot fit). Whole chunks only: a chunk cut short would be
    resumed, but by another server start of the same config, and a start (60-225 s) costs more device
    time than the idle end of a command (which ends early and frees the node)."""
    need = clock.startup_s + throughput.STOP_RESERVE_S
    taken: list[Chunk] = []
    for ch in group:
        runs = chunk_s(clock, ch, (todo or {}).get(ch.index, CONCURRENCY))
        if need + (runs or 0.0) > left_s or (runs is None and taken):
            break
        need += runs or 0.0
        taken.append(ch)
    return taken


def run(args: argparse.Namespace) -> int:
    deadline = Deadline(args.time_budget)
    clock = throughput.RunClock.seeded(args.results_dir)
    todo = pick(args)
    if not todo:
        print(f"sweep {args.tag}: every chunk is done", flush=True)
        return 0
    # --chunks measures the named chunks whole (again, if done); --next resumes partial chunks.
    resume = args.chunks is None
    left_c = {ch.index: missing(chunk_state(ch, args.tag, args.results_dir)[1]) if resume else list(CONCURRENCY)
              for ch in todo}  # fmt: skip
    failed = False
    for group in server_groups(todo):
        left = deadline.remaining()
        taken = fitting_prefix(clock, group, left, left_c)
        for ch in group[len(taken):]:
            need = chunk_s(clock, ch, left_c[ch.index])
            guess = "unknown" if need is None else f"about {need:.0f} s of runs"
            print(f"sweep {args.tag}: chunk {ch.index} ({ch.config}, {ch.output_len}) not started: {guess} "
                  f"after a {clock.startup_s:.0f} s server start, {left:.0f} s left", flush=True)  # fmt: skip
        if not taken:
            continue
        lens = [ch.output_len for ch in taken]
        config = taken[0].config
        argv = ["--model", args.model, "--data-dir", str(args.data_dir), "--out", str(args.out),
                "--configs", config, "--output-len", ",".join(map(str, lens)),
                "--concurrency", ",".join(map(str, CONCURRENCY)), "--waves", str(WAVES),
                "--run-id", f"sweep-{args.tag}-{{output_len}}",
                "--log-name", f"throughput_sweep-{args.tag}-{'-'.join(map(str, lens))}_{file_stem(config)}.log",
                "--time-budget", f"{left:.0f}", *(["--resume", str(args.results_dir)] if resume else [])]  # fmt: skip
        failed |= throughput.main(argv, clock) != 0
    return 1 if failed else 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    for name in ("status", "run"):
        s = sub.add_parser(name)
        s.add_argument("--tag", required=True, help="names the measured commit; part of every run id")
        s.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS, help="where finished chunks are looked up")
        s.add_argument("--lens", default=None, help=f"comma-separated output lengths of {OUTPUT_LENS} (default: all)")
        s.add_argument("--configs", default=None, help=f"comma-separated configs of {CONFIGS} (default: all)")
    r = sub.choices["run"]
    r.add_argument("--model", required=True, help="model folder (also the tokenizer)")
    r.add_argument("--data-dir", type=Path, required=True, help="folder with aime24.jsonl / amc23.jsonl")
    r.add_argument("--out", type=Path, required=True, help="output folder (on the GPU node: $OUT)")
    which = r.add_mutually_exclusive_group(required=True)
    which.add_argument("--chunks", default=None, help="comma-separated chunk indices (see status), measured whole")
    which.add_argument("--next", type=int, default=None,
                       help="run the first N chunks not done (a partial one: only its missing concurrencies)")
    r.add_argument("--time-budget", type=float, default=560.0, help="seconds for the whole command")
    args = p.parse_args(argv)
    if not args.tag or not all(ch.isalnum() or ch in "._-" for ch in args.tag):
        p.error(f"--tag must be letters, digits, '.', '_' or '-' (it is part of file names), got {args.tag!r}")
    try:
        args.lens = None if args.lens is None else [int(x) for x in args.lens.split(",") if x.strip()]
    except ValueError:
        p.error(f"--lens must be comma-separated integers, got {args.lens!r}")
    if args.lens is not None and (not args.lens or not set(args.lens) <= set(OUTPUT_LENS)):
        p.error(f"--lens must name output lengths of {OUTPUT_LENS}, got {args.lens}")
    args.configs = None if args.configs is None else [x.strip() for x in args.configs.split(",") if x.strip()]
    if args.configs is not None and (not args.configs or not set(args.configs) <= set(CONFIGS)):
        p.error(f"--configs must name configs of {CONFIGS}, got {args.configs}")
    if args.command == "run":
        if args.chunks is not None and (args.lens is not None or args.configs is not None):
            p.error("--chunks names chunks by index: leave out --lens/--configs")
        if args.chunks is not None:
            try:
                args.chunks = [int(x) for x in args.chunks.split(",") if x.strip()]
            except ValueError:
                p.error(f"--chunks must be comma-separated integers, got {args.chunks!r}")
            if not args.chunks or not all(0 <= i < len(chunks()) for i in args.chunks):
                p.error(f"--chunks must name chunks 0..{len(chunks()) - 1}")
        if args.next is not None and args.next < 1:
            p.error("--next must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "status":
        print(status_table(args.tag, args.results_dir, selected(args.lens, args.configs)))
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
