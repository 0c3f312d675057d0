"""Per-row planning between the vocabulary-parallel passes of ``logit_bins``: which tokens a row's list holds.

Top list (``top_plan_kernel``, after level 1's histogram): the top run of bins holding at most
``list_cap`` tokens. The draft sampler samples from it; the target filter's first select decides
every row whose cut provably lies inside it (exact sums over the list: the first token under the list
is cut when the list holds top_k tokens or top_p of the mass, or lies below the min-p floor). When
bin 0 alone holds more, the list is its first ``list_cap`` tokens in id order (the draft's candidates;
the target moves on to the bracket stage).

Bracket (``bracket_plan_kernel``, the rows whose cut lies below their top list, or whose bin 0 was
too full): a filter keeps a token by the count and mass above it (flashinfer: #{z > z_x} < top_k and
mass{z > z_x} < top_p; pytorch: rank < top_k and the mass ranked ahead <= top_p; both with the
min-p floor p >= min_p x p_max, and flashinfer's min-p batches judging top-p on the top-k
renormalised row). Counts per bin are exact, a bin's mass lies within [count x exp(-(j + 1) / R),
count x exp(-j / R)] / S, and the tokens above the stage's first bin (the top list) or above a later
level's bins have an exact count and mass. So every token of a bin is surely kept (the counts and
masses up to and including the bin are within the limits) or surely cut (those above it already reach
them), or neither: the bracket is the run of bins that are neither, and it holds the cut. Then
    WINDOW: the bracket fits the list (with everything above it too, when that fits: lo = -2^30);
    refine: its bins are split into the next level's finer ones (``logit_bins``), unless this is the
        last level or the bracket holds level 1's unbounded deepest bin;
    BIG: still more than ``list_cap`` tokens; the select resolves it as one tied value or over the row.
A bracket is widened to hold a token whenever a token lies below it, so the list always holds the
boundary between the kept and the cut tokens. Masses are bounded with margins for the exponential's
and the sums' rounding; the decisions that matter are made on exact sums by the selects.
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
    WINDOW,
    first_resolution,
    floor_depth,
    pow2_exponent,
    row_params,
    row_stats,
    unfiltered,
)

# Relative slack on bounded masses: the exponential's error (a few ulp) and fp32 sums of <= NB bins.
_SLACK = tl.constexpr(1e-4)
_ALL_ABOVE = tl.constexpr(-1073741824)  # a range's lo that takes every token above it too


@triton.jit
def _bin_totals(Hist, row, n_chunks, w, NB_C: tl.constexpr):
    """[NB] the row's bin counts over its chunks (bins from w on: 0), one chunk's [NB] at a time."""
    bins = tl.arange(0, NB_C)
    tot = tl.zeros([NB_C], dtype=tl.int32)
    for ch in range(0, n_chunks):
        tot += tl.load(Hist + (row * n_chunks + ch) * NB_C + bins, mask=bins < w, other=0)
    return tot


@triton.jit
def _chunk_offsets(Hist, Offsets, row, n_chunks, in_rng, extra, NB_C: tl.constexpr, NCH: tl.constexpr):
    """Store each chunk's offset into the list: the exclusive running sum of its tokens in range (bins where
    in_rng [NB]) plus ``extra`` [NCH] of its own."""
    bins = tl.arange(0, NB_C)
    chs = tl.arange(0, NCH)
    per_chunk = extra
    for ch in range(0, n_chunks):
        n = tl.sum(tl.load(Hist + (row * n_chunks + ch) * NB_C + bins, mask=in_rng, other=0), axis=0)
        per_chunk += tl.where(chs == ch, n, 0)
    tl.store(Offsets + row * NCH + chs, tl.cumsum(per_chunk, axis=0) - per_chunk)


@triton.jit
def _store_range(PlanI, PlanF, row, base, lo, hi, first, cnt_off, r):
    plan = PlanI + row * PLAN_I
    tl.store(plan + 1, 0)
    tl.store(plan + 3, base)
    tl.store(plan + 4, lo)
    tl.store(plan + 5, hi)
    tl.store(plan + 6, first)
    tl.store(plan + 7, cnt_off)
    tl.store(PlanF + row * PLAN_F + 1, r)


@triton.jit
def top_plan_kernel(
    Hist,
    Stats,
    Temperature,
    Top_k,
    Top_p,
    Min_p,
    PlanI,
    PlanF,
    Path,
    ListN,
    Offsets,
    vocab,
    repeats,
    n_chunks,
    list_cap,
    GREEDY_EPS_C: tl.constexpr,
    NB_C: tl.constexpr,
    DEPTH_C: tl.constexpr,
    NCH: tl.constexpr,
    MIN_P: tl.constexpr,
    TARGET: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    inv_t, k_eff, p_lim, min_p = row_params(
        Temperature, Top_k, Top_p, Min_p, row // repeats, vocab, GREEDY_EPS_C, MIN_P
    )
    no_filter = unfiltered(k_eff, p_lim, min_p, vocab)
    if not TARGET:
        no_filter = no_filter & False  # the draft samples every row from its list
    if no_filter:
        tl.store(Path + row, NOFILTER)
        tl.store(ListN + row, 0)
    else:
        m, inv_s, fin, zmin, arg = row_stats(Stats, row, n_chunks, NCH)
        bins = tl.arange(0, NB_C)
        real = bins < NB_C - 1
        tot = _bin_totals(Hist, row, n_chunks, NB_C - 1, NB_C)
        c_le = tl.cumsum(tot, axis=0)
        first_over = tl.min(tl.where(real & (c_le > list_cap), bins, NB_C), axis=0)
        hi = tl.maximum(first_over - 1, 0)
        n_list = tl.minimum(tl.sum(tl.where(bins <= hi, tot, 0), axis=0), list_cap)
        r = first_resolution(m, zmin, NB_C, DEPTH_C)
        _store_range(PlanI, PlanF, row, 0, _ALL_ABOVE, hi, 1, 0, r)
        complete = first_over > 0
        if TARGET:
            # The bracket stage from bin 0 takes a row whose bin 0 alone overflows the list, and a row whose
            # list surely holds less than top_k tokens and top_p of the mass (a flat row: its cut lies
            # deeper, and gathering the list would only be read again). Flashinfer's min-p rows judge
            # top-p on the top-k mass and min-p rows have a floor: they keep the list.
            if not MIN_P:
                u_list = (
                    tl.sum(
                        tl.where(real & (bins <= hi), tot.to(tl.float32) * tl.exp(-bins.to(tl.float32) / r), 0.0),
                        axis=0,
                    )
                    * inv_s
                    * (1.0 + _SLACK)
                )
                complete = complete & ((n_list >= k_eff) | (u_list >= p_lim))
            tl.store(PlanI + row * PLAN_I + 2, 0)
            tl.store(PlanI + row * PLAN_I + 8, 0)
            tl.store(PlanF + row * PLAN_F + 2, 0.0)
            tl.store(Path + row, tl.where(complete, FULL, PENDING))
        else:
            tl.store(Path + row, FULL)
        tl.store(ListN + row, n_list)
        _chunk_offsets(Hist, Offsets, row, n_chunks, real & (bins <= hi), tl.zeros([NCH], dtype=tl.int32), NB_C, NCH)


@triton.jit
def bracket_plan_kernel(
    Hist,
    AboveCnt,
    AboveMass,
    Stats,
    Temperature,
    Top_k,
    Top_p,
    Min_p,
    PlanI,
    PlanF,
    Path,
    ListN,
    Offsets,
    vocab,
    repeats,
    n_chunks,
    list_cap,
    GREEDY_EPS_C: tl.constexpr,
    NB_C: tl.constexpr,
    DEPTH_C: tl.constexpr,
    NCH: tl.constexpr,
    FIRST: tl.constexpr,
    LAST: tl.constexpr,
    RANK: tl.constexpr,
    MIN_P: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    plan = PlanI + row * PLAN_I
    if FIRST:  # level 1's histogram, from the bin under the top list
        active = tl.load(Path + row) == PENDING
    else:
        active = tl.load(plan + 1) > 0
    if active:
        inv_t, k_eff, p_lim, min_p = row_params(
            Temperature, Top_k, Top_p, Min_p, row // repeats, vocab, GREEDY_EPS_C, MIN_P
        )
        m, inv_s, fin, zmin, arg = row_stats(Stats, row, n_chunks, NCH)
        chs = tl.arange(0, NCH)
        bins = tl.arange(0, NB_C)
        if FIRST:
            r = first_resolution(m, zmin, NB_C, DEPTH_C)
            base = 0
            lvl1 = 1
            w = NB_C - 1
            real = (bins >= tl.load(plan + 2)) & (bins < w)  # the top list's bins lie above the stage
            above_c = tl.zeros([NCH], dtype=tl.int32)
            n_above_lvl = tl.load(plan + 8)
            above_mass = tl.load(PlanF + row * PLAN_F + 2)
        else:
            r = tl.load(PlanF + row * PLAN_F)
            base = tl.load(plan)
            lvl1 = 0
            w = tl.load(plan + 1)
            real = bins < w
            above_c = tl.load(AboveCnt + row * NCH + chs, mask=chs < n_chunks, other=0)
            n_above_lvl = tl.sum(above_c, axis=0)
            above_mass = tl.sum(tl.load(AboveMass + row * NCH + chs, mask=chs < n_chunks, other=0.0), axis=0) * inv_s
        tot = tl.where(real, _bin_totals(Hist, row, n_chunks, w, NB_C), 0)
        c_le = tl.cumsum(tot, axis=0) + n_above_lvl
        c_lt = c_le - tot
        jf = (base + bins).to(tl.float32)
        lo_d = jf / r
        hi_d = (jf + 1.0) / r
        if FIRST:  # level 1's last real bin holds every token deeper than the others
            hi_d = tl.where(bins == w - 1, float("inf"), hi_d)
        totf = tot.to(tl.float32)
        u = totf * tl.exp(-lo_d) * inv_s
        low = totf * tl.exp(-hi_d) * inv_s
        u_le = (above_mass + tl.cumsum(u, axis=0)) * (1.0 + _SLACK)
        l_lt = (above_mass + tl.cumsum(low, axis=0) - low) * (1.0 - _SLACK)
        p_sure = p_lim
        p_cut = p_lim
        if MIN_P and not RANK:
            # top-p on the top-k renormalised row: the top-k mass lies between the mass above the
            # bin holding the k-th token and the mass up to it.
            joint = (p_lim < float("inf")) & (k_eff < vocab)
            j_k = tl.min(tl.where(real & (c_le >= k_eff), bins, w - 1), axis=0)
            p_sure = tl.where(joint, p_lim * tl.max(tl.where(bins == j_k, l_lt, 0.0), axis=0), p_lim)
            p_cut = tl.where(joint, p_lim * tl.max(tl.where(bins == j_k, u_le, 0.0), axis=0), p_lim)
        floor_d = floor_depth(min_p)
        sure = ~real | ((c_le <= k_eff) & (u_le < p_sure) & (hi_d * (1.0 + _SLACK) < floor_d))
        sure = sure & (bins < w)  # bins before the stage's first one count as kept (they are above it)
        if RANK:
            cut = (c_lt >= k_eff) | (l_lt > p_cut)
        else:
            cut = (c_lt >= k_eff) | (l_lt >= p_cut)
        cut = real & (cut | (lo_d * (1.0 - _SLACK) > floor_d)) | (bins >= w)
        j_lo = tl.minimum(tl.min(tl.where(sure, NB_C, bins), axis=0), w)
        j_hi = tl.min(tl.where(cut & (bins >= j_lo), bins, NB_C), axis=0) - 1
        if MIN_P and not RANK:
            j_hi = tl.maximum(j_hi, tl.where(joint, j_k, -1))  # the top-k mass is computed from the list
        j_hi = tl.minimum(j_hi, w - 1)
        # The list must hold the boundary: a token below an empty bracket joins it (it is cut), or,
        # when the only tokens below lie under this level (cut at the level before), the last token
        # above it does (it is kept).
        n_in = tl.sum(tl.where(real & (bins >= j_lo) & (bins <= j_hi), tot, 0), axis=0)
        next_full = tl.min(tl.where(real & (bins > j_hi) & (tot > 0), bins, NB_C), axis=0)
        prev_full = tl.max(tl.where(real & (bins < j_lo) & (tot > 0), bins, -1), axis=0)
        under = fin - n_above_lvl - tl.sum(tot, axis=0)  # finite tokens below this level's bins
        widen_down = (n_in == 0) & (next_full < NB_C)
        widen_up = (n_in == 0) & (next_full == NB_C) & (under > 0) & (prev_full >= 0)
        j_hi = tl.where(widen_down, next_full, tl.where(widen_up, prev_full, j_hi))
        j_lo = tl.minimum(tl.where(widen_up, prev_full, j_lo), tl.maximum(j_hi, 0))
        in_rng = real & (bins >= j_lo) & (bins <= j_hi)
        n_in = tl.sum(tl.where(in_rng, tot, 0), axis=0)
        n_up = n_above_lvl + tl.sum(tl.where(real & (bins < j_lo), tot, 0), axis=0)
        width = tl.maximum(j_hi - j_lo + 1, 1)
        split = 1 << pow2_exponent(tl.maximum((NB_C - 1) // width, 1).to(tl.float32))
        refinable = (split >= 2) & (n_in > list_cap)
        if FIRST:  # level 1's deepest bin is unbounded: it cannot be split
            refinable = refinable & (j_hi < w - 1)
        if LAST:
            refinable = refinable & (split < 0)
        if refinable:
            tl.store(plan, (base + j_lo) * split)
            tl.store(plan + 1, width * split)
            tl.store(PlanF + row * PLAN_F, r * split.to(tl.float32))
        else:
            everything = n_up + n_in <= list_cap
            lo = tl.where(everything, _ALL_ABOVE, j_lo)
            _store_range(PlanI, PlanF, row, base, lo, j_hi, lvl1, tl.where(everything, 0, n_up), r)
            tl.store(Path + row, tl.where(n_in <= list_cap, WINDOW, BIG))
            tl.store(ListN + row, tl.where(everything, n_up + n_in, n_in))
            # Everything: the bins up to j_hi, the top list's before the stage's first one at level 1
            # included, and the tokens above a later level's bins.
            rng = tl.where(everything, (bins <= j_hi) & (bins < w), in_rng)
            _chunk_offsets(Hist, Offsets, row, n_chunks, rng, tl.where(everything, above_c, 0), NB_C, NCH)
