"""Every place where sglang-sparsespec touches SGLang 0.5.17 internals.

``HOOKS`` is the single list of SGLang symbols we hook, each with the reason; ``apply()``
registers them with SGLang's ``HookRegistry`` and registers the PILLAR algorithm through
``SpeculativeAlgorithm.register``. Besides the hooked symbols, these modules use SGLang code
directly: ``worker`` (BaseSpecWorker, the plan stream, the decode graph batch sizes, and for plain rounds a
second DecodeCudaGraphRunner built under a spec-config override), ``rounds`` (EAGLE's chain verify helpers
and EAGLEWorkerV2's one-token verify input; on the decode path, ModelRunner.sampler (Sampler.forward's
signature) on the step's logits wrapped in LogitsProcessorOutput, a GenerationBatchResult built as
run_eagle_verify builds it), ``verify_input`` (EagleVerifyInput, extended), ``request_rounds`` (Req's
sampling parameters, output ids, retraction count and processor, which say which requests take one token per
round, and ScheduleBatch / SamplingBatchInfo fields that say which batches the sampler alone serves),
``finish_check`` (Req's stop-token sets, vocabulary size and output ids, and the runtime context's server
args, around the hooked update_finish_state), ``decode_graphs`` (ForwardBatch, forward context, graph capture mode and the
capture-time gc freeze, for both runners' DECODE forwards and graphs), ``draft_runner`` (murmur_hash32 for seeded draft noise), ``draft_attention`` (a TritonAttnBackend subclass for the
draft steps; for the plain step its decode_attention_fwd, get_num_kv_splits and max_kv_splits, and
create_flashinfer_kv_indices_triton's signature, to attend as SGLang's decode does), ``verify_sample`` (eagle_sample's logit processing and verify coins, the
server's sampling backend, the Sampler's apply_custom_logit_processor), ``spec_algo`` (ModelConfig, to refuse unsupported attention and mrope at launch),
``triton_verify`` (extend_attention_fwd's signature; HybridAttnBackend's own routing, to find the
Triton backend that serves TARGET_VERIFY under --attention-backend flashinfer), ``request_guard``
(SamplingParams' and the tokenized request's msgspec schema and SGLang's IPC codec, to check a
request before dispatch), ``sampler_warmup`` (the sampler's FlashInfer entry points, built at start
instead of on the first sampled request), ``slot_warmup`` (write_req_to_token_pool_triton's signature as
write_cache_indices calls it: both alignment variants built at start), ``serve_warmup`` (SGLang's custom-warmup registry,
``sglang.srt.entrypoints.warmup.warmup``, and GenerateReqInput: real warm-up batches before the
server listens; ``spec_algo`` names it in ``ServerArgs.warmups``), ``tp_agree`` (the TP group's CPU group and rank_in_group, to broadcast rank
0's round shape and let rank 0 alone write the cost file), ``openai_guard`` (FastAPI's body fields of the HTTP app's routes, whose validation it wraps), ``mixed_runner``
(create_flashinfer_kv_indices_triton for the verify segments' prefix slots, and SamplingBatchInfo fields
that say which batches a mixed iteration serves), ``offload_kv`` / ``offload_hooks`` (the MHA host pool and the model runner's KV
allocator). Nothing outside this package imports SGLang internals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import (
    alloc_reserve,
    client_parity,
    cuda_graph,
    finish_check,
    kv_cache_builder,
    metrics,
    offload_hooks,
    openai_guard,
    request_guard,
    reserved_tokens,
    serve_warmup,
    server_args_flags,
    server_info,
    spec_alloc,
    startup_timeline,
    triton_verify,
    verify_sample,
)
from .spec_algo import ALGORITHM_NAME, PillarSpecAlgo, validate_server_args


@dataclass(frozen=True)
class Hook:
    target: str  # dotted path of the SGLang symbol
    kind: str  # HookType member name
    fn: Callable
    why: str


HOOKS: tuple[Hook, ...] = (
    Hook(
        "sglang.srt.server_args.ServerArgs.add_cli_args",
        "AFTER",
        server_args_flags.add_pillar_flags,
        "PILLAR's knobs appear as --pillar-* launch flags in SGLang's own parser and --help",
    ),
    Hook(
        "sglang.srt.server_args.ServerArgs.from_cli_args",
        "AROUND",
        server_args_flags.export_pillar_flags,
        "the --pillar-* values must be in the environment before ServerArgs validates them and "
        "before the scheduler processes (which inherit it) start",
    ),
    Hook(
        "sglang.srt.mem_cache.kv_cache_builder.get_draft_kv_pool",
        "AROUND",
        kv_cache_builder.no_draft_pool_for_pillar,
        "scheduler start-up dereferences draft_worker.draft_worker.draft_runner; PILLAR has no draft pool",
    ),
    Hook(
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info",
        "AROUND",
        cuda_graph.graph_runner_spec_info,
        "TARGET_VERIFY graph capture gets no spec metadata for plugin algorithms; give it EAGLE's topk=1 dummy",
    ),
    Hook(
        "sglang.srt.speculative.spec_info.create_dummy_verify_input",
        "AROUND",
        cuda_graph.warmup_dummy_verify_input,
        "runner warm-up builds the same dummy verify input (base_runner imports it by name)",
    ),
    Hook(
        "sglang.srt.managers.utils.compute_num_reserved_tokens",
        "AROUND",
        reserved_tokens.reserve_verify_window,
        "requests near the context limit need room for the k+1 verify slots, as EAGLE gets",
    ),
    Hook(
        "sglang.srt.mem_cache.allocation_sizing.get_alloc_reserve_per_decode",
        "AROUND",
        alloc_reserve.reserve_for_chains,
        "a mixed-phase chain drafts on after its verify in the same iteration, k + 1 slots further "
        "than spec v2's 2 (k + 1) reserve covers (schedule_batch and eagle_utils import it by name)",
    ),
    Hook(
        "sglang.srt.speculative.eagle_utils.alloc_for_spec_decode",
        "AROUND",
        spec_alloc.listed_next_lens,
        "every speculative decode round reserves KV through it, and its closing loop indexes a CPU "
        "tensor once per request (a select and an item each: ~1 ms of host time per round at 256 "
        "requests); with one-token pages a list of the same lengths serves it "
        "(eagle_prepare_for_decode imports it by name)",
    ),
    Hook(
        "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_extend",
        "AROUND",
        triton_verify.pillar_verify,
        "PILLAR's verify runs the split-KV verify kernel (SGLang's extend kernel is far below bandwidth), "
        "and PillarAttn selection reads its attention probabilities (logits + LSE)",
    ),
    Hook(
        "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments",
        "AROUND",
        request_guard.guard_normalize,
        "SGLang expands a request n times before checking anything: n must be an int in [1, 128] "
        "first (a string or float n is a 500, a huge one blocks the HTTP process)",
    ),
    Hook(
        "sglang.srt.managers.io_struct.GenerateReqInput.__getitem__",
        "AFTER",
        request_guard.stamp_prompt_index,
        "a batch member remembers its position, so that a 400 names the bad prompt of a batch",
    ),
    Hook(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        "AROUND",
        request_guard.validate_request,
        "what reaches the scheduler must be servable: out-of-vocabulary ids (SGLang never calls its own "
        "check), empty prompts, sampling values of the wrong type or outside what the scheduler's "
        "tensors hold would kill the scheduler; checked here they are a 400",
    ),
    Hook(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object",
        "AROUND",
        request_guard.check_tokenized,
        "the message the scheduler will decode must fit SGLang's own schema (a list extra_key or "
        "custom_logit_processor passes every earlier check); SamplingParams.verify's 400s for one "
        "prompt of a batch name that prompt",
    ),
    Hook(
        "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase._compute_extra_key",
        "AROUND",
        request_guard.extra_key_type_is_a_400,
        "a non-string cache_salt / extra_key in an OpenAI request raises TypeError there, a 500",
    ),
    Hook(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request",
        "AROUND",
        request_guard.reserved_rid,
        "a client rid with the warm-up prefix would turn its batch into warm-up rounds (unmeasured, "
        "uncounted); requests over HTTP carry the Request, the start-up warm-up calls it without",
    ),
    Hook(
        "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase.__init__",
        "AFTER",
        openai_guard.guard_http_app,
        "ChatCompletionRequest's mode='before' validators call .get on the raw body and response_format "
        "(AttributeError, a 500, for [1, 2] or a string); the HTTP app's lifespan builds the OpenAI "
        "handlers before it serves, the moment to wrap its routes' body validation",
    ),
    Hook(
        "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._handle_last_assistant_message",
        "AFTER",
        openai_guard.continue_needs_a_message,
        "continue_final_message on a lone assistant message leaves the chat template no conversation "
        "(IndexError in transformers, a 500)",
    ),
    Hook(
        "sglang.srt.managers.scheduler_components.output_streamer._GenerationStreamAccumulator.accept",
        "AROUND",
        client_parity.accept_like_plain_decoding,
        "a request's output chunk is built there for one token per step: a round of several tokens "
        "jumps over the stream-interval points (length 1 mod N) and counts reasoning tokens past the "
        "finish trim; PILLAR's per-request proposed drafts travel in the chunk",
    ),
    Hook(
        "sglang.srt.managers.scheduler_components.batch_result_processor.SchedulerBatchResultProcessor._resolve_spec_v2_tokens",
        "AFTER",
        client_parity.count_proposed_drafts,
        "the per-request rounds are credited there; under adaptive speculation each round's own draft "
        "count (0-k) is what the request was proposed",
    ),
    Hook(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._calculate_spec_decoding_metrics",
        "AFTER",
        client_parity.proposed_drafts_in_meta_info,
        "meta_info's spec_accept_rate assumes speculative_num_draft_tokens - 1 drafts per round",
    ),
    Hook(
        "sglang.srt.speculative.eagle_utils.eagle_sample",
        "AROUND",
        verify_sample.pillar_eagle_sample,
        "PILLAR drafts record their proposal on C candidates, not as full-vocabulary rows; its sampled "
        "verify accepts against that record (run_eagle_verify imports eagle_sample by name)",
    ),
    Hook(
        "sglang.srt.managers.schedule_batch.Req.update_finish_state",
        "AROUND",
        finish_check.stop_before_length,
        "a round's accepted run is checked whole, length first: a run crossing max_new_tokens after a "
        "stop token finished with 'length' and kept the tokens after the stop; stock decoding stops at "
        "the first token that finishes, which the run's check now does piece by piece",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.get_internal_state",
        "AFTER",
        server_info.add_pillar_state,
        "/server_info shows which draft count each round ran (adaptive speculation) and the "
        "acceptance estimate, which only the PILLAR worker knows",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.init_metrics_reporter",
        "AFTER",
        metrics.attach_prometheus,
        "with --enable-metrics PILLAR's draft/accept counters, path counts and round times go to "
        "SGLang's Prometheus endpoint with the scheduler collector's labels (the worker exists by then)",
    ),
    # The start-up timeline (patches/startup_timeline.py): one log line of where a server's start went.
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
    # The offload-aware KV pool (patches/offload.py, docs/offload.md): every hook below is a no-op
    # unless --pillar-offload-host-gb > 0.
    Hook(
        "sglang.srt.server_args.ServerArgs.__post_init__",
        "AFTER",
        offload_hooks.validate_offload_flag,
        "offload combined with an algorithm, page size or cache mode it does not serve fails at launch",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.init_memory_pools",
        "AFTER",
        offload_hooks.create_offloader,
        "the pinned host pool and copy stream are built once the device KV pool exists",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.update_running_batch",
        "AROUND",
        offload_hooks.park_before_retract,
        "when the next decode round does not fit, park requests on host before SGLang retracts (recomputes)",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.get_next_batch_to_run",
        "AROUND",
        offload_hooks.restore_before_scheduling,
        "free slots of finished copies, end aborted parked requests and restore parked ones before "
        "the step is planned (after the previous step's result was processed)",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler._get_new_batch_prefill_raw",
        "AROUND",
        offload_hooks.hold_admission_while_parked,
        "new prefills would take the memory parked requests wait for",
    ),
    Hook(
        "sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req",
        "AROUND",
        offload_hooks.admit_against_host,
        "admission counts free host tokens for decode growth: SGLang admits ignore_eos requests "
        "(radix off) only when their exact demand fits the GPU, so it queues instead of over-admitting "
        "and nothing is ever parked (H100, 64 x 7000 tokens at demand / 1.5: 43 ran, 21 waited)",
    ),
    Hook(
        "sglang.srt.mem_cache.common.release_kv_cache",
        "AROUND",
        offload_hooks.release_parked_kv,
        "a parked request that finishes (its in-flight step's result) or is aborted has its private KV "
        "on host, not in its req_to_token row",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.abort_request",
        "AFTER",
        offload_hooks.mark_parked_aborts,
        "parked requests are in neither the waiting queue nor the running batch that abort searches",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.is_fully_idle",
        "AFTER",
        offload_hooks.parked_requests_are_work,
        "parked requests are in neither the running batch nor the waiting queue: without this the "
        "scheduler counts as idle, flush_cache clears the pools under them and the leak check fires",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.pause_generation",
        "AFTER",
        offload_hooks.retract_parked_on_pause,
        "a retract-mode pause (before a weight update) retracts the running batch only; parked "
        "requests are retracted too, so no KV of the old weights survives on host",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.get_internal_state",
        "AFTER",
        offload_hooks.add_offload_state,
        "/server_info shows parks, restores, bytes moved and retraction fallbacks",
    ),
)

_applied = False


def _factory(server_args):
    from .worker import PillarWorker

    return PillarWorker


def apply() -> None:
    """Register PILLAR and its hooks; idempotent within a process."""
    global _applied
    if _applied:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    SpeculativeAlgorithm.register(
        ALGORITHM_NAME,
        supports_overlap=True,
        validate_server_args=validate_server_args,
        spec_class=PillarSpecAlgo,
    )(_factory)
    for hook in HOOKS:
        HookRegistry.register(hook.target, hook.fn, HookType[hook.kind])
    serve_warmup.register()
    _applied = True
