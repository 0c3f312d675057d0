"""The sampled verify's residual draw over a whole row, vocabulary-parallel, and the residual's parts.

A request whose first rejection (or bonus position) lands on a row without a complete list draws from
its residual max(0, p - q) over the whole vocabulary: ``draw_mass_kernel`` (one program per (request,
chunk)) sums each chunk's residual and p mass, then ``draw_pick_kernel`` (one per request) picks the
chunk the final coin lands in and scans it in id order (launches 2 and 3 of ``verify_accept``). The
residual's parts, shared with the list draw of ``verify_accept``: the record to subtract
(``draft_record``), min(p, q) at a tile of tokens (``record_overlap``) and one tile of the inverse-CDF
scan (``scan_step``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .logit_bins import inv_temperature, load_z
from .target_filter import kept_p, load_desc


@triton.jit
def draft_record(
    Rec_ids,
    Rec_q,
    b,
    n_acc,
    num_drafts,
    stride_cb,
    stride_cj,
    stride_db,
    stride_dj,
    K: tl.constexpr,
    RC: tl.constexpr,
    BLOCK_RC: tl.constexpr,
):
    """(ids [BLOCK_RC], q, live, ids row, q row) of the record to subtract: the rejected draft's (none past the
    last draft); the rows' pointers serve ``record_overlap``'s pass per slot."""
    offs_r = tl.arange(0, BLOCK_RC)
    j = tl.minimum(n_acc, K - 1)
    sub = (offs_r < RC) & (n_acc < num_drafts)
    ids_row = Rec_ids + b * stride_cb + j * stride_cj
    q_row = Rec_q + b * stride_db + j * stride_dj
    ids_q = tl.load(ids_row + offs_r, mask=sub, other=-1)
    q = tl.load(q_row + offs_r, mask=sub, other=0.0)
    return ids_q, q, sub, ids_row, q_row


@triton.jit
def record_overlap(idx, p, ids_q, q, sub, ids_row, q_row, RC: tl.constexpr):
    """min(p, q) at tokens idx [N] whose id the record (``draft_record``) lists, 0 elsewhere. Only slots with
    q > 0 count (unused slots repeat ids with q = 0). A tile that holds none of the listed ids (most tiles of a
    vocabulary-wide scan) compares nothing; one that does takes a pass per slot, so a tile of any width needs
    registers for [N] values only (an [N, slots] comparison held the scans to 64-token tiles)."""
    lo = tl.min(idx, axis=0)
    hi = tl.max(idx, axis=0)
    hit = tl.sum((sub & (q > 0.0) & (ids_q >= lo) & (ids_q <= hi)).to(tl.int32), axis=0)
    q_at = tl.zeros_like(p)
    if hit > 0:
        for j in range(RC):
            q_at += tl.where(idx == tl.load(ids_row + j), tl.load(q_row + j).to(tl.float32), 0.0)
    return tl.minimum(p, q_at)


@triton.jit
def num_drafts_at(Num_drafts, b, stride_n, PER_ROW: tl.constexpr):
    # PER_ROW: Num_drafts points at each request's count; else it is the batch's count itself.
    if PER_ROW:
        count = tl.load(Num_drafts + b * stride_n)
    else:
        count = Num_drafts
    return count


@triton.jit
def scan_step(
    base_l,
    idx,
    vocab,
    inv_t,
    m,
    z_star,
    scale,
    tie_end,
    ids_q,
    q,
    sub,
    ids_row,
    q_row,
    has_residual,
    target,
    cum,
    drawn,
    last,
    RC: tl.constexpr,
):
    """One tile of the inverse-CDF scan in id order: (mass so far, first id past the target or -1, last id with
    mass or -1) -> the same after the tokens idx [N] (ascending; ids >= vocab: none)."""
    p = kept_p(load_z(base_l, idx, vocab, inv_t), idx, m, z_star, scale, tie_end)
    r = tl.where(has_residual, p - record_overlap(idx, p, ids_q, q, sub, ids_row, q_row, RC), p)
    c = cum + tl.cumsum(r, axis=0)
    first = tl.min(tl.where((c > target) & (r > 0.0), idx, vocab), axis=0)
    drawn = tl.where((drawn < 0) & (first < vocab), first, drawn)
    last = tl.maximum(last, tl.max(tl.where(r > 0.0, idx, -1), axis=0))
    return cum + tl.sum(r, axis=0), drawn, last


@triton.jit
def draw_mass_kernel(
    Logits,
    Temperature,
    Desc,
    Pending,
    Num_accepted,
    Rec_ids,
    Rec_q,
    ChunkMass,
    vocab,
    stride_l,
    n_chunks,
    Num_drafts,
    stride_n,
    stride_cb,
    stride_cj,
    stride_db,
    stride_dj,
    GREEDY_EPS_C: tl.constexpr,
    K: tl.constexpr,
    RC: tl.constexpr,
    BLOCK_RC: tl.constexpr,
    CHUNK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PER_ROW: tl.constexpr,
):
    """Per (request, chunk) of a pending draw: the chunk's residual mass, summed token by token (as the
    reference: a residual that cancels exactly sums to exactly 0), and its p mass."""
    b, ch = tl.program_id(0).to(tl.int64), tl.program_id(1)
    row = tl.load(Pending + b)
    if row >= 0:
        inv_t = inv_temperature(Temperature, b, GREEDY_EPS_C)
        m, z_star, scale, tie_end = load_desc(Desc, row)
        base_l = Logits + row * stride_l
        num_drafts = num_drafts_at(Num_drafts, b, stride_n, PER_ROW)
        ids_q, q, sub, ids_row, q_row = draft_record(
            Rec_ids,
            Rec_q,
            b,
            tl.load(Num_accepted + b),
            num_drafts,
            stride_cb,
            stride_cj,
            stride_db,
            stride_dj,
            K,
            RC,
            BLOCK_RC,
        )
        offs = tl.arange(0, BLOCK_S)
        mass = 0.0
        res = 0.0
        for s0 in range(0, CHUNK_C, BLOCK_S):
            idx = ch * CHUNK_C + s0 + offs
            p = kept_p(load_z(base_l, idx, vocab, inv_t), idx, m, z_star, scale, tie_end)
            mass += tl.sum(p, axis=0)
            res += tl.sum(p - record_overlap(idx, p, ids_q, q, sub, ids_row, q_row, RC), axis=0)
        tl.store(ChunkMass + (b * n_chunks + ch) * 2, res)
        tl.store(ChunkMass + (b * n_chunks + ch) * 2 + 1, mass)


@triton.jit
def draw_pick_kernel(
    Logits,
    Temperature,
    Desc,
    Pending,
    Num_accepted,
    Rec_ids,
    Rec_q,
    Final_coins,
    ChunkMass,
    Emitted,
    vocab,
    stride_l,
    n_chunks,
    Num_drafts,
    stride_n,
    stride_cb,
    stride_cj,
    stride_db,
    stride_dj,
    stride_fc,
    stride_eb,
    GREEDY_EPS_C: tl.constexpr,
    K: tl.constexpr,
    RC: tl.constexpr,
    BLOCK_RC: tl.constexpr,
    NCH: tl.constexpr,
    CHUNK_C: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PER_ROW: tl.constexpr,
):
    """Per request with a pending draw: the chunk where the cumulative mass passes the coin, then the token."""
    b = tl.program_id(0).to(tl.int64)
    row = tl.load(Pending + b)
    if row >= 0:
        chs = tl.arange(0, NCH)
        live = chs < n_chunks
        res_c = tl.load(ChunkMass + (b * n_chunks + chs) * 2, mask=live, other=0.0)
        p_c = tl.load(ChunkMass + (b * n_chunks + chs) * 2 + 1, mask=live, other=0.0)
        # Rounding can leave no residual mass only when p == q; p itself is then exact.
        has_residual = tl.sum(res_c, axis=0) > 0.0
        mass_c = tl.where(has_residual, res_c, p_c)
        target = tl.load(Final_coins + b * stride_fc).to(tl.float32) * tl.sum(mass_c, axis=0)
        cum_c = tl.cumsum(mass_c, axis=0)
        pos = live & (mass_c > 0.0)
        first_c = tl.min(tl.where(pos & (cum_c > target), chs, NCH), axis=0)
        ch = tl.where(first_c < NCH, first_c, tl.max(tl.where(pos, chs, 0), axis=0))
        cum = tl.sum(tl.where(chs == ch, cum_c - mass_c, 0.0), axis=0)
        target = tl.where(first_c < NCH, target, float("inf"))  # rounding left none: the last id with mass
        inv_t = inv_temperature(Temperature, b, GREEDY_EPS_C)
        m, z_star, scale, tie_end = load_desc(Desc, row)
        base_l = Logits + row * stride_l
        n_acc = tl.load(Num_accepted + b)
        ids_q, q, sub, ids_row, q_row = draft_record(
            Rec_ids,
            Rec_q,
            b,
            n_acc,
            num_drafts_at(Num_drafts, b, stride_n, PER_ROW),
            stride_cb,
            stride_cj,
            stride_db,
            stride_dj,
            K,
            RC,
            BLOCK_RC,
        )
        offs = tl.arange(0, BLOCK_S)
        drawn = -1
        last = -1
        for s0 in range(0, CHUNK_C, BLOCK_S):
            cum, drawn, last = scan_step(
                base_l,
                ch * CHUNK_C + s0 + offs,
                vocab,
                inv_t,
                m,
                z_star,
                scale,
                tie_end,
                ids_q,
                q,
                sub,
                ids_row,
                q_row,
                has_residual,
                target,
                cum,
                drawn,
                last,
                RC,
            )
        tl.store(Emitted + b * stride_eb + n_acc, tl.where(drawn < 0, last, drawn).to(tl.int64))
