"""The draft step's weight GEMMs at decode batch sizes: cuBLAS (``F.linear``, what SGLang runs) against a Triton
skinny GEMM over its launch parameters (GPU only).

    python -m tools.draft_gemm --out benchmarks/results/kernels/draft_gemm_<device>_<commit>.json

A draft step is a decode forward: each layer's qkv, o, gate/up and down projections at M = batch rows read the
whole weight once, so at M = 64 they are memory-bound (Qwen3-1.7B: 100 MB a layer, 21 us at 4.8 TB/s). The
round's profile (``trace_qwen3-1.7b_round_h200_6c8d415``) has cuBLAS at 40.5 us a layer (2.5 TB/s): its gate/up
tile runs 96 CTAs on 132 SMs and its down projection splits K and reduces in a second kernel. This probe times,
for each projection of a shape at each M, ``layers`` calls on distinct weights replayed from one CUDA graph (the
weights do not fit L2, launches are amortised as in the draft step's graph) and reports us per call and GB/s.

Measured at 2021a7f (draft_gemm_h200_2021a7f.json): with bf16 weights the Triton kernel only matches cuBLAS at
M = 64 (gate/up 15.4 against 15.8 us, down 11.3 against 11.3) and loses at M = 256.

A draft forward need not use the target's exact weights: rejection sampling keeps the output exact for any draft
distribution it records, so the drafts may come from fp8 copies of the weights (per-output-channel scales,
bf16 activations: ``triton_w8``), which halves the bytes a memory-bound GEMM reads; the verify keeps the exact
weights. Expected at M = 64 on Qwen3-1.7B at the bf16 kernel's ~3 TB/s: gate/up ~9 us, down ~7, qkv ~5, o ~4.5
(~25 us a layer against cuBLAS's 40) and the LM head ~85 us against ~155: ~0.5 ms less a draft step, ~4 ms less
an 8-draft round. ``cublas_fp8`` (``torch._scaled_mm`` with fp8 activations quantized beforehand, quantization
not timed) bounds what cuBLAS's own fp8 path could do.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from tools.kernels_setup import provenance, write_result


# (name, hidden, q heads, kv heads, head dim, intermediate, vocabulary, layers to cycle through)
SHAPES = {
    "qwen3-1.7b": (2048, 16, 8, 128, 6144, 151936, 28),
    "qwen3-8b": (4096, 32, 8, 128, 12288, 151936, 12),
}
FP8_MAX = 448.0  # largest finite float8_e4m3fn
# (block_n, block_k, split_k, warps, stages)
GRID = [
    (bn, bk, sk, w, st)
    for bn in (32, 64, 128)
    for bk in (64, 128, 256)
    for sk in (1, 2, 4)
    for w in (4, 8)
    for st in (3, 4)
    if not (bn == 128 and bk == 256 and st == 4)  # over the shared memory of one SM
]


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
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    STAGES: tl.constexpr,
    W_SCALED: tl.constexpr,
):
    """Out[m, n] = sum_k X[m, k] W[n, k] for a [BLOCK_M, BLOCK_N] tile over one of SPLIT_K slices of K (K a
    multiple of SPLIT_K x BLOCK_K); with SPLIT_K > 1 each slice writes fp32 partials Part[slice, m, n].
    W_SCALED: W is fp8 with one scale per output channel, Scale[n]; its tiles widen to X's dtype in registers
    and the scale multiplies the finished sums (it is constant along K)."""
    pid_n, pid_k, pid_m = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k_len = K // SPLIT_K
    x_ptr = X + offs_m[:, None] * stride_xm + (pid_k * k_len + offs_k)[None, :]
    w_ptr = W + offs_n[:, None] * stride_wn + (pid_k * k_len + offs_k)[None, :]
    m_ok, n_ok = offs_m[:, None] < M, offs_n[:, None] < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for _ in tl.range(0, k_len, BLOCK_K, num_stages=STAGES):
        x = tl.load(x_ptr, mask=m_ok, other=0.0)
        w = tl.load(w_ptr, mask=n_ok, other=0.0).to(x.dtype)
        acc = tl.dot(x, tl.trans(w), acc)
        x_ptr += BLOCK_K
        w_ptr += BLOCK_K
    if W_SCALED:
        acc *= tl.load(Scale + offs_n, mask=offs_n < N, other=0.0)[None, :]
    ok = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if SPLIT_K == 1:
        tl.store(Out + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(Out.dtype.element_ty), mask=ok)
    else:
        tl.store(Part + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :], acc, mask=ok)


@triton.jit
def _split_sum_kernel(Part, Out, MN, N, stride_om, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < MN
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(Part + s * MN + offs, mask=ok, other=0.0)
    tl.store(Out + (offs // N) * stride_om + offs % N, acc.to(Out.dtype.element_ty), mask=ok)


def skinny_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    part: torch.Tensor | None,
    block_n: int,
    block_k: int,
    split_k: int,
    warps: int,
    stages: int,
    scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """out [M, N] = x [M, K] @ w [N, K].T (``F.linear`` without bias); ``part`` [split_k, M, N] fp32 scratch
    when split_k > 1. K must be a multiple of split_k x block_k. ``scale`` [N] fp32: w is fp8 and its row n
    stands for scale[n] x w[n] (``quantize_rows``)."""
    m, k = x.shape
    n = w.shape[0]
    if k % (split_k * block_k):
        raise ValueError(f"K={k} is not a multiple of split_k x block_k = {split_k * block_k}")
    block_m = max(16, min(64, triton.next_power_of_2(m)))
    grid = (triton.cdiv(n, block_n), split_k, triton.cdiv(m, block_m))
    _skinny_gemm_kernel[grid](
        x, w, out, part if part is not None else out, scale if scale is not None else out, m, n, k,
        x.stride(0), w.stride(0), out.stride(0), BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        SPLIT_K=split_k, STAGES=stages, W_SCALED=scale is not None, num_warps=warps,
    )  # fmt: skip
    if split_k > 1:
        _split_sum_kernel[(triton.cdiv(m * n, 1024),)](part, out, m * n, n, out.stride(0), SPLIT_K=split_k, BLOCK=1024)
    return out


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 e4m3 weights, fp32 scale [N]): each output channel scaled so its largest magnitude is FP8_MAX."""
    scale = (w.float().abs().amax(dim=1) / FP8_MAX).clamp_min(1e-12)
    return (w.float() / scale[:, None]).to(torch.float8_e4m3fn), scale


