"""Draft steps' MLPs with gate/up and SiLU-and-mul in one launch (patches/draft_mlp.py): through the loaded plugin on
SGLang's own Qwen2MLP and LlamaMLP forwards (fused only inside ``fused_mlp()``, equal to SGLang's path up to the
product's rounding), which layers fuse and which keep SGLang's forward, and the knob reaching the draft runner.

Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs compiled.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt import runtime_context
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.models.llama import LlamaMLP
from sglang.srt.models.qwen2 import Qwen2MLP
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import ServerArgs
from sglang_sparsespec.modes import DraftMlp
from sglang_sparsespec.kernels.glu_gemm import GLU_MAX_ROWS, glu_gemm
from sglang_sparsespec.patches import draft_mlp as dm
from sglang_sparsespec.patches.contacts import resolve
from triton_env import DEVICE

HIDDEN, INTER = 64, 96


class _Linear(torch.nn.Module):
    """SGLang's linear-layer surface: ``weight``, ``quant_method``, ``bias``, and (out, bias) from a call."""

    def __init__(self, weight: torch.Tensor, method: object | None = None, bias: torch.Tensor | None = None):
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)
        self.quant_method = UnquantizedLinearMethod() if method is None else method
        self.bias = bias
        self.batches: list[object] = []

    def forward(self, x: torch.Tensor, forward_batch: object = None) -> tuple[torch.Tensor, None]:
        self.batches.append(forward_batch)
        return torch.nn.functional.linear(x, self.weight), None


class _Dual:
    """A release's DualGemm: whether SGLang's own fused gate/up path takes the call."""

    def __init__(self, runs: bool):
        self.runs = runs

    def can_run(self, x: torch.Tensor, gate_up: object) -> bool:
        return self.runs


def _mlp(cls: type, seed: int = 0, dtype: torch.dtype = torch.bfloat16, **odd: object) -> torch.nn.Module:
    """An instance of SGLang's MLP class ``cls`` on ``_Linear`` layers (its __init__ builds TP-sharded layers);
    ``odd``: attributes that make it unfusable."""
    gen = torch.Generator().manual_seed(seed)
    mlp = cls.__new__(cls)
    torch.nn.Module.__init__(mlp)
    mlp.gate_up_proj = _Linear((torch.randn(2 * INTER, HIDDEN, generator=gen) / HIDDEN**0.5).to(dtype).to(DEVICE))
    mlp.down_proj = _Linear((torch.randn(HIDDEN, INTER, generator=gen) / INTER**0.5).to(dtype).to(DEVICE))
    mlp.act_fn = SiluAndMul()
    mlp.dual_gemm = _Dual(False)  # SGLang's own fused path (0.5.22 on), here never runnable
    if "gate_method" in odd:
        mlp.gate_up_proj.quant_method = odd.pop("gate_method")
    if "gate_bias" in odd:
        mlp.gate_up_proj.bias = odd.pop("gate_bias")
    for name, value in odd.items():
        setattr(mlp, name, value)
    return mlp


