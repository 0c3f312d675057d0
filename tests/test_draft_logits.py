"""Draft steps, and verify forwards when asked, keep half-precision logits (no fp32 copy): where the hook hands
them over as they are, where it leaves SGLang's copy, that the draft runner's draft steps (and only they) run in
that context, and that the draft sampler draws the same tokens from the kept logits as from their fp32 copy."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang_sparsespec.kernels.draft_sample import DraftSampleInputs, draft_sample_fwd
from sglang_sparsespec.patches import draft_logits as dl
from triton_env import DEVICE


def _copy(processor, logits, logits_metadata, use_buffer=True, **kwargs):
    """Stands in for SGLang's copy: the fp32 logits cut to the vocabulary."""
    return logits[:, : processor.vocab_size].float()


@pytest.mark.parametrize("padded", [False, True])
def test_draft_steps_keep_half_precision_logits(padded: bool) -> None:
    processor = SimpleNamespace(vocab_size=50, final_logit_softcapping=None)
    logits = torch.randn(4, 64 if padded else 50, dtype=torch.bfloat16, device=DEVICE)
    assert dl.keep_draft_logits(_copy, processor, logits, None, use_buffer=True).dtype == torch.float32
    with dl.draft_step():
        kept = dl.keep_draft_logits(_copy, processor, logits, None, use_buffer=True)
        assert kept.dtype == torch.bfloat16 and kept.shape == (4, 50)
        assert kept.data_ptr() == logits.data_ptr()  # no copy
        torch.testing.assert_close(kept.float(), _copy(processor, logits, None), rtol=0, atol=0)
        # SGLang's copy stays where it does more than widen: a soft-cap, fp32 logits.
        capped = SimpleNamespace(vocab_size=50, final_logit_softcapping=30.0)
        assert dl.keep_draft_logits(_copy, capped, logits, None, use_buffer=True).dtype == torch.float32
        assert (
            dl.keep_draft_logits(_copy, processor, logits, None, use_buffer=True, softcap=30.0).dtype == torch.float32
        )
        assert dl.keep_draft_logits(_copy, processor, logits.float(), None).dtype == torch.float32
    assert dl.keep_draft_logits(_copy, processor, logits, None).dtype == torch.float32  # the context is left


def _meta(mode, buffer: torch.Tensor | None = None) -> SimpleNamespace:
    return SimpleNamespace(forward_mode=mode, next_token_logits_buffer=buffer)


