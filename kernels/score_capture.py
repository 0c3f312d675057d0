"""PillarAttn score capture: per-KV-head attention mass of the verify queries on the prefix.

After the verify pass of layer l has produced, for every verify query row i and query head,
the natural-log log-sum-exp `lse[i, head]` of that row's full (prefix + causal extend)
attention, this kernel re-reads Q and the prefix K (never V) and writes

    score[h, t] = 1 / (G * n_q) * sum_{i < n_q} sum_{g < G} exp(s(i, h*G + g, t) - lse[i, h*G + g])

for every KV head h and every committed-prefix position t of a verify request, where
G = H_q / H_kv, n_q = the request's number of verify rows (k + 1) and
s = cap(sm_scale * q . k) is the same logit the attention kernel used. Every verify row sees
the whole prefix, so the divisor is the same for all t. The k + 1 verify tokens themselves
are not scored (they are not in kv_indices).

With ``last_row_only`` only the request's last verify row (the query furthest ahead, nearest to
the next round's drafts) is scored: i runs over {n_q - 1} and the divisor is G.

Output layout (flat, SGLang kv_indptr offsets): `out[h, kv_indptr[b] + t]` for t < prefix_len[b];
entries of `out` outside those ranges are left untouched. Pass a per-layer slice
`scores[l]` of a `[num_layers, H_kv, cap]` buffer so that a single selection launch can later
read all layers as `scores.view(num_layers * H_kv, cap)` (see topk_select.py).
Memory: num_layers * H_kv * cap * itemsize; for Qwen3-8B (36 layers, 8 KV heads) that is
1.15 KB per prefix token in fp32 (0.6 KB in fp16), i.e. 0.8 % (0.4 %) of the KV cache itself.
`cap` must be >= the largest total prefix (kv_indptr[bs]) of a verify batch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_int_vector, default_num_splits, splits_cap
from ._tiles import mean_prefix_chunk, soft_cap


@triton.jit
def _score_capture_kernel(
    Q,
    K_Buffer,
    Lse,
    Out,
    qo_indptr,
    kv_indptr,
    kv_indices,
    Enabled,
    sm_scale,
    stride_qt,
    stride_qh,
    stride_kbs,
    stride_kh,
    stride_lt,
    stride_lh,
    stride_oh,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PAR_SPLITS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    LOGIT_CAP: tl.constexpr,
    ACCUMULATE: tl.constexpr,
    TRANSPOSED: tl.constexpr,
    HAS_ENABLED: tl.constexpr,
    LAST_ROW: tl.constexpr,
):
    cur_b = tl.program_id(0)
    cur_kv_head = tl.program_id(1)
    split = tl.program_id(2)

    qo_start = tl.load(qo_indptr + cur_b).to(tl.int64)
    qo_len = tl.load(qo_indptr + cur_b + 1) - qo_start
    kv_start = tl.load(kv_indptr + cur_b).to(tl.int64)
    prefix_len = tl.load(kv_indptr + cur_b + 1) - kv_start

    # Chunks of the batch's mean prefix (as the verify kernel's): in a batch of mixed contexts a long
    # request spreads over more splits instead of one long program per split; empty splits exit.
    chunk = mean_prefix_chunk(kv_indptr, prefix_len, PAR_SPLITS, NUM_SPLITS, BLOCK_N)
    split_start = split * chunk
    split_end = tl.minimum(split_start + chunk, prefix_len)
    n_rows = qo_len * GROUP
    if LAST_ROW:
        # Only the last verify query's GROUP rows: shift the row base to it.
        qo_start += tl.maximum(qo_len - 1, 0)
        n_rows = tl.minimum(qo_len, 1) * GROUP
    run = (split_end > split_start) & (n_rows > 0)
    if HAS_ENABLED:
        run = run & (tl.load(Enabled) != 0)
    if run:
        inv_rows = 1.0 / n_rows.to(tl.float32)
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < D
        out_row = Out + cur_kv_head * stride_oh + kv_start
        # Rows are (verify query i, head g of the group) pairs packed as r = i * GROUP + g. The launcher
        # sizes BLOCK_M for the batch's mean verify width, so this loop normally runs once and Q stays in
        # registers across the whole K sweep; wider requests take more row blocks instead of dropping rows.
        # TRANSPOSED tiles are positions x rows: the per-position sum over rows is then a reduction along
        # the tile's second axis (inside a warp) instead of a cross-warp one on every tile. Measured on the
        # H100 at L = 16K (kernels_capture_*h100.json): 25-31% faster for head dim 64, but for head dim
        # 128 -12% at batch 4 and +61% at batch 64, so the launcher enables it for head dims <= 64 only.
        for m0 in range(0, n_rows, BLOCK_M):
            offs_r = m0 + tl.arange(0, BLOCK_M)
            mask_r = offs_r < n_rows
            row_t = qo_start + offs_r // GROUP
            row_h = cur_kv_head * GROUP + offs_r % GROUP
            q_rows = Q + row_t * stride_qt + row_h * stride_qh
            if TRANSPOSED:
                q = tl.load(q_rows[None, :] + offs_d[:, None], mask=mask_r[None, :] & mask_d[:, None], other=0.0)
            else:
                q = tl.load(q_rows[:, None] + offs_d[None, :], mask=mask_r[:, None] & mask_d[None, :], other=0.0)
            lse = tl.load(Lse + row_t * stride_lt + row_h * stride_lh, mask=mask_r, other=0.0)
            for start_n in range(split_start, split_end, BLOCK_N):
                offs_n = start_n + tl.arange(0, BLOCK_N)
                mask_n = offs_n < split_end
                slot = tl.load(kv_indices + kv_start + offs_n, mask=mask_n, other=0).to(tl.int64)
                k_pos = K_Buffer + slot * stride_kbs + cur_kv_head * stride_kh
                # Same logit as the attention kernels (q cast to the cache dtype, fp32 accumulate, then
                # scale and cap), so exp(s - lse) is their softmax probability.
                if TRANSPOSED:
                    k = tl.load(k_pos[:, None] + offs_d[None, :], mask=mask_n[:, None] & mask_d[None, :], other=0.0)
                    s = tl.dot(k, q.to(k.dtype)).to(tl.float32) * sm_scale
                else:
                    k = tl.load(k_pos[None, :] + offs_d[:, None], mask=mask_n[None, :] & mask_d[:, None], other=0.0)
                    s = tl.dot(q.to(k.dtype), k).to(tl.float32) * sm_scale
                s = soft_cap(s, LOGIT_CAP)
                if TRANSPOSED:
                    p = tl.where(mask_n[:, None] & mask_r[None, :], tl.exp(s - lse[None, :]), 0.0)
                    contrib = tl.sum(p, 1) * inv_rows
                else:
                    p = tl.where(mask_r[:, None] & mask_n[None, :], tl.exp(s - lse[:, None]), 0.0)
                    contrib = tl.sum(p, 0) * inv_rows
                # Later row blocks (and, with ACCUMULATE, earlier layers) left partial sums here.
                if ACCUMULATE:
                    contrib += tl.load(out_row + offs_n, mask=mask_n, other=0.0).to(tl.float32)
                elif m0 > 0:
                    contrib += tl.load(out_row + offs_n, mask=mask_n, other=0.0).to(tl.float32)
                tl.store(out_row + offs_n, contrib.to(Out.dtype.element_ty), mask=mask_n)
            # The next row block re-reads these partial sums, possibly from other threads of this CTA.
            tl.debug_barrier()


def score_capture(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    lse: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    num_splits: int | None = None,
    accumulate: bool = False,
    transposed: bool | None = None,
    enabled: torch.Tensor | None = None,
    last_row_only: bool = False,
    block_n: int | None = None,
    num_warps: int | None = None,
    max_splits: int | None = None,
) -> torch.Tensor:
    """Write PillarAttn scores of one layer into `out` (see the module docstring) and return it.

    accumulate=True adds this layer's scores to what `out` already holds (summing layers
    into one buffer) instead of overwriting.

    q: [num_tokens, H_q, D] verify queries (bf16/fp16); request b owns rows qo_indptr[b]:qo_indptr[b+1].
    k_buffer: [pool_slots, H_kv, D] this layer's K cache (page_size 1).
    lse: [num_tokens, H_q] fp32 natural-log LSE returned by the verify attention for the same rows.
    qo_indptr, kv_indptr: [bs + 1] int32/int64; kv_indices: int slots of each request's committed prefix.
    out: [H_kv, cap] float tensor (fp32/fp16/bf16), last dim contiguous.
    sm_scale: logit scale including any k_scale, as given to the attention kernel.
    num_splits: static prefix splits of a request at the batch's mean prefix length (per KV head); default
    fills about two GPU waves; a longer request gets more, up to ``max_splits`` (default
    ``splits_cap(num_splits)``; >= num_splits).
    transposed: tile orientation (a speed choice only); default: transposed for head dims <= 64.
    enabled: optional [1] int device flag; 0 makes the launch write nothing (read on the device, so a
    captured graph can skip the capture on some replays).
    last_row_only: score only each request's last verify row (module docstring).
    block_n, num_warps: prefix tile width and warps per program (speed only; default from the row block:
    128 wide for up to 64 rows, 15-45% faster than 64 in the H100 sweep at head dims 64 and 128).
    Sizes that vary per step are read on the device only, so the call is CUDA-graph safe.
    """
    if q.dim() != 3 or k_buffer.dim() != 3 or q.shape[-1] != k_buffer.shape[-1]:
        raise ValueError(
            f"q [T, H_q, D] and k_buffer [slots, H_kv, D] expected, got {tuple(q.shape)} {tuple(k_buffer.shape)}"
        )
    num_tokens, h_q, d = q.shape
    h_kv = k_buffer.shape[1]
    if h_q % h_kv:
        raise ValueError(f"H_q={h_q} is not a multiple of H_kv={h_kv}")
    if lse.shape != (num_tokens, h_q) or lse.dtype != torch.float32:
        raise ValueError(f"lse must be fp32 [{num_tokens}, {h_q}], got {lse.dtype} {tuple(lse.shape)}")
    bs = qo_indptr.shape[0] - 1
    check_int_vector("qo_indptr", qo_indptr, bs + 1)
    check_int_vector("kv_indptr", kv_indptr, bs + 1)
    if kv_indices.dim() != 1 or kv_indices.dtype not in (torch.int32, torch.int64):
        raise ValueError("kv_indices must be a 1-D int32/int64 tensor")
    if out.dim() != 2 or out.shape[0] != h_kv or out.stride(1) != 1 or not out.is_floating_point():
        raise ValueError(f"out must be a float [{h_kv}, cap] tensor with a contiguous last dim, got {tuple(out.shape)}")
    if enabled is not None and (enabled.numel() < 1 or enabled.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"enabled must be an int32/int64 device flag, got {enabled.dtype} {tuple(enabled.shape)}")
    group = h_q // h_kv
    if num_splits is None:
        # H100 sweep (kernels_tune_h100.json): with 128-wide tiles, two splits beat one by 13% at
        # 256 x 7K (head dim 64) and cost < 1% where one split already fills the GPU.
        num_splits = max(2, default_num_splits(bs * h_kv, q.device))
    # Row block for the batch's mean verify width (static: tokens / requests); min 16 for tl.dot.
    mean_rows = group if last_row_only else -(-num_tokens // max(bs, 1)) * group
    block_m = max(16, triton.next_power_of_2(mean_rows))
    max_splits = splits_cap(num_splits, max_splits)
    grid = (bs, h_kv, max_splits)
    _score_capture_kernel[grid](
        q,
        k_buffer,
        lse,
        out,
        qo_indptr,
        kv_indptr,
        kv_indices,
        enabled,
        sm_scale,
        q.stride(0),
        q.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        lse.stride(0),
        lse.stride(1),
        out.stride(0),
        GROUP=group,
        D=d,
        BLOCK_D=triton.next_power_of_2(d),
        BLOCK_M=block_m,
        BLOCK_N=block_n or (128 if block_m <= 64 else 32),
        PAR_SPLITS=num_splits,
        NUM_SPLITS=max_splits,
        LOGIT_CAP=logit_cap,
        ACCUMULATE=accumulate,
        TRANSPOSED=d <= 64 if transposed is None else transposed,
        HAS_ENABLED=enabled is not None,
        LAST_ROW=last_row_only,
        num_warps=num_warps or (8 if block_m >= 128 else 4),
        num_stages=2,
    )
    return out


def score_capture_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    lse: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    out: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    accumulate: bool = False,
    last_row_only: bool = False,
) -> torch.Tensor:
    """Plain-torch `score_capture` (same contract, loops over requests; for tests)."""
    h_q, h_kv = q.shape[1], k_buffer.shape[1]
    group = h_q // h_kv
    qo, kv = qo_indptr.tolist(), kv_indptr.tolist()
    for b in range(len(qo) - 1):
        if kv[b + 1] == kv[b] or qo[b + 1] == qo[b]:
            continue
        qb = q[qo[b] : qo[b + 1]].to(k_buffer.dtype).float()  # [n_q, H_q, D]
        kb = k_buffer[kv_indices[kv[b] : kv[b + 1]].long()].float()  # [P, H_kv, D]
        kb = kb.repeat_interleave(group, dim=1)  # [P, H_q, D]
        s = torch.einsum("ihd,thd->iht", qb, kb) * sm_scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        p = torch.exp(s - lse[qo[b] : qo[b + 1], :, None])  # [n_q, H_q, P]
        if last_row_only:
            p = p[-1:]
        per_kv_head = p.view(p.shape[0], h_kv, group, -1).mean(dim=(0, 2))  # [H_kv, P]
        if accumulate:
            per_kv_head = per_kv_head + out[:, kv[b] : kv[b + 1]].float()
        out[:, kv[b] : kv[b + 1]] = per_kv_head.to(out.dtype)
    return out
