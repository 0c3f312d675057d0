"""Serving throughput per config and concurrency, measured with SGLang's bench_serving.

    python -m benchmarks.throughput --model M --data-dir D --out DIR \\
        --configs stock,pillar[,ngram,stock-flashinfer,pillar-k4] --concurrency 1,16,64 \\
        --output-len 2048[,4096,...] [--waves 2 | --num-prompts-per-conc N] [--time-budget 540] \\
        [--run-id ID] [--resume DIR]

Each config's server starts once; every output length and concurrency runs against it with
fixed-length outputs (ignore_eos) on the AIME24+AMC23 chat prompts. Every run goes through bench_serving's own command line, in one
long-lived client process (benchmarks/bench_driver.py) that imports it while the first server
boots. Writes ``DIR/throughput_<run>_<config>.json`` per config and length (rewritten after every
run; with several lengths the run id holds ``{output_len}``) and one progress log, prints a
progress line per run and a markdown table at the end. A server that dies or fails to start marks
its runs failed and the next config goes on; runs that no longer fit ``--time-budget`` are skipped
and listed. A result file already in DIR is never replaced without ``--resume``: a second comparison
needs its own run id. ``--resume DIR`` keeps the ok runs of a result file of the same name in DIR (an earlier
command's, copied back into the tree) when config and workload match, and runs only the rest, so
one comparison too long for one device command is finished by the next (a config whose runs are
all kept starts no server). Exit code 0 when nothing failed (skips allowed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.bench_driver import BenchDriver
from benchmarks.configs import CONFIGS_HELP, ServerConfig, add_server_options, file_stem, parse_env, resolve_config
from benchmarks.meta import new_run_id, run_metadata
from benchmarks.report import (
    DEFAULT_RESULTS,
    stream_interval,
    throughput_rows,
    throughput_table,
)
from benchmarks.runlog import Deadline, RunLog, write_json
from benchmarks.server import (
    STOP_RESERVE_S,
    Server,
    ServerError,
    decode_intervals,
    http_json,
    install_signal_handlers,
    log_tail,
    scheduler_state,
    start_recorded,
)
from benchmarks.workload import (
    DEFAULT_DATASETS,
    build_prompts,
    load_tokenizer,
    prompt_token_stats,
    write_bench_serving_file,
)
from sglang_sparsespec.spec.adaptive import cell_key, cell_label

START_GUESS_FLOOR_S = 90.0  # floor of the server-start guess (a start takes 60-140 s warm, up to 240 s on a fresh node)
MIN_RUN_S = 20.0  # the guess for a run shape never measured
RUN_MARGIN = 1.3  # a config may be slower than the slowest one measured so far at the same shape
# A run's wall time outside bench_serving's timed window (tokenizer and dataset load, one 32-token
# warmup request, a 1 s sleep, metrics); the module import is paid once per driver, not per run.
RUN_OVERHEAD_S = 10.0


def config_family(name: str) -> str:
    """``pillar-k4-coarse:budget_ratio=0.1`` -> ``pillar``; ``stock-flashinfer`` -> ``stock``."""
    return name.split(":")[0].split("-")[0]


@dataclass
class RunClock:
    """Wall-time guesses from measured history, so that a server is not started (and a bench not
    launched) when the budget cannot cover it: a run cut short by the budget is wasted device time.
    ``rates[(config, c, n)]``: slowest output tok/s over bench_serving's own timed window (``duration``) of a
    finished run at concurrency ``c`` with ``n`` output tokens per request (the window, not the wall
    time, so results from before the bench driver, which paid a 26 s import per run, still apply);
    ``starts[family]``: slowest server start of a config family (``config_family``) so far."""

    rates: dict[tuple[str, int, int], float] = field(default_factory=dict)
    starts: dict[str, float] = field(default_factory=dict)

    @classmethod
    def seeded(cls, results_dir: Path) -> RunClock:
        """A clock holding the run times of the throughput results in ``results_dir`` (any run id) that
        streamed in chunks: at stream interval 1 the HTTP path, not decoding, set the pace. Server starts
        are not seeded: a warm node starts a server in 60-140 s, a fresh one in up to 240 s, and a
        command knows which it is only from its own starts."""
        clock = cls()
        for path in sorted(results_dir.glob("throughput_*.json")):
            doc = json.loads(path.read_text())
            if doc.get("kind") != "throughput" or stream_interval(doc["config"]["flags"]) <= 1:
                continue
            for r in doc["runs"]:
                m = r.get("metrics") or {}
                if r["status"] == "ok" and m.get("duration"):
                    clock.record_run(doc["config"]["name"], r["concurrency"], doc["workload"]["output_len"],
                                     m["total_output_tokens"], m["duration"])  # fmt: skip
        return clock

    def rate(self, config: str, concurrency: int, output_len: int) -> float | None:
        """Output tok/s to plan with, from pools of runs of this length: the config itself, its family
        (``pillar-coarse`` -> every ``pillar*``; a variant runs the same worker), then every config. NGRAM's
        7K runs take 2.5x PILLAR's, so a PILLAR variant guessed from them would never fit a command. Within
        a pool the slowest run of the shape counts; an unmeasured concurrency gets at most twice the rate of
        the nearest measured lower one: doubling the batch at best doubles the rate, so the guess errs long
        (a 256 x 7K run launched on the flat MIN_RUN_S guess with 78 s left was cut). The pool measured
        nearest below ``concurrency`` wins, the narrower on a tie: a variant's own c=1 run doubled six times
        guessed its 64 x 7K run at 650 s where its family's 64 x 7K runs took 34 s, and the run was skipped."""
        family = config_family(config)
        best: tuple[int, float] | None = None
        for member in (lambda name: name == config, lambda name: config_family(name) == family, lambda name: True):
            pool: dict[int, float] = {}
            for (name, c, n), rate in self.rates.items():
                if n == output_len and c <= concurrency and member(name):
                    pool[c] = min(rate, pool.get(c, rate))
            c = max(pool, default=0)
            if c and (best is None or c > best[0]):
                best = (c, pool[c] * min(concurrency / c, 2.0))
        return None if best is None else best[1]

    def run_s(self, config: str, concurrency: int, output_len: int, num_prompts: int) -> float | None:
        """Expected wall time of a run; None before any run of this length at this or a lower concurrency finished."""
        rate = self.rate(config, concurrency, output_len)
        return None if rate is None else RUN_MARGIN * num_prompts * output_len / rate + RUN_OVERHEAD_S

    def guess_s(self, config: str, concurrency: int, output_len: int, num_prompts: int) -> float:
        expected = self.run_s(config, concurrency, output_len, num_prompts)
        return MIN_RUN_S if expected is None else expected

    def record_run(self, config: str, concurrency: int, output_len: int, output_tokens: int, duration_s: float) -> None:
        rate = output_tokens / duration_s
        key = (config, concurrency, output_len)
        self.rates[key] = min(rate, self.rates.get(key, rate))

    def startup_guess(self, config: str) -> float:
        """The slowest start of the config's family in this command, else the floor. Per family: a
        stock start paying FlashInfer's JIT (245 s on the H100 at ce113f5) said nothing of the PILLAR
        start after it (94 s), yet skipped it; and a skip wastes the rest of the budget, where a start
        that runs out of it still fills the JIT caches the next command starts from."""
        return self.starts.get(config_family(config), START_GUESS_FLOOR_S)

    def record_start(self, config: str, seconds: float) -> None:
        family = config_family(config)
        self.starts[family] = max(self.starts.get(family, START_GUESS_FLOOR_S), seconds)


