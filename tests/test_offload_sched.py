"""patches/offload.py against SGLang's real scheduler pieces on CPU: a real ``RadixCache`` over a real
``ReqToTokenPool`` and ``TokenToKVPoolAllocator``, real ``Req`` objects, and the scheduler's own
``is_fully_idle``, ``flush_cache`` and ``pause_generation`` (with the plugin's hooks applied) on a
scheduler stand-in. Copies are deferred until their fence completes, as on a side stream."""

from __future__ import annotations

from array import array
from collections import deque
from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from test_offload_patch import SERVED, Batch, Mover  # noqa: E402  (also loads the plugin's hooks)

from sglang_sparsespec.offload import Where  # noqa: E402
from sglang_sparsespec.patches import offload  # noqa: E402

POOL = 36  # device KV slots
pytestmark = SERVED  # SGLang's scheduler pieces as the releases the pool serves have them


@pytest.fixture(autouse=True)
def published_server_args(llama_config_dir):
    """Req and release_kv_cache read the process's published ServerArgs, as in a scheduler process."""
    from sglang.srt import runtime_context
    from test_offload_patch import _args

    runtime_context.publish(_args(llama_config_dir), role="test")
    yield
    runtime_context.reset_context()


class Sched:
    """The scheduler state the methods under test read, with SGLang's own methods bound to it."""

    from sglang.srt.managers.scheduler import Scheduler

    is_fully_idle = Scheduler.is_fully_idle
    flush_cache = Scheduler.flush_cache
    pause_generation = Scheduler.pause_generation

    def __init__(self, pool, allocator, tree):
        from sglang.srt.disaggregation.utils import DisaggregationMode

        self.req_to_token_pool, self.token_to_kv_pool_allocator, self.tree_cache = pool, allocator, tree
        self.running_batch = Batch([], pool, allocator)
        self.chunked_req = self.last_batch = self.cur_batch_for_debug = None
        self.enable_overlap, self.result_queue, self.waiting_queue = True, deque(), []
        self.dllm_manager = SimpleNamespace(any_staging_reqs=lambda: False)
        self.grammar_manager = SimpleNamespace(grammar_queue=[], clear=lambda: None)
        self.disaggregation_mode, self._engine_paused = DisaggregationMode.NULL, False
        self.server_args = SimpleNamespace(disaggregation_mode="null")
        self.hisparse_coordinator = self.draft_worker = None
        self.enable_hisparse = self.enable_hierarchical_cache = False
        self.metrics_reporter = SimpleNamespace(
            reset_metrics=lambda: None,
            is_stats_logging_rank=False,
            last_gen_throughput=0.0,
            current_scheduler_metrics_enabled=False,
        )
        self.kv_events_publisher = SimpleNamespace(publish_kv_events=lambda: None)
        self.ipc_channels = SimpleNamespace(send_to_tokenizer=SimpleNamespace(send_output=lambda msg, req: None))

    def _pp_microbatches_drained(self):
        return True

    def _add_request_to_queue(self, req):
        self.waiting_queue.append(req)


def make_world(agree=None):
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.radix_cache import RadixCache

    pool = ReqToTokenPool(4, 64, "cpu", False)
    allocator = TokenToKVPoolAllocator(POOL, torch.float32, "cpu", None, False)
    tree = RadixCache(
        CacheInitParams(disable=False, req_to_token_pool=pool, token_to_kv_pool_allocator=allocator, page_size=1)
    )
    sched = Sched(pool, allocator, tree)
    mover = Mover(POOL, 64)
    off = offload.KVOffloader(sched, mover, decode_reserve=1, **({} if agree is None else {"agree": agree}))
    off._batch_of = lambda rows: Batch([r.req for r in rows], pool, allocator)
    sched.pillar_offload = off
    return SimpleNamespace(pool=pool, allocator=allocator, tree=tree, sched=sched, mover=mover, off=off)


def prefill(w, rid: str, prompt: list[int], max_new: int):
    """A request admitted and prefilled as SGLang does it: prefix matched and locked, the rest allocated."""
    from sglang.srt.managers.schedule_batch import Req, ReqKvInfo
    from sglang.srt.sampling.sampling_params import SamplingParams

    req = Req(rid, "", array("q", prompt), SamplingParams(max_new_tokens=max_new, temperature=0.0))
    w.pool.alloc([req])
    req.init_next_round_input(w.tree)
    w.tree.inc_lock_ref(req.last_node)
    start = len(req.prefix_indices)
    req.set_extend_range(start, len(prompt))
    slots = w.allocator.alloc(len(prompt) - start)
    w.pool.write((req.req_pool_idx, slice(0, len(prompt))), torch.cat([req.prefix_indices, slots]).to(torch.int32))
    w.mover.kv[slots] = (100 * req.req_pool_idx + torch.arange(start, len(prompt))).float()[:, None]
    req.kv = ReqKvInfo(kv_allocated_len=len(prompt), swa_evicted_seqlen=0)
    req.kv_committed_len = len(prompt)
    return req


