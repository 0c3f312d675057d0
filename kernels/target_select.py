"""The select launches of ``target_filter``: each row's exact threshold, written as its descriptor.

``select_top_kernel`` runs after the top list's gather (launch 2 of ``target_filter``): a row whose cut
provably lies inside its top list gets its exact threshold over the list, the others become PENDING
with the list's exact count and mass as the bracket stage's start. ``select_kernel`` runs after the
bracket stage (launch 4): the exact threshold over the bracket's list, or, for a bracket too large to
list, one tied value (TIE) or the whole row (VOCAB). Both write ``Desc`` in the layout ``TargetRows``
documents: (m, z*, scale, tie_end) per row.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .logit_bins import (
    BIG,
    FULL,
    NOFILTER,
    PENDING,
    PLAN_F,
    PLAN_I,
    TIE,
    VOCAB,
    WINDOW,
    floor_depth,
    load_z,
    row_params,
    row_stats,
)
from .target_wide import above, next_up, tie_cut, wide_cut
from .top_candidates import candidate_path

_SLACK_SELECT = tl.constexpr(1e-4)  # the min-p floor's bin test, as the plan's
_ALL_ABOVE_SELECT = tl.constexpr(-1073741824)  # a list range that holds every token above it


@triton.jit
def _nth_in_range(
    base_l,
    Offsets,
    row,
    nth,
    n_chunks,
    m,
    r,
    base,
    lo,
    hi,
    first,
    vocab,
    inv_t,
    NB_C: tl.constexpr,
    NCH: tl.constexpr,
    CHUNK_C: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """The id of the nth (1-based, id order) token of a row's final bin range, from the per-chunk offsets."""
    chs = tl.arange(0, NCH)
    offs_c = tl.load(Offsets + row * NCH + chs, mask=chs < n_chunks, other=2147483647)
    ch = tl.max(tl.where(offs_c < nth, chs, 0), axis=0)
    seen = tl.sum(tl.where(chs == ch, offs_c, 0), axis=0)
    offs = tl.arange(0, BLOCK_V)
    found = vocab
    for sub in range(0, CHUNK_C, BLOCK_V):
        idx = ch * CHUNK_C + sub + offs
        z = load_z(base_l, idx, vocab, inv_t)
        j = tl.minimum((m - z) * r, 1.0e9).to(tl.int32) - base
        j = tl.where(first != 0, tl.minimum(j, NB_C - 2), j)
        take = (z > -float("inf")) & (j >= lo) & (j <= hi)
        hit = take & (seen + tl.cumsum(take.to(tl.int32), axis=0) == nth)
        found = tl.minimum(found, tl.min(tl.where(hit, idx, vocab), axis=0))
        seen += tl.sum(take.to(tl.int32), axis=0)
    return found


@triton.jit
def _store_desc(Desc, row, m, z_star, scale, tie_end):
    out = Desc + row * 4
    tl.store(out, m)
    tl.store(out + 1, z_star)
    tl.store(out + 2, scale)
    tl.store(out + 3, tie_end.to(tl.float32))  # ids < 2^24 are exact in fp32


@triton.jit
def _list_top(ListZ, row, n_items, list_cap, BLOCK_V: tl.constexpr):
    """The largest z of a row's list."""
    top = -float("inf")
    for start in range(0, n_items, BLOCK_V):
        pos = start + tl.arange(0, BLOCK_V)
        z = tl.load(ListZ + row * list_cap + pos, mask=pos < n_items, other=-float("inf"))
        top = tl.maximum(top, tl.max(z, axis=0))
    return top


@triton.jit
def whole_row_cut(
    base_l, vocab, inv_t, m, inv_s, k_eff, p_lim, floor, RANK: tl.constexpr, MIN_P: tl.constexpr, BLOCK_V: tl.constexpr
):
    """(z*, tie end, kept mass) of a row by an exact pass over its whole vocabulary (the VOCAB path: no list, no
    offsets above it; the row max bounds the threshold)."""
    return wide_cut(
        base_l, base_l, base_l, vocab, vocab, inv_t, m, inv_s, k_eff, p_lim, floor, m, 0, 0.0, RANK, MIN_P, False,
        BLOCK_V,
    )  # fmt: skip