METRIC_KEYS = (
    "completed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
    "input_throughput", "output_throughput", "total_throughput",
    "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms",
    "mean_tpot_ms", "median_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "median_itl_ms", "p99_itl_ms",
    "mean_e2e_latency_ms", "median_e2e_latency_ms", "p99_e2e_latency_ms",
    "concurrency", "max_concurrent_requests", "max_output_tokens_per_s", "accept_length",
)  # fmt: skip


@dataclass(frozen=True)
class Workload:
    """What every request looks like. ``dataset_files`` maps num_prompts -> bench_serving custom-dataset JSONL."""

    output_len: int
    temperature: float
    top_p: float
    dataset_files: dict[int, Path]
    # Requests per second, Poisson arrivals (bench_serving); inf sends them all at once, so the
    # concurrency alone paces them (a closed loop: a finished request lets the next one start).
    request_rate: float = math.inf


def bench_argv(
    base_url: str, model: str, workload: Workload, concurrency: int, num_prompts: int, output_file: Path
) -> list[str]:
    """bench_serving's command-line arguments for one run (what follows ``python -m sglang.bench_serving``)."""
    return [
        "--backend", "sglang", "--base-url", base_url, "--model", model, "--tokenizer", model,
        "--dataset-name", "custom", "--dataset-path", str(workload.dataset_files[num_prompts]),
        "--sharegpt-output-len", str(workload.output_len),
        "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
        "--temperature", str(workload.temperature), "--top-p", str(workload.top_p), "--seed", "1",
        "--request-rate", str(workload.request_rate),
        "--output-file", str(output_file), "--disable-tqdm", "--output-details",
    ]  # fmt: skip


