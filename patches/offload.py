"""Scheduler wiring of the offload-aware KV pool (``docs/offload.md``).

Off unless ``--pillar-offload-host-gb`` > 0. When the running batch's next decode round does not
fit in the GPU pool, requests are *parked* instead of retracted: the KV of their private
positions (past the prefix the radix cache owns and they keep locked) is copied to pinned host
memory on a side stream, they leave the batch, and their device slots are freed once the copy's
event completed. A parked request keeps its ``req_pool_idx`` row, so everything keyed by it
survives untouched: the FutureMap relay (seq_lens, the pending bonus / next input token) and the
PILLAR worker's per-request state, whose selection plans hold positions, not slots. Restoring
allocates fresh slots, copies the KV back (the next forward waits on the copy's event), rewrites
the row at the same positions and merges the request into the running batch as it left it.
When nothing can be parked (host budget exhausted or no eligible request), SGLang's own
retraction runs, with one log line per episode.

Ordering under the overlap scheduler: parking happens in ``update_running_batch`` of step N while
step N-1 may still run; the copy waits for the forward stream and covers every allocated slot, so
it includes what N-1 writes, and N-1's result is then processed for the parked request as usual
(tokens appended, or finished: ``release_kv_cache`` is hooked). Restores, aborts and finishes of
parked requests are handled at the top of the next ``get_next_batch_to_run``, after N-1's result.
A request whose prefill result is still unprocessed (it joined the batch from step N-1's prefill, or
it is mid-way through a chunked prefill) is never parked: processing that result hands the
request's row to ``RadixCache.cache_unfinished_req``, which would insert the slots parking freed
into the tree.

Parked requests are work: the scheduler is not idle while any exists (no flush, no idle leak
check), and a pause that retracts the running requests retracts the parked ones too.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import Any

import torch

from sglang_sparsespec.offload import Agree, Candidate, OffloadLedger, Where, choose_victims
from sglang_sparsespec.rids import abort_matches

logger = logging.getLogger(__name__)

# A restore needs room for the restored KV plus this many decode rounds of the whole batch, so a
# restored request is not parked again on the very next round (park/restore thrash).
RESTORE_HEADROOM_ROUNDS = 16

_ACTIVE: KVOffloader | None = None  # the offloader of this scheduler process


@dataclass
class _Row:
    """A parked request's slice of the running batch, restored as it was."""

    req: Any
    seq_len: torch.Tensor  # [1] on the device
    seq_len_cpu: torch.Tensor | None
    orig_seq_len: torch.Tensor
    spec_info: Any | None


def parkable(req) -> bool:
    """Requests whose per-batch state a restore rebuilds exactly (the rest are retracted as in SGLang)."""
    sp = req.sampling_params
    return (
        not req.finished()
        and req.to_finish is None
        and req.grammar is None
        and req.custom_logit_processor is None
        and req.multimodal_inputs is None
        and not req.return_hidden_states
        and getattr(req, "mamba_pool_idx", None) is None
        and req.inflight_middle_chunks <= 0  # a chunked prefill in flight
        # Penalizers accumulate output counts in the batch's orchestrator, which a restore rebuilds.
        and sp.frequency_penalty == 0.0
        and sp.presence_penalty == 0.0
        and sp.repetition_penalty == 1.0
        and not sp.min_new_tokens
    )


