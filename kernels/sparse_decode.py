"""PillarAttn sparse decode attention (one query per request, the draft step).

Request b, KV head h attends over the union of
  (a) its selected positions  sel_pos[r, h, :sel_cnt[r]]  with r = sel_rows[b] (or b), kept only
      where 0 <= pos < tail_start[b] (so the union with the tail has no duplicates), and
  (b) the shared tail  tail_start[b] <= pos < seq_lens[b]  (recent verified tokens, this round's
      drafts, and the current token, whose KV is already written),
and every position is mapped to its KV slot through req_to_token[req_pool_indices[b], pos]. A KV head marked in
``dense_heads`` attends the whole prefix instead (its tail starts at 0, so no selection is read); one given a row
of ``match`` lists attends, besides, that list's positions of request b below its tail (``token_match.py``: the
token matches its plan does not hold, so no position is attended twice; -1 entries are skipped).
Given the step's own K/V (``new_kv``), the kernel also writes them into their slots, which saves the
separate store launch of every layer of every draft step: the current token is then attended from the
step's K/V in registers instead of being read back from the cache, so no program reads a slot this
launch writes. Given a rotary embedding as well (``rope``: SGLang's neox cos | sin cache and each row's
position) and optionally a per-head RMS norm before it (``qk_norm``, Qwen3's), the kernel normalizes and
rotates the query and the step's key as it loads them (``qk_prologue.py``), which saves those launches of
every layer too (the model's calls are deferred to here, ``patches/draft_qk.py``).
Selections stay position-based (sorted, as topk_select writes them), so they survive slot changes.

Flash-decoding in two stages like SGLang's decode kernel: stage 1 runs a program per
(request, KV head, split) that handles the whole GQA group with tl.dot and writes a normalized
partial output and its LSE; stage 2 (``sparse_decode_merge.py``) merges the splits. Split
boundaries come from the device lengths, the grid only from static sizes, so launches are
CUDA-graph safe. bf16/fp16 inputs, fp32 accumulation, natural-log softmax, optional tanh logit
soft-cap. An empty attention set yields a zero output row.

At a full draft batch (64 requests x 8 KV heads of Qwen3-1.7B) the 512 programs run in one wave only while the
sm_90 build stays at or under 128 registers a thread (today 88-90): a variant that kept the normalized q live
across the tile loop took 162 and ran 41.8 instead of 27.9 us a layer (sparse_layout_h200_e26c1cb.json). The first
tile taken out of the loop to look its slots up ahead of q's prologue (90 registers) ran 40.8 against 29.6
(sparse_layout_h200_2b172bd.json): the tiles stay in one loop.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_int_vector, default_num_splits
from ._tiles import attend_tile, finish_partial, load_kv_tile
from .qk_prologue import prologue_rows
from .sparse_decode_merge import merge_split_partials


@triton.jit
def _tile_slots(sel_base, req_row, start_n, end, cnt, tail_start, seq_len, BLOCK_N: tl.constexpr):
    """(KV slots [BLOCK_N] int64, valid [BLOCK_N]) of virtual indices start_n .. start_n + BLOCK_N - 1 below end:
    index j < cnt is the j-th selected position (kept below tail_start), j >= cnt tail position tail_start + j - cnt."""
    offs_j = start_n + tl.arange(0, BLOCK_N)
    in_range = offs_j < end
    in_sel = offs_j < cnt
    sel_pos = tl.load(sel_base + offs_j, mask=in_range & in_sel, other=-1)
    pos = tl.where(in_sel, sel_pos, tail_start + offs_j - cnt)
    valid = in_range & (pos >= 0) & (pos < tl.where(in_sel, tail_start, seq_len))
    return tl.load(req_row + pos, mask=valid, other=0).to(tl.int64), valid


@triton.jit
def _match_slots(list_base, req_row, start_n, end, tail_start, BLOCK_N: tl.constexpr):
    """(KV slots, valid) of a match list's entries start_n .. start_n + BLOCK_N - 1 below end (kept below the tail)."""
    offs_j = start_n + tl.arange(0, BLOCK_N)
    pos = tl.load(list_base + offs_j, mask=offs_j < end, other=-1)
    valid = (pos >= 0) & (pos < tail_start)
    return tl.load(req_row + pos, mask=valid, other=0).to(tl.int64), valid


