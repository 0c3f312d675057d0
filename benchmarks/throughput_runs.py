"""The runs of one throughput config: start its server once, run every output length and concurrency
against it, and record each run (bench_serving's metrics, per-request latencies, server state)."""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.bench_driver import BenchDriver
from benchmarks.configs import ServerConfig, file_stem
from benchmarks.run_clock import RunClock
from benchmarks.runlog import Deadline, RunLog, write_json
from benchmarks.server import STOP_RESERVE_S, Server, ServerError, log_tail, start_recorded
from benchmarks.serving_run import (
    METRIC_KEYS,
    Workload,
    bench_argv,
    decode_step_cells,
    per_request,
    pillar_state,
    read_bench_result,
    reset_spec_counters,
    server_info,
)


@dataclass
class Segment:
    """The runs of one output length on one config's server: ``doc`` is written to ``out_path``;
    ``kept``: runs resumed from an earlier command, by concurrency (not run again)."""

    workload: Workload
    doc: dict[str, Any]
    out_path: Path
    kept: dict[int, dict[str, Any]] = field(default_factory=dict)

    def init_runs(self, concurrencies: Sequence[int], num_prompts: dict[int, int]) -> list[dict[str, Any]]:
        """Fill ``doc["runs"]`` in concurrency order; returns the records still to run."""
        self.doc["runs"] = [
            self.kept.get(c)
            or {
                "concurrency": c,
                "num_prompts": num_prompts[c],
                "status": "skipped",
                "error": None,
                "wall_s": None,
                "metrics": None,
            }
            for c in concurrencies
        ]
        return [r for r in self.doc["runs"] if "measured" not in r]


@dataclass(frozen=True)
class Invocation:
    """What every server and run of one throughput invocation shares."""

    args: argparse.Namespace
    deadline: Deadline
    clock: RunClock
    log: RunLog
    driver: BenchDriver


def run_config(
    config: ServerConfig,
    segments: Sequence[Segment],
    concurrencies: Sequence[int],
    num_prompts: dict[int, int],
    inv: Invocation,
) -> None:
    """Start the config's server once, run every segment's concurrencies in order, stop it.

    Every segment's doc shares one ``server`` record (the same start serves them all) and is
    rewritten after each of its runs."""
    args, deadline, clock, log, driver = inv.args, inv.deadline, inv.clock, inv.log, inv.driver
    all_runs = [(seg, r) for seg in segments for r in seg.init_runs(concurrencies, num_prompts)]
    srv: dict[str, Any] = {
        "status": "pending",
        "startup_s": None,
        "error": None,
        "output_lens": [seg.workload.output_len for seg in segments],
    }
    for seg in segments:
        seg.doc["server"] = srv

    def write_all() -> None:
        for seg in segments:
            write_json(seg.out_path, seg.doc)

    if not all_runs:
        srv.update(status="not started", error="every run resumed from an earlier command")
        log.line(f"{config.name}: every run resumed, no server start")
        write_all()
        return

    first_seg, first = all_runs[0]
    first_run_s = clock.guess_s(config.name, first["concurrency"], first_seg.workload.output_len, first["num_prompts"])
    if not deadline.allows(clock.startup_guess(config.name) + first_run_s + STOP_RESERVE_S):
        srv.update(status="skipped", error=f"time budget ({deadline.remaining():.0f} s left)")
        for _, r in all_runs:
            r["error"] = "time budget"
        log.line(f"{config.name}: SKIPPED (time budget, {deadline.remaining():.0f} s left)")
        write_all()
        return
    server = Server.sglang(
        args.model,
        config.flags,
        log_path=args.work_dir / f"{file_stem(config.name)}.server.log",
        env=config.environment(args.env),
    )
    srv["command"] = server.argv
    with server:
        log.line(f"{config.name}: starting server")
        driver.start()  # imports bench_serving while the server boots
        if not start_recorded(
            server, config.name, srv, min(args.startup_timeout, deadline.remaining() - STOP_RESERVE_S), log
        ):
            for _, r in all_runs:
                r.update(status="failed", error="server failed to start")
            write_all()
            return
        clock.record_start(config.name, srv["startup_s"])
        srv["server_info"] = server_info(server)
        log.line(f"{config.name}: server up after {srv['startup_s']:.0f} s")
        for seg, r in all_runs:
            run_one(config, seg, r, server, inv)
            write_json(seg.out_path, seg.doc)
        log.block(f"{config.name} server log tail", log_tail(server.log_path, 40))
    write_all()


