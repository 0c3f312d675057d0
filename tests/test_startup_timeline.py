"""The start-up timeline: phases timed through the hooked SGLang calls, carried from the scheduler ranks to
the HTTP process, logged in one line once the server is ready (CPU; fake phases on a fake clock)."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("sglang")

from sglang.srt.plugins import load_plugins  # noqa: E402

load_plugins()

from sglang_sparsespec.patches import startup_timeline as st  # noqa: E402


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def spend(self, seconds: float) -> None:
        self.t += seconds


def test_a_nested_phase_counts_once_in_the_inner_phase() -> None:
    clock = FakeClock()
    pc = st.PhaseClock(clock)

    def pool() -> str:
        clock.spend(1.0)
        pc.time(st.KERNELS, clock.spend, 0.5)  # built while the pool is set up
        clock.spend(0.25)
        return "pool"

    assert pc.time(st.KV_POOL, pool) == "pool"
    pc.time(st.KERNELS, clock.spend, 2.0)
    assert pc.seconds == {st.KV_POOL: 1.25, st.KERNELS: 2.5}
    with pytest.raises(RuntimeError):  # a phase that fails still closes, so later phases nest right
        pc.time(st.WEIGHTS, lambda: (clock.spend(3.0), (_ for _ in ()).throw(RuntimeError("x"))))
    pc.time(st.WARMUP, clock.spend, 1.0)
    assert pc.seconds[st.WEIGHTS] == 3.0 and pc.seconds[st.WARMUP] == 1.0


def test_the_line_lists_the_phases_that_ran_in_order() -> None:
    pillar = {
        st.WARMUP: 5.2,
        st.WEIGHTS: 12.3,
        st.KV_POOL: 1.1,
        st.TARGET_GRAPHS: 20.2,
        st.DRAFT_GRAPHS: 10.1,
        st.KERNELS: 3.0,
    }
    assert st.format_line("PILLAR", pillar, 56.0) == (
        "PILLAR start-up: weights 12.3 s, KV pool 1.1 s, target graphs 20.2 s, draft graphs 10.1 s, "
        "kernels 3.0 s, warm-up 5.2 s, other 4.1 s, total 56.0 s"
    )
    stock = {st.WEIGHTS: 12.0, st.KV_POOL: 1.0, st.TARGET_GRAPHS: 20.0, st.WARMUP: 1.0}
    assert st.format_line(st.server_label(None), stock, 40.0) == (
        "Stock start-up: weights 12.0 s, KV pool 1.0 s, target graphs 20.0 s, warm-up 1.0 s, other 6.0 s, total 40.0 s"
    )
    assert st.server_label("pillar") == "PILLAR"


class _Worker:
    def __init__(self, clock: FakeClock, seconds: float) -> None:
        self.clock, self.seconds, self.calls = clock, seconds, 0

    def init_cuda_graphs(self) -> None:
        self.calls += 1
        self.clock.spend(self.seconds)


def _scheduler_rank(monkeypatch: pytest.MonkeyPatch, weights: float, graphs: float, draft: float) -> dict:
    """One scheduler rank's start through the hooked SGLang methods; returns its startup_time report."""
    from sglang.srt.managers.scheduler import Scheduler
    from sglang_sparsespec.patches import sampler_warmup, slot_warmup, worker

    clock = FakeClock()
    monkeypatch.setattr(st, "SCHEDULER_CLOCK", st.PhaseClock(clock))
    # The plugin's kernel builds are hooked (their CUDA-only bodies return at once on a CPU device), and the
    # PILLAR worker, which imports them by name, calls the hooked ones.
    sampler_warmup.build_sampling_kernels("flashinfer", 16, "cpu")
    assert st.SCHEDULER_CLOCK.seconds == {st.KERNELS: 0.0}
    assert (worker.build_sampling_kernels, worker.build_slot_kernels) == (
        sampler_warmup.build_sampling_kernels,
        slot_warmup.build_slot_kernels,
    )
    assert slot_warmup.build_slot_kernels.__wrapped__ is not None
    st.time_weights(clock.spend, weights)  # ModelRunner.load_model's wrapper
    st.time_kv_pool(lambda: (clock.spend(1.0), st.time_kernels(clock.spend, 0.5)))  # slot kernels inside
    st.time_kernels(clock.spend, 2.0)
    tp, spec = _Worker(clock, graphs), _Worker(clock, draft)
    sched = SimpleNamespace(tp_worker=tp, draft_worker=spec, rust_server=None)  # no Rust server (read from 0.5.23)
    Scheduler.init_all_cuda_graphs(sched)  # SGLang's own method calls both workers' captures
    assert (tp.calls, spec.calls) == (1, 1) and "init_cuda_graphs" not in vars(tp)  # instance wrapper removed
    sched.tp_worker = SimpleNamespace(weight_load_time=weights, graph_time_usage={"decode": graphs})
    sched.draft_worker = SimpleNamespace(weight_load_time=0.0, graph_time_usage={})
    sched.kv_cache_allocation_time, sched.scheduler_startup_begin = 1.5, time.perf_counter()
    Scheduler.init_startup_timing_summary(sched)
    return sched.startup_time