def projections(shape: str) -> dict[str, tuple[int, int]]:
    """(N, K) of each weight GEMM of a decoder layer (SGLang's fused qkv and gate/up) and of the LM head."""
    hidden, h_q, h_kv, d, inter, vocab, _ = SHAPES[shape]
    return {
        "qkv": ((h_q + 2 * h_kv) * d, hidden),
        "o": (hidden, h_q * d),
        "gate_up": (2 * inter, hidden),
        "down": (hidden, inter),
        "lm_head": (vocab, hidden),
    }


def graph_us(calls: list, reps: int = 20) -> float:
    """Mean us per call of ``calls`` replayed from one CUDA graph (after one eager warm-up of each)."""
    for c in calls:
        c()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for c in calls:
            c()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps / len(calls)


def measure(shape: str, m: int, grid: list[tuple[int, int, int, int, int]]) -> list[dict[str, Any]]:
    """Per projection: cuBLAS (bf16), cuBLAS fp8 (``torch._scaled_mm``), and the Triton kernel over ``grid`` on
    bf16 weights (``triton``) and on their fp8 copies (``triton_w8``); the LM head cycles two copies (one is
    already far past L2)."""
    rows = []
    for proj, (n, k) in projections(shape).items():
        layers = 2 if proj == "lm_head" else SHAPES[shape][-1]
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
        w8s = [quantize_rows(w) for w in ws]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        part = torch.empty(4, m, n, device="cuda", dtype=torch.float32)
        gb = n * k * 2 / 1e9
        base = {"shape": shape, "m": m, "proj": proj, "n": n, "k": k}
        us = graph_us([lambda w=w: F.linear(x, w) for w in ws])
        rows.append({**base, "kernel": "cublas", "us": us, "GBps": gb / us * 1e6})
        ref = F.linear(x, ws[0]).float()
        rows.append({**base, **cublas_fp8(x, w8s, ref, gb / 2)})
        for kernel, weights, bytes_gb in (("triton", [(w, None) for w in ws], gb), ("triton_w8", w8s, gb / 2)):
            for bn, bk, sk, warps, stages in grid:
                if k % (sk * bk):
                    continue
                args = (bn, bk, sk, warps, stages)
                w0, s0 = weights[0]
                try:
                    got = skinny_gemm(x, w0, out, part, *args, scale=s0).float()
                    err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
                    us = graph_us([lambda w=w, s=s: skinny_gemm(x, w, out, part, *args, scale=s) for w, s in weights])
                except Exception as exc:  # a launch the GPU refuses (shared memory): recorded, not fatal
                    rows.append({**base, "kernel": kernel, "config": args, "error": repr(exc)[:200]})
                    continue
                rows.append(
                    {**base, "kernel": kernel, "config": args, "us": us, "GBps": bytes_gb / us * 1e6, "rel_err": err}
                )
        del ws, w8s
        torch.cuda.empty_cache()
    return rows


