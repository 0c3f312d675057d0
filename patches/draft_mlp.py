"""Draft steps run the MLP's gate/up projection and SiLU-and-mul as one launch (``kernels/glu_gemm.py``).

A decoder layer's MLP is SGLang's gate/up GEMM (cuBLAS, [M, 2N] out), its SiLU-and-mul kernel, then the down
projection. Inside ``fused_mlp()`` (the draft runner's draft steps, with ``--pillar-draft-mlp fused``) the hooks below
compute silu(gate) * up in the GEMM's epilogue and hand it to the layer's own down projection: one launch and one
gap less a layer of every draft step, and the [M, 2N] intermediate never written. With ``fused_down`` the down
projection of an unsharded layer is ``kernels/split_gemm.py`` too, which sums its split-K slices in its own launch
where cuBLAS runs a second one: another launch and gap less a layer. With ``fused_norm`` a Qwen3 layer's
post-attention add-RMSNorm becomes the gate/up kernel's prologue: SGLang's communicator hands the attention's output
on as it came, with a new buffer as the residual, and the MLP's kernel adds, normalizes and writes that residual
(SGLang 0.5.17-0.5.20, whose Qwen3 layer norms through ``LayerCommunicator.prepare_mlp``). Only where that is the
same computation: unquantized bf16 / fp16 gate/up and down projections without bias, SGLang's ``SiluAndMul``, at most
``GLU_MAX_ROWS`` rows, a reduction length the kernel steps through, a plain RMSNorm with no communication around it,
and where SGLang has no fused path of its own for the call (its dual GEMM, where a release has one and it can run).
Everything else runs SGLang's forward. The verify and the plain step never enter ``fused_mlp()``: only draft numerics
change, so only acceptance can.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from sglang_sparsespec.kernels.glu_gemm import GLU_MAX_ROWS, AddNorm, glu_block_k, glu_gemm, glu_norm_fits
from sglang_sparsespec.kernels.split_gemm import SplitWorkspace, split_block_k, split_gemm

from .draft_qk import plain_rms_norm


@dataclass(frozen=True)
class _DeferredNorm:
    """A post-attention add-RMSNorm left to the layer's MLP: the MLP called with ``hidden`` (the attention's output,
    handed on as it came) runs ``add_norm`` as its gate/up kernel's prologue."""

    hidden: torch.Tensor
    add_norm: AddNorm


_FUSE: ContextVar[bool] = ContextVar("pillar_fused_mlp", default=False)
_DOWN: ContextVar[SplitWorkspace | None] = ContextVar("pillar_fused_down", default=None)
_NORM: ContextVar[bool] = ContextVar("pillar_fused_norm", default=False)
_LAYER_MLP: ContextVar[torch.nn.Module | None] = ContextVar("pillar_layer_mlp", default=None)
_PENDING: ContextVar[_DeferredNorm | None] = ContextVar("pillar_deferred_norm", default=None)


@contextmanager
def fused_mlp(down: SplitWorkspace | None = None, norm: bool = False) -> Iterator[None]:
    """A draft step's forward whose MLPs run gate/up and the activation as one launch where they can; with ``down``
    (a workspace for the hidden size, used by this step's stream only) the down projection sums its split-K slices
    inside its own launch where it can; with ``norm`` the post-attention add-RMSNorm runs in the gate/up launch
    where it can."""
    tokens = _FUSE.set(True), _DOWN.set(down), _NORM.set(norm), _PENDING.set(None)
    try:
        yield
    finally:
        for var, token in zip((_FUSE, _DOWN, _NORM, _PENDING), tokens):
            var.reset(token)


def _down(mlp, act: torch.Tensor, **kwargs) -> torch.Tensor:
    """The layer's down projection of ``act``: one launch with its split sum inside ``fused_mlp(down)`` for an
    unquantized, unsharded projection (no all-reduce after it) at a width the workspace serves; else SGLang's."""
    ws, proj = _DOWN.get(), mlp.down_proj
    weight = getattr(proj, "weight", None)
    if (
        ws is not None
        and getattr(proj, "input_size_per_partition", None) == getattr(proj, "input_size", 0)  # unsharded
        and isinstance(weight, torch.Tensor)
        and weight.dtype == act.dtype
        and weight.is_contiguous()
        and weight.shape == (ws.parts.shape[2], act.shape[1])
        and split_block_k(act.shape[1]) is not None
    ):
        return split_gemm(act, weight, ws)
    out, _ = proj(act, **kwargs)
    return out


def _unquantized(linear) -> bool:
    """SGLang's plain linear layer: unquantized weights (an attribute a release lacks: not plain), no bias."""
    method = getattr(linear, "quant_method", None)
    return type(method).__name__ == "UnquantizedLinearMethod" and getattr(linear, "bias", None) is None


