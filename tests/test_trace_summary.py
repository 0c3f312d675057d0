"""benchmarks.trace_summary on a hand-made chrome trace."""

from __future__ import annotations

import gzip
import json

import pytest

from benchmarks.trace_summary import busy_us, load_trace, summarize


def _kernel(name: str, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_busy_time_counts_overlaps_once():
    assert busy_us([(0, 10), (5, 12), (20, 25), (21, 22)]) == 17


def test_summary_per_step(tmp_path):
    trace = {
        "traceEvents": [
            _kernel("attn", 0, 100),
            _kernel("gemm", 100, 50),
            _kernel("attn", 400, 100),
            _kernel("copy", 520, 30, cat="gpu_memcpy"),
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5000},  # host events: not GPU time
        ]
    }
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(trace, f)
    s = summarize(load_trace(path), steps=2)
    assert s["window_ms_per_step"] == pytest.approx(0.275)  # 550 us over 2 steps
    assert s["busy_ms_per_step"] == pytest.approx(0.14)
    assert s["idle_ms_per_step"] == pytest.approx(0.135)
    assert s["kernels"][0] == {"name": "attn", "ms_per_step": pytest.approx(0.1), "calls_per_step": 1.0}
    assert [k["name"] for k in s["kernels"]] == ["attn", "gemm", "copy"]


def test_no_gpu_events_is_an_error():
    with pytest.raises(ValueError, match="no GPU events"):
        summarize({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 0, "dur": 1}]}, steps=1)


def test_host_events_give_submissions_and_top_operators():
    trace = {
        "traceEvents": [
            _kernel("attn", 0, 100),
            _kernel("gemm", 100, 50),
            _kernel("cudaLaunchKernel", 0, 3, cat="cuda_runtime"),
            _kernel("cudaLaunchKernel", 10, 3, cat="cuda_runtime"),
            _kernel("cudaGraphLaunch", 20, 5, cat="cuda_runtime"),
            _kernel("cudaMemcpyAsync", 30, 2, cat="cuda_runtime"),
            _kernel("cudaStreamSynchronize", 40, 9, cat="cuda_runtime"),  # a wait, not a submission
            _kernel("aten::mm", 0, 40, cat="cpu_op"),
            _kernel("aten::mm", 50, 20, cat="cpu_op"),
            _kernel("aten::add", 80, 10, cat="cpu_op"),
        ]
    }
    s = summarize(trace, steps=2)
    assert s["submits_per_step"] == 2.0 and s["graph_launches_per_step"] == 0.5
    assert s["host_ops"][0] == {"name": "aten::mm", "ms_per_step": pytest.approx(0.03), "calls_per_step": 1.0}
    assert [o["name"] for o in s["host_ops"]] == ["aten::mm", "aten::add"]
    # A GPU-only trace has no host fields.
    assert "submits_per_step" not in summarize({"traceEvents": [_kernel("attn", 0, 10)]}, steps=1)


def test_python_frames_name_each_operator_s_caller():
    def frame(name: str, ts: float, dur: float, tid: int = 1) -> dict:
        return {"ph": "X", "cat": "python_function", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}

    def op(name: str, ts: float, dur: float, tid: int = 1) -> dict:
        return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}

    trace = {
        "traceEvents": [
            _kernel("attn", 0, 10),
            frame("scheduler.py(10): step", 0, 100),
            frame("worker.py(5): loop", 10, 50),
            frame("torch/_tensor.py(1): __int__", 20, 10),  # library plumbing: the loop is the caller
            op("aten::item", 22, 4),
            op("aten::item", 40, 2),
            op("aten::item", 40, 2, tid=2),  # tid 2: no frame
            op("aten::mm", 70, 20),  # after the loop closed: the step's own call
        ]
    }
    callers = summarize(trace, steps=1)["host_callers"]
    assert callers[0] == {
        "caller": "worker.py(5): loop",
        "op": "aten::item",
        "calls_per_step": 2.0,
        "ms_per_step": pytest.approx(0.006),
    }
    assert {(c["caller"], c["op"]) for c in callers[1:]} == {
        ("?", "aten::item"),
        ("scheduler.py(10): step", "aten::mm"),
    }
    # Without Python frames there is no caller table.
    assert "host_callers" not in summarize({"traceEvents": [_kernel("attn", 0, 10), op("aten::mm", 0, 5)]}, steps=1)