def cublas_fp8(x: torch.Tensor, w8s: list, ref: torch.Tensor, gb: float) -> dict[str, Any]:
    """``torch._scaled_mm`` on fp8 activations (quantized per row beforehand, not timed) and the fp8 weights."""
    xs = (x.float().abs().amax(dim=1, keepdim=True) / FP8_MAX).clamp_min(1e-12)
    x8 = (x.float() / xs).to(torch.float8_e4m3fn)

    def call(w8: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(x8, w8.t(), scale_a=xs, scale_b=s[None, :], out_dtype=torch.bfloat16)

    try:
        err = ((call(*w8s[0]).float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
        us = graph_us([lambda w=w, s=s: call(w, s) for w, s in w8s])
    except Exception as exc:  # a torch / GPU without row-wise scaled fp8 GEMMs: recorded
        return {"kernel": "cublas_fp8", "error": repr(exc)[:200]}
    return {"kernel": "cublas_fp8", "us": us, "GBps": gb / us * 1e6, "rel_err": err}


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (shape, m, proj): cuBLAS against cuBLAS fp8 and the fastest launch of each Triton kernel."""
    out = []
    keys = sorted({(r["shape"], r["m"], r["proj"]) for r in rows})
    for key in keys:
        mine = [r for r in rows if (r["shape"], r["m"], r["proj"]) == key and "us" in r]
        cublas = next(r["us"] for r in mine if r["kernel"] == "cublas")
        entry: dict[str, Any] = {"shape": key[0], "m": key[1], "proj": key[2], "cublas_us": cublas}
        fp8 = next((r["us"] for r in mine if r["kernel"] == "cublas_fp8"), None)
        entry["cublas_fp8_us"] = fp8
        for kernel in ("triton", "triton_w8"):
            best = min((r for r in mine if r["kernel"] == kernel), key=lambda r: r["us"], default=None)
            entry[f"{kernel}_us"] = best["us"] if best else None
            entry[f"{kernel}_config"] = best["config"] if best else None
            entry[f"{kernel}_speedup"] = cublas / best["us"] if best else None
        out.append(entry)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("draft_gemm needs a CUDA GPU")
    started = time.time()
    rows = [r for shape in args.shapes for m in args.batches for r in measure(shape, m, GRID)]
    best = summary(rows)
    for b in best:
        print(b, flush=True)
    doc = {
        **provenance("draft_gemm"),
        "timing": "one CUDA graph of one call per layer on distinct weights, mean of 20 replays",
        "summary": best,
        "rows": rows,
        "wall_s": time.time() - started,
    }
    write_result(args.out, doc)


if __name__ == "__main__":
    main()
