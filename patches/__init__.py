"""Every place where sglang-sparsespec touches SGLang internals (releases 0.5.17 through 0.5.23).

``HOOKS`` lists every SGLang symbol we hook, each with the reason and the releases it was checked against, one list per
feature (``PILLAR_HOOKS`` here, ``hooks_boundary``, ``hooks_startup``, ``hooks_offload``); ``apply()`` registers those
of the installed release with SGLang's ``HookRegistry`` and registers the PILLAR algorithm through
``SpeculativeAlgorithm.register``. Where SGLang changed between the releases, ``contacts`` holds one adapter per changed
contact; ``signatures`` compares the installed SGLang with what was surveyed per release, at launch (docs/versions.md).

Besides the hooked symbols, these modules use SGLang code directly: ``worker`` (BaseSpecWorker, the model runner's KV
cache dtype, the plan stream, the decode graph batch sizes, and for plain rounds a second DecodeCudaGraphRunner built
under a spec-config override), ``rounds`` (EAGLE's chain verify input builder; on the decode path, ModelRunner.sampler
(Sampler.forward's signature) on the step's logits wrapped in LogitsProcessorOutput, a GenerationBatchResult as SGLang's
verify builds it; a prefill batch's input_ids, which rank the draft vocabulary, and its Reqs' req_pool_idx,
origin_input_ids and output_ids, which the match heads' token ids are written from), ``verify`` (SGLang's verify steps
for a topk=1 chain: the slot kernel, ForwardBatch, the graph runner's can_run_graph / load_batch / execute, the forward
context, the target worker's verify forward, grammar masks, the bonus-token kernel, spec logprobs,
GenerationBatchResult), ``verify_input`` (EagleVerifyInput, extended, with its acceptance: eagle_sample's logit
processing, its verify coins and, for plain greedy batches, eagle_sample itself; the server's sampling backend; the
Sampler's apply_custom_logit_processor), ``request_rounds`` (Req's sampling parameters, output ids, retraction count and
processor, which say which requests take one token per round, and ScheduleBatch / SamplingBatchInfo fields that say
which batches the sampler alone serves), ``finish_check`` (Req's stop-token sets, vocabulary size and output ids, and
the runtime context's server args, around the hooked update_finish_state), ``decode_graphs`` (ForwardBatch, forward
context, graph_capture(), graph capture mode and the capture-time gc freeze, for both runners' DECODE forwards and
graphs), ``draft_runner`` (murmur_hash32 for seeded draft noise), ``draft_logits`` (the logits processor's vocab_size
and final_logit_softcapping, LogitsMetadata's forward_mode), ``draft_lm_head`` (the LM head's weight, quant_method and
LoRA hooks, the logits processor's fp32 and RL on-policy flags and caller-owned output), ``draft_mlp`` (the MLP's
gate_up_proj weight, down_proj and act_fn, a release's DualGemm.can_run), ``plain_layers`` (the RMSNorm fields and the
linear layers' quant_method and bias that say a fused kernel computes the layer's call), ``draft_qk`` (the rotary
embedding's cos_sin_cache, head and rotary dims, neox style and fallback flag; Qwen3's apply_qk_norm; the decoder class
names whose attention calls them right before attending), ``draft_attention`` (a TritonAttnBackend subclass for the
draft steps; for the plain step its decode_attention_fwd, get_num_kv_splits and max_kv_splits, and
create_flashinfer_kv_indices_triton's signature, to attend as SGLang's decode does; MHATokenToKVPool's store and its
quantization, store dtype and HND layout, to write a draft step's K/V inside the sparse kernel only where SGLang's store
is a plain row write), ``spec_algo`` (ModelConfig, to refuse unsupported attention, mrope, models that are not
decoder-only generators and dense or match heads the model lacks at launch), ``triton_verify`` (extend_attention_fwd's
signature; HybridAttnBackend's own routing, to find the Triton backend that serves TARGET_VERIFY under
--attention-backend flashinfer; forward_extend's save_kv_cache and the backend's dcp_size, _translate_kv_loc and KV
pool, to store the chain's K/V as SGLang would), ``cuda_graph`` (the decode graph runner's capture_forward_mode and
attn_backend), ``request_guard`` (SamplingParams' and the tokenized request's msgspec schema and SGLang's IPC codec, to
check a request before dispatch), ``probe_capture`` (the model's RadixAttention modules: their forward's q and k, layer
id, head counts, head dim, scaling and logit cap, read by a forward pre-hook during the warm-up's probe prefills for
``N@auto`` match heads), ``sampler_warmup`` (the sampler's FlashInfer entry points, built at start instead of on the
first sampled request; FlashInfer's own JIT spec, not an SGLang symbol, compiled on a thread beside the captures),
``slot_warmup`` (write_req_to_token_pool_triton's signature as write_cache_indices calls it: both alignment variants
built at start), ``serve_warmup`` (SGLang's custom-warmup registry, ``sglang.srt.entrypoints.warmup.warmup``, and
GenerateReqInput: real warm-up batches before the server listens; ``spec_algo`` names it in ``ServerArgs.warmups``),
``tp_agree`` (the TP group's CPU group and rank_in_group, to broadcast rank 0's round shape and let rank 0 alone write
the cost file), ``openai_guard`` (FastAPI's body fields of the HTTP app's routes, whose validation it wraps),
``mixed_runner`` (create_flashinfer_kv_indices_triton for the verify segments' prefix slots, and SamplingBatchInfo
fields that say which batches a mixed iteration serves), ``offload_kv`` / ``offload_hooks`` (the MHA host pool and the
model runner's KV allocator; the load snapshot's msgspec struct), ``live_rids`` (the scheduler's request queues and
batches, from 0.5.22 its _collect_inflight_batches, in 0.5.21 the runtime context's pipeline size, its Rust server,
AbortReq and FINISH_ABORT, to find live rids and answer a refused one), ``ollama_guard`` (FastAPI's HTTPException and
StreamingResponse around the Ollama handlers). Nothing outside this package imports SGLang internals.
"""

