"""patches/offload.py on CPU: real ServerArgs validation, and park / restore / finish / abort
against small pools of real torch tensors (copies deferred until their fence completes)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("sglang")

from sglang.srt.plugins import load_plugins

load_plugins()

from sglang.srt.server_args import ServerArgs
from sglang_sparsespec.patches import offload, versions
from sglang_sparsespec.patches.contacts import OFFLOAD_RELEASES, resolve
from test_offload import Fence, HostSlots

from sglang_sparsespec.offload import Where

H = 4  # values per token (all layers, K and V) in the fake pool
# The tests that run the pool inside SGLang's own scheduler, admission or cache code: on the releases it
# serves (contacts.OFFLOAD_RELEASES); elsewhere the flag is refused at launch (the test below).
SERVED = pytest.mark.skipif(
    versions.INSTALLED not in OFFLOAD_RELEASES,
    reason=f"the offload pool serves SGLang {OFFLOAD_RELEASES[0]}-{OFFLOAD_RELEASES[-1]}; refused on this release",
)


def _args(model_dir, **overrides) -> ServerArgs:
    base = {"model_path": str(model_dir), "attention_backend": "triton", "skip_tokenizer_init": True, "device": "cpu"}
    base.update(overrides)
    return resolve(ServerArgs(**base))


def test_flag_refused_at_launch_on_the_releases_the_pool_does_not_serve(llama_config_dir, monkeypatch):
    monkeypatch.setenv("SPARSESPEC_OFFLOAD_HOST_GB", "4")
    if versions.INSTALLED in OFFLOAD_RELEASES:
        _args(llama_config_dir)
        return
    for overrides in ({}, {"speculative_algorithm": "pillar"}):
        with pytest.raises(ValueError, match="--pillar-offload-host-gb serves SGLang 0.5.17 through 0.5.20") as err:
            _args(llama_config_dir, **overrides)
        assert "\n" not in str(err.value)
    monkeypatch.setenv("SPARSESPEC_OFFLOAD_HOST_GB", "0")
    _args(llama_config_dir)  # off: nothing to refuse


@SERVED
def test_flag_validated_at_launch_for_stock_and_pillar(llama_config_dir, monkeypatch):
    monkeypatch.setenv("SPARSESPEC_OFFLOAD_HOST_GB", "4")
    _args(llama_config_dir)  # stock decoding, radix cache on
    _args(llama_config_dir, disable_radix_cache=True)
    _args(llama_config_dir, speculative_algorithm="pillar")
    for overrides, message in (
        ({"page_size": 16}, "--page-size"),
        ({"enable_hierarchical_cache": True}, "--enable-hierarchical-cache"),
        ({"tp_size": 2}, "--tp-size > 1 (refused until measured on several GPUs)"),
        ({"enable_pdmux": True}, "--enable-pdmux"),  # its loop never restores: parked requests would stay on host
        ({"enable_page_major_kv_layout": True}, "--enable-page-major-kv-layout"),  # another slot layout
        ({"kv_cache_dtype": "fp8_e4m3"}, "--kv-cache-dtype fp8_e4m3"),  # scaled rows the host copies do not move
    ):
        with pytest.raises(ValueError, match="--pillar-offload-host-gb does not support") as err:
            _args(llama_config_dir, **overrides)
        assert message in str(err.value) and "\n" not in str(err.value)
    monkeypatch.setenv("SPARSESPEC_OFFLOAD_HOST_GB", "-2")  # the error names the flag beside its variable
    with pytest.raises(ValueError, match="--pillar-offload-host-gb / SPARSESPEC_OFFLOAD_HOST_GB must be a finite"):
        _args(llama_config_dir)
    monkeypatch.setenv("SPARSESPEC_OFFLOAD_HOST_GB", "1e9")  # more than the host can pin: refused before loading
    with pytest.raises(ValueError, match=r"--pillar-offload-host-gb 1e\+09 x 1 scheduler process\(es\) asks for more"):
        _args(llama_config_dir)
    monkeypatch.setenv("SPARSESPEC_OFFLOAD_HOST_GB", "0")
    _args(llama_config_dir, page_size=16)  # off: nothing to refuse


class Allocator:
    def __init__(self, size):
        self.free_pages = torch.arange(1, size + 1)

    def available_size(self):
        return len(self.free_pages)

    def alloc(self, n):
        if n > len(self.free_pages):
            return None
        out, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return out

    def free(self, idx):
        assert not torch.isin(idx, self.free_pages).any(), "device double free"
        self.free_pages = torch.cat([self.free_pages, idx])


class Mover:
    """KV [slot, H] on the 'device', [host slot, H] on the host; a copy runs when its fence completes."""

    bytes_per_token = 2 * H

    def __init__(self, dev_slots, host_slots):
        self.kv = torch.zeros(dev_slots + 1, H)
        self.host = torch.zeros(host_slots, H)
        self.host_pool = HostSlots(host_slots)
        self.fences = []

    def _fence(self, work):
        self.fences.append(Fence(work))
        return self.fences[-1]

    def to_host(self, dev, host):
        return self._fence(lambda: self.host.index_copy_(0, host, self.kv[dev]))

    def to_device(self, host, dev):
        return self._fence(lambda: self.kv.index_copy_(0, dev, self.host[host]))

    def drain(self):
        for fence in self.fences:
            fence.synchronize()


class Batch:
    """The ScheduleBatch surface park_if_needed uses; one token per request per round."""

    def __init__(self, reqs, pool, allocator):
        self.reqs, self.req_to_token_pool, self.token_to_kv_pool_allocator = reqs, pool, allocator
        self.seq_lens = torch.tensor([r.kv.kv_allocated_len for r in reqs])
        self.seq_lens_cpu, self.orig_seq_lens, self.spec_info = self.seq_lens.clone(), self.seq_lens.clone(), None

    def filter_batch(self, keep_indices=None):
        keep = [i for i, r in enumerate(self.reqs) if not r.finished()] if keep_indices is None else keep_indices
        self.reqs = [self.reqs[i] for i in keep]
        for name in ("seq_lens", "seq_lens_cpu", "orig_seq_lens"):
            setattr(self, name, getattr(self, name)[keep])

    def is_empty(self):
        return not self.reqs

    def new_tokens_required_next_decode(self, selected_indices=None):
        reqs = self.reqs if selected_indices is None else [self.reqs[i] for i in selected_indices]
        return sum(1 for r in reqs if r.kv.kv_allocated_len)  # reads r.kv, as SGLang's speculative estimate does

    def check_decode_mem(self):
        return self.token_to_kv_pool_allocator.available_size() >= self.new_tokens_required_next_decode()


def _req(rid, idx, length, protected, remaining):
    sp = SimpleNamespace(
        frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0, min_new_tokens=0, max_new_tokens=remaining
    )
    return SimpleNamespace(
        rid=rid,
        req_pool_idx=idx,
        cache_protected_len=protected,
        kv=SimpleNamespace(kv_allocated_len=length),
        kv_committed_len=length,
        sampling_params=sp,
        output_ids=[],
        to_finish=None,
        finished_reason=None,
        grammar=None,
        custom_logit_processor=None,
        multimodal_inputs=None,
        return_hidden_states=False,
        inflight_middle_chunks=0,
        finished=lambda: False,
    )


@pytest.fixture
def world(monkeypatch):
    """Two requests fill a 20-slot pool (the first shares a 4-token locked prefix); KV = position ids."""
    allocator, mover = Allocator(20), Mover(20, 64)
    pool = SimpleNamespace(req_to_token=torch.zeros(4, 32, dtype=torch.int32))
    pool.write = lambda index, values: pool.req_to_token.__setitem__(index, values)
    reqs = [_req("near", 1, 10, 4, 5), _req("far", 2, 10, 0, 500)]
    for r in reqs:
        slots = allocator.alloc(r.kv.kv_allocated_len)
        pool.req_to_token[r.req_pool_idx, : len(slots)] = slots.to(torch.int32)
        mover.kv[slots] = (100 * r.req_pool_idx + torch.arange(len(slots))).float()[:, None].expand(-1, H)
    released = []
    sched = SimpleNamespace(
        token_to_kv_pool_allocator=allocator,
        req_to_token_pool=pool,
        tree_cache="tree",
        chunked_req=None,
        ipc_channels=SimpleNamespace(
            send_to_tokenizer=SimpleNamespace(send_output=lambda msg, req: released.append(("abort", req.rid)))
        ),
    )
    off = offload.KVOffloader(sched, mover, decode_reserve=1)
    monkeypatch.setattr(offload, "_ACTIVE", off)
    monkeypatch.setattr(off, "_batch_of", lambda rows: Batch([r.req for r in rows], pool, allocator))
    monkeypatch.setattr("sglang.srt.mem_cache.common.evict_from_tree_cache", lambda tree, n: None)

    def original_release(req, tree, is_insert):  # SGLang's release_kv_cache: frees [protected, committed)
        row = pool.req_to_token[req.req_pool_idx]
        allocator.free(row[req.cache_protected_len : req.kv_committed_len].to(torch.int64))
        released.append(("release", req.rid, req.kv_committed_len))

    return SimpleNamespace(
        allocator=allocator,
        mover=mover,
        pool=pool,
        reqs=reqs,
        off=off,
        batch=Batch(reqs, pool, allocator),
        released=released,
        original_release=original_release,
    )


def _kv_of(w, req):
    return w.mover.kv[w.pool.req_to_token[req.req_pool_idx, : req.kv.kv_allocated_len].long(), 0]


def test_park_frees_slots_only_after_the_copy_and_restore_puts_kv_back(world):
    w, far = world, world.reqs[1]
    before = _kv_of(w, far).clone()
    w.off.park_if_needed(w.batch)
    assert [r.rid for r in w.batch.reqs] == ["near"]  # furthest from finishing was parked
    assert w.off.ledger.where(id(w.reqs[1])) is Where.PARKED and all(f.done for f in w.mover.fences)
    assert w.allocator.available_size() == 10 and w.off.ledger.host_free() == 54
    w.mover.kv[w.allocator.alloc(10)] = -1.0  # another request reuses (and overwrites) the freed slots
    w.allocator.free(torch.arange(11, 21))
    running = w.off.before_schedule(w.batch)  # 10 free < 10 + 16 rounds of headroom: stays parked
    assert w.off.ledger.where(id(w.reqs[1])) is Where.PARKED and running.reqs == w.batch.reqs
    w.allocator.free(w.pool.req_to_token[1, 4:10].long())  # "near" finished: 16 free
    running = w.off.before_schedule(Batch([], w.pool, w.allocator))  # empty batch: restore what fits
    assert [r.rid for r in running.reqs] == ["far"] and w.off.ledger.where(id(w.reqs[1])) is Where.RESTORING
    w.mover.fences[-1].complete()
    w.off.before_schedule(running)
    assert w.off.ledger.where(id(w.reqs[1])) is None and w.off.ledger.host_free() == 64
    assert torch.equal(_kv_of(w, far), before)  # same KV at the same positions, in new slots
    s = w.off.summary()
    assert (s["parks"], s["restores"], s["bytes_to_host"], s["retraction_fallbacks"]) == (1, 1, 10 * 2 * H, 0)


def test_restore_skips_finished_requests_still_in_the_running_batch(world):
    """A request that finished last round stays in the running batch until SGLang filters it, with its
    KV released (req.kv None): the restore's estimate of the batch's next round must skip it."""
    w, near = world, world.reqs[0]
    w.off.park_if_needed(w.batch)
    w.allocator.free(w.pool.req_to_token[1, 4:10].long())
    near.kv, near.finished = None, lambda: True
    running = w.off.before_schedule(w.batch)  # 16 free < far's 10 + 16 rounds of its own growth: stays parked
    assert running.reqs == [near] and w.off.ledger.where(id(w.reqs[1])) is Where.PARKED


def test_only_private_kv_moves_and_host_budget_falls_back(world):
    w = world
    w.reqs[0].sampling_params.max_new_tokens = 900  # now "near" is the victim: 6 private tokens
    w.mover.host_pool = w.off.ledger.host = HostSlots(5)
    w.off.park_if_needed(w.batch)  # near needs 6 host slots, far 10: neither fits -> SGLang retracts
    assert len(w.batch.reqs) == 2 and w.off.fallbacks == 1 and len(w.off.ledger) == 0
    w.mover.host_pool = w.off.ledger.host = HostSlots(6)
    w.off.park_if_needed(w.batch)
    rec = w.off.ledger.record(id(w.reqs[0]))
    assert (rec.start, rec.end) == (4, 10) and w.allocator.available_size() == 6


def test_parked_request_that_finishes_is_released_once(world):
    w, far = world, world.reqs[1]
    w.off.park_if_needed(w.batch)
    far.kv_committed_len = 12  # its in-flight step's result arrived and finished it
    w.off.release_parked(w.original_release, far, "tree", True)
    assert w.released == [("release", "far", 0)] and far.kv_committed_len == 12
    assert w.allocator.available_size() == 10 and w.off.ledger.host_free() == 64 and not w.off.has_parked


def test_abort_of_parked_and_in_flight_requests(world, monkeypatch):
    w, far = world, world.reqs[1]
    w.off.park_if_needed(w.batch)
    w.off.mark_aborts(SimpleNamespace(abort_all=False, rid="fa"))  # another request's id, a prefix of this one's
    assert far.to_finish is None
    w.off.mark_aborts(SimpleNamespace(abort_all=False, rid="far"))
    assert far.to_finish is not None
    monkeypatch.setattr(  # the hooked release_kv_cache over the fake pool
        "sglang.srt.mem_cache.common.release_kv_cache",
        lambda req, tree, is_insert=True: offload._ACTIVE.release_parked(w.original_release, req, tree, is_insert),
    )
    w.off.before_schedule(w.batch)
    assert ("abort", "far") in w.released and far.finished_reason is not None and not w.off.has_parked
    assert w.allocator.available_size() == 10 and w.off.ledger.host_free() == 64
    # A copy still in flight: drop waits for it, then frees the slots the request still held.
    near = w.reqs[0]
    host = w.off.ledger.reserve_host(6)
    slots = w.pool.req_to_token[1, 4:10].long()
    w.off.ledger.park(id(near), 4, 10, slots, host, w.mover.to_host(slots, host))
    w.off.release_parked(w.original_release, near, "tree", False)
    assert w.mover.fences[-1].done and w.allocator.available_size() == 16 and w.off.ledger.host_free() == 64


def test_offloader_takes_the_pool_from_the_model_runner_when_the_pools_exist(monkeypatch):
    # Scheduler.init_memory_pools (the hook point) runs before Scheduler.__init__ copies the
    # allocator onto the scheduler: the 2026-11-25 H100 run failed on scheduler.token_to_kv_pool_allocator.
    from sglang_sparsespec.patches import offload_hooks

    built = []
    monkeypatch.setattr(offload_hooks, "offload_host_gb", lambda: 2.0)
    monkeypatch.setattr(offload_hooks, "offload_refusal", lambda server_args: None)
    agree = lambda counts: counts  # noqa: E731  (the TP group's MIN all-reduce)
    monkeypatch.setattr(offload_hooks, "min_over_tp_group", lambda: agree)
    monkeypatch.setattr(
        offload_hooks, "CudaKVMover", lambda pool, gb, stream_of: built.append((pool, gb)) or Mover(8, 8)
    )
    monkeypatch.setattr(offload, "_ACTIVE", None)
    allocator = SimpleNamespace(get_kvcache=lambda: "device-kv-pool")
    sched = SimpleNamespace(
        server_args=None,
        spec_algorithm=SimpleNamespace(is_none=lambda: True),
        tp_worker=SimpleNamespace(model_runner=SimpleNamespace(token_to_kv_pool_allocator=allocator)),
    )
    assert offload_hooks.create_offloader("result", sched) == "result"
    assert built == [("device-kv-pool", 2.0)] and sched.pillar_offload is offload._ACTIVE
    assert sched.pillar_offload.ledger.agree is agree


# -- admission: PrefillAdder.add_one_req counts the host budget (the registered hook) ------------


def test_restored_batch_merges_and_filters_with_sglang_batches(monkeypatch):
    """The batch ``_batch_of`` builds goes through SGLang's own ScheduleBatch.merge_batch and filter_batch
    either way round with a batch that came from prefill (which carries a per-request multimodal list)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    sampling = SimpleNamespace(merge_batch=lambda other: None, filter_batch=lambda *a, **k: None)
    monkeypatch.setattr(SamplingBatchInfo, "from_schedule_batch", classmethod(lambda cls, b, vocab: sampling))
    sched = SimpleNamespace(
        req_to_token_pool=SimpleNamespace(device="cpu"),
        token_to_kv_pool_allocator=None,
        tree_cache=None,
        model_config=SimpleNamespace(vocab_size=32, is_encoder_decoder=False),
        enable_overlap=True,
        spec_algorithm=SpeculativeAlgorithm.NONE,
    )
    off = offload.KVOffloader.__new__(offload.KVOffloader)
    off.scheduler = sched

    def batch(rid: str, idx: int, n: int) -> ScheduleBatch:
        req = SimpleNamespace(
            rid=rid,
            req_pool_idx=idx,
            return_logprob=False,
            grammar=None,
            is_prefill_only=False,
            multimodal_inputs=None,
            return_hidden_states_mode=CaptureHiddenMode.NULL,
            finished=lambda: False,
        )
        n_t = torch.tensor([n])
        return off._batch_of([offload._Row(req=req, seq_len=n_t, seq_len_cpu=n_t, orig_seq_len=n_t, spec_info=None)])

    prefilled = batch("running", 1, 5)
    prefilled.multimodal_inputs = [None]  # as prepare_for_extend leaves a text-only batch
    prefilled.merge_batch(batch("restored", 2, 7))
    restored = batch("restored-alone", 3, 9)  # a restore into an empty running batch, then a prefill joins it
    restored.merge_batch(prefilled)
    assert [r.rid for r in restored.reqs] == ["restored-alone", "running", "restored"]
    assert restored.multimodal_inputs == [None] * 3 and restored.seq_lens.tolist() == [9, 5, 7]
    restored.filter_batch(keep_indices=[2])
    assert [r.rid for r in restored.reqs] == ["restored"] and restored.multimodal_inputs == [None]


@SERVED
def test_the_mover_takes_only_the_plain_mha_pool():
    """A subclass of SGLang's MHA pool (page-major, FP4, MXFP8) lays its slots out otherwise than the host pool's
    per-layer copy kernels read them: refused before any copy, not parked as garbage."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    from sglang_sparsespec.patches.offload_kv import CudaKVMover

    class PackedPool(MHATokenToKVPool):
        pass

    with pytest.raises(TypeError, match="needs SGLang's plain 16-bit MHA KV pool \\(got PackedPool"):
        CudaKVMover(object.__new__(PackedPool), 1.0, lambda: None)
