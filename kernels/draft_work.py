"""The work list of a planned draft-attention launch (``sparse_decode_fwd(work=...)``).

A draft step's plans differ in length (a dense request reads its whole prefix, a boosted one a
larger budget), and with one program per (request, KV head) every layer waits for the longest. The
work list spreads them over a static pool of P programs per KV head instead: request b asks for
ceil(plan_b / chunk) programs (1 to max_chunks); when the asks exceed the pool, each request's
extra programs shrink in proportion (integer floor: bs + sum(extra) <= P), so the pool always
covers every plan and its chunks grow instead. Each program reads whole tiles (a multiple of
block_n positions) of one request's plan, in plan order; programs past the last request's are
idle (request 0, empty range).

``plan_work`` is one Triton program (a single launch per draft step, inside the step's CUDA graph;
the same plan as tensor ops would be ~35 launches); ``plan_work_ref`` is its torch reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass
class DraftWork:
    """A work list for one draft step's attention (all layers share it): P programs per KV head.

    prog_req:   [P] int32 — the request (batch index) of program p; an idle program holds 0 and an
                empty range;
    prog_start: [P] int32, prog_end: [P] int32 — the plan's virtual indices [start, end) program p
                reads (selected positions first, then the tail, as ``sparse_decode`` orders them);
    req_first:  [bs] int32, req_count: [bs] int32 — request b's programs are first_b .. first_b +
                count_b - 1 (count_b in [1, max_chunks]);
    max_chunks: static bound on count_b (sizes the merge's tile).
    """

    prog_req: torch.Tensor
    prog_start: torch.Tensor
    prog_end: torch.Tensor
    req_first: torch.Tensor
    req_count: torch.Tensor
    max_chunks: int


def _check(bs: int, programs: int, chunk: int, max_chunks: int) -> None:
    if programs < bs or chunk < 1 or max_chunks < 1:
        raise ValueError(f"need programs >= bs ({programs} < {bs}?), chunk >= 1 and max_chunks >= 1")


@triton.jit
def _plan_work_kernel(
    Sel_cnt,
    Sel_rows,
    Tail_start,
    Seq_lens,
    Prog_req,
    Prog_start,
    Prog_end,
    Req_first,
    Req_count,
    bs,
    programs,
    KMAX: tl.constexpr,
    CHUNK: tl.constexpr,
    MAX_CHUNKS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_B: tl.constexpr,
    BLOCK_P: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_B)
    live = offs < bs
    rows = tl.load(Sel_rows + offs, mask=live, other=0).to(tl.int64)
    tail = tl.load(Tail_start + offs, mask=live, other=0).to(tl.int64)
    seq = tl.load(Seq_lens + offs, mask=live, other=0).to(tl.int64)
    cnt = tl.minimum(tl.maximum(tl.load(Sel_cnt + rows, mask=live, other=0).to(tl.int64), 0), KMAX)
    cnt = tl.where(tail > 0, cnt, 0)
    total = cnt + tl.maximum(seq - tail, 0)
    extra = tl.minimum(tl.maximum((total + CHUNK - 1) // CHUNK, 1), MAX_CHUNKS) - 1
    extra = tl.where(live, extra, 0)
    asked = tl.sum(extra, 0)
    room = programs - bs
    count = 1 + tl.where(asked > room, (extra * room) // tl.maximum(asked, 1), extra)
    count = tl.where(live, count, 0)
    per = (total + count - 1) // tl.maximum(count, 1)
    per = (per + BLOCK_N - 1) // BLOCK_N * BLOCK_N
    ends = tl.cumsum(count, 0)
    first = ends - count
    tl.store(Req_first + offs, first.to(tl.int32), mask=live)
    tl.store(Req_count + offs, count.to(tl.int32), mask=live)
    for c in range(MAX_CHUNKS):  # request b's c-th program is p = first_b + c
        own = live & (c < count)
        start = c * per
        tl.store(Prog_req + first + c, offs.to(tl.int32), mask=own)
        tl.store(Prog_start + first + c, start.to(tl.int32), mask=own)
        tl.store(Prog_end + first + c, tl.minimum(start + per, total).to(tl.int32), mask=own)
    used = tl.sum(count, 0)  # programs [used, P) are idle; disjoint from the stores above
    for p0 in range(0, programs, BLOCK_P):
        p = p0 + tl.arange(0, BLOCK_P)
        idle = (p >= used) & (p < programs)
        zero = tl.zeros([BLOCK_P], dtype=tl.int32)
        tl.store(Prog_req + p, zero, mask=idle)
        tl.store(Prog_start + p, zero, mask=idle)
        tl.store(Prog_end + p, zero, mask=idle)


def plan_work(
    sel_cnt: torch.Tensor,
    sel_rows: torch.Tensor,
    tail_start: torch.Tensor,
    seq_lens: torch.Tensor,
    kmax: int,
    programs: int,
    chunk: int,
    max_chunks: int,
    block_n: int = 32,
) -> DraftWork:
    """The work list of one step (module docstring), one launch, no host sync. sel_cnt [N] int: the
    plans' counts by row; sel_rows [bs]: request b's row; tail_start, seq_lens [bs]: the plan as
    ``sparse_decode`` reads it (a tail at 0 means the whole prefix, counts ignored)."""
    bs = seq_lens.shape[0]
    _check(bs, programs, chunk, max_chunks)
    device = seq_lens.device
    prog = torch.empty((3, programs), dtype=torch.int32, device=device)
    req = torch.empty((2, bs), dtype=torch.int32, device=device)
    _plan_work_kernel[(1,)](
        sel_cnt,
        sel_rows,
        tail_start,
        seq_lens,
        prog[0],
        prog[1],
        prog[2],
        req[0],
        req[1],
        bs,
        programs,
        KMAX=kmax,
        CHUNK=chunk,
        MAX_CHUNKS=max_chunks,
        BLOCK_N=block_n,
        BLOCK_B=max(16, triton.next_power_of_2(bs)),
        BLOCK_P=1024,
    )
    return DraftWork(prog[0], prog[1], prog[2], req[0], req[1], max_chunks)


def plan_work_ref(
    sel_cnt: torch.Tensor,
    sel_rows: torch.Tensor,
    tail_start: torch.Tensor,
    seq_lens: torch.Tensor,
    kmax: int,
    programs: int,
    chunk: int,
    max_chunks: int,
    block_n: int = 32,
) -> DraftWork:
    """Plain-torch ``plan_work`` (for tests)."""
    bs = seq_lens.shape[0]
    _check(bs, programs, chunk, max_chunks)
    tail = tail_start.to(torch.int64)
    cnt = torch.where(tail > 0, sel_cnt[sel_rows.long()].to(torch.int64).clamp(0, kmax), 0)
    total = cnt + (seq_lens.to(torch.int64) - tail).clamp(min=0)
    extra = torch.div(total + chunk - 1, chunk, rounding_mode="floor").clamp(1, max_chunks) - 1
    asked, room = int(extra.sum()), programs - bs
    count = 1 + (torch.div(extra * room, max(asked, 1), rounding_mode="floor") if asked > room else extra)
    per = torch.div(total + count - 1, count, rounding_mode="floor")
    per = torch.div(per + block_n - 1, block_n, rounding_mode="floor") * block_n
    first = torch.cumsum(count, 0) - count
    prog = torch.zeros((3, programs), dtype=torch.int32, device=seq_lens.device)
    for b in range(bs):
        for c in range(int(count[b])):
            start = c * int(per[b])
            prog[:, int(first[b]) + c] = torch.tensor([b, start, min(start + int(per[b]), int(total[b]))])
    return DraftWork(prog[0], prog[1], prog[2], first.to(torch.int32), count.to(torch.int32), max_chunks)
