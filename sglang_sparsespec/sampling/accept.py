"""The verify's acceptance as tensor logic: which of each request's drafts a verify keeps and which
token it emits after them, for both runners (the split round's verify, ``patches/verify_input``,
and the mixed-phase iterations, ``patches/mixed_runner``), so a request's distribution never
depends on which runner served it.

* ``greedy_accept``: the greedy chain rule, drafts kept while they match the target's argmax;
* ``stock_accept``: exact rejection sampling of compact draft records (``rejection``) against the
  distribution stock decoding samples from (``target``);
* ``chain_layout``: an acceptance laid out as SGLang's EAGLE verify returns it for a topk=1 chain.

Every function is shape-static and free of host synchronisation (the mixed runner captures them in
CUDA graphs).
"""

from __future__ import annotations

import torch
from sglang_sparsespec.kernels.target_filter import target_filter_fwd
from sglang_sparsespec.kernels.verify_accept import rejection_fwd

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.modes import AcceptList
from sglang_sparsespec.sampling.rejection import DraftRecord, rejection_sample
from sglang_sparsespec.sampling.target import SamplingBackend, SamplingRows, target_probs

# The target filter's first list in this process (``--pillar-accept-list``): set by the PILLAR worker before its
# graphs capture the acceptance, so every captured and eager verify of the process reads the same one.
_CANDIDATES = PillarConfig.accept_list is AcceptList.CANDIDATES


def use_candidates(on: bool) -> None:
    """Whether this process's acceptance builds its first lists from the candidates (``AcceptList.CANDIDATES``)."""
    global _CANDIDATES
    _CANDIDATES = on


def greedy_accept(
    target: torch.Tensor, drafts: torch.Tensor, num_drafts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy verify: target [S, k + 1] the target's argmax per row, drafts [S, k], num_drafts [S]
    (columns past it are stale). Returns (emitted [S, k + 1]: the accepted drafts, the target's
    token after them, then -1; num_accepted [S] int64)."""
    k = drafts.shape[1]
    cols = torch.arange(k + 1, device=target.device)
    ok = (drafts == target[:, :k]) & (cols[:k].view(1, -1) < num_drafts.view(-1, 1))
    num_accepted = ok.to(torch.int64).cumprod(dim=1).sum(dim=1)
    emitted = torch.where(cols.view(1, -1) <= num_accepted.view(-1, 1), target, -1)
    return emitted, num_accepted


def stock_accept(
    logits: torch.Tensor, rows: SamplingRows, record: DraftRecord, coins: torch.Tensor, final_coins: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact rejection sampling of ``record`` against stock decoding's distribution of each verify
    row (``target.target_probs``; logits [bs * (k + 1), V], row b * (k + 1) + j under request b of
    ``rows``). Returns (emitted [bs, k + 1], num_accepted [bs]).

    On the GPU: ``kernels/target_filter.py`` (compact rows, vocabulary-parallel) and the fused
    ``kernels/verify_accept.py``; the zero-width record of a plain-decoding round draws from the
    dense rows. Elsewhere the torch references."""
    bs, k = record.tokens.shape
    if not logits.is_cuda:
        return rejection_sample(target_probs(logits, rows, k + 1).view(bs, k + 1, -1), record, coins, final_coins)
    rank_rule = rows.backend is SamplingBackend.PYTORCH
    params = (rows.temperature, rows.top_k, rows.top_p, rows.min_p)
    target = target_filter_fwd(logits, *params, k + 1, rank_rule, candidates=_CANDIDATES)
    if k == 0:
        return rejection_sample(target.dense().view(bs, 1, -1), record, coins, final_coins)
    r = record
    return rejection_fwd(target, r.tokens, r.cand_ids, r.cand_q, r.q_tok, r.num_drafts, coins, final_coins)


def chain_layout(
    emitted: torch.Tensor, num_accepted: torch.Tensor, retrieve_index: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``emitted`` [bs, k + 1] / ``num_accepted`` [bs] as SGLang's verify returns an acceptance:
    (predict [bs * (k + 1)] int32, slot ``retrieve_index[b, j]`` holding emitted token j, 0 past the
    run; accept_lens [bs] int32, the run's length with the emitted token; accept_index [bs, k + 1]
    int32, the run's slots, then -1)."""
    bs, k1 = emitted.shape
    col = torch.arange(k1, device=emitted.device)[None, :]
    emit = col <= num_accepted[:, None]
    slots = retrieve_index.to(torch.int64)
    predict = torch.zeros(bs * k1, dtype=torch.int32, device=emitted.device)
    predict.scatter_(0, slots.reshape(-1), torch.where(emit, emitted, 0).to(torch.int32).reshape(-1))
    accept_index = torch.where(emit, slots, -1).to(torch.int32)
    return predict, num_accepted.to(torch.int32) + 1, accept_index