@triton.jit
def select_top_kernel(
    Logits,
    Temperature,
    Top_k,
    Top_p,
    Min_p,
    Stats,
    PlanI,
    PlanF,
    Path,
    ListN,
    ListIds,
    ListZ,
    ChunkMass,
    Desc,
    vocab,
    stride_l,
    repeats,
    n_chunks,
    list_cap,
    GREEDY_EPS_C: tl.constexpr,
    NCH: tl.constexpr,
    BLOCK_V: tl.constexpr,
    RANK: tl.constexpr,
    MIN_P: tl.constexpr,
    CANDIDATES: tl.constexpr,
    CAP_P2: tl.constexpr,
):
    """The rows with a complete top list: the exact threshold when the cut provably lies inside it, else the
    row becomes PENDING with the list's exact count and mass as the bracket stage's start. NOFILTER rows
    get the softmax itself. With CANDIDATES the list is ``top_candidates``' (every row PENDING so far): a row
    that likely decides from it (its chunks' exact count and mass) gets it sorted and is decided here; the
    others stay PENDING with that count and mass as the bracket stage's start."""
    row = tl.program_id(0).to(tl.int64)
    m, inv_s, fin, zmin, arg = row_stats(Stats, row, n_chunks, NCH)
    if CANDIDATES:
        path = candidate_path(
            Temperature, Top_k, Top_p, Min_p, Path, PlanI, PlanF, ListN, ListIds, ListZ, ChunkMass, row, inv_s, fin,
            vocab, repeats, n_chunks, list_cap, GREEDY_EPS_C, NCH, RANK, MIN_P, CAP_P2,
        )  # fmt: skip
    else:
        path = tl.load(Path + row)
    if path == NOFILTER:
        _store_desc(Desc, row, m, -float("inf"), inv_s, vocab)
    if path == FULL:
        inv_t, k_eff, p_lim, min_p = row_params(
            Temperature, Top_k, Top_p, Min_p, row // repeats, vocab, GREEDY_EPS_C, MIN_P
        )
        floor = tl.where(min_p > 0.0, m + tl.log(tl.maximum(min_p, 1e-30)), -float("inf"))
        n_items = tl.load(ListN + row)
        ids, zs = ListIds + row * list_cap, ListZ + row * list_cap
        top = _list_top(ListZ, row, n_items, list_cap, BLOCK_V)
        n_all, mass = above(zs, ids, zs, n_items, vocab, inv_t, m, inv_s, -float("inf"), 0, 0.0, False, True, BLOCK_V)
        # The first token under the list has every listed token above it: it is cut iff they reach top_k or
        # the mass limit (on flashinfer's min-p rows top_p x the top-k mass: exact from the list once it
        # holds top_k tokens, else at most top_p), or it lies under the min-p floor (surely: its bin does).
        plan = PlanI + row * PLAN_I
        hi = tl.load(plan + 5)
        r = tl.load(PlanF + row * PLAN_F + 1)
        p_lim_eff = p_lim
        whole_row = n_items < 0
        if MIN_P and not RANK:
            joint = (p_lim < float("inf")) & (k_eff < vocab)
            if joint & (n_items >= k_eff):
                z_k, tie_k, mass_k = wide_cut(
                    zs,
                    ids,
                    zs,
                    n_items,
                    vocab,
                    inv_t,
                    m,
                    inv_s,
                    k_eff,
                    float("inf"),
                    -float("inf"),
                    top,
                    0,
                    0.0,
                    False,
                    False,
                    True,
                    BLOCK_V,
                )
                p_lim_eff = p_lim * mass_k
            # The top-k mass that scales top_p needs the top-k tokens past the list: the whole row, exactly.
            whole_row = joint & (n_items < k_eff)
        if RANK:
            by_mass = mass > p_lim_eff
        else:
            by_mass = mass >= p_lim_eff
        floor_d = floor_depth(min_p)
        by_floor = (hi + 1.0) / r * (1.0 - _SLACK_SELECT) > floor_d
        if whole_row:
            base_l = Logits + row * stride_l
            z_star, tie_end, kept = whole_row_cut(
                base_l, vocab, inv_t, m, inv_s, k_eff, p_lim, floor, RANK, MIN_P, BLOCK_V
            )
            _store_desc(Desc, row, m, z_star, inv_s / kept, tie_end)
            tl.store(Path + row, VOCAB)
        elif (n_items >= k_eff) | (n_items >= fin) | by_mass | by_floor:
            z_star, tie_end, kept = wide_cut(
                zs,
                ids,
                zs,
                n_items,
                vocab,
                inv_t,
                m,
                inv_s,
                k_eff,
                p_lim,
                floor,
                top,
                0,
                0.0,
                RANK,
                MIN_P,
                True,
                BLOCK_V,
            )
            _store_desc(Desc, row, m, z_star, inv_s / kept, tie_end)
        else:
            tl.store(Path + row, PENDING)
            tl.store(plan + 2, hi + 1)
            tl.store(plan + 8, n_items)
            tl.store(PlanF + row * PLAN_F + 2, mass)


