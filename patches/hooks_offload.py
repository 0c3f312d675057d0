"""The offload-aware KV pool's hooks (``offload``, docs/offload.md): every one is a no-op unless
--pillar-offload-host-gb > 0. The pool serves ``contacts.OFFLOAD_RELEASES``; on the other releases only
the launch validation is applied, which refuses the flag there.
"""

from __future__ import annotations

from . import offload_hooks
from .contacts import OFFLOAD_RELEASES
from .hook import Hook
from .versions import releases

_VALIDATE = (
    "offload combined with an algorithm, page size, cache mode or SGLang release it does not serve fails at launch"
)

OFFLOAD_HOOKS: tuple[Hook, ...] = (
    Hook(
        "sglang.srt.server_args.ServerArgs.__post_init__",
        "AFTER",
        offload_hooks.validate_offload_flag,
        _VALIDATE,
        versions=releases(last="0.5.18"),
    ),
    Hook(
        "sglang.srt.server_args.ServerArgs.resolve_once",
        "AFTER",
        offload_hooks.validate_offload_flag,
        f"{_VALIDATE} (0.5.19 resolves ServerArgs there, apart from construction)",
        versions=releases("0.5.19"),
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.init_memory_pools",
        "AFTER",
        offload_hooks.create_offloader,
        "the pinned host pool and copy stream are built once the device KV pool exists",
        versions=OFFLOAD_RELEASES,
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.update_running_batch",
        "AROUND",
        offload_hooks.park_before_retract,
        "when the next decode round does not fit, park requests on host before SGLang retracts (recomputes)",
        versions=OFFLOAD_RELEASES,
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run",
        "AROUND",
        offload_hooks.restore_before_scheduling,
        "free slots of finished copies, end aborted parked requests and restore parked ones before "
        "the step is planned (after the previous step's result was processed)",
        versions=OFFLOAD_RELEASES,
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler._get_new_batch_prefill_raw",
        "AROUND",
        offload_hooks.hold_admission_while_parked,
        "new prefills would take the memory parked requests wait for",
        versions=OFFLOAD_RELEASES,
    ),
    Hook(
        "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req",
        "AROUND",
        offload_hooks.admit_against_host,
        "admission counts free host tokens for decode growth: SGLang admits ignore_eos requests "
        "(radix off) only when their exact demand fits the GPU, so it queues instead of over-admitting "
        "and nothing is ever parked (H100, 64 x 7000 tokens at demand / 1.5: 43 ran, 21 waited)",
        versions=OFFLOAD_RELEASES,
    ),
    Hook(
        "sglang.srt.mem_cache.common.release_kv_cache",
        "AROUND",
        offload_hooks.release_parked_kv,
        "a parked request that finishes (its in-flight step's result) or is aborted has its private KV "
        "on host, not in its req_to_token row",
        versions=OFFLOAD_RELEASES,
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.abort_request",
        "AFTER",
        offload_hooks.mark_parked_aborts,
        "parked requests are in neither the waiting queue nor the running batch that abort searches",
        versions=OFFLOAD_RELEASES,
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.is_fully_idle",
        "AFTER",
        offload_hooks.parked_requests_are_work,
        "parked requests are in neither the running batch nor the waiting queue: without this the "
        "scheduler counts as idle, flush_cache clears the pools under them and the leak check fires",
        versions=OFFLOAD_RELEASES,
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.pause_generation",
        "AFTER",
        offload_hooks.retract_parked_on_pause,
        "a retract-mode pause (before a weight update) retracts the running batch only; parked "
        "requests are retracted too, so no KV of the old weights survives on host",
        versions=OFFLOAD_RELEASES,
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.get_internal_state",
        "AFTER",
        offload_hooks.add_offload_state,
        "/server_info shows parks, restores, bytes moved and retraction fallbacks",
        versions=OFFLOAD_RELEASES,
    ),
    Hook(
        "sglang.srt.managers.scheduler_components.load_inquirer.SchedulerLoadInquirer.get_loads",
        "AFTER",
        offload_hooks.count_parked_load,
        "parked requests are in neither the running batch nor the waiting queue it counts: /v1/loads "
        "and --dp-size load balancing would see the replica lighter than it is",
        versions=OFFLOAD_RELEASES,
    ),
)
