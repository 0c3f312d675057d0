"""The scheduler hooks of the offload-aware KV pool; each is a no-op unless an offloader exists.

An offloader exists only in a scheduler process started with ``--pillar-offload-host-gb`` > 0
(``create_offloader``, right after SGLang built the KV pools).
"""

from __future__ import annotations

import msgspec

from sglang_sparsespec.config import offload_host_gb

from . import offload, offload_capacity
from .contacts import resolved
from .offload_kv import CudaKVMover, host_memory_gap, offload_refusal
from .server_args_flags import with_flags
from .tp_agree import min_over_tp_group


def validate_offload_flag(result, server_args, *args, **kwargs):
    """ServerArgs: a bad budget, one this host cannot pin, or an unsupported combination fails at launch, in one
    line."""
    try:
        gb = offload_host_gb()
    except ValueError as exc:
        raise ValueError(with_flags(str(exc))) from None
    if gb > 0:
        sa = resolved(server_args)
        reason = offload_refusal(sa) or host_memory_gap(gb, sa)
        if reason is not None:
            raise ValueError(reason)
    return result


def create_offloader(result, scheduler, *args, **kwargs):
    gb = offload_host_gb()
    if gb > 0:
        from sglang.srt.mem_cache.allocation_sizing import get_alloc_reserve_per_decode

        if (reason := offload_refusal(resolved(scheduler.server_args))) is not None:
            raise ValueError(reason)
        # The scheduler takes its own token_to_kv_pool_allocator reference only after this hook
        # (Scheduler.__init__, from build_kv_cache's result); the model runner holds it already.
        allocator = scheduler.tp_worker.model_runner.token_to_kv_pool_allocator
        mover = CudaKVMover(allocator.get_kvcache(), gb, lambda: getattr(scheduler, "forward_stream", None))
        reserve = 1 if scheduler.spec_algorithm.is_none() else get_alloc_reserve_per_decode()
        # Copies advance as far as every TP rank's did, so every rank decides from the same ledger.
        off = offload.KVOffloader(scheduler, mover, reserve, agree=min_over_tp_group())
        scheduler.pillar_offload = offload._ACTIVE = off
    return result


def _offloader(scheduler) -> offload.KVOffloader | None:
    return getattr(scheduler, "pillar_offload", None)


def restore_before_scheduling(original, scheduler, *args, **kwargs):
    off = _offloader(scheduler)
    if off is not None:
        if "running_batch" in kwargs:
            kwargs["running_batch"] = off.before_schedule(kwargs["running_batch"])
        else:
            args = (off.before_schedule(args[0]), *args[1:])
    return original(scheduler, *args, **kwargs)


def park_before_retract(original, scheduler, batch, *args, **kwargs):
    off = _offloader(scheduler)
    if off is not None:
        off.park_if_needed(batch)
    return original(scheduler, batch, *args, **kwargs)


def hold_admission_while_parked(original, scheduler, *args, **kwargs):
    off = _offloader(scheduler)
    if off is not None and off.has_parked and scheduler.chunked_req is None:
        # Parked requests come back first; new prefills would take the memory they wait for.
        return None, kwargs["running_batch"] if "running_batch" in kwargs else args[-1]
    return original(scheduler, *args, **kwargs)


def admit_against_host(original, adder, req, *args, **kwargs):
    # The adder has no scheduler reference; this process's offloader is the module's.
    off = offload._ACTIVE
    if off is not None:
        return offload_capacity.admit(off, original, adder, req, *args, **kwargs)
    return original(adder, req, *args, **kwargs)


def release_parked_kv(original, req, tree_cache, is_insert: bool = True):
    off = offload._ACTIVE
    if off is not None and off.tracks(req):
        return off.release_parked(original, req, tree_cache, is_insert)
    return original(req, tree_cache, is_insert)


def mark_parked_aborts(result, scheduler, recv_req, *args, **kwargs):
    off = _offloader(scheduler)
    if off is not None:
        off.mark_aborts(recv_req)
    return result


def parked_requests_are_work(result, scheduler, *args, **kwargs):
    """``Scheduler.is_fully_idle``: not idle while a request is parked or a restore's copy is in flight,
    so no flush clears the pools under them and the idle leak check does not count their slots."""
    off = _offloader(scheduler)
    if off is not None and off.busy:
        return False
    return result


def retract_parked_on_pause(result, scheduler, recv_req, *args, **kwargs):
    off = _offloader(scheduler)
    if off is not None and recv_req.mode == "retract":
        off.retract_parked()
    return result


def add_offload_state(result, scheduler, *args, **kwargs):
    off = _offloader(scheduler)
    state = getattr(result, "internal_state", None)
    if off is not None and isinstance(state, dict):
        state["offload"] = off.summary()
    return result


def count_parked_load(result, inquirer, *args, **kwargs):
    """``SchedulerLoadInquirer.get_loads``: parked requests run (their KV waits on host and comes back),
    so /v1/loads and the DP balancer count them and their tokens (the inquirer has no scheduler
    reference; this process's offloader is the module's)."""
    off = offload._ACTIVE
    if off is None or not off.has_parked:
        return result
    requests, tokens = offload_capacity.parked_load(off)
    return msgspec.structs.replace(
        result,
        num_running_reqs=result.num_running_reqs + requests,
        num_total_tokens=result.num_total_tokens + tokens,
        num_active_tokens=result.num_active_tokens + tokens,
    )