def process_prefill_result(w, req) -> None:
    """What process_batch_result_prefill does for a request that did not finish."""
    from sglang.srt.mem_cache.common import maybe_cache_unfinished_req

    req.output_ids.append(7)
    maybe_cache_unfinished_req(req, w.tree)


def decode(w, req, n: int) -> None:
    for _ in range(n):
        pos = req.kv.kv_allocated_len
        slot = w.allocator.alloc(1)
        w.pool.write((req.req_pool_idx, slice(pos, pos + 1)), slot.to(torch.int32))
        w.mover.kv[slot] = float(100 * req.req_pool_idx + pos)
        req.kv.kv_allocated_len = req.kv_committed_len = pos + 1
        req.output_ids.append(7)


def tree_slots_free(w) -> set[int]:
    """Slots the radix tree holds that sit in the allocator's free list (must be none)."""
    return set(w.tree.all_values_flatten().tolist()) & set(w.allocator.free_pages.tolist())


def full_pool(w, rids=("old", "new")):
    """'old' decoded 20 tokens past its 8-token prompt (cached in the tree); 'new' shares that prompt
    and was just prefilled (4 private tokens). The pool is full: the next round is 2 tokens short,
    and 'new' is the request furthest from finishing."""
    old = prefill(w, rids[0], list(range(8)), max_new=25)
    process_prefill_result(w, old)
    decode(w, old, 19)  # 20 output tokens, KV for 27 positions (the last token's arrives next round)
    new = prefill(w, rids[1], list(range(8)) + [50, 51, 52, 53], max_new=100)
    assert len(new.prefix_indices) == 8 and new.cache_protected_len == 8
    assert w.allocator.available_size() == POOL - 27 - 4
    w.others = w.allocator.alloc(w.allocator.available_size())  # other requests hold the rest
    return old, new


@pytest.mark.parametrize("in_flight", ["prefill_result_queued", "chunked_req", "middle_chunk_in_flight"])
def test_a_request_whose_prefill_result_is_unprocessed_is_never_parked(in_flight):
    """Overlap scheduler: step N-1's prefill batch is merged into the running batch and step N parks
    before N-1's result is processed; processing it calls RadixCache.cache_unfinished_req on the row.
    Had 'new' been parked, the tree would now hold its freed slots."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    w = make_world()
    old, new = full_pool(w)
    # Each of SGLang's marks of a prefill in flight on its own (a chunked prefill sets several).
    if in_flight == "prefill_result_queued":
        pending = SimpleNamespace(forward_mode=ForwardMode.EXTEND, reqs=[new], decoding_reqs=None)
        w.sched.result_queue.append((pending, None))
    elif in_flight == "chunked_req":  # still mid-way through a chunked prefill
        w.sched.chunked_req = new
    else:
        new.inflight_middle_chunks = 1
    batch = Batch([old, new], w.pool, w.allocator)
    w.off.park_if_needed(batch)
    assert batch.reqs == [new] and w.off.ledger.where(id(old)) is Where.PARKED and w.off.ledger.where(id(new)) is None
    if in_flight == "chunked_req":
        w.sched.chunked_req = None
    new.inflight_middle_chunks = 0
    process_prefill_result(w, new)
    assert not tree_slots_free(w)
    assert len(w.tree.all_values_flatten()) == 12  # the shared prompt and new's 4 private tokens


@pytest.mark.parametrize("pending", [None, "decode", "mixed"])
def test_without_a_pending_prefill_the_furthest_request_is_parked(pending):
    """Once its prefill result was processed the new request is an ordinary candidate again, also
    while a decode batch, or a mixed batch in which it decodes, waits for its result."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    w = make_world()
    old, new = full_pool(w)
    process_prefill_result(w, new)  # its prompt is now the tree's: nothing private to park yet
    w.allocator.free(w.others[:3])
    decode(w, new, 3)
    if pending is not None:
        mode = ForwardMode.DECODE if pending == "decode" else ForwardMode.MIXED
        w.sched.result_queue.append(
            (SimpleNamespace(forward_mode=mode, reqs=[old, new], decoding_reqs=[old, new]), None)
        )
    batch = Batch([old, new], w.pool, w.allocator)
    w.off.park_if_needed(batch)
    assert batch.reqs == [old] and w.off.ledger.record(id(new)).tokens == 3
    assert not tree_slots_free(w)


