"""The draft steps' gate/up GEMM with its SiLU-and-mul epilogue (kernels/glu_gemm.py) against its reference and
against SGLang's two steps (the product rounded to the activations' dtype, then silu(gate) * up): row and column
tails, every K step, fp16; refused inputs.

Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs compiled.
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.glu_gemm import GLU_MAX_ROWS, glu_block_k, glu_gemm, glu_gemm_ref
from triton_env import DEVICE


def _inputs(m: int, n: int, k: int, seed: int, dtype: torch.dtype = torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=gen)
    w = torch.randn(2 * n, k, generator=gen) / k**0.5
    return x.to(dtype).to(DEVICE), w.to(dtype).to(DEVICE)


def _sglang_steps(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """SGLang's path: the GEMM's output in x's dtype, then silu(gate) * up in fp32."""
    gate, up = (x.float() @ w.float().T).to(x.dtype).float().chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


@pytest.mark.parametrize(
    "m, n, k, dtype",
    [
        (1, 64, 128, torch.bfloat16),
        (19, 40, 256, torch.bfloat16),
        (64, 96, 96, torch.bfloat16),
        (33, 72, 64, torch.float16),
    ],
)
def test_glu_gemm_is_the_gemm_then_the_activation(m: int, n: int, k: int, dtype: torch.dtype) -> None:
    """Equal to the fp32 reference up to the output's rounding, and to SGLang's two steps up to the product's
    rounding, bounded from the terms' absolute sums: 1 row, a partial row tile, 64 rows, partial column tiles
    (40, 72, 96 columns), K steps of 128, 64 and 32."""
    x, w = _inputs(m, n, k, seed=m + n + k, dtype=dtype)
    out = torch.full((m, n), float("nan"), dtype=dtype, device=DEVICE)
    assert glu_gemm(x, w, out) is out
    ref = glu_gemm_ref(x, w)
    torch.testing.assert_close(out.float(), ref.float(), rtol=1e-2, atol=1e-2)
    gate, up = (x.float() @ w.float().T).chunk(2, dim=-1)
    t_gate, t_up = (x.float().abs() @ w.float().abs().T).chunk(2, dim=-1)
    unit = 2**-7 if dtype == torch.bfloat16 else 2**-10
    # a product rounded within `unit` of its terms' absolute sum moves silu(gate) * up by at most this much
    bound = unit * (t_gate * up.abs() + (gate.abs() + t_gate) * t_up) + unit * out.float().abs() + 1e-3
    assert ((out.float() - _sglang_steps(x, w)).abs() <= bound).all()


def test_glu_gemm_allocates_its_output_and_skips_empty_batches() -> None:
    x, w = _inputs(5, 32, 64, seed=3)
    out = glu_gemm(x, w)
    assert out.shape == (5, 32) and out.dtype == x.dtype
    torch.testing.assert_close(out.float(), glu_gemm_ref(x, w).float(), rtol=1e-2, atol=1e-2)
    assert glu_gemm(x[:0], w).shape == (0, 32)


def test_glu_block_k_divides_k_or_refuses() -> None:
    assert [glu_block_k(k) for k in (2048, 576, 96, 48)] == [128, 64, 32, None]


def test_glu_gemm_refuses_what_it_cannot_compute() -> None:
    x, w = _inputs(4, 32, 64, seed=5)
    with pytest.raises(ValueError, match=r"w \[2N, K\]"):
        glu_gemm(x, w[:-1])
    with pytest.raises(ValueError, match="half-precision"):
        glu_gemm(x, w.float())
    with pytest.raises(ValueError, match="multiple of 32"):
        glu_gemm(x[:, :48], w[:, :48].contiguous())
    with pytest.raises(ValueError, match="at most"):
        glu_gemm(torch.zeros(GLU_MAX_ROWS + 1, 64, dtype=x.dtype, device=DEVICE), w)
    with pytest.raises(ValueError, match="out must be"):
        glu_gemm(x, w, torch.empty(4, 31, dtype=x.dtype, device=DEVICE))
