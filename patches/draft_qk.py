"""Draft steps normalize and rotate q and the new key inside the sparse attention kernel, verifies inside their
prologue launch: fewer launches a layer.

A layer of a decode forward runs SGLang's q/k norm kernel (Qwen3) and rotary kernel on (q, k), then its attention,
which in a draft step is PILLAR's sparse kernel (``patches/draft_attention.py``). That kernel already loads q and
the step's key (it stores the key itself), so it can normalize and rotate them as it loads them
(``kernels/qk_prologue.py``): inside ``deferred_qk()`` the hooks below hand (q, k) back untouched and leave the
work (the norm weights, SGLang's neox cos | sin cache, the positions) to the layer's attention call, which either
fuses it or, where it cannot store in-kernel, runs SGLang's own calls first, in the model's order. On the H200's
Qwen3-1.7B round the q/k norm and rotary launches took 2.0 and 2.2 us a layer of every draft step, each with its
gap (trace_qwen3-1.7b_round_h200_e8410c8). A verify layer's prologue (``kernels/verify_prologue.py``, run by
``patches/triton_verify.py`` inside its ``verify_qk_scope``) takes the same deferred work for the chain's q and k.

Only for the architectures in ``QK_IN_KERNEL``: their attention calls the q/k norm (Qwen3) and the rotary
embedding once on (q, k) and passes the result straight to the attention layer, so nothing between sees the
untouched values. A rotation the kernel cannot do (another style, partial rotary, offsets) runs SGLang's, after
the deferred norm it must follow. Draft numerics never touch the output's exactness; they only move acceptance.
The verify's prologue computes SGLang's math in SGLang's order and roundings (fp32, rounded to the activations'
dtype after the norm and after the rotation); only its norm's sum of squares may add in another order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from .plain_layers import plain_rms_norm

# Decoder classes whose attention is `[q, k = apply_qk_norm(q, k, ...)]; q, k = rotary_emb(positions, q, k)`
# followed by `attn(q, k, v, ...)`.
QK_IN_KERNEL = frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"})

QK = tuple[torch.Tensor, torch.Tensor]


@dataclass
class DeferredNorm:
    """One layer's per-head q/k RMS norm, left to its attention call: weights [D], epsilons, and SGLang's own
    call ``(q, k) -> (q, k)`` for attention that cannot normalize in its kernel."""

    q_weight: torch.Tensor
    k_weight: torch.Tensor
    q_eps: float
    k_eps: float
    apply: Callable[[torch.Tensor, torch.Tensor], QK]


@dataclass
class DeferredRope:
    """One layer's rotary embedding, left to its attention call.

    cos_sin: [max_pos, D] cos | sin halves (SGLang's ``cos_sin_cache``, neox layout, rotary dim = head dim);
    positions: [bs] int; apply: SGLang's own rotary call ``(positions, q, k) -> (q, k)``.
    """

    cos_sin: torch.Tensor
    positions: torch.Tensor
    apply: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], QK]


@dataclass
class DeferredQK:
    """What the model left to a layer's attention call (either may be None), and how to do it there unfused."""

    norm: DeferredNorm | None
    rope: DeferredRope | None

    def apply(self, q: torch.Tensor, k: torch.Tensor) -> QK:
        """SGLang's own calls, in the model's order."""
        if self.norm is not None:
            q, k = self.norm.apply(q, k)
        if self.rope is not None:
            q, k = self.rope.apply(self.rope.positions, q, k)
        return q, k


_DEFER: ContextVar[bool] = ContextVar("pillar_defer_qk", default=False)
_NORM: ContextVar[DeferredNorm | None] = ContextVar("pillar_pending_norm", default=None)
_ROPE: ContextVar[DeferredRope | None] = ContextVar("pillar_pending_rope", default=None)


@contextmanager
def deferred_qk() -> Iterator[None]:
    """A draft step's forward whose attention normalizes and rotates q and k itself."""
    token = _DEFER.set(True)
    try:
        yield
    finally:
        _DEFER.reset(token)
        _NORM.set(None)
        _ROPE.set(None)


def take_deferred() -> DeferredQK | None:
    """What the model left to this attention call (None: q and k arrive done)."""
    norm, rope = _NORM.get(), _ROPE.get()
    if norm is None and rope is None:
        return None
    _NORM.set(None)
    _ROPE.set(None)
    return DeferredQK(norm, rope)


def defer_draft_qk_norm(original, q, k, q_norm, k_norm, head_dim, *args, **kwargs):
    """AROUND Qwen3's ``apply_qk_norm``: inside ``deferred_qk()``, plain RMS norms of whole heads are recorded for
    the layer's attention and (q, k) are returned as they came; else SGLang's."""
    if not (_DEFER.get() and plain_rms_norm(q_norm, head_dim) and plain_rms_norm(k_norm, head_dim)):
        return original(q, k, q_norm, k_norm, head_dim, *args, **kwargs)
    _NORM.set(
        DeferredNorm(
            q_norm.weight,
            k_norm.weight,
            float(q_norm.variance_epsilon),
            float(k_norm.variance_epsilon),
            lambda q_, k_: original(q_, k_, q_norm, k_norm, head_dim, *args, **kwargs),
        )
    )
    return q, k


def _fusable_rope(rotary, query: torch.Tensor) -> bool:
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
    """AROUND ``RotaryEmbedding.forward_cuda``: inside ``deferred_qk()``, a plain neox rotation (no offsets, no
    fused KV store) is recorded for the layer's attention and (q, k) are returned as they came; else SGLang's,
    after a norm the model deferred before it."""
    plain = all(a is None for a in args) and all(v is None for v in kwargs.values())
    if not (_DEFER.get() and plain and _fusable_rope(rotary, query)):
        norm = _NORM.get()
        if norm is not None:  # the rotation follows the norm: run that first
            _NORM.set(None)
            query, key = norm.apply(query, key)
        return original(rotary, positions, query, key, *args, **kwargs)
    _ROPE.set(DeferredRope(rotary.cos_sin_cache, positions, lambda p, q, k: original(rotary, p, q, k)))
    return query, key
