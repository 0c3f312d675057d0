"""Which KV positions each request's draft steps attend to.

A *plan* is made at the end of every target forward (prefill or verify) and stored per
request; the next draft round reads it. The draft list of a request is

    selected positions (sorted, < tail_start)  ∪  [tail_start, seq_len)  ∪  this round's drafts

Everything here is shape-static tensor code with no host synchronisation, so it can run
inside the overlap scheduler's forward step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_sparsespec.config import PillarConfig, SelectionPolicy


@dataclass
class SelectionPlan:
    """Per-request draft attention plan; bs = rows of the batch it was made for.

    sel_pos:    [bs, kmax] int32 — selected positions ascending, then -1 padding.
    sel_cnt:    [bs] int32 — number of valid entries in ``sel_pos`` (<= kmax).
    tail_start: [bs] int32 — first position of the always-attended recent tail;
                every selected position is < tail_start <= seq_len.
    """

    sel_pos: torch.Tensor
    sel_cnt: torch.Tensor
    tail_start: torch.Tensor


def budget(cfg: PillarConfig, seq_lens: torch.Tensor) -> torch.Tensor:
    """B(L) = min(L, max(min_budget, ceil(ratio * L))) per request, int64 [bs]."""
    lens = seq_lens.to(torch.int64)
    scaled = torch.ceil(lens.to(torch.float64) * cfg.budget_ratio).to(torch.int64)
    return torch.minimum(lens, scaled.clamp(min=cfg.min_budget))


def streaming_plan(cfg: PillarConfig, seq_lens: torch.Tensor, kmax: int) -> SelectionPlan:
    """Attention sinks [0, s) plus the most recent B - s positions (MagicDec-style).

    Also the seed of every request's first round after prefill, when no verify
    scores exist yet (so the first k drafts are sparse too, never dense).
    """
    lens = seq_lens.to(torch.int64)
    bs = lens.shape[0]
    sinks = torch.clamp(lens, max=min(cfg.sink_tokens, kmax))
    window = budget(cfg, lens) - sinks
    tail_start = torch.maximum(sinks, lens - window)
    cols = torch.arange(kmax, device=lens.device).expand(bs, kmax)
    sel_pos = torch.where(cols < sinks[:, None], cols, -1)
    return SelectionPlan(sel_pos.to(torch.int32), sinks.to(torch.int32), tail_start.to(torch.int32))


def pillar_plan(
    cfg: PillarConfig,
    scores: torch.Tensor,
    verify_lens: torch.Tensor,
    new_lens: torch.Tensor,
    kmax: int,
) -> SelectionPlan:
    """Top-K positions by the attention mass the verify queries gave them.

    scores:      [bs, S] float — mass per prefix position; entries at >= verify_lens are ignored.
    verify_lens: [bs] — prefix length the verify pass attended to (scored positions).
    new_lens:    [bs] — committed length after acceptance (>= verify_lens).
    The tail [verify_len - recent_window, new_len) is always attended, and the budget
    left after the tail goes to the best-scored positions before it.
    """
    if kmax > scores.shape[1]:
        raise ValueError(f"kmax={kmax} exceeds the scored width {scores.shape[1]}")
    vlen = verify_lens.to(torch.int64)
    nlen = new_lens.to(torch.int64)
    tail_start = torch.clamp(vlen - cfg.recent_window, min=0)
    count = budget(cfg, nlen) - (nlen - tail_start)
    count = torch.minimum(count.clamp(min=0), torch.clamp(tail_start, max=kmax))

    positions = torch.arange(scores.shape[1], device=scores.device)
    eligible = positions[None, :] < tail_start[:, None]
    masked = torch.where(eligible, scores.float(), float("-inf"))
    _, top = torch.topk(masked, kmax, dim=1, sorted=True)
    rank = torch.arange(kmax, device=scores.device)[None, :]
    keep = rank < count[:, None]
    # Dropped ranks sort to the end; then they are marked -1.
    big = torch.iinfo(torch.int64).max
    ordered, _ = torch.sort(torch.where(keep, top, big), dim=1)
    sel_pos = torch.where(ordered == big, -1, ordered)
    return SelectionPlan(sel_pos.to(torch.int32), count.to(torch.int32), tail_start.to(torch.int32))
