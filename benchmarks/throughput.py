"""Serving throughput per config and concurrency, measured with SGLang's bench_serving.

    python -m benchmarks.throughput --model M --data-dir D --out DIR \\
        --configs stock,pillar[,ngram,stock-flashinfer,pillar-k4] --concurrency 1,16,64 \\
        --output-len 2048[,4096,...] [--waves 2 | --num-prompts-per-conc N] [--time-budget 540] \\
        [--run-id ID] [--resume DIR]

Each config's server starts once; every output length and concurrency runs against it with fixed-length outputs
(ignore_eos) on the AIME24+AMC23 chat prompts. Every run goes through bench_serving's own command line, in one
long-lived client process (benchmarks/bench_driver.py) that imports it while the first server boots. Writes
``DIR/throughput_<run>_<config>.json`` per config and length (rewritten after every run; with several lengths the
run id holds ``{output_len}``) and one progress log, prints a progress line per run and a markdown table at the end.
A server that dies or fails to start marks its runs failed and the next config goes on; runs that no longer fit
``--time-budget`` are skipped and listed. A result file already in DIR is never replaced without ``--resume``: a
second comparison needs its own run id. ``--resume DIR`` keeps the ok runs of a result file of the same name in DIR
(an earlier command's, copied back into the tree) when config and workload match, and runs only the rest, so one
comparison too long for one device command is finished by the next (a config whose runs are all kept starts no
server). Exit code 0 when nothing failed (skips allowed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.bench_driver import BenchDriver
from benchmarks.configs import CONFIGS_HELP, add_server_options, file_stem, parse_env, resolve_config
from benchmarks.meta import device_name, new_run_id, provenance, run_metadata
from benchmarks.report import DEFAULT_RESULTS, load_results, throughput_rows, throughput_table
from benchmarks.run_clock import RunClock
from benchmarks.runlog import Deadline, RunLog
from benchmarks.server import install_signal_handlers
from benchmarks.serving_run import Workload
from benchmarks.throughput_runs import Invocation, Segment, run_config
from benchmarks.workload import (
    DEFAULT_DATASETS,
    build_prompts,
    load_tokenizer,
    prompt_token_stats,
    write_bench_serving_file,
)


def default_num_prompts(concurrency: int, waves: int = 2) -> int:
    # Two waves of requests by default: the second starts while the first drains, so the batch
    # stays near full for most of the run (with fixed-length outputs one wave also keeps it full,
    # at half the time); at least 4 so concurrency 1 averages a few requests.
    return max(waves * concurrency, 4)


def resumable_runs(earlier: Path, doc: dict[str, Any]) -> tuple[dict[int, dict[str, Any]], str]:
    """The ok runs of ``earlier`` (an earlier command's result file of ``doc``'s name) that ``doc`` keeps
    instead of running again, by concurrency, and why none are kept. Kept only when the config (name,
    flags, environment, resolved PILLAR knobs) and the workload are the same and the run sent as many
    requests. A kept run carries ``measured``: the provenance of the command that ran it and that
    command's ``server`` record (its full command line), since the doc's ``meta`` and ``server`` are the
    new command's, whose server may not even start."""
    if not earlier.is_file():
        return {}, f"no earlier {earlier.name}"
    old = json.loads(earlier.read_text())
    for part, keys in (
        ("config", ("name", "flags", "env", "pillar_config")),
        ("workload", ("kind", "output_len", "input_len", "temperature", "top_p", "datasets", "request_rate")),
    ):
        for key in keys:
            if old.get(part, {}).get(key) != doc[part].get(key):
                return {}, f"{earlier.name}: {part}.{key} differs"
    want = doc["workload"]["num_prompts"]
    kept = {
        r["concurrency"]: {
            **r,
            "measured": r.get("measured") or {**provenance(old["meta"]), "server": old.get("server")},
        }
        for r in old.get("runs", [])
        if r.get("status") == "ok" and want.get(str(r["concurrency"])) == r.get("num_prompts")
    }
    return kept, "" if kept else f"{earlier.name}: no ok run with the same request count"


