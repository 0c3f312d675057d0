"""Building blocks shared by the PillarAttn kernels (inlined by Triton).

The logit soft-cap is shared with score capture, so its probabilities use the attention's logits.
In the split-KV attention kernels (sparse decode, verify) a stage-1 program folds K/V tiles into a
running (max, sum, acc) per query row and ends with a normalized partial output and its natural-log
LSE; stage 2 merges the partials of all splits.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mean_prefix_chunk(kv_indptr, prefix_len, PAR_SPLITS: tl.constexpr, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Prefix positions per split for a request of ``prefix_len`` in a batch of tl.num_programs(0) requests
    whose prefixes kv_indptr delimits: BLOCK_N-aligned chunks of the batch's mean prefix / PAR_SPLITS, larger
    only where the request would need more than NUM_SPLITS of them. A batch of mixed contexts then runs
    programs of about a mean request's share, not one per request as long as the longest; a uniform batch
    is cut into PAR_SPLITS per request, as by its own length."""
    bs = tl.num_programs(0)
    total = tl.load(kv_indptr + bs) - tl.load(kv_indptr)
    chunk = tl.maximum(tl.cdiv(total, bs * PAR_SPLITS), tl.cdiv(prefix_len, NUM_SPLITS))
    return tl.cdiv(chunk, BLOCK_N) * BLOCK_N


@triton.jit
def load_kv_tile(
    K_Buffer, V_Buffer, slot, valid, kv_head, stride_kbs, stride_kh, stride_vbs, stride_vh, offs_d, mask_d
):
    """K as [D, N] (ready for q @ k) and V as [N, D] of the cache slots `slot` [N] of one KV head; masked-out
    entries (`valid` [N] False) read as 0."""
    k = tl.load(
        K_Buffer + slot[None, :] * stride_kbs + kv_head * stride_kh + offs_d[:, None],
        mask=valid[None, :] & mask_d[:, None],
        other=0.0,
    )
    v = tl.load(
        V_Buffer + slot[:, None] * stride_vbs + kv_head * stride_vh + offs_d[None, :],
        mask=valid[:, None] & mask_d[None, :],
        other=0.0,
    )
    return k, v


@triton.jit
def soft_cap(s, LOGIT_CAP: tl.constexpr):
    """tanh logit soft-cap (cap * tanh(s / cap), written with a sigmoid); LOGIT_CAP = 0: identity."""
    if LOGIT_CAP > 0:
        s = LOGIT_CAP * (2.0 * tl.sigmoid(2.0 * s / LOGIT_CAP) - 1.0)
    return s


@triton.jit
def attend_tile(q, k, v, seen, e_max, e_sum, acc, sm_scale, LOGIT_CAP: tl.constexpr):
    """Fold one tile into the online softmax of the rows of q.

    q: [M, D]; k: [D, N]; v: [N, D]; seen: bool, broadcastable to [M, N] (False = masked out);
    e_max, e_sum: [M] fp32; acc: [M, D] fp32. Returns the updated (e_max, e_sum, acc). The running
    max is kept finite, so a fully masked tile leaves a row unchanged.
    """
    qk = soft_cap(tl.dot(q.to(k.dtype), k).to(tl.float32) * sm_scale, LOGIT_CAP)
    qk = tl.where(seen, qk, -float("inf"))
    n_e_max = tl.maximum(tl.maximum(tl.max(qk, 1), e_max), -1e20)
    re_scale = tl.exp(e_max - n_e_max)
    p = tl.exp(qk - n_e_max[:, None])
    acc = acc * re_scale[:, None] + tl.dot(p.to(v.dtype), v).to(tl.float32)
    e_sum = e_sum * re_scale + tl.sum(p, 1)
    return n_e_max, e_sum, acc


@triton.jit
def finish_partial(e_max, e_sum, acc):
    """(normalized partial output [M, D], LSE [M]) of a split; a row that saw nothing: (0, -inf)."""
    has = e_sum > 0
    out = acc / tl.where(has, e_sum, 1.0)[:, None]
    lse = tl.where(has, e_max + tl.log(tl.where(has, e_sum, 1.0)), -float("inf"))
    return out, lse


@triton.jit
def merge_splits(lse, parts):
    """Merge S partials of one row: lse [S] (-inf = empty), parts [S, D] -> (output [D], total LSE)."""
    m = tl.maximum(tl.max(lse, 0), -1e20)
    w = tl.exp(lse - m)
    denom = tl.sum(w, 0)
    return tl.sum(w[:, None] * parts, 0) / tl.where(denom > 0, denom, 1.0), m + tl.log(denom)
