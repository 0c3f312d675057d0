"""Stock SGLang's sampling distribution, in plain torch.

``target_probs`` is the distribution stock SGLang decoding samples from (its flashinfer sampler):
temperature, then top-k / top-p judged *jointly* on the softmax (``filter_apply_order="joint"``),
or, when min-p is on, top-k renorm -> top-p renorm -> min-p, as its sampler chains them. It is the
plain-torch form (a full-vocabulary sort, so CPU tests and references only); the GPU verify computes
the same rows in ``patches/verify_sample.target_probs_gpu``: one Triton kernel
(``kernels/target_filter.py``) when every request's top_k is small, else SGLang's renorm kernels.
Drafts are sampled by ``kernels/draft_sample.py`` from a compact proposal that needs neither the
sort nor a full row.

Everything here is shape-static, vectorised over the batch and free of host syncs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_sparsespec.kernels.draft_sample import GREEDY_EPS


@dataclass
class SamplingRows:
    """Per-request sampling parameters, already on the logits' device; one row per request.

    temperature: [bs] float32; < GREEDY_EPS means greedy.
    top_p: [bs] float32 in (0, 1]; >= 1 disables top-p.
    top_k: [bs] int32; 1 means greedy (SGLang encodes greedy as top_k=1, temperature=1),
        <= 0 or >= vocab disables top-k.
    min_p: [bs] float32 in [0, 1], or None: min-p off for the batch (stock SGLang then
        filters top-k and top-p jointly, else one after the other; see ``target_probs``).
    """

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor | None = None

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


def _renorm(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = torch.where(keep, probs, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def target_probs(logits: torch.Tensor, rows: SamplingRows, repeats: int = 1) -> torch.Tensor:
    """Stock SGLang's sampling distribution of every logits row under its request's parameters.

    logits: [bs * repeats, V] (any float dtype); row i belongs to request i // repeats.
    Returns [bs * repeats, V] float32 rows summing to 1. Greedy rows are one-hot at
    ``torch.argmax(logits)`` (ties: lowest id). Without min-p, top-k and top-p are judged jointly
    on the softmax; with min-p (``rows.min_p`` not None) top-k renormalises, then top-p is judged
    on that, then min-p keeps tokens >= min_p x the row maximum.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [n, V], got shape {tuple(logits.shape)}")
    if repeats < 1 or logits.shape[0] != rows.batch_size * repeats:
        raise ValueError(
            f"logits has {logits.shape[0]} rows, expected batch {rows.batch_size} x repeats {repeats}"
        )
    temp = _per_position(rows.temperature, repeats)
    top_k = _per_position(rows.top_k, repeats)
    top_p = _per_position(rows.top_p, repeats)
    greedy = (temp < GREEDY_EPS) | (top_k == 1)
    # Greedy rows divide by 1 instead of ~0 so no inf/nan is computed and later discarded.
    probs = torch.softmax(logits.to(torch.float32) / torch.where(greedy, 1.0, temp)[:, None], dim=-1)
    no_p = torch.ones_like(top_p)
    if rows.min_p is None:
        probs = _renorm(probs, _top_k_top_p_mask(probs, top_k, top_p))
    else:
        probs = _renorm(probs, _top_k_top_p_mask(probs, top_k, no_p))
        probs = _renorm(probs, _top_k_top_p_mask(probs, torch.zeros_like(top_k), top_p))
        floor = probs.amax(dim=-1, keepdim=True) * _per_position(rows.min_p, repeats)[:, None]
        probs = _renorm(probs, probs >= floor)
    one_hot = torch.zeros_like(probs).scatter_(1, logits.argmax(dim=-1, keepdim=True), 1.0)
    return torch.where(greedy[:, None], one_hot, probs)