def finish(w, req) -> None:
    """The request finished (its result processed): SGLang releases its KV into the tree."""
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH
    from sglang.srt.mem_cache.common import release_kv_cache

    req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
    release_kv_cache(req, w.tree)


def test_parked_requests_keep_the_scheduler_busy_and_block_flush():
    w = make_world()
    old, new = full_pool(w)
    process_prefill_result(w, new)
    w.off.park_if_needed(Batch([old, new], w.pool, w.allocator))  # 'new' has nothing private: 'old' goes
    finish(w, new)  # the batch empties while 'old' waits on host
    free, tree_tokens = w.allocator.available_size(), w.tree.total_size()
    assert w.off.has_parked and not w.sched.is_fully_idle()
    assert w.sched.flush_cache() is False  # refused, as with running requests
    assert (w.allocator.available_size(), w.tree.total_size(), w.pool.available_size()) == (free, tree_tokens, 3)
    assert w.off.ledger.where(id(old)) is Where.PARKED
    # Restored and finished: idle again, and the flush runs.
    w.sched.running_batch = w.off.before_schedule(Batch([], w.pool, w.allocator))
    assert not w.sched.is_fully_idle()
    w.mover.fences[-1].complete()
    w.off.before_schedule(w.sched.running_batch)
    assert not w.off.busy
    finish(w, old)
    w.sched.running_batch.filter_batch()
    assert w.sched.is_fully_idle() and w.sched.flush_cache() is True
    assert w.allocator.available_size() == POOL and w.tree.total_size() == 0


def test_two_live_requests_of_one_rid_are_parked_and_released_apart(monkeypatch):
    """Two tokenizer workers each accept a client's rid "dup": the pool tells the requests apart by
    object. Keyed by rid, finishing the resident one dropped the parked one's host KV (that client
    would wait forever) and its slots leaked."""
    w = make_world()
    monkeypatch.setattr(offload, "_ACTIVE", w.off)  # the hooked release_kv_cache finds it
    old, new = full_pool(w, rids=("dup", "dup"))
    process_prefill_result(w, new)
    kv_before = w.mover.kv[w.pool.req_to_token[old.req_pool_idx, 8:27].long()].clone()
    w.off.park_if_needed(Batch([old, new], w.pool, w.allocator))  # 'new' has nothing private: 'old' goes
    assert w.off.ledger.where(id(old)) is Where.PARKED and w.off.ledger.where(id(new)) is None
    finish(w, new)  # the resident request of the same rid finishes
    assert w.off.ledger.where(id(old)) is Where.PARKED and w.off.ledger.host_free() == 64 - 19
    w.sched.running_batch = w.off.before_schedule(Batch([], w.pool, w.allocator))
    w.mover.fences[-1].complete()
    w.off.before_schedule(w.sched.running_batch)
    assert w.sched.running_batch.reqs == [old] and not w.off.busy
    assert torch.equal(w.mover.kv[w.pool.req_to_token[old.req_pool_idx, 8:27].long()], kv_before)
    finish(w, old)
    w.allocator.free(w.others)
    assert w.allocator.available_size() + w.tree.evictable_size() == POOL and w.tree.protected_size() == 0
    assert not tree_slots_free(w) and w.pool.available_size() == 4


def test_pause_with_retract_retracts_parked_requests_and_frees_their_host_slots(monkeypatch):
    """A retract-mode pause precedes a weight update: parked KV (old weights) must not survive it."""
    from sglang.srt.managers.io_struct import PauseGenerationReqInput

    w = make_world()
    monkeypatch.setattr(offload, "_ACTIVE", w.off)  # the hooked release_kv_cache finds it
    old, new = full_pool(w)
    process_prefill_result(w, new)
    w.sched.running_batch = Batch([old, new], w.pool, w.allocator)
    w.off.park_if_needed(w.sched.running_batch)
    assert w.off.ledger.where(id(old)) is Where.PARKED and w.off.ledger.host_free() == 64 - 19
    w.sched.pause_generation(PauseGenerationReqInput(mode="retract"))
    assert {r.rid for r in w.sched.waiting_queue} == {"old", "new"}
    assert all(r.is_retracted and r.req_pool_idx is None for r in w.sched.waiting_queue)
    assert not w.off.busy and w.off.ledger.host_free() == 64 and w.pool.available_size() == 4
    # Every device slot is free or held (unlocked, evictable) by the tree: nothing leaked, nothing doubly freed.
    held = set(w.tree.all_values_flatten().tolist())
    free = w.allocator.free_pages.tolist()
    assert len(free) == len(set(free)) and not held & set(free)
    assert w.tree.protected_size() == 0


