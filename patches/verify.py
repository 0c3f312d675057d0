"""The verify of a round: the target model's TARGET_VERIFY forward of each request's chain, then the
bookkeeping of what ``PillarVerifyInput.accept`` kept. A round calls ``forward``, marks its clock,
calls ``accept`` on its verify input and hands the acceptance to ``result``.

This is SGLang's topk=1 EAGLE verify (``run_eagle_verify``) for the models PILLAR serves (one CUDA
device, MHA with page size 1: ``spec_algo`` refuses MLA, hybrid linear / state-space, sliding-window
and mrope models, whose extra verify state SGLang's verify also updates), on an explicit
``VerifyPass``: the target's own backend and verify graphs, or a plain round's width-1 ones.

* ``forward``: the chain's KV slots (``out_cache_loc``: the pool slots at seq_len .. seq_len + k of
  each request, written by the forward) and the ForwardBatch, planned on the plan stream with the
  pass's CUDA graph loaded when one fits; the forward itself; the grammar's vocabulary mask;
* ``result``: the new lengths (seq_len + accepted drafts + 1), each request's last emitted token
  (the next round's pending token), logprobs when asked, and SGLang's batch result (tokens in the
  verify's slot layout, accept lengths, the forward batch kept alive for the overlap scheduler).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_uniform
from sglang.kernels.ops.speculative.eagle import fill_bonus_tokens
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context
from sglang.srt.speculative.spec_utils import (
    GrammarTree,
    build_grammar_vocab_mask,
    record_stream_each,
    record_stream_for_v2_verify,
)
from sglang.srt.utils.async_probe import maybe_detect_inf, maybe_detect_nan, maybe_detect_oob

from .contacts import compute_spec_logprobs
from .triton_verify import verify_qk_scope
from .verify_input import PillarVerifyInput


@dataclass
class Pools:
    """What a verify reads besides the batch: the target worker, its request-to-slot pool and plan stream."""

    target_worker: Any
    req_to_token_pool: Any
    plan_stream: Any
    plan_stream_ctx: Any


@dataclass
class VerifyPass:
    """The attention backend and TARGET_VERIFY graph runner (None: eager only) a verify runs on.
    ``own``: they are the target model runner's own, and the forward runs through the target worker
    as SGLang's verify does; otherwise under this backend, its graphs replayed directly."""

    attn_backend: Any
    graph_runner: Any
    own: bool


@dataclass
class VerifyForward:
    """A verify forward's output: ``forward_batch`` (kept alive until the scheduler is done with the
    round), its ``logits_output``, ``graphed`` (a CUDA graph ran) and the ``grammar_mask`` (None
    without grammars) ``accept`` applies."""

    forward_batch: Any
    logits_output: Any
    graphed: bool
    grammar_mask: Any
    routed_experts_output: Any = None
    indexer_topk_output: Any = None


def forward(batch, pools: Pools, vpass: VerifyPass, grammar_barrier=None) -> VerifyForward:
    """The TARGET_VERIFY forward of ``batch.spec_info`` (a ``PillarVerifyInput``) on ``vpass``."""
    verify_input: PillarVerifyInput = batch.spec_info
    device = batch.seq_lens.device
    fwd_stream = torch.get_device_module(device).current_stream()
    record_stream_for_v2_verify(batch, verify_input, fwd_stream)
    with pools.plan_stream_ctx:
        fb, graphed = _prepare(batch, verify_input, pools, vpass)
    # The verify's rebinds (draft tokens, slots allocated on the plan stream) are read on this stream.
    record_stream_each((batch.input_ids, batch.out_cache_loc), fwd_stream)
    if pools.plan_stream:
        fwd_stream.wait_stream(pools.plan_stream)
        # Buffers filled from the drafts (mask, positions) were planned before the drafts existed.
        graph_bs = vpass.graph_runner.bs if graphed else None
        vpass.attn_backend.update_verify_buffers_to_fill_after_draft(verify_input, graph_bs)
    grammar_tree = None
    if batch.has_grammar:  # read before the forward launches, as SGLang's verify does
        grammar_tree = GrammarTree.from_device(
            verify_input.retrieve_next_token,
            verify_input.retrieve_next_sibling,
            verify_input.draft_token.view(verify_input.retrieve_next_token.shape),
        )
    out = _run(fb, pools.target_worker, vpass, graphed)
    grammar_mask = None
    if batch.has_grammar:
        grammar_mask = build_grammar_vocab_mask(
            reqs=batch.reqs,
            tree=grammar_tree,
            sampling_info=batch.sampling_info,
            device=verify_input.retrieve_next_token.device,
            barrier=grammar_barrier,
        )
    maybe_detect_nan(out.logits_output.next_token_logits, "verify: target model logits")
    maybe_detect_inf(out.logits_output.next_token_logits, "verify: target model logits")
    return VerifyForward(
        fb, out.logits_output, graphed, grammar_mask, out.routed_experts_output, out.indexer_topk_output
    )