def parse_int_list(text: str, flag: str, parser: argparse.ArgumentParser) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        parser.error(f"{flag} must be comma-separated integers, got {text!r}")
    if not values or min(values) < 1:
        parser.error(f"{flag} needs positive integers, got {text!r}")
    return values


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model folder (also the tokenizer)")
    p.add_argument("--data-dir", type=Path, required=True, help="folder with aime24.jsonl / amc23.jsonl")
    p.add_argument("--out", required=True, type=Path, help="output folder (on the GPU node: $OUT)")
    p.add_argument("--configs", default="stock,pillar", help=CONFIGS_HELP)
    p.add_argument("--concurrency", default="1,16,64")
    p.add_argument(
        "--output-len",
        default="2048",
        help="output tokens per request; a comma list runs each length on the same server start",
    )
    p.add_argument("--waves", type=int, default=2, help="requests per concurrency: max(waves*concurrency, 4)")
    p.add_argument("--num-prompts-per-conc", type=int, default=None, help="a fixed request count instead of --waves")
    p.add_argument("--datasets", default=",".join(DEFAULT_DATASETS))
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling for every request (1: off)")
    p.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="requests per second, Poisson arrivals (default inf: all at once, paced by --concurrency); "
        "a finite rate measures latency at a fixed load",
    )
    add_server_options(p, 540.0)
    p.add_argument(
        "--run-id",
        default=None,
        help="share one id across invocations of one comparison; with several --output-len it must "
        "contain {output_len} (each length is its own comparison)",
    )
    p.add_argument("--work-dir", type=Path, default=None, help="server/bench logs and prompt files (default: temp dir)")
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="DIR",
        help="keep the ok runs of same-named result files in DIR (e.g. benchmarks/results/throughput) and run the rest",
    )
    args = p.parse_args(argv)
    args.config_names = [c for c in args.configs.split(",") if c]
    try:
        args.server_configs = [resolve_config(c, tuple(shlex.split(args.extra_server_args))) for c in args.config_names]
    except ValueError as e:
        p.error(str(e))
    if len(set(args.config_names)) != len(args.config_names):
        p.error(f"--configs lists a config twice: {args.configs}")
    args.concurrencies = parse_int_list(args.concurrency, "--concurrency", p)
    args.output_lens = parse_int_list(args.output_len, "--output-len", p)
    if min(args.output_lens) < 4:
        p.error("--output-len must be >= 4 (bench_serving rejects shorter fixed outputs)")
    if len(set(args.output_lens)) != len(args.output_lens):
        p.error(f"--output-len lists a length twice: {args.output_len}")
    if args.num_prompts_per_conc is not None and args.num_prompts_per_conc < 1:
        p.error("--num-prompts-per-conc must be >= 1")
    if args.waves < 1:
        p.error("--waves must be >= 1")
    if args.temperature < 0 or not 0.0 < args.top_p <= 1.0:
        p.error("--temperature must be >= 0 and --top-p in (0, 1]")
    if not args.request_rate > 0:
        p.error(f"--request-rate must be > 0 (inf: all at once), got {args.request_rate}")
    if args.resume is not None and not args.resume.is_dir():
        p.error(f"--resume must be a folder of result files, got {args.resume}")
    try:
        args.env = parse_env(args.env)
    except ValueError as e:
        p.error(str(e))
    args.datasets = tuple(d for d in args.datasets.split(",") if d)
    args.run_id = args.run_id or (new_run_id() + ("-{output_len}" if len(args.output_lens) > 1 else ""))
    if len(args.output_lens) > 1 and "{output_len}" not in args.run_id:
        p.error("several --output-len need a --run-id containing {output_len}")
    if args.run_id.replace("{output_len}", "").count("{") or args.run_id.count("}") != args.run_id.count(
        "{output_len}"
    ):
        p.error(f"--run-id may contain only the placeholder {{output_len}}, got {args.run_id!r}")
    earlier = [path for path in result_paths(args).values() if path.exists()]
    if earlier and args.resume is None:  # a second comparison under one run id would replace the first's files
        p.error(
            f"{earlier[0]} exists (an earlier command's results): give this comparison its own --run-id, or "
            "--resume the folder holding it to keep its runs"
        )
    args.work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="sparsespec-bench-"))
    return args


