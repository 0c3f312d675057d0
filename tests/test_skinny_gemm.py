"""The draft GEMM probe's kernel (tools/skinny_gemm.py) against its reference: bf16 weights and fp8 copies with
per-channel scales, split-K, row and column tails; the fp8 copy's error against the exact product; the add-RMSNorm
and SiLU-and-mul prologues and the down projection's partials summed inside the add-RMSNorm against SGLang's
separate steps; refused inputs.

Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs compiled.
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.fp8 import FP8_MAX, quantize_rows
from tools.skinny_gemm import add_norm_scale, prologue_ref, reduce_add_norm, skinny_gemm, skinny_gemm_ref
from triton_env import DEVICE


def _inputs(m: int, n: int, k: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    # channels of very different magnitudes, one all zero: per-channel scales must keep each one's resolution
    w = torch.randn(n, k, generator=gen) * torch.logspace(-3, 1, n)[:, None]
    w[3] = 0
    return x.to(DEVICE), w.to(torch.bfloat16).to(DEVICE)


@pytest.mark.parametrize("split_k, block_n", [(1, 32), (2, 32), (1, 16)])
@pytest.mark.parametrize("fp8", [False, True])
def test_skinny_gemm_matches_reference(split_k: int, block_n: int, fp8: bool) -> None:
    m, n, k = 19, 72, 128  # 19 rows: a partial row tile; 72 columns: a partial column tile
    x, w = _inputs(m, n, k, seed=split_k + 2 * fp8)
    scale = None
    if fp8:
        w, scale = quantize_rows(w)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    part = torch.empty(split_k, m, n, device=DEVICE)
    skinny_gemm(x, w, out, part, block_n=block_n, block_k=32, split_k=split_k, warps=4, stages=2, scale=scale)
    expected = skinny_gemm_ref(x, w, scale)
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_fp8_copies_keep_each_channel_close_to_the_exact_product() -> None:
    x, w = _inputs(8, 64, 256, seed=7)
    w8, scale = quantize_rows(w)
    assert w8.dtype == torch.float8_e4m3fn and scale.dtype == torch.float32
    peaks = w8.float().abs().amax(dim=1)
    assert torch.equal(peaks[3], torch.tensor(0.0, device=DEVICE))  # the zero channel stays zero
    assert torch.allclose(peaks[torch.arange(64, device=DEVICE) != 3], torch.tensor(FP8_MAX, device=DEVICE))
    out = torch.empty(8, 64, dtype=torch.bfloat16, device=DEVICE)
    skinny_gemm(x, w8, out, block_n=32, block_k=64, stages=2, scale=scale)
    exact = x.float() @ w.float().T
    # e4m3 rounds each weight within 2^-4 of itself relative to its channel (3 mantissa bits), whatever the
    # channel's magnitude: every output stays within that share of its terms' absolute sum (+ bf16 rounding)
    terms = x.float().abs() @ w.float().abs().T
    assert ((out.float() - exact).abs() <= 0.0625 * terms + 0.004 * exact.abs() + 1e-6).all()
    assert ((out.float() - exact).abs() / terms.clamp_min(1e-6))[:, 4:].median() < 0.01


def test_skinny_gemm_refuses_what_it_cannot_compute() -> None:
    x, w = _inputs(4, 32, 64, seed=1)
    out = torch.empty(4, 32, dtype=torch.bfloat16, device=DEVICE)
    w8, scale = quantize_rows(w)
    with pytest.raises(ValueError, match="not a multiple"):
        skinny_gemm(x, w, out, block_k=48)
    with pytest.raises(ValueError, match="fp8 with a scale"):
        skinny_gemm(x, w8, out, block_k=32)  # fp8 without its scale
    with pytest.raises(ValueError, match="fp8 with a scale"):
        skinny_gemm(x, w, out, block_k=32, scale=scale)  # a scale for exact weights
    with pytest.raises(ValueError, match="scratch"):
        skinny_gemm(x, w, out, block_k=32, split_k=2)
    with pytest.raises(ValueError, match="contiguous rows"):
        skinny_gemm(x, w[:, :32], out, block_k=32)


def test_prefetch_needs_a_programmatic_dependent_launch() -> None:
    x, w = _inputs(4, 32, 256, seed=0)
    with pytest.raises(ValueError, match="needs pdl"):
        skinny_gemm(x, w, torch.empty(4, 32, dtype=x.dtype, device=DEVICE), pdl=False, prefetch=True)


def _norm_inputs(m: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    residual = torch.randn(m, k, generator=gen) * 3
    weight = 1 + 0.2 * torch.randn(k, generator=gen)
    return residual.to(torch.bfloat16).to(DEVICE), weight.to(torch.bfloat16).to(DEVICE)


@pytest.mark.parametrize("block_n", [16, 32])
def test_add_norm_prologue_is_the_norm_then_the_gemm(block_n: int) -> None:
    m, n, k, eps = 19, 40, 256, 1e-6
    x, w = _inputs(m, n, k, seed=5)
    residual, weight = _norm_inputs(m, k, seed=6)
    residual_out = torch.full_like(residual, float("nan"))
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    skinny_gemm(x, w, out, block_n=block_n, block_k=64, stages=2, add_norm=(residual, residual_out, weight, eps))
    h = torch.empty_like(residual)
    a = prologue_ref(x, add_norm=(residual, h, weight, eps))
    # the new residual stream, as SGLang's fused add-RMSNorm leaves it (the interpreter may round bf16 otherwise)
    torch.testing.assert_close(residual_out, h, rtol=2**-7, atol=0.0)
    # each operand within a bf16 rounding (2^-8 of itself; the interpreter may round bf16 otherwise than the GPU)
    # and the output's own rounding: bounds relative to the terms' absolute sum, which cancellation cannot shrink
    scale = add_norm_scale(h, eps)
    terms = a.float().abs() @ w.float().abs().T * scale
    assert ((out.float() - a.float() @ w.float().T * scale).abs() <= 2**-7 * terms + 1e-3).all()
    # against SGLang's order (normalize, round to bf16, then the GEMM): the same up to those roundings
    normed = (h.float() * scale * weight.float()).to(torch.bfloat16)
    assert ((out.float() - normed.float() @ w.float().T).abs() <= 2**-6 * terms + 1e-3).all()


@pytest.mark.parametrize("split_k", [1, 2])
def test_silu_mul_prologue_is_the_activation_then_the_gemm(split_k: int) -> None:
    m, n, k = 19, 40, 256
    gate_up = torch.randn(m, 2 * k, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16).to(DEVICE)
    _, w = _inputs(1, n, k, seed=9)
    out = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device=DEVICE)
    part = torch.empty(split_k, m, n, device=DEVICE)
    skinny_gemm(gate_up, w, out, part, block_n=32, block_k=64, split_k=split_k, stages=2, silu_mul=True)
    a = prologue_ref(gate_up, silu_mul=True)
    terms = a.float().abs() @ w.float().abs().T  # bounds as in the add-norm test
    assert ((out.float() - a.float() @ w.float().T).abs() <= 2**-7 * terms + 1e-3).all()


def test_prologues_refuse_what_they_cannot_compute() -> None:
    x, w = _inputs(4, 32, 128, seed=2)
    out = torch.empty(4, 32, dtype=torch.bfloat16, device=DEVICE)
    residual, weight = _norm_inputs(4, 128, seed=3)
    with pytest.raises(ValueError, match="split_k = 1"):
        skinny_gemm(x, w, out, torch.empty(2, 4, 32, device=DEVICE), block_k=64, split_k=2,
                    add_norm=(residual, torch.empty_like(residual), weight, 1e-6))  # fmt: skip
    with pytest.raises(ValueError, match="another tensor"):
        skinny_gemm(x, w, out, block_k=64, add_norm=(residual, residual, weight, 1e-6))
    with pytest.raises(ValueError, match="one prologue"):
        skinny_gemm(x, w, out, block_k=64, add_norm=(residual, torch.empty_like(residual), weight, 1e-6),
                    silu_mul=True)  # fmt: skip
    with pytest.raises(ValueError, match="contiguous rows"):
        skinny_gemm(x, w, out, block_k=64, silu_mul=True)  # silu_mul reads [gate | up]: 2K columns


def test_reduce_add_norm_sums_the_partials_then_adds_and_normalizes() -> None:
    """The down projection's split-K partials left unsummed (reduce=False), then summed inside the residual add and
    RMSNorm: SGLang's GEMM then fused add-RMSNorm, up to bf16 roundings."""
    m, n, k, split_k, eps = 19, 48, 256, 4, 1e-6
    x, w = _inputs(m, n, k, seed=12)
    residual, weight = _norm_inputs(m, n, seed=13)
    part = torch.full((split_k, m, n), float("nan"), device=DEVICE)
    untouched = torch.full((m, n), 7.0, dtype=torch.bfloat16, device=DEVICE)
    skinny_gemm(x, w, untouched, part, block_n=16, block_k=64, split_k=split_k, stages=2, reduce=False)
    assert (untouched == 7.0).all() and not part.isnan().any()
    out, residual_out = torch.empty_like(residual), torch.empty_like(residual)
    reduce_add_norm(part, split_k, residual, weight, eps, out, residual_out)
    down = skinny_gemm_ref(x, w)
    h = (down.float() + residual.float()).to(torch.bfloat16)
    torch.testing.assert_close(
        residual_out.float(), h.float(), rtol=2**-7, atol=2**-7 * down.float().abs().max().item()
    )
    normed = h.float() * add_norm_scale(h, eps) * weight.float()
    torch.testing.assert_close(out.float(), normed, rtol=2**-6, atol=2**-6)
    with pytest.raises(ValueError, match="reduce=False"):
        skinny_gemm(x, w, untouched, part, block_k=64, reduce=False)
