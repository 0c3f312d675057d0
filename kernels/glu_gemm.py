"""A draft step's gate/up projection with SiLU-and-mul as its epilogue (``glu_gemm``): out [M, N] =
silu(x @ gate.T) * (x @ up.T) for w = [gate | up] rows [2N, K], SGLang's merged ``gate_up_proj`` layout, in one
launch at draft batch sizes (M <= ``GLU_MAX_ROWS``); plain-torch reference ``glu_gemm_ref``.

At those sizes the projection reads its whole weight once and its time is the weight's bytes. SGLang runs it as a
cuBLAS GEMM that writes [M, 2N], then its activation kernel reads that back: two launches and a gap. Here each
program reads the gate and the up rows of its BLOCK_N output columns into two fp32 accumulators over the whole of K
and writes silu(gate) * up once. On an H200 at Qwen3-1.7B's shape (M = 64, K = 2048, N = 6144;
draft_gemm_fused_h200_83a528f.json) the launch (64-column tiles, 128-wide K steps, 4 warps, 4 stages) takes 15.8 us
against 18.1 us for cuBLAS then SGLang's activation.

With ``add_norm`` (``AddNorm``) the kernel is also the layer's post-attention add-RMSNorm, SGLang's own launch
(2.8 us and a gap a layer of every draft step at 64 rows, trace_qwen3-1.7b_round_h200_5851633): each program forms
h = x + residual tile by tile as it steps through K, feeds h * norm weight to the products, sums h * h per row and
scales both accumulators by the rows' 1 / rms before the activation (the norm's row scale commutes with the product);
the first K / BLOCK_K column programs write one K tile each of h, rounded, as the next layer's residual.
``norm_gemm`` is the same kernel without the activation: a projection (a draft layer's qkv) with the layer's input
add-RMSNorm as its prologue.

Numerics: the products stay fp32 through the activation, where SGLang rounds gate_up to the activations' dtype
first, so the rows differ from SGLang's by that rounding (with ``add_norm``, also by where the row scale applies).
Only draft steps use it: it moves acceptance, never the output (the verify runs SGLang's MLP).
"""

from __future__ import annotations

from dataclasses import dataclass

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
# With the add-RMSNorm the residual's tile joins the pipeline: at 128-wide K steps the sm_90 build asks 254 KB of
# shared memory (227 KB there) and spills; 64-wide steps build in 131 KB and 241 registers, no spill.
NORM_BLOCK_K = 64
# norm_gemm's column tile (a qkv projection: 4096 columns at Qwen3-1.7B, 128 programs); its single weight tile leaves
# 128-wide K steps room: 164 KB of shared memory at 64 rows.
NORM_BLOCK_N = 32


@dataclass(frozen=True)
class AddNorm:
    """The add-RMSNorm ahead of the projection: x + residual, normalized over K with ``weight`` and ``eps``.

    residual: [M, K], x's dtype, contiguous rows; weight: [K]; residual_out: [M, K] like residual, another buffer,
    receives x + residual rounded to x's dtype (the next layer's residual)."""

    residual: torch.Tensor
    weight: torch.Tensor
    eps: float
    residual_out: torch.Tensor


