"""Acceptance of the draft policies on the real model, all in one run.

    python -m benchmarks.acceptance --model M --data-dir D --out F.json \\
        [--configs pillar,pillar-coarse,pillar-streaming,pillar-oracle] [--temps 0,0.6] \\
        [--max-new-tokens 4096] [--num-prompts 32] [--datasets aime24]

Each config's server starts once and answers every prompt at every temperature with
fixed-length outputs (ignore_eos), so all policies draft over the same contexts. Per
(config, temperature): accept length (tokens per verify step, bonus included) and the
share of verify steps that accepted at least j drafts, j = 1..k, from SGLang's own
per-request histograms. ``pillar-oracle`` (each draft query's own exact top-K) is an
upper bound for analysis, not a serving mode. Writes F.json (rewritten after every pass)
and F.log; exit code 0 when every pass finished.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.configs import CONFIGS_HELP, add_server_options, resolve_config
from benchmarks.meta import run_metadata
from benchmarks.passes import PassResult, parse_pass_options, prompt_settings, run_passes
from benchmarks.runlog import write_json
from benchmarks.server import begin
from benchmarks.workload import build_prompts, load_tokenizer

DEFAULT_CONFIGS = "pillar,pillar-coarse,pillar-streaming,pillar-oracle"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model folder (also the tokenizer)")
    p.add_argument("--data-dir", type=Path, required=True, help="folder with aime24.jsonl / amc23.jsonl")
    p.add_argument("--out", type=Path, required=True, help="result JSON path; the log goes beside it (.log)")
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help=CONFIGS_HELP)
    p.add_argument("--temps", default="0,0.6")
    p.add_argument("--datasets", default="aime24")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=4096)
    p.add_argument("--concurrency", type=int, default=0, help="requests in flight (0 = all at once)")
    add_server_options(p)
    p.add_argument("--run-id", default=None)
    p.add_argument("--server-log-dir", type=Path, default=None, help="full server logs (default: a temp dir)")
    args = p.parse_args(argv)
    if args.num_prompts < 1 or args.max_new_tokens < 1:
        p.error("--num-prompts and --max-new-tokens must be >= 1")
    try:
        args.temps = [float(t) for t in args.temps.split(",") if t.strip()]
    except ValueError as e:
        p.error(str(e))
    parse_pass_options(p, args)
    args.configs = [c for c in args.configs.split(",") if c]
    for name in args.configs:
        try:
            if not resolve_config(name).speculative:
                p.error(f"config {name!r} does not speculate; acceptance needs a speculative config")
        except ValueError as e:
            p.error(str(e))
    return args


def table(results: dict[str, list[dict[str, Any]]]) -> str:
    """Markdown: one row per (config, temperature) pass."""
    lines = [
        "| config | T | accept len | accept rate by draft position (>= j accepted) | status |",
        "|---|---|---|---|---|",
    ]
    for name, passes in results.items():
        for p in passes:
            al = p.get("accept_length_overall")
            rates = " ".join(f"{r:.2f}" for r in p.get("accept_rate_by_position") or []) or "-"
            al_text = f"{al:.2f}" if al else "-"
            lines.append(f"| {name} | {p['temperature']} | {al_text} | {rates} | {p['status']} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    deadline, log = begin(args.time_budget, args.out.with_suffix(".log"))
    doc: dict[str, Any] = {
        "kind": "acceptance",
        "schema": 1,
        "meta": run_metadata(args.run_id),
        "settings": {**prompt_settings(args), "ignore_eos": True, "temps": args.temps},
        "servers": {},
        "results": {},
    }
    write_json(args.out, doc)
    tokenizer = load_tokenizer(args.model)
    prompts = build_prompts(tokenizer, args.data_dir, args.num_prompts, args.datasets)
    log.line(
        f"acceptance run {args.run_id} on {doc['meta']['device']}: {len(prompts)} prompts, "
        f"{sum(len(p.input_ids) for p in prompts)} prompt tokens; server logs in {args.server_log_dir}"
    )
    all_ok = True
    for name in args.configs:
        passes = [PassResult(name, t, args.max_new_tokens, ignore_eos=True) for t in args.temps]
        doc["servers"][name] = run_passes(
            resolve_config(name, args.extra_server_args), passes, prompts, args, deadline, log
        )
        doc["results"][name] = [p.summary() for p in passes]
        for s in doc["results"][name]:
            s.pop("accept_length_per_request", None)  # the pooled numbers are what this run compares
        all_ok &= all(p.status == "ok" for p in passes)
        write_json(args.out, doc)
    doc["all_passes_ok"] = all_ok
    write_json(args.out, doc)
    log.block("acceptance by policy", table(doc["results"]))
    log.line(f"wrote {args.out}")
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
