"""One (context L, batch B) point of the step-time benchmark on a running server.

``measure_point`` sends B requests of L random prompt ids through an unmeasured pass of M1 tokens, then
the measured M1 and M2 passes (ignore_eos), and reads the step time off their walls, SGLang's decode
log and PILLAR's timing reports of the M2 pass; ``profile_pass`` profiles a window of scheduler steps
of a third pass. ``pool_skip_reason`` says why a point cannot run as one batch.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import random
import statistics
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.client import generate_all
from benchmarks.server import Server, decode_intervals, http_json
from benchmarks.trace_summary import load_trace, summarize
from sglang_sparsespec.rounds.timing import GAP, PHASES, parse_reports

# KV slots per request beyond prompt + output: room for the draft tokens a speculative round
# allocates past the committed ones, so a point that fits never runs at the pool's very edge.
KV_SLACK = 16


def random_prompts(n: int, length: int, seed: int, vocab_size: int) -> list[list[int]]:
    """Token ids in [1000, min(100000, vocab_size)): past the special tokens, inside the embedding table
    (SmolLM2's has 49152 rows, Qwen3's 151936)."""
    rng = random.Random(seed)
    return [[rng.randrange(1000, min(100000, vocab_size)) for _ in range(length)] for _ in range(n)]


def kv_pool_tokens(server: Server) -> int | None:
    """Tokens the server's KV pool holds. SGLang 0.5.17's /server_info merges in the scheduler's start-up
    info (Scheduler.get_init_info), whose ``max_total_num_tokens`` is the pool size; None if unreadable."""
    try:
        info = http_json(server.base_url + "/server_info", timeout=30)
    except (OSError, ValueError):
        return None
    pool = info.get("max_total_num_tokens") if isinstance(info, dict) else None
    return pool if isinstance(pool, int) else None


def pool_skip_reason(length: int, batch: int, pool: int | None, args: argparse.Namespace) -> str | None:
    """Why (L, B) cannot run as one batch: requests that do not fit the KV pool would queue."""
    need = batch * (length + args.m_max + KV_SLACK)
    if pool is None or need <= pool:
        return None
    return f"KV pool: {batch} x ({length} + {args.m_max} + {KV_SLACK}) = {need} tokens > {pool}"


def sampling(args: argparse.Namespace, tokens: int) -> dict[str, Any]:
    """Sampling parameters of every request of the run: ``tokens`` output tokens, no early stop."""
    return {"temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": tokens, "ignore_eos": True}


def measure_point(server: Server, length: int, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """Walls of the M1 and M2 passes and the PILLAR timing reports logged during the M2 pass."""
    prompts = random_prompts(batch, length, seed=length * 1000 + batch, vocab_size=args.vocab_size)
    # An unmeasured M1 pass first, so that one-time costs of a server's first long prefill cannot land in the
    # M1 wall alone (stock at 256 x 2K, the first point of 388e953's server: 4.0 ms per step against 6.7 ms of
    # kernel time; a staggered admission, see --decode-tokens, is the other suspect).
    generate_all(server, prompts, sampling(args, args.m1), concurrency=batch, timeout_s=240)
    walls = {}
    for m in (args.m1, args.m2):
        offset = server.log_path.stat().st_size if server.log_path.exists() else 0
        t0 = time.monotonic()
        outs = generate_all(server, prompts, sampling(args, m), concurrency=batch, timeout_s=240)
        walls[m] = time.monotonic() - t0
        if any(o.completion_tokens != m for o in outs):
            raise RuntimeError(f"expected {m} tokens per request at L={length}, B={batch}")
    # offset is the log size before the M2 pass: its reports are the ones that count.
    with open(server.log_path, "rb") as f:
        f.seek(offset)
        log = f.read().decode("utf-8", "replace")
    reports = parse_reports(log)
    row: dict[str, Any] = {"context": length, "batch": batch, "wall_m1_s": walls[args.m1], "wall_m2_s": walls[args.m2]}
    row["step_ms"] = 1000 * (walls[args.m2] - walls[args.m1]) / (args.m2 - args.m1)
    # SGLang's own decode log of the M2 pass (its full-batch intervals): the served time per step
    # (stock) or per output token (PILLAR), free of the prefill that the wall difference must cancel
    # (at 256 x 2K the wall difference gave 4.0 and 8.1 ms on two runs of one commit's stock server).
    if served := [ms for running, _, ms in decode_intervals(log) if running == batch]:
        row["log_step_ms"], row["log_intervals"] = statistics.median(served), len(served)
    # Rounds at the full batch only: ramp-up and drain rounds run smaller batches.
    full = [r for r in reports if r.batch >= 0.9 * batch]
    if full:
        n = sum(r.rounds for r in full)
        for p in (*PHASES, GAP):
            row[f"{p}_ms"] = sum(r.ms[p] * r.rounds for r in full) / n
        row["round_ms"] = sum(row[f"{p}_ms"] for p in PHASES)
        row["timed_rounds"] = n
    if args.profile_steps:
        try:  # the point's times stand without it
            row["profile"] = profile_pass(server, prompts, args, delay_s=1.2 * walls[args.m1])
        except (OSError, TimeoutError, ValueError, RuntimeError) as e:
            row["profile_error"] = f"{type(e).__name__}: {e}"
    return row


def profile_pass(server: Server, prompts: list[list[int]], args: argparse.Namespace, delay_s: float) -> dict[str, Any]:
    """Kernel time of ``args.profile_steps`` scheduler steps (rounds) in the middle of a decode pass.

    The profile starts ``delay_s`` into the pass (past the prefill and the M1 tokens) and the pass
    decodes 10 tokens per profiled step more than M2, so even rounds of 9 tokens stay in decode."""
    out_dir = Path(tempfile.mkdtemp(prefix="profile-", dir=args.work_dir))
    activities = ["CPU", "GPU"] if args.profile_host else ["GPU"]
    request = {
        "output_dir": str(out_dir),
        "num_steps": args.profile_steps,
        "activities": activities,
        "with_stack": args.profile_stack,
        "record_shapes": False,
    }
    pool = cf.ThreadPoolExecutor(max_workers=1)
    try:
        tokens = args.m_max
        done = pool.submit(
            generate_all, server, prompts, sampling(args, tokens), concurrency=len(prompts), timeout_s=240
        )
        time.sleep(delay_s)
        try:  # a profile whose window outlasted the last pass stops at the next step: end it first
            urllib.request.urlopen(server.base_url + "/stop_profile", timeout=120).close()
        except urllib.error.HTTPError:
            pass  # none in progress
        post = urllib.request.Request(
            server.base_url + "/start_profile",
            data=json.dumps(request).encode(),
            headers={"Content-Type": "application/json"},
        )
        try:
            urllib.request.urlopen(post, timeout=120).close()  # the reply is plain text
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"/start_profile: HTTP {e.code}: {e.read()[:300]!r}") from None
        done.result()
    finally:
        pool.shutdown(wait=True)
    # The scheduler writes the trace after the last profiled step; a file still being written fails to load.
    end = time.monotonic() + 60
    while True:
        try:
            return summarize(load_trace(next(out_dir.glob("*.trace.json*"))), args.profile_steps)
        except (StopIteration, OSError, EOFError, ValueError) as e:
            if time.monotonic() > end:
                raise TimeoutError(f"no usable trace in {out_dir} 60 s after the profiled pass: {e!r}") from None
            time.sleep(1.0)
