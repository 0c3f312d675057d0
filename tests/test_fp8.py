"""fp8 copies with one scale a row (sglang_sparsespec/fp8.py): the weight's copy in row chunks equal to one piece,
the step's activations as the weight's rows are quantized, and the scaled product's error against the exact one."""

from __future__ import annotations

import torch
from sglang_sparsespec.fp8 import FP8, FP8_MAX, quantize_activations, quantize_rows, scaled_logits
from triton_env import DEVICE


def _rows(m: int, k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    # rows of very different magnitudes, one all zero: per-row scales must keep each one's resolution
    x = torch.randn(m, k, generator=gen) * torch.logspace(-3, 1, m)[:, None]
    x[1] = 0
    return x.to(torch.bfloat16).to(DEVICE)


def test_quantizing_in_row_chunks_gives_the_whole_weights_quantization() -> None:
    w = _rows(70, 32, seed=3)
    whole, whole_scale = quantize_rows(w, chunk=1024)
    parts, parts_scale = quantize_rows(w, chunk=16)  # 70 rows: four full chunks and a partial one
    assert torch.equal(parts.float(), whole.float()) and torch.equal(parts_scale, whole_scale)


def test_activations_are_quantized_as_weight_rows_are() -> None:
    x = _rows(9, 48, seed=4)
    x8, scale = quantize_activations(x)
    w8, w_scale = quantize_rows(x)
    assert x8.dtype == FP8 and torch.equal(x8.float(), w8.float()) and torch.equal(scale, w_scale)
    peaks = x8.float().abs().amax(dim=1)
    assert peaks[1] == 0 and torch.allclose(
        peaks[torch.arange(9, device=DEVICE) != 1], torch.tensor(FP8_MAX, device=DEVICE)
    )


def test_scaled_logits_stay_within_e4m3_rounding_of_the_exact_product() -> None:
    x, w = _rows(16, 64, seed=5), _rows(48, 64, seed=6)
    got = scaled_logits(x, *quantize_rows(w))
    assert got.dtype == x.dtype and got.shape == (16, 48)
    exact = x.float() @ w.float().T
    # e4m3 rounds each value within 2^-4 of itself relative to its row's peak (3 mantissa bits), on both sides of
    # the product: every output stays within ~2 x 2^-4 of its terms' absolute sum (+ bf16 rounding)
    terms = x.float().abs() @ w.float().abs().T
    assert ((got.float() - exact).abs() <= 0.13 * terms + 0.004 * exact.abs() + 1e-6).all()
    assert ((got.float() - exact).abs() / terms.clamp_min(1e-6)).median() < 0.02
