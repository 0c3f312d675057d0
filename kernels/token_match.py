"""The draft step's token matches: where a request's input token occurred before, and what followed it.

An induction head attends the position after the current token's earlier occurrences, a duplicate-token head the
occurrences themselves: lookups by content, which no plan chosen from other queries' attention holds
(``selection/match_heads.py``). Request b with input token t = tokens[b] scans its committed token ids
ids[req_pool_indices[b], :tail_start[b]] from the end and writes, for each of its ``latest`` latest occurrences p
(newest first), p at match_pos[b, 2r] and p + 1 at match_pos[b, 2r + 1], the latter -1 where p + 1 holds t itself
(then it is listed as an occurrence) or lies in the tail (which every head attends); match_cnt[b] = 2 x the
occurrences found, and only those entries are written. So the list holds no position twice and none at or past
the tail. One program per request, blocks of ``block`` positions, newest first, stopping once ``latest`` are found;
CUDA-graph safe (the grid and the buffers are static).

``match_lists_fwd`` then gives each listed KV head its own copy of the list with the positions its plan already
holds set to -1, so the draft kernel attends no position twice without comparing anything itself: done there, the
comparison took its registers from ~95 to 206-218 a thread (ptxas, Triton 3.6, sm_90) and a layer with one listed
head from 32 to 58 us (kernels_match_heads_h100_58858b1.json). One program per (request, listed head).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_int_vector


@triton.jit
def _token_match(
    Ids, Req_pool_indices, Tokens, Tail_start, Match_pos, Match_cnt, stride_ids, stride_mb,
    LATEST: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    row = Ids + tl.load(Req_pool_indices + b).to(tl.int64) * stride_ids
    tok = tl.load(Tokens + b).to(tl.int32)
    end = tl.load(Tail_start + b).to(tl.int32)
    out = Match_pos + b * stride_mb
    offs = tl.arange(0, BLOCK)
    found = end * 0
    hi = end
    while (hi > 0) & (found < LATEST):
        pos = hi - 1 - offs  # newest first
        hit = (pos >= 0) & (tl.load(row + pos, mask=pos >= 0, other=-1) == tok)
        rank = found + tl.cumsum(hit.to(tl.int32), 0) - 1
        keep = hit & (rank < LATEST)
        nxt = pos + 1
        nxt_tok = tl.load(row + nxt, mask=keep & (nxt < end), other=tok)
        tl.store(out + 2 * rank, pos, mask=keep)
        tl.store(out + 2 * rank + 1, tl.where(nxt_tok != tok, nxt, -1), mask=keep)
        found = tl.minimum(found + tl.sum(hit.to(tl.int32), 0), LATEST)
        hi -= BLOCK
    tl.store(Match_cnt + b, 2 * found)


def token_match_fwd(
    ids: torch.Tensor,
    req_pool_indices: torch.Tensor,
    tokens: torch.Tensor,
    tail_start: torch.Tensor,
    match_pos: torch.Tensor,
    match_cnt: torch.Tensor,
    block: int = 1024,
) -> None:
    """Each request's matches into ``match_pos`` / ``match_cnt`` (semantics in the module docstring).

    ids: [pool_reqs, max_ctx] int32 token id at each position of each request row; req_pool_indices, tokens,
    tail_start: [bs] int tensors; match_pos: [>= bs, 2 * latest] int32 (``latest`` = half its width);
    match_cnt: [>= bs] int32. block: positions a program compares at once (speed only)."""
    bs = tokens.shape[0]
    if ids.dim() != 2 or ids.dtype != torch.int32 or ids.stride(1) != 1:
        raise ValueError("ids must be a row-major int32 [pool_reqs, max_ctx] tensor")
    for name, t in (("req_pool_indices", req_pool_indices), ("tokens", tokens), ("tail_start", tail_start)):
        check_int_vector(name, t, bs)
    width = match_pos.shape[-1]
    if match_pos.dim() != 2 or match_pos.dtype != torch.int32 or width % 2 or match_pos.shape[0] < bs:
        raise ValueError(f"match_pos must be int32 [>= {bs}, 2 x latest], got {match_pos.dtype} {match_pos.shape}")
    if match_pos.stride(1) != 1 or match_cnt.dtype != torch.int32 or match_cnt.shape[0] < bs:
        raise ValueError("match_pos needs a contiguous last dim and match_cnt int32 [>= bs] entries")
    if bs:
        _token_match[(bs,)](
            ids, req_pool_indices, tokens, tail_start, match_pos, match_cnt, ids.stride(0), match_pos.stride(0),
            LATEST=width // 2, BLOCK=block,
        )  # fmt: skip


@triton.jit
def _match_lists(
    Match_pos, Match_cnt, Sel_pos, Sel_cnt, Sel_rows, Groups, Lists, stride_mb, stride_sr, stride_sg, stride_ln,
    stride_lb, KMAX: tl.constexpr, BLOCK_M: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1).to(tl.int64)
    row = tl.load(Sel_rows + b).to(tl.int64)
    plan = Sel_pos + row * stride_sr + tl.load(Groups + i).to(tl.int64) * stride_sg
    cnt = tl.minimum(tl.maximum(tl.load(Sel_cnt + row), 0), KMAX)
    n = tl.load(Match_cnt + b)
    offs_m = tl.arange(0, BLOCK_M)
    offs_c = tl.arange(0, CHUNK)
    for m0 in range(0, n, BLOCK_M):
        pos = tl.load(Match_pos + b * stride_mb + m0 + offs_m, mask=m0 + offs_m < n, other=-1)
        hits = tl.zeros([BLOCK_M], dtype=tl.int32)
        for c in range(0, cnt, CHUNK):
            v = tl.load(plan + c + offs_c, mask=c + offs_c < cnt, other=-1)
            hits += tl.sum((pos[:, None] == v[None, :]).to(tl.int32), axis=1)
        tl.store(Lists + i * stride_ln + b * stride_lb + m0 + offs_m, tl.where(hits > 0, -1, pos), mask=m0 + offs_m < n)


def match_lists_fwd(
    match_pos: torch.Tensor,
    match_cnt: torch.Tensor,
    sel_pos: torch.Tensor,
    sel_cnt: torch.Tensor,
    sel_rows: torch.Tensor,
    groups: torch.Tensor,
    lists: torch.Tensor,
) -> None:
    """lists[i, b, j] = match_pos[b, j], or -1 where listed head i's plan holds it, for j < match_cnt[b] (the rest
    of each row is left as it was).

    match_pos [>= bs, M], match_cnt [>= bs]: ``token_match_fwd``'s outputs; sel_pos [rows, G, kmax] int32 and sel_cnt
    [rows] int32: the plans (``selection/state.py``; G = 1 for a set shared by every head); sel_rows [bs]: request
    b's plan row; groups [n] int32: listed head i's set (layer x num_kv_heads + head; any value where G = 1);
    lists [n, >= bs, M] int32."""
    bs, n = sel_rows.shape[0], groups.shape[0]
    check_int_vector("sel_rows", sel_rows, bs)
    check_int_vector("groups", groups, n)
    width = match_pos.shape[-1]
    if sel_pos.dim() != 3 or sel_pos.dtype != torch.int32 or sel_pos.stride(2) != 1:
        raise ValueError(f"sel_pos must be int32 [rows, groups, kmax], got {sel_pos.dtype} {tuple(sel_pos.shape)}")
    if lists.dim() != 3 or lists.dtype != torch.int32 or lists.shape[0] != n or lists.shape[1] < bs:
        raise ValueError(f"lists must be int32 [{n}, >= {bs}, {width}], got {lists.dtype} {tuple(lists.shape)}")
    if lists.shape[2] != width or lists.stride(2) != 1 or match_pos.stride(1) != 1 or match_pos.shape[0] < bs:
        raise ValueError(f"lists [{n}, >= {bs}, {width}] and match_pos [>= {bs}, {width}] need contiguous rows")
    if bs and n:
        shared = sel_pos.shape[1] == 1  # one set for every head: each listed head compares with it
        _match_lists[(bs, n)](
            match_pos, match_cnt, sel_pos, sel_cnt, sel_rows, groups, lists, match_pos.stride(0), sel_pos.stride(0),
            0 if shared else sel_pos.stride(1), lists.stride(0), lists.stride(1),
            KMAX=sel_pos.shape[2], BLOCK_M=64, CHUNK=64,
        )  # fmt: skip


def match_lists_ref(
    match_pos: torch.Tensor,
    match_cnt: torch.Tensor,
    sel_pos: torch.Tensor,
    sel_cnt: torch.Tensor,
    sel_rows: torch.Tensor,
    groups: torch.Tensor,
) -> list[list[list[int]]]:
    """Plain-torch ``match_lists_fwd``: lists[i][b] = lists[i, b, :match_cnt[b]] (for tests)."""
    out = []
    for g in groups.tolist():
        per_request = []
        for b in range(sel_rows.shape[0]):
            row = int(sel_rows[b])
            plan = sel_pos[row, 0 if sel_pos.shape[1] == 1 else g, : max(int(sel_cnt[row]), 0)].tolist()
            per_request.append([-1 if p in plan else p for p in match_pos[b, : int(match_cnt[b])].tolist()])
        out.append(per_request)
    return out


def token_match_ref(
    ids: torch.Tensor, req_pool_indices: torch.Tensor, tokens: torch.Tensor, tail_start: torch.Tensor, latest: int
) -> list[list[int]]:
    """Plain-torch ``token_match_fwd``: each request's list, match_pos[b, :match_cnt[b]] (for tests)."""
    lists = []
    for b in range(tokens.shape[0]):
        row, end, tok = ids[int(req_pool_indices[b])].long(), int(tail_start[b]), int(tokens[b])
        found = []
        for p in (row[:end] == tok).nonzero().view(-1).flip(0)[:latest].tolist():
            found += [p, p + 1 if p + 1 < end and int(row[p + 1]) != tok else -1]
        lists.append(found)
    return lists