def _fusable(mlp, x: torch.Tensor) -> bool:
    gate_up = getattr(mlp, "gate_up_proj", None)
    weight = getattr(gate_up, "weight", None)
    if not (
        isinstance(weight, torch.Tensor) and _unquantized(gate_up) and _unquantized(getattr(mlp, "down_proj", None))
    ):
        return False
    dual = getattr(mlp, "dual_gemm", None)  # SGLang's own fused gate/up path (0.5.22 on): where it runs, it wins
    return (
        type(getattr(mlp, "act_fn", None)).__name__ == "SiluAndMul"
        and x.dim() == 2
        and 0 < x.shape[0] <= GLU_MAX_ROWS
        and x.dtype in (torch.bfloat16, torch.float16)
        and x.stride(1) == 1
        and weight.dtype == x.dtype
        and weight.is_contiguous()
        and weight.shape[1] == x.shape[1]
        and glu_block_k(x.shape[1]) is not None
        and not (dual is not None and dual.can_run(x, gate_up))
    )


def fuse_qwen2_mlp(original, mlp, x, forward_batch=None):
    """AROUND ``Qwen2MLP.forward`` (Qwen2 and Qwen3): inside ``fused_mlp()``, gate/up and SiLU-and-mul in one
    launch (with the add-RMSNorm ``defer_mlp_norm`` left to this call, if any), then the layer's down projection as
    SGLang calls it; else SGLang's."""
    add_norm = _take_norm(x)
    if add_norm is None and not (_FUSE.get() and _fusable(mlp, x)):
        return original(mlp, x, forward_batch)
    return _down(mlp, glu_gemm(x, mlp.gate_up_proj.weight, add_norm=add_norm), forward_batch=forward_batch)


def fuse_llama_mlp(original, mlp, x, forward_batch=None):
    """AROUND ``LlamaMLP.forward`` (Llama, Mistral): as ``fuse_qwen2_mlp``; its down projection takes no batch."""
    if not (_FUSE.get() and _fusable(mlp, x)):
        return original(mlp, x, forward_batch)
    return _down(mlp, glu_gemm(x, mlp.gate_up_proj.weight))


def name_layer_mlp(original, layer, *args, **kwargs):
    """AROUND ``Qwen3DecoderLayer.forward``: inside ``fused_mlp(norm=True)``, names the layer's MLP for
    ``defer_mlp_norm`` (SGLang's communicator does not know which module consumes its output)."""
    if not _NORM.get():
        return original(layer, *args, **kwargs)
    token = _LAYER_MLP.set(getattr(layer, "mlp", None))
    try:
        return original(layer, *args, **kwargs)
    finally:
        _LAYER_MLP.reset(token)


def defer_mlp_norm(original, communicator, hidden_states, residual, forward_batch, cache=None):
    """AROUND ``LayerCommunicator.prepare_mlp``: inside ``fused_mlp(norm=True)``, where the communicator only norms
    (no all-reduce, scatter or gather) and the layer's MLP runs the fused kernel on these rows, returns the
    attention's output as it came and a new buffer as the residual; the MLP's kernel adds, normalizes and fills
    it. Else SGLang's."""
    mlp, norm = _LAYER_MLP.get(), getattr(communicator, "post_attention_layernorm", None)
    fn = getattr(communicator, "_communicate_with_all_reduce_and_layer_norm_fn", None)
    hidden = hidden_states.shape[-1]
    if not (
        _NORM.get()
        and cache is None
        and getattr(fn, "__name__", None) == "_simple"
        and type(mlp).__name__ == "Qwen2MLP"  # the class fuse_qwen2_mlp hooks (Qwen3's MLP)
        and isinstance(residual, torch.Tensor)
        and residual.shape == hidden_states.shape
        and residual.dtype == hidden_states.dtype
        and residual.is_contiguous()
        and plain_rms_norm(norm, hidden)
        and getattr(norm, "fp32_residual", True) is False
        and _fusable(mlp, hidden_states)
        and glu_norm_fits(mlp.gate_up_proj.weight.shape[0] // 2, hidden)
    ):
        return original(communicator, hidden_states, residual, forward_batch, cache)
    new_residual = torch.empty_like(residual)
    add_norm = AddNorm(residual, norm.weight, float(norm.variance_epsilon), new_residual)
    _PENDING.set(_DeferredNorm(hidden_states, add_norm))
    return hidden_states, new_residual


def _take_norm(x: torch.Tensor) -> AddNorm | None:
    """The add-RMSNorm deferred for the rows ``x``, once; None when there is none."""
    pending = _PENDING.get()
    if pending is None or pending.hidden is not x:
        return None
    _PENDING.set(None)
    return pending.add_norm
