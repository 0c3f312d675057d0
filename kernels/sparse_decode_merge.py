"""Stage 2 of the sparse decode attention (``sparse_decode.py``): merge the partial outputs of stage 1.

Stage 1 writes each program's normalized partial output and its natural-log LSE, per query head: request
b's splits are Mid_O[b, :, s]. The merge writes each request's output row.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._tiles import merge_splits


@triton.jit
def _sparse_decode_stage2(
    Mid_O,
    Mid_lse,
    Out,
    stride_mb,
    stride_mh,
    stride_ms,
    stride_lb,
    stride_lh,
    stride_ob,
    stride_oh,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    cur_b = tl.program_id(0).to(tl.int64)
    cur_head = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    mask_s = offs_s < NUM_SPLITS
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D
    base = cur_b * stride_mb + cur_head * stride_mh
    lse = tl.load(Mid_lse + cur_b * stride_lb + cur_head * stride_lh + offs_s, mask=mask_s, other=-float("inf"))
    parts = tl.load(
        Mid_O + base + offs_s[:, None] * stride_ms + offs_d[None, :],
        mask=mask_s[:, None] & mask_d[None, :],
        other=0.0,
    )
    o, _ = merge_splits(lse, parts)
    tl.store(Out + cur_b * stride_ob + cur_head * stride_oh + offs_d, o.to(Out.dtype.element_ty), mask=mask_d)


def merge_split_partials(mid_o: torch.Tensor, mid_lse: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """Merge a static split grid into ``o``; returns ``o``.

    mid_o: [bs, H_q, S, D] fp32 partials; mid_lse: [bs, H_q, S] fp32 (-inf = empty split); o: [bs, H_q, D].
    """
    bs, h_q, num_splits, d = mid_o.shape
    _sparse_decode_stage2[(bs, h_q)](
        mid_o,
        mid_lse,
        o,
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        o.stride(0),
        o.stride(1),
        D=d,
        BLOCK_D=triton.next_power_of_2(d),
        NUM_SPLITS=num_splits,
        BLOCK_S=triton.next_power_of_2(num_splits),
        num_warps=4,
    )
    return o

