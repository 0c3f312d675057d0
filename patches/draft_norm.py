"""A Qwen3 draft layer's two add-RMSNorms run by the GEMM after each (``--pillar-draft-mlp fused_norm``).

SGLang norms a layer's residual stream in its own launches: the input add-RMSNorm before the qkv projection, the
post-attention one before gate/up (2.8 us and a gap each, a layer of every draft step at 64 rows). Inside
``deferred_norms()`` (the draft runner's draft steps) the communicator's ``prepare_attn`` / ``prepare_mlp`` hand the
rows on as they came, with a new buffer as the residual, and leave the norm to the module that consumes those rows:
the qkv projection (``kernels/glu_gemm.norm_gemm``, here) or the MLP's gate/up kernel (``glu_gemm``'s ``add_norm``,
patches/draft_mlp.py), which add, normalize and fill the new residual in their own launch.

A norm is left only to a module that will take it: ``name_layer`` names the decoder layer, each deferral checks that
the layer's consumer runs the fused kernel on these rows, and the consumer takes the norm by the identity of the rows
it is called with. A norm still waiting when the layer returns means a consumer was skipped, which would attend or
project un-normed rows: the layer raises instead (at graph capture, before serving). SGLang 0.5.17-0.5.20, whose
Qwen3 layer norms through ``LayerCommunicator``; every other forward runs SGLang's norms.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from sglang_sparsespec.kernels.glu_gemm import GLU_MAX_ROWS, AddNorm, glu_norm_fits, norm_gemm

from .plain_layers import plain_linear, plain_rms_norm


@dataclass(frozen=True)
class _DeferredNorm:
    """An add-RMSNorm left to ``consumer``: called with ``rows`` (handed on as they came), it runs ``add_norm``."""

    rows: torch.Tensor
    consumer: torch.nn.Module
    add_norm: AddNorm


_ON: ContextVar[bool] = ContextVar("pillar_deferred_norms", default=False)
_LAYER: ContextVar[torch.nn.Module | None] = ContextVar("pillar_norm_layer", default=None)
_PENDING: ContextVar[_DeferredNorm | None] = ContextVar("pillar_deferred_norm", default=None)


@contextmanager
def deferred_norms() -> Iterator[None]:
    """A draft step's forward whose Qwen3 layers leave their add-RMSNorms to the next GEMM where it can take them."""
    tokens = _ON.set(True), _PENDING.set(None)
    try:
        yield
    finally:
        _ON.reset(tokens[0])
        _PENDING.reset(tokens[1])


def layer() -> torch.nn.Module | None:
    """The decoder layer ``name_layer`` named, inside ``deferred_norms()``; else None."""
    return _LAYER.get() if _ON.get() else None


def plain_norm(norm, rows: torch.Tensor, residual) -> bool:
    """SGLang's plain RMSNorm over the rows' width with a residual of their shape and dtype, kept in their dtype."""
    return (
        isinstance(residual, torch.Tensor)
        and residual.shape == rows.shape
        and residual.dtype == rows.dtype
        and residual.is_contiguous()
        and plain_rms_norm(norm, rows.shape[-1])
        and getattr(norm, "fp32_residual", True) is False
    )


_UNTAKEN = "a deferred add-RMSNorm was not taken by its consumer: run --pillar-draft-mlp fused"


def leave(rows: torch.Tensor, residual: torch.Tensor, norm, consumer: torch.nn.Module) -> torch.Tensor:
    """Leaves ``norm`` of rows + residual to ``consumer``; returns the new residual buffer it will fill. A norm
    still waiting means its consumer was skipped: refused."""
    if _PENDING.get() is not None:
        raise RuntimeError(_UNTAKEN)
    new_residual = torch.empty_like(residual)
    add_norm = AddNorm(residual, norm.weight, float(norm.variance_epsilon), new_residual)
    _PENDING.set(_DeferredNorm(rows, consumer, add_norm))
    return new_residual


