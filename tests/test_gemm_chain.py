"""The GEMM chain probe's five-launch draft layer (tools/gemm_chain.py) computes the layer that SGLang's sequence
computes (tools/layer_probe.py's DraftStep: add-RMSNorm, qkv, sparse attention, o, add-RMSNorm, gate/up,
SiLU-and-mul, down), up to bf16 rounding: its comparison on the GPU is then a comparison of times.

Without a GPU the kernels run in Triton's CPU interpreter (see triton_env.py), on SmolLM2-135M's layer sizes with
a few layers, rows and tokens; with CUDA they run compiled, with programmatic dependent launches and prefetch.
"""

from __future__ import annotations

import pytest
import torch
from tools import gemm_chain, kernels_setup, layer_probe
from triton_env import DEVICE, INTERPRET


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def test_fused_layers_compute_sglangs_layers(monkeypatch: pytest.MonkeyPatch) -> None:
    for module in (kernels_setup, layer_probe, gemm_chain):  # the probes allocate on their module's DEVICE
        monkeypatch.setattr(module, "DEVICE", DEVICE)
    torch.manual_seed(0)
    norm, silu_mul, _ = layer_probe.small_kernels()
    step = layer_probe.DraftStep("smollm2-135m", 4, 64, 1, norm, silu_mul)
    step.layers = step.layers[:2]
    x0, residual0 = step.x.clone(), step.residual.clone()
    expected = step.layers_output().clone()
    expected_residual = step.residual.clone()
    step.x.copy_(x0)
    step.residual.copy_(residual0)
    fused = gemm_chain.FusedLayers(step, gemm_chain.LAUNCHES["smollm2-135m"], overlap=not INTERPRET)
    got = fused.run()
    # the stream after the last layer's second add: in the first of the two buffers (2 adds a layer)
    got_residual = fused.residuals[0]
    # Rounding only, the interpreter's bf16 truncation included: each path attends the step's own key from its own
    # qkv GEMM (the compiled probe measured 1.4 %; 5 % is the bound its reading rule allows).
    assert _rel(got_residual, expected_residual) < 5e-2
    assert _rel(got, expected) < 5e-2
    # and the bounds mean something: the layers' input is far from their output
    assert _rel(step.x, expected) > 0.5


def test_the_stream_variants_read_the_chains_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """``Streams`` GEMMs every weight of the chain once: the merged layer's output is the layer's qkv, o and
    gate/up products side by side, and the flat GEMM's slice of a layer is that layer's merged output."""
    monkeypatch.setattr(gemm_chain, "DEVICE", "cpu")
    torch.manual_seed(0)
    chain = gemm_chain.Chain("smollm2-135m", 4)
    chain.weights = chain.weights[:3]
    streams = gemm_chain.Streams(chain)
    assert streams.bytes_per_layer == sum(w.numel() * 2 for w in (streams.wide[0], streams.down[0]))
    streams.run("cublas_merged")
    last = chain.weights[-1]
    expected = torch.cat([chain.x0.float() @ last[name].float().T for name in gemm_chain.WIDE], dim=1)
    assert _rel(streams.out["wide"], expected) < 1e-2
    assert _rel(streams.out["down"], streams.h.float() @ last["down"].float().T) < 1e-2
    merged_last = streams.out["wide"].clone()
    streams.run("cublas_flat")
    width = streams.wide[0].shape[0]
    assert _rel(streams.out["flat_wide"][:, -width:], merged_last) < 1e-2
    assert _rel(streams.out["flat_wide"][:, :width], merged_last) > 0.5  # another layer's weights
