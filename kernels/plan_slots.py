"""KV slots of the planned positions, once per draft round.

A plan stores positions (``PlanState``: they survive KV moves), so every tile of every draft step's
sparse attention used to chain three dependent loads: the selected position, its slot in
``req_to_token``, then the K/V rows. Within one round no KV moves, so the middle load can be done
once for the round's k steps: for request b (batch order) and set g,

    out[b, g, j] = req_to_token[req_pool_indices[b], pos]   with pos = sel_pos[sel_rows[b], g, j],
                   for j < cnt = clamp(sel_cnt[sel_rows[b]], 0, Kmax) and 0 <= pos < tail_start[b],
    out[b, g, j] = -1                                       for j < cnt otherwise (a dropped selection);

entries j >= cnt are left as they are (the sparse kernel reads only j < cnt). ``tail_start`` is the
round's, in batch order (0 for a request drafting over its whole prefix: all its entries drop).
One program per (request, set, block of entries), CUDA-graph safe.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_int_vector


@triton.jit
def _plan_slots_kernel(
    Sel_pos,
    Sel_cnt,
    Sel_rows,
    Tail_start,
    Req_to_token,
    Req_pool_indices,
    Out,
    stride_sr,
    stride_sg,
    stride_rt,
    stride_ob,
    stride_og,
    KMAX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    cur_b = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    row = tl.load(Sel_rows + cur_b).to(tl.int64)
    cnt = tl.minimum(tl.maximum(tl.load(Sel_cnt + row).to(tl.int32), 0), KMAX)
    tail_start = tl.load(Tail_start + cur_b).to(tl.int32)
    listed = offs < cnt
    pos = tl.load(Sel_pos + row * stride_sr + g * stride_sg + offs, mask=listed, other=-1)
    kept = listed & (pos >= 0) & (pos < tail_start)
    req_row = Req_to_token + tl.load(Req_pool_indices + cur_b).to(tl.int64) * stride_rt
    slot = tl.load(req_row + pos, mask=kept, other=-1)
    tl.store(Out + cur_b * stride_ob + g * stride_og + offs, tl.where(kept, slot, -1), mask=listed)


def _check(sel_pos, sel_cnt, sel_rows, tail_start, req_to_token, req_pool_indices, out) -> None:
    if sel_pos.dim() != 3 or sel_pos.dtype != torch.int32 or sel_pos.stride(2) != 1:
        raise ValueError(f"sel_pos must be int32 [N, groups, Kmax], row-major, got {sel_pos.dtype} {tuple(sel_pos.shape)}")
    bs = out.shape[0]
    if out.dtype != torch.int32 or out.shape[1:] != sel_pos.shape[1:] or out.stride(2) != 1:
        raise ValueError(f"out must be int32 [bs, {sel_pos.shape[1]}, {sel_pos.shape[2]}], got {out.dtype} {tuple(out.shape)}")
    if req_to_token.dim() != 2 or req_to_token.dtype != torch.int32 or req_to_token.stride(1) != 1:
        raise ValueError("req_to_token must be a row-major int32 [pool_reqs, max_ctx] tensor")
    check_int_vector("sel_cnt", sel_cnt, sel_pos.shape[0])
    for name, t in (("sel_rows", sel_rows), ("tail_start", tail_start), ("req_pool_indices", req_pool_indices)):
        check_int_vector(name, t, bs)


def plan_slots_fwd(
    sel_pos: torch.Tensor,
    sel_cnt: torch.Tensor,
    sel_rows: torch.Tensor,
    tail_start: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    out: torch.Tensor,
    block: int = 256,
) -> torch.Tensor:
    """Fill ``out`` [bs, groups, Kmax] int32 as the module docstring says; returns it.

    sel_pos: [N, groups, Kmax] int32 plan positions (``PlanState.sel_pos``); sel_cnt: [N] int32;
    sel_rows, tail_start, req_pool_indices: [bs] int tensors (the plan row, the round's tail start
    and the pool row of request b); req_to_token: [pool_reqs, max_ctx] int32.
    """
    _check(sel_pos, sel_cnt, sel_rows, tail_start, req_to_token, req_pool_indices, out)
    bs, groups, kmax = out.shape
    if bs == 0:
        return out
    _plan_slots_kernel[(bs, groups, triton.cdiv(kmax, block))](
        sel_pos,
        sel_cnt,
        sel_rows,
        tail_start,
        req_to_token,
        req_pool_indices,
        out,
        sel_pos.stride(0),
        sel_pos.stride(1),
        req_to_token.stride(0),
        out.stride(0),
        out.stride(1),
        KMAX=kmax,
        BLOCK=block,
    )
    return out


def plan_slots_ref(
    sel_pos: torch.Tensor,
    sel_cnt: torch.Tensor,
    sel_rows: torch.Tensor,
    tail_start: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """Plain-torch ``plan_slots_fwd`` (loops over requests; for tests)."""
    kmax = sel_pos.shape[2]
    for b in range(out.shape[0]):
        row = int(sel_rows[b])
        cnt = min(max(int(sel_cnt[row]), 0), kmax)
        pos = sel_pos[row, :, :cnt].long()
        kept = (pos >= 0) & (pos < int(tail_start[b]))
        slots = req_to_token[int(req_pool_indices[b])][pos.clamp(min=0)]
        out[b, :, :cnt] = torch.where(kept, slots, -1).to(torch.int32)
    return out
