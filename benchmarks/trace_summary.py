"""Where a profiled window's GPU time goes: a summary of a PyTorch (Kineto) chrome trace.

SGLang's ``/start_profile`` writes one ``*.trace.json.gz`` per rank; ``summarize`` reads its GPU
kernel and memcpy/memset events and returns, per scheduler step of the window: the wall span from the
first GPU event to the last, the GPU busy time (the union of the events' intervals: concurrent
streams count once), the idle rest (host-bound time), and the kernels that take the most time. This is
what says whether a step costs more than another on the GPU (which kernels) or on the host (idle).
A trace that also recorded the CPU (``step_times --profile-host``) adds, per step, the host's GPU work
submissions (kernel and graph launches, async copies: how much of a step runs eagerly) and the host
operators that take the most time; the host profiler slows the host, so read its idle times with care.
With Python stacks recorded too (``--profile-stack``), ``host_callers`` names the code that calls the
most host operators per step: each operator counts for the innermost Python frame around it outside torch.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
# CUDA runtime / driver calls that submit GPU work; a graph launch submits a whole captured graph.
RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
SUBMIT_NAMES = ("LaunchKernel", "GraphLaunch", "MemcpyAsync", "MemsetAsync")
TOP_KERNELS = 25
TOP_HOST_OPS = 15
TOP_CALLERS = 15
# Frames inside these paths are the operator's own plumbing, not the code that called it.
LIBRARY_FRAMES = ("torch/", "<built-in", "contextlib.py", "functools.py")
NAME_CHARS = 120  # template-heavy kernel names are cut; the prefix tells them apart


def load_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


def summarize(trace: dict[str, Any], steps: int) -> dict[str, Any]:
    """Per-step GPU time of a trace whose window covered ``steps`` scheduler steps (ms)."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]
    if not events:
        raise ValueError("the trace holds no GPU events (was the GPU activity profiled?)")
    spans = [(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in events]
    window = max(end for _, end in spans) - min(start for start, _ in spans)
    busy = busy_us(spans)
    per = 1000.0 * steps  # us in the window -> ms per step
    return {
        "steps": steps,
        "events": len(events),
        "window_ms_per_step": window / per,
        "busy_ms_per_step": busy / per,
        "idle_ms_per_step": (window - busy) / per,
        "kernels": _top(events, TOP_KERNELS, steps),
        **host_summary(trace, steps),
    }


def _top(events: list[dict[str, Any]], n: int, steps: int) -> list[dict[str, Any]]:
    """The ``n`` event names with the most total duration, in ms and calls per step."""
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for e in events:
        entry = by_name[str(e.get("name", "?"))[:NAME_CHARS]]
        entry[0] += float(e.get("dur", 0.0))
        entry[1] += 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:n]
    return [{"name": name, "ms_per_step": d / (1000.0 * steps), "calls_per_step": c / steps} for name, (d, c) in top]


def host_summary(trace: dict[str, Any], steps: int) -> dict[str, Any]:
    """Per step: GPU work submissions (``submits_per_step``; ``graph_launches_per_step`` of them whole graphs)
    and the host operators (``cpu_op`` events, inclusive times: nested operators count in both) that take the
    most time; empty for a trace without CPU events."""
    host = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    runtime = [str(e.get("name", "")) for e in host if e.get("cat") in RUNTIME_CATEGORIES]
    ops = [e for e in host if e.get("cat") == "cpu_op"]
    if not runtime and not ops:
        return {}
    out = {
        "submits_per_step": sum(any(k in n for k in SUBMIT_NAMES) for n in runtime) / steps,
        "graph_launches_per_step": sum("GraphLaunch" in n for n in runtime) / steps,
        "host_ops": _top(ops, TOP_HOST_OPS, steps),
    }
    frames = [e for e in host if e.get("cat") == "python_function"]
    if frames:
        out["host_callers"] = host_callers(frames, ops, steps)
    return out


def _span(e: dict[str, Any]) -> tuple[float, float]:
    start = float(e["ts"])
    return start, start + float(e.get("dur", 0.0))


def host_callers(frames: list[dict[str, Any]], ops: list[dict[str, Any]], steps: int) -> list[dict[str, Any]]:
    """Per (caller, operator): operator calls and inclusive ms per step, the ``TOP_CALLERS`` most called. The
    caller is the innermost ``python_function`` frame on the operator's thread that encloses it and is not in
    LIBRARY_FRAMES (frames nest: a sweep in start order keeps the open ones on a stack)."""
    by_thread: dict[tuple[Any, Any], list[tuple[float, float, int, dict[str, Any]]]] = defaultdict(list)
    for kind, events in ((0, frames), (1, ops)):  # at equal starts a frame opens before the operator it holds
        for e in events:
            start, end = _span(e)
            by_thread[(e.get("pid"), e.get("tid"))].append((start, -end, kind, e))
    counts: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])
    for timeline in by_thread.values():
        stack: list[tuple[float, str]] = []  # (end, name) of the open frames
        for start, neg_end, kind, e in sorted(timeline, key=lambda t: t[:3]):
            while stack and stack[-1][0] <= start:
                stack.pop()
            name = str(e.get("name", "?"))
            if kind == 0:
                stack.append((-neg_end, name))
                continue
            caller = next((f for _, f in reversed(stack) if not any(lib in f for lib in LIBRARY_FRAMES)), "?")
            entry = counts[(caller[:NAME_CHARS], name)]
            entry[0] += -neg_end - start
            entry[1] += 1
    top = sorted(counts.items(), key=lambda kv: -kv[1][1])[:TOP_CALLERS]
    return [
        {"caller": c, "op": op, "calls_per_step": n / steps, "ms_per_step": d / (1000.0 * steps)}
        for (c, op), (d, n) in top
    ]
