"""The draft step's weight GEMMs at decode batch sizes: cuBLAS (``F.linear``, what SGLang runs) against a Triton
skinny GEMM (``tools/skinny_gemm.py``) over its launch parameters (GPU only).

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
distribution it records, so the drafts could come from fp8 copies of the weights (per-output-channel scales,
bf16 activations: ``triton_w8``), which halves the bytes a memory-bound GEMM reads. ``cublas_fp8``
(``torch._scaled_mm`` with fp8 activations quantized beforehand, quantization not timed) bounds what cuBLAS's own
fp8 path could do. Measured at e8410c8 (draft_gemm_h200_e8410c8.json, M = 64, us): gate/up 15.9 cuBLAS, 20.0
``triton_w8``, 12.2 ``cublas_fp8``; down 11.2, 16.1, 17.7; qkv 6.7, 11.5, 8.6; o 6.2, 8.9, 8.8; LM head 161, 146,
102. Half the bytes did not make the GEMMs faster (a layer 40 us with bf16 cuBLAS, 57 with ``triton_w8``, 47
with ``cublas_fp8`` before its quantization launches), so the draft steps keep the exact weights.

``gate_up_silu``: the gate/up projection with its activation, as a draft layer runs them (cuBLAS, then SGLang's
SiLU-and-mul launch: 15.8 + 1.7 us and a launch gap in the H200 round at 886f2d3) against the Triton kernel with
SiLU-and-mul as its epilogue (``kernels/glu_gemm.py``, what ``--pillar-draft-mlp fused`` runs: one launch, no
gate/up output). A draft step saves the
difference 28 times (Qwen3-1.7B), 8 steps a round. ``down_add_norm``: the down projection and the add-RMSNorm
after it (cuBLAS's split-K GEMM, its split sum, SGLang's fused add-RMSNorm: 9.6 + 2.2 + 2.8 us and two gaps in
that round) against the Triton kernel's split-K partials summed inside the add-RMSNorm (``reduce_add_norm``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from sglang_sparsespec.fp8 import quantize_rows
from sglang_sparsespec.kernels.glu_gemm import glu_gemm

from tools.kernels_setup import graph_ms, provenance, write_result
from tools.skinny_gemm import reduce_add_norm, skinny_gemm


# (name, hidden, q heads, kv heads, head dim, intermediate, vocabulary, layers to cycle through)
SHAPES = {
    "qwen3-1.7b": (2048, 16, 8, 128, 6144, 151936, 28),
    "qwen3-8b": (4096, 32, 8, 128, 12288, 151936, 12),
}
# (block_n, block_k, split_k, warps, stages)
GRID = [
    (bn, bk, sk, w, st)
    for bn in (16, 32, 64, 128)  # 16: narrow outputs (2048 channels) still fill 128 SMs
    for bk in (64, 128, 256)
    for sk in (1, 2, 4)
    for w in (4, 8)
    for st in (3, 4)
    if not (bn == 128 and bk == 256 and st == 4)  # over the shared memory of one SM
]


def projections(shape: str) -> dict[str, tuple[int, int]]:
    """(N, K) of each weight GEMM of a decoder layer (SGLang's fused qkv and gate/up; gate_up_silu: the same
    weight with its activation) and of the LM head."""
    hidden, h_q, h_kv, d, inter, vocab, _ = SHAPES[shape]
    return {
        "qkv": ((h_q + 2 * h_kv) * d, hidden),
        "o": (hidden, h_q * d),
        "gate_up": (2 * inter, hidden),
        "gate_up_silu": (2 * inter, hidden),
        "down": (hidden, inter),
        "down_add_norm": (hidden, inter),
        "lm_head": (vocab, hidden),
    }


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """SGLang's fused add-RMSNorm of a draft layer, in place (sgl_kernel's; torch's ops where it is absent)."""
    try:
        from sgl_kernel import fused_add_rmsnorm
    except ImportError:
        residual.add_(x)
        x.copy_(F.rms_norm(residual.float(), (x.shape[-1],), weight.float(), eps))
        return x
    fused_add_rmsnorm(x, residual, weight, eps)
    return x


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """SGLang's activation launch of a draft layer (sgl_kernel's silu_and_mul; torch's ops where it is absent)."""
    try:
        from sgl_kernel import silu_and_mul as fused
    except ImportError:
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up
    out = torch.empty(gate_up.shape[0], gate_up.shape[1] // 2, dtype=gate_up.dtype, device=gate_up.device)
    fused(gate_up, out)
    return out


def graph_us(calls: list, reps: int = 20) -> float:
    """Mean us per call of ``calls`` replayed from one CUDA graph (after one eager warm-up of each)."""

    def all_calls() -> None:
        for c in calls:
            c()

    return graph_ms(all_calls, reps) * 1e3 / len(calls)


def measure(
    shape: str, m: int, grid: list[tuple[int, int, int, int, int]], projs: list[str] | None = None
) -> list[dict[str, Any]]:
    """Per projection (``projs``, default all): cuBLAS (bf16), cuBLAS fp8 (``torch._scaled_mm``), and the Triton
    kernel over ``grid`` on bf16 weights (``triton``) and on their fp8 copies (``triton_w8``); gate_up_silu: cuBLAS
    then SGLang's activation launch against the Triton kernel's epilogue, and down_add_norm (``down_add_norm_rows``),
    bf16 weights only. The LM head cycles two copies (one is already far past L2)."""
    rows = []
    for proj, (n, k) in projections(shape).items():
        if projs is not None and proj not in projs:
            continue
        glu = proj == "gate_up_silu"
        layers = 2 if proj == "lm_head" else SHAPES[shape][-1]
        ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(layers)]
        w8s = [] if proj in ("gate_up_silu", "down_add_norm") else [quantize_rows(w) for w in ws]
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n // 2 if glu else n, device="cuda", dtype=torch.bfloat16)
        part = torch.empty(8, m, n, device="cuda", dtype=torch.float32)
        gb = n * k * 2 / 1e9
        base = {"shape": shape, "m": m, "proj": proj, "n": n, "k": k}
        if proj == "down_add_norm":
            rows += down_add_norm_rows(base, x, ws, part, gb, grid)
        elif glu:
            us = graph_us([lambda w=w: silu_and_mul(F.linear(x, w)) for w in ws])
            rows.append({**base, "kernel": "cublas", "us": us, "GBps": gb / us * 1e6})
            ref = silu_and_mul(F.linear(x, ws[0])).float()
            rows += glu_rows({**base, "kernel": "triton"}, x, ws, out, ref, gb, grid)
        else:
            us = graph_us([lambda w=w: F.linear(x, w) for w in ws])
            rows.append({**base, "kernel": "cublas", "us": us, "GBps": gb / us * 1e6})
            ref = F.linear(x, ws[0]).float()
            rows.append({**base, **cublas_fp8(x, w8s, ref, gb / 2)})
            rows += triton_rows({**base, "kernel": "triton"}, x, [(w, None) for w in ws], out, part, ref, gb, grid)
            rows += triton_rows({**base, "kernel": "triton_w8"}, x, w8s, out, part, ref, gb / 2, grid)
        del ws, w8s
        torch.cuda.empty_cache()
    return rows