def read_bench_result(path: Path) -> dict[str, Any]:
    """The last result line bench_serving appended to ``path``, parsed once (with ``--output-details`` it
    also carries every request's ITLs: tens of MB at 256 x 7000); ValueError if there is none."""
    try:
        lines = [l for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
    except OSError as e:
        raise ValueError(f"no bench_serving result at {path}: {e}") from None
    if not lines:
        raise ValueError(f"bench_serving result file {path} is empty")
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise ValueError(f"bench_serving result in {path} is not JSON: {e}") from None
    if not isinstance(result, dict) or result.get("output_throughput") is None:
        raise ValueError(f"bench_serving result in {path} has no output_throughput")
    return result


def per_request(result: dict[str, Any]) -> dict[str, list[float]] | None:
    """Each request's time to first token and end-to-end latency (s, ms resolution) and output length, in
    bench_serving's request order, from the details ``--output-details`` adds to its result (None
    without them). Why: a fixed-size run's throughput ends with its slowest request, so the spread of the
    latencies, not their mean, says how much a drain costs."""
    if not {"ttfts", "itls", "output_lens"} <= result.keys():
        return None
    ttft = [float(t or 0.0) for t in result["ttfts"]]
    e2e = [t + sum(itl or ()) for t, itl in zip(ttft, result["itls"])]
    return {"ttft_s": [round(t, 3) for t in ttft], "e2e_s": [round(t, 3) for t in e2e],
            "output_len": [int(n or 0) for n in result["output_lens"]]}  # fmt: skip


def default_num_prompts(concurrency: int, waves: int = 2) -> int:
    # Two waves of requests by default: the second starts while the first drains, so the batch
    # stays near full for most of the run (with fixed-length outputs one wave also keeps it full,
    # at half the time); at least 4 so concurrency 1 averages a few requests.
    return max(waves * concurrency, 4)


def reset_spec_counters(server: Server) -> bool:
    """Zero the server's running accept-length average so each run reports its own.

    In 0.5.17 any accepted /set_internal_state call resets the counters that /server_info's
    avg_spec_accept_length is computed from; an empty update is accepted and changes nothing else.
    """
    try:
        reply = http_json(server.base_url + "/set_internal_state", {"server_args": {}}, timeout=30)
    except (OSError, ValueError):
        return False
    return bool(reply) and all(reply)


def pillar_state(server: Server) -> dict[str, Any] | None:
    """PILLAR's live numbers from /server_info (rounds by draft count, dense request rounds, the
    policy's cost cells, the metrics summary): cumulative since the server started, so a run's record
    holds everything up to its end. None for other servers or when the request fails."""
    try:
        info = http_json(server.base_url + "/server_info", timeout=30)
    except (OSError, ValueError):
        return None
    return scheduler_state(info).get("pillar")


def decode_step_cells(log_text: str) -> dict[str, dict[str, float]]:
    """``decode_intervals`` in the cells of PILLAR's adaptive policy ("<batch bucket>x<context ~tokens>", as
    /server_info shows them), so a plain PILLAR round is read against stock's step at the same batch and
    context: the median ms per step per cell."""
    steps: dict[str, list[float]] = {}
    for running, tokens, ms in decode_intervals(log_text):
        steps.setdefault(cell_label(cell_key(running, tokens / running)), []).append(ms)
    return {cell: {"ms": round(statistics.median(v), 3), "lines": len(v)} for cell, v in sorted(steps.items())}


def server_info(server: Server) -> dict[str, Any] | None:
    try:
        info = http_json(server.base_url + "/server_info", timeout=30)
    except (OSError, ValueError):
        return None
    info.pop("internal_states", None)  # per-step state, not configuration
    return info


PROVENANCE_KEYS = ("run_id", "date_utc", "device", "hostname", "git_commit", "sglang_version")


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
    for part, keys in (("config", ("name", "flags", "env", "pillar_config")),
                       ("workload", ("kind", "output_len", "input_len", "temperature", "top_p", "datasets", "request_rate"))):  # fmt: skip
        for key in keys:
            if old.get(part, {}).get(key) != doc[part].get(key):
                return {}, f"{earlier.name}: {part}.{key} differs"
    want = doc["workload"]["num_prompts"]
    kept = {
        r["concurrency"]: {**r, "measured": r.get("measured")
                           or {**{k: old["meta"].get(k) for k in PROVENANCE_KEYS}, "server": old.get("server")}}
        for r in old.get("runs", [])
        if r.get("status") == "ok" and want.get(str(r["concurrency"])) == r.get("num_prompts")
    }
    return kept, "" if kept else f"{earlier.name}: no ok run with the same request count"


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
            self.kept.get(c) or {"concurrency": c, "num_prompts": num_prompts[c], "status": "skipped", "error": None,
                                 "wall_s": None, "metrics": None}
            for c in concurrencies
        ]  # fmt: skip
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
    srv: dict[str, Any] = {"status": "pending", "startup_s": None, "error": None,
                           "output_lens": [seg.workload.output_len for seg in segments]}  # fmt: skip
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
        args.model, config.flags, log_path=args.work_dir / f"{file_stem(config.name)}.server.log",
        env=config.environment(args.env),
    )
    srv["command"] = server.argv
    with server:
        log.line(f"{config.name}: starting server")
        driver.start()  # imports bench_serving while the server boots
        if not start_recorded(server, config.name, srv, min(args.startup_timeout, deadline.remaining() - STOP_RESERVE_S), log):
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
        log.line(f"{name} c={c}: SKIPPED (time budget: about {expected_s:.0f} s needed, "
                 f"{deadline.remaining() - STOP_RESERVE_S:.0f} s left)")  # fmt: skip
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
    p.add_argument("--output-len", default="2048",
                   help="output tokens per request; a comma list runs each length on the same server start")
    p.add_argument("--waves", type=int, default=2, help="requests per concurrency: max(waves*concurrency, 4)")
    p.add_argument("--num-prompts-per-conc", type=int, default=None, help="a fixed request count instead of --waves")
    p.add_argument("--datasets", default=",".join(DEFAULT_DATASETS))
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling for every request (1: off)")
    p.add_argument("--request-rate", type=float, default=math.inf,
                   help="requests per second, Poisson arrivals (default inf: all at once, paced by --concurrency); "
                        "a finite rate measures latency at a fixed load")
    add_server_options(p, 540.0)
    p.add_argument("--run-id", default=None,
                   help="share one id across invocations of one comparison; with several --output-len it must "
                        "contain {output_len} (each length is its own comparison)")
    p.add_argument("--work-dir", type=Path, default=None, help="server/bench logs and prompt files (default: temp dir)")
    p.add_argument("--resume", type=Path, default=None, metavar="DIR",
                   help="keep the ok runs of same-named result files in DIR (e.g. benchmarks/results) and run the rest")
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
    if args.run_id.replace("{output_len}", "").count("{") or args.run_id.count("}") != args.run_id.count("{output_len}"):
        p.error(f"--run-id may contain only the placeholder {{output_len}}, got {args.run_id!r}")
    earlier = [path for path in result_paths(args).values() if path.exists()]
    if earlier and args.resume is None:  # a second comparison under one run id would replace the first's files
        p.error(f"{earlier[0]} exists (an earlier command's results): give this comparison its own --run-id, or "
                "--resume the folder holding it to keep its runs")
    args.work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="sparsespec-bench-"))
    return args


