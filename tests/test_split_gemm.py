"""The draft steps' down projection with its split-K sum inside the launch (kernels/split_gemm.py) against its
reference: row tails, column tails, repeated launches on one workspace (the counters back at zero, the sum the same
bits whichever slice finishes last), refused inputs.

Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs compiled.
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.split_gemm import SPLIT_K, SplitWorkspace, split_block_k, split_gemm, split_gemm_ref
from triton_env import DEVICE

K = SPLIT_K * 256


def _inputs(m: int, n: int, k: int, seed: int, dtype: torch.dtype = torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen)
    w = torch.randn(n, k, generator=gen) / k**0.5
    return x.to(dtype).to(DEVICE), w.to(dtype).to(DEVICE)


@pytest.mark.parametrize(
    "m, n, k, dtype",
    [
        (1, 64, 2 * K, torch.bfloat16),
        (19, 80, 3 * SPLIT_K * 128, torch.bfloat16),
        (64, 96, SPLIT_K * 32, torch.float16),
    ],
)
def test_the_split_sum_is_the_gemm(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    """Equal to the reference's slices summed in order, up to the rounding of each slice's own sum: 1 row, a partial
    row tile, 64 rows; a partial column tile (80 columns) and whole ones; K steps of 256, 128 and 32."""
    x, w = _inputs(m, n, k, seed=m + n, dtype=dtype)
    ws = SplitWorkspace.create(n, DEVICE)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
    assert split_gemm(x, w, ws, out) is out
    torch.testing.assert_close(out.float(), split_gemm_ref(x, w).float(), rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(out.float(), (x.float() @ w.float().T), rtol=2e-2, atol=2e-2)
    assert not ws.counters.any()  # every column tile's counter back at zero for the next launch


def test_launches_on_one_workspace_repeat_the_same_bits() -> None:
    x, w = _inputs(33, 64, K, seed=5)
    ws = SplitWorkspace.create(64, DEVICE)
    first = split_gemm(x, w, ws)
    other = split_gemm(x.flip(0).contiguous(), w, ws)  # another launch in between uses the same slices
    assert torch.equal(split_gemm(x, w, ws), first)
    torch.testing.assert_close(other.flip(0).float(), first.float(), rtol=1e-2, atol=1e-2)
    assert not ws.counters.any()


def test_it_refuses_what_it_cannot_compute() -> None:
    x, w = _inputs(4, 64, K, seed=1)
    ws = SplitWorkspace.create(64, DEVICE)
    assert (split_block_k(6144), split_block_k(768), split_block_k(SPLIT_K * 32 + 16)) == (256, 128, None)
    with pytest.raises(ValueError, match="multiple"):
        split_gemm(x[:, : K - 16].contiguous(), w[:, : K - 16].contiguous(), ws)
    with pytest.raises(ValueError, match="at most"):
        split_gemm(torch.cat([x] * 17), w, ws)
    with pytest.raises(ValueError, match="workspace"):
        split_gemm(x, w, SplitWorkspace.create(96, DEVICE))
    with pytest.raises(ValueError, match="half-precision"):
        split_gemm(x.float(), w.float(), ws)
    assert split_gemm(x[:0], w, ws).shape == (0, 64)
