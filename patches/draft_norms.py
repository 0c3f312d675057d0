"""Draft steps fold each decoder layer's two add-RMSNorms into the GEMMs around them (``--pillar-draft-norms folded``).

A Llama / Qwen2 / Qwen3 decoder layer runs, on its residual stream h: add-RMSNorm, qkv, attention, o, add-RMSNorm,
gate/up, down; SGLang hands (hidden, residual) from layer to layer and each norm kernel adds the two first. An
RMSNorm scales each row by one number and each column by its weight g: norm(h) @ W.T = rsqrt(mean(h^2) + eps) *
((h * g) @ W.T). Inside ``folded_norms()`` (the draft runner's draft steps) a foldable layer runs as:
- qkv and gate/up read h itself (``kernels/glu_gemm.py`` with ``norm``): each program sums h's squares as it streams
  h over K, scales the tile by g before the product and each row in the epilogue;
- o and down add their products into h (``h.addmm_``: cuBLAS with beta 1, in place), the residual add in the GEMM;
so the layer launches neither norm kernel, and hands (h, None) on, which is how SGLang's own layer code reads the
first layer's input (the next layer folds or not; the model's final norm normalizes h alone).

The attention between qkv and o stays the model's own (its q/k norm, rotary and sparse kernel): the layer's call sets
what its qkv_proj and o_proj calls should do (``_Pending``) and the two linear-layer hooks below do it when they see
exactly those modules and h; a layer whose attention did not make both calls raises instead of drafting from
unnormalized rows. Foldable: tensor parallel size 1, SGLang's plain RMSNorms, unquantized linear layers without bias,
an MLP that ``draft_mlp`` would fuse (SiluAndMul, at most ``GLU_MAX_ROWS`` rows), no extra layer inputs. Every other
layer, and every verify and plain step, runs SGLang's forward. h is updated in place: in a draft step it is the
forward's own embedding output (the draft runner passes no input embeddings). Numerics: SGLang rounds the normalized
row before its GEMM, here h * g is rounded and the row scale applied to the fp32 sums: draft numerics only, which
move acceptance, never the output.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from sglang_sparsespec.kernels.glu_gemm import GLU_MAX_ROWS, Norm, glu_block_k, glu_gemm, norm_gemm

from .draft_mlp import fusable
from .plain_layers import plain_linear, plain_rms_norm

_FOLD: ContextVar[bool] = ContextVar("pillar_folded_norms", default=False)


@dataclass
class _Pending:
    """One layer's attention call: its qkv_proj reads ``h`` through ``norm``; its o_proj adds into ``h``."""

    reads: torch.nn.Module
    norm: Norm
    adds: torch.nn.Module
    h: torch.Tensor
    read: bool = False
    added: bool = False


_PENDING: ContextVar[_Pending | None] = ContextVar("pillar_folded_layer", default=None)


@contextmanager
def folded_norms() -> Iterator[None]:
    """A draft step's forward whose foldable decoder layers run without their norm kernels."""
    token = _FOLD.set(True)
    try:
        yield
    finally:
        _FOLD.reset(token)


def _norm_of(rms) -> Norm:
    return rms.weight, float(rms.variance_epsilon)


def _single_rank(linear) -> bool:
    """A plain linear layer whose call is its GEMM alone: one rank, no reduction, no decode-attention TP."""
    return (
        plain_linear(linear)
        and getattr(linear, "tp_size", 0) == 1
        and not getattr(linear, "use_decode_attn_tp", False)
        and getattr(linear, "use_dp_attention_reduce", False) is False
        and linear.weight.is_contiguous()
    )


def foldable(layer, h: torch.Tensor) -> bool:
    """Whether ``layer`` computes, on rows ``h``, what its folded form does (module docstring)."""
    attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
    qkv, o = getattr(attn, "qkv_proj", None), getattr(attn, "o_proj", None)
    if not (h.dim() == 2 and 0 < h.shape[0] <= GLU_MAX_ROWS and h.is_contiguous() and mlp is not None):
        return False
    size = h.shape[1]
    return (
        type(qkv).__name__ == "QKVParallelLinear"
        and type(o).__name__ == "RowParallelLinear"
        and all(_single_rank(lin) and lin.weight.dtype == h.dtype for lin in (qkv, o, mlp.down_proj))
        and getattr(mlp.gate_up_proj, "tp_size", 0) == 1
        and plain_rms_norm(getattr(layer, "input_layernorm", None), size)
        and plain_rms_norm(getattr(layer, "post_attention_layernorm", None), size)
        and glu_block_k(size) is not None
        and fusable(mlp, h)
    )


def fold_decoder_layer(original, layer, positions, hidden_states, forward_batch, residual, *args, **kwargs):
    """AROUND ``LlamaDecoderLayer.forward``, ``Qwen2DecoderLayer.forward`` and ``Qwen3DecoderLayer.forward``: inside
    ``folded_norms()`` a foldable layer runs folded and returns (h, None); else SGLang's."""
    if not (_FOLD.get() and not args and all(v is None for v in kwargs.values()) and foldable(layer, hidden_states)):
        return original(layer, positions, hidden_states, forward_batch, residual, *args, **kwargs)
    h = hidden_states if residual is None else hidden_states + residual  # after an unfolded layer: one add
    attn, mlp = layer.self_attn, layer.mlp
    pending = _Pending(attn.qkv_proj, _norm_of(layer.input_layernorm), attn.o_proj, h)
    token = _PENDING.set(pending)
    try:
        out = attn(positions=positions, hidden_states=h, forward_batch=forward_batch)
    finally:
        _PENDING.reset(token)
    if not (pending.read and pending.added and out is h):
        raise RuntimeError(
            f"{type(attn).__name__} did not call its qkv_proj on the layer's rows and its o_proj once each: "
            "its folded draft norms cannot run (launch with --pillar-draft-norms sglang)"
        )
    act = glu_gemm(h, mlp.gate_up_proj.weight, norm=_norm_of(layer.post_attention_layernorm))
    return h.addmm_(act, mlp.down_proj.weight.t()), None


def fold_qkv_proj(original, linear, input_, *args, **kwargs):
    """AROUND ``ColumnParallelLinear.forward``: a folded layer's qkv projection of h, through its input norm."""
    pending = _PENDING.get()
    if pending is None or linear is not pending.reads or input_ is not pending.h or args or kwargs or pending.read:
        return original(linear, input_, *args, **kwargs)
    pending.read = True
    return norm_gemm(input_, linear.weight, pending.norm), None


def fold_o_proj(original, linear, input_, *args, **kwargs):
    """AROUND ``RowParallelLinear.forward``: a folded layer's o projection, added into h in the GEMM."""
    pending = _PENDING.get()
    # Only the plain call: the batch may come along (it selects no reduction at one rank), nothing else
    plain = not args and all(v is None or v is False for k, v in kwargs.items() if k != "forward_batch")
    if pending is None or linear is not pending.adds or pending.added or input_.dim() != 2 or not plain:
        return original(linear, input_, *args, **kwargs)
    pending.added = True
    return pending.h.addmm_(input_, linear.weight.t()), None
