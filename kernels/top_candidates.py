"""The target filter's first list without a histogram: every token of probability >= 1 / (list_cap - 1).

At most list_cap - 1 tokens of a row can each hold 1 / (list_cap - 1) of its mass, so that set fits the
list whatever the row looks like; no histogram has to size it first. The row's maxima are listed even when
they hold less (a greedy row's token); a list that still overflows (a near-uniform row's thousands of tied
maxima) is not used. On a
peaked row (a real model's, at the temperatures people sample with) it holds the top-p nucleus, the
top-k tokens or everything above the min-p floor, and the select decides the row from it exactly; the
rest go on to the histogram's bracket stage (``cut_plan``). One read of the logits after the statistics
pass instead of a level-1 histogram and a scanned gather (two reads' time each, ``logit_bins``):

    ``_candidate_kernel`` (rows x chunks): the chunk's candidates written at slots taken with one relaxed
        atomic each (only candidates take one; the row's counter is list_n), and the chunk's exact count
        and mass exp(z - m) of its candidates (per chunk, so their sums do not depend on which chunk
        took a slot first);
    ``sort_list`` (in the select, on the rows it keeps): the list put back in id order, the order every
        reader of a list expects (ties by lower id, the residual draw's scan), so slots taken in any
        order give one result.
Shape-static and sync-free (CUDA-graph safe).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .logit_bins import FULL, NOFILTER, PENDING, load_z, row_params, row_stats


@triton.jit
def candidate_depth(inv_s, list_cap):
    """The depth d = m - z down to which a row's list holds its tokens: ln((list_cap - 1) / S), where p = exp(-d) / S
    reaches 1 / (list_cap - 1), and at least 0 (the maxima). Every token left out lies deeper."""
    return tl.maximum(tl.log((list_cap - 1).to(tl.float32) * inv_s), 0.0)


@triton.jit
def _candidate_kernel(
    Logits,
    Temperature,
    Top_k,
    Top_p,
    Min_p,
    Stats,
    ListIds,
    ListZ,
    ListN,
    ChunkMass,
    vocab,
    stride_l,
    repeats,
    n_chunks,
    list_cap,
    GREEDY_EPS_C: tl.constexpr,
    NCH: tl.constexpr,
    CHUNK_C: tl.constexpr,
    BLOCK_V: tl.constexpr,
    MIN_P: tl.constexpr,
):
    row, ch = tl.program_id(0).to(tl.int64), tl.program_id(1)
    inv_t, k_eff, p_lim, min_p = row_params(
        Temperature, Top_k, Top_p, Min_p, row // repeats, vocab, GREEDY_EPS_C, MIN_P
    )
    if (k_eff < vocab) | (p_lim < float("inf")) | (min_p > 0.0):  # a row with no filter lists nothing
        m, inv_s, fin, zmin, arg = row_stats(Stats, row, n_chunks, NCH)
        depth = candidate_depth(inv_s, list_cap)
        base_l = Logits + row * stride_l
        offs = tl.arange(0, BLOCK_V)
        mass = 0.0
        for sub in range(0, CHUNK_C, BLOCK_V):
            idx = ch * CHUNK_C + sub + offs
            z = load_z(base_l, idx, vocab, inv_t)
            take = (m - z <= depth) & (z > -float("inf"))
            # Relaxed: a slot only has to be unique; the select reads the list after this launch ends.
            slot = tl.atomic_add(ListN + row + idx * 0, 1, mask=take, sem="relaxed")
            keep = take & (slot < list_cap)
            tl.store(ListIds + row * list_cap + slot, idx, mask=keep)
            tl.store(ListZ + row * list_cap + slot, z, mask=keep)
            mass += tl.sum(tl.where(take, tl.exp(z - m), 0.0), axis=0)
        tl.store(ChunkMass + row * NCH + ch, mass)


@triton.jit
def _sort_slice(Ids, Zs, n_items, SIZE: tl.constexpr):
    pos = tl.arange(0, SIZE)
    live = pos < n_items
    ids = tl.load(Ids + pos, mask=live, other=2147483647)  # padding sorts last
    zbits = tl.load(Zs + pos, mask=live, other=0.0).to(tl.int32, bitcast=True)
    # Ids are unique: sorting (id, z bits) packed in one int64 orders by id and carries each z along.
    key = tl.sort((ids.to(tl.int64) << 32) | (zbits.to(tl.int64) & 0xFFFFFFFF))
    tl.store(Ids + pos, (key >> 32).to(tl.int32), mask=live)
    tl.store(Zs + pos, key.to(tl.int32).to(tl.float32, bitcast=True), mask=live)


@triton.jit
def sort_list(Ids, Zs, n_items, CAP_P2: tl.constexpr):
    """Put a list of n_items <= CAP_P2 (id, z) pairs in ascending id order, in place; the smallest sort that
    holds them (a nucleus is a few tokens: 64 most of the time). Ends with a barrier, so the program's
    threads read the sorted list afterwards."""
    if n_items <= 64:
        _sort_slice(Ids, Zs, n_items, 64)
    elif n_items <= 512:
        _sort_slice(Ids, Zs, n_items, 512)
    else:
        _sort_slice(Ids, Zs, n_items, CAP_P2)
    tl.debug_barrier()


@triton.jit
def candidate_path(
    Temperature,
    Top_k,
    Top_p,
    Min_p,
    Path,
    ListN,
    ListIds,
    ListZ,
    ChunkMass,
    row,
    inv_s,
    fin,
    vocab,
    repeats,
    n_chunks,
    list_cap,
    GREEDY_EPS_C: tl.constexpr,
    NCH: tl.constexpr,
    RANK: tl.constexpr,
    MIN_P: tl.constexpr,
    CAP_P2: tl.constexpr,
):
    """A row's path from its candidate list, stored and returned: NOFILTER (no filter); FULL, the list sorted,
    when its count and mass (the chunks' sums: the same whatever order the slots were taken in) say the cut
    lies inside it (the select then decides on exact sums over the sorted list); else PENDING (so is a list
    that overflowed)."""
    inv_t, k_eff, p_lim, min_p = row_params(
        Temperature, Top_k, Top_p, Min_p, row // repeats, vocab, GREEDY_EPS_C, MIN_P
    )
    path = tl.full([], PENDING, tl.int32)
    if (k_eff >= vocab) & (p_lim == float("inf")) & (min_p <= 0.0):
        path = tl.full([], NOFILTER, tl.int32)
        tl.store(ListN + row, 0)
    else:
        n_items = tl.load(ListN + row)
        chs = tl.arange(0, NCH)
        mass = tl.sum(tl.load(ChunkMass + row * NCH + chs, mask=chs < n_chunks, other=0.0), axis=0) * inv_s
        if RANK:
            by_mass = mass > p_lim
        else:
            by_mass = mass >= p_lim
        floor_d = tl.where(min_p > 0.0, -tl.log(tl.maximum(min_p, 1e-30)), float("inf"))
        by_floor = candidate_depth(inv_s, list_cap) > floor_d
        likely = (n_items <= list_cap) & ((n_items >= k_eff) | (n_items >= fin) | by_mass | by_floor)
        if MIN_P and not RANK:  # top_p of the top-k mass: the list must hold the top k
            likely = likely & ((p_lim == float("inf")) | (k_eff >= vocab) | (n_items >= k_eff))
        if likely:
            sort_list(ListIds + row * list_cap, ListZ + row * list_cap, n_items, CAP_P2)
            path = tl.full([], FULL, tl.int32)
    tl.store(Path + row, path)
    return path