class RaisingMover(Mover):
    """Fails part-way: one layer's copy is queued (pending) when the next one raises."""

    def to_host(self, dev, host):
        self._fence(lambda: None)
        raise RuntimeError("copy failed")

    def to_device(self, host, dev):
        self._fence(lambda: None)
        raise RuntimeError("copy failed")


def test_a_copy_that_raises_leaks_no_reserved_slot():
    w = make_world()
    old, new = full_pool(w)
    process_prefill_result(w, new)
    good, bad = w.mover, RaisingMover(POOL, 64)
    bad.host_pool = w.off.ledger.host = good.host_pool
    w.off.mover = bad
    batch = Batch([old, new], w.pool, w.allocator)
    with pytest.raises(RuntimeError, match="copy failed"):
        w.off.park_if_needed(batch)
    assert all(f.done for f in bad.fences)  # the queued part ran before its slots went back
    assert w.off.ledger.host_free() == 64 and len(w.off.ledger) == 0 and not w.off.has_parked
    assert batch.reqs == [old, new] and w.allocator.available_size() == 0
    w.off.mover = good
    w.off.park_if_needed(batch)  # parks 'old'
    finish(w, new)
    held = w.allocator.available_size() + w.tree.evictable_size()  # free, or freed by eviction on demand
    w.off.mover = bad
    bad.fences.clear()
    with pytest.raises(RuntimeError, match="copy failed"):
        w.off.before_schedule(Batch([], w.pool, w.allocator))
    assert len(bad.fences) == 1 and bad.fences[0].done
    assert w.allocator.available_size() + w.tree.evictable_size() == held
    assert w.off.ledger.where(id(old)) is Where.PARKED and w.off.ledger.host_free() == 45
    w.off.mover = good
    back = w.off.before_schedule(Batch([], w.pool, w.allocator))
    assert [r.rid for r in back.reqs] == ["old"]


def _load_inquirer(sched, used: int):
    """SGLang's own load inquirer over the world's scheduler (the fields get_loads reads)."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler_components.load_inquirer import SchedulerLoadInquirer
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    stats = SimpleNamespace(
        spec_accept_rate=0.0,
        kv_transfer_speed_gb_s=0.0,
        kv_transfer_latency_ms=0.0,
        num_grammar_queue_reqs=0,
        num_paused_reqs=0,
        num_retracted_reqs=0,
        gen_throughput=0.0,
        cache_hit_rate=0.0,
        utilization=0.0,
    )
    observer = SimpleNamespace(get_pool_stats=lambda: SimpleNamespace(get_kv_token_stats=lambda: (used, used / POOL)))
    nothing = lambda: None  # noqa: E731
    return SchedulerLoadInquirer(
        disaggregation_mode=DisaggregationMode.NULL,
        ps=SimpleNamespace(dp_rank=0),
        server_args=None,
        max_total_num_tokens=POOL,
        max_running_requests=4,
        pool_stats_observer=observer,
        tp_worker=None,
        token_to_kv_pool_allocator=None,
        spec_algorithm=SpeculativeAlgorithm.NONE,
        get_running_batch=lambda: sched.running_batch,
        get_waiting_queue=lambda: sched.waiting_queue,
        get_stats=lambda: stats,
        get_chunked_req=nothing,
        get_disagg_prefill_bootstrap_queue=nothing,
        get_disagg_prefill_inflight_queue=nothing,
        get_disagg_decode_prealloc_queue=nothing,
        get_disagg_decode_transfer_queue=nothing,
        get_spec_total_num_accept_tokens=lambda: 0,
        get_spec_total_num_forward_ct=lambda: 0,
        get_total_prefill_uncached_tokens=lambda: 0,
        get_total_prefill_busy_us=lambda: 0,
        get_decode_moment_totals=lambda: (0, 0.0, 0.0),
    )


def test_load_reports_count_parked_requests_as_running(monkeypatch):
    """/v1/loads and --dp-size load balancing read SchedulerLoadInquirer.get_loads: a replica with
    requests parked on host is as loaded as it was before they were parked."""
    w = make_world()
    monkeypatch.setattr(offload, "_ACTIVE", w.off)
    old, new = full_pool(w)
    process_prefill_result(w, new)
    w.sched.running_batch = Batch([old, new], w.pool, w.allocator)
    before = _load_inquirer(w.sched, POOL - w.allocator.available_size()).get_loads()
    w.off.park_if_needed(w.sched.running_batch)  # 'old' (19 private tokens) goes to host
    after = _load_inquirer(w.sched, POOL - w.allocator.available_size()).get_loads()
    assert (before.num_running_reqs, after.num_running_reqs) == (2, 2)
    assert after.num_total_tokens == before.num_total_tokens == after.num_active_tokens
