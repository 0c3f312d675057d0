"""``eagle_sample``: PILLAR's verify acceptance from compact draft records.

SGLang's sampled verify (``chain_speculative_sampling_triton``) needs every draft's full
vocabulary distribution. PILLAR drafts record q on C candidates only (``DraftRecord``), so for a
PILLAR verify input (``attach_round``) that is not all greedy, this replaces the sampling half of
``eagle_sample``: the same logit processing as SGLang (NaN guard, penalties, logit bias, grammar
mask), the target distribution stock decoding samples from (``target_probs_gpu``: one kernel,
``kernels/target_filter.py``, when every top_k is small; else SGLang's renorm kernels), then exact
rejection sampling (``kernels/verify_accept.py`` on the GPU; ``spec/rejection.rejection_sample`` is
its reference). A custom logit processor is applied last, as SGLang's Sampler does, to row 0 of each
request (its requests draft nothing: ``patches/request_rounds.py``); a round with such requests, or
with per-request draft counts, is accepted here for greedy batches too (``greedy_accept``: SGLang's
greedy chain rule with each request's count), since SGLang's greedy verify would accept drafts of a
request that has none. Other all-greedy batches, idle batches and other algorithms run SGLang's code.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from sglang_sparsespec.kernels.target_filter import target_filter_fwd
from sglang_sparsespec.kernels.verify_accept import rejection_fwd, softmax_t_fwd

from sglang_sparsespec.spec.mixed import greedy_accept
from sglang_sparsespec.spec.rejection import DraftRecord, rejection_sample
from sglang_sparsespec.spec.sampling import SamplingRows, target_probs

ATTR = "_sparsespec_round"


@dataclass
class PillarRound:
    """What a PILLAR verify input carries for the sampling step: the draft record (None when the
    batch drafted greedily), a callback run once the verify forward is done (phase timing), and
    num_drafts [bs] int32 on the device: each request's own draft count where some requests draft
    fewer than the round (None: the record's count, or every column for a greedy round)."""

    record: DraftRecord | None
    on_logits: Callable[[], None] | None = None
    num_drafts: torch.Tensor | None = None


def attach_round(verify_input, pillar_round: PillarRound) -> None:
    setattr(verify_input, ATTR, pillar_round)


# The candidates target_filter_fwd sorts per row. A batch whose every request has top_k <= this
# (Qwen3's recommended top_k is 20; greedy rows are top_k 1) filters in that one kernel; others keep
# SGLang's renorm kernels. Measured on the H100 at 256 requests x 9 rows x 49,152 tokens, T 0.6,
# top-p 0.95 (kernels_accept_h100_cb3888a.json): top-k 50 + top-p 1.60 ms vs 4.02 ms; top-p alone
# 1.78 vs 1.85 ms, and 8.78 ms when every nucleus is wider than the candidates (the kernel's exact
# vocabulary-wide fallback), so a top-p-only batch is not worth the risk of wide nuclei.
FILTER_CANDIDATES = 64


def top_k_bounded(reqs) -> bool:
    """Every request's top_k is at most FILTER_CANDIDATES (SGLang stores "off" as TOP_K_ALL)."""
    return all(r.sampling_params.top_k <= FILTER_CANDIDATES for r in reqs)


def target_probs_gpu(logits: torch.Tensor, sampling_info, repeats: int, top_k_bounded: bool) -> torch.Tensor:
    """Stock decoding's distribution for each row (as ``target_probs``).

    Stock SGLang samples joint top-k/top-p (flashinfer ``filter_apply_order="joint"``), or top-k
    renorm -> top-p renorm -> min-p when min-p is on; SGLang's own verify applies top-k then top-p
    and drops min-p, which differs from stock when both top-k and top-p are set. Filters a batch
    does not use hold their off values per row (top_k TOP_K_ALL, top_p 1), and greedy requests
    top_k 1. ``top_k_bounded`` (every request's top_k <= FILTER_CANDIDATES, known on the host)
    picks ``target_filter_fwd``; both paths give the same distribution.
    """
    if not top_k_bounded:
        return _renorm_probs(logits, sampling_info, repeats)
    min_p = sampling_info.min_ps if sampling_info.need_min_p_sampling else None
    temperature = sampling_info.temperatures.view(-1)
    return target_filter_fwd(
        logits, temperature, sampling_info.top_ks, sampling_info.top_ps, min_p, repeats, FILTER_CANDIDATES
    )


def _renorm_probs(logits: torch.Tensor, sampling_info, repeats: int) -> torch.Tensor:
    """``target_probs_gpu`` through softmax_t_fwd and SGLang's renorm kernels."""
    from sgl_kernel import top_k_renorm_prob, top_p_renorm_prob

    def per_row(t: torch.Tensor) -> torch.Tensor:
        return torch.repeat_interleave(t.view(-1), repeats, dim=0)

    probs = softmax_t_fwd(logits, sampling_info.temperatures.view(-1), repeats)
    top_k = per_row(sampling_info.top_ks)
    top_p = per_row(sampling_info.top_ps)
    if sampling_info.need_min_p_sampling:
        if sampling_info.need_top_k_sampling:
            probs = top_k_renorm_prob(probs, top_k)
        if sampling_info.need_top_p_sampling:
            probs = top_p_renorm_prob(probs, top_p)
        floor = probs.amax(dim=-1, keepdim=True) * per_row(sampling_info.min_ps)[:, None]
        probs = torch.where(probs >= floor, probs, 0.0)
        return probs / probs.sum(dim=-1, keepdim=True)
    if sampling_info.need_top_k_sampling and sampling_info.need_top_p_sampling:
        keep = (top_k_renorm_prob(probs, top_k) > 0) & (top_p_renorm_prob(probs, top_p) > 0)
        probs = torch.where(keep, probs, 0.0)
        return probs / probs.sum(dim=-1, keepdim=True)
    if sampling_info.need_top_k_sampling:
        return top_k_renorm_prob(probs, top_k)
    if sampling_info.need_top_p_sampling:
        return top_p_renorm_prob(probs, top_p)
    return probs


def _stock_probs(logits: torch.Tensor, sampling_info, repeats: int, top_k_bounded: bool) -> torch.Tensor:
    if logits.is_cuda:
        return target_probs_gpu(logits, sampling_info, repeats, top_k_bounded)
    rows = SamplingRows(
        temperature=sampling_info.temperatures.view(-1).float(),
        top_p=sampling_info.top_ps.float(),
        top_k=sampling_info.top_ks.to(torch.int32),
        min_p=sampling_info.min_ps.float() if sampling_info.need_min_p_sampling else None,
    )
    return target_probs(logits, rows, repeats)


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


def pillar_eagle_sample(original, verify_input, batch, logits_output, grammar_mask=None):
    pillar_round: PillarRound | None = getattr(verify_input, ATTR, None)
    if pillar_round is not None and pillar_round.on_logits is not None:
        pillar_round.on_logits()
    if pillar_round is None or batch.forward_mode.is_idle():
        return original(verify_input, batch, logits_output, grammar_mask)
    sampling_info = batch.sampling_info
    record, counts = pillar_round.record, pillar_round.num_drafts
    greedy = sampling_info.is_all_greedy
    per_request = counts is not None or sampling_info.has_custom_logit_processor
    if (not per_request if greedy else record is None):
        return original(verify_input, batch, logits_output, grammar_mask)
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
        probs = _stock_probs(logits, sampling_info, k1, top_k_bounded(batch.reqs)).view(bs, k1, -1)
        coins, final_coins = _verify_coins(
            sampling_info=sampling_info,
            seq_lens=batch.seq_lens,
            draft_token_num=k1,
            candidates=candidates,
            device=logits.device,
        )
        emitted, num_accepted = _rejection(probs, record, coins[:, : k1 - 1], final_coins)
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


def _rejection(probs: torch.Tensor, record: DraftRecord, coins: torch.Tensor, final_coins: torch.Tensor):
    # The fused kernel on the GPU (rounds with drafts); the torch reference elsewhere and for the
    # zero-width record of plain-decoding rounds.
    if probs.is_cuda and record.tokens.shape[1] >= 1:
        r = record
        return rejection_fwd(probs, r.tokens, r.cand_ids, r.cand_q, r.q_tok, r.num_drafts, coins, final_coins)
    return rejection_sample(probs, record, coins, final_coins)


def _broadcast_from_rank0(*tensors: torch.Tensor) -> None:
    # As SGLang's verify: ranks may round the target probabilities differently; rank 0 decides.
    from sglang.srt.distributed import get_tp_group
    from sglang.srt.layers.dp_attention import is_dp_attention_enabled
    from sglang.srt.runtime_context import get_parallel

    group = get_parallel().attn_tp_group if is_dp_attention_enabled() else get_tp_group()
    if group.world_size > 1:
        for t in tensors:
            group.broadcast(t, src=0)
