"""fp8 (e4m3) copies with one scale a row, for a draft step's LM head (``--pillar-draft-lm-head fp8``).

A draft step reads the whole LM head (Qwen3-1.7B: 151,936 x 2048 bf16, 622 MB) to score 64 rows: 161 us with cuBLAS
on an H200, against 102 us for cuBLAS's fp8 GEMM on a per-channel fp8 copy with activations quantized per row
(draft_gemm_h200_e8410c8.json). Drafts need not use the exact weights: the verify's rejection sampling keeps the
output exact for whatever distribution a draft was drawn from, so a coarser LM head only moves acceptance.
``quantize_rows`` makes the weight's copy once; ``quantize_activations`` the step's rows; ``scaled_logits`` the
product in bf16.
"""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0  # largest finite float8_e4m3fn
MIN_SCALE = 1e-12  # an all-zero row keeps a tiny scale and zeros


def quantize_rows(w: torch.Tensor, chunk: int = 8192) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 e4m3 rows [N, K], fp32 scale [N]): each row scaled so its largest magnitude is FP8_MAX. ``chunk`` rows at
    a time, so the fp32 working copy stays small next to a large weight (an LM head's fp32 copy alone is 1-2.5 GB)."""
    w8 = torch.empty(w.shape, dtype=FP8, device=w.device)
    scale = torch.empty(w.shape[0], dtype=torch.float32, device=w.device)
    for start in range(0, w.shape[0], chunk):
        rows = w[start : start + chunk].float()
        s = (rows.abs().amax(dim=1) / FP8_MAX).clamp_min(MIN_SCALE)
        w8[start : start + chunk] = (rows / s[:, None]).to(FP8)
        scale[start : start + chunk] = s
    return w8, scale


def quantize_activations(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_rows`` of a step's rows x [M, K] in one piece, shape-static (CUDA-graph safe): (fp8 [M, K], [M])."""
    xf = x.float()
    scale = xf.abs().amax(dim=1).div_(FP8_MAX).clamp_min_(MIN_SCALE)
    return (xf / scale[:, None]).to(FP8), scale


def scaled_logits(x: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ (w_scale[n] x w8[n]).T in x's dtype: cuBLAS's fp8 GEMM on x quantized per row."""
    x8, x_scale = quantize_activations(x)
    return torch._scaled_mm(x8, w8.t(), scale_a=x_scale[:, None], scale_b=w_scale[None, :], out_dtype=x.dtype)
