"""A Qwen3 draft layer's add-RMSNorms run by the GEMMs after them (``--pillar-draft-mlp fused_norm``,
patches/draft_norm.py): through the loaded plugin on SGLang's LayerCommunicator.prepare_attn / prepare_mlp,
ColumnParallelLinear.forward (the qkv projection) and Qwen2MLP.forward, the layer's output and its residuals those of
SGLang's path (its add-RMSNorms, the projections) within the roundings, SGLang's residuals left as they were; where a
norm is not SGLang's plain one or its consumer cannot take it, SGLang's norm runs; a norm no consumer took stops the
layer; the knob reaching the draft steps only.

SGLang 0.5.21 on norms Qwen3 through its layer boundary, which the plugin leaves alone (no communicator: skipped).
Without a GPU the kernels run in Triton's CPU interpreter (see triton_env.py); with CUDA they run compiled.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.linear import QKVParallelLinear
from sglang.srt.layers.quantization.unquant import UnquantizedLinearMethod
from sglang.srt.models.qwen2 import Qwen2MLP
from sglang.srt.models.qwen3 import Qwen3Attention
from sglang_sparsespec.kernels.glu_gemm import GLU_MAX_ROWS
from sglang_sparsespec.patches import draft_mlp as dm
from sglang_sparsespec.patches import draft_norm as dn
from test_draft_mlp import HIDDEN, _mlp, _sglang_path, published  # noqa: F401 (the fixture, used by name below)
from triton_env import DEVICE

from sglang_sparsespec.config import DraftMlp

communicator = pytest.importorskip("sglang.srt.layers.communicator")
QKV = 2 * HIDDEN  # q, k and v columns of the stand-in attention


def _norm(seed: int) -> RMSNorm:
    norm = RMSNorm(HIDDEN, eps=1e-6)
    gen = torch.Generator().manual_seed(seed)
    norm.weight.data = (1 + 0.2 * torch.randn(HIDDEN, generator=gen)).to(torch.bfloat16).to(DEVICE)
    return norm


def _communicator(fn_name: str = "_simple") -> SimpleNamespace:
    """A LayerCommunicator's surface prepare_attn / prepare_mlp read on one rank: its two RMSNorms, the post-attention
    norm function (SGLang's own ``_simple``, or one named otherwise standing for the all-reduce / gather variants)
    and the trivial rows' communication after the input norm."""
    simple = communicator.CommunicateWithAllReduceAndLayerNormFn._simple
    fn = simple if fn_name == "_simple" else type(simple)(simple.__code__, simple.__globals__, fn_name)
    return SimpleNamespace(
        input_layernorm=_norm(1), post_attention_layernorm=_norm(2), _communicate_with_all_reduce_and_layer_norm_fn=fn,
        _communicate_simple_fn=communicator.CommunicateSimpleFn._trivial, qkv_latent_func=None, _context=None,
    )  # fmt: skip


def _qkv() -> QKVParallelLinear:
    """SGLang's QKVParallelLinear on one rank (its __init__ needs a TP group): the fields its forward reads."""
    linear = QKVParallelLinear.__new__(QKVParallelLinear)
    torch.nn.Module.__init__(linear)
    gen = torch.Generator().manual_seed(3)
    weight = (torch.randn(QKV, HIDDEN, generator=gen) / HIDDEN**0.5).to(torch.bfloat16).to(DEVICE)
    linear.weight = torch.nn.Parameter(weight, requires_grad=False)
    linear.bias, linear.skip_bias_add, linear.gather_output, linear.tp_size = None, False, False, 1
    linear.quant_method = UnquantizedLinearMethod()
    return linear


class _Wrapped(torch.nn.Module):
    """A module around the projection that calls it (as SGLang's LoRA layers do), with its weight and fields."""

    def __init__(self, inner: torch.nn.Module):
        super().__init__()
        self.inner = inner
        self.weight, self.bias, self.tp_size, self.quant_method = inner.weight, None, 1, inner.quant_method

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.inner(x)


def _layer() -> SimpleNamespace:
    attn = Qwen3Attention.__new__(Qwen3Attention)
    torch.nn.Module.__init__(attn)
    attn.qkv_proj = _qkv()
    return SimpleNamespace(self_attn=attn, mlp=_mlp(Qwen2MLP))


def _forward(comm: SimpleNamespace, batch: object):
    """Qwen3DecoderLayer.forward as SGLang writes it, the attention reduced to its qkv projection (its q columns,
    scaled, stand for the attention's output): prepare_attn, qkv, prepare_mlp, the MLP."""

    def forward(layer, hidden: torch.Tensor, residual: torch.Tensor):
        hidden, residual = communicator.LayerCommunicator.prepare_attn(comm, hidden, residual, batch)
        qkv, _ = layer.self_attn.qkv_proj(hidden)
        hidden, residual = communicator.LayerCommunicator.prepare_mlp(comm, qkv[:, :HIDDEN] * 0.5, residual, batch)
        return Qwen2MLP.forward(layer.mlp, hidden, forward_batch=batch), residual, qkv

    return forward


def _rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, HIDDEN, generator=gen).to(torch.bfloat16).to(DEVICE)
    return hidden, (4 * torch.randn(n, HIDDEN, generator=gen)).to(torch.bfloat16).to(DEVICE)


