"""Exact rejection sampling of k drafts against compact draft records.

Speculative sampling (Leviathan et al. / Chen et al.): draft j, drawn from q_j, is accepted with
probability min(1, p_j(x_j) / q_j(x_j)); at the first rejection the emitted token is drawn from the
residual max(0, p_j - q_j) (normalised); if all k drafts pass, a bonus token is drawn from p_k.
Every emitted token then follows the target p exactly, whatever q is. Here q_j is known only on its
support (``DraftRecord``: C candidate ids and their probabilities, q = 0 elsewhere), which is all
the residual needs: r = p - min(p, q) differs from p on those C ids only.

All tensor work, shape-static and sync-free. The randomness comes in as SGLang's verify coins and,
for the drafts, as the draft runner's noise; under deterministic inference both are hashes of the
request's seed and position (the drafts' in a column range of their own, so the two stay independent),
so a seeded request that runs the same rounds draws the same tokens on every run.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class DraftRecord:
    """What the verify needs of k sampled drafts per request, without vocabulary-wide rows.

    tokens [bs, k] int64: the drafts; cand_ids [bs, k, C] int64: the support of each draft's
    proposal q_j (distinct where q_j > 0; slots with q_j = 0 may repeat ids); cand_q [bs, k, C]
    float32: q_j on them (0 where filtered out, rows sum to 1); q_tok [bs, k] float32:
    q_j(tokens[:, j]), > 0.
    num_drafts: how many of the k columns were drafted this round: None (all k), one int in 0..k
    for the whole batch, or a [bs] int64 / int32 tensor on the drafts' device with each request's
    own count, every value in 0..k (not checked here: reading the values would sync with the
    device). A request that drafts fewer than the verify width leaves the rest of its columns
    unfilled (stale); they are never accepted, and the token after its last real draft comes from
    its residual there (the target itself past the drafts).
    """

    tokens: torch.Tensor
    cand_ids: torch.Tensor
    cand_q: torch.Tensor
    q_tok: torch.Tensor
    num_drafts: int | torch.Tensor | None = None

    def __post_init__(self) -> None:
        bs, k = self.tokens.shape
        if self.num_drafts is None:
            self.num_drafts = k
        if isinstance(self.num_drafts, torch.Tensor):
            if tuple(self.num_drafts.shape) != (bs,) or self.num_drafts.dtype not in (torch.int32, torch.int64):
                raise ValueError(
                    f"per-request num_drafts must be a [{bs}] int32 / int64 tensor, got "
                    f"{tuple(self.num_drafts.shape)} {self.num_drafts.dtype}"
                )
        elif not 0 <= self.num_drafts <= k:
            raise ValueError(f"num_drafts must be in 0..{k}, got {self.num_drafts}")
        if self.cand_ids.shape != self.cand_q.shape or tuple(self.cand_ids.shape[:2]) != (bs, k):
            raise ValueError(
                f"cand_ids {tuple(self.cand_ids.shape)} and cand_q {tuple(self.cand_q.shape)} must be [{bs}, {k}, C]"
            )
        if tuple(self.q_tok.shape) != (bs, k):
            raise ValueError(f"q_tok must be [{bs}, {k}], got {tuple(self.q_tok.shape)}")


def rejection_sample(
    target_p: torch.Tensor, record: DraftRecord, coins: torch.Tensor, final_coins: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a prefix of each request's drafts and draw the token after it.

    target_p [bs, k+1, V] float32: the target distribution at each verify row (row j scores draft
    j; row k is the bonus row); coins [bs, k] and final_coins [bs] uniform in [0, 1).
    Returns (emitted [bs, k+1] int64: the accepted drafts, then the drawn token, then -1;
    num_accepted [bs] int64, each in 0..that request's num_drafts).
    """
    bs, k1, _ = target_p.shape
    k = k1 - 1
    if record.tokens.shape != (bs, k) or tuple(coins.shape) != (bs, k) or tuple(final_coins.shape) != (bs,):
        raise ValueError(
            f"drafts and coins must be [{bs}, {k}] and final_coins [{bs}] for target_p {tuple(target_p.shape)}"
        )
    dev = target_p.device
    n = record.num_drafts
    # One path for both forms: a batch-wide count is every request's count.
    n = torch.full((bs,), n, dtype=torch.int64, device=dev) if isinstance(n, int) else n.to(torch.int64)
    p_tok = target_p[:, :k].gather(2, record.tokens[..., None]).squeeze(-1)
    # u < p / q, without the division (q_tok > 0: the draft was drawn from q); undrafted columns fail.
    accepted = (coins * record.q_tok < p_tok) & (torch.arange(k, device=dev)[None, :] < n[:, None])
    num_accepted = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    rows = torch.arange(bs, device=dev)
    final_p = target_p[rows, num_accepted]
    if k == 0:  # the zero-width record of a plain-decoding round: nothing to subtract
        residual = final_p
    else:
        # At a rejection (num_accepted < n) subtract min(p, q) on the rejected draft's support; past
        # a request's drafts (n == 0 included) nothing. To stay shape-static every row gathers a
        # column's record (where it counts, num_accepted < n <= k: the rejected one), possibly a
        # stale one: masked with where, not a product (a stale q may be NaN), ids included.
        sub = (num_accepted < n)[:, None]
        j = num_accepted.clamp(max=k - 1)
        ids = torch.where(sub, record.cand_ids[rows, j], 0)
        overlap = torch.where(sub, torch.minimum(final_p.gather(1, ids), record.cand_q[rows, j]), 0.0)
        residual = final_p.scatter_add(1, ids, -overlap).clamp_(min=0.0)
    # Rounding can leave a residual of zero mass only when p == q; p itself is then exact. One
    # vocabulary-wide scan: the row to draw from is chosen before the cumulative sum.
    empty = residual.sum(dim=1, keepdim=True) <= 0
    cdf = torch.where(empty, final_p, residual).cumsum(dim=1)
    # Inverse CDF: the first id whose cumulative mass exceeds u * total has positive mass.
    total = cdf[:, -1:]
    drawn = torch.searchsorted(cdf, final_coins[:, None] * total, right=True)
    # u * total can round up to total: fall back to the last id with mass (where cdf reaches it).
    drawn = torch.minimum(drawn, (cdf < total).sum(dim=1, keepdim=True)).squeeze(1)
    col = torch.arange(k1, device=dev)[None, :]
    drafts = torch.cat([record.tokens, record.tokens.new_zeros((bs, 1))], dim=1)
    emitted = torch.where(col < num_accepted[:, None], drafts, -1)
    emitted = torch.where(col == num_accepted[:, None], drawn[:, None], emitted)
    return emitted, num_accepted
