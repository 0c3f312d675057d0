"""Per-request latency and accept length at one concurrency: which requests make the E2E tail, and why?

    python -m benchmarks.request_tail --model M --data-dir D --out F.json \
        [--configs pillar,pillar-streaming] [--concurrency 128] [--num-prompts 128] [--max-new-tokens 7000]

A one-wave throughput run ends with its slowest request, so a few slow requests set its out tok/s.
This sends the throughput harness's prompts (token ids, greedy, ignore_eos) to each config's server
in turn, ``--concurrency`` at a time, and records per request: prompt, start and end, completion
tokens, verify rounds and accept length. Every running request advances once per forward, so a
request that verified more rounds (a lower accept length) finishes later: if the slowest requests
are those with the most rounds, the tail is their acceptance (what the draft policy made of those
prompts); if they verified no more rounds than the others but took longer, it is scheduling.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.configs import file_stem, resolve_config
from benchmarks.meta import new_run_id, run_metadata
from benchmarks.request_paths import request
from benchmarks.runlog import RunLog, write_json
from benchmarks.server import Server, install_signal_handlers, start_recorded
from benchmarks.workload import DEFAULT_DATASETS, Prompt, build_prompts, load_tokenizer

SLOWEST = 5  # rows listed per config in the summary


def _pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100) of a non-empty list."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))]


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Latency and accept-length spread of one config's requests, and how far verify rounds explain latency.

    ``rounds_ratio_slowest`` = mean verify rounds of the slowest ``SLOWEST`` requests / mean of all: near
    their latency ratio when acceptance makes the tail, near 1 when scheduling does."""
    ok = [r for r in rows if r.get("error") is None and r.get("spec_verify_ct")]
    if not ok:
        return {"requests_ok": 0}
    end = [r["end_s"] for r in ok]
    rounds = [float(r["spec_verify_ct"]) for r in ok]
    slow = sorted(ok, key=lambda r: r["end_s"], reverse=True)[:SLOWEST]
    try:
        corr: float | None = statistics.correlation(end, rounds)
    except statistics.StatisticsError:  # fewer than 2 requests, or constant end times or rounds
        corr = None
    return {
        "requests_ok": len(ok),
        "end_s_mean": statistics.fmean(end), "end_s_p50": _pct(end, 50), "end_s_p99": _pct(end, 99), "end_s_max": max(end),
        "accept_mean": statistics.fmean(r["spec_accept_length"] for r in ok),
        "accept_min": min(r["spec_accept_length"] for r in ok),
        "corr_end_vs_rounds": corr,
        "latency_ratio_slowest": statistics.fmean(r["end_s"] for r in slow) / statistics.fmean(end),
        "rounds_ratio_slowest": statistics.fmean(float(r["spec_verify_ct"]) for r in slow) / statistics.fmean(rounds),
        "slowest": [{k: r[k] for k in ("request", "source", "end_s", "spec_verify_ct", "spec_accept_length")} for r in slow],
    }  # fmt: skip


def drive(base_url: str, prompts: list[Prompt], concurrency: int, max_new: int, timeout_s: float) -> list[dict[str, Any]]:
    """All ``prompts`` at ``concurrency`` in flight; per request its times relative to the first send."""
    t0 = time.monotonic()

    def one(i: int) -> dict[str, Any]:
        start = time.monotonic() - t0
        row: dict[str, Any] = {"request": i, "source": prompts[i].source, "start_s": start}
        try:
            row.update(request(base_url, "ids", prompts[i].input_ids, prompts[i].text, max_new, timeout_s))
            row["error"] = None
        except OSError as e:  # URLError, timeouts, a dead server: recorded, the other requests go on
            row["error"] = f"{type(e).__name__}: {e}"
        row["end_s"] = time.monotonic() - t0
        return row

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(one, range(len(prompts))))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model folder (also the tokenizer)")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True, help="result JSON; the server logs go beside it")
    p.add_argument("--configs", default="pillar,pillar-streaming", help="comma-separated, each on its own server")
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--num-prompts", type=int, default=None, help="default: --concurrency (one wave)")
    p.add_argument("--max-new-tokens", type=int, default=7000)
    p.add_argument("--extra-server-args", default="")
    p.add_argument("--startup-timeout", type=float, default=400.0)
    p.add_argument("--request-timeout", type=float, default=900.0)
    args = p.parse_args(argv)
    if args.concurrency < 1 or (args.num_prompts is not None and args.num_prompts < 1):
        p.error("--concurrency and --num-prompts must be >= 1")
    names = [c for c in args.configs.split(",") if c]
    try:
        configs = {n: resolve_config(n, tuple(shlex.split(args.extra_server_args))) for n in names}
    except ValueError as e:
        p.error(str(e))
    if not configs or not all(c.speculative for c in configs.values()):
        p.error(f"--configs must name speculative configs (no verify rounds without one), got {args.configs!r}")
    install_signal_handlers()
    prompts = build_prompts(load_tokenizer(args.model), args.data_dir, args.num_prompts or args.concurrency, DEFAULT_DATASETS)
    log = RunLog(args.out.with_suffix(".log"))
    doc: dict[str, Any] = {"kind": "request_tail", "meta": run_metadata(new_run_id()), "concurrency": args.concurrency,
                           "max_new_tokens": args.max_new_tokens, "runs": []}  # fmt: skip
    failed = False
    for name, config in configs.items():
        env = config.environment({})
        run: dict[str, Any] = {"config": name, "flags": list(config.flags), "env": env,
                               "pillar_config": config.pillar_config({}), "rows": []}  # fmt: skip
        doc["runs"].append(run)
        server_log = args.out.with_name(f"{args.out.stem}_{file_stem(name)}.server.log")
        with Server.sglang(args.model, config.flags, log_path=server_log, env=env) as server:
            if not start_recorded(server, name, run, args.startup_timeout, log):
                failed = True
                write_json(args.out, doc)
                continue
            log.line(f"{name}: server up after {run['startup_s']:.0f} s; {len(prompts)} requests at c={args.concurrency}")
            run["rows"] = drive(server.base_url, prompts, args.concurrency, args.max_new_tokens, args.request_timeout)
        run["summary"] = s = summarize(run["rows"])
        failed |= s["requests_ok"] < len(prompts)
        log.line(f"{name}: {json.dumps({k: v for k, v in s.items() if k != 'slowest'}, default=str)}")
        for r in s.get("slowest", []):
            log.line(f"{name}:   slow {json.dumps(r)}")
        write_json(args.out, doc)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
