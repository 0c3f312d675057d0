"""Draft steps rotate q and the new key inside the sparse attention kernel: no rotary launch.

A layer of a decode forward runs SGLang's rotary kernel on (q, k), then its attention, which in a draft step
is PILLAR's sparse kernel (``patches/draft_attention.py``). That kernel already loads q and the step's key (it
stores the key itself), so it can rotate them as it loads them: inside ``deferred_rope()`` the hook below hands
(q, k) back unrotated and leaves the rotation (SGLang's neox cos | sin cache and the positions) to the layer's
attention call, which either fuses it or, where it cannot store in-kernel, applies SGLang's own kernel first.
One launch less per layer of every draft step (2.2 us and its gap on the H200, trace_qwen3-1.7b_round_h200_e8410c8).

Only for the architectures in ``ROPE_IN_KERNEL``: their attention calls the rotary embedding once on (q, k) and
passes the result straight to the attention layer, so nothing between the two sees the unrotated values. Draft
numerics never touch the output's exactness (the verify keeps SGLang's kernels); they only move acceptance.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

# Decoder classes whose attention is `q, k = rotary_emb(positions, q, k)` followed by `attn(q, k, v, ...)`.
ROPE_IN_KERNEL = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})


@dataclass
class DeferredRope:
    """One layer's rotary embedding, left to its attention call.

    cos_sin: [max_pos, D] cos | sin halves (SGLang's ``cos_sin_cache``, neox layout, rotary dim = head dim);
    positions: [bs] int; apply: SGLang's own rotary call ``(positions, q, k) -> (q, k)``, for attention that
    cannot rotate in its kernel.
    """

    cos_sin: torch.Tensor
    positions: torch.Tensor
    apply: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


_DEFER: ContextVar[bool] = ContextVar("pillar_defer_rope", default=False)
_PENDING: ContextVar[DeferredRope | None] = ContextVar("pillar_pending_rope", default=None)


@contextmanager
def deferred_rope() -> Iterator[None]:
    """A draft step's forward whose attention rotates q and k itself."""
    token = _DEFER.set(True)
    try:
        yield
    finally:
        _DEFER.reset(token)
        _PENDING.set(None)


def take_deferred() -> DeferredRope | None:
    """The rotary embedding the model left to this attention call (None: q and k arrive rotated)."""
    pending = _PENDING.get()
    if pending is not None:
        _PENDING.set(None)
    return pending


def _fusable(rotary, query: torch.Tensor) -> bool:
    """SGLang's standard CUDA path of a neox rotary over the whole head (an attribute a release lacks: not)."""
    cache = getattr(rotary, "cos_sin_cache", None)
    head = getattr(rotary, "head_size", None)
    return (
        getattr(rotary, "use_fallback_kernel", True) is False
        and getattr(rotary, "is_neox_style", False) is True
        and getattr(rotary, "rotary_dim", None) == head
        and getattr(rotary, "position_start", 0) == 0
        and isinstance(cache, torch.Tensor)
        and cache.dim() == 2
        and cache.shape[1] == head
        and cache.device == query.device
    )


def defer_draft_rope(original, rotary, positions, query, key, *args, **kwargs):
    """AROUND ``RotaryEmbedding.forward_cuda``: inside ``deferred_rope()``, a plain neox rotation (no offsets,
    no fused KV store) is recorded for the layer's attention and (q, k) are returned as they came; else SGLang's."""
    plain = all(a is None for a in args) and all(v is None for v in kwargs.values())
    if not (_DEFER.get() and plain and _fusable(rotary, query)):
        return original(rotary, positions, query, key, *args, **kwargs)
    _PENDING.set(DeferredRope(rotary.cos_sin_cache, positions, lambda p, q, k: original(rotary, p, q, k)))
    return query, key
