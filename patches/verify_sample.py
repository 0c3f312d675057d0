"""``eagle_sample``: PILLAR's verify acceptance from compact draft records.

SGLang's sampled verify (``chain_speculative_sampling_triton``) needs every draft's full
vocabulary distribution. PILLAR drafts record q on C candidates only (``DraftRecord``), so for a
PILLAR verify input (``PillarVerifyInput``) that is not all greedy, this replaces the sampling half of
``eagle_sample``: the same logit processing as SGLang (NaN guard, penalties, logit bias, grammar
mask), the target distribution stock decoding samples from under the server's sampling backend
and exact rejection sampling (``stock_accept``, shared with the mixed runner: on the GPU
``kernels/target_filter.py`` and ``kernels/verify_accept.py``; ``sampling/target.target_probs`` and
``sampling/rejection.rejection_sample`` are their references). A custom logit processor is applied last, as SGLang's Sampler does, to row 0 of each
request (its requests draft nothing: ``patches/request_rounds.py``); a round with such requests, or
with per-request draft counts, is accepted here for greedy batches too (``greedy_accept``: SGLang's
greedy chain rule with each request's count), since SGLang's greedy verify would accept drafts of a
request that has none. Other all-greedy batches, idle batches and other algorithms run SGLang's code.
"""

from __future__ import annotations

import dataclasses

import torch
from sglang_sparsespec.kernels.target_filter import target_filter_fwd
from sglang_sparsespec.kernels.verify_accept import rejection_fwd

from sglang_sparsespec.rounds.mixed import greedy_accept
from sglang_sparsespec.sampling.rejection import DraftRecord, rejection_sample
from sglang_sparsespec.sampling.target import SamplingBackend, SamplingRows, target_probs

from .verify_input import PillarVerifyInput


def sampling_backend() -> SamplingBackend:
    """The stock sampler this server runs (``--sampling-backend``; deterministic inference forces
    pytorch), read where SGLang's Sampler reads it."""
    from sglang.srt.runtime_context import get_exec

    return SamplingBackend(get_exec().kernel.sampling_backend)