def _sglang_layer(comm: SimpleNamespace, layer: SimpleNamespace, hidden: torch.Tensor, residual: torch.Tensor):
    """SGLang's path on copies, outside the draft steps: its add-RMSNorms and projections, the MLP in plain torch."""
    lc = communicator.LayerCommunicator
    normed, residual = lc.prepare_attn(comm, hidden.clone(), residual.clone(), None)
    qkv = torch.nn.functional.linear(normed, layer.self_attn.qkv_proj.weight)
    normed, residual = lc.prepare_mlp(comm, qkv[:, :HIDDEN] * 0.5, residual, None)
    return _sglang_path(layer.mlp, normed), residual, qkv


def _record_leaves(monkeypatch) -> set[str]:
    """The consumers ("qkv", "mlp") the norms of a forward are left to, recorded as draft_norm.leave is called."""
    left: set[str] = set()
    leave = dn.leave

    def recorded(rows: torch.Tensor, residual: torch.Tensor, norm: RMSNorm, consumer: torch.nn.Module):
        left.add("mlp" if isinstance(consumer, Qwen2MLP) else "qkv")
        return leave(rows, residual, norm, consumer)

    monkeypatch.setattr(dn, "leave", recorded)
    return left


@pytest.mark.usefixtures("published")
def test_the_qkv_and_gate_up_kernels_run_the_layers_add_rms_norms(monkeypatch) -> None:
    left = _record_leaves(monkeypatch)
    comm, layer, batch = _communicator(), _layer(), object()
    hidden, residual = _rows(5, seed=1)
    expected, expected_residual, expected_qkv = _sglang_layer(comm, layer, hidden, residual)
    kept = residual.clone()
    with dm.fused_mlp(), dn.deferred_norms():
        out, new_residual, qkv = dn.name_layer(_forward(comm, batch), layer, hidden, residual)
        assert dn._PENDING.get() is None  # both norms taken
    assert left == {"qkv", "mlp"} and torch.equal(
        residual, kept
    )  # SGLang's residual untouched: each norm filled a buffer of its own
    torch.testing.assert_close(qkv.float(), expected_qkv.float(), rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(new_residual.float(), expected_residual.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(out.float(), expected.float(), rtol=5e-2, atol=5e-2)


@pytest.mark.usefixtures("published")
@pytest.mark.parametrize(
    "case, deferred",
    [
        ("norms off", set()),
        ("all-reduce", {"qkv"}),  # the post-attention norm's communicator does more than norm
        ("sharded qkv", {"mlp"}),
        ("wrapped qkv", {"mlp"}),  # a LoRA layer around the projection: its forward is not the hooked one
        ("fp32 residual", set()),
        ("rows", set()),  # past the kernels' 64 rows
        ("unnamed layer", set()),
    ],
)
def test_sglangs_add_rms_norm_runs_where_no_kernel_can_take_it(monkeypatch, case: str, deferred: set) -> None:
    left = _record_leaves(monkeypatch)
    comm = _communicator("_gather_hidden_states_and_residual" if case == "all-reduce" else "_simple")
    layer, batch = _layer(), object()
    if case == "fp32 residual":
        comm.input_layernorm.fp32_residual = comm.post_attention_layernorm.fp32_residual = True
    if case == "sharded qkv":
        layer.self_attn.qkv_proj.tp_size = 2
    if case == "wrapped qkv":
        layer.self_attn.qkv_proj = _Wrapped(layer.self_attn.qkv_proj)
    hidden, residual = _rows(GLU_MAX_ROWS + 1 if case == "rows" else 5, seed=2)
    expected, expected_residual, _ = _sglang_layer(comm, layer, hidden, residual)
    forward = _forward(comm, batch)
    with dm.fused_mlp(), dn.deferred_norms() if case != "norms off" else dm.fused_mlp():
        if case == "unnamed layer":
            out, new_residual, _ = forward(layer, hidden, residual)
        else:
            out, new_residual, _ = dn.name_layer(forward, layer, hidden, residual)
    assert left == deferred
    torch.testing.assert_close(out.float(), expected.float(), rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(new_residual.float(), expected_residual.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.usefixtures("published")
@pytest.mark.parametrize("then_mlp", [False, True])
def test_a_norm_no_consumer_took_stops_the_layer(then_mlp: bool) -> None:
    """A deferred norm whose rows reach something else than its consumer (here the layer skips the qkv call) would
    project un-normed rows: the layer raises, at its end or when the next norm would be left (before the MLP)."""
    comm, layer = _communicator(), _layer()
    hidden, residual = _rows(3, seed=4)

    def skips_qkv(layer, hidden: torch.Tensor, residual: torch.Tensor):
        hidden, residual = communicator.LayerCommunicator.prepare_attn(comm, hidden, residual, None)
        if then_mlp:
            hidden, residual = communicator.LayerCommunicator.prepare_mlp(comm, hidden * 0.5, residual, None)
            return Qwen2MLP.forward(layer.mlp, hidden), residual
        return hidden, residual

    with dm.fused_mlp(), dn.deferred_norms(), pytest.raises(RuntimeError, match="not taken"):
        dn.name_layer(skips_qkv, layer, hidden, residual)


@pytest.mark.parametrize("mode, norm", [(DraftMlp.FUSED_NORM, True), (DraftMlp.FUSED, False)])
def test_the_knob_defers_the_norms_in_draft_steps_only(monkeypatch, mode: DraftMlp, norm: bool) -> None:
    from test_draft_runner import probe_forwards

    assert probe_forwards(monkeypatch, dn._ON.get, draft_mlp=mode) == [norm, norm, False]
    assert probe_forwards(monkeypatch, dm._FUSE.get, draft_mlp=mode) == [True, True, False]
