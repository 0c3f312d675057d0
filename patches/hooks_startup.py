"""The start-up timeline's hooks (``startup_timeline``): one log line of where a server's start went.
"""

from __future__ import annotations

from . import startup_timeline
from .hook import Hook

STARTUP_HOOKS: tuple[Hook, ...] = (
    Hook(
        "sglang.srt.model_executor.model_runner.ModelRunner.load_model",
        "AROUND",
        startup_timeline.time_weights,
        "the start-up timeline's weights phase: the target's (and any draft model's) weight loading",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.init_memory_pools",
        "AROUND",
        startup_timeline.time_kv_pool,
        "the start-up timeline's KV pool phase: the target's pools and the speculative worker's share",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.init_all_cuda_graphs",
        "AROUND",
        startup_timeline.time_graphs,
        "the start-up timeline's graph phases: it calls the target worker's init_cuda_graphs, then the "
        "speculative worker's (PILLAR's draft, plain and mixed graphs), each timed apart",
    ),
    Hook(
        "sglang_sparsespec.patches.sampler_warmup.build_sampling_kernels",
        "AROUND",
        startup_timeline.time_kernels,
        "the start-up timeline's kernels phase: the plugin's FlashInfer sampling-kernel build "
        "(the PILLAR worker imports it by name)",
    ),
    Hook(
        "sglang_sparsespec.patches.slot_warmup.build_slot_kernels",
        "AROUND",
        startup_timeline.time_kernels,
        "the start-up timeline's kernels phase: the plugin's KV slot-kernel build (the PILLAR worker "
        "imports it by name)",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.init_startup_timing_summary",
        "AFTER",
        startup_timeline.report_phases,
        "the scheduler's phases ride to the HTTP process in SGLang's own startup_time report",
    ),
    Hook(
        "sglang.srt.observability.startup_time.aggregate_scheduler_startup_times",
        "AROUND",
        startup_timeline.carry_phases,
        "SGLang merges the ranks' startup_time reports keeping only its own keys; the plugin's phases "
        "are merged beside them (the engine and the DP controller import it by name)",
    ),
    Hook(
        "sglang.srt.entrypoints.warmup.execute_warmups",
        "AROUND",
        startup_timeline.time_custom_warmups,
        "the start-up timeline's warm-up phase: the custom --warmups, PILLAR's among them "
        "(http_server imports it by name)",
    ),
    Hook(
        "sglang.srt.entrypoints.http_server._wait_and_warmup",
        "AROUND",
        startup_timeline.log_when_ready,
        "SGLang's warm-up request ends the start: its time is warm-up, and the timeline is logged "
        "once the server is ready",
    ),
)
