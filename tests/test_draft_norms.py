"""Draft steps' decoder layers with their add-RMSNorms folded into the GEMMs (patches/draft_norms.py): through the
loaded plugin on SGLang's own Llama / Qwen2 / Qwen3 decoder-layer forwards and linear-layer classes, equal to the
layer's math (norm, attention, residual add, norm, MLP, residual add) up to rounding, with and without a residual
handed in; which layers fold and which keep SGLang's forward; an attention that skips its projections raises; the
knob reaches the draft steps only; the launch refuses it where the layers no longer take the residual.

Without a GPU the kernels run in Triton's CPU interpreter (see triton_env.py); with CUDA they run compiled.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt import runtime_context
from sglang.srt.layers.activation import SiluAndMul
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import QKVParallelLinear, RowParallelLinear
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.models.llama import LlamaDecoderLayer, LlamaMLP
from sglang.srt.models.qwen2 import Qwen2DecoderLayer
from sglang.srt.models.qwen3 import Qwen3DecoderLayer
from sglang.srt.plugins import load_plugins
from sglang.srt.server_args import ServerArgs
from sglang_sparsespec.config import DraftNorms
from sglang_sparsespec.kernels.glu_gemm import GLU_MAX_ROWS
from sglang_sparsespec.patches import draft_norms as dn
from sglang_sparsespec.patches import versions
from sglang_sparsespec.patches.contacts import FOLD_RELEASES, resolve
from triton_env import DEVICE

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 64, 4, 2, 16, 96
Q, KV = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
folding_release = pytest.mark.skipif(
    versions.INSTALLED not in FOLD_RELEASES,
    reason=f"the folded norms serve SGLang {FOLD_RELEASES[0]}-{FOLD_RELEASES[-1]}; refused on this release",
)


def _weight(rows: int, cols: int, gen: torch.Generator) -> torch.nn.Parameter:
    w = (torch.randn(rows, cols, generator=gen) / cols**0.5).to(torch.bfloat16).to(DEVICE)
    return torch.nn.Parameter(w, requires_grad=False)


def _linear(cls: type, rows: int, cols: int, gen: torch.Generator, **odd: object) -> torch.nn.Module:
    """An instance of SGLang's linear class ``cls`` at one rank (its __init__ builds TP-sharded layers)."""
    lin = cls.__new__(cls)
    torch.nn.Module.__init__(lin)
    lin.weight = _weight(rows, cols, gen)
    lin.quant_method, lin.bias, lin.skip_bias_add, lin.gather_output = UnquantizedLinearMethod(), None, False, False
    lin.tp_size, lin.tp_rank, lin.use_decode_attn_tp, lin.use_dp_attention_reduce = 1, 0, False, False
    for name, value in odd.items():
        setattr(lin, name, value)
    return lin