@triton.jit
def _glu_gemm_kernel(
    X, W, Out, R, ROut, NormW, M, N, K, eps, stride_xm, stride_wn, stride_om, stride_rm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, ADD_NORM: tl.constexpr,
    GLU: tl.constexpr,
):  # fmt: skip
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok, n_ok = offs_m[:, None] < M, offs_n[:, None] < N
    x_ptr = X + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    r_off = offs_m[:, None].to(tl.int64) * stride_rm + offs_k[None, :]
    gate_ptr = W + offs_n[:, None].to(tl.int64) * stride_wn + offs_k[None, :]
    up_ptr = gate_ptr + N.to(tl.int64) * stride_wn  # the up rows sit N rows below the gate rows
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    sumsq = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        x = tl.load(x_ptr, mask=m_ok, other=0.0)
        if ADD_NORM:
            h = x.to(tl.float32) + tl.load(R + r_off + k0, mask=m_ok, other=0.0).to(tl.float32)
            # K tile k0 / BLOCK_K of the new residual comes from the program of that column tile
            tl.store(ROut + r_off + k0, h.to(X.dtype.element_ty), mask=m_ok & (k0 == pid_n * BLOCK_K))
            sumsq += tl.sum(h * h, axis=1)
            x = (h * tl.load(NormW + k0 + offs_k).to(tl.float32)[None, :]).to(X.dtype.element_ty)
        gate = tl.dot(x, tl.trans(tl.load(gate_ptr, mask=n_ok, other=0.0)), gate)
        if GLU:
            up = tl.dot(x, tl.trans(tl.load(up_ptr, mask=n_ok, other=0.0)), up)
        x_ptr += BLOCK_K
        gate_ptr += BLOCK_K
        up_ptr += BLOCK_K
    if ADD_NORM:
        scale = tl.rsqrt(sumsq / K + eps)[:, None]
        gate *= scale
        up *= scale
    out = gate * tl.sigmoid(gate) * up if GLU else gate  # without GLU: the plain product x @ w.T
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
    add_norm: AddNorm | None = None,
) -> torch.Tensor:
    """silu(x @ gate.T) * (x @ up.T) into ``out`` (default: a new [M, N] tensor in x's dtype); returns it. With
    ``add_norm``, x is first x + residual normalized (RMSNorm), and x + residual goes to its residual_out.

    x: [M, K] with M <= GLU_MAX_ROWS, contiguous rows; w: [2N, K] = [gate | up] rows, contiguous, in x's dtype
    (bf16 or fp16); K a multiple of 32. The launch parameters (default: the measured launch; ``block_k``: by
    default ``glu_block_k``, at most NORM_BLOCK_K with ``add_norm``, else a divisor of K) change speed only.
    """
    if x.dim() != 2 or w.dim() != 2 or w.shape[0] % 2 or w.shape[1] != x.shape[1]:
        raise ValueError(f"x [M, K] and w [2N, K] expected, got {tuple(x.shape)} {tuple(w.shape)}")
    if block_k is None:
        block_k = _default_block_k(x.shape[1], add_norm is not None)
    return _launch(x, w, w.shape[0] // 2, out, (block_n, block_k, warps, stages), add_norm, glu=True)


def norm_gemm(x: torch.Tensor, w: torch.Tensor, add_norm: AddNorm, out: torch.Tensor | None = None) -> torch.Tensor:
    """RMSNorm(x + residual) @ w.T into ``out`` (default: a new [M, N] tensor in x's dtype), x + residual into
    ``add_norm.residual_out``; returns ``out``: a projection with the add-RMSNorm ahead of it (a draft layer's qkv).

    x: [M, K] as ``glu_gemm``'s; w: [N, K], contiguous, in x's dtype. One NORM_BLOCK_N-column program a tile, K
    steps of ``glu_block_k`` (the plain product's tiles leave the residual's tile room in shared memory)."""
    if x.dim() != 2 or w.dim() != 2 or w.shape[1] != x.shape[1]:
        raise ValueError(f"x [M, K] and w [N, K] expected, got {tuple(x.shape)} {tuple(w.shape)}")
    launch = (NORM_BLOCK_N, _default_block_k(x.shape[1], False), WARPS, STAGES)
    return _launch(x, w, w.shape[0], out, launch, add_norm, glu=False)


def _launch(
    x: torch.Tensor,
    w: torch.Tensor,
    n: int,
    out: torch.Tensor | None,
    launch: tuple[int, int | None, int, int],
    add_norm: AddNorm | None,
    glu: bool,
) -> torch.Tensor:
    m, k = x.shape
    block_n, block_k, warps, stages = launch
    out = skinny_operands(x, w, n, out)
    if block_k is None or k % block_k or m > GLU_MAX_ROWS:
        raise ValueError(f"K={k} must be a multiple of 32 (of block_k={block_k}) and M={m} at most {GLU_MAX_ROWS}")
    if add_norm is not None:
        _check_add_norm(add_norm, x, _tiles_cover_k(n, block_n, block_k, k))
    if m == 0:
        return out
    block_m = max(16, triton.next_power_of_2(m))
    r, r_out, norm_w, eps = (
        (x, x, x, 0.0)  # unread without ADD_NORM
        if add_norm is None
        else (add_norm.residual, add_norm.residual_out, add_norm.weight, add_norm.eps)
    )
    _glu_gemm_kernel[(triton.cdiv(n, block_n), triton.cdiv(m, block_m))](
        x, w, out, r, r_out, norm_w, m, n, k, eps, x.stride(0), w.stride(0), out.stride(0), r.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, STAGES=stages, ADD_NORM=add_norm is not None, GLU=glu,
        num_warps=warps,
    )  # fmt: skip
    return out


def glu_norm_fits(n: int, k: int, glu: bool = True) -> bool:
    """Whether the default launch with ``add_norm`` writes the whole new residual at N output columns and
    reduction length K (glu_gemm's, else norm_gemm's): as many column programs as K steps at least (Qwen3-1.7B:
    gate/up 96 programs, qkv 128, for 32 and 16 steps)."""
    block_k = _default_block_k(k, glu)
    return block_k is not None and _tiles_cover_k(n, BLOCK_N if glu else NORM_BLOCK_N, block_k, k)


def _default_block_k(k: int, gate_up_norm: bool) -> int | None:
    """The default K step: ``glu_block_k``, at most NORM_BLOCK_K for gate/up with the add-RMSNorm."""
    block_k = glu_block_k(k)
    return min(block_k, NORM_BLOCK_K) if gate_up_norm and block_k is not None else block_k


def _tiles_cover_k(n: int, block_n: int, block_k: int, k: int) -> bool:
    """Whether the column programs are at least the K steps: each writes one K tile of the new residual."""
    return triton.cdiv(n, block_n) * block_k >= k


def _check_add_norm(add_norm: AddNorm, x: torch.Tensor, tiles_cover_k: bool) -> None:
    """ValueError unless the norm's tensors fit x [M, K] and the column programs are enough to write every K
    tile of the new residual."""
    r, r_out, weight = add_norm.residual, add_norm.residual_out, add_norm.weight
    if r.shape != x.shape or r_out.shape != x.shape or r.dtype != x.dtype or r_out.dtype != x.dtype:
        raise ValueError(f"residual and residual_out must be {tuple(x.shape)} {x.dtype}")
    if r.stride(1) != 1 or r_out.stride(1) != 1 or r_out.stride(0) != r.stride(0) or weight.shape != (x.shape[1],):
        raise ValueError("residual and residual_out need contiguous rows of one stride and weight one value a column")
    if r_out.data_ptr() in (r.data_ptr(), x.data_ptr()) or not weight.is_contiguous():
        raise ValueError("residual_out must be a buffer of its own and weight contiguous")
    if not tiles_cover_k:
        raise ValueError("fewer column tiles than K steps: the new residual would not be written whole")


def glu_gemm_ref(x: torch.Tensor, w: torch.Tensor, add_norm: AddNorm | None = None) -> torch.Tensor:
    """Plain-torch ``glu_gemm``: fp32 products and activation, rounded to x's dtype once; with ``add_norm`` the
    products of h * norm weight (rounded to x's dtype) scaled by each row's 1 / rms(h), h = x + residual in fp32,
    and h rounded into residual_out."""
    scale = 1.0
    if add_norm is not None:
        h = x.float() + add_norm.residual.float()
        add_norm.residual_out.copy_(h.to(x.dtype))
        scale = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + add_norm.eps)
        x = (h * add_norm.weight.float()).to(x.dtype)
    gate, up = (x.float() @ w.float().T * scale).chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)
