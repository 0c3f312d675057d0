"""What a draft step's sparse attention applies to q and the new key as it loads them (``prologue_rows``): a
per-head RMS norm (Qwen3's q_norm / k_norm) and the neox rotary embedding, each as SGLang's own kernel computes it
(fp32 math, rounded to the activations' dtype after each); plain-torch references ``rms_norm_ref`` and
``rope_neox_ref``. The rotary layout is SGLang's ``cos_sin_cache``: per position, the cos of every frequency then
the sin, over the whole head (rotary dim = head dim); dimension d pairs with d +- D/2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def prologue_rows(
    x, x_ptr, offs_d, mask, W, eps, cs_row, D: tl.constexpr, NORM: tl.constexpr, ROPE: tl.constexpr
):  # fmt: skip
    """Rows x [M, BLOCK_D] as loaded from x_ptr + offs_d ([1, BLOCK_D]; lanes >= D are 0): their RMS norm with
    weight W [D] and ``eps`` (NORM), then their rotation by the cos | sin row at cs_row (ROPE). The rotation's
    partner lanes are loaded again and normalized with their own row's scale."""
    HALF: tl.constexpr = D // 2
    xf = x.to(tl.float32)
    if ROPE:
        partner = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
        other = tl.load(x_ptr + partner, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        inv = tl.rsqrt(tl.sum(xf * xf, axis=1) / D + eps)[:, None]
        xf = (xf * inv * tl.load(W + offs_d, mask=offs_d < D, other=0.0).to(tl.float32)).to(x.dtype).to(tl.float32)
        if ROPE:
            w_partner = tl.load(W + partner, mask=offs_d < D, other=0.0).to(tl.float32)
            other = (other * inv * w_partner).to(x.dtype).to(tl.float32)
    if ROPE:
        freq = tl.where(offs_d < HALF, offs_d, offs_d - HALF)
        cos = tl.load(cs_row + freq, mask=offs_d < D, other=1.0).to(tl.float32)
        sin = tl.load(cs_row + HALF + freq, mask=offs_d < D, other=0.0).to(tl.float32)
        xf = xf * cos + tl.where(offs_d < HALF, -1.0, 1.0) * other * sin
    return xf.to(x.dtype)


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Per-row RMS norm of x [..., D] with weight [D] (fp32 math, x's dtype out), as SGLang's RMSNorm."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def rope_neox_ref(x: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Neox rotary embedding of x [bs, heads, D] at positions [bs] (fp32 math, x's dtype out)."""
    half = x.shape[-1] // 2
    cs = cos_sin_cache[positions.long()].float()[:, None, :]  # [bs, 1, D]: cos | sin
    cos, sin = cs[..., :half], cs[..., half:]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