def grid_rows(
    base: dict[str, Any], k: int, grid: list, ref: torch.Tensor, gb: float, layers: int, launch, prepare=None
) -> list[dict[str, Any]]:
    """``launch(config, layer)`` (one call on layer ``layer``'s weights, returning the output to check) over the
    launch parameters ``grid`` whose K split divides ``k``: us, GB/s and the error of layer 0's output against
    ``ref`` (after ``prepare()``, which resets what a call changes in place); a launch the GPU refuses (shared
    memory) is recorded with its error, not fatal."""
    rows = []
    for config in grid:
        if k % (config[2] * config[1]):
            continue
        try:
            if prepare is not None:
                prepare()
            got = launch(config, 0).float()
            err = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
            us = graph_us([lambda i=i: launch(config, i) for i in range(layers)])
        except Exception as exc:
            rows.append({**base, "config": config, "error": repr(exc)[:200]})
            continue
        rows.append({**base, "config": config, "us": us, "GBps": gb / us * 1e6, "rel_err": err})
    return rows


def triton_rows(base: dict[str, Any], x, weights: list, out, part, ref, gb: float, grid: list) -> list[dict[str, Any]]:
    """The skinny GEMM on ``weights`` ((w, scale) per layer) over ``grid``."""

    def launch(config: tuple, i: int) -> torch.Tensor:
        w, scale = weights[i]
        return skinny_gemm(x, w, out, part, *config, scale=scale)

    return grid_rows(base, x.shape[1], grid, ref, gb, len(weights), launch)


