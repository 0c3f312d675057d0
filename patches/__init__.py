"""Every place where sglang-sparsespec touches SGLang 0.5.17 internals.

``HOOKS`` is the single list of SGLang symbols we hook, each with the reason; ``apply()``
registers them with SGLang's ``HookRegistry`` and registers the PILLAR algorithm through
``SpeculativeAlgorithm.register``. Besides the hooked symbols, these modules use SGLang code
directly: ``worker`` (BaseSpecWorker, EAGLE's verify helpers, and for plain-decoding rounds a second
DecodeCudaGraphRunner built under a spec-config override and EAGLEWorkerV2's one-token verify input; on
the decode path, ModelRunner.sampler (Sampler.forward's signature) on the step's logits wrapped in
LogitsProcessorOutput, a GenerationBatchResult built as run_eagle_verify builds it, and ScheduleBatch /
SamplingBatchInfo fields that say which batches the sampler alone serves), ``draft_runner`` (ForwardBatch,
forward context, graph capture mode, the capture-time gc freeze), ``draft_attention`` (a TritonAttnBackend subclass for the
draft steps; for the plain step its decode_attention_fwd, get_num_kv_splits and max_kv_splits, and
create_flashinfer_kv_indices_triton's signature, to attend as SGLang's decode does), ``verify_sample`` (eagle_sample's logit processing and verify coins, the
server's sampling backend), ``spec_algo`` (ModelConfig, to refuse unsupported attention at launch),
``triton_verify`` (extend_attention_fwd's signature; HybridAttnBackend's own routing, to find the
Triton backend that serves TARGET_VERIFY under --attention-backend flashinfer), ``request_guard``
(SamplingParams' and the tokenized request's msgspec schema and SGLang's IPC codec, to check a
request before dispatch), ``sampler_warmup`` (the sampler's FlashInfer entry points, built at start
instead of on the first sampled request), ``slot_warmup`` (write_req_to_token_pool_triton's signature as
write_cache_indices calls it: both alignment variants built at start), ``serve_warmup`` (SGLang's custom-warmup registry,
``sglang.srt.entrypoints.warmup.warmup``, and GenerateReqInput: real warm-up batches before the
server listens; ``spec_algo`` names it in ``ServerArgs.warmups``), ``tp_agree`` (the TP group's CPU group and rank_in_group, to broadcast rank
0's round shape and let rank 0 alone write the cost file), ``mixed_runner`` (as ``draft_runner``: ForwardBatch,
forward context, graph capture mode and gc freeze; create_flashinfer_kv_indices_triton for the verify
segments' prefix slots, sgl_kernel's renorm kernels for their target distribution, and SamplingBatchInfo
fields that say which batches a mixed iteration serves), ``offload_kv`` / ``offload_hooks`` (the MHA host pool and the model runner's KV
allocator). Nothing outside this package imports SGLang internals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import (
    alloc_reserve,
    cuda_graph,
    kv_cache_builder,
    metrics,
    offload_hooks,
    request_guard,
    reserved_tokens,
    serve_warmup,
    server_args_flags,
    server_info,
    spec_alloc,
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
        "sglang.srt.speculative.eagle_utils.eagle_sample",
        "AROUND",
        verify_sample.pillar_eagle_sample,
        "PILLAR drafts record their proposal on C candidates, not as full-vocabulary rows; its sampled "
        "verify accepts against that record (run_eagle_verify imports eagle_sample by name)",
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
