"""Draft steps, and with ``--pillar-verify-logits half`` the verify, keep their logits in the LM head's dtype.

SGLang's logits processor copies every forward's logits to fp32 (``LogitsProcessor._copy_logits_to_buffer``): 28 us
of each draft step at 64 x 151,936 on an H200 (trace_qwen3-1.7b_round_h200_6c8d415) and 252 us of the verify's 576
rows (trace_qwen3-1.7b_round_h200_886f2d3), after which the samplers read twice the bytes. A draft step's logits
feed only the draft sampler, and a sampled verify's the acceptance (``stock_accept``), whose kernels widen each
value to fp32 as they load it (the same value: bf16 / fp16 -> fp32 is exact), so the hook hands those logits over in
the LM head's dtype: inside ``draft_step()`` as the LM head wrote them, and in TARGET_VERIFY forwards of a process
whose PILLAR worker asked for it (``keep_verify_logits``, set before its verify graphs are captured) in the first
half of SGLang's fp32 logits buffer (a copy of half the bytes, the buffer the graphs share). Compiled, a 2-byte row
may be summed in another order than its fp32 copy (Triton lays out loads by bytes), so probabilities can differ in
their last bits: a draft record's (the verify reads the record each draft was drawn from) and the target's (fp32
rounding of the same distribution, as any other summation order is). Every verify whose logits something else reads
or changes gets SGLang's fp32 values first (``PillarVerifyInput.accept``); every other forward keeps SGLang's copy,
and so do models with a final logit soft-cap, which is applied on that copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

_DRAFT_STEP: ContextVar[bool] = ContextVar("pillar_draft_step", default=False)
# One PILLAR worker a scheduler process; its config decides before the target's verify graphs are captured.
_KEEP_VERIFY = False


@contextmanager
def draft_step() -> Iterator[None]:
    """A draft step's forward: its logits stay in the LM head's dtype."""
    token = _DRAFT_STEP.set(True)
    try:
        yield
    finally:
        _DRAFT_STEP.reset(token)


def in_draft_step() -> bool:
    """Whether the current forward is a draft step's."""
    return _DRAFT_STEP.get()


def keep_verify_logits(keep: bool) -> None:
    """Whether this process's TARGET_VERIFY forwards keep their logits in the LM head's dtype."""
    global _KEEP_VERIFY
    _KEEP_VERIFY = keep


def _verify_forward(logits_metadata) -> bool:
    return _KEEP_VERIFY and logits_metadata is not None and logits_metadata.forward_mode.is_target_verify()


def keep_draft_logits(original, processor, logits, logits_metadata, *args, **kwargs):
    """AROUND ``LogitsProcessor._copy_logits_to_buffer``: in a draft step, or a verify forward of a process that
    keeps them, half-precision logits without a soft-cap are returned in their dtype (cut to the vocabulary, as
    SGLang cuts them; a graphed verify's in SGLang's shared buffer); else SGLang's copy."""
    draft = _DRAFT_STEP.get()
    keep = (
        (draft or _verify_forward(logits_metadata))
        and logits.dtype in (torch.bfloat16, torch.float16)
        and not getattr(processor, "final_logit_softcapping", None)
        and kwargs.get("softcap") is None
    )
    if not keep:
        return original(processor, logits, logits_metadata, *args, **kwargs)
    vocab = processor.vocab_size
    logits = logits[:, :vocab] if logits.shape[-1] > vocab else logits
    use_buffer = kwargs.get("use_buffer", args[0] if args else True)
    buffer = logits_metadata.next_token_logits_buffer if use_buffer and not draft else None
    if buffer is None or tuple(buffer.shape) != tuple(logits.shape) or not buffer.is_contiguous():
        return logits
    # A captured verify's output stays alive with its graph: one per batch size, 1.8 GB of bf16 rows at 64 x 9 x
    # 151,936 over SGLang's 27 sizes. The graphs share SGLang's fp32 logits buffer instead; its first half holds
    # the rows in the LM head's dtype (a copy of half the bytes of SGLang's).
    kept = buffer.view(-1).view(logits.dtype)[: logits.numel()].view(logits.shape)
    kept.copy_(logits)
    return kept
