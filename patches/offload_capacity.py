"""What the offload pool adds to the scheduler's view of its capacity (``docs/offload.md``).

Admission: free host tokens count as pool for the decode growth of a request that can be parked
(``admit``). Load reports: parked requests are running requests whose KV waits on host
(``parked_load``), so ``/v1/loads`` and the DP balancer, which reads the same snapshot, see them.
"""

from __future__ import annotations

from .offload import KVOffloader, parkable


def admission_slack(off: KVOffloader, live_requests: int) -> int:
    """Host tokens that admission may count as KV pool for the requests' future decode growth.

    Free host slots (parked and restoring KV is already outside them), minus what the parked
    requests will still grow (they are in neither the running batch nor the adder's estimate),
    minus one decode reserve (the over-allocated draft / verify slots) per live request.
    May be <= 0: then admission is SGLang's own.
    """
    growth = sum(max(row.req.sampling_params.max_new_tokens - len(row.req.output_ids), 0) for row in off.rows.values())
    return off.ledger.host_free() - growth - off.decode_reserve * live_requests


def admit(off: KVOffloader, original, adder, req, *args, **kwargs):
    """``PrefillAdder.add_one_req`` with the host budget counted as pool for decode growth.

    SGLang admits a request only when its future demand fits the free (and evictable) GPU
    tokens: exactly for ``ignore_eos`` requests with the radix cache off (it then never
    over-admits), by ``new_token_ratio`` otherwise. With an offloader, the overshoot is parked
    on host rather than retracted or left queued, so the demand may use GPU + host free tokens.
    Invariants: only a request that can be parked borrows (one that cannot, penalized, grammar-bound
    or with a custom processor, would be retracted and recomputed where SGLang queues it); the
    request's whole prefill is allocated in this pass and fits the GPU now (the slack funds decode
    growth only, which ``park_if_needed`` serves; a later chunk of a chunked prompt would need GPU
    memory that parking does not make); the adder's offsets are exactly SGLang's after the call
    (the slack is lent for this one call).
    """
    running = 0 if adder.running_batch is None else len(adder.running_batch.reqs)
    slack = admission_slack(off, running + len(adder.can_run_list) + 1)
    extend = len(req.full_untruncated_fill_ids) - len(req.prefix_indices)
    whole_prefill_now = adder.rem_chunk_tokens is None or extend <= adder.rem_chunk_tokens
    fits_gpu_now = adder.ceil_paged_tokens(extend) + adder.page_size <= adder.cur_rem_tokens
    if slack <= 0 or not whole_prefill_now or not fits_gpu_now or not parkable(req):
        return original(adder, req, *args, **kwargs)
    # Both budgets: rem_total_tokens gates the estimated demand; add_one_req_ignore_eos also
    # simulates the exact demand from cur_rem_tokens (this step's prefill was checked above).
    adder.rem_total_token_offset -= slack
    adder.cur_rem_token_offset -= slack
    try:
        return original(adder, req, *args, **kwargs)
    finally:
        adder.rem_total_token_offset += slack
        adder.cur_rem_token_offset += slack


def parked_load(off: KVOffloader) -> tuple[int, int]:
    """(requests, KV tokens) parked on host. A park whose copy is still in flight holds its device
    slots, which the pool's used tokens count already: only its request is added."""
    tokens = 0
    for key in off.rows:
        rec = off.ledger.record(key)
        tokens += 0 if rec.device is not None else rec.tokens
    return len(off.rows), tokens