@pytest.mark.parametrize("keep", [False, True])
def test_verify_forwards_keep_half_precision_logits_when_the_worker_asks(monkeypatch, keep: bool) -> None:
    """--pillar-verify-logits half: TARGET_VERIFY forwards hand their bf16 logits over, a graphed one in the first
    half of SGLang's shared fp32 buffer (no memory of its own), an eager one as the LM head wrote them; every other
    forward mode keeps SGLang's copy, and so does every verify with fp32 (the default)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    monkeypatch.setattr(dl, "_KEEP_VERIFY", False)
    dl.keep_verify_logits(keep)
    processor = SimpleNamespace(vocab_size=50, final_logit_softcapping=None)
    logits = torch.randn(9, 50, dtype=torch.bfloat16, device=DEVICE)
    modes = (ForwardMode.TARGET_VERIFY, ForwardMode.DECODE, ForwardMode.EXTEND)
    dtypes = [dl.keep_draft_logits(_copy, processor, logits, _meta(mode)).dtype for mode in modes]
    assert dtypes == [torch.bfloat16 if keep else torch.float32, torch.float32, torch.float32]
    capped = SimpleNamespace(vocab_size=50, final_logit_softcapping=30.0)
    assert dl.keep_draft_logits(_copy, capped, logits, _meta(ForwardMode.TARGET_VERIFY)).dtype == torch.float32
    buffer = torch.full((9, 50), float("nan"), device=DEVICE)
    graphed = dl.keep_draft_logits(_copy, processor, logits, _meta(ForwardMode.TARGET_VERIFY, buffer))
    eager = dl.keep_draft_logits(_copy, processor, logits, _meta(ForwardMode.TARGET_VERIFY))
    with dl.draft_step():  # a draft step's graphs keep their own rows
        draft = dl.keep_draft_logits(_copy, processor, logits, _meta(ForwardMode.DECODE, buffer))
    assert draft.data_ptr() == logits.data_ptr()
    if keep:
        assert graphed.dtype == torch.bfloat16 and graphed.data_ptr() == buffer.data_ptr()
        assert torch.equal(graphed, logits) and eager.data_ptr() == logits.data_ptr()
    else:
        assert torch.equal(graphed, logits.float()) and graphed.dtype == eager.dtype == torch.float32


def test_the_draft_runner_keeps_logits_in_draft_steps_only(monkeypatch) -> None:
    from test_draft_runner import probe_forwards

    assert probe_forwards(monkeypatch, dl._DRAFT_STEP.get) == [True, True, False]


def test_the_draft_sampler_draws_the_same_from_kept_logits_as_from_their_fp32_copy() -> None:
    """Tokens and candidate ids equal; the recorded probabilities equal up to the order the kernels sum a row
    in, which the GPU may lay out differently for 2-byte loads (float rounding, not a different draw)."""
    gen = torch.Generator().manual_seed(5)
    n, vocab, c = 6, 3000, 16
    padded = (torch.randn(n, vocab + 40, generator=gen) * 3).to(torch.bfloat16).to(DEVICE)
    kept = padded[:, :vocab]  # what a draft step hands over: rows strided past the vocabulary
    temp = torch.tensor([0.6, 1.0, 0.0, 1.3, 0.6, 2.0], device=DEVICE)
    top_p = torch.tensor([0.95, 1.0, 1.0, 0.9, 0.5, 0.99], device=DEVICE)
    top_k = torch.tensor([-1, 20, 1, -1, 5, -1], dtype=torch.int32, device=DEVICE)
    min_p = torch.zeros(n, device=DEVICE)
    noise = torch.empty((n, c)).exponential_(generator=gen).to(DEVICE)
    outs = []
    for logits in (kept, kept.float().contiguous()):
        out = (
            torch.empty(n, dtype=torch.int64, device=DEVICE),
            torch.empty((n, c), dtype=torch.int64, device=DEVICE),
            torch.empty((n, c), device=DEVICE),
            torch.empty(n, device=DEVICE),
        )
        draft_sample_fwd(DraftSampleInputs(logits, temp, top_p, top_k, min_p, noise), *out)
        outs.append(out)
    (tok, ids, q, q_tok), (tok32, ids32, q32, q_tok32) = outs
    assert torch.equal(tok, tok32) and torch.equal(ids, ids32)
    torch.testing.assert_close(q, q32, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(q_tok, q_tok32, rtol=1e-5, atol=1e-7)


def test_sglang_copy_is_skipped_through_the_loaded_plugin(monkeypatch) -> None:
    """Through SGLang's plugin loading, on SGLang's own LogitsMetadata: LogitsProcessor._copy_logits_to_buffer
    keeps a draft step's bf16 logits and, when the worker asks, a verify forward's; it copies every other
    forward's to fp32 as SGLang does."""
    from sglang.srt.layers.logits_processor import LogitsMetadata, LogitsProcessor
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.plugins import load_plugins

    load_plugins()
    monkeypatch.setattr(dl, "_KEEP_VERIFY", False)
    processor = SimpleNamespace(vocab_size=10, final_logit_softcapping=None)
    decode, verify = (LogitsMetadata(forward_mode=mode) for mode in (ForwardMode.DECODE, ForwardMode.TARGET_VERIFY))
    logits = torch.randn(2, 12, dtype=torch.bfloat16, device=DEVICE)
    with dl.draft_step():
        kept = LogitsProcessor._copy_logits_to_buffer(processor, logits, decode, use_buffer=True)
    copied = LogitsProcessor._copy_logits_to_buffer(processor, logits, decode, use_buffer=True)
    assert (kept.dtype, copied.dtype) == (torch.bfloat16, torch.float32)
    assert kept.shape == copied.shape == (2, 10) and torch.equal(kept.float(), copied)
    assert LogitsProcessor._copy_logits_to_buffer(processor, logits, verify).dtype == torch.float32
    dl.keep_verify_logits(True)
    assert LogitsProcessor._copy_logits_to_buffer(processor, logits, verify).dtype == torch.bfloat16
    assert LogitsProcessor._copy_logits_to_buffer(processor, logits, decode).dtype == torch.float32