@triton.jit
def _sparse_decode_stage1(
    Q,
    K_Buffer,
    V_Buffer,
    Req_to_token,
    Req_pool_indices,
    Sel_pos,
    Sel_cnt,
    Sel_rows,
    Tail_start,
    Seq_lens,
    Dense_heads,
    Match_lists,
    Match_cnt,
    Match_heads,
    K_new,
    V_new,
    Out_loc,
    Cos_sin,
    Rope_pos,
    Q_w,
    K_w,
    q_eps,
    k_eps,
    Mid_O,
    Mid_lse,
    sm_scale,
    stride_qb,
    stride_qh,
    stride_kbs,
    stride_kh,
    stride_vbs,
    stride_vh,
    stride_rt,
    stride_knb,
    stride_knh,
    stride_vnb,
    stride_vnh,
    stride_cs,
    stride_sb,
    stride_sh,
    stride_mll,
    stride_mlb,
    stride_mb,
    stride_mh,
    stride_ms,
    stride_lb,
    stride_lh,
    GROUP: tl.constexpr,
    KMAX: tl.constexpr,
    D: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    LOGIT_CAP: tl.constexpr,
    HAS_SEL_ROWS: tl.constexpr,
    HAS_DENSE: tl.constexpr,
    MATCH: tl.constexpr,
    NEW_KV: tl.constexpr,
    ROPE: tl.constexpr,
    NORM: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # the next launch may start now; every input here may be the previous launch's output
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    cur_b = tl.program_id(0).to(tl.int64)
    cur_kv_head = tl.program_id(1)
    split = tl.program_id(2)

    if HAS_SEL_ROWS:
        sel_row = tl.load(Sel_rows + cur_b).to(tl.int64)
    else:
        sel_row = cur_b
    req_row = Req_to_token + tl.load(Req_pool_indices + cur_b).to(tl.int64) * stride_rt
    sel_base = Sel_pos + sel_row * stride_sb + cur_kv_head * stride_sh
    cnt = tl.minimum(tl.maximum(tl.load(Sel_cnt + sel_row).to(tl.int32), 0), KMAX)
    tail_start = tl.load(Tail_start + cur_b).to(tl.int32)
    if HAS_DENSE:
        tail_start = tl.where(tl.load(Dense_heads + cur_kv_head) != 0, 0, tail_start)
    # Selections are kept only below tail_start: with the tail at 0 (a request drafting densely)
    # none is, so skip the loop over them.
    cnt = tl.where(tail_start > 0, cnt, 0)
    seq_len = tl.load(Seq_lens + cur_b).to(tl.int32)
    # With NEW_KV the current position (seq_len - 1) comes from K_new / V_new: the cache reads stop before it.
    cached_len = seq_len - 1 if NEW_KV else seq_len
    match_start = cnt + tl.maximum(cached_len - tail_start, 0)
    total = match_start
    match_base = Match_lists
    if MATCH:  # a listed head's list follows its tail (none where the tail starts at 0: nothing lies below it)
        list_row = tl.load(Match_heads + cur_kv_head)
        listed = (list_row >= 0) & (tail_start > 0)
        total += tl.where(listed, tl.load(Match_cnt + cur_b).to(tl.int32), 0)
        match_base += tl.maximum(list_row, 0).to(tl.int64) * stride_mll + cur_b * stride_mlb

    # Virtual index j < cnt is the j-th selected position, j >= cnt is tail position tail_start + j - cnt.
    chunk = tl.cdiv(tl.cdiv(total, NUM_SPLITS), BLOCK_N) * BLOCK_N
    split_start = split * chunk
    split_end = tl.minimum(split_start + chunk, total)

    offs_h = tl.arange(0, BLOCK_H)
    mask_h = offs_h < GROUP
    cur_heads = cur_kv_head * GROUP + offs_h
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < D

    e_max = tl.full([BLOCK_H], -float("inf"), tl.float32)
    e_sum = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    q_ptr = Q + cur_b * stride_qb + cur_heads[:, None] * stride_qh
    q_mask = mask_h[:, None] & mask_d[None, :]
    q = tl.load(q_ptr + offs_d[None, :], mask=q_mask, other=0.0)
    cs_row = Cos_sin
    if ROPE:
        cs_row += tl.load(Rope_pos + cur_b).to(tl.int64) * stride_cs
    if ROPE or NORM:
        q = prologue_rows(q, q_ptr, offs_d[None, :], q_mask, Q_w, q_eps, cs_row, D, NORM, ROPE)
    # The plan and tail's tiles, then a listed head's match tiles in a loop of their own: in one loop, their slot
    # logic took SmolLM2's draft build from 96 to 113 registers a thread (ptxas, Triton 3.6, sm_90): 4 programs an
    # SM instead of 5.
    plan_end = tl.minimum(split_end, match_start)
    if plan_end > split_start:
        for start_n in range(split_start, plan_end, BLOCK_N):
            slot, valid = _tile_slots(sel_base, req_row, start_n, plan_end, cnt, tail_start, cached_len, BLOCK_N)
            k, v = load_kv_tile(
                K_Buffer, V_Buffer, slot, valid, cur_kv_head, stride_kbs, stride_kh, stride_vbs, stride_vh, offs_d,
                mask_d,
            )  # fmt: skip
            # A tile can be fully masked (dropped selections); attend_tile keeps the running max finite.
            e_max, e_sum, acc = attend_tile(q, k, v, valid[None, :], e_max, e_sum, acc, sm_scale, LOGIT_CAP)
    if MATCH:
        match_from = tl.maximum(split_start, match_start) - match_start
        match_end = split_end - match_start
        if match_end > match_from:
            for start_n in range(match_from, match_end, BLOCK_N):
                slot, valid = _match_slots(match_base, req_row, start_n, match_end, tail_start, BLOCK_N)
                k, v = load_kv_tile(
                    K_Buffer, V_Buffer, slot, valid, cur_kv_head, stride_kbs, stride_kh, stride_vbs, stride_vh,
                    offs_d, mask_d,
                )  # fmt: skip
                e_max, e_sum, acc = attend_tile(q, k, v, valid[None, :], e_max, e_sum, acc, sm_scale, LOGIT_CAP)
    if NEW_KV:
        # The new key as a one-row tile, the shape the prologue works on. Loaded before the loop instead, the round
        # took 1.8 ms longer on the H200 (steps_qwen3-1.7b[_sparse_e837f22]_h200_64d2031.json: 36.16 vs 34.34 ms).
        k_new_ptr = K_new + cur_b * stride_knb + cur_kv_head * stride_knh
        k_row = tl.load(k_new_ptr + offs_d[None, :], mask=mask_d[None, :], other=0.0)
        if ROPE or NORM:
            k_row = prologue_rows(k_row, k_new_ptr, offs_d[None, :], mask_d[None, :], K_w, k_eps, cs_row, D, NORM, ROPE)
        k_new = tl.reshape(k_row, (BLOCK_D,))
        v_new = tl.load(V_new + cur_b * stride_vnb + cur_kv_head * stride_vnh + offs_d, mask=mask_d, other=0.0)
        if split == 0:  # one program per (request, KV head) writes the slot; none of this launch reads it
            slot_new = tl.load(Out_loc + cur_b).to(tl.int64)
            tl.store(K_Buffer + slot_new * stride_kbs + cur_kv_head * stride_kh + offs_d, k_new, mask=mask_d)
            tl.store(V_Buffer + slot_new * stride_vbs + cur_kv_head * stride_vh + offs_d, v_new, mask=mask_d)
        # The last split attends the current position (in the tail unless the tail starts past it) as a
        # one-column tile, through the same fold as the cached ones.
        offs_n = tl.arange(0, BLOCK_N)
        seen = (offs_n == 0) & (split == NUM_SPLITS - 1) & (seq_len >= 1) & (seq_len - 1 >= tail_start)
        k_tile = tl.where(seen[None, :], k_new[:, None], tl.zeros([BLOCK_D, BLOCK_N], dtype=k_new.dtype))
        v_tile = tl.where(seen[:, None], v_new[None, :], tl.zeros([BLOCK_N, BLOCK_D], dtype=v_new.dtype))
        e_max, e_sum, acc = attend_tile(q, k_tile, v_tile, seen[None, :], e_max, e_sum, acc, sm_scale, LOGIT_CAP)

    # Every split writes (an empty one: lse = -inf, zeros) so stage 2 needs no length logic. With one
    # split, Mid_O is the output itself and there is no stage 2 (see sparse_decode_fwd).
    part, lse = finish_partial(e_max, e_sum, acc)
    mid = cur_b * stride_mb + cur_heads * stride_mh + split * stride_ms
    tl.store(
        Mid_O + mid[:, None] + offs_d[None, :], part.to(Mid_O.dtype.element_ty), mask=mask_h[:, None] & mask_d[None, :]
    )
    if NUM_SPLITS > 1:
        tl.store(Mid_lse + cur_b * stride_lb + cur_heads * stride_lh + split, lse, mask=mask_h)


def sparse_decode_fwd(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    sel_pos: torch.Tensor,
    sel_cnt: torch.Tensor,
    tail_start: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    sel_rows: torch.Tensor | None = None,
    new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float, float] | None = None,
    dense_heads: torch.Tensor | None = None,
    match: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    num_kv_splits: int | None = None,
    block_n: int = 32,
    num_warps: int = 4,
    num_stages: int = 3,
    pdl: bool = False,
) -> torch.Tensor:
    """Sparse decode attention of one layer into `o` (semantics in the module docstring); returns `o`.

    q, o: [bs, H_q, D] (o in q's dtype); k_buffer, v_buffer: [pool_slots, H_kv, D] page_size-1 cache.
    req_to_token: [pool_reqs, max_ctx] int32; req_pool_indices, tail_start, seq_lens: [bs] int tensors.
    sel_pos: [N, H_kv, Kmax] int32 sorted positions (-1 padded), e.g. a layer slice of topk_select's
    output; sel_cnt: [N] int32 valid entries (clamped to [0, Kmax]); sel_rows: optional [bs] row of
    request b in sel_pos/sel_cnt (e.g. req_pool_indices), default b.
    new_kv: optional (k [bs, H_kv, D], v [bs, H_kv, D] in the cache's dtype, out_loc [bs] int slots): the
    current token's K/V, written into slot out_loc[b] by this launch (the slot need not hold them before).
    rope: optional (cos_sin_cache [max_pos, D] with cos | sin halves, positions [bs] int), with new_kv only: q
    and the new key are given before their neox rotary embedding, which the kernel applies (the stored key too).
    qk_norm: optional (q weight [D], k weight [D], q eps, k eps), with new_kv only: q and the new key are given
    before their per-head RMS norm too, which the kernel applies first.
    dense_heads: optional [H_kv] int32, nonzero where a KV head attends every position below seq_lens.
    match: optional (lists [n, >= bs, M] int32, match_cnt [>= bs] int32, heads [H_kv] int32): KV head h with
    heads[h] >= 0 also attends lists[heads[h], b, :match_cnt[b]] where below the tail (``match_lists_fwd``'s lists,
    which hold no position of the head's plan); heads[h] = -1 leaves head h to its plan.
    sm_scale: logit scale (times any k_scale); logit_cap: tanh soft-cap, 0 = off.
    num_kv_splits: static split count; default fills about two GPU waves for this batch size.
    block_n, num_warps, num_stages: gather tile width, warps per program, pipeline depth (speed only;
    H100 sweep, benchmarks/results/kernels/kernels_tune_sparse_h100.json: 3 stages are 12-30% faster than 2).
    pdl: stage 1 as a programmatic dependent launch (sm_90 and later, compiled only; speed only): it lets the
    next launch start as soon as it runs and waits for the previous launch before reading anything.
    """
    if q.dim() != 3 or k_buffer.dim() != 3 or v_buffer.shape != k_buffer.shape or q.shape[2] != k_buffer.shape[2]:
        shapes = f"{tuple(q.shape)} {tuple(k_buffer.shape)} {tuple(v_buffer.shape)}"
        raise ValueError(f"q [bs, H_q, D] and equal k/v buffers [slots, H_kv, D] expected, got {shapes}")
    bs, h_q, d = q.shape
    h_kv = k_buffer.shape[1]
    if h_q % h_kv:
        raise ValueError(f"H_q={h_q} is not a multiple of H_kv={h_kv}")
    if o.shape != q.shape or o.dtype != q.dtype or o.stride(2) != 1 or q.stride(2) != 1:
        raise ValueError(
            f"o must match q ({q.dtype} {tuple(q.shape)}) with contiguous last dims, got {o.dtype} {tuple(o.shape)}"
        )
    if req_to_token.dim() != 2 or req_to_token.dtype != torch.int32 or req_to_token.stride(1) != 1:
        raise ValueError("req_to_token must be a row-major int32 [pool_reqs, max_ctx] tensor")
    for name, t in (("req_pool_indices", req_pool_indices), ("tail_start", tail_start), ("seq_lens", seq_lens)):
        check_int_vector(name, t, bs)
    if sel_pos.dim() != 3 or sel_pos.dtype != torch.int32 or sel_pos.shape[1] != h_kv or sel_pos.stride(2) != 1:
        raise ValueError(
            f"sel_pos must be int32 [N, {h_kv}, Kmax] with a contiguous last dim, "
            f"got {sel_pos.dtype} {tuple(sel_pos.shape)}"
        )
    check_int_vector("sel_cnt", sel_cnt, sel_pos.shape[0])
    if sel_rows is not None:
        check_int_vector("sel_rows", sel_rows, bs)
    if dense_heads is not None:
        check_int_vector("dense_heads", dense_heads, h_kv)
    if match is not None:
        match_lists, match_cnt, match_heads = match
        if (
            match_lists.dim() != 3
            or match_lists.dtype != torch.int32
            or match_lists.shape[1] < bs
            or match_lists.stride(2) != 1
        ):
            raise ValueError(
                f"match lists must be int32 [n, >= {bs}, M], got {match_lists.dtype} {tuple(match_lists.shape)}"
            )
        if match_cnt.dtype != torch.int32 or match_cnt.shape[0] < bs:
            raise ValueError(f"match_cnt must be int32 [>= {bs}], got {match_cnt.dtype} {tuple(match_cnt.shape)}")
        check_int_vector("match heads", match_heads, h_kv)
    else:
        match_lists, match_cnt, match_heads = sel_pos, sel_cnt, sel_cnt  # unused: MATCH is off
    if sel_rows is None and sel_pos.shape[0] < bs:
        raise ValueError(f"sel_pos has {sel_pos.shape[0]} rows for a batch of {bs}")
    if new_kv is not None:
        k_new, v_new, out_loc = new_kv
        for name, t in (("k", k_new), ("v", v_new)):
            if t.shape != (bs, h_kv, d) or t.dtype != k_buffer.dtype or t.stride(2) != 1:
                raise ValueError(
                    f"new_kv {name} must be [{bs}, {h_kv}, {d}] {k_buffer.dtype} with a contiguous last dim, "
                    f"got {t.dtype} {tuple(t.shape)}"
                )
        check_int_vector("out_loc", out_loc, bs)
    else:
        k_new = v_new = out_loc = q  # unused: NEW_KV is off
    if rope is not None:
        cos_sin, rope_pos = rope
        if new_kv is None or cos_sin.dim() != 2 or cos_sin.shape[1] != d or d % 2 or cos_sin.stride(1) != 1:
            raise ValueError(
                f"rope needs new_kv and a [max_pos, {d}] cos | sin cache (even head dim), got {tuple(cos_sin.shape)}"
            )
        check_int_vector("rope positions", rope_pos, bs)
    else:
        cos_sin = rope_pos = q  # unused: ROPE is off
    if qk_norm is not None:
        q_w, k_w, q_eps, k_eps = qk_norm
        if new_kv is None or q_w.shape != (d,) or k_w.shape != (d,):
            raise ValueError(f"qk_norm needs new_kv and [{d}] weights, got {tuple(q_w.shape)} {tuple(k_w.shape)}")
    else:
        q_w = k_w = q  # unused: NORM is off
        q_eps = k_eps = 0.0
    group = h_q // h_kv
    if num_kv_splits is None:
        num_kv_splits = default_num_splits(bs * h_kv, q.device)
    block_d = triton.next_power_of_2(d)
    if num_kv_splits == 1:
        # A full batch already fills the GPU with one split per (request, KV head): stage 1 writes
        # the output, and the merge launch (one per layer and draft step) is skipped.
        mid_o, mid_lse = o.unsqueeze(2), o
    else:
        mid_o = torch.empty((bs, h_q, num_kv_splits, d), dtype=torch.float32, device=q.device)
        mid_lse = torch.empty((bs, h_q, num_kv_splits), dtype=torch.float32, device=q.device)
    _sparse_decode_stage1[(bs, h_kv, num_kv_splits)](
        q, k_buffer, v_buffer, req_to_token, req_pool_indices, sel_pos, sel_cnt, sel_rows, tail_start, seq_lens,
        dense_heads, match_lists, match_cnt, match_heads, k_new, v_new, out_loc, cos_sin, rope_pos, q_w, k_w, q_eps,
        k_eps, mid_o, mid_lse, sm_scale,
        q.stride(0), q.stride(1), k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        req_to_token.stride(0), k_new.stride(0), k_new.stride(1), v_new.stride(0), v_new.stride(1),
        cos_sin.stride(0), sel_pos.stride(0), sel_pos.stride(1), match_lists.stride(0), match_lists.stride(1),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), mid_lse.stride(0), mid_lse.stride(1),
        GROUP=group, KMAX=sel_pos.shape[2], D=d, BLOCK_D=block_d, BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n, NUM_SPLITS=num_kv_splits, LOGIT_CAP=logit_cap, HAS_SEL_ROWS=sel_rows is not None,
        HAS_DENSE=dense_heads is not None, MATCH=match is not None,
        NEW_KV=new_kv is not None, ROPE=rope is not None,
        NORM=qk_norm is not None, PDL=pdl, num_warps=num_warps, num_stages=num_stages, launch_pdl=pdl,
    )  # fmt: skip
    if num_kv_splits == 1:
        return o
    return merge_split_partials(mid_o, mid_lse, o)
