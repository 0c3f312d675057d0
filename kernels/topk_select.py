"""Batched top-K selection of PillarAttn scores, output sorted by position.

Rows: for request b and row r (r enumerates (layer, KV head) pairs, e.g. r = layer * H_kv + h when
`scores` is a `[num_layers, H_kv, cap]` buffer viewed as `[num_layers * H_kv, cap]`), the candidate
scores are `scores[r, seg_start[b] : seg_start[b] + seg_len[b]]`, i.e. positions 0..seg_len[b]-1 of
the request (seg_start is normally score_capture's kv_indptr[:-1]).

Result for request b, written to row d = out_rows[b] (or b) of the outputs:
    cnt = min(max(k[b], 0), seg_len[b], Kmax)
    out[d, r, :cnt]  = the positions of the cnt largest scores of row r, sorted ascending,
    out[d, r, cnt:]  = -1,
    out_cnt[d]       = cnt (the same for every row r of the request).
Ties are broken towards the lower position; -0.0 equals +0.0; NaN scores are not supported.
K >= seg_len returns every position, K = 0 returns nothing, K > Kmax is clamped to Kmax.

Triton method (one program per (request, row), CUDA-graph safe): a radix select over an
order-preserving unsigned image of the score finds the cnt-th largest key in 8-bit histogram
passes (four for fp32 scores, two for fp16/bf16); a final pass in position order keeps every key
above it plus the first `need` keys equal to it, compacting with prefix sums, so the output comes
out sorted for free. Cost: 5 reads of an fp32 row, 3 of a 16-bit one (20 vs 6 bytes per
candidate), so storing scores in fp16 makes selection about 3x cheaper.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_int_vector


@triton.jit
def _ordered_key(x, KEY_BITS: tl.constexpr):
    """Unsigned key (in a uint32) whose order is the float order of `x`, -0.0 folded onto +0.0.

    16-bit scores get 16-bit keys, so selection needs two radix passes instead of four.
    """
    x = (x.to(tl.float32) + 0.0).to(x.dtype)  # exact round trip; the add is done in fp32
    if KEY_BITS == 16:
        bits = x.to(tl.uint16, bitcast=True).to(tl.uint32)
        key = tl.where((bits >> 15) != 0, bits ^ 0xFFFF, bits | 0x8000)
    else:
        bits = x.to(tl.uint32, bitcast=True)
        key = tl.where((bits >> 31) != 0, bits ^ 0xFFFFFFFF, bits | 0x80000000)
    return key


@triton.jit
def _topk_select_kernel(
    Scores,
    Seg_start,
    Seg_len,
    K_req,
    Out,
    Out_cnt,
    Out_rows,
    stride_sr,
    stride_ob,
    stride_or,
    KMAX: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    KEY_BITS: tl.constexpr,
    HAS_OUT_ROWS: tl.constexpr,
):
    cur_b = tl.program_id(0)
    cur_r = tl.program_id(1)
    if HAS_OUT_ROWS:
        dst = tl.load(Out_rows + cur_b).to(tl.int64)
    else:
        dst = cur_b.to(tl.int64)
    start = tl.load(Seg_start + cur_b).to(tl.int64)
    n = tl.maximum(tl.load(Seg_len + cur_b).to(tl.int32), 0)
    k_eff = tl.minimum(tl.minimum(tl.maximum(tl.load(K_req + cur_b).to(tl.int32), 0), n), KMAX)
    row = Scores + cur_r.to(tl.int64) * stride_sr + start
    out_row = Out + dst * stride_ob + cur_r.to(tl.int64) * stride_or
    offs = tl.arange(0, BLOCK_N)

    # Defaults select everything (every key is >= 0 and at most n of them equal 0).
    thresh = tl.zeros([], dtype=tl.uint32)
    need_eq = n
    if (k_eff > 0) & (k_eff < n):
        bins = tl.arange(0, 256)
        prefix = tl.zeros([], dtype=tl.uint32)
        remaining = k_eff  # how many of the keys matching `prefix` still have to be taken
        for p in tl.static_range(KEY_BITS // 8):  # digits of 8 bits, most significant first
            hist = tl.zeros([256], dtype=tl.int32)
            for t in range(0, n, BLOCK_N):
                mask = (t + offs) < n
                key = _ordered_key(tl.load(row + t + offs, mask=mask, other=0.0), KEY_BITS)
                if p > 0:
                    mask = mask & ((key >> (KEY_BITS - 8 * p)) == prefix)
                hist += tl.histogram(((key >> (KEY_BITS - 8 - 8 * p)) & 0xFF).to(tl.int32), 256, mask=mask)
            # Highest digit whose keys (together with all higher digits) reach `remaining`.
            at_or_above = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist
            digit = tl.max(tl.where(at_or_above >= remaining, bins, -1), 0)
            remaining -= tl.sum(tl.where(bins == digit, at_or_above - hist, 0), 0)
            prefix = (prefix << 8) | digit.to(tl.uint32)
        thresh = prefix
        need_eq = remaining

    n_loop = tl.where(k_eff > 0, n, 0)
    taken = 0
    seen_eq = 0
    for t in range(0, n_loop, BLOCK_N):
        pos = t + offs
        mask = pos < n
        key = _ordered_key(tl.load(row + pos, mask=mask, other=0.0), KEY_BITS)
        is_eq = (mask & (key == thresh)).to(tl.int32)
        eq_rank = seen_eq + tl.cumsum(is_eq, 0) - is_eq
        take = (mask & (key > thresh)) | ((is_eq != 0) & (eq_rank < need_eq))
        take_i = take.to(tl.int32)
        tl.store(out_row + taken + tl.cumsum(take_i, 0) - take_i, pos, mask=take)
        taken += tl.sum(take_i, 0)
        seen_eq += tl.sum(is_eq, 0)

    offs_k = tl.arange(0, BLOCK_K)
    for t in range((k_eff // BLOCK_K) * BLOCK_K, KMAX, BLOCK_K):
        idx = t + offs_k
        tl.store(out_row + idx, tl.full([BLOCK_K], -1, tl.int32), mask=(idx >= k_eff) & (idx < KMAX))
    if cur_r == 0:
        tl.store(Out_cnt + dst, k_eff)


def _check_select_args(scores, seg_start, seg_len, k, out, out_cnt, out_rows) -> int:
    if scores.dim() != 2 or scores.stride(1) != 1 or scores.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(
            f"scores must be fp32/fp16/bf16 [rows, cap] with a contiguous last dim, "
            f"got {scores.dtype} {tuple(scores.shape)}"
        )
    bs = seg_start.shape[0]
    check_int_vector("seg_start", seg_start, bs)
    check_int_vector("seg_len", seg_len, bs)
    check_int_vector("k", k, bs)
    if out.dim() != 3 or out.dtype != torch.int32 or out.shape[1] != scores.shape[0] or out.stride(2) != 1:
        raise ValueError(
            f"out must be int32 [N, {scores.shape[0]}, Kmax] with a contiguous last dim, "
            f"got {out.dtype} {tuple(out.shape)}"
        )
    if out_cnt.dim() != 1 or out_cnt.dtype != torch.int32 or out_cnt.shape[0] != out.shape[0]:
        raise ValueError(f"out_cnt must be int32 [{out.shape[0]}], got {out_cnt.dtype} {tuple(out_cnt.shape)}")
    if out_rows is not None:
        check_int_vector("out_rows", out_rows, bs)
    elif out.shape[0] < bs:
        raise ValueError(f"out has {out.shape[0]} request rows for a batch of {bs}")
    return bs


def topk_select(
    scores: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    k: torch.Tensor,
    out: torch.Tensor,
    out_cnt: torch.Tensor,
    out_rows: torch.Tensor | None = None,
    block_n: int = 4096,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k positions per (request, row), sorted ascending (contract in the module docstring).

    scores: [R, cap] fp32/fp16/bf16; seg_start, seg_len, k: [bs] int32/int64 device tensors.
    out: [N, R, Kmax] int32 (Kmax = out.shape[2]); out_cnt: [N] int32.
    out_rows: optional [bs] destination row per request (e.g. req_pool_indices); default b.
    block_n: candidates per loop step (power of 2); large tiles cut the serial steps of a long row.
    Returns (out, out_cnt).
    """
    bs = _check_select_args(scores, seg_start, seg_len, k, out, out_cnt, out_rows)
    kmax = out.shape[2]
    _topk_select_kernel[(bs, scores.shape[0])](
        scores,
        seg_start,
        seg_len,
        k,
        out,
        out_cnt,
        out_rows,
        scores.stride(0),
        out.stride(0),
        out.stride(1),
        KMAX=kmax,
        BLOCK_N=block_n,
        BLOCK_K=min(1024, triton.next_power_of_2(max(kmax, 1))),
        KEY_BITS=8 * scores.element_size(),
        HAS_OUT_ROWS=out_rows is not None,
        num_warps=8 if block_n >= 2048 else 4,
    )
    return out, out_cnt


def topk_select_ref(
    scores: torch.Tensor,
    seg_start: torch.Tensor,
    seg_len: torch.Tensor,
    k: torch.Tensor,
    out: torch.Tensor,
    out_cnt: torch.Tensor,
    out_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain-torch `topk_select`: stable descending sort (ties -> lower position), then sort positions."""
    _check_select_args(scores, seg_start, seg_len, k, out, out_cnt, out_rows)
    kmax = out.shape[2]
    rows = out_rows.tolist() if out_rows is not None else range(seg_start.shape[0])
    for b, d in enumerate(rows):
        start, n = int(seg_start[b]), max(int(seg_len[b]), 0)
        cnt = min(max(int(k[b]), 0), n, kmax)
        x = scores[:, start : start + n].float() + 0.0
        order = torch.sort(x, dim=1, descending=True, stable=True).indices[:, :cnt]
        out[d] = -1
        out[d, :, :cnt] = order.sort(dim=1).values.to(torch.int32)
        out_cnt[d] = cnt
    return out, out_cnt