def result_paths(args: argparse.Namespace) -> dict[tuple[str, int], Path]:
    """The result file of each (config, output length) of the command."""
    return {(c.name, n): args.out / f"throughput_{run_id_for(args.run_id, [n])}_{file_stem(c.name)}.json"
            for c in args.server_configs for n in args.output_lens}  # fmt: skip


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
    log.line(f"throughput run {base_meta['run_id']} on {base_meta['device']}; "
             f"logs and prompt files in {args.work_dir}")  # fmt: skip

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
        return {"kind": "aime", "output_len": output_len, "input_len": None,
                "temperature": args.temperature, "top_p": args.top_p, "ignore_eos": True,
                "request_rate": "inf" if math.isinf(args.request_rate) else args.request_rate,
                "num_prompts": {str(c): n for c, n in num_prompts.items()}, **prompt_doc}  # fmt: skip

    docs = []
    paths = result_paths(args)
    clock = RunClock.seeded(DEFAULT_RESULTS)
    with BenchDriver(args.work_dir / "bench_driver.log") as driver:
        inv = Invocation(args, deadline, clock, log, driver)
        for config in args.server_configs:
            segments = []
            for n in args.output_lens:
                doc: dict[str, Any] = {
                    "kind": "throughput",
                    "schema": 1,
                    "meta": meta[n],
                    "config": {"name": config.name, "flags": list(config.flags), "env": config.environment(args.env),
                               "pillar_config": config.pillar_config(args.env)},
                    "workload": workload_doc(n),
                    "server": {},
                    "runs": [],
                }
                out_path = paths[(config.name, n)]
                kept: dict[int, dict[str, Any]] = {}
                if args.resume is not None:
                    kept, why_not = resumable_runs(args.resume / out_path.name, doc)
                    log.line(f"{config.name} len={n}: resumed c={','.join(map(str, sorted(kept)))} from {args.resume}"
                             if kept else f"{config.name} len={n}: nothing resumed ({why_not})")  # fmt: skip
                segments.append(Segment(Workload(n, args.temperature, args.top_p, files, args.request_rate), doc, out_path, kept))
            run_config(config, segments, args.concurrencies, num_prompts, inv)
            docs.extend(seg.doc for seg in segments)

    statuses = [r["status"] for d in docs for r in d["runs"]]
    skipped = [f"{d['config']['name']} len={d['workload']['output_len']} c={r['concurrency']}"
               for d in docs for r in d["runs"] if r["status"] == "skipped"]  # fmt: skip
    print("\n" + throughput_table(throughput_rows(docs)) + "\n", flush=True)
    if skipped:
        log.line(f"SKIPPED {len(skipped)} runs for the time budget: {', '.join(skipped)}")
    resumed = sum("measured" in r for d in docs for r in d["runs"])
    log.line(f"done: {statuses.count('ok')} ok ({resumed} resumed), {statuses.count('failed')} failed, "
             f"{len(skipped)} skipped -> {args.out}")  # fmt: skip
    return 1 if "failed" in statuses else 0


if __name__ == "__main__":
    sys.exit(main())
