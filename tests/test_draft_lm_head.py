"""Draft steps' LM head on an fp8 copy or a draft vocabulary (patches/draft_lm_head.py): which LM heads get a copy
or a vocabulary, SGLang's own ``LogitsProcessor._compute_lm_head`` through the loaded plugin (the copy only inside a
draft step, within e4m3 rounding of the exact logits; the vocabulary's logits the exact ones of its ids), and every
processor setting that keeps SGLang's GEMM."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.plugins import load_plugins
from sglang_sparsespec.patches import draft_lm_head as dlh
from sglang_sparsespec.patches.draft_logits import draft_step
from triton_env import DEVICE

VOCAB, HIDDEN = 96, 64


class UnquantizedEmbeddingMethod:  # SGLang's name for an LM head's plain GEMM
    pass


def _head(seed: int = 0, rows: int = VOCAB, dtype: torch.dtype = torch.bfloat16, **odd: object) -> torch.nn.Module:
    head = torch.nn.Module()
    gen = torch.Generator().manual_seed(seed)
    head.weight = torch.nn.Parameter((torch.randn(rows, HIDDEN, generator=gen) / 8).to(dtype).to(DEVICE), False)
    head.quant_method = UnquantizedEmbeddingMethod()
    for name, value in odd.items():
        setattr(head, name, value)
    return head


def _processor(**flags: object) -> LogitsProcessor:
    """SGLang's processor with the fields ``_compute_lm_head`` reads (its __init__ needs a model config)."""
    processor = LogitsProcessor.__new__(LogitsProcessor)
    torch.nn.Module.__init__(processor)
    processor.use_fp32_lm_head, processor.use_fp32_lm_head_output, processor.rl_on_policy_target = False, False, None
    for name, value in flags.items():
        setattr(processor, name, value)
    return processor


@pytest.fixture(autouse=True)
def no_copies(monkeypatch):
    monkeypatch.setattr(dlh, "_COPIES", {})
    monkeypatch.setattr(dlh, "_VOCABS", {})


@pytest.mark.parametrize(
    "odd, kept",
    [
        ({}, True),
        ({"rows": 90}, False),  # cuBLAS's fp8 GEMM takes 16-divisible dims
        ({"dtype": torch.float32}, False),
        ({"quant_method": SimpleNamespace()}, False),  # a quantized LM head
        ({"set_lora": lambda *a: None}, False),
    ],
)
def test_only_plain_half_precision_lm_heads_get_a_copy(odd: dict, kept: bool) -> None:
    head = _head(**odd)
    assert dlh.prepare_fp8_lm_head(head) is kept
    assert (id(head) in dlh._COPIES) is kept
    assert dlh.prepare_fp8_lm_head(None) is False


def test_the_loaded_plugin_scores_draft_steps_on_the_copy_only() -> None:
    load_plugins()
    head, processor = _head(), _processor()
    x = (torch.randn(8, HIDDEN, generator=torch.Generator().manual_seed(1)) / 4).to(torch.bfloat16).to(DEVICE)
    sglang = LogitsProcessor._compute_lm_head(processor, x, head, None)
    assert torch.equal(sglang, x @ head.weight.T)
    with draft_step():  # not prepared: SGLang's
        assert torch.equal(LogitsProcessor._compute_lm_head(processor, x, head, None), sglang)
    dlh.prepare_fp8_lm_head(head)
    assert torch.equal(LogitsProcessor._compute_lm_head(processor, x, head, None), sglang)  # not a draft step
    with draft_step():
        drafted = LogitsProcessor._compute_lm_head(processor, x, head, None)
    assert drafted.dtype == sglang.dtype and not torch.equal(drafted, sglang)
    exact = x.float() @ head.weight.float().T
    terms = x.float().abs() @ head.weight.float().abs().T
    assert ((drafted.float() - exact).abs() <= 0.13 * terms + 0.004 * exact.abs() + 1e-6).all()


@pytest.mark.parametrize(
    "flags, bias",
    [
        ({"use_fp32_lm_head": True}, None),
        ({"use_fp32_lm_head_output": True}, None),
        ({"rl_on_policy_target": "fsdp"}, None),
        ({}, torch.zeros(VOCAB)),
    ],
)
def test_processor_settings_that_change_the_gemm_keep_sglangs(flags: dict, bias) -> None:
    head, calls = _head(), []
    dlh.prepare_fp8_lm_head(head)

    def original(processor, hidden_states, lm_head, embedding_bias=None, **kwargs):
        calls.append(kwargs)
        return hidden_states

    x = torch.zeros(4, HIDDEN, dtype=torch.bfloat16, device=DEVICE)
    with draft_step():
        dlh.draft_lm_head(original, _processor(**flags), x, head, bias, out=None)
        dlh.draft_lm_head(original, _processor(), x.float(), head)  # rows in another dtype
    assert calls == [{"out": None}, {}]


def test_the_loaded_plugin_scores_draft_steps_on_the_draft_vocabulary_only() -> None:
    load_plugins()
    head, processor = _head(), _processor()
    vocab = dlh.use_draft_vocab(head, 32)
    vocab.observe(torch.arange(40, 80, device=DEVICE))
    vocab.refresh()  # ties: the first 32 counted ids, 40..71
    x = (torch.randn(8, HIDDEN, generator=torch.Generator().manual_seed(2)) / 4).to(torch.bfloat16).to(DEVICE)
    full = LogitsProcessor._compute_lm_head(processor, x, head, None)
    assert full.shape == (8, VOCAB)  # not a draft step: SGLang's
    out = _out()
    with draft_step():
        drafted = LogitsProcessor._compute_lm_head(processor, x, head, None)
        kept = LogitsProcessor._compute_lm_head(processor, x, head, None, **out)
    assert vocab.ids.tolist() == list(range(40, 72))
    torch.testing.assert_close(drafted, full[:, 40:72])
    assert kept.shape == ((8, VOCAB) if out else (8, 32))  # a caller-owned output (0.5.23): SGLang's GEMM


def _out() -> dict:
    """SGLang 0.5.23's keyword for a caller-owned logits buffer, where the release takes it."""
    import inspect

    params = inspect.signature(LogitsProcessor._compute_lm_head).parameters
    return {"out": torch.empty(8, VOCAB, dtype=torch.bfloat16, device=DEVICE)} if "out" in params else {}


@pytest.mark.parametrize("odd", [{"dtype": torch.float32}, {"quant_method": SimpleNamespace()}, {"rows": 16}])
def test_only_plain_lm_heads_wider_than_it_get_a_draft_vocabulary(odd: dict) -> None:
    assert dlh.use_draft_vocab(_head(**odd), 16) is None and dlh._VOCABS == {}
    assert dlh.use_draft_vocab(None, 16) is None
