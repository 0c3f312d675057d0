"""The exact threshold of a target row: over the list ``cut_plan`` gathered, or over the whole vocabulary.

A row's kept set is returned as (z*, tie_end, kept mass): token i is kept iff z_i > z*, or z_i == z*
and i <= tie_end (the pytorch rule's partial ties; flashinfer keeps every tie, tie_end = V). Items are
the list's tokens (``LIST``: ids ``Ids`` and z ``Zs``, n_items of them in ascending id order) or the
row's (``LIST`` off: n_items = V, ids 0..V-1). A list comes with offsets: cnt_off tokens of mass
mass_off (already divided by S) lie above all of it, every one of them kept, and ``top`` is the
list's largest z; the counts and masses above a value t <= top are then cnt_off + the list's own.
Every token below the list is cut (``cut_plan`` widens the list until one is), so the bisections
below, which search t between the list and -inf, meet the true condition at the first token under
the list. The thresholds are bisections on z's int32 key (~33 passes over the items): cheap over a
list of at most a few thousand tokens; over the whole vocabulary (the rare fallback) ~1 ms a row.
``tie_cut`` decides a bracket whose tokens all hold one value without listing them.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .logit_bins import load_z


@triton.jit
def _to_key(z):
    # float32 -> int32 whose signed order is z's order (negative floats count down in bits).
    b = z.to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF)


@triton.jit
def _from_key(k):
    return tl.where(k >= 0, k, k ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def next_up(z):
    """The least float above z (z finite): a threshold that keeps exactly the tokens above z."""
    return _from_key(_to_key(z) + 1)


@triton.jit
def _item(base_l, Ids, Zs, pos, n_items, vocab, inv_t, LIST: tl.constexpr):
    """(token id, z) of item ``pos``; past the end: id vocab, z -inf."""
    if LIST:
        live = pos < n_items
        idx = tl.load(Ids + pos, mask=live, other=vocab)
        z = tl.load(Zs + pos, mask=live, other=-float("inf"))
    else:
        idx = pos
        z = load_z(base_l, pos, vocab, inv_t)
    return idx, z


@triton.jit
def above(
    base_l,
    Ids,
    Zs,
    n_items,
    vocab,
    inv_t,
    m,
    inv_s,
    t,
    cnt_off,
    mass_off,
    STRICT: tl.constexpr,
    LIST: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """(#tokens with z > t (STRICT) or z >= t, their probability mass), the offsets included (t <= top)."""
    offs = tl.arange(0, BLOCK_V)
    cnt = 0
    mass = 0.0
    for start in range(0, n_items, BLOCK_V):
        item_id, z = _item(base_l, Ids, Zs, start + offs, n_items, vocab, inv_t, LIST)
        if STRICT:
            sel = z > t
        else:
            sel = z >= t
        cnt += tl.sum(sel.to(tl.int32), axis=0)
        mass += tl.sum(tl.where(sel, tl.exp(z - m), 0.0), axis=0)
    return cnt + cnt_off, mass * inv_s + mass_off


@triton.jit
def _value_cut(
    base_l,
    Ids,
    Zs,
    n_items,
    vocab,
    inv_t,
    m,
    inv_s,
    lim,
    p_lim,
    top,
    cnt_off,
    mass_off,
    LIST: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """The least t with #{z > t} < lim and mass{z > t} < p_lim (the flashinfer rule: a token x is kept iff
    t holds at z_x, so the kept set is {z >= t}). Bisection on the key; hi = top holds (the caller checks)."""
    lo = _to_key(tl.full([], -float("inf"), tl.float32)).to(tl.int64) - 1
    hi = _to_key(top).to(tl.int64)
    for _ in range(33):
        mid = lo + ((hi - lo) >> 1)
        cnt, mass = above(
            base_l,
            Ids,
            Zs,
            n_items,
            vocab,
            inv_t,
            m,
            inv_s,
            _from_key(mid.to(tl.int32)),
            cnt_off,
            mass_off,
            True,
            LIST,
            BLOCK_V,
        )
        # Once hi - lo == 1, mid == lo (a NaN key below -inf): nothing moves.
        ok = (cnt < lim) & (mass < p_lim)
        open_ = hi - lo > 1
        hi = tl.where(ok & open_, mid, hi)
        lo = tl.where(ok | ~open_, lo, mid)
    return _from_key(hi.to(tl.int32))


@triton.jit
def _rank_cut(
    base_l,
    Ids,
    Zs,
    n_items,
    vocab,
    inv_t,
    m,
    inv_s,
    lim,
    p_lim,
    top,
    cnt_off,
    mass_off,
    LIST: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """The z of the last kept rank, rank r kept iff r < lim and the mass ahead of it <= p_lim (the pytorch
    rule): the largest t whose tokens z >= t reach lim or carry more than p_lim (above top: the caller)."""
    lo = _to_key(tl.full([], -float("inf"), tl.float32)).to(tl.int64)  # z >= -inf: every token, always true
    hi = _to_key(top).to(tl.int64) + 1
    for _ in range(32):
        mid = lo + ((hi - lo) >> 1)
        cnt, mass = above(
            base_l,
            Ids,
            Zs,
            n_items,
            vocab,
            inv_t,
            m,
            inv_s,
            _from_key(mid.to(tl.int32)),
            cnt_off,
            mass_off,
            False,
            LIST,
            BLOCK_V,
        )
        ok = (cnt >= lim) | (mass > p_lim)
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return _from_key(lo.to(tl.int32))


@triton.jit
def _rank_ties(
    base_l,
    Ids,
    Zs,
    n_items,
    vocab,
    inv_t,
    m,
    inv_s,
    z_star,
    lim,
    p_lim,
    cnt_off,
    mass_off,
    LIST: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """(tie_end, kept mass) of the rank prefix ending at value z*: ranks G .. G+E-1 hold z* (lower ids
    first); tie j is kept iff G + j < lim and the mass ahead of it, M_gt + j * p(z*), <= p_lim."""
    n_gt, mass_gt = above(
        base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, z_star, cnt_off, mass_off, True, LIST, BLOCK_V
    )
    n_ge, mass_ge = above(
        base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, z_star, cnt_off, mass_off, False, LIST, BLOCK_V
    )
    n_eq = n_ge - n_gt
    v = tl.exp(z_star - m) * inv_s
    by_p = tl.where(v > 0.0, tl.floor((p_lim - mass_gt) / v) + 1.0, n_eq.to(tl.float32))
    n_tie = tl.minimum(lim - n_gt, tl.minimum(by_p, n_eq.to(tl.float32)).to(tl.int32))
    n_tie = tl.maximum(n_tie, 1)  # z* is kept by construction, whatever the rounding of M_gt
    offs = tl.arange(0, BLOCK_V)
    seen = 0
    tie_end = vocab
    for start in range(0, n_items, BLOCK_V):
        idx, z = _item(base_l, Ids, Zs, start + offs, n_items, vocab, inv_t, LIST)
        eq = z == z_star
        last = eq & (seen + tl.cumsum(eq.to(tl.int32), axis=0) == n_tie)
        tie_end = tl.minimum(tie_end, tl.min(tl.where(last, idx, vocab), axis=0))
        seen += tl.sum(eq.to(tl.int32), axis=0)
    return tie_end, mass_gt + n_tie.to(tl.float32) * v


@triton.jit
def wide_cut(
    base_l,
    Ids,
    Zs,
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
    RANK: tl.constexpr,
    MIN_P: tl.constexpr,
    LIST: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    """(z*, tie_end, kept mass) of a row under its backend's rule (see target_filter). Over a list: the
    kept set ends inside it or just above it (then z* = next_up(top): only the offsets' tokens)."""
    if RANK:
        lim = k_eff
        if MIN_P:
            n_min, mass_min = above(
                base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, floor, cnt_off, mass_off, False, LIST, BLOCK_V
            )
            lim = tl.minimum(lim, tl.maximum(n_min, 1))
        z_star = _rank_cut(
            base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, lim, p_lim, top, cnt_off, mass_off, LIST, BLOCK_V
        )
        tie_end, mass = _rank_ties(
            base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, z_star, lim, p_lim, cnt_off, mass_off, LIST, BLOCK_V
        )
        # The last kept rank lies above the list: the offsets' tokens alone are kept.
        above_only = (cnt_off >= lim) | (mass_off > p_lim)
    else:
        lim_p = p_lim
        if MIN_P:
            # top-p is judged on the top-k renormalised row: mass ahead < top_p x (top-k mass).
            if (p_lim < float("inf")) & (k_eff < vocab):
                z_k = _value_cut(
                    base_l,
                    Ids,
                    Zs,
                    n_items,
                    vocab,
                    inv_t,
                    m,
                    inv_s,
                    k_eff,
                    float("inf"),
                    top,
                    cnt_off,
                    mass_off,
                    LIST,
                    BLOCK_V,
                )
                z_k = tl.where(cnt_off < k_eff, z_k, next_up(top))
                n_k, mass_k = above(
                    base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, z_k, cnt_off, mass_off, False, LIST, BLOCK_V
                )
                lim_p = p_lim * mass_k
        z_star = _value_cut(
            base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, k_eff, lim_p, top, cnt_off, mass_off, LIST, BLOCK_V
        )
        above_only = (cnt_off >= k_eff) | (mass_off >= lim_p)
        if MIN_P:
            z_star = tl.maximum(z_star, floor)
            above_only |= top < floor
        # Kept: z >= z*, every tie; z > z* or (z == z* and any id) says the same.
        tie_end = vocab
        n_kept, mass = above(
            base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, z_star, cnt_off, mass_off, False, LIST, BLOCK_V
        )
    z_star = tl.where(above_only, next_up(top), z_star)
    tie_end = tl.where(above_only, vocab, tie_end)
    mass = tl.where(above_only, mass_off, mass)
    return z_star, tie_end, mass


@triton.jit
def tie_cut(v, n_eq, cnt_off, mass_off, m, inv_s, k_eff, p_lim, floor, vocab, RANK: tl.constexpr, MIN_P: tl.constexpr):
    """(kept ties, kept mass) when the n_eq tokens of a row's bracket all hold the value v, cnt_off tokens
    of mass mass_off above them (all kept) and every token below them cut: flashinfer keeps all of them
    or none, pytorch a prefix by id (the caller finds the last one)."""
    pv = tl.exp(v - m) * inv_s
    if RANK:
        lim = k_eff
        if MIN_P:
            lim = tl.minimum(lim, tl.maximum(cnt_off + tl.where(v >= floor, n_eq, 0), 1))
        by_p = tl.where(pv > 0.0, tl.floor((p_lim - mass_off) / pv) + 1.0, n_eq.to(tl.float32))
        n_tie = tl.minimum(lim - cnt_off, tl.minimum(tl.maximum(by_p, 0.0), n_eq.to(tl.float32)).to(tl.int32))
        n_tie = tl.maximum(n_tie, 0)
    else:
        lim_p = p_lim
        if MIN_P:
            joint = (p_lim < float("inf")) & (k_eff < vocab)
            mass_k = tl.where(cnt_off >= k_eff, mass_off, mass_off + n_eq.to(tl.float32) * pv)
            lim_p = tl.where(joint, p_lim * mass_k, p_lim)
        keep = (cnt_off < k_eff) & (mass_off < lim_p)
        if MIN_P:
            keep &= v >= floor
        n_tie = tl.where(keep, n_eq, 0)
    return n_tie, mass_off + n_tie.to(tl.float32) * pv