class KVOffloader:
    """Parks and restores requests of one scheduler. ``mover`` is a ``CudaKVMover`` (or a CPU double)."""

    def __init__(self, scheduler, mover, decode_reserve: int, agree: Agree | None = None) -> None:
        self.scheduler = scheduler
        self.mover = mover
        self.ledger = OffloadLedger(mover.host_pool, agree)  # agree: MIN over the TP ranks (tp_agree)
        self.decode_reserve = decode_reserve  # tokens a request may allocate for its next round
        # By the request object's id (the row holds the object): two live requests can share a rid.
        self.rows: dict[int, _Row] = {}
        self.fallbacks = 0  # decode rounds that SGLang's retraction had to serve
        self._warned = False

    @property
    def has_parked(self) -> bool:
        return bool(self.rows)

    @property
    def busy(self) -> bool:
        """Requests parked, or copies of restored requests still in flight: the scheduler is not idle."""
        return bool(self.rows) or len(self.ledger) > 0

    def _prefill_pending(self) -> set[int]:
        """``id`` of every request whose prefill result SGLang has not processed yet.

        Under the overlap scheduler the previous step's batch waits in ``result_queue`` until after
        this step is planned; its prefilled requests are already merged into the running batch.
        Processing that result runs ``cache_unfinished_req`` on each prefilled row (not on the
        decoding requests a mixed batch carries, whose results are decode results). The chunked
        request is mid-prefill until its last chunk's result arrives.
        """
        sched = self.scheduler
        pending: set[int] = set()
        for b, _ in getattr(sched, "result_queue", ()):
            # Scheduler.process_batch_result's dispatch: decode first, then prefill.
            if b.forward_mode.is_decode() or not b.forward_mode.is_extend():
                continue
            decoding = {id(r) for r in b.decoding_reqs or ()}
            pending.update(id(r) for r in b.reqs if id(r) not in decoding)
        if sched.chunked_req is not None:
            pending.add(id(sched.chunked_req))
        return pending

    # -- step N: the batch does not fit -> park ------------------------------------------------
    def park_if_needed(self, batch) -> None:
        batch.filter_batch()
        if batch.is_empty() or batch.check_decode_mem():
            return
        allocator = batch.token_to_kv_pool_allocator
        short = batch.new_tokens_required_next_decode() - allocator.available_size()
        pending = self._prefill_pending()
        # Batch position is admission order: prefills and restores are merged at the end.
        cands = [
            Candidate(id(req), req.kv.kv_allocated_len - req.cache_protected_len,
                      req.sampling_params.max_new_tokens - len(req.output_ids), i)
            for i, req in enumerate(batch.reqs)
            if parkable(req) and id(req) not in pending and self.ledger.where(id(req)) is None
        ]  # fmt: skip
        victims = choose_victims(cands, short, self.ledger.host_free(), len(batch.reqs) - 1)
        if not victims:
            self._fallback(short)
            return
        index = {id(req): i for i, req in enumerate(batch.reqs)}
        parked: list[int] = []
        try:
            for v in victims:
                self._park(batch, index[v.key])
                parked.append(index[v.key])
        finally:  # a failed copy leaves the requests parked so far consistent (out of the batch, freed)
            batch.filter_batch(keep_indices=[i for i in range(len(batch.reqs)) if i not in set(parked)])
            # This round needs the memory now: wait for these copies (each ordered after the in-flight
            # forward), then free the slots. SGLang's retraction covers any remaining shortfall.
            for v in victims[: len(parked)]:
                self._free_device(self.ledger.settle(v.key))
        if not batch.check_decode_mem():
            self._fallback(batch.new_tokens_required_next_decode() - allocator.available_size())

    def _park(self, batch, i: int) -> None:
        req = batch.reqs[i]
        start, end = req.cache_protected_len, req.kv.kv_allocated_len
        spec_info = None
        if batch.spec_info is not None:
            # filter_batch rebinds the draft input's fields, so a shallow copy slices independently.
            spec_info = copy.copy(batch.spec_info)
            spec_info.filter_batch(new_indices=torch.tensor([i], device=batch.seq_lens.device), new_indices_cpu=[i])
        row = _Row(
            req=req,
            seq_len=batch.seq_lens[i : i + 1],
            seq_len_cpu=None if batch.seq_lens_cpu is None else batch.seq_lens_cpu[i : i + 1],
            orig_seq_len=batch.orig_seq_lens[i : i + 1],
            spec_info=spec_info,
        )
        device_slots = batch.req_to_token_pool.req_to_token[req.req_pool_idx, start:end].to(torch.int64)
        # The host reservation is the last step that can fail before the park is recorded.
        host_slots = self.ledger.reserve_host(end - start)
        try:
            fence = self.mover.to_host(device_slots, host_slots)
        except BaseException:
            # Nothing was recorded: the reservation goes back, once no copy that reached the stream still writes it.
            self.mover.drain()
            self.ledger.host.free(host_slots)
            raise
        self.ledger.park(id(req), start, end, device_slots, host_slots, fence)
        self.rows[id(req)] = row

    def _free_device(self, slots) -> None:
        if slots is not None and len(slots):
            self.scheduler.token_to_kv_pool_allocator.free(slots)

    def _fallback(self, short: int) -> None:
        self.fallbacks += 1
        if not self._warned:
            self._warned = True
            logger.warning(
                "KV offload: %d tokens short and no request can be parked (host budget %d of %d tokens "
                "free, %d parked); SGLang retracts (recomputes) requests",
                short, self.ledger.host_free(), self.mover.host_pool.size, len(self.rows),
            )  # fmt: skip

    # -- top of every step: settle, finish/abort, restore -----------------------------------------
    def before_schedule(self, running_batch):
        for _, slots in self.ledger.poll():
            self._free_device(slots)
        for row in list(self.rows.values()):
            if row.req.to_finish is not None or row.req.finished():
                self._abort_parked(row)
        if self.rows:
            running_batch = self._restore(running_batch)
        self._warned = self._warned and bool(self.rows)
        return running_batch

    def _abort_parked(self, row: _Row) -> None:
        from sglang.srt.managers.io_struct import AbortReq
        from sglang.srt.mem_cache.common import release_kv_cache

        req = row.req
        if req.to_finish is not None and not req.finished():
            req.finished_reason, req.to_finish = req.to_finish, None
        release_kv_cache(req, self.scheduler.tree_cache, is_insert=False)  # -> release_parked
        self.scheduler.ipc_channels.send_to_tokenizer.send_output(AbortReq(rid=req.rid), req)

    def _restore(self, running_batch):
        from sglang.srt.mem_cache.common import evict_from_tree_cache

        sched = self.scheduler
        allocator = sched.token_to_kv_pool_allocator
        empty = running_batch is None or running_batch.is_empty()
        if empty:  # nothing else can run: wait for pending parks rather than idle with KV on host
            for key in list(self.rows):
                self._free_device(self.ledger.settle(key))
        restored: list[_Row] = []
        running_need = 0
        if not empty:
            # Requests that finished last round are still in the batch until SGLang filters it, their KV
            # already released (req.kv None, which SGLang's speculative estimate reads): they need nothing.
            live = [i for i, r in enumerate(running_batch.reqs) if r.kv is not None and not r.finished()]
            running_need = running_batch.new_tokens_required_next_decode(live)
        for rec in self.ledger.parked_in_order():
            batch_need = running_need + self.decode_reserve * (len(restored) + 1)
            need = rec.tokens + batch_need * (1 if empty and not restored else RESTORE_HEADROOM_ROUNDS)
            evict_from_tree_cache(sched.tree_cache, need)
            if allocator.available_size() < need:
                break
            row = self.rows[rec.key]
            slots = allocator.alloc(rec.tokens)
            try:
                fence = self.mover.to_device(rec.host, slots)
            except BaseException:
                # The request stays parked on host; the slots go back once no layer's copy already queued writes them.
                self.mover.drain()
                allocator.free(slots)
                raise
            sched.req_to_token_pool.write((row.req.req_pool_idx, slice(rec.start, rec.end)), slots.to(torch.int32))
            self.ledger.begin_restore(rec.key, fence)
            restored.append(self.rows.pop(rec.key))
        if not restored:
            return running_batch
        back = self._batch_of(restored)
        if empty:
            return back
        running_batch.merge_batch(back)
        running_batch.batch_is_full = False
        return running_batch

    def _batch_of(self, rows: list[_Row]):
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

        s = self.scheduler
        reqs = [r.req for r in rows]
        b = ScheduleBatch.init_new(
            reqs, s.req_to_token_pool, s.token_to_kv_pool_allocator, s.tree_cache,
            s.model_config, s.enable_overlap, s.spec_algorithm,
        )  # fmt: skip
        b.forward_mode = ForwardMode.DECODE
        b.req_pool_indices_cpu = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
        b.req_pool_indices = b.req_pool_indices_cpu.to(b.device, non_blocking=True)
        b.seq_lens = torch.cat([r.seq_len for r in rows])
        cpu = [r.seq_len_cpu for r in rows]
        b.seq_lens_cpu = None if any(c is None for c in cpu) else torch.cat(cpu)
        b.orig_seq_lens = torch.cat([r.orig_seq_len for r in rows])
        b.input_ids = None  # relayed through the FutureMap row, as for every decode round
        # prepare_for_extend leaves a per-request list here, and merge_batch / filter_batch index and
        # concatenate it whenever the running batch has one (the H100 offload test died on None).
        b.multimodal_inputs = [r.multimodal_inputs for r in reqs]
        if b.return_logprob:
            b.top_logprobs_nums = [r.logprob.top_logprobs_num for r in reqs]
            b.token_ids_logprobs = [r.logprob.token_ids_logprob for r in reqs]
        b.sampling_info = SamplingBatchInfo.from_schedule_batch(b, s.model_config.vocab_size)
        if rows[0].spec_info is not None:
            b.spec_info = rows[0].spec_info
            for r in rows[1:]:
                b.spec_info.merge_batch(r.spec_info)
        return b

    # -- finish / abort of a parked request --------------------------------------------------------
    def tracks(self, req) -> bool:
        return self.ledger.where(id(req)) is not None

    def release_parked(self, original, req, tree_cache, is_insert: bool) -> None:
        """``release_kv_cache`` for a request the ledger holds: wait for its copy, then free."""
        rec = self.ledger.drop(id(req))
        self.rows.pop(id(req), None)
        if rec.where is Where.RESTORING:  # back on the device: an ordinary release
            return original(req, tree_cache, is_insert)
        self._free_device(rec.device)
        # Its private KV is gone from the device: release it as a request of length ``start``
        # (the locked prefix is unlocked, the row freed), then restore the real length.
        committed = req.kv_committed_len
        req.kv_committed_len = req.kv.kv_allocated_len = rec.start
        try:
            original(req, tree_cache, False)
        finally:
            req.kv_committed_len = committed

    def retract_parked(self) -> None:
        """``pause_generation(retract)``: retract the parked requests as SGLang retracted the running ones.

        A retract-mode pause precedes a weight update: no KV computed with the old weights may
        survive it. Each parked request is released through the hooked ``release_kv_cache`` (its
        pending copy waited for, host slots freed, the locked prefix unlocked, the row freed), reset
        and queued again, to be prefilled anew after the pause.
        """
        from .contacts import retract_all

        sched = self.scheduler
        reqs = [row.req for row in self.rows.values()]
        if not reqs:
            return
        retract_all(
            reqs=reqs, server_args=sched.server_args, req_to_token_pool=sched.req_to_token_pool,
            token_to_kv_pool_allocator=sched.token_to_kv_pool_allocator, tree_cache=sched.tree_cache,
            hisparse_coordinator=getattr(sched, "hisparse_coordinator", None), offload_kv=False,
        )  # fmt: skip
        for req in reqs:
            sched._add_request_to_queue(req)

    def mark_aborts(self, recv_req) -> None:
        from sglang.srt.managers.schedule_batch import FINISH_ABORT

        for row in self.rows.values():
            if recv_req.abort_all or abort_matches(row.req.rid, recv_req.rid):
                row.req.to_finish = FINISH_ABORT("Aborted by AbortReq.")

    def summary(self) -> dict:
        st = self.ledger.stats
        bpt = self.mover.bytes_per_token
        return {
            "parked_now": len(self.rows),
            "parks": st.parks,
            "restores": st.restores,
            "bytes_to_host": st.tokens_to_host * bpt,
            "bytes_to_device": st.tokens_to_device * bpt,
            "host_tokens_free": self.ledger.host_free(),
            "host_tokens": self.mover.host_pool.size,
            "retraction_fallbacks": self.fallbacks,
        }
