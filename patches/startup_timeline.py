"""The server's start-up timeline in one log line, for stock and PILLAR servers alike.

Servers are restarted and autoscaled, so where start-up time goes matters. The scheduler process times
its phases by wrapping the calls that make them: ``ModelRunner.load_model`` (weights),
``Scheduler.init_memory_pools`` (KV pool), the target worker's and the speculative worker's
``init_cuda_graphs`` inside ``Scheduler.init_all_cuda_graphs`` (target graphs; PILLAR's draft, plain and
mixed graphs), and the plugin's kernel builds (``build_sampling_kernels``, ``build_slot_kernels``). A phase
nested in another counts once, in the inner phase (the slot kernels built while the KV pool is set up
are kernels, not KV pool). The phases ride in the scheduler's own ``startup_time`` report to the HTTP
process (across TP ranks the slowest rank's, SGLang's rule for its own phases; see ``phases_from_report``
for ``--dp-size N``), which times the
warm-ups (custom ``--warmups``, PILLAR's among them, and SGLang's warm-up request) and, once the server
is ready, logs

    PILLAR start-up: weights 12.3 s, KV pool 1.1 s, target graphs 20.2 s, draft graphs 10.1 s,
    kernels 3.0 s, warm-up 5.2 s, other 4.0 s, total 56.0 s

where total runs from the launcher process's creation and ``other`` is what no phase covers (imports,
process spawns, distributed and tokenizer set-up).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

logger = logging.getLogger(__name__)

WEIGHTS, KV_POOL, TARGET_GRAPHS, DRAFT_GRAPHS, KERNELS, WARMUP = (
    "weights", "KV pool", "target graphs", "draft graphs", "kernels", "warm-up",
)  # fmt: skip
PHASE_ORDER = (WEIGHTS, KV_POOL, TARGET_GRAPHS, DRAFT_GRAPHS, KERNELS, WARMUP)
# The key under which a scheduler's phases travel in SGLang's startup_time dict (and /server_info).
STARTUP_KEY = "sparsespec_phases"


class PhaseClock:
    """Seconds per phase, each nested call counted in its innermost phase only."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.now = now
        self.seconds: dict[str, float] = {}
        self._stack: list[list[float]] = []  # per open phase: [start, seconds spent in nested phases]

    def time(self, phase: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._stack.append([self.now(), 0.0])
        try:
            return fn(*args, **kwargs)
        finally:
            self._close(phase)

    async def time_async(self, phase: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self._stack.append([self.now(), 0.0])
        try:
            return await fn(*args, **kwargs)
        finally:
            self._close(phase)

    def _close(self, phase: str) -> None:
        start, nested = self._stack.pop()
        elapsed = self.now() - start
        self.seconds[phase] = self.seconds.get(phase, 0.0) + elapsed - nested
        if self._stack:
            self._stack[-1][1] += elapsed


SCHEDULER_CLOCK = PhaseClock()  # the scheduler process's phases
SERVER_CLOCK = PhaseClock()  # the HTTP process's warm-ups


def merge_phases(reports: Iterable[Mapping[str, float] | None]) -> dict[str, float]:
    """Ranks start side by side: each phase's slowest rank is what the start waited for."""
    merged: dict[str, float] = {}
    for report in reports:
        for phase, seconds in (report or {}).items():
            merged[phase] = max(merged.get(phase, 0.0), float(seconds))
    return merged


def format_line(label: str, phases: Mapping[str, float], total: float) -> str:
    """One line: the phases that ran, in start-up order, then what no phase covers, then the total."""
    named = [(p, phases[p]) for p in PHASE_ORDER if p in phases]
    named += sorted((p, s) for p, s in phases.items() if p not in PHASE_ORDER)
    other = max(0.0, total - sum(s for _, s in named))
    parts = [f"{p} {s:.1f} s" for p, s in named] + [f"other {other:.1f} s", f"total {total:.1f} s"]
    return f"{label} start-up: " + ", ".join(parts)


def server_label(speculative_algorithm: str | None) -> str:
    return "Stock" if not speculative_algorithm else str(speculative_algorithm).upper()


# ---- scheduler process ---------------------------------------------------------------
def time_weights(original, *args, **kwargs):
    return SCHEDULER_CLOCK.time(WEIGHTS, original, *args, **kwargs)


def time_kv_pool(original, *args, **kwargs):
    return SCHEDULER_CLOCK.time(KV_POOL, original, *args, **kwargs)


def time_kernels(original, *args, **kwargs):
    return SCHEDULER_CLOCK.time(KERNELS, original, *args, **kwargs)


def time_graphs(original, scheduler, *args, **kwargs):
    """The target's and the speculative worker's captures apart: each worker's ``init_cuda_graphs`` is
    timed through an instance attribute that lives only while the scheduler captures."""
    wrapped = []
    for worker, phase in ((getattr(scheduler, "tp_worker", None), TARGET_GRAPHS),
                          (getattr(scheduler, "draft_worker", None), DRAFT_GRAPHS)):  # fmt: skip
        capture = getattr(worker, "init_cuda_graphs", None)
        if capture is None:
            continue
        worker.init_cuda_graphs = lambda *a, _c=capture, _p=phase, **k: SCHEDULER_CLOCK.time(_p, _c, *a, **k)
        wrapped.append(worker)
    try:
        return original(scheduler, *args, **kwargs)
    finally:
        for worker in wrapped:
            del worker.init_cuda_graphs  # the class's method again


def report_phases(result, scheduler, *args, **kwargs):
    """Add this rank's phases to the ``startup_time`` the scheduler hands to the HTTP process."""
    startup = getattr(scheduler, "startup_time", None)
    if isinstance(startup, dict):
        startup[STARTUP_KEY] = dict(SCHEDULER_CLOCK.seconds)
    return result


def carry_phases(original, startup_times, *args, **kwargs):
    """SGLang's aggregation keeps only its own keys; the plugin's phases are merged beside them."""
    reports = list(startup_times)
    result = original(reports, *args, **kwargs)
    phases = merge_phases(r.get(STARTUP_KEY) for r in reports if isinstance(r, Mapping))
    if phases and isinstance(result, dict):
        result[STARTUP_KEY] = phases
    return result


# ---- HTTP process --------------------------------------------------------------------
def time_custom_warmups(original, *args, **kwargs):
    return SERVER_CLOCK.time_async(WARMUP, original, *args, **kwargs)


def _process_start() -> float:
    import psutil

    return psutil.Process().create_time()


def phases_from_report(startup: Mapping[str, Any]) -> dict[str, float]:
    """The scheduler phases in SGLang's merged ``startup_time`` report. Under ``--dp-size N`` the report
    was merged in SGLang's DP-controller process, which loads no plugins and keeps only SGLang's own keys:
    the timeline then falls back to those (weights, KV pool, SGLang's graph captures; PILLAR's own
    graphs and kernels are then part of ``other``)."""
    if startup.get(STARTUP_KEY):
        return dict(startup[STARTUP_KEY])
    phases = {}
    if "load_weight" in startup:
        phases[WEIGHTS] = float(startup["load_weight"])
    if "kv_cache_allocation" in startup:
        phases[KV_POOL] = float(startup["kv_cache_allocation"])
    if startup.get("cuda_graph"):
        phases[TARGET_GRAPHS] = float(sum(startup["cuda_graph"].values()))
    return phases


def _scheduler_phases() -> dict[str, float]:
    from sglang.srt.entrypoints import http_server

    state = getattr(http_server, "_global_state", None)
    startup = getattr(getattr(state, "tokenizer_manager", None), "startup_time", None) or {}
    return phases_from_report(startup)


def log_when_ready(original, *args, **kwargs):
    """Time SGLang's warm-up request (the server is ready when it returns) and log the timeline."""
    result = SERVER_CLOCK.time(WARMUP, original, *args, **kwargs)
    server_args = kwargs.get("server_args", args[0] if args else None)
    try:
        phases = {**_scheduler_phases(), **SERVER_CLOCK.seconds}
        total = time.time() - _process_start()
        logger.info(format_line(server_label(getattr(server_args, "speculative_algorithm", None)), phases, total))
    except Exception as e:  # the timeline is a report: it never stops a server that came up
        logger.warning("start-up timeline not logged: %s", e)
    return result
