"""Draft steps score their rows on an fp8 copy of the LM head (``--pillar-draft-lm-head fp8``).

``prepare_fp8_lm_head`` quantizes the target's LM head once per process (one scale an output row,
``sglang_sparsespec/fp8.py``), before any draft graph is captured; inside ``draft_step()`` the hook below replaces
``LogitsProcessor._compute_lm_head``'s bf16 GEMM with cuBLAS's fp8 GEMM on that copy and the step's rows quantized
per row. Only where SGLang's own path is a plain GEMM of the hidden rows and the LM head's weight: half-precision
weight and rows, no bias, no LoRA, no LM-head quantization, no fp32 LM head or output, no RL on-policy target.
Every other forward (the verify, the plain step, prefill) runs SGLang's, so only drafts, and so only acceptance,
see the copy's rounding.
"""

from __future__ import annotations

import logging

import torch
from sglang_sparsespec.fp8 import quantize_rows, scaled_logits

from .draft_logits import in_draft_step

logger = logging.getLogger(__name__)

# Quantization methods of an LM head whose forward is SGLang's plain GEMM of the weight.
_PLAIN_METHODS = frozenset({"UnquantizedEmbeddingMethod", "UnquantizedLinearMethod"})
# The fp8 copy of each prepared LM head (by module id: a process has one target model): (rows [V, K], scales [V]).
_COPIES: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def prepare_fp8_lm_head(lm_head: torch.nn.Module) -> bool:
    """Quantize ``lm_head``'s weight for the draft steps; False (nothing kept) where it is not a plain half-precision
    weight whose rows cuBLAS's fp8 GEMM can take (16-divisible dims)."""
    weight = getattr(lm_head, "weight", None)
    plain = (
        isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and weight.dtype in (torch.bfloat16, torch.float16)
        and weight.shape[0] % 16 == 0
        and weight.shape[1] % 16 == 0
        and not hasattr(lm_head, "set_lora")
        and (getattr(lm_head, "quant_method", None) is None or type(lm_head.quant_method).__name__ in _PLAIN_METHODS)
    )
    if not plain:
        logger.warning("PILLAR: --pillar-draft-lm-head fp8 needs a plain half-precision LM head; keeping SGLang's")
        return False
    _COPIES[id(lm_head)] = quantize_rows(weight.detach())
    return True


def fp8_draft_lm_head(original, processor, hidden_states, lm_head, embedding_bias=None, **kwargs):
    """AROUND ``LogitsProcessor._compute_lm_head``: in a draft step, a prepared LM head's logits from its fp8 copy;
    else SGLang's."""
    copy = _COPIES.get(id(lm_head)) if in_draft_step() else None
    plain = (
        copy is not None
        and embedding_bias is None
        and hidden_states.dim() == 2
        and hidden_states.dtype == lm_head.weight.dtype
        and not getattr(processor, "use_fp32_lm_head", False)
        and not getattr(processor, "use_fp32_lm_head_output", False)
        and getattr(processor, "rl_on_policy_target", None) is None
    )
    if not plain:
        return original(processor, hidden_states, lm_head, embedding_bias, **kwargs)
    return scaled_logits(hidden_states, *copy)