def run_one(config: ServerConfig, seg: Segment, r: dict[str, Any], server: Server, inv: Invocation) -> None:
    """One bench_serving run against ``server``; fills the run record ``r``."""
    args, deadline, clock, log, driver = inv.args, inv.deadline, inv.clock, inv.log, inv.driver
    c, n, out_len = r["concurrency"], r["num_prompts"], seg.workload.output_len
    name = config.name if len(args.output_lens) == 1 else f"{config.name} len={out_len}"
    if seg.doc["server"]["status"] != "ok":
        r.update(status="failed", error="server died earlier")
        return
    expected_s = clock.guess_s(config.name, c, out_len, n)
    if not deadline.allows(STOP_RESERVE_S + expected_s):
        r["error"] = "time budget"
        log.line(
            f"{name} c={c}: SKIPPED (time budget: about {expected_s:.0f} s needed, "
            f"{deadline.remaining() - STOP_RESERVE_S:.0f} s left)"
        )
        return
    if config.speculative and not reset_spec_counters(server):
        r["accept_length_note"] = "counter reset failed: accept length is cumulative since server start"
    log_start = server.log_path.stat().st_size if server.log_path.is_file() else 0
    stem = f"bench_{file_stem(config.name)}_{out_len}_c{c}"
    result_file = args.work_dir / f"{stem}.jsonl"
    result_file.unlink(missing_ok=True)
    bench_log = args.work_dir / f"{stem}.log"
    argv = bench_argv(server.base_url, args.model, seg.workload, c, n, result_file)
    t0 = time.monotonic()
    try:
        code = driver.run(argv, bench_log, deadline.remaining() - STOP_RESERVE_S, server.check_alive)
        r["wall_s"] = time.monotonic() - t0
        if code != 0:
            raise RuntimeError(f"bench_serving exited with code {code}")
        result = read_bench_result(result_file)
        r["metrics"] = {k: result.get(k) for k in METRIC_KEYS}
        if (details := per_request(result)) is not None:
            r["per_request"] = details
        if config.speculative and (state := pillar_state(server)) is not None:
            r["pillar_state"] = state
        elif not config.speculative:
            with open(server.log_path, "rb") as f:
                f.seek(log_start)
                r["decode_step_ms"] = decode_step_cells(f.read().decode("utf-8", "replace"))
        done = r["metrics"]["completed"]
        r["status"] = "ok" if done == n else "failed"
        if done == n:
            clock.record_run(config.name, c, out_len, r["metrics"]["total_output_tokens"], r["metrics"]["duration"])
        else:
            r["error"] = f"only {done}/{n} requests completed"
    except ServerError as e:
        r.update(status="failed", error=str(e), wall_s=time.monotonic() - t0)
        seg.doc["server"].update(status="died", error=str(e).splitlines()[0])
    except (TimeoutError, RuntimeError, ValueError) as e:  # RuntimeError: an exit code, or a DriverError
        r.update(status="failed", error=f"{type(e).__name__}: {e}", wall_s=time.monotonic() - t0)
    if r["status"] != "ok":
        log.block(f"{name} c={c} bench_serving log tail", log_tail(bench_log, 80))
        log.block(f"{name} c={c} bench driver log tail", log_tail(driver.log_path, 40))
        log.block(f"{name} c={c} server log tail", log_tail(server.log_path, 80))
    log.line(progress_line(name, r))


def progress_line(config: str, run: dict[str, Any]) -> str:
    head = f"{config} c={run['concurrency']} n={run['num_prompts']}"
    m = run.get("metrics")
    if run["status"] != "ok" or not m:
        return f"{head}: {run['status'].upper()} ({str(run.get('error')).splitlines()[0]})"
    acc = f", accept {m['accept_length']:.2f}" if m.get("accept_length") else ""
    # A mean far above the median: some requests waited for their first token (a stall).
    mean = f" mean {m['mean_ttft_ms']:.0f}" if m.get("mean_ttft_ms") is not None else ""
    return (
        f"{head}: {m['output_throughput']:.0f} out tok/s, TPOT med {m['median_tpot_ms']:.2f} ms "
        f"p99 {m['p99_tpot_ms']:.2f} ms, TTFT med {m['median_ttft_ms']:.0f}{mean} ms{acc} ({run['wall_s']:.0f} s)"
    )