class _Attention(torch.nn.Module):
    """SGLang's attention contract: qkv_proj on the layer's rows, something of q, k and v, o_proj on the result.
    ``skips``: calls qkv_proj on a copy of the rows (a model whose attention the fold cannot follow)."""

    def __init__(self, gen: torch.Generator, skips: bool = False, **odd: object):
        super().__init__()
        self.qkv_proj = _linear(QKVParallelLinear, Q + 2 * KV, HIDDEN, gen, **odd)
        self.o_proj = _linear(RowParallelLinear, HIDDEN, Q, gen)
        self.skips = skips

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor, forward_batch: object) -> torch.Tensor:
        qkv, _ = self.qkv_proj(hidden_states.clone() if self.skips else hidden_states)
        q, k, v = qkv.split([Q, KV, KV], dim=-1)
        mixed = torch.sigmoid(q.float()) * torch.cat([v, k], dim=-1).float().repeat(1, Q // (2 * KV))
        out, _ = self.o_proj(mixed.to(hidden_states.dtype))
        return out


def _layer(cls: type, seed: int = 0, skips: bool = False, **odd: object) -> torch.nn.Module:
    """An instance of SGLang's decoder layer ``cls`` on stand-in attention and SGLang's LlamaMLP, RMSNorms with
    weights away from 1; ``odd``: attributes of its qkv projection."""
    gen = torch.Generator().manual_seed(seed)
    layer = cls.__new__(cls)
    torch.nn.Module.__init__(layer)
    layer.self_attn = _Attention(gen, skips, **odd)
    mlp = LlamaMLP.__new__(LlamaMLP)
    torch.nn.Module.__init__(mlp)
    mlp.gate_up_proj = _linear(RowParallelLinear, 2 * INTER, HIDDEN, gen)  # any plain one-rank linear layer
    mlp.down_proj = _linear(RowParallelLinear, HIDDEN, INTER, gen)
    mlp.act_fn = SiluAndMul()
    layer.mlp = mlp
    for name in ("input_layernorm", "post_attention_layernorm"):
        norm = RMSNorm(HIDDEN, eps=1e-6).to(DEVICE)
        norm.weight.data = (0.5 + torch.rand(HIDDEN, generator=gen)).to(DEVICE)
        setattr(layer, name, norm)
    return layer


def _rms(x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
    return x * torch.rsqrt(x.square().mean(dim=-1, keepdim=True) + norm.variance_epsilon) * norm.weight.float()


def _layer_math(layer: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """The decoder layer in fp32 torch: h + o(attention(norm(h))), then + down(silu(gate) * up of norm(h))."""
    attn, mlp = layer.self_attn, layer.mlp
    q, k, v = (_rms(h, layer.input_layernorm) @ attn.qkv_proj.weight.float().T).split([Q, KV, KV], dim=-1)
    h = h + (torch.sigmoid(q) * torch.cat([v, k], dim=-1).repeat(1, Q // (2 * KV))) @ attn.o_proj.weight.float().T
    gate, up = (_rms(h, layer.post_attention_layernorm) @ mlp.gate_up_proj.weight.float().T).chunk(2, dim=-1)
    return h + (torch.nn.functional.silu(gate) * up) @ mlp.down_proj.weight.float().T


@pytest.fixture
def published(llama_config_dir):
    """The loaded plugin and a scheduler's published ServerArgs."""
    load_plugins()
    sa = resolve(ServerArgs(model_path=str(llama_config_dir), skip_tokenizer_init=True, device="cpu"))
    runtime_context.publish(sa, role="test")
    yield
    runtime_context.reset_context()


def _rows(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (3 * torch.randn(n, HIDDEN, generator=gen)).to(torch.bfloat16).to(DEVICE)


@folding_release
@pytest.mark.parametrize("cls", [LlamaDecoderLayer, Qwen2DecoderLayer, Qwen3DecoderLayer])
@pytest.mark.parametrize("handed_residual", [False, True])
def test_the_loaded_plugin_folds_sglangs_layer_inside_draft_steps(published, cls: type, handed_residual: bool) -> None:
    """Through SGLang's hooked forwards: the folded layer equals the layer's math on h (= hidden + residual where
    a residual comes in) and hands (h, None) on, h updated in place when no residual came in."""
    layer, batch = _layer(cls), SimpleNamespace()
    hidden, residual = _rows(7, 1), _rows(7, 2) if handed_residual else None
    h = hidden.float() + (residual.float() if handed_residual else 0.0)
    with dn.folded_norms():
        out, passed = cls.forward(layer, torch.arange(7, device=DEVICE), hidden, batch, residual)
    assert passed is None and (out is hidden) != handed_residual
    expected = _layer_math(layer, h)
    torch.testing.assert_close(out.float(), expected, rtol=5e-2, atol=5e-2 * expected.abs().max().item())
    assert (out.float() - expected).abs().mean() < 2e-2 * expected.abs().mean()  # not the unnormalized rows'


@folding_release
def test_outside_draft_steps_and_for_odd_layers_sglangs_forward_runs(published) -> None:
    calls: list[str] = []

    def original(layer, positions, hidden, batch, residual, *args, **kwargs):
        calls.append("sglang")
        return hidden, residual

    fold = dn.fold_decoder_layer
    x, pos = _rows(3, 3), torch.arange(3, device=DEVICE)
    fold(original, _layer(LlamaDecoderLayer), pos, x, None, None)  # outside folded_norms()
    with dn.folded_norms():
        for layer, rows in [
            (_layer(LlamaDecoderLayer, tp_size=2), x),  # a sharded projection: its rank's sum needs the others'
            (_layer(LlamaDecoderLayer, quant_method=SimpleNamespace()), x),  # a quantized qkv projection
            (_layer(LlamaDecoderLayer, bias=torch.zeros(Q + 2 * KV)), x),
            (_layer(LlamaDecoderLayer), _rows(GLU_MAX_ROWS + 1, 4)),  # past the measured rows
            (_layer(LlamaDecoderLayer), x.float()),
        ]:
            fold(original, layer, pos, rows, None, None)
        fold(original, _layer(Qwen3DecoderLayer), pos, x, None, None, post_residual_addition=x)  # an extra input
        odd_norm = _layer(LlamaDecoderLayer)
        odd_norm.post_attention_layernorm.cast_x_before_out_mul = True
        fold(original, odd_norm, pos, x, None, None)
    assert calls == ["sglang"] * 8


@folding_release
def test_an_attention_the_fold_cannot_follow_raises(published) -> None:
    with dn.folded_norms(), pytest.raises(RuntimeError, match="--pillar-draft-norms sglang"):
        LlamaDecoderLayer.forward(_layer(LlamaDecoderLayer, skips=True), torch.arange(3), _rows(3, 5), None, None)


@folding_release
def test_the_linear_hooks_touch_only_the_folded_layers_modules(published) -> None:
    """With no layer folding, and for modules other than the folded layer's, the linear layers run SGLang's call."""
    gen = torch.Generator().manual_seed(6)
    qkv = _linear(QKVParallelLinear, Q + 2 * KV, HIDDEN, gen)
    x = _rows(2, 7)
    out, _ = QKVParallelLinear.forward(qkv, x)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, qkv.weight))
    other = _linear(QKVParallelLinear, Q + 2 * KV, HIDDEN, gen)
    layer = _layer(LlamaDecoderLayer)
    norm = (layer.input_layernorm.weight, 1e-6)
    token = dn._PENDING.set(dn._Pending(other, norm, layer.self_attn.o_proj, x))
    try:
        out, _ = QKVParallelLinear.forward(qkv, x)  # another module than the pending one
    finally:
        dn._PENDING.reset(token)
    torch.testing.assert_close(out, torch.nn.functional.linear(x, qkv.weight))


@pytest.mark.parametrize("mode, folded", [(DraftNorms.FOLDED, True), (DraftNorms.SGLANG, False)])
def test_the_knob_folds_draft_steps_never_the_plain_step(monkeypatch, mode: DraftNorms, folded: bool) -> None:
    from test_draft_runner import probe_forwards

    assert probe_forwards(monkeypatch, dn._FOLD.get, draft_norms=mode) == [folded, folded, False]


def test_the_launch_takes_the_knob_only_where_layers_take_the_residual(llama_config_dir, monkeypatch) -> None:
    from test_plugin import _args

    monkeypatch.setenv("SPARSESPEC_DRAFT_NORMS", "folded")
    if versions.INSTALLED in FOLD_RELEASES:
        assert _args(llama_config_dir).speculative_algorithm == "PILLAR"
    else:
        with pytest.raises(ValueError, match="--pillar-draft-norms sglang") as err:
            _args(llama_config_dir)
        assert "\n" not in str(err.value)
