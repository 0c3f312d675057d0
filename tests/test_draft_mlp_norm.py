"""A Qwen3 draft layer's post-attention add-RMSNorm run by the gate/up kernel (``--pillar-draft-mlp fused_norm``,
patches/draft_mlp.py): through the loaded plugin on SGLang's LayerCommunicator.prepare_mlp and Qwen2MLP.forward, the
layer's output and its new residual those of SGLang's path (its add-RMSNorm, then the MLP) within the roundings,
SGLang's residual left as it was; where the communicator does more than the norm, the norm is not plain, the MLP
cannot fuse or the layer is not named, SGLang's add-RMSNorm runs; the knob reaching the draft steps only.

SGLang 0.5.21 on norms Qwen3 through its layer boundary, which the plugin leaves alone (no communicator: skipped).
Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs compiled.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.models.qwen2 import Qwen2MLP
from sglang_sparsespec.kernels.glu_gemm import GLU_MAX_ROWS, glu_gemm
from sglang_sparsespec.patches import draft_mlp as dm
from test_draft_mlp import HIDDEN, _mlp, _sglang_path, published  # noqa: F401 (the fixture, used by name below)
from triton_env import DEVICE

from sglang_sparsespec.config import DraftMlp

communicator = pytest.importorskip("sglang.srt.layers.communicator")


def _communicator(fn_name: str = "_simple", seed: int = 0) -> SimpleNamespace:
    """A LayerCommunicator's surface prepare_mlp reads: its post-attention RMSNorm and norm function (SGLang's own
    ``_simple``, or one named otherwise standing for the all-reduce / scatter / gather variants)."""
    norm = RMSNorm(HIDDEN, eps=1e-6)
    gen = torch.Generator().manual_seed(seed)
    norm.weight.data = (1 + 0.2 * torch.randn(HIDDEN, generator=gen)).to(torch.bfloat16).to(DEVICE)
    simple = communicator.CommunicateWithAllReduceAndLayerNormFn._simple
    fn = simple if fn_name == "_simple" else type(simple)(simple.__code__, simple.__globals__, fn_name)
    return SimpleNamespace(
        post_attention_layernorm=norm, _communicate_with_all_reduce_and_layer_norm_fn=fn, _context=None
    )


def _layer(comm: SimpleNamespace, mlp: torch.nn.Module, batch: object):
    """Qwen3DecoderLayer.forward's MLP half, as SGLang writes it: prepare_mlp, then the MLP on its output."""

    def forward(layer, hidden: torch.Tensor, residual: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden, residual = communicator.LayerCommunicator.prepare_mlp(comm, hidden, residual, batch)
        return Qwen2MLP.forward(layer.mlp, hidden, forward_batch=batch), residual

    return SimpleNamespace(mlp=mlp), forward


def _rows(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, HIDDEN, generator=gen).to(torch.bfloat16).to(DEVICE)
    return hidden, (4 * torch.randn(n, HIDDEN, generator=gen)).to(torch.bfloat16).to(DEVICE)


def _sglang_layer(comm: SimpleNamespace, mlp: torch.nn.Module, hidden: torch.Tensor, residual: torch.Tensor):
    """SGLang's path on copies: its add-RMSNorm (in place), then the MLP in plain torch."""
    normed, new_residual = communicator.LayerCommunicator.prepare_mlp(comm, hidden.clone(), residual.clone(), None)
    return _sglang_path(mlp, normed), new_residual


@pytest.mark.usefixtures("published")
def test_the_gate_up_kernel_runs_the_layers_add_rms_norm(monkeypatch) -> None:
    norms: list[bool] = []

    def counted(x: torch.Tensor, w: torch.Tensor, add_norm) -> torch.Tensor:
        norms.append(add_norm is not None)
        return glu_gemm(x, w, add_norm=add_norm)

    monkeypatch.setattr(dm, "glu_gemm", counted)
    comm, mlp, batch = _communicator(), _mlp(Qwen2MLP), object()
    hidden, residual = _rows(5, seed=1)
    expected, expected_residual = _sglang_layer(comm, mlp, hidden, residual)
    kept = residual.clone()
    layer, forward = _layer(comm, mlp, batch)
    with dm.fused_mlp(norm=True):
        out, new_residual = dm.name_layer_mlp(forward, layer, hidden, residual)
        assert dm._PENDING.get() is None  # the MLP took the norm it was left
    assert norms == [True] and new_residual is not residual and torch.equal(residual, kept)
    torch.testing.assert_close(new_residual.float(), expected_residual.float(), rtol=2**-7, atol=0)
    torch.testing.assert_close(out.float(), expected.float(), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("case", ["norm off", "all-reduce", "fp32 residual", "rows", "unnamed layer"])
@pytest.mark.usefixtures("published")
def test_sglangs_add_rms_norm_runs_where_the_kernel_cannot_take_it(monkeypatch, case: str) -> None:
    norms: list[bool] = []

    def counted(x: torch.Tensor, w: torch.Tensor, add_norm) -> torch.Tensor:
        norms.append(add_norm is not None)
        return glu_gemm(x, w, add_norm=add_norm)

    monkeypatch.setattr(dm, "glu_gemm", counted)
    comm, mlp, batch = _communicator("_gather_hidden_states_and_residual" if case == "all-reduce" else "_simple"), \
        _mlp(Qwen2MLP), object()  # fmt: skip
    if case == "fp32 residual":
        comm.post_attention_layernorm.fp32_residual = True
    hidden, residual = _rows(GLU_MAX_ROWS + 1 if case == "rows" else 5, seed=2)
    expected, expected_residual = _sglang_layer(comm, mlp, hidden, residual)
    layer, forward = _layer(comm, mlp, batch)
    with dm.fused_mlp(norm=case != "norm off"):
        if case == "unnamed layer":
            out, new_residual = forward(layer, hidden, residual)
        else:
            out, new_residual = dm.name_layer_mlp(forward, layer, hidden, residual)
    assert True not in norms  # SGLang's norm: its residual, to the bit
    torch.testing.assert_close(new_residual.float(), expected_residual.float(), rtol=0, atol=0)
    torch.testing.assert_close(out.float(), expected.float(), rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("mode, norm", [(DraftMlp.FUSED_NORM, True), (DraftMlp.FUSED, False)])
def test_the_knob_defers_the_norm_in_draft_steps_only(monkeypatch, mode: DraftMlp, norm: bool) -> None:
    from test_draft_runner import probe_forwards

    assert probe_forwards(monkeypatch, dm._NORM.get, draft_mlp=mode) == [norm, norm, False]
    assert probe_forwards(monkeypatch, dm._FUSE.get, draft_mlp=mode) == [True, True, False]
