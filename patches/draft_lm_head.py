"""Draft steps score their rows on a draft vocabulary (``--pillar-draft-vocab N``) or an fp8 copy of the LM head
(``--pillar-draft-lm-head fp8``).

``use_draft_vocab`` registers an LM head's ``DraftVocab`` (``sglang_sparsespec/draft_vocab.py``: the N ids the
server commits most, their rows gathered); inside ``draft_step()`` the hook below replaces
``LogitsProcessor._compute_lm_head``'s GEMM with one over those rows, so the step's logits are [n, N] and the draft
runner maps its picks back to token ids. ``prepare_fp8_lm_head`` quantizes the target's LM head once per process
(one scale an output row, ``sglang_sparsespec/fp8.py``), before any draft graph is captured; in a draft step the
hook then runs cuBLAS's fp8 GEMM on that copy and the step's rows quantized per row. Either only where SGLang's own
path is a plain GEMM of the hidden rows and the LM head's weight: half-precision weight and rows, no bias, no LoRA,
no LM-head quantization, no fp32 LM head or output, no RL on-policy target, no caller-owned output. Every other
forward (the verify, the plain step, prefill) runs SGLang's, so only drafts, and so only acceptance, see either.
"""

from __future__ import annotations

import logging

import torch
from sglang_sparsespec.draft_vocab import DraftVocab
from sglang_sparsespec.fp8 import quantize_rows, scaled_logits

from .draft_logits import in_draft_step

logger = logging.getLogger(__name__)

# Quantization methods of an LM head whose forward is SGLang's plain GEMM of the weight.
_PLAIN_METHODS = frozenset({"UnquantizedEmbeddingMethod", "UnquantizedLinearMethod"})
# The fp8 copy of each prepared LM head (by module id: a process has one target model): (rows [V, K], scales [V]).
_COPIES: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
# The draft vocabulary of each registered LM head (by module id).
_VOCABS: dict[int, DraftVocab] = {}


def _plain_head(lm_head: torch.nn.Module) -> bool:
    """An LM head whose forward is SGLang's plain GEMM of a half-precision weight."""
    weight = getattr(lm_head, "weight", None)
    return (
        isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and weight.dtype in (torch.bfloat16, torch.float16)
        and not hasattr(lm_head, "set_lora")
        and (getattr(lm_head, "quant_method", None) is None or type(lm_head.quant_method).__name__ in _PLAIN_METHODS)
    )


def use_draft_vocab(lm_head: torch.nn.Module, size: int) -> DraftVocab | None:
    """A draft vocabulary of ``size`` ids over ``lm_head``'s rows, registered for the draft steps; None (nothing
    registered) where the LM head is not plain or has no more rows than ``size``."""
    if not (_plain_head(lm_head) and size < lm_head.weight.shape[0]):
        logger.warning("PILLAR: --pillar-draft-vocab needs a plain half-precision LM head wider than it; scoring all")
        return None
    vocab = _VOCABS[id(lm_head)] = DraftVocab(lm_head.weight.detach(), size)
    return vocab


def prepare_fp8_lm_head(lm_head: torch.nn.Module) -> bool:
    """Quantize ``lm_head``'s weight for the draft steps; False (nothing kept) where it is not a plain half-precision
    weight whose rows cuBLAS's fp8 GEMM can take (16-divisible dims)."""
    plain = _plain_head(lm_head) and lm_head.weight.shape[0] % 16 == 0 and lm_head.weight.shape[1] % 16 == 0
    if not plain:
        logger.warning("PILLAR: --pillar-draft-lm-head fp8 needs a plain half-precision LM head; keeping SGLang's")
        return False
    _COPIES[id(lm_head)] = quantize_rows(lm_head.weight.detach())
    return True


def draft_lm_head(original, processor, hidden_states, lm_head, embedding_bias=None, **kwargs):
    """AROUND ``LogitsProcessor._compute_lm_head``: in a draft step, a registered LM head's logits over its draft
    vocabulary [n, N], else a prepared one's from its fp8 copy; else SGLang's."""
    key = id(lm_head) if in_draft_step() else None
    vocab, copy = _VOCABS.get(key), _COPIES.get(key)
    plain = (
        (vocab is not None or copy is not None)
        and embedding_bias is None
        and kwargs.get("out") is None
        and hidden_states.dim() == 2
        and hidden_states.dtype == lm_head.weight.dtype
        and not getattr(processor, "use_fp32_lm_head", False)
        and not getattr(processor, "use_fp32_lm_head_output", False)
        and getattr(processor, "rl_on_policy_target", None) is None
    )
    if not plain:
        return original(processor, hidden_states, lm_head, embedding_bias, **kwargs)
    if vocab is not None:
        return torch.matmul(hidden_states, vocab.rows.T)
    return scaled_logits(hidden_states, *copy)
