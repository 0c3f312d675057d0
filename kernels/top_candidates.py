"""The target filter's first list without a histogram: the level-1 bins whose tokens hold >= 1 / (list_cap - 1).

At most list_cap - 1 tokens of a row can each hold 1 / (list_cap - 1) of its mass, so the bins above that
depth fit the list whatever the row looks like; no histogram has to size it first. Bin 0 (the maxima: a
greedy row's token) is listed even when it holds less; a list that still overflows (a near-uniform row's
thousands of near-tied maxima) is not used. On a peaked row (a real model's, at the temperatures people
sample with) the list holds the top-p nucleus, the top-k tokens or everything above the min-p floor, and
the select decides the row from it exactly; the other rows go on to the histogram's bracket stage
(``cut_plan``) from the bin under the list, with its exact count and mass. One read of the logits after
the statistics pass instead of a level-1 histogram and a scanned gather (two reads' time each), and only of
the chunks whose max (from the statistics) reaches the list: a few of a peaked row's 19 at 151,936 ids. A row
whose statistics already show that its candidates cannot decide it (``hopeless``: a near-uniform row) skips
it:

    ``_candidate_kernel`` (rows x chunks): the chunk's candidates written at slots taken with one relaxed
        atomic each (only candidates take one; the row's counter is list_n), and the chunk's exact mass
        exp(z - m) of its candidates (per chunk, so the row's sum does not depend on which chunk took a
        slot first);
    ``candidate_path`` (in the select): each row's path, and for the rows it keeps ``sort_list``: the list
        put back in id order, the order every reader of a list expects (ties by lower id, the residual
        draw's scan), so slots taken in any order give one result.
``target_filter_fwd(candidates=True)`` runs it (the server's unless ``--pillar-accept-list bins``).
Shape-static and sync-free (CUDA-graph safe).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .logit_bins import (
    FULL,
    NOFILTER,
    PENDING,
    PLAN_F,
    PLAN_I,
    chunk_max,
    first_resolution,
    floor_depth,
    level_bin,
    load_z,
    row_params,
    row_stats,
    unfiltered,
)


# Relative margin on the candidates' mass (the chunks' fp32 sums) when a row's bracket starts under its list.
_MARGIN = tl.constexpr(1e-5)


@triton.jit
def candidate_bins(m, zmin, inv_s, list_cap, NB_C: tl.constexpr, DEPTH_C: tl.constexpr):
    """(r, j0): level 1's resolution (``logit_bins``) and the first level-1 bin under a row's list, which holds
    bins 0 .. j0 - 1: tokens of depth d = m - z < j0 / r <= ln((list_cap - 1) / S), where p = exp(-d) / S
    reaches 1 / (list_cap - 1); bin 0 (the maxima) at least. Bin-aligned, so the bracket stage can start
    under the list with its exact count and mass, as under a top list of bins."""
    r = first_resolution(m, zmin, NB_C, DEPTH_C)
    d = tl.log((list_cap - 1).to(tl.float32) * inv_s)
    return r, tl.minimum(tl.maximum(d * r, 1.0), NB_C - 2).to(tl.int32)  # floor: d * r >= 1 here


@triton.jit
def hopeless(inv_s, fin, k_eff, p_lim, floor_d, r, j0, list_cap):
    """Whether a row's candidates surely cannot decide it, known from its statistics: at most min(list_cap, fin)
    tokens of at most p_max = 1 / S each reach neither top_p's mass nor top_k's count nor every finite token,
    and the list's last bin lies above any min-p floor (``floor_depth``). Such a row (a near-uniform one: random
    weights' logits) skips the candidate pass, so it costs what it did before the candidates."""
    mass_max = tl.minimum(fin, list_cap).to(tl.float32) * inv_s
    return (mass_max < p_lim * (1.0 - _MARGIN)) & (k_eff > list_cap) & (fin > list_cap) & (j0 / r <= floor_d)


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
    PlanI,
    PlanF,
    vocab,
    stride_l,
    repeats,
    n_chunks,
    list_cap,
    GREEDY_EPS_C: tl.constexpr,
    NCH: tl.constexpr,
    CHUNK_C: tl.constexpr,
    BLOCK_V: tl.constexpr,
    NB_C: tl.constexpr,
    DEPTH_C: tl.constexpr,
    MIN_P: tl.constexpr,
):
    row, ch = tl.program_id(0).to(tl.int64), tl.program_id(1)
    inv_t, k_eff, p_lim, min_p = row_params(
        Temperature, Top_k, Top_p, Min_p, row // repeats, vocab, GREEDY_EPS_C, MIN_P
    )
    if not unfiltered(k_eff, p_lim, min_p, vocab):  # a row with no filter lists nothing
        m, inv_s, fin, zmin, arg = row_stats(Stats, row, n_chunks, NCH)
        r, j0 = candidate_bins(m, zmin, inv_s, list_cap, NB_C, DEPTH_C)
        skip = hopeless(inv_s, fin, k_eff, p_lim, floor_depth(min_p), r, j0, list_cap)
        # The row's list bounds and its skip are decided here once, where every chunk computes them alike; the
        # select reads them instead of deriving them from its own sum over the chunks, which may round
        # differently: a j0 one bin off would claim a bin this pass never listed.
        if ch == 0:
            tl.store(PlanI + row * PLAN_I + 5, j0 - 1)
            tl.store(PlanF + row * PLAN_F + 1, r)
        if skip:
            tl.store(ChunkMass + row * NCH + ch, -1.0)  # a skipped row's mass reads negative
            return
        # A chunk whose max lies under the list holds no candidate (a token's bin only grows as z falls): its
        # mass is 0 without reading it. On a peaked row most chunks are such, on a wide one all but a few.
        if level_bin(chunk_max(Stats, row, n_chunks, ch), m, r, 0, NB_C - 1, True) >= j0:
            tl.store(ChunkMass + row * NCH + ch, 0.0)
            return
        base_l = Logits + row * stride_l
        offs = tl.arange(0, BLOCK_V)
        mass = 0.0
        for sub in range(0, CHUNK_C, BLOCK_V):
            idx = ch * CHUNK_C + sub + offs
            z = load_z(base_l, idx, vocab, inv_t)
            take = (level_bin(z, m, r, 0, NB_C - 1, True) < j0) & (z > -float("inf"))
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
    PlanI,
    PlanF,
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
    that overflowed, and a row the candidate pass skipped). The plan holds the list's last bin and level 1's
    resolution (the candidate pass's), and for a PENDING row the count and mass above the bracket stage's first
    bin, as ``select_top_kernel`` leaves a top list's."""
    inv_t, k_eff, p_lim, min_p = row_params(
        Temperature, Top_k, Top_p, Min_p, row // repeats, vocab, GREEDY_EPS_C, MIN_P
    )
    path = tl.full([], PENDING, tl.int32)
    if unfiltered(k_eff, p_lim, min_p, vocab):
        path = tl.full([], NOFILTER, tl.int32)
        tl.store(ListN + row, 0)
    else:
        n_items = tl.load(ListN + row)
        chs = tl.arange(0, NCH)
        mass = tl.sum(tl.load(ChunkMass + row * NCH + chs, mask=chs < n_chunks, other=0.0), axis=0) * inv_s
        plan = PlanI + row * PLAN_I
        j0 = tl.load(plan + 5) + 1  # the candidate pass's bounds and skip (``_candidate_kernel``)
        r = tl.load(PlanF + row * PLAN_F + 1)
        if RANK:
            by_mass = mass > p_lim
        else:
            by_mass = mass >= p_lim
        floor_d = floor_depth(min_p)
        by_floor = j0.to(tl.float32) / r > floor_d
        fits = (n_items <= list_cap) & (mass >= 0.0)
        likely = fits & ((n_items >= k_eff) | (n_items >= fin) | by_mass | by_floor)
        if MIN_P and not RANK:  # top_p of the top-k mass: the list must hold the top k
            short = (p_lim < float("inf")) & (k_eff < vocab) & (n_items < k_eff)
            likely = likely & ~short
            fits = fits & ~short
        if likely:
            sort_list(ListIds + row * list_cap, ListZ + row * list_cap, n_items, CAP_P2)
            path = tl.full([], FULL, tl.int32)
        else:
            # Every listed token is kept (fewer than top_k, less than top_p with a margin for the sums'
            # rounding, above any min-p floor): the bracket starts under the list. Otherwise (an overflowing
            # list, top-k mass unknown, or no list: a hopeless row) it starts at bin 0, which is always right.
            under = fits & (mass * (1.0 + _MARGIN) < p_lim)
            tl.store(plan + 2, tl.where(under, j0, 0))
            tl.store(plan + 8, tl.where(under, n_items, 0))
            tl.store(PlanF + row * PLAN_F + 2, tl.where(under, mass, 0.0))
    tl.store(Path + row, path)
    return path
