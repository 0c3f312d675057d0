"""A draft step's gate/up projection with SiLU-and-mul as its epilogue (``glu_gemm``): out [M, N] =
silu(x @ gate.T) * (x @ up.T) for w = [gate | up] rows [2N, K], SGLang's merged ``gate_up_proj`` layout, in one
launch at draft batch sizes (M <= ``GLU_MAX_ROWS``); plain-torch reference ``glu_gemm_ref``.

At those sizes the projection reads its whole weight once and its time is the weight's bytes. SGLang runs it as a
cuBLAS GEMM that writes [M, 2N], then its activation kernel reads that back: two launches and a gap. Here each
program reads the gate and the up rows of its BLOCK_N output columns into two fp32 accumulators over the whole of K
and writes silu(gate) * up once. On an H200 at Qwen3-1.7B's shape (M = 64, K = 2048, N = 6144;
draft_gemm_fused_h200_83a528f.json) the launch (64-column tiles, 128-wide K steps, 4 warps, 4 stages) takes 15.8 us
against 18.1 us for cuBLAS then SGLang's activation.

Numerics: the products stay fp32 through the activation, where SGLang rounds gate_up to the activations' dtype
first, so the rows differ from SGLang's by that rounding. Only draft steps use it: it moves acceptance, never the
output (the verify runs SGLang's MLP).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import skinny_operands

# Rows up to here run one program row (a 16-64-row tile); at 256 rows cuBLAS's gate/up alone beat the skinny tile
# (20.5 against 30.6 us, draft_gemm_h200_e8410c8.json), so larger batches keep SGLang's launches.
GLU_MAX_ROWS = 64
BLOCK_N = 64
WARPS = 4
STAGES = 4


@triton.jit
def _glu_gemm_kernel(
    X, W, Out, M, N, K, stride_xm, stride_wn, stride_om,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok, n_ok = offs_m[:, None] < M, offs_n[:, None] < N
    x_ptr = X + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    gate_ptr = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    up_ptr = gate_ptr + N.to(tl.int64) * stride_wn  # the up rows sit N rows below the gate rows
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        x = tl.load(x_ptr, mask=m_ok, other=0.0)
        gate = tl.dot(x, tl.trans(tl.load(gate_ptr, mask=n_ok, other=0.0)), gate)
        up = tl.dot(x, tl.trans(tl.load(up_ptr, mask=n_ok, other=0.0)), up)
        x_ptr += BLOCK_K
        gate_ptr += BLOCK_K
        up_ptr += BLOCK_K
    out = gate * tl.sigmoid(gate) * up
    ok = m_ok & (offs_n < N)[None, :]
    tl.store(Out + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :], out.to(Out.dtype.element_ty), mask=ok)


def glu_block_k(k: int) -> int | None:
    """The K step for a reduction of length ``k`` (128 where it divides k, else 64 or 32); None: no step divides
    it, and the caller keeps SGLang's launches."""
    return next((b for b in (128, 64, 32) if k % b == 0), None)


def glu_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor | None = None,
    block_n: int = BLOCK_N,
    block_k: int | None = None,
    warps: int = WARPS,
    stages: int = STAGES,
) -> torch.Tensor:
    """silu(x @ gate.T) * (x @ up.T) into ``out`` (default: a new [M, N] tensor in x's dtype); returns it.

    x: [M, K] with M <= GLU_MAX_ROWS, contiguous rows; w: [2N, K] = [gate | up] rows, contiguous, in x's dtype
    (bf16 or fp16); K a multiple of 32. The launch parameters (default: the measured launch; ``block_k``: by
    default ``glu_block_k``, else a divisor of K) change speed only.
    """
    if x.dim() != 2 or w.dim() != 2 or w.shape[0] % 2 or w.shape[1] != x.shape[1]:
        raise ValueError(f"x [M, K] and w [2N, K] expected, got {tuple(x.shape)} {tuple(w.shape)}")
    m, k = x.shape
    n = w.shape[0] // 2
    out = skinny_operands(x, w, n, out)
    block_k = glu_block_k(k) if block_k is None else block_k
    if block_k is None or k % block_k or m > GLU_MAX_ROWS:
        raise ValueError(f"K={k} must be a multiple of 32 (of block_k={block_k}) and M={m} at most {GLU_MAX_ROWS}")
    if m == 0:
        return out
    block_m = max(16, triton.next_power_of_2(m))
    _glu_gemm_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, block_m))](
        x, w, out, m, n, k, x.stride(0), w.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages, num_warps=warps,
    )  # fmt: skip
    return out


def glu_gemm_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Plain-torch ``glu_gemm``: fp32 products and activation, rounded to x's dtype once."""
    gate, up = (x.float() @ w.float().T).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)
