"""Batches of ``/generate`` requests against one server start, and their acceptance statistics.

Shared by ``lossless`` (greedy identity vs stock) and ``acceptance`` (draft policies).
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.client import GenOutput, generate_all
from benchmarks.configs import ServerConfig, file_stem, parse_env
from benchmarks.meta import new_run_id
from benchmarks.runlog import Deadline, RunLog
from benchmarks.server import (
    MIN_START_S,
    STOP_RESERVE_S,
    Server,
    log_tail,
    start_recorded,
)
from benchmarks.workload import Prompt


@dataclass
class PassResult:
    """One batch of requests against one server. ``outputs`` is in prompt order when status == 'ok'."""

    server: str
    temperature: float
    max_new_tokens: int
    top2: bool = False  # also fetch the top-2 log-probabilities of every output token
    ignore_eos: bool = False  # fixed-length outputs (every request runs max_new_tokens)
    status: str = "skipped"  # ok | failed | skipped
    error: str | None = None
    wall_s: float | None = None
    outputs: list[GenOutput] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "server": self.server,
            "temperature": self.temperature,
            "max_new_tokens": self.max_new_tokens,
            "status": self.status,
            "error": self.error,
            "wall_s": self.wall_s,
        }
        if self.status == "ok":
            doc.update(acceptance_summary(self.outputs, self.wall_s))
        return doc


def acceptance_summary(outputs: Sequence[GenOutput], wall_s: float | None = None) -> dict[str, Any]:
    """Pooled acceptance of one pass.

    accept_length_overall = all output tokens / all verify steps (SGLang's per-request
    definition, pooled; bonus token included). From SGLang's per-request histograms of
    correct drafts per verify step (``spec_correct_drafts_histogram``, pooled into
    ``correct_drafts_histogram``): ``accept_rate_by_position[j-1]`` = share of verify
    steps that accepted at least j drafts, and ``conditional_accept_by_position[j-1]`` =
    the same given that draft j-1 was accepted (how well draft j matches once reached).
    ``cached_prompt_tokens``: prompt tokens the radix cache served (shows a shared prefix was shared).
    """
    spec = [o for o in outputs if o.verify_ct]
    total_tokens = sum(o.completion_tokens for o in outputs)
    per_req = [o.accept_length for o in outputs]
    doc: dict[str, Any] = {
        "num_requests": len(outputs),
        "output_tokens": total_tokens,
        "output_tok_per_s": total_tokens / wall_s if wall_s else None,
        "requests_with_spec_counters": len(spec),
        "accept_length_overall": None,
        "accept_length_mean": None,
        "accept_length_per_request": [None if a is None else round(a, 4) for a in per_req],
        "cached_prompt_tokens": sum(o.cached_tokens or 0 for o in outputs)
        if any(o.cached_tokens is not None for o in outputs)
        else None,
    }
    if spec:
        doc["accept_length_overall"] = sum(o.completion_tokens for o in spec) / sum(o.verify_ct or 0 for o in spec)
        doc["accept_length_mean"] = statistics.fmean(o.accept_length or 0.0 for o in spec)
    hists = [o.accept_histogram for o in outputs if o.accept_histogram]
    if hists:
        pooled = [sum(h[i] for h in hists if i < len(h)) for i in range(max(map(len, hists)))]
        steps = sum(pooled)
        at_least = [sum(pooled[j:]) for j in range(1, len(pooled))]
        doc["correct_drafts_histogram"] = pooled
        doc["accept_rate_by_position"] = [round(n / steps, 5) for n in at_least]
        reached = [steps] + at_least[:-1]
        doc["conditional_accept_by_position"] = [round(n / r, 5) if r else None for n, r in zip(at_least, reached)]
    return doc


def parse_pass_options(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The options lossless and acceptance share: server environment and flags, datasets, run id, log folder."""
    try:
        args.env = parse_env(args.env)
    except ValueError as e:
        p.error(str(e))
    args.extra_server_args = tuple(shlex.split(args.extra_server_args))
    args.datasets = tuple(d for d in args.datasets.split(",") if d)
    args.run_id = args.run_id or new_run_id()
    args.server_log_dir = args.server_log_dir or Path(tempfile.mkdtemp(prefix="sparsespec-bench-"))


def prompt_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings of a result that every pass of its prompts shares (lossless and acceptance record them)."""
    return {
        "model": args.model,
        "datasets": list(args.datasets),
        "num_prompts": args.num_prompts,
        "max_new_tokens": args.max_new_tokens,
        "concurrency": args.concurrency or args.num_prompts,
        "extra_server_args": list(args.extra_server_args),
        "env": args.env,
    }


def run_passes(
    config: ServerConfig,
    passes: list[PassResult],
    prompts: Sequence[Prompt],
    args: argparse.Namespace,
    deadline: Deadline,
    log: RunLog,
) -> dict[str, Any]:
    """Start one server, run ``passes`` in order (filling them in), stop it; returns the server record."""
    name, env = config.name, config.environment(args.env)
    record: dict[str, Any] = {
        "flags": list(config.flags),
        "env": env,
        "status": "skipped",
        "startup_s": None,
        "error": None,
        "pillar_config": config.pillar_config(args.env),
    }
    if not deadline.allows(MIN_START_S):
        log.line(f"{name}: skipped, {deadline.remaining():.0f} s of budget left")
        for p in passes:
            p.error = "time budget"
        return record
    log_path = args.server_log_dir / f"{file_stem(name)}.server.log"
    server = Server.sglang(args.model, config.flags, log_path=log_path, env=env)
    record["command"] = server.argv
    with server:
        log.line(f"{name}: starting server: {shlex.join(server.argv[1:])}")
        if not start_recorded(
            server, name, record, min(args.startup_timeout, deadline.remaining() - STOP_RESERVE_S), log
        ):
            for p in passes:
                p.status, p.error = "failed", "server failed to start"
            return record
        log.line(f"{name}: server up after {record['startup_s']:.0f} s")
        for i, p in enumerate(passes):
            label = f"{name} pass {i + 1}/{len(passes)} (T={p.temperature}, max_new={p.max_new_tokens})"
            if not deadline.allows(STOP_RESERVE_S + 10):
                p.error = "time budget"
                log.line(f"{label}: SKIPPED (time budget)")
                continue
            sampling = {"temperature": p.temperature, "max_new_tokens": p.max_new_tokens, "ignore_eos": p.ignore_eos}
            t0 = time.monotonic()
            try:
                p.outputs = generate_all(
                    server,
                    [q.input_ids for q in prompts],
                    sampling,
                    concurrency=args.concurrency or len(prompts),
                    timeout_s=deadline.remaining() - STOP_RESERVE_S,
                    top2=p.top2,
                )
                p.status, p.wall_s = "ok", time.monotonic() - t0
                acc = acceptance_summary(p.outputs, p.wall_s)
                al = acc["accept_length_overall"]
                log.line(
                    f"{label}: {acc['output_tokens']} tokens in {p.wall_s:.1f} s"
                    + (f", accept length {al:.3f}" if al is not None else "")
                )
            except Exception as e:  # a failed pass must not lose the others' results
                p.status, p.error, p.wall_s = "failed", f"{type(e).__name__}: {e}", time.monotonic() - t0
                log.line(f"{label}: FAILED: {p.error.splitlines()[0]}")
                if server.proc is None or server.proc.poll() is not None:
                    record.update(status="died", error=p.error)
                    break
        log.block(f"{name} server log tail", log_tail(server.log_path, 40))
    for p in passes:
        if p.status == "skipped" and p.error is None:
            p.error = "server died"
    return record
