"""A round's draft selections as KV slots: the plans' positions looked up once, before the first draft step.

The draft kernel (``sparse_decode.py``) reaches a selected token through its position, the position's slot in
req_to_token, then its K/V rows: three dependent loads a tile, in every layer of every draft step. A request's
slots do not move within a round (KV is offloaded and reloaded between rounds, never during one), so the slots
looked up once a round leave the steps two dependent loads (``tools/sparse_layout_probe.py`` on an H200, Qwen3-1.7B
64 x 4096: 26.6 against 29.6 us a layer; laying the rows out contiguously as well saved only 0.3 us more).
Plans stay position-based (``PlanState``) so they survive the moves between rounds.

Row b of the output, in batch order, holds request b's selections (its plan row ``rows[b]``) as slots; entries the
draft kernel would drop (past the plan's count, -1 padding, at or past the row's tail start) are -1.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_int_vector


@triton.jit
def _sel_slots_kernel(
    Sel_pos,
    Sel_cnt,
    Tail_start,
    Req_to_token,
    Rows,
    Out,
    stride_pr,
    stride_pg,
    stride_rt,
    stride_or,
    stride_og,
    KMAX: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0)
    group = tl.program_id(1)
    row = tl.load(Rows + b).to(tl.int64)
    cnt = tl.minimum(tl.maximum(tl.load(Sel_cnt + row).to(tl.int32), 0), KMAX)
    tail_start = tl.load(Tail_start + b).to(tl.int32)
    src = Sel_pos + row * stride_pr + group * stride_pg
    dst = Out + b.to(tl.int64) * stride_or + group * stride_og
    for start in range(0, KMAX, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        in_k = offs < KMAX
        pos = tl.load(src + offs, mask=in_k & (offs < cnt), other=-1)
        keep = (pos >= 0) & (pos < tail_start)
        slot = tl.load(Req_to_token + row * stride_rt + pos, mask=keep, other=-1)
        tl.store(dst + offs, tl.where(keep, slot, -1), mask=in_k)


def sel_slots_fwd(
    sel_pos: torch.Tensor,
    sel_cnt: torch.Tensor,
    tail_start: torch.Tensor,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """Write ``out[b, g, j]`` = req_to_token[rows[b], sel_pos[rows[b], g, j]] for the entries the draft kernel
    attends, else -1; returns ``out``.

    sel_pos: [N, G, Kmax] int32 plans (PlanState.sel_pos: G = layers x KV heads, or 1 for shared plans);
    sel_cnt: [N] int32; rows: [bs] int (each request's plan and req_to_token row); tail_start: [bs] int (batch
    order, the round's: selections at or past it are dropped); req_to_token: [pool_reqs, max_ctx] int32;
    out: [>= bs, G, Kmax] int32 with a contiguous last dim (rows past bs untouched).
    """
    bs = rows.shape[0]
    if sel_pos.dim() != 3 or sel_pos.dtype != torch.int32 or sel_pos.stride(2) != 1:
        raise ValueError(f"sel_pos must be int32 [N, G, Kmax] with a contiguous last dim, got {tuple(sel_pos.shape)}")
    if out.dim() != 3 or out.dtype != torch.int32 or out.shape[0] < bs or out.shape[1:] != sel_pos.shape[1:]:
        raise ValueError(f"out must be int32 [>= {bs}, {sel_pos.shape[1]}, {sel_pos.shape[2]}], got {tuple(out.shape)}")
    if out.stride(2) != 1 or req_to_token.dtype != torch.int32 or req_to_token.stride(1) != 1:
        raise ValueError("out and req_to_token need contiguous last dims, req_to_token int32")
    check_int_vector("rows", rows, bs)
    check_int_vector("tail_start", tail_start, bs)
    check_int_vector("sel_cnt", sel_cnt, sel_pos.shape[0])
    if bs == 0:
        return out
    kmax = sel_pos.shape[2]
    _sel_slots_kernel[(bs, sel_pos.shape[1])](
        sel_pos, sel_cnt, tail_start, req_to_token, rows, out,
        sel_pos.stride(0), sel_pos.stride(1), req_to_token.stride(0), out.stride(0), out.stride(1),
        KMAX=kmax, BLOCK=min(1024, triton.next_power_of_2(kmax)), num_warps=4,
    )  # fmt: skip
    return out


def sel_slots_ref(
    sel_pos: torch.Tensor,
    sel_cnt: torch.Tensor,
    tail_start: torch.Tensor,
    req_to_token: torch.Tensor,
    rows: torch.Tensor,
    out: torch.Tensor,
) -> torch.Tensor:
    """Plain-torch ``sel_slots_fwd`` (loops over the batch; for tests)."""
    kmax = sel_pos.shape[2]
    for b in range(rows.shape[0]):
        row = int(rows[b])
        pos = sel_pos[row].long()  # [G, Kmax]
        cnt = min(max(int(sel_cnt[row]), 0), kmax)
        keep = (torch.arange(kmax, device=pos.device) < cnt) & (pos >= 0) & (pos < int(tail_start[b]))
        slots = req_to_token[row, pos.clamp(min=0)].to(torch.int32)
        out[b] = torch.where(keep, slots, torch.full_like(slots, -1))
    return out
