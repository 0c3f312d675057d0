"""The reliability run's load phase: mixed requests against the server, some dropped by the client.

``plan_load`` draws the requests (prompt repeats, output lengths, temperatures, streaming, which ones
the client abandons and when), ``run_load`` sends them with a bounded number in flight while watching
the server, and ``latency_summary`` condenses what came back.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import random
import statistics
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.client import parse_generate_reply
from benchmarks.runlog import Deadline
from benchmarks.server import STOP_RESERVE_S, Server

AFTER_LOAD_S = 90.0  # kept back from the load phase for the bad inputs, idle and the second probe


@dataclass(frozen=True)
class LoadRequest:
    """One request of the load phase; ``abort_after`` = SSE events read before closing (streamed) or
    the client timeout in seconds (not streamed); None = read to the end. A planned abort ignores EOS:
    it must still be generating when the client leaves."""

    input_ids: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    stream: bool
    abort_after: float | None
    ignore_eos: bool = False


@dataclass
class Outcome:
    kind: str  # ok | aborted | error
    stream: bool
    latency_s: float
    ttft_s: float | None = None
    error: str | None = None


def plan_load(prompts: Sequence[Sequence[int]], n: int, aborts: int, max_new: int, seed: int) -> list[LoadRequest]:
    """``n`` requests; ``aborts`` of them (chosen at random) are dropped by the client.

    A planned abort asks for ``max_new`` tokens with EOS ignored so that it is still generating when
    the client leaves: a streamed one closes after 1-4 events, a non-streamed one times out after
    0.2-1 s (the H100 run of 798cdd4 finished 50 of 200 planned aborts that asked for 1000 tokens
    within a 0.3-2 s timeout; the run of 5653bde, asking for 3000 without ignoring EOS, 28 of 200:
    sampled SmolLM2 answers often end within a few events).
    """
    if not 0 <= aborts <= n:
        raise ValueError(f"aborts must be in [0, {n}], got {aborts}")
    rng = random.Random(seed)
    dropped = set(rng.sample(range(n), aborts))
    plan = []
    for i in range(n):
        ids = [t for _ in range(rng.randint(1, 8)) for t in rng.choice(prompts)]
        new = round(math.exp(rng.uniform(math.log(8), math.log(max_new))))
        stream = rng.random() < 0.4
        abort = None
        if i in dropped:
            abort = float(rng.randint(1, 4)) if stream else rng.uniform(0.2, 1.0)
            new = max_new
        temperature, top_p = rng.choice([0.0, 0.6, 1.0]), rng.choice([1.0, 0.95, 0.8])
        plan.append(LoadRequest(ids, new, temperature, top_p, stream, abort, ignore_eos=abort is not None))
    return plan


def post_json(url: str, body: Any, timeout: float):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def run_one(base_url: str, r: LoadRequest, timeout: float) -> Outcome:
    body = {
        "input_ids": r.input_ids,
        "stream": r.stream,
        "sampling_params": {
            "max_new_tokens": r.max_new_tokens,
            "temperature": r.temperature,
            "top_p": r.top_p,
            "ignore_eos": r.ignore_eos,
        },
    }
    t0 = time.monotonic()
    ttft = None
    try:
        if not r.stream:
            with post_json(base_url + "/generate", body, r.abort_after or timeout) as resp:
                parse_generate_reply(json.loads(resp.read()))
            return Outcome("ok", False, time.monotonic() - t0)
        events = 0
        with post_json(base_url + "/generate", body, timeout) as resp:
            for line in resp:
                if not line.startswith(b"data:"):
                    continue
                if line.strip() == b"data: [DONE]":
                    return Outcome("ok", True, time.monotonic() - t0, ttft)
                if b'"error"' in line[:20]:
                    raise ValueError(line.decode()[:300])
                ttft = ttft if ttft is not None else time.monotonic() - t0
                events += 1
                if r.abort_after is not None and events >= r.abort_after:
                    return Outcome("aborted", True, time.monotonic() - t0, ttft)  # closing the response drops it
        raise ValueError("stream ended without [DONE]")
    except (TimeoutError, urllib.error.URLError) as e:
        if isinstance(e, urllib.error.URLError) and not isinstance(e.reason, TimeoutError):
            return Outcome("error", r.stream, time.monotonic() - t0, ttft, f"URLError: {e.reason}"[:300])
        kind = "aborted" if r.abort_after is not None and not r.stream else "error"
        return Outcome(kind, r.stream, time.monotonic() - t0, ttft, None if kind == "aborted" else "timeout")
    except (OSError, ValueError) as e:
        return Outcome("error", r.stream, time.monotonic() - t0, ttft, f"{type(e).__name__}: {e}"[:300])


def run_load(server: Server, plan: Sequence[LoadRequest], concurrency: int, deadline: Deadline) -> list[Outcome]:
    """Every request with at most ``concurrency`` in flight; stops (ServerError) if the server dies,
    and leaves the unfinished ones when only the later phases' time is left."""
    reserve = STOP_RESERVE_S + AFTER_LOAD_S
    timeout = max(30.0, deadline.remaining() - reserve)
    pool = cf.ThreadPoolExecutor(max_workers=concurrency)
    try:
        futures = [pool.submit(run_one, server.base_url, r, timeout) for r in plan]
        pending = set(futures)
        while pending:
            _, pending = cf.wait(pending, timeout=1.0)
            server.check_alive()
            if pending and deadline.remaining() < reserve:
                break
        return [f.result() for f in futures if f.done()]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def latency_summary(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    def pct(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        q = statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1 else values * 99
        return {"p50": q[49], "p90": q[89], "p99": q[98], "max": max(values)}

    done = [o for o in outcomes if o.kind == "ok"]
    return {
        "e2e_s_non_streamed": pct([o.latency_s for o in done if not o.stream]),
        "e2e_s_streamed": pct([o.latency_s for o in done if o.stream]),
        "ttft_s_streamed": pct([o.ttft_s for o in outcomes if o.ttft_s is not None]),
    }
