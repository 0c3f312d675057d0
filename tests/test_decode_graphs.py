"""``patches/decode_graphs.py``: which captured batch size serves a batch, and that a batch without a
graph runs the very body a graph would have recorded (the capture itself needs CUDA: the runners'
GPU tests, tests/test_draft_runner.py and tests/test_mixed_runner.py, replay it)."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import pytest
import torch
from sglang_sparsespec.patches.decode_graphs import DecodeGraphs, Kind


def graphs(capture_bs: list[int], max_bs: int = 8) -> DecodeGraphs:
    return DecodeGraphs(SimpleNamespace(), capture_bs, max_bs, "draft")


def test_a_batch_takes_the_smallest_bucket_that_holds_it():
    g = graphs([8, 1, 4, 16])  # unsorted, and a bucket past max_bs that can never serve
    assert g.capture_bs == [1, 4, 8]
    assert [g.bucket(n) for n in (1, 2, 4, 5, 8)] == [(1, 1), (4, 4), (4, 4), (8, 8), (8, 8)]
    assert graphs([]).bucket(3) == (None, 3)  # no graphs: eager, unpadded
    assert graphs([2], max_bs=6).bucket(5) == (None, 5)  # past the largest bucket: eager
    with pytest.raises(RuntimeError, match="PILLAR draft batch 9 exceeds max running requests 8"):
        g.bucket(9)


def test_run_replays_the_keys_graph_or_runs_the_body():
    g, calls = graphs([4]), []
    g.graphs[(4, Kind.SAMPLED)] = SimpleNamespace(replay=lambda: calls.append("replay"))

    def body() -> None:
        calls.append("body")

    assert g.run((4, Kind.SAMPLED), body) and calls == ["replay"]
    assert not g.run((4, Kind.GREEDY), body) and calls == ["replay", "body"]  # not captured
    assert not g.run(None, body) and calls == ["replay", "body", "body"]  # past every bucket


def test_the_graph_kind_follows_only_greediness():
    # Top-k, top-p and temperature are per-row tensors the captured kernels read: one sampled kind.
    for top_k in (False, True):
        assert Kind.of(SimpleNamespace(is_all_greedy=False, need_top_k_sampling=top_k)) is Kind.SAMPLED
        assert Kind.of(SimpleNamespace(is_all_greedy=True, need_top_k_sampling=top_k)) is Kind.GREEDY


def test_capture_outside_capturing_is_refused():
    with pytest.raises(RuntimeError, match="outside capturing"):
        graphs([4]).capture((4, Kind.GREEDY), lambda: None, lambda: None)


def test_captures_run_inside_sglangs_graph_capture(monkeypatch):
    """PILLAR's graphs are captured as SGLang's own runners capture theirs: inside its graph_capture() (under
    tensor parallelism the custom all-reduce registers the captured buffers with the other ranks on exit, and
    PyNccl, not torch.distributed, takes the rest), on the stream it hands out, in its capture mode and gc freeze."""
    import sglang.srt.distributed.parallel_state as parallel_state
    import sglang.srt.model_executor.runner as runner

    events: list[str] = []

    def context(name, value=None):
        @contextmanager
        def manager(*args, **kwargs):
            events.append(f"enter {name}")
            yield value
            events.append(f"exit {name}")

        return manager

    stream = SimpleNamespace(synchronize=lambda: events.append("synchronize"))
    monkeypatch.setattr(parallel_state, "graph_capture", context("graph_capture", SimpleNamespace(stream=stream)))
    monkeypatch.setattr(runner, "model_capture_mode", context("capture mode"))
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    g = DecodeGraphs(SimpleNamespace(server_args=SimpleNamespace(enable_cudagraph_gc=False)), [4], 8, "draft")
    with g.capturing("draft-step graphs"):
        assert events == ["enter graph_capture", "enter capture mode"]
        assert g._stream is stream and g._pool == "pool"
    assert events[-3:] == ["synchronize", "exit capture mode", "exit graph_capture"]
    assert g._stream is None  # capture() is refused again once the runner's captures are done
