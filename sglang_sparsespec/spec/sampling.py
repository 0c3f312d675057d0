"""Per-request sampling distributions and draft sampling for the PILLAR worker.

The PILLAR worker drafts k tokens with the target model under sparse attention: each draft
is sampled with :func:`sample` from :func:`target_probs` of its logits, and that
distribution q is kept. The drafts and q ([bs, k, V], row j = the distribution draft j was
sampled from) go to SGLang's own verify, which computes the target distributions p with
full attention and runs its exact rejection sampling (``chain_speculative_sampling_triton``).

Everything here is shape-static, vectorised over the batch and free of host syncs (no
``.item()``, no value-dependent Python branches, no data-dependent shapes), so it can run
inside the decode step and inside CUDA graphs. Randomness comes from ``Tensor.exponential_``,
which CUDA graphs support through the generator's philox offset.

Filtering follows SGLang's "joint" semantics (its pytorch sampling backend and FlashInfer's
``filter_apply_order="joint"``): after temperature and softmax, a token is kept iff its rank
is below top_k AND the probability mass strictly above it is <= top_p AND it has at least
min_p times the largest probability; the kept mass is then renormalised.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Temperatures below this mean greedy (SGLang's own cut-off, sampling_params._SAMPLING_EPS).
GREEDY_EPS = 1e-6


@dataclass
class SamplingRows:
    """Per-request sampling parameters, already on the logits' device; one row per request.

    temperature: [bs] float32; < GREEDY_EPS means greedy.
    top_p: [bs] float32 in (0, 1]; >= 1 disables top-p.
    top_k: [bs] int32; 1 means greedy (SGLang encodes greedy as top_k=1, temperature=1),
        <= 0 or >= vocab disables top-k.
    min_p: [bs] float32 in [0, 1] or None (disabled for every row).
    filter_top: static host flag; False skips the O(V log V) sort behind top-k/top-p and is
        only correct when no non-greedy row uses either. A Python bool, so a captured graph
        sees one fixed code path.
    """

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor | None = None
    filter_top: bool = True

    def __post_init__(self) -> None:
        if self.temperature.dim() != 1:
            raise ValueError(f"temperature must be [bs], got shape {tuple(self.temperature.shape)}")
        bs = self.temperature.shape[0]
        for name in ("top_p", "top_k", "min_p"):
            t = getattr(self, name)
            if t is not None and tuple(t.shape) != (bs,):
                raise ValueError(f"{name} must have shape ({bs},), got {tuple(t.shape)}")
        if self.top_k.is_floating_point():
            raise ValueError(f"top_k must be an integer tensor, got {self.top_k.dtype}")

    @property
    def batch_size(self) -> int:
        return self.temperature.shape[0]


def _per_position(t: torch.Tensor, repeats: int) -> torch.Tensor:
    # Row i of the logits belongs to request i // repeats; expand() keeps the size static.
    return t[:, None].expand(t.shape[0], repeats).reshape(-1)


def _top_k_top_p_mask(probs: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """[n, V] bool: tokens surviving joint top-k/top-p, ties at the cut broken by lower id."""
    vocab = probs.shape[-1]
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(vocab, device=probs.device)
    k_eff = torch.where((top_k <= 0) | (top_k >= vocab), vocab, top_k.to(torch.int64))
    keep = rank[None, :] < k_eff[:, None]
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p
    # top_p >= 1 must keep everything, even where rounding pushes the cumulative sum past 1.
    keep &= (mass_before <= top_p[:, None]) | (top_p[:, None] >= 1.0)
    return torch.empty_like(keep).scatter_(1, order, keep)


def target_probs(logits: torch.Tensor, rows: SamplingRows, repeats: int = 1) -> torch.Tensor:
    """Sampling distribution of every logits row under its request's parameters.

    logits: [bs * repeats, V] (any float dtype); row i belongs to request i // repeats.
    Returns [bs * repeats, V] float32 rows summing to 1. Greedy rows are one-hot at
    ``torch.argmax(logits)`` (ties: lowest id), so speculative greedy decoding stays exact.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [n, V], got shape {tuple(logits.shape)}")
    if repeats < 1 or logits.shape[0] != rows.batch_size * repeats:
        raise ValueError(
            f"logits has {logits.shape[0]} rows, expected batch {rows.batch_size} x repeats {repeats}"
        )
    temp = _per_position(rows.temperature, repeats)
    top_k = _per_position(rows.top_k, repeats)
    greedy = (temp < GREEDY_EPS) | (top_k == 1)
    # Greedy rows divide by 1 instead of ~0 so no inf/nan is computed and later discarded.
    scaled = logits.to(torch.float32) / torch.where(greedy, 1.0, temp)[:, None]
    probs = torch.softmax(scaled, dim=-1)
    keep = None
    if rows.filter_top:
        keep = _top_k_top_p_mask(probs, top_k, _per_position(rows.top_p, repeats))
    if rows.min_p is not None:
        # The row maximum always survives top-k/top-p, so thresholding on it matches
        # thresholding after those filters.
        floor = probs.amax(dim=-1, keepdim=True) * _per_position(rows.min_p, repeats)[:, None]
        keep = probs >= floor if keep is None else keep & (probs >= floor)
    if keep is not None:
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(greedy[:, None], one_hot, probs)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row: [n, V] non-negative weights (need not sum to 1) -> [n] int64.

    Exponential race: argmax_i w_i / E_i with E_i ~ Exp(1) picks i with probability
    w_i / sum(w), with no cumulative sum, no normalisation and no host sync. One-hot rows
    always return their hot index.
    """
    if probs.dim() != 2:
        raise ValueError(f"probs must be [n, V], got shape {tuple(probs.shape)}")
    race = torch.empty_like(probs).exponential_(generator=generator)
    # A zero draw would turn a zero weight into 0/0 = nan, which argmax would pick.
    race.clamp_(min=torch.finfo(probs.dtype).tiny)
    return (probs / race).argmax(dim=-1)