from __future__ import annotations

import logging

from sglang_sparsespec.config import ALGORITHM_NAME

from . import (
    alloc_reserve,
    client_parity,
    cuda_graph,
    draft_lm_head,
    draft_logits,
    draft_mlp,
    draft_qk,
    finish_check,
    kv_cache_builder,
    metrics,
    reserved_tokens,
    serve_warmup,
    server_args_flags,
    server_info,
    spec_alloc,
    triton_verify,
)
from .hook import Hook
from .hooks_boundary import BOUNDARY_HOOKS
from .hooks_offload import OFFLOAD_HOOKS
from .hooks_startup import STARTUP_HOOKS
from .spec_algo import PillarSpecAlgo, validate_server_args
from .versions import out_of_range, releases

logger = logging.getLogger(__name__)

# Speculation itself: PILLAR's worker, rounds, verify and what clients see of them.
PILLAR_HOOKS: tuple[Hook, ...] = (
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
        "scheduler start-up dereferences draft_worker.draft_worker.draft_runner; PILLAR has no draft pool "
        "(0.5.18 asks the worker's primary_draft_kv_pool instead, None for PILLAR's absent draft worker)",
        versions=("0.5.17",),
    ),
    Hook(
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.get_spec_info",
        "AROUND",
        cuda_graph.graph_runner_spec_info,
        "TARGET_VERIFY graph capture gets no spec metadata for plugin algorithms; give it EAGLE's topk=1 dummy",
    ),
    Hook(
        "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.capture",
        "AROUND",
        cuda_graph.verify_capture_scope,
        "a TARGET_VERIFY graph records the verify prologue's one launch in place of the model's q/k norm and "
        "rotary kernels only if the model's forwards are captured with those calls left to it (capture_forward_mode "
        "and attn_backend say which graph and backend)",
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
        "(eagle_prepare_for_decode imports it by name); 0.5.19 lists the lengths itself",
        versions=releases(last="0.5.18"),
    ),
    Hook(
        "sglang.srt.layers.attention.triton_backend.TritonAttnBackend.forward_extend",
        "AROUND",
        triton_verify.pillar_verify,
        "PILLAR's verify runs the split-KV verify kernel (SGLang's extend kernel is far below bandwidth), "
        "and PillarAttn selection reads its attention probabilities (logits + LSE); SGLang's graph runner "
        "captures the TARGET_VERIFY graphs these kernels run in at start-up, before any PILLAR round. The "
        "kernel is reached through the backend's extend_attention_fwd attribute, which attach_verify routes "
        "once at start-up (forward_extend makes that inner call)",
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
        "sglang.srt.managers.scheduler_components.batch_result_processor"
        ".SchedulerBatchResultProcessor._resolve_spec_v2_tokens",
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
        "sglang.srt.layers.logits_processor.LogitsProcessor._copy_logits_to_buffer",
        "AROUND",
        draft_logits.keep_draft_logits,
        "a draft step's logits feed only PILLAR's draft sampler, and a sampled verify's (--pillar-verify-logits "
        "half) its acceptance, which read bf16 as exactly as their fp32 copy: those forwards skip the copy (every "
        "other forward keeps it)",
    ),
    Hook(
        "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.forward_cuda",
        "AROUND",
        draft_qk.defer_draft_rope,
        "a draft step's sparse attention kernel rotates q and the new key as it loads them, a verify's prologue "
        "launch the chain's q and k (one launch less per layer); only inside the draft runner's draft steps and "
        "verify_qk_scope's verifies, every other call runs SGLang's kernel",
    ),
    Hook(
        "sglang.srt.models.qwen3.apply_qk_norm",
        "AROUND",
        draft_qk.defer_draft_qk_norm,
        "a Qwen3 draft step's sparse attention kernel applies the per-head q/k norm as it loads q and the new key, "
        "a verify's prologue launch to the chain's (one launch less per layer); only inside the draft runner's "
        "draft steps and verify_qk_scope's verifies, every other call runs SGLang's",
    ),
    Hook(
        "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head",
        "AROUND",
        draft_lm_head.draft_lm_head,
        "with --pillar-draft-vocab N a draft step's LM head scores only the N ids the server commits most, with "
        "--pillar-draft-lm-head fp8 it reads an fp8 copy of its weight (half the bytes); only inside the draft "
        "runner's draft steps, every other forward runs SGLang's GEMM",
    ),
    Hook(
        "sglang.srt.models.qwen2.Qwen2MLP.forward",
        "AROUND",
        draft_mlp.fuse_qwen2_mlp,
        "with --pillar-draft-mlp fused a draft step's Qwen2 / Qwen3 MLP runs gate/up with SiLU-and-mul in the GEMM's "
        "epilogue (one launch less per layer); only inside the draft runner's draft steps, every other call runs "
        "SGLang's",
    ),
    Hook(
        "sglang.srt.models.llama.LlamaMLP.forward",
        "AROUND",
        draft_mlp.fuse_llama_mlp,
        "as Qwen2MLP.forward's, for Llama and Mistral draft steps",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.init_metrics_reporter",
        "AFTER",
        metrics.attach_prometheus,
        "with --enable-metrics PILLAR's draft/accept counters, path counts and round times go to "
        "SGLang's Prometheus endpoint with the scheduler collector's labels (the worker exists by then)",
    ),
)

# Every hook, one list per feature. Hooks on one symbol wrap in this order (the first innermost): the
# offload pool's Scheduler.abort_request hook sees the request ids the boundary's has restored.
HOOKS: tuple[Hook, ...] = (*PILLAR_HOOKS, *BOUNDARY_HOOKS, *STARTUP_HOOKS, *OFFLOAD_HOOKS)

_applied = False


def _factory(server_args):
    from .worker import PillarWorker

    return PillarWorker


def apply() -> None:
    """Register PILLAR and the hooks checked against the installed SGLang release; idempotent within a
    process. On a release outside the supported range no hook is applied (stock SGLang runs untouched)
    and PILLAR stays registered only to refuse the launch with one line naming the range."""
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
    _applied = True
    refusal = out_of_range()
    if refusal is not None:
        logger.warning("%s: no hook applied, --speculative-algorithm %s is refused", refusal, ALGORITHM_NAME)
        return
    for hook in HOOKS:
        if hook.applies():
            HookRegistry.register(hook.target, hook.fn, HookType[hook.kind])
    serve_warmup.register()
