"""The draft GEMM probe's Triton kernel (``tools/draft_gemm.py``): ``out = x @ w.T`` at decode batch sizes
(M = a few dozen rows), w bf16 or an fp8 copy with one scale per output channel.

At decode batch sizes a linear layer reads its whole weight once, so its time is the weight's bytes: the probe
asks whether a kernel tuned for that shape beats cuBLAS with bf16 weights, and whether fp8 copies (half the
bytes; the kernel widens each fp8 tile to the activations' dtype in registers) would shorten the draft steps.
Measured on an H200 (draft_gemm_h200_2021a7f.json, draft_gemm_h200_e8410c8.json): bf16 only matches cuBLAS at
M = 64, and the fp8 copies run 0.6-0.8x cuBLAS's bf16 (the widened tile goes through registers instead of
the asynchronous copy pipeline), so the product keeps cuBLAS. One program computes a [BLOCK_M, BLOCK_N] tile over
one of SPLIT_K slices of K; with SPLIT_K > 1 the slices write fp32 partials that a second launch sums.

The gate/up projection with SiLU-and-mul as its epilogue is the product's own kernel (``kernels/glu_gemm.py``).
``reduce_add_norm``: the down
projection's split-K partials summed inside the next step, SGLang's fused residual add and RMSNorm, so the split
sum's launch goes instead of running between them.

A chain of these GEMMs can overlap each launch with the one before it (``pdl``: programmatic dependent launch,
sm_90): a program lets the next launch start as soon as it runs, and waits for the previous launch's results
only before its K loop reads x, so a GEMM's ramp (launch, first weight bytes in flight) overlaps the previous
GEMM's tail. With ``prefetch`` a program also asks L2 for its whole weight slice (one ``prefetch.global.L2``
per 128-byte line, which returns at once) before that wait: weights never depend on the previous launch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# What the kernel applies to x as it loads it (``prologue``): nothing, SGLang's fused add-RMSNorm, SiLU-and-mul.
PROLOGUES = {"none": 0, "add_norm": 1, "silu_mul": 2}
ADD_NORM: tl.constexpr = tl.constexpr(PROLOGUES["add_norm"])
SILU_MUL: tl.constexpr = tl.constexpr(PROLOGUES["silu_mul"])


@triton.jit
def _skinny_gemm_kernel(
    X,
    W,
    Out,
    Part,
    Scale,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_om,
    R,
    R_out,
    G,
    eps,
    stride_rm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    STAGES: tl.constexpr,
    W_SCALED: tl.constexpr,
    PDL: tl.constexpr,
    PREFETCH: tl.constexpr,
    PROLOGUE: tl.constexpr,
):
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    if PDL:  # the next launch may start now: it waits for this one's results before reading them
        tl.extra.cuda.gdc_launch_dependents()
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k_len = K // SPLIT_K
    x_ptr = X + offs_m[:, None].to(tl.int64) * stride_xm + (pid_k * k_len + offs_k)[None, :]
    w_ptr = W + offs_n[:, None].to(tl.int64) * stride_wn + (pid_k * k_len + offs_k)[None, :]
    m_ok, n_ok = offs_m[:, None] < M, offs_n[:, None] < N
    if PREFETCH:
        LINE: tl.constexpr = 1024 // W.dtype.element_ty.primitive_bitwidth  # elements in a 128-byte line
        _prefetch_slice(W, offs_n, N, stride_wn, pid_k * k_len, k_len, BLOCK_K, LINE)
    if PDL:  # x is the previous launch's output
        tl.extra.cuda.gdc_wait()
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if PROLOGUE == ADD_NORM:  # one K slice (SPLIT_K = 1): the row norms need the whole row
        r_off = offs_m[:, None].to(tl.int64) * stride_rm + offs_k[None, :]
        g_ptr = G + offs_k
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
    for _ in tl.range(0, k_len, BLOCK_K, num_stages=STAGES):
        x = tl.load(x_ptr, mask=m_ok, other=0.0)
        if PROLOGUE == ADD_NORM:
            # h = x + residual, rounded as the residual stream holds it; the GEMM reads h * g and the row's
            # 1 / rms(h) scales the product after the loop (it is constant along K)
            h = (x.to(tl.float32) + tl.load(R + r_off, mask=m_ok, other=0.0).to(tl.float32)).to(x.dtype)
            if pid_n == 0:  # one column of programs writes the new residual; R_out is not R, which others read
                tl.store(R_out + r_off, h, mask=m_ok)
            hf = h.to(tl.float32)
            sum_sq += tl.sum(hf * hf, axis=1)
            x = (hf * tl.load(g_ptr).to(tl.float32)[None, :]).to(x.dtype)
            r_off += BLOCK_K
            g_ptr += BLOCK_K
        elif PROLOGUE == SILU_MUL:  # x holds [gate | up] rows, K columns each
            gate = x.to(tl.float32)
            up = tl.load(x_ptr + K, mask=m_ok, other=0.0).to(tl.float32)
            x = (gate * tl.sigmoid(gate) * up).to(x.dtype)
        w = tl.load(w_ptr, mask=n_ok, other=0.0).to(x.dtype)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptr += BLOCK_K
        w_ptr += BLOCK_K
    n_in = offs_n < N
    if W_SCALED:  # the channel's scale is constant along K: it scales each slice's sum
        acc *= tl.load(Scale + offs_n, mask=n_in, other=0.0)[None, :]
    if PROLOGUE == ADD_NORM:
        acc *= tl.rsqrt(sum_sq / K + eps)[:, None]
    ok = (offs_m[:, None] < M) & n_in[None, :]
    if SPLIT_K == 1:
        tl.store(Out + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(Out.dtype.element_ty), mask=ok)
    else:
        tl.store(Part + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :], acc, mask=ok)


@triton.jit
def _prefetch_slice(W, offs_n, N, stride_wn, k0, k_len, BLOCK_K: tl.constexpr, LINE: tl.constexpr):
    """One ``prefetch.global.L2`` for each LINE-element (128-byte) line of the weight rows offs_n, columns
    k0 .. k0 + k_len: the instruction returns at once, the lines arrive while the program waits. Rows past N
    prefetch row N - 1 again (a hint, never a fault)."""
    rows = W + tl.minimum(offs_n, N - 1)[:, None].to(tl.int64) * stride_wn
    lines = rows + (k0 + tl.arange(0, BLOCK_K // LINE) * LINE)[None, :]
    for _ in range(0, k_len, BLOCK_K):
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; mov.u32 $0, 0;", "=r,l", [lines], dtype=tl.int32, is_pure=False, pack=1
        )
        lines += BLOCK_K


@triton.jit
def _split_sum_kernel(Part, Out, MN, N, stride_om, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()  # the partials are the previous launch's output
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    row, col = offs // N, offs % N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(Part + s * MN + offs, mask=ok, other=0.0)
    tl.store(Out + row * stride_om + col, acc.to(Out.dtype.element_ty), mask=ok)


def skinny_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    part: torch.Tensor | None = None,
    block_n: int = 32,
    block_k: int = 256,
    split_k: int = 1,
    warps: int = 4,
    stages: int = 4,
    scale: torch.Tensor | None = None,
    pdl: bool = False,
    prefetch: bool = False,
    add_norm: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float] | None = None,
    silu_mul: bool = False,
    reduce: bool = True,
) -> torch.Tensor:
    """out [M, N] = x [M, K] @ w [N, K].T, ``F.linear``'s product; returns ``out``.

    x, out: rows with a contiguous last dim; w: [N, K] contiguous, in x's dtype, or fp8 with ``scale`` [N] fp32
    (row n stands for scale[n] x w[n], as ``sglang_sparsespec.fp8.quantize_rows`` writes it). ``part``: [split_k,
    M, N] fp32 scratch when split_k > 1. K must be a multiple of split_k x block_k. The launch parameters change
    speed only, and so do ``pdl`` (a programmatic dependent launch, sm_90 and later; the split sum too) and
    ``prefetch`` (the weight slice asked of L2 before the wait; compiled only, as is ``pdl``: the CPU interpreter
    runs neither).
    A prologue replaces the launch before the GEMM: ``add_norm`` = (residual, residual_out, norm weight [K], eps)
    multiplies RMSNorm(h) * weight, h = x + residual, and writes h to residual_out (not residual: other programs
    still read it), with one K slice; ``silu_mul`` multiplies silu(gate) * up of x = [gate | up] ([M, 2K]).
    ``reduce=False`` (split_k > 1) leaves the partials in ``part`` for ``reduce_add_norm`` and writes nothing to
    ``out``.
    """
    if prefetch and not pdl:
        raise ValueError("prefetch overlaps the wait of a programmatic dependent launch: it needs pdl")
    if add_norm is not None and silu_mul:
        raise ValueError("one prologue at a time: add_norm or silu_mul")
    if not reduce and split_k == 1:
        raise ValueError("reduce=False leaves split-K partials: it needs split_k > 1")
    m = x.shape[0]
    n, k = w.shape
    x_cols = 2 * k if silu_mul else k
    if x.shape[1] != x_cols or out.shape != (m, n) or x.stride(1) != 1 or w.stride(1) != 1 or out.stride(1) != 1:
        raise ValueError(f"x [M, K], w [N, K], out [M, N] with contiguous rows, got {x.shape} {w.shape} {out.shape}")
    if add_norm is not None:
        residual, residual_out, norm_weight, eps = add_norm
        if split_k != 1 or residual.shape != x.shape or residual_out.shape != x.shape or norm_weight.shape != (k,):
            raise ValueError("add_norm needs split_k = 1, residual and residual_out shaped as x, a weight [K]")
        if residual.stride() != residual_out.stride() or residual_out.data_ptr() == residual.data_ptr():
            raise ValueError("add_norm's residual_out must be another tensor, laid out as residual")
    else:
        residual = residual_out = norm_weight = out
        eps = 0.0
    prologue = PROLOGUES["add_norm" if add_norm is not None else "silu_mul" if silu_mul else "none"]
    exact = scale is None and w.dtype == x.dtype
    if not exact and not (scale is not None and w.dtype == torch.float8_e4m3fn and scale.shape == w.shape[:1]):
        raise ValueError(f"w in x's dtype ({x.dtype}), or fp8 with a scale [N]; got {w.dtype}, scale {scale}")
    if k % (split_k * block_k):
        raise ValueError(f"K={k} is not a multiple of split_k x block_k = {split_k * block_k}")
    if split_k > 1 and (part is None or part.shape[0] < split_k or part[0].numel() < m * n):
        raise ValueError(f"split_k={split_k} needs a float32 scratch part [>= {split_k}, {m}, {n}]")
    block_m = max(16, min(64, triton.next_power_of_2(m)))
    grid = (triton.cdiv(n, block_n), split_k, triton.cdiv(m, block_m))
    _skinny_gemm_kernel[grid](
        x, w, out, part if part is not None else out, scale if scale is not None else out,
        m, n, k, x.stride(0), w.stride(0), out.stride(0), residual, residual_out, norm_weight, eps,
        residual.stride(0), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, SPLIT_K=split_k, STAGES=stages,
        W_SCALED=scale is not None, PDL=pdl, PREFETCH=prefetch, PROLOGUE=prologue, num_warps=warps,
        launch_pdl=pdl,
    )  # fmt: skip
    if split_k > 1 and reduce:
        _split_sum_kernel[(triton.cdiv(m * n, 1024),)](
            part, out, m * n, n, out.stride(0), SPLIT_K=split_k, BLOCK=1024, PDL=pdl, launch_pdl=pdl,
        )  # fmt: skip
    return out


@triton.jit
def _reduce_add_norm_kernel(
    Part, Residual, Weight, Out, ResidualOut, M, N, eps, stride_rm, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    ok = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(Part + (s * M + row) * N + offs, mask=ok, other=0.0)
    residual = tl.load(Residual + row * stride_rm + offs, mask=ok, other=0.0)
    # the product rounded as the GEMM's output would be, then SGLang's fused add-RMSNorm on it
    h = acc.to(residual.dtype).to(tl.float32) + residual.to(tl.float32)
    tl.store(ResidualOut + row * stride_rm + offs, h.to(residual.dtype), mask=ok)
    rms = tl.rsqrt(tl.sum(h * h, axis=0) / N + eps)
    weight = tl.load(Weight + offs, mask=ok, other=0.0).to(tl.float32)
    tl.store(Out + row * stride_rm + offs, (h * rms * weight).to(residual.dtype), mask=ok)


def reduce_add_norm(
    part: torch.Tensor,
    split_k: int,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    residual_out: torch.Tensor,
) -> torch.Tensor:
    """The down projection's ``split_k`` partials (``skinny_gemm(reduce=False)``: part [>= split_k, M, N] fp32)
    summed into its output, added to ``residual`` [M, N] and RMS-normalized with ``weight`` [N]: ``out`` the
    normalized rows, ``residual_out`` the new residual stream (as SGLang's fused add-RMSNorm leaves them, with the
    GEMM's output rounded to the residual's dtype first). One program a row; returns ``out``."""
    m, n = residual.shape
    if part.shape[0] < split_k or part[0].numel() < m * n or weight.shape != (n,):
        raise ValueError(f"part [>= {split_k}, {m}, {n}] and weight [{n}] needed, got {part.shape} {weight.shape}")
    if out.shape != residual.shape or residual_out.shape != residual.shape or out.stride() != residual.stride():
        raise ValueError("out and residual_out must be shaped and laid out as residual")
    _reduce_add_norm_kernel[(m,)](
        part, residual, weight, out, residual_out, m, n, eps, residual.stride(0),
        SPLIT_K=split_k, BLOCK=triton.next_power_of_2(n), num_warps=8,
    )  # fmt: skip
    return out


def prologue_ref(
    x: torch.Tensor,
    add_norm: tuple[torch.Tensor, torch.Tensor, torch.Tensor, float] | None = None,
    silu_mul: bool = False,
) -> torch.Tensor:
    """What ``skinny_gemm``'s prologue hands its GEMM, in plain torch (``add_norm`` writes residual_out too): the
    weighted h without its row scale, which the GEMM applies after the product."""
    if silu_mul:
        gate, up = x.float().chunk(2, dim=-1)
        return (F.silu(gate) * up).to(x.dtype)
    if add_norm is None:
        return x
    residual, residual_out, norm_weight, _ = add_norm
    residual_out.copy_((x.float() + residual.float()).to(x.dtype))
    return (residual_out.float() * norm_weight.float()).to(x.dtype)


def add_norm_scale(h: torch.Tensor, eps: float) -> torch.Tensor:
    """1 / rms of each row of h [M, K] (fp32): the factor ``skinny_gemm``'s add_norm applies after its product."""
    return torch.rsqrt(h.float().pow(2).mean(dim=-1, keepdim=True) + eps)


def skinny_gemm_ref(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor | None = None) -> torch.Tensor:
    """Plain-torch ``skinny_gemm`` without a prologue (fp32 math, x's dtype out)."""
    wf = w.float() if scale is None else w.float() * scale[:, None]
    return (x.float() @ wf.T).to(x.dtype)
