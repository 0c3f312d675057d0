"""KV index lists of the k sparse draft steps of one round.

Request b's list at draft step i (0-based) is, in this order,

    sel_pos[b, :sel_cnt[b]]  ++  [tail_start[b], seq_len[b] + i]

The last entries are the current round's own tokens: step i feeds the token at position
seq_len + i, whose KV it writes before attending. Because every step's list is a prefix
of the next, the slot matrix is built once per round and each step only compacts a
longer prefix into SGLang's flat ``kv_indptr`` / ``kv_indices`` form.
All functions are shape-static and free of host synchronisation (CUDA-graph safe).
"""

from __future__ import annotations

import torch


def round_slots(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sel_pos: torch.Tensor,
    sel_cnt: torch.Tensor,
    tail_start: torch.Tensor,
    num_steps: int,
    width: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """KV slots of the longest (last-step) list of every request.

    req_to_token: [pool_rows, max_ctx] int32 — position -> slot per request row.
    sel_pos: [bs, kmax] int32 sorted, -1 padded; sel_cnt, tail_start, seq_lens: [bs].
    width: static row width; must be >= kmax + max tail length + num_steps.
    Returns (slots [bs, width] int64 with 0 beyond each row's length,
             base_len [bs] int64 = list length at step 0 minus one).
    """
    bs, kmax = sel_pos.shape
    dev = seq_lens.device
    lens = seq_lens.to(torch.int64)
    cnt = sel_cnt.to(torch.int64)
    tail = tail_start.to(torch.int64)
    base_len = cnt + (lens - tail)  # selected + tail, before this round's tokens
    col = torch.arange(width, device=dev)[None, :].expand(bs, width)
    # Column j < cnt is a selected position; beyond it positions run contiguously
    # from tail_start (the tail, then this round's tokens).
    sel_part = torch.gather(sel_pos.to(torch.int64), 1, col.clamp(max=kmax - 1)) if kmax > 0 else col
    contiguous = tail[:, None] + (col - cnt[:, None])
    pos = torch.where(col < cnt[:, None], sel_part, contiguous)
    valid = col < (base_len + num_steps)[:, None]
    pos = torch.where(valid, pos, 0)
    rows = req_pool_indices.to(torch.int64)[:, None].expand(bs, width)
    slots = req_to_token[rows, pos].to(torch.int64)
    return torch.where(valid, slots, 0), base_len


def step_indices(
    slots: torch.Tensor,
    base_len: torch.Tensor,
    step: int,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
) -> torch.Tensor:
    """Compact the step-``step`` prefix of every row into flat SGLang index form.

    slots: [bs, width] from :func:`round_slots`; kv_indptr: [>= bs+1] int32 (written);
    kv_indices: [>= bs*width + 1] int64 (written; its last element is a scratch sink for
    masked-out columns). Returns the per-request list lengths [bs] int64.
    """
    bs, width = slots.shape
    lens = base_len + (step + 1)
    kv_indptr[:1].zero_()  # not `= 0`: a host scalar copy is illegal under graph capture
    kv_indptr[1 : bs + 1] = torch.cumsum(lens, dim=0)
    col = torch.arange(width, device=slots.device)[None, :]
    dest = kv_indptr[:bs, None].to(torch.int64) + col
    sink = kv_indices.shape[0] - 1
    dest = torch.where(col < lens[:, None], dest, sink)
    kv_indices.scatter_(0, dest.reshape(-1), slots.reshape(-1))
    return lens
