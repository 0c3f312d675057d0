"""The neox rotary embedding as the sparse draft kernel applies it to what it loads (``rope_rows``), and its
plain-torch reference (``rope_neox_ref``). The layout is SGLang's ``cos_sin_cache``: per position, the cos of every
frequency then the sin, over the whole head (rotary dim = head dim); dimension d pairs with d +- D/2.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def rope_rows(x, x_ptr, offs_d, mask, cs_row, HALF: tl.constexpr):
    """Neox rotary embedding of the rows x [..., BLOCK_D] loaded from x_ptr + offs_d (the partner of d is
    d +- HALF), with cos | sin halves at cs_row: fp32 math, x's dtype out, as SGLang's rotary kernel."""
    partner = tl.where(offs_d < HALF, offs_d + HALF, offs_d - HALF)
    sign = tl.where(offs_d < HALF, -1.0, 1.0)
    freq = tl.where(offs_d < HALF, offs_d, offs_d - HALF)
    cos = tl.load(cs_row + freq, mask=offs_d < 2 * HALF, other=1.0).to(tl.float32)
    sin = tl.load(cs_row + HALF + freq, mask=offs_d < 2 * HALF, other=0.0).to(tl.float32)
    other = tl.load(x_ptr + partner, mask=mask, other=0.0).to(tl.float32)
    return (x.to(tl.float32) * cos + sign * other * sin).to(x.dtype)


def rope_neox_ref(x: torch.Tensor, cos_sin_cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Neox rotary embedding of x [bs, heads, D] at positions [bs] (fp32 math, x's dtype out)."""
    half = x.shape[-1] // 2
    cs = cos_sin_cache[positions.long()].float()[:, None, :]  # [bs, 1, D]: cos | sin
    cos, sin = cs[..., :half], cs[..., half:]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
