"""fp8 draft weights (``--pillar-draft-weights fp8``): draft steps read fp8 copies of the linear weights.

A draft step is a decode forward whose linear layers, at a few dozen rows, take the time of reading their
weights. Rejection sampling keeps PILLAR's output exact for any draft distribution it records, so the draft
steps may read per-channel fp8 copies (``kernels/skinny_gemm.py``: half the bytes) while the verify, the
plain-decoding steps and prefill read the exact weights. Only the draft runner's draft steps run inside
``FP8Weights.active()``; the hook on SGLang's ``UnquantizedLinearMethod.apply`` sends a layer to the fp8
kernel only there. CUDA graphs record the path that ran at capture: the draft-step graphs replay the fp8
GEMMs, every other graph the exact ones. The LM head, an embedding module that SGLang's logits processor
multiplies itself, is copied too and routed by a hook on ``LogitsProcessor._compute_lm_head`` (logits in the
activations' dtype, as the exact path writes them).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from sglang_sparsespec.kernels._common import num_sms
from sglang_sparsespec.kernels.skinny_gemm import decode_launch, quantize_rows, skinny_gemm

logger = logging.getLogger(__name__)

# Rows up to which a draft forward's GEMM reads the fp8 copy: one 64-row tile, so every program reads its
# weight columns once. Wider batches keep cuBLAS on the exact weights (bf16 skinny launches lost to cuBLAS at
# 256 rows: draft_gemm_h200_2021a7f.json).
MAX_ROWS = 64

_ACTIVE: ContextVar[FP8Weights | None] = ContextVar("pillar_fp8_draft_weights", default=None)


@dataclass
class FP8Weights:
    """fp8 copies [N, K] and per-channel scales [N] fp32 of the model's unquantized linear layers, by the layer."""

    table: dict[int, tuple[torch.Tensor, torch.Tensor]]
    nbytes: int

    @classmethod
    def build(cls, model: torch.nn.Module, device: torch.device) -> FP8Weights:
        """Copies of every linear layer SGLang runs through ``UnquantizedLinearMethod`` and of an unquantized LM
        head (``model.lm_head``, the embedding itself when tied), bf16 / fp16 weights only."""
        from sglang.srt.layers.quantization.unquant import UnquantizedEmbeddingMethod, UnquantizedLinearMethod

        if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
            major, minor = torch.cuda.get_device_capability(device)
            raise ValueError(
                f"--pillar-draft-weights fp8 needs fp8 support (compute capability 8.9+); "
                f"{torch.cuda.get_device_name(device)} has {major}.{minor}"
            )
        table, nbytes = {}, 0
        head = getattr(model, "lm_head", None)
        for module in model.modules():
            weight = getattr(module, "weight", None)
            method = getattr(module, "quant_method", None)
            if not (
                isinstance(method, UnquantizedLinearMethod)
                or (module is head and isinstance(method, UnquantizedEmbeddingMethod))
            ):
                continue
            if weight is None or weight.dim() != 2 or weight.dtype not in (torch.bfloat16, torch.float16):
                continue
            if decode_launch(*weight.shape, num_sms(device)) is None:
                continue  # no tile divides K: the layer keeps its exact weights in drafts too
            try:
                w8, scale = quantize_rows(weight.data)
            except torch.cuda.OutOfMemoryError:
                raise ValueError(
                    f"--pillar-draft-weights fp8: no GPU memory left for the fp8 copies ({nbytes / 1e9:.2f} GB made, "
                    f"more needed); lower --mem-fraction-static"
                ) from None
            table[id(module)] = (w8, scale)
            nbytes += w8.numel() + scale.numel() * 4
        if not table:
            raise ValueError("--pillar-draft-weights fp8: the model has no unquantized bf16 / fp16 linear layer")
        logger.info("PILLAR fp8 draft weights: %d linear layers, %.2f GB", len(table), nbytes / 1e9)
        return cls(table, nbytes)

    @contextmanager
    def active(self) -> Iterator[None]:
        """The draft steps' forward: linear layers in ``table`` read their fp8 copies."""
        token = _ACTIVE.set(self)
        try:
            yield
        finally:
            _ACTIVE.reset(token)


def _copy_for(layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fp8 copy a call of ``layer`` on ``x`` reads: inside ``FP8Weights.active()``, for a copied layer, at
    decode batch size; else None (SGLang's own path)."""
    weights = _ACTIVE.get()
    if weights is None:  # every linear call outside the draft steps (stock's included) stops here
        return None
    entry = weights.table.get(id(layer))
    rows = x.numel() // x.shape[-1] if x.dim() else 0
    return entry if entry is not None and 0 < rows <= MAX_ROWS else None


def fp8_draft_linear(original, method, layer, x, bias=None):
    """AROUND ``UnquantizedLinearMethod.apply``: a draft step's copied layer runs ``skinny_gemm`` on its fp8 copy;
    every other call runs SGLang's method."""
    entry = _copy_for(layer, x)
    if entry is None:
        return original(method, layer, x, bias)
    return _fp8_linear(x, *entry, bias)


def fp8_draft_lm_head(original, processor, hidden_states, lm_head, embedding_bias=None, **kwargs):
    """AROUND ``LogitsProcessor._compute_lm_head``: a draft step's logits from the LM head's fp8 copy, where SGLang
    would multiply the bf16 weight itself (no LoRA, no fp32 LM head: those keep SGLang's path)."""
    entry = _copy_for(lm_head, hidden_states)
    fp32 = getattr(processor, "use_fp32_lm_head", False) or getattr(processor, "use_fp32_lm_head_output", False)
    if entry is None or fp32 or hasattr(lm_head, "set_lora"):
        return original(processor, hidden_states, lm_head, embedding_bias, **kwargs)
    return _fp8_linear(hidden_states, *entry, embedding_bias)


def _fp8_linear(x: torch.Tensor, w8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    rows = x.numel() // x.shape[-1]
    x2 = x.reshape(rows, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    n, k = w8.shape
    block_n, block_k, split_k = decode_launch(n, k, num_sms(x.device))
    out = torch.empty((rows, n), dtype=x.dtype, device=x.device)
    part = torch.empty((split_k, rows, n), dtype=torch.float32, device=x.device) if split_k > 1 else None
    # 3 stages of a 64 x 128 bf16 and a 64 x 128 fp8 tile (72 KB) fit an Ada SM's shared memory and a Hopper's.
    skinny_gemm(x2, w8, out, part, block_n, block_k, split_k, warps=4, stages=3, scale=scale, bias=bias)
    return out.view(*x.shape[:-1], n)
