"""Stock SGLang's sampling distribution, in plain torch.

``target_probs`` is the distribution stock SGLang 0.5.17 decoding samples from. It depends on the
server's ``--sampling-backend`` (``SamplingBackend``; deterministic inference forces pytorch):

flashinfer (the default), no min-p in the batch: ``top_k_top_p_sampling_from_probs(...,
    filter_apply_order="joint")``, whose kernel accepts a draw x iff #{p > p_x} < top_k and the
    mass of {p > p_x} < top_p (both strict): a value threshold, so every token tied at the cut stays.
flashinfer with min-p: ``top_k_renorm_prob`` (keeps p > pivot, the pivot below the k-th largest
    value: x stays iff #{p > p_x} < top_k), ``top_p_renorm_prob`` (x stays iff the renormalised mass
    of {p > p_x} < top_p), then ``min_p_sampling_from_probs`` (p >= min_p x max p).
pytorch: ``top_k_top_p_min_p_sampling_from_probs_torch``: one descending sort of the original
    probabilities, rank r kept iff r < top_k, the mass before it <= top_p and (with min-p)
    p >= min_p x p_max, jointly. Ties are ordered by the sort; torch's CUDA sort of a vocabulary
    row is a stable radix sort, so among equal probabilities the lower id ranks first (assumed here,
    and what ``stable=True`` gives on every device).

Greedy requests are top_k 1 at temperature 1 in SGLang; inside a sampled batch the flashinfer rule
keeps every tied maximum (the draw is uniform among them) and the pytorch rule keeps rank 0 (the
lowest id). All-greedy batches never reach here (SGLang's own argmax). ``top_p >= 1`` keeps every
token: stock's float sums can drop tokens whose larger neighbours already sum to 1.0 in fp32, a
mass below fp32 resolution. A full-vocabulary sort, so CPU tests and references only; the GPU
verify computes the same rows with ``kernels/target_filter.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import torch

from sglang_sparsespec.kernels.logit_bins import GREEDY_EPS


class SamplingBackend(str, Enum):
    """Which stock sampler the target reproduces (SGLang's ``--sampling-backend``)."""

    FLASHINFER = "flashinfer"
    PYTORCH = "pytorch"


@dataclass
class SamplingRows:
    """Per-request sampling parameters, already on the logits' device; one row per request.

    temperature: [bs] float32; < GREEDY_EPS means greedy.
    top_p: [bs] float32 in (0, 1]; >= 1 disables top-p.
    top_k: [bs] int32; 1 means greedy (SGLang encodes greedy as top_k=1, temperature=1),
        <= 0 or >= vocab disables top-k.
    min_p: [bs] float32 in [0, 1], or None: min-p off for the batch (SGLang's need_min_p_sampling).
    backend: the stock sampler whose distribution this is.
    """

    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor | None = None
    backend: SamplingBackend = SamplingBackend.FLASHINFER

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
        self.backend = SamplingBackend(self.backend)

    @property
    def batch_size(self) -> int:
        return self.temperature.shape[0]


def per_position(t: torch.Tensor, repeats: int) -> torch.Tensor:
    # Row i of the logits belongs to request i // repeats; expand() keeps the size static.
    return t[:, None].expand(t.shape[0], repeats).reshape(-1)


def _greater(probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[n, V] (#tokens with p > p_x, their mass) for every token x."""
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    neg = -sorted_p
    n_gt = torch.searchsorted(neg, neg, right=False)  # the first sorted slot of x's value
    ahead = sorted_p.cumsum(dim=-1) - sorted_p
    mass_gt = ahead.gather(1, n_gt)
    back = torch.empty_like(order).scatter_(
        1, order, torch.arange(probs.shape[-1], device=probs.device).expand_as(order)
    )
    return n_gt.gather(1, back), mass_gt.gather(1, back)


def _renorm(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    kept = torch.where(keep, probs, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def _flashinfer(probs: torch.Tensor, k: torch.Tensor, p_lim: torch.Tensor, min_p: torch.Tensor | None) -> torch.Tensor:
    if min_p is None:
        n_gt, mass_gt = _greater(probs)
        return _renorm(probs, (n_gt < k[:, None]) & (mass_gt < p_lim[:, None]))
    probs = _renorm(probs, _greater(probs)[0] < k[:, None])
    probs = _renorm(probs, _greater(probs)[1] < p_lim[:, None])
    return _renorm(probs, probs >= probs.amax(dim=-1, keepdim=True) * min_p[:, None])


def _pytorch(probs: torch.Tensor, k: torch.Tensor, p_lim: torch.Tensor, min_p: torch.Tensor | None) -> torch.Tensor:
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    rank = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    keep = (rank < k[:, None]) & (sorted_p.cumsum(dim=-1) - sorted_p <= p_lim[:, None])
    if min_p is not None:
        keep &= sorted_p >= sorted_p[:, :1] * min_p[:, None]
    return _renorm(probs, torch.empty_like(keep).scatter_(1, order, keep))


def target_probs(logits: torch.Tensor, rows: SamplingRows, repeats: int = 1) -> torch.Tensor:
    """Stock SGLang's sampling distribution of every logits row under its request's parameters.

    logits: [bs * repeats, V] (any float dtype); row i belongs to request i // repeats.
    Returns [bs * repeats, V] float32 rows summing to 1, filtered by ``rows.backend``'s rule.
    """
    if logits.dim() != 2:
        raise ValueError(f"logits must be [n, V], got shape {tuple(logits.shape)}")
    if repeats < 1 or logits.shape[0] != rows.batch_size * repeats:
        raise ValueError(f"logits has {logits.shape[0]} rows, expected batch {rows.batch_size} x repeats {repeats}")
    vocab = logits.shape[-1]
    temp = per_position(rows.temperature, repeats)
    top_k = per_position(rows.top_k, repeats).to(torch.int64)
    top_p = per_position(rows.top_p, repeats)
    greedy = temp < GREEDY_EPS  # SGLang's own encoding is top_k 1 at temperature 1
    k = torch.where(greedy, 1, torch.where((top_k <= 0) | (top_k >= vocab), vocab, top_k))
    p_lim = torch.where(top_p >= 1.0, float("inf"), top_p)
    probs = torch.softmax(logits.to(torch.float32) / torch.where(greedy, 1.0, temp)[:, None], dim=-1)
    min_p = None if rows.min_p is None else per_position(rows.min_p, repeats)
    rule = _flashinfer if rows.backend is SamplingBackend.FLASHINFER else _pytorch
    return rule(probs, k, p_lim, min_p)
