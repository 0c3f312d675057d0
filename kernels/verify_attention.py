"""Split-KV verify attention: k + 1 chained query rows per request, full prefix, LSE out.

Request b has n_b = qo_indptr[b+1] - qo_indptr[b] <= max_extend verify rows (the bonus token
and the k drafts, in order). Row i attends to
  (a) every prefix slot kv_indices[kv_indptr[b] : kv_indptr[b+1]] of k_buffer / v_buffer, and
  (b) the request's own verify tokens j <= i, whose K/V are k_ext / v_ext rows qo_indptr[b] + j
(a causal chain: SGLang's topk=1 EAGLE verify mask). This is the semantics of SGLang's
``extend_attention_fwd`` for such a batch, but computed the way a decode kernel reads the cache:
one program per (request, KV head, split) loads each prefix K/V tile once for the whole GQA
group and all verify rows (rows packed as r = i * G + g into one tl.dot), so the prefix is read
once per KV head at full bandwidth instead of once per query head and row block. The last split
index handles part (b). Stage 2 merges the splits and, if asked, writes each row's natural-log
LSE, which PillarAttn's score capture needs. Split boundaries come from device lengths and the
grid from static sizes only, so launches are CUDA-graph safe. bf16/fp16 in, fp32 accumulation,
optional tanh logit soft-cap; K and V head dims must be equal.

Splits are cut to the batch's mean prefix, not to each request's own length. A serving batch
mixes contexts (requests start as others finish), and with a fixed split count per request the
longest requests' programs set the layer's time: at 256 requests, where one split per request
fills the GPU, a batch spread over 0-7K can cost up to what a uniform 7K batch does, where
stock SGLang's decode kernel, which splits each request by its length, costs about what a batch
at the mean does. Here a request of length L gets ceil(L / chunk) splits with chunk = mean / S (S the
static split count a uniform batch gets), at most ``splits_cap(S)`` (2S): a uniform batch is cut as
before, and in a mixed one spread up to twice the mean no program reads much more than a mean
request's share. Empty splits store only their LSE (-inf), so the spare programs of short requests cost
a few loads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_int_vector, default_num_splits, splits_cap
from ._tiles import attend_tile, finish_partial, load_kv_tile, mean_prefix_chunk


@triton.jit
def _verify_stage1(
    Q,
    K_Ext,
    V_Ext,
    K_Buffer,
    V_Buffer,
    qo_indptr,
    kv_indptr,
    kv_indices,
    Mid_O,
    Mid_lse,
    sm_scale,
    stride_qt,
    stride_qh,
    stride_ket,
    stride_keh,
    stride_vet,
    stride_veh,
    stride_kbs,
    stride_kh,
    stride_vbs,
    stride_vh,
    stride_mt,
    stride_mh,
    stride_ms,
    stride_lt,
    stride_lh,
    GROUP: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_E: tl.constexpr,
    MAX_EXTEND: tl.constexpr,
    PAR_SPLITS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    LOGIT_CAP: tl.constexpr,
):
    cur_b = tl.program_id(0)
    cur_kv_head = tl.program_id(1)
    split = tl.program_id(2)

    qo_start = tl.load(qo_indptr + cur_b).to(tl.int64)
    qo_len = (tl.load(qo_indptr + cur_b + 1) - qo_start).to(tl.int32)
    kv_start = tl.load(kv_indptr + cur_b).to(tl.int64)
    prefix_len = (tl.load(kv_indptr + cur_b + 1) - kv_start).to(tl.int32)

    offs_r = tl.arange(0, BLOCK_M)
    row_q = offs_r // GROUP  # verify row i of packed row r
    heads = cur_kv_head * GROUP + offs_r % GROUP
    mask_r = (row_q < qo_len) & (row_q < MAX_EXTEND)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D

    e_max = tl.full([BLOCK_M], -float("inf"), tl.float32)
    e_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if split < NUM_SPLITS:
        # Splits past the request's prefix are empty.
        chunk = mean_prefix_chunk(kv_indptr, prefix_len, PAR_SPLITS, NUM_SPLITS, BLOCK_N)
        lo = split * chunk
        hi = tl.minimum(lo + chunk, prefix_len)
    else:
        lo = 0
        hi = tl.minimum(qo_len, MAX_EXTEND)
    if (hi > lo) & (qo_len > 0):
        q = tl.load(
            Q + (qo_start + row_q)[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
            mask=mask_r[:, None] & mask_d[None, :],
            other=0.0,
        )
        if split < NUM_SPLITS:
            for start_n in range(lo, hi, BLOCK_N):
                offs_n = start_n + tl.arange(0, BLOCK_N)
                valid = offs_n < hi
                slot = tl.load(kv_indices + kv_start + offs_n, mask=valid, other=0).to(tl.int64)
                k, v = load_kv_tile(
                    K_Buffer, V_Buffer, slot, valid, cur_kv_head, stride_kbs, stride_kh, stride_vbs, stride_vh, offs_d, mask_d
                )
                e_max, e_sum, acc = attend_tile(q, k, v, valid[None, :], e_max, e_sum, acc, sm_scale, LOGIT_CAP)
        else:
            # The verify tokens themselves: one BLOCK_E tile, causal (row i sees j <= i).
            offs_e = tl.arange(0, BLOCK_E)
            valid_e = offs_e < hi
            k = tl.load(
                K_Ext + (qo_start + offs_e)[None, :] * stride_ket + cur_kv_head * stride_keh + offs_d[:, None],
                mask=valid_e[None, :] & mask_d[:, None],
                other=0.0,
            )
            v = tl.load(
                V_Ext + (qo_start + offs_e)[:, None] * stride_vet + cur_kv_head * stride_veh + offs_d[None, :],
                mask=valid_e[:, None] & mask_d[None, :],
                other=0.0,
            )
            seen = valid_e[None, :] & (offs_e[None, :] <= row_q[:, None])
            e_max, e_sum, acc = attend_tile(q, k, v, seen, e_max, e_sum, acc, sm_scale, LOGIT_CAP)

    # Every split writes its LSE (an empty one: -inf) so stage 2 needs no length logic; only splits
    # that attended write their partial output, which stage 2 reads only where the LSE is finite.
    part, lse = finish_partial(e_max, e_sum, acc)
    tok = qo_start + row_q
    mid = tok * stride_mt + heads * stride_mh + split * stride_ms
    attended = (hi > lo) & (qo_len > 0)
    tl.store(Mid_O + mid[:, None] + offs_d[None, :], part, mask=mask_r[:, None] & mask_d[None, :] & attended)
    tl.store(Mid_lse + tok * stride_lt + heads * stride_lh + split, lse, mask=mask_r)


@triton.jit
def _verify_stage2(
    Mid_O,
    Mid_lse,
    Out,
    Lse,
    qo_indptr,
    stride_mt,
    stride_mh,
    stride_ms,
    stride_lt,
    stride_lh,
    stride_ot,
    stride_oh,
    stride_st,
    stride_sh,
    H_Q: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_HH: tl.constexpr,
    NUM_PARTS: tl.constexpr,
    BLOCK_S: tl.constexpr,
    HAS_LSE: tl.constexpr,
):
    # A program merges BLOCK_HH heads of one verify row: a program per (row, head) was thousands of
    # programs each reading a few hundred floats, paced by scheduling rather than by bandwidth.
    cur_b = tl.program_id(0)
    row = tl.program_id(1)
    qo_start = tl.load(qo_indptr + cur_b).to(tl.int64)
    owned = row < tl.load(qo_indptr + cur_b + 1) - qo_start
    tok = qo_start + row
    offs_h = tl.program_id(2) * BLOCK_HH + tl.arange(0, BLOCK_HH)
    mask_h = (offs_h < H_Q) & owned
    offs_s = tl.arange(0, BLOCK_S)
    mask_hs = mask_h[:, None] & (offs_s < NUM_PARTS)[None, :]
    offs_d = tl.arange(0, BLOCK_D)
    lse = tl.load(Mid_lse + tok * stride_lt + offs_h[:, None] * stride_lh + offs_s[None, :], mask=mask_hs,
                  other=-float("inf"))  # fmt: skip
    part_ptr = Mid_O + tok * stride_mt + offs_h[:, None, None] * stride_mh + offs_s[None, :, None] * stride_ms
    part_mask = (mask_hs & (lse > -float("inf")))[:, :, None] & (offs_d < D)[None, None, :]
    parts = tl.load(part_ptr + offs_d[None, None, :], mask=part_mask, other=0.0)
    m = tl.maximum(tl.max(lse, 1), -1e20)  # merge_splits, per head
    w = tl.exp(lse - m[:, None])
    denom = tl.sum(w, 1)
    o = tl.sum(w[:, :, None] * parts, 1) / tl.where(denom > 0, denom, 1.0)[:, None]
    out_mask = mask_h[:, None] & (offs_d < D)[None, :]
    tl.store(Out + tok * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :], o.to(Out.dtype.element_ty),
             mask=out_mask)  # fmt: skip
    if HAS_LSE:
        tl.store(Lse + tok * stride_st + offs_h * stride_sh, m + tl.log(denom), mask=mask_h)


def verify_attention_fwd(
    q: torch.Tensor,
    k_ext: torch.Tensor,
    v_ext: torch.Tensor,
    o: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    max_extend: int,
    sm_scale: float,
    logit_cap: float = 0.0,
    lse: torch.Tensor | None = None,
    num_kv_splits: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
    max_kv_splits: int | None = None,
) -> torch.Tensor:
    """Verify attention of one layer into `o` (semantics in the module docstring); returns `o`.

    q, o: [T, H_q, D] (o in q's dtype; T >= qo_indptr[bs]); k_ext, v_ext: [T, H_kv, D] the verify
    tokens' own K/V; k_buffer, v_buffer: [slots, H_kv, D] page_size-1 cache.
    qo_indptr, kv_indptr: [bs + 1] int offsets; kv_indices: prefix slots.
    max_extend: static row count per request (k + 1); a request's rows past it, and rows no request
    owns, are not written.
    lse: optional [T, H_q] fp32 out, natural log, over prefix and chain.
    num_kv_splits: static prefix split count of a request at the batch's mean prefix length, default
    about two GPU waves; a longer request gets more, up to ``max_kv_splits`` (default
    ``splits_cap(num_kv_splits)``; >= num_kv_splits).
    block_n, num_warps, num_stages: tile width along the prefix (default: 128 for head dims <= 64 or
    row blocks <= 32, else 32), warps per program and software pipeline depth (speed only).
    """
    if q.dim() != 3 or k_buffer.dim() != 3 or v_buffer.shape != k_buffer.shape or q.shape[2] != k_buffer.shape[2]:
        shapes = f"{tuple(q.shape)} {tuple(k_buffer.shape)} {tuple(v_buffer.shape)}"
        raise ValueError(f"q [T, H_q, D] and equal k/v buffers [slots, H_kv, D] expected, got {shapes}")
    t, h_q, d = q.shape
    h_kv = k_buffer.shape[1]
    if h_q % h_kv:
        raise ValueError(f"H_q={h_q} is not a multiple of H_kv={h_kv}")
    if k_ext.shape != (t, h_kv, d) or v_ext.shape != k_ext.shape:
        raise ValueError(f"k_ext/v_ext must be [{t}, {h_kv}, {d}], got {tuple(k_ext.shape)} {tuple(v_ext.shape)}")
    if o.shape != q.shape or o.dtype != q.dtype:
        raise ValueError(f"o must match q ({q.dtype} {tuple(q.shape)}), got {o.dtype} {tuple(o.shape)}")
    if any(x.stride(2) != 1 for x in (q, k_ext, v_ext, o, k_buffer, v_buffer)):
        raise ValueError("q, k_ext, v_ext, o and the k/v buffers need a contiguous last dim")
    bs = qo_indptr.shape[0] - 1
    check_int_vector("qo_indptr", qo_indptr, bs + 1)
    check_int_vector("kv_indptr", kv_indptr, bs + 1)
    if max_extend < 1:
        raise ValueError(f"max_extend must be >= 1, got {max_extend}")
    if lse is not None and (lse.shape != (t, h_q) or lse.dtype != torch.float32):
        raise ValueError(f"lse must be float32 [{t}, {h_q}], got {lse.dtype} {tuple(lse.shape)}")
    if bs == 0 or t == 0:
        return o
    group = h_q // h_kv
    if num_kv_splits is None:
        num_kv_splits = default_num_splits(bs * h_kv, q.device, cap=16)

    block_m = max(16, triton.next_power_of_2(max_extend * group))
    if block_n is None:
        # Sweeps at 4 warps, 3 stages: at head dim 64 a 128-wide tile reads the prefix at 2.4-2.5 TB/s for
        # 256 x 4-7K on the H100 (kernels_tune_h100.json), 1.73x faster than 32; at head dim 128 with a
        # 32-row block (GQA 2, k = 8: Qwen3-1.7B) it reads 64 x 4K at 3.55 TB/s on the H200, 1.22x faster
        # than 32 (kernels_tune_qwen3-1.7b_h200_ea20acc.json); with a 64-row block (GQA 4: Qwen3-8B) the
        # 32-wide tile is best on the H100 (401 against 447 us at 64 x 4K).
        block_n = 128 if d <= 64 or block_m <= 32 else 32
    max_splits = splits_cap(num_kv_splits, max_kv_splits)
    parts = max_splits + 1  # the last one is the chain of verify tokens
    block_d = triton.next_power_of_2(d)
    mid_o = torch.empty((t, h_q, parts, d), dtype=torch.float32, device=q.device)
    mid_lse = torch.empty((t, h_q, parts), dtype=torch.float32, device=q.device)
    _verify_stage1[(bs, h_kv, parts)](
        q,
        k_ext,
        v_ext,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        mid_o,
        mid_lse,
        sm_scale,
        q.stride(0),
        q.stride(1),
        k_ext.stride(0),
        k_ext.stride(1),
        v_ext.stride(0),
        v_ext.stride(1),
        k_buffer.stride(0),
        k_buffer.stride(1),
        v_buffer.stride(0),
        v_buffer.stride(1),
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        GROUP=group,
        D=d,
        BLOCK_D=block_d,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_E=max(16, triton.next_power_of_2(max_extend)),
        MAX_EXTEND=max_extend,
        PAR_SPLITS=num_kv_splits,
        NUM_SPLITS=max_splits,
        LOGIT_CAP=logit_cap,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    # Stage 1 wrote partials only for the rows requests own (i < min(n_b, max_extend)), and
    # stage 2 visits exactly those, so every other row of o / lse is left untouched.
    block_hh = min(triton.next_power_of_2(h_q), 16)
    _verify_stage2[(bs, max_extend, triton.cdiv(h_q, block_hh))](
        mid_o,
        mid_lse,
        o,
        lse if lse is not None else mid_lse,
        qo_indptr,
        mid_o.stride(0),
        mid_o.stride(1),
        mid_o.stride(2),
        mid_lse.stride(0),
        mid_lse.stride(1),
        o.stride(0),
        o.stride(1),
        lse.stride(0) if lse is not None else 0,
        lse.stride(1) if lse is not None else 0,
        H_Q=h_q,
        D=d,
        BLOCK_D=block_d,
        BLOCK_HH=block_hh,
        NUM_PARTS=parts,
        BLOCK_S=triton.next_power_of_2(parts),
        HAS_LSE=lse is not None,
        num_warps=4,
    )
    return o


def verify_attention_ref(
    q: torch.Tensor,
    k_ext: torch.Tensor,
    v_ext: torch.Tensor,
    o: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    max_extend: int,
    sm_scale: float,
    logit_cap: float = 0.0,
    lse: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain-torch `verify_attention_fwd` (fp32 math, a loop over requests; for tests)."""
    h_q, h_kv = q.shape[1], k_buffer.shape[1]
    group = h_q // h_kv
    for b in range(qo_indptr.shape[0] - 1):
        q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
        n = min(q1 - q0, max_extend)
        if n <= 0:
            continue
        slots = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])].long()
        keys = torch.cat([k_buffer[slots], k_ext[q0 : q0 + n]]).float().repeat_interleave(group, dim=1)
        vals = torch.cat([v_buffer[slots], v_ext[q0 : q0 + n]]).float().repeat_interleave(group, dim=1)
        s = torch.einsum("ihd,jhd->hij", q[q0 : q0 + n].float(), keys) * sm_scale
        if logit_cap > 0:
            s = logit_cap * torch.tanh(s / logit_cap)
        p_len = slots.numel()
        chain = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        seen = torch.cat([torch.ones(n, p_len, dtype=torch.bool, device=q.device), chain], dim=1)
        s = s.masked_fill(~seen, -float("inf"))
        o[q0 : q0 + n] = torch.einsum("hij,jhd->ihd", s.softmax(-1), vals).to(o.dtype)
        if lse is not None:
            lse[q0 : q0 + n] = s.logsumexp(-1).transpose(0, 1)
    return o