@triton.jit
def select_kernel(
    Logits,
    Temperature,
    Top_k,
    Top_p,
    Min_p,
    Stats,
    PlanI,
    PlanF,
    Path,
    ListN,
    ListIds,
    ListZ,
    Offsets,
    AboveMass,
    RangeZ,
    Desc,
    vocab,
    stride_l,
    repeats,
    n_chunks,
    list_cap,
    GREEDY_EPS_C: tl.constexpr,
    NB_C: tl.constexpr,
    NCH: tl.constexpr,
    CHUNK_C: tl.constexpr,
    BLOCK_V: tl.constexpr,
    RANK: tl.constexpr,
    MIN_P: tl.constexpr,
):
    """The bracket stage's rows: the exact threshold over the list with the offsets above it (WINDOW; FULL
    once the list holds everything above it too), or, for a bracket too large to list, one tied value (TIE)
    or the whole row (VOCAB)."""
    row = tl.program_id(0).to(tl.int64)
    path = tl.load(Path + row)
    if (path == WINDOW) | (path == BIG):
        inv_t, k_eff, p_lim, min_p = row_params(
            Temperature, Top_k, Top_p, Min_p, row // repeats, vocab, GREEDY_EPS_C, MIN_P
        )
        m, inv_s, fin, zmin, arg = row_stats(Stats, row, n_chunks, NCH)
        base_l = Logits + row * stride_l
        floor = tl.where(min_p > 0.0, m + tl.log(tl.maximum(min_p, 1e-30)), -float("inf"))
        chs = tl.arange(0, NCH)
        plan = PlanI + row * PLAN_I
        cnt_off = tl.load(plan + 7)
        mass_off = tl.sum(tl.load(AboveMass + row * NCH + chs, mask=chs < n_chunks, other=0.0), axis=0) * inv_s
        n_items = tl.load(ListN + row)
        z_star = tl.full([], -float("inf"), tl.float32)
        tie_end = vocab
        mass = mass_off
        new_path = path
        if path == WINDOW:
            if n_items > 0:  # else every finite token lies above the list: all kept
                ids, zs = ListIds + row * list_cap, ListZ + row * list_cap
                top = _list_top(ListZ, row, n_items, list_cap, BLOCK_V)
                z_star, tie_end, mass = wide_cut(
                    base_l,
                    ids,
                    zs,
                    n_items,
                    vocab,
                    inv_t,
                    m,
                    inv_s,
                    k_eff,
                    p_lim,
                    floor,
                    top,
                    cnt_off,
                    mass_off,
                    RANK,
                    MIN_P,
                    True,
                    BLOCK_V,
                )
            new_path = tl.where(tl.load(plan + 4) == _ALL_ABOVE_SELECT, FULL, WINDOW)
        else:
            rng = RangeZ + (row * NCH + chs) * 2
            z_lo = tl.min(tl.load(rng, mask=chs < n_chunks, other=float("inf")), axis=0)
            z_hi = tl.max(tl.load(rng + 1, mask=chs < n_chunks, other=-float("inf")), axis=0)
            if z_lo == z_hi:
                new_path = TIE
                n_tie, mass = tie_cut(
                    z_lo, n_items, cnt_off, mass_off, m, inv_s, k_eff, p_lim, floor, vocab, RANK, MIN_P
                )
                z_star = tl.where(n_tie > 0, z_lo, next_up(z_lo))
                if RANK:
                    if (n_tie > 0) & (n_tie < n_items):
                        tie_end = _nth_in_range(
                            base_l,
                            Offsets,
                            row,
                            n_tie,
                            n_chunks,
                            m,
                            tl.load(PlanF + row * PLAN_F + 1),
                            tl.load(plan + 3),
                            tl.load(plan + 4),
                            tl.load(plan + 5),
                            tl.load(plan + 6),
                            vocab,
                            inv_t,
                            NB_C,
                            NCH,
                            CHUNK_C,
                            BLOCK_V,
                        )
            else:
                new_path = VOCAB
                z_star, tie_end, mass = whole_row_cut(
                    base_l, vocab, inv_t, m, inv_s, k_eff, p_lim, floor, RANK, MIN_P, BLOCK_V
                )
        _store_desc(Desc, row, m, z_star, inv_s / mass, tie_end)
        tl.store(Path + row, new_path)
