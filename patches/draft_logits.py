"""Draft steps keep their logits in the LM head's dtype: no fp32 copy.

SGLang's logits processor copies every forward's logits to fp32 (``LogitsProcessor._copy_logits_to_buffer``):
28 us of each draft step at 64 x 151,936 on an H200 (trace_qwen3-1.7b_round_h200_6c8d415), after which the
draft sampler reads twice the bytes. A draft step's logits feed only the draft sampler, whose kernels widen
each value to fp32 as they load it (the same value: bf16 / fp16 -> fp32 is exact), so inside ``draft_step()``
the hook hands the logits over as the LM head wrote them. Compiled, a 2-byte row may be summed in another
order than its fp32 copy (Triton lays out loads by bytes), so a record's probabilities can differ in their
last bits; the output stays exact either way, since the verify reads the record each draft was drawn from.
The plain-decoding step and every other forward keep SGLang's fp32 copy; so do models with a final logit
soft-cap, which is applied on that copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_DRAFT_STEP: ContextVar[bool] = ContextVar("pillar_draft_step", default=False)


@contextmanager
def draft_step() -> Iterator[None]:
    """A draft step's forward: its logits stay in the LM head's dtype."""
    token = _DRAFT_STEP.set(True)
    try:
        yield
    finally:
        _DRAFT_STEP.reset(token)


def keep_draft_logits(original, processor, logits, logits_metadata, *args, **kwargs):
    """AROUND ``LogitsProcessor._copy_logits_to_buffer``: inside ``draft_step()``, half-precision logits without a
    soft-cap are returned as they are (cut to the vocabulary, as SGLang cuts them); else SGLang's copy."""
    keep = (
        _DRAFT_STEP.get()
        and logits.dtype in (torch.bfloat16, torch.float16)
        and not getattr(processor, "final_logit_softcapping", None)
        and kwargs.get("softcap") is None
    )
    if not keep:
        return original(processor, logits, logits_metadata, *args, **kwargs)
    vocab = processor.vocab_size
    return logits[:, :vocab] if logits.shape[-1] > vocab else logits
