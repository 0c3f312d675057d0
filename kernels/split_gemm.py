"""A draft step's down projection in one launch (``split_gemm``): out [M, N] = x @ w.T at draft batch sizes
(M <= ``SPLIT_MAX_ROWS``), K split over SPLIT_K programs per column tile and the slices summed by the last of them to
finish; plain-torch reference ``split_gemm_ref``.

At 64 rows the projection's time is its weight's bytes, and a [64, N] output has too few column tiles to keep every
multiprocessor reading: cuBLAS splits K and sums the slices in a second launch (Qwen3-1.7B's down projection on the
H200: 9.5 us, then 2.2 us for the sum and a gap, 224 times a round; trace_qwen3-1.7b_round_h200_dc107e4). Here each
program writes its fp32 slice, then counts itself in its column tile's counter (acquire-release, GPU scope); the
program that counts last reads the SPLIT_K slices in slice order, so the sum is the same whichever finishes last, writes
the tile and resets the counter for the next launch. ``SplitWorkspace`` holds the slices and the counters (zero
between launches); one workspace serves one stream's launches one after another.

The launch is the fastest of the 144 the draft GEMM probe timed for that projection at 64 rows (32-column tiles,
K steps of 256, two slices, 4 warps, 4 stages: 11.3 us with a separate sum, draft_gemm_h200_2021a7f.json): its
64 x 2 = 128 programs, each filling one multiprocessor's shared memory, run in one wave on 132. Four slices made
256 programs, two waves: 19.4 us a call in the server (steps_qwen3-1.7b_h200_5851633.json), as the probe had it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ._common import skinny_operands

# One program row: a draft batch up to here (the draft steps' bucket sizes) runs a 16-64-row tile.
SPLIT_MAX_ROWS = 64
BLOCK_N = 32
SPLIT_K = 2
WARPS = 4
STAGES = 4


@dataclass(frozen=True)
class SplitWorkspace:
    """parts: [SPLIT_K, SPLIT_MAX_ROWS, N] fp32 slices; counters: [cdiv(N, BLOCK_N)] int32, zero between launches."""

    parts: torch.Tensor
    counters: torch.Tensor

    @classmethod
    def create(cls, n: int, device: torch.device | str) -> SplitWorkspace:
        return cls(
            torch.empty(SPLIT_K, SPLIT_MAX_ROWS, n, dtype=torch.float32, device=device),
            torch.zeros(triton.cdiv(n, BLOCK_N), dtype=torch.int32, device=device),
        )


@triton.jit
def _split_gemm_kernel(
    X, W, Out, Parts, Counters, M, N, K, stride_xm, stride_wn, stride_om, stride_ps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k_len = K // SPLIT_K
    offs_k = pid_k * k_len + tl.arange(0, BLOCK_K)
    m_ok, n_ok = offs_m[:, None] < M, offs_n[:, None] < N
    x_ptr = X + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    w_ptr = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in tl.range(0, k_len, BLOCK_K, num_stages=STAGES):
        x = tl.load(x_ptr, mask=m_ok, other=0.0)
        acc = tl.dot(x, tl.trans(tl.load(w_ptr, mask=n_ok, other=0.0)), acc)
        x_ptr += BLOCK_K
        w_ptr += BLOCK_K
    ok = m_ok & (offs_n < N)[None, :]
    tile = offs_m[:, None] * N + offs_n[None, :]
    tl.store(Parts + pid_k * stride_ps + tile, acc, mask=ok)
    # release: this slice is visible before the count; acquire: the last to count sees every slice
    if tl.atomic_add(Counters + pid_n, 1, sem="acq_rel") == SPLIT_K - 1:
        total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            total += tl.load(Parts + s * stride_ps + tile, mask=ok, other=0.0, cache_modifier=".cg")
        tl.store(Out + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :], total.to(Out.dtype.element_ty),
                 mask=ok)  # fmt: skip
        tl.atomic_xchg(Counters + pid_n, 0)


def split_gemm(x: torch.Tensor, w: torch.Tensor, ws: SplitWorkspace, out: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w.T into ``out`` (default: a new [M, N] tensor in x's dtype); returns it.

    x: [M, K] with M <= SPLIT_MAX_ROWS, contiguous rows; w: [N, K] contiguous, in x's dtype (bf16 or fp16); K with a
    K step (``split_block_k``); ws: a workspace for N (``SplitWorkspace.create(N, device)``), not used by another
    launch at the same time.
    """
    if x.dim() != 2 or w.dim() != 2 or w.shape[1] != x.shape[1]:
        raise ValueError(f"x [M, K] and w [N, K] expected, got {tuple(x.shape)} {tuple(w.shape)}")
    m, k = x.shape
    n = w.shape[0]
    out = skinny_operands(x, w, n, out)
    block_k = split_block_k(k)
    if block_k is None or m > SPLIT_MAX_ROWS:
        raise ValueError(f"M={m} must be at most {SPLIT_MAX_ROWS} and K={k} a multiple of {SPLIT_K * 32}")
    if ws.parts.shape != (SPLIT_K, SPLIT_MAX_ROWS, n) or ws.counters.shape != (triton.cdiv(n, BLOCK_N),):
        raise ValueError(f"the workspace is not one for N={n}")
    if m == 0:
        return out
    _split_gemm_kernel[(triton.cdiv(n, BLOCK_N), SPLIT_K)](
        x, w, out, ws.parts, ws.counters, m, n, k, x.stride(0), w.stride(0), out.stride(0), ws.parts.stride(0),
        BLOCK_M=max(16, triton.next_power_of_2(m)), BLOCK_N=BLOCK_N, BLOCK_K=block_k, SPLIT_K=SPLIT_K, STAGES=STAGES,
        num_warps=WARPS,
    )  # fmt: skip
    return out


def split_block_k(k: int) -> int | None:
    """The K step for a reduction of length ``k``: the widest of 256, 128, 64 and 32 that divides each of the
    SPLIT_K slices (256 for Qwen3-1.7B's 6144 and SmolLM2's 1536, 128 for 2 x 384); None: none does, and the caller
    keeps SGLang's launches."""
    return next((b for b in (256, 128, 64, 32) if k % (SPLIT_K * b) == 0), None)


def split_gemm_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Plain-torch ``split_gemm``: the SPLIT_K slices' fp32 products summed in slice order, rounded once."""
    xs, ws = x.float().chunk(SPLIT_K, dim=1), w.float().chunk(SPLIT_K, dim=1)
    return sum(a @ b.T for a, b in zip(xs, ws)).to(x.dtype)