@pytest.fixture
def published(llama_config_dir, monkeypatch: pytest.MonkeyPatch):
    """The HTTP process's ServerArgs, resolved and published as a launch leaves them (_wait_and_warmup reads
    the published configuration from 0.5.19), and no post-warm-up GC freeze request (0.5.23 posts one to
    the server it just started)."""
    from sglang.srt import runtime_context
    from sglang.srt.entrypoints import http_server
    from sglang.srt.server_args import ServerArgs

    from sglang_sparsespec.patches.contacts import resolve

    def publish(**overrides):
        sa = resolve(
            ServerArgs(
                model_path=str(llama_config_dir),
                attention_backend="triton",
                skip_tokenizer_init=True,
                device="cpu",
                **overrides,
            )
        )
        runtime_context.publish(sa, role="test")
        return sa

    monkeypatch.setattr(http_server, "_freeze_gc_after_server_warmup", lambda server_args: None, raising=False)
    yield publish
    runtime_context.reset_context()


def test_scheduler_phases_ride_sglangs_startup_report_to_the_server_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, published
) -> None:
    from sglang.srt.entrypoints import http_server, warmup
    from sglang.srt.observability.startup_time import build_engine_startup_time

    rank0 = _scheduler_rank(monkeypatch, weights=10.0, graphs=20.0, draft=8.0)
    assert rank0[st.STARTUP_KEY] == {
        st.WEIGHTS: 10.0,
        st.KV_POOL: 1.0,
        st.KERNELS: 2.5,
        st.TARGET_GRAPHS: 20.0,
        st.DRAFT_GRAPHS: 8.0,
    }
    rank1 = _scheduler_rank(monkeypatch, weights=12.0, graphs=19.0, draft=9.0)
    # SGLang's engine-level aggregation (the DP controller uses the same function) keeps the plugin's phases,
    # each at its slowest rank.
    engine = build_engine_startup_time([rank0, rank1], tokenizer_e2e=1.0)
    assert engine["load_weight"] == 12.0
    assert engine[st.STARTUP_KEY] == {
        st.WEIGHTS: 12.0,
        st.KV_POOL: 1.0,
        st.KERNELS: 2.5,
        st.TARGET_GRAPHS: 20.0,
        st.DRAFT_GRAPHS: 9.0,
    }

    # The HTTP process: custom warm-ups, then SGLang's warm-up request, then the line.
    clock = FakeClock()
    monkeypatch.setattr(st, "SERVER_CLOCK", st.PhaseClock(clock))
    monkeypatch.setattr(
        http_server,
        "_global_state",
        SimpleNamespace(tokenizer_manager=SimpleNamespace(startup_time=engine, server_status=None)),
    )
    monkeypatch.setattr(st, "_process_start", lambda: time.time() - 60.0)

    async def fake_warmup(disaggregation_mode: str, tokenizer_manager: object) -> None:
        clock.spend(4.0)

    monkeypatch.setitem(warmup._warmup_registry, "timeline_test", fake_warmup)
    asyncio.run(warmup.execute_warmups("null", ["timeline_test"], None))
    server_args = published(speculative_algorithm="pillar")
    with caplog.at_level(logging.INFO, logger=st.logger.name):
        http_server._wait_and_warmup(server_args, execute_warmup_func=lambda sa: (clock.spend(1.5), True)[1])
    lines = [r.getMessage() for r in caplog.records if "start-up:" in r.getMessage()]
    assert len(lines) == 1
    assert lines[0].startswith(
        "PILLAR start-up: weights 12.0 s, KV pool 1.0 s, target graphs 20.0 s, "
        "draft graphs 9.0 s, kernels 2.5 s, warm-up 5.5 s, other 10.0 s, total 60.0 s"
    )


def test_a_stock_server_logs_its_line_without_pillar_phases(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, published
) -> None:
    from sglang.srt.entrypoints import http_server

    clock = FakeClock()
    monkeypatch.setattr(st, "SERVER_CLOCK", st.PhaseClock(clock))
    stock = {"load_weight": 3.0, st.STARTUP_KEY: {st.WEIGHTS: 3.0, st.KV_POOL: 0.5, st.TARGET_GRAPHS: 30.0}}
    monkeypatch.setattr(
        http_server,
        "_global_state",
        SimpleNamespace(tokenizer_manager=SimpleNamespace(startup_time=stock, server_status=None)),
    )
    monkeypatch.setattr(st, "_process_start", lambda: time.time() - 40.0)
    server_args = published()
    with caplog.at_level(logging.INFO, logger=st.logger.name):
        http_server._wait_and_warmup(server_args, execute_warmup_func=lambda sa: (clock.spend(2.0), True)[1])
    line = next(r.getMessage() for r in caplog.records if "start-up:" in r.getMessage())
    assert line.startswith(
        "Stock start-up: weights 3.0 s, KV pool 0.5 s, target graphs 30.0 s, warm-up 2.0 s, other 4.5 s, total 40.0 s"
    )
    assert "draft graphs" not in line and "kernels" not in line


def test_a_report_merged_without_the_plugin_falls_back_to_sglangs_own_phases() -> None:
    # Under --dp-size N SGLang's DP-controller process merges the replicas' reports without the plugin.
    from sglang.srt.observability.startup_time import aggregate_scheduler_startup_times

    rank = {
        "load_weight": 4.0,
        "kv_cache_allocation": 0.5,
        "scheduler_e2e": 30.0,
        "cuda_graph": {"prefill": 20.0, "decode": 3.0},
        st.STARTUP_KEY: {st.WEIGHTS: 4.0},
    }
    merged = aggregate_scheduler_startup_times.__wrapped__([rank, rank])  # SGLang's own, unhooked
    assert st.STARTUP_KEY not in merged
    assert st.phases_from_report(merged) == {st.WEIGHTS: 4.0, st.KV_POOL: 0.5, st.TARGET_GRAPHS: 23.0}
    assert st.phases_from_report(rank) == {st.WEIGHTS: 4.0}
    assert st.phases_from_report({}) == {}
