"""Scheduler side of request ids: a live id is not taken twice, and an abort reaches its own request.

With ``--tokenizer-worker-num`` > 1 each tokenizer worker refuses a duplicate rid only among its own
requests, so two clients can have live requests of one rid at the scheduler; everything downstream
keys by rid (the detokenizer's decode state: one client got the other's text). The scheduler is the one
place that sees every request of a server (of a DP replica under ``--dp-size``): ``refuse_live_duplicate``
answers a request whose rid is live there with a 400, as SGLang's own scheduler-side refusals are sent
(an ``AbortReq`` carrying the finish reason to the request's tokenizer worker).

SGLang's ``Scheduler.abort_request`` aborts every request whose rid starts with the aborted one.
``exact_abort`` hides the others from it for the call: a request is aborted by its own rid or its
parent's (``sglang_sparsespec.rids.abort_matches``).
"""

from __future__ import annotations

from collections.abc import Iterator
from http import HTTPStatus
from typing import Any

from sglang_sparsespec.rids import RidBook, abort_matches

_BOOK = "_sparsespec_rid_book"


def _queued(scheduler) -> Iterator[Any]:
    """Requests the scheduler holds that have not been run to their end: each may still send output."""
    yield from scheduler.waiting_queue
    if scheduler.chunked_req is not None:
        yield scheduler.chunked_req
    yield from getattr(scheduler.grammar_manager, "grammar_queue", ())
    if getattr(scheduler, "dllm_config", None) is not None:
        yield from scheduler.dllm_manager.waiting_queue
        yield from scheduler.dllm_manager.staging_queue
    # PD disaggregation's queues: None outside that mode (Scheduler.init_disaggregation), absent in some releases.
    for name in ("disagg_prefill_bootstrap_queue", "disagg_decode_prealloc_queue", "disagg_decode_transfer_queue"):
        queue = getattr(scheduler, name, None)
        for item in getattr(queue, "queue", ()):
            yield getattr(item, "req", item)
        yield from getattr(queue, "retracted_queue", ())
    yield from getattr(scheduler, "disagg_prefill_inflight_queue", None) or ()


def _batched(scheduler) -> Iterator[Any]:
    """Requests of the batches Scheduler.abort_request searches (a finished one already sent its output)."""
    from sglang.srt.runtime_context import get_parallel

    collect = getattr(scheduler, "_collect_inflight_batches", None)
    if collect is not None:  # from 0.5.22 SGLang's own list (pipeline micro-batches, the polled result queue)
        batches = collect()
    else:  # what abort_request reads: Scheduler.ps up to 0.5.20, the runtime context in 0.5.21
        ps = getattr(scheduler, "ps", None)
        pp = ps.pp_size if ps is not None else get_parallel().pp_size
        if pp == 1:
            batches = [scheduler.running_batch, scheduler.last_batch]
        else:
            batches = [*scheduler.running_mbs, *scheduler.mbs]
    for batch in batches:
        if batch is not None:
            yield from batch.reqs


def live_ids(scheduler) -> set[str]:
    """Rids of every request this scheduler will still send output for (parked ones included)."""
    ids = {req.rid for req in _queued(scheduler)}
    ids.update(req.rid for req in _batched(scheduler) if not req.finished())
    offloader = getattr(scheduler, "pillar_offload", None)
    if offloader is not None:
        ids.update(row.req.rid for row in offloader.rows.values())
    return ids


def _refuse(scheduler, recv_req) -> None:
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    message = (
        f"rid {recv_req.rid!r} is the id of a request that is still running: a request id must be unique "
        "among the server's live requests"
    )
    reason = FINISH_ABORT(message, HTTPStatus.BAD_REQUEST, "BadRequestError").to_json()
    abort = AbortReq(rid=recv_req.rid, finished_reason=reason, http_worker_ipc=recv_req.http_worker_ipc)
    scheduler.ipc_channels.send_to_tokenizer.send_output(abort, recv_req)


# ---- hooks (registered in patches/hooks_boundary.py) -----------------------------------------------
def refuse_live_duplicate(original, scheduler, recv_req, *args, **kwargs):
    """Scheduler.handle_generate_request: a rid live in this scheduler is a 400; each TP rank decides
    alike (the same requests in the same order), only rank 0 has a socket to answer on."""
    if getattr(scheduler, "rust_server", None) is not None:
        # SGLang's embedded Rust server answers its clients itself: nothing reads the tokenizer socket a refusal
        # would go out on, so the refused client would wait forever. Its requests take SGLang's own path.
        return original(scheduler, recv_req, *args, **kwargs)
    rid = recv_req.rid
    book = vars(scheduler).get(_BOOK)
    if book is None:
        book = RidBook()
        setattr(scheduler, _BOOK, book)
    if isinstance(rid, str):
        if book.maybe_live(rid) and rid in live_ids(scheduler):
            _refuse(scheduler, recv_req)
            return None
        book.accept(rid, lambda: live_ids(scheduler))
    return original(scheduler, recv_req, *args, **kwargs)


def exact_abort(original, scheduler, recv_req, *args, **kwargs):
    """Scheduler.abort_request: requests whose rid merely starts with the aborted one are hidden from
    SGLang's prefix match for the call (their rid carries a leading character it cannot start with)."""
    if recv_req.abort_all:
        return original(scheduler, recv_req, *args, **kwargs)
    target = recv_req.rid
    if not target:
        return None  # an empty rid is a prefix of every rid and the id of none
    mark = "\x01" if target.startswith("\x00") else "\x00"
    reqs = {id(r): r for source in (_queued(scheduler), _batched(scheduler)) for r in source}
    hidden = [r for r in reqs.values() if r.rid.startswith(target) and not abort_matches(r.rid, target)]
    for req in hidden:
        req.rid = mark + req.rid
    try:
        return original(scheduler, recv_req, *args, **kwargs)
    finally:
        for req in hidden:
            req.rid = req.rid[1:]