def _prepare(batch, verify_input: PillarVerifyInput, pools: Pools, vpass: VerifyPass):
    """The chain's KV slots and the verify's ForwardBatch, with ``vpass``'s graph loaded when it fits."""
    if not batch.forward_mode.is_idle():
        bs = batch.req_pool_indices.shape[0]
        width = verify_input.draft_token_num
        batch.input_ids = verify_input.draft_token
        maybe_detect_oob(batch.input_ids, 0, batch.model_config.vocab_size, "v2 prepare_for_verify input_ids")
        req_to_token = pools.req_to_token_pool.req_to_token
        batch.out_cache_loc = torch.empty(bs * width, dtype=torch.int64, device=batch.seq_lens.device)
        assign_extend_cache_locs_uniform[(bs,)](
            batch.req_pool_indices, req_to_token, batch.seq_lens, batch.out_cache_loc, req_to_token.shape[1], width
        )
        # Split batches (two-batch overlap) read these; without a host copy of seq_lens both stay None.
        verify_input.seq_lens_cpu = batch.seq_lens_cpu
        verify_input.seq_lens_sum = int(batch.seq_lens_cpu.sum()) if batch.seq_lens_cpu is not None else None
    batch.forward_mode = ForwardMode.IDLE if batch.forward_mode.is_idle() else ForwardMode.TARGET_VERIFY
    mr = pools.target_worker.model_runner
    fb = ForwardBatch.init_new(
        batch, mr, capture_hidden_mode=CaptureHiddenMode.FULL, return_hidden_states_before_norm=False
    )
    runner = vpass.graph_runner
    graphed = bool(runner and runner.can_run_graph(fb))
    if graphed:
        runner.load_batch(fb)
        fb.mark_forward_metadata_ready()
    return fb, graphed


def _run(fb, target_worker, vpass: VerifyPass, graphed: bool):
    """The forward; a GenerationBatchResult-like output with logits_output and the capture outputs. An eager
    forward leaves the model's q/k norm and rotary to the verify prologue where the pass's hooks ask for it."""
    with verify_qk_scope(vpass.attn_backend, fb.forward_mode):
        return _run_in_scope(fb, target_worker, vpass, graphed)


def _run_in_scope(fb, target_worker, vpass: VerifyPass, graphed: bool):
    if vpass.own:  # SGLang's own path: the model runner replays its verify graph or plans eagerly
        return target_worker.forward_batch_generation(batch=None, forward_batch=fb, is_verify=True)
    with forward_context(ForwardContext(attn_backend=vpass.attn_backend)):
        if graphed:
            return GenerationBatchResult(logits_output=vpass.graph_runner.execute(fb), can_run_cuda_graph=True)
        # Eager: the model runner would plan on its own backend; this pass's is planned here instead.
        if not fb.forward_mode.is_idle():
            vpass.attn_backend.init_forward_metadata(fb)
            fb.mark_forward_metadata_ready()
        return target_worker.forward_batch_generation(batch=None, forward_batch=fb, is_verify=True)


def result(
    batch,
    fwd: VerifyForward,
    predict: torch.Tensor,
    accept_lens: torch.Tensor,
    accept_index: torch.Tensor,
    num_steps: int,
) -> tuple[GenerationBatchResult, torch.Tensor]:
    """SGLang's batch result of an accepted verify, and each request's next pending token [bs] int32."""
    verify_input: PillarVerifyInput = batch.spec_info
    device = batch.seq_lens.device
    if batch.forward_mode.is_idle():
        bonus = torch.empty((0,), dtype=torch.int32, device=device)
    else:
        accept_tokens = predict[accept_index]
        bonus = torch.empty_like(accept_lens, dtype=torch.int32)
        bs, stride = accept_index.shape
        fill_bonus_tokens[(bs,)](accept_tokens, accept_lens, bonus, stride)
        if batch.return_logprob:
            compute_spec_logprobs(batch, fwd.logits_output, predict, accept_index, num_steps)
    result = GenerationBatchResult(
        logits_output=fwd.logits_output,
        next_token_ids=predict,
        can_run_cuda_graph=fwd.graphed,
        speculative_num_draft_tokens=verify_input.draft_token_num,
        accept_lens=accept_lens,
        new_seq_lens=batch.seq_lens + accept_lens,
        routed_experts_output=fwd.routed_experts_output,
        indexer_topk_output=fwd.indexer_topk_output,
        # Verify-time tensors (draft tokens, slots) the scheduler's next batch rebinds must outlive it.
        extra_keep_alive_refs=[fwd.forward_batch],
    )
    return result, bonus