def glu_rows(base: dict[str, Any], x, ws: list, out, ref, gb: float, grid: list) -> list[dict[str, Any]]:
    """The draft steps' gate/up kernel with its SiLU-and-mul epilogue (``glu_gemm``: no K split) over ``grid``."""

    def launch(config: tuple, i: int) -> torch.Tensor:
        block_n, block_k, _, warps, stages = config
        return glu_gemm(x, ws[i], out, block_n=block_n, block_k=block_k, warps=warps, stages=stages)

    return grid_rows(base, x.shape[1], [c for c in grid if c[2] == 1], ref, gb, len(ws), launch)


def down_add_norm_rows(base: dict[str, Any], x, ws: list, part, gb: float, grid: list) -> list[dict[str, Any]]:
    """The down projection then the add-RMSNorm: cuBLAS and SGLang's kernel against the Triton kernel, whose split-K
    partials ``reduce_add_norm`` sums (one split: its output, then SGLang's kernel)."""
    m, n = x.shape[0], ws[0].shape[0]
    residual = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    weight = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    out, normed, residual_out = (torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ref = add_rmsnorm(F.linear(x, ws[0]), residual.clone(), weight, 1e-6).float()  # before replays move residual
    start = residual.clone()
    us = graph_us([lambda w=w: add_rmsnorm(F.linear(x, w), residual, weight, 1e-6) for w in ws])
    rows = [{**base, "kernel": "cublas", "us": us, "GBps": gb / us * 1e6}]

    def launch(config: tuple, i: int) -> torch.Tensor:
        if config[2] == 1:
            return add_rmsnorm(skinny_gemm(x, ws[i], out, part, *config), residual, weight, 1e-6)
        skinny_gemm(x, ws[i], out, part, *config, reduce=False)
        return reduce_add_norm(part, config[2], residual, weight, 1e-6, normed, residual_out)

    triton = {**base, "kernel": "triton"}
    return rows + grid_rows(triton, x.shape[1], grid, ref, gb, len(ws), launch, lambda: residual.copy_(start))


def cublas_fp8(x: torch.Tensor, w8s: list, ref: torch.Tensor, gb: float) -> dict[str, Any]:
    """``torch._scaled_mm`` on fp8 activations (quantized per row beforehand, not timed) and the fp8 weights."""
    x8, xs = quantize_rows(x)  # one scale a row, as the weights have one a channel

    def call(w8: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return torch._scaled_mm(x8, w8.t(), scale_a=xs[:, None], scale_b=s[None, :], out_dtype=torch.bfloat16)

    try:
        err = ((call(*w8s[0]).float() - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()
        us = graph_us([lambda w=w, s=s: call(w, s) for w, s in w8s])
    except Exception as exc:  # a torch / GPU without row-wise scaled fp8 GEMMs: recorded
        return {"kernel": "cublas_fp8", "error": repr(exc)[:200]}
    return {"kernel": "cublas_fp8", "us": us, "GBps": gb / us * 1e6, "rel_err": err}


def summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (shape, m, proj): cuBLAS against cuBLAS fp8, the fastest launch of each Triton kernel."""
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
    parser.add_argument("--projs", nargs="+", choices=list(projections("qwen3-1.7b")), help="default: all")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("draft_gemm needs a CUDA GPU")
    started = time.time()
    rows = [r for shape in args.shapes for m in args.batches for r in measure(shape, m, GRID, args.projs)]
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
