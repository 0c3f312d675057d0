"""Draft steps run the MLP's gate/up projection and SiLU-and-mul as one launch (``kernels/glu_gemm.py``).

A decoder layer's MLP is SGLang's gate/up GEMM (cuBLAS, [M, 2N] out), its SiLU-and-mul kernel, then the down
projection. Inside ``fused_mlp()`` (the draft runner's draft steps, with ``--pillar-draft-mlp fused``) the hooks below
compute silu(gate) * up in the GEMM's epilogue and hand it to the layer's own down projection: one launch and one
gap less a layer of every draft step, and the [M, 2N] intermediate never written. Only where that is the same
computation: unquantized bf16 / fp16 gate/up and down projections without bias, SGLang's ``SiluAndMul``, at most
``GLU_MAX_ROWS`` rows, a reduction length the kernel steps through, and where SGLang has no fused path of its own
for the call (its dual GEMM, where a release has one and it can run). Everything else runs SGLang's forward. The
verify and the plain step never enter ``fused_mlp()``: only draft numerics change, so only acceptance can.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from sglang_sparsespec.kernels.glu_gemm import GLU_MAX_ROWS, glu_block_k, glu_gemm

from .plain_layers import plain_linear

_FUSE: ContextVar[bool] = ContextVar("pillar_fused_mlp", default=False)


@contextmanager
def fused_mlp() -> Iterator[None]:
    """A draft step's forward whose MLPs run gate/up and the activation as one launch where they can."""
    token = _FUSE.set(True)
    try:
        yield
    finally:
        _FUSE.reset(token)


def _fusable(mlp, x: torch.Tensor) -> bool:
    gate_up = getattr(mlp, "gate_up_proj", None)
    weight = getattr(gate_up, "weight", None)
    if not (
        isinstance(weight, torch.Tensor) and plain_linear(gate_up) and plain_linear(getattr(mlp, "down_proj", None))
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
    launch, then the layer's down projection as SGLang calls it; else SGLang's."""
    if not (_FUSE.get() and _fusable(mlp, x)):
        return original(mlp, x, forward_batch)
    out, _ = mlp.down_proj(glu_gemm(x, mlp.gate_up_proj.weight), forward_batch=forward_batch)
    return out


def fuse_llama_mlp(original, mlp, x, forward_batch=None):
    """AROUND ``LlamaMLP.forward`` (Llama, Mistral): as ``fuse_qwen2_mlp``; its down projection takes no batch."""
    if not (_FUSE.get() and _fusable(mlp, x)):
        return original(mlp, x, forward_batch)
    out, _ = mlp.down_proj(glu_gemm(x, mlp.gate_up_proj.weight))
    return out