def stock_accept(
    logits: torch.Tensor, rows: SamplingRows, record: DraftRecord, coins: torch.Tensor, final_coins: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact rejection sampling of ``record`` against stock decoding's distribution of each verify
    row (``sampling/target.target_probs``; logits [bs * (k + 1), V], row b * (k + 1) + j under
    request b of ``rows``). The one acceptance of both runners, so a request's distribution never
    depends on its batch-mates. Returns (emitted [bs, k + 1], num_accepted [bs]).

    On the GPU: ``kernels/target_filter.py`` (compact rows, vocabulary-parallel) and the fused
    ``kernels/verify_accept.py``, shape-static and sync-free (the mixed runner captures it in a
    CUDA graph); the zero-width record of a plain-decoding round draws from the dense rows. Elsewhere
    the torch references."""
    bs, k = record.tokens.shape
    if not logits.is_cuda:
        return rejection_sample(target_probs(logits, rows, k + 1).view(bs, k + 1, -1), record, coins, final_coins)
    rank_rule = rows.backend is SamplingBackend.PYTORCH
    target = target_filter_fwd(logits, rows.temperature, rows.top_k, rows.top_p, rows.min_p, k + 1, rank_rule)
    if k == 0:
        return rejection_sample(target.dense().view(bs, 1, -1), record, coins, final_coins)
    r = record
    return rejection_fwd(target, r.tokens, r.cand_ids, r.cand_q, r.q_tok, r.num_drafts, coins, final_coins)


def sampling_rows(sampling_info) -> SamplingRows:
    """A batch's parameters as SGLang lays them out (temperatures [bs, 1]; off filters TOP_K_ALL /
    1.0; greedy requests top_k 1 at temperature 1; min_ps only when a request uses min-p)."""
    min_p = sampling_info.min_ps if sampling_info.need_min_p_sampling else None
    return SamplingRows(
        sampling_info.temperatures.view(-1), sampling_info.top_ps, sampling_info.top_ks, min_p, sampling_backend()
    )


def _process_logits(logits: torch.Tensor, verify_input, sampling_info, grammar_mask) -> None:
    """In place, what eagle_sample does to the verify logits before sampling."""
    from sglang.srt.sampling.penaltylib.repetition_penalty import (
        apply_scaling_penalties,
    )
    from sglang.srt.utils.async_probe import sanitize_nan_logits

    n = verify_input.draft_token_num
    sanitize_nan_logits(logits, "verify: target model logits")
    if sampling_info.acc_additive_penalties is not None:
        logits.add_(torch.repeat_interleave(sampling_info.acc_additive_penalties, n, dim=0))
    if sampling_info.acc_scaling_penalties is not None:
        apply_scaling_penalties(logits, torch.repeat_interleave(sampling_info.acc_scaling_penalties, n, dim=0))
    if sampling_info.logit_bias is not None:
        logits.add_(torch.repeat_interleave(sampling_info.logit_bias, n, dim=0))
    if grammar_mask is not None:
        grammar_mask.apply(logits)
    if sampling_info.has_custom_logit_processor:
        # Stock applies processors after the penalties, bias and grammar mask (ModelRunner.sample, then
        # Sampler._preprocess_logits), once per request: here to row 0, the row of the token such a
        # request takes (it drafts nothing), a view written in place. NaNs a processor leaves are
        # cleaned after it, as in stock.
        from sglang.srt.layers.sampler import apply_custom_logit_processor

        row0 = logits.view(-1, n, logits.shape[-1])[:, 0]
        apply_custom_logit_processor(row0, sampling_info)
        sanitize_nan_logits(logits, "verify: custom logit processor")


def pillar_eagle_sample(original, verify_input, batch, logits_output, grammar_mask=None, *later, **later_kw):
    # later / later_kw: the parameters later releases added (0.5.20 uno_target_max_top_k, 0.5.22 the
    # watermark state, which PILLAR refuses at launch), passed through to stock's own sample.
    if not isinstance(verify_input, PillarVerifyInput):
        return original(verify_input, batch, logits_output, grammar_mask, *later, **later_kw)
    if verify_input.on_logits is not None:
        verify_input.on_logits()
    if batch.forward_mode.is_idle():
        return original(verify_input, batch, logits_output, grammar_mask, *later, **later_kw)
    sampling_info = batch.sampling_info
    record, counts = verify_input.record, verify_input.num_drafts
    greedy = sampling_info.is_all_greedy
    per_request = counts is not None or sampling_info.has_custom_logit_processor
    if (not per_request if greedy else record is None):
        return original(verify_input, batch, logits_output, grammar_mask, *later, **later_kw)
    from sglang.srt.speculative.eagle_utils import _verify_coins

    logits = logits_output.next_token_logits
    _process_logits(logits, verify_input, sampling_info, grammar_mask)
    bs, k1 = batch.seq_lens.shape[0], verify_input.draft_token_num
    candidates = verify_input.draft_token.reshape(bs, k1)
    if greedy:
        if counts is None:  # every request drafted the whole verify width
            counts = torch.full((bs,), k1 - 1, dtype=torch.int32, device=logits.device)
        emitted, num_accepted = greedy_accept(logits.argmax(dim=-1).view(bs, k1), candidates[:, 1:], counts)
    else:
        if counts is not None:
            record = dataclasses.replace(record, num_drafts=counts)
        coins, final_coins = _verify_coins(
            sampling_info=sampling_info,
            seq_lens=batch.seq_lens,
            draft_token_num=k1,
            candidates=candidates,
            device=logits.device,
        )
        emitted, num_accepted = stock_accept(
            logits, sampling_rows(sampling_info), record, coins[:, : k1 - 1], final_coins
        )
    # SGLang's layout: slot retrieve_index[b, j] holds emitted token j; accept_index lists the
    # slots of the accepted drafts and the drawn token, -1 after.
    col = torch.arange(k1, device=logits.device)[None, :]
    emit = col <= num_accepted[:, None]
    slots = verify_input.retrieve_index.to(torch.int64)
    predict = torch.zeros(bs * k1, dtype=torch.int32, device=logits.device)
    predict.scatter_(0, slots.reshape(-1), torch.where(emit, emitted, 0).to(torch.int32).reshape(-1))
    accept_index = torch.where(emit, slots, -1).to(torch.int32)
    num_correct = num_accepted.to(torch.int32)
    _broadcast_from_rank0(predict, accept_index, num_correct)
    return predict, num_correct + 1, accept_index


def _broadcast_from_rank0(*tensors: torch.Tensor) -> None:
    # As SGLang's verify: ranks may round the target probabilities differently; rank 0 decides.
    from sglang.srt.distributed import get_tp_group
    from sglang.srt.layers.dp_attention import is_dp_attention_enabled
    from sglang.srt.runtime_context import get_parallel

    group = get_parallel().attn_tp_group if is_dp_attention_enabled() else get_tp_group()
    if group.world_size > 1:
        for t in tensors:
            group.broadcast(t, src=0)