def result_paths(args: argparse.Namespace) -> dict[tuple[str, int], Path]:
    """The result file of each (config, output length) of the command."""
    return {
        (c.name, n): args.out / f"throughput_{run_id_for(args.run_id, [n])}_{file_stem(c.name)}.json"
        for c in args.server_configs
        for n in args.output_lens
    }


def run_id_for(template: str, output_lens: Sequence[int]) -> str:
    """The run id of ``output_lens`` (one length: its comparison's id; several: the log's name)."""
    return template.replace("{output_len}", "-".join(map(str, output_lens)))


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    deadline = Deadline(args.time_budget)
    args.out.mkdir(parents=True, exist_ok=True)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    log = RunLog(args.out / f"throughput_{run_id_for(args.run_id, args.output_lens)}.log")
    base_meta = run_metadata(run_id_for(args.run_id, args.output_lens))  # device and versions: queried once
    meta = {n: {**base_meta, "run_id": run_id_for(args.run_id, [n])} for n in args.output_lens}
    log.line(f"throughput run {base_meta['run_id']} on {base_meta['device']}; logs and prompt files in {args.work_dir}")

    num_prompts = {c: args.num_prompts_per_conc or default_num_prompts(c, args.waves) for c in args.concurrencies}
    files: dict[int, Path] = {}
    tokenizer = load_tokenizer(args.model)
    for n in sorted(set(num_prompts.values())):
        prompts = build_prompts(tokenizer, args.data_dir, n, args.datasets)
        files[n] = args.work_dir / f"prompts_{n}.jsonl"
        write_bench_serving_file(files[n], prompts)
    prompt_doc = {"datasets": list(args.datasets), "prompt_tokens": prompt_token_stats(prompts)}

    def workload_doc(output_len: int) -> dict[str, Any]:
        # kind and input_len stay in the record: --resume matches them against earlier files
        return {
            "kind": "aime",
            "output_len": output_len,
            "input_len": None,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "ignore_eos": True,
            "request_rate": "inf" if math.isinf(args.request_rate) else args.request_rate,
            "num_prompts": {str(c): n for c, n in num_prompts.items()},
            **prompt_doc,
        }

    docs = []
    paths = result_paths(args)
    clock = RunClock.seeded(load_results(DEFAULT_RESULTS)[0], device=device_name())
    with BenchDriver(args.work_dir / "bench_driver.log") as driver:
        inv = Invocation(args, deadline, clock, log, driver)
        for config in args.server_configs:
            segments = []
            for n in args.output_lens:
                doc: dict[str, Any] = {
                    "kind": "throughput",
                    "schema": 1,
                    "meta": meta[n],
                    "config": {
                        "name": config.name,
                        "flags": list(config.flags),
                        "env": config.environment(args.env),
                        "pillar_config": config.pillar_config(args.env),
                    },
                    "workload": workload_doc(n),
                    "server": {},
                    "runs": [],
                }
                out_path = paths[(config.name, n)]
                kept: dict[int, dict[str, Any]] = {}
                if args.resume is not None:
                    kept, why_not = resumable_runs(args.resume / out_path.name, doc)
                    log.line(
                        f"{config.name} len={n}: resumed c={','.join(map(str, sorted(kept)))} from {args.resume}"
                        if kept
                        else f"{config.name} len={n}: nothing resumed ({why_not})"
                    )
                segments.append(
                    Segment(Workload(n, args.temperature, args.top_p, files, args.request_rate), doc, out_path, kept)
                )
            run_config(config, segments, args.concurrencies, num_prompts, inv)
            docs.extend(seg.doc for seg in segments)

    statuses = [r["status"] for d in docs for r in d["runs"]]
    skipped = [
        f"{d['config']['name']} len={d['workload']['output_len']} c={r['concurrency']}"
        for d in docs
        for r in d["runs"]
        if r["status"] == "skipped"
    ]
    print("\n" + throughput_table(throughput_rows(docs)) + "\n", flush=True)
    if skipped:
        log.line(f"SKIPPED {len(skipped)} runs for the time budget: {', '.join(skipped)}")
    resumed = sum("measured" in r for d in docs for r in d["runs"])
    log.line(
        f"done: {statuses.count('ok')} ok ({resumed} resumed), {statuses.count('failed')} failed, "
        f"{len(skipped)} skipped -> {args.out}"
    )
    return 1 if "failed" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
