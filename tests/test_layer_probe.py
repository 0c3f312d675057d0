"""The layer probe (tools/layer_probe.py): its L2 prefetch kernel against its reference (shares that end in a partial
tile, and programs left with no share at all), and its attention launched as the draft steps launch it.

Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs compiled.
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.qk_prologue import rope_neox_ref
from tools import kernels_setup, layer_probe
from tools.layer_probe import prefetch_l2, prefetch_ref
from triton_env import DEVICE


@pytest.mark.parametrize("programs, block", [(4, 64), (8, 512)])  # (8, 512): programs 5-7 have nothing to read
def test_prefetch_sums_each_programs_share(programs: int, block: int) -> None:
    w = torch.randn(70, 33, generator=torch.Generator().manual_seed(programs)).to(torch.bfloat16).to(DEVICE)
    sums = torch.full((programs,), float("nan"), device=DEVICE)
    prefetch_l2(w, sums, block=block)
    torch.testing.assert_close(sums, prefetch_ref(w, programs, block=block), rtol=1e-4, atol=1e-3)
    assert prefetch_ref(w, programs, block=block).sum().item() == pytest.approx(w.float().sum().item(), abs=1e-2)


def test_prefetch_refuses_a_strided_weight() -> None:
    w = torch.randn(8, 64, device=DEVICE).to(torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous"):
        prefetch_l2(w[:, :32], torch.zeros(2, device=DEVICE))


def test_the_probes_attention_stores_the_steps_key_as_a_draft_step_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """The step's key, rotated at the last position, and its value land in that position's slot of the layer's
    pool, taken from the qkv GEMM's output that q comes from (SmolLM2-135M: rotary, no q/k norm)."""
    for module in (kernels_setup, layer_probe):  # the probe allocates on its module's DEVICE
        monkeypatch.setattr(module, "DEVICE", DEVICE)
    torch.manual_seed(0)
    norm, silu_mul, _ = layer_probe.small_kernels()
    step = layer_probe.DraftStep("smollm2-135m", 3, 48, 1, norm, silu_mul)
    assert "qk_norm" not in step.prologue
    layer, (h_q, h_kv, d) = step.layers[0], (step.shape.h_q, step.shape.h_kv, step.shape.d)
    k_new = step.qkv[:, h_q * d : (h_q + h_kv) * d].reshape(3, h_kv, d)
    v_new = step.qkv[:, (h_q + h_kv) * d :].reshape(3, h_kv, d)
    slots = step.req_to_token[torch.arange(3, device=DEVICE), step.seq_lens - 1].long()
    layer.k[slots] = 0
    layer.v[slots] = 0
    step.attend(layer, step.qkv[:, : step.q_cols].view(step.q_shape))
    cos_sin, positions = step.prologue["rope"]
    torch.testing.assert_close(
        layer.k[slots].float(), rope_neox_ref(k_new, cos_sin, positions).float(), atol=2e-2, rtol=2e-2
    )
    assert torch.equal(layer.v[slots], v_new)


def test_a_qwen3_prologue_normalizes_q_and_k() -> None:
    """Qwen3's shape adds the per-head q/k RMS norm (unit weights) to the store and rotary; SmolLM2's does not."""
    shapes = {s.name: s for s in kernels_setup.SHAPES}
    seq_lens = torch.tensor([5, 7], device=DEVICE)
    req_to_token = torch.arange(16, dtype=torch.int32, device=DEVICE).view(2, 8)
    for name, normed in (("qwen3-1.7b", True), ("smollm2-135m", False)):
        shape = shapes[name]
        kv = torch.zeros(2, shape.h_kv, shape.d, device=DEVICE, dtype=torch.bfloat16)
        got = kernels_setup.draft_prologue(shape, kv, kv, req_to_token, seq_lens)
        assert got["new_kv"][2].tolist() == [4, 14]  # the slots of positions 4 and 6
        assert got["rope"][0].shape == (7, shape.d) and got["rope"][1].tolist() == [4, 6]
        assert ("qk_norm" in got) == normed
        if normed:
            assert got["qk_norm"][0].shape == got["qk_norm"][1].shape == (shape.d,)


def test_each_gemm_part_computes_its_product(monkeypatch: pytest.MonkeyPatch) -> None:
    """The part variants run one GEMM of every layer: o_addmm / down_addmm add the product into the residual
    stream, the others write what the served layer computes (SmolLM2-135M's shape, one layer)."""
    for module in (kernels_setup, layer_probe):
        monkeypatch.setattr(module, "DEVICE", DEVICE)
    torch.manual_seed(2)
    norm, silu_mul, _ = layer_probe.small_kernels()
    step = layer_probe.DraftStep("smollm2-135m", 3, 48, 1, norm, silu_mul)
    step.layers = step.layers[:1]
    layer = step.layers[0]
    before = step.residual.float().clone()
    step.call("part_down_addmm")()
    added = step.act.float() @ layer.down.float().T
    torch.testing.assert_close(step.residual.float(), before + added, rtol=3e-2, atol=3e-2)
    step.call("part_gate_up_glu")()
    gate, up = (step.x.float() @ layer.gate_up.float().T).chunk(2, dim=-1)
    torch.testing.assert_close(step.act.float(), torch.nn.functional.silu(gate) * up, rtol=3e-2, atol=3e-2)
    for name in layer_probe.PARTS:
        step.call(f"part_{name}")()  # every part runs