def _sglang_path(mlp: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """SGLang's MLP in plain torch: the gate/up product rounded to x's dtype, silu(gate) * up, the down GEMM."""
    gate, up = torch.nn.functional.linear(x, mlp.gate_up_proj.weight).float().chunk(2, dim=-1)
    return torch.nn.functional.linear((torch.nn.functional.silu(gate) * up).to(x.dtype), mlp.down_proj.weight)


@pytest.fixture
def published(llama_config_dir):
    """The loaded plugin and a scheduler's published ServerArgs (SGLang's MLP forwards read them)."""
    load_plugins()
    sa = resolve(ServerArgs(model_path=str(llama_config_dir), skip_tokenizer_init=True, device="cpu"))
    runtime_context.publish(sa, role="test")
    yield
    runtime_context.reset_context()


@pytest.mark.parametrize("cls", [Qwen2MLP, LlamaMLP])
def test_the_loaded_plugin_fuses_sglangs_mlp_inside_draft_steps_only(published, monkeypatch, cls: type) -> None:
    launches: list[int] = []

    def counted(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        launches.append(x.shape[0])
        return glu_gemm(x, w)

    monkeypatch.setattr(dm, "glu_gemm", counted)
    mlp, batch = _mlp(cls), SimpleNamespace(forward_mode=SimpleNamespace(is_decode=lambda: False))
    x = torch.randn(5, HIDDEN, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(DEVICE)
    outside = cls.forward(mlp, x, batch)
    assert launches == []
    torch.testing.assert_close(outside.float(), _sglang_path(mlp, x).float(), rtol=3e-2, atol=3e-2)
    with dm.fused_mlp():
        inside = cls.forward(mlp, x, batch)
    assert launches == [5]
    # Qwen2MLP hands its batch to the down projection, LlamaMLP does not: the hook calls it as SGLang does
    assert mlp.down_proj.batches == [batch, batch] if cls is Qwen2MLP else [None, None]
    torch.testing.assert_close(inside.float(), outside.float(), rtol=3e-2, atol=3e-2)
    assert cls.forward(mlp, x, batch) is not None and launches == [5]  # the context's end restores SGLang's


@pytest.mark.parametrize(
    "rows, dtype, odd, fused",
    [
        (GLU_MAX_ROWS, torch.bfloat16, {}, True),
        (3, torch.float16, {"dual_gemm": _Dual(False)}, True),
        (GLU_MAX_ROWS + 1, torch.bfloat16, {}, False),  # a batch past the measured rows
        (3, torch.float32, {}, False),
        (3, torch.bfloat16, {"gate_method": SimpleNamespace()}, False),  # a quantized gate/up
        (3, torch.bfloat16, {"gate_bias": torch.zeros(2 * INTER)}, False),
        (3, torch.bfloat16, {"act_fn": torch.nn.GELU()}, False),
        (3, torch.bfloat16, {"dual_gemm": _Dual(True)}, False),  # SGLang's own fused path runs
    ],
)
def test_only_plain_mlps_fuse(published, rows: int, dtype: torch.dtype, odd: dict, fused: bool) -> None:
    calls: list[str] = []

    def original(mlp, x, forward_batch=None):
        calls.append("sglang")
        return x

    mlp = _mlp(LlamaMLP, dtype=torch.bfloat16 if dtype == torch.float32 else dtype, **odd)
    x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows)).to(dtype).to(DEVICE)
    with dm.fused_mlp():
        out = dm.fuse_llama_mlp(original, mlp, x)
    assert calls == ([] if fused else ["sglang"])
    if fused:
        torch.testing.assert_close(out.float(), _sglang_path(mlp, x).float(), rtol=3e-2, atol=3e-2)
    calls.clear()
    dm.fuse_qwen2_mlp(original, mlp, x)  # outside a draft step: always SGLang's
    assert calls == ["sglang"]


def test_an_odd_reduction_length_keeps_sglangs_forward(published) -> None:
    calls: list[str] = []
    mlp = _mlp(Qwen2MLP)
    mlp.gate_up_proj.weight.data = mlp.gate_up_proj.weight.data[:, :48].contiguous()
    with dm.fused_mlp():
        dm.fuse_qwen2_mlp(lambda *a, **k: calls.append("sglang"), mlp, torch.zeros(2, 48, dtype=torch.bfloat16))
    assert calls == ["sglang"]


@pytest.mark.parametrize("mode, fused", [(DraftMlp.FUSED, True), (DraftMlp.SGLANG, False)])
def test_the_knob_fuses_draft_steps_never_the_plain_step(monkeypatch, mode: DraftMlp, fused: bool) -> None:
    from test_draft_runner import probe_forwards

    assert probe_forwards(monkeypatch, dm._FUSE.get, draft_mlp=mode) == [fused, fused, False]