def take(rows: torch.Tensor, consumer: torch.nn.Module) -> AddNorm | None:
    """The add-RMSNorm left to ``consumer`` for ``rows``, once; None when there is none."""
    pending = _PENDING.get()
    if pending is None or pending.rows is not rows or pending.consumer is not consumer:
        return None
    _PENDING.set(None)
    return pending.add_norm


def name_layer(original, decoder_layer, *args, **kwargs):
    """AROUND ``Qwen3DecoderLayer.forward``: inside ``deferred_norms()``, names the layer for the deferrals (SGLang's
    communicator does not know which modules consume its rows), and refuses a norm no consumer took."""
    if not _ON.get():
        return original(decoder_layer, *args, **kwargs)
    token = _LAYER.set(decoder_layer)
    try:
        out = original(decoder_layer, *args, **kwargs)
    finally:
        _LAYER.reset(token)
    if _PENDING.get() is not None:
        raise RuntimeError(_UNTAKEN)
    return out


def _qkv_takes(attn, rows: torch.Tensor) -> bool:
    """Qwen3's attention projects these rows with an unsharded, unquantized, bias-free qkv GEMM norm_gemm serves."""
    qkv = getattr(attn, "qkv_proj", None)
    weight = getattr(qkv, "weight", None)
    return (
        type(attn).__name__ == "Qwen3Attention"
        and type(qkv).__name__ == "QKVParallelLinear"  # its forward is the hooked one (a LoRA wrapper's is not)
        and not getattr(attn, "use_fused_qk_norm_mrope", False)
        and plain_linear(qkv)
        and getattr(qkv, "tp_size", None) == 1
        and isinstance(weight, torch.Tensor)
        and weight.dtype == rows.dtype == torch.bfloat16  # Qwen3's forward casts other rows to bf16 (a new tensor)
        and weight.is_contiguous()
        and weight.dim() == 2
        and weight.shape[1] == rows.shape[1]
        and rows.dim() == 2
        and 0 < rows.shape[0] <= GLU_MAX_ROWS
        and rows.stride(1) == 1
        and glu_norm_fits(weight.shape[0], rows.shape[1], glu=False)
    )


def defer_attn_norm(original, communicator, hidden_states, residual, forward_batch, *args, **kwargs):
    """AROUND ``LayerCommunicator.prepare_attn``: inside ``deferred_norms()``, where the communicator does nothing but
    the layer's input add-RMSNorm, SGLang's plain one (a residual; no all-reduce fusion, quantized output,
    post-residual addition, gather or latent qkv), and the layer's qkv GEMM can take it, returns the rows as they
    came and a new residual buffer; else SGLang's."""
    decoder_layer = layer()
    attn = getattr(decoder_layer, "self_attn", None)
    norm = getattr(communicator, "input_layernorm", None)
    simple = getattr(communicator, "_communicate_simple_fn", None)
    if not (
        decoder_layer is not None
        and getattr(simple, "__name__", None) == "_trivial"  # the norm's rows are the attention's, no gather
        and getattr(communicator, "qkv_latent_func", 0) is None
        and not args
        and not kwargs.get("quant_format")
        and kwargs.get("post_residual_addition") is None
        and not getattr(hidden_states, "_sglang_needs_allreduce_fusion", False)
        and plain_norm(norm, hidden_states, residual)
        and _qkv_takes(attn, hidden_states)
    ):
        return original(communicator, hidden_states, residual, forward_batch, *args, **kwargs)
    return hidden_states, leave(hidden_states, residual, norm, attn.qkv_proj)


def fuse_qkv_norm(original, linear, input_):
    """AROUND ``ColumnParallelLinear.forward``: the qkv projection a deferred input norm was left to runs it as its
    prologue (``norm_gemm``); every other call is SGLang's."""
    add_norm = take(input_, linear) if _ON.get() else None
    if add_norm is None:
        return original(linear, input_)
    return norm_gemm(input_, linear.weight, add_norm), None
