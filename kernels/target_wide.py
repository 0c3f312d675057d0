"""The exact threshold of a target row whose kept set does not fit its top-C candidates.

``kernels/target_filter.py`` decides almost every row from its top-C candidates. A row whose kept
set may extend past them (a nucleus wider than C, more than C tokens tied at the cut) finds its cut
here, one program per row: bisections on z's int32 key (~33 passes each) over a list of its top-C2
tokens (``LIST``: ids and z gathered with the C candidates; C2 = 2048 tokens a pass is cheap), or,
when even those may not hold the kept set, over the whole vocabulary (~1 ms a row at 151,936
tokens: the rare path). Each returns the kept set as (z*, tie_end, kept mass): token i is kept iff
z_i > z*, or z_i == z* and i <= tie_end. Items are the row's tokens (``LIST`` off: n_items = V,
ids 0..V-1) or the list's (ids ``Ids``, z ``Zs``, n_items listed, in ascending id order).
"""

from __future__ import annotations

import triton
import triton.language as tl

from .draft_sample import load_z


@triton.jit
def _to_key(z):
    # float32 -> int32 whose signed order is z's order (negative floats count down in bits).
    b = z.to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF)


@triton.jit
def _from_key(k):
    return tl.where(k >= 0, k, k ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


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
def above(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, t,
           STRICT: tl.constexpr, LIST: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """(#items with z > t (STRICT) or z >= t, their probability mass)."""
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
    return cnt, mass * inv_s


@triton.jit
def _value_cut(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, lim, p_lim,
               LIST: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """The least t with #{z > t} < lim and mass{z > t} < p_lim (the flashinfer rule: a token x is
    kept iff t holds at z_x, so the kept set is {z >= t}). Bisection on the key; hi always holds."""
    lo = _to_key(tl.full([], -float("inf"), tl.float32)).to(tl.int64) - 1
    hi = _to_key(m).to(tl.int64)  # nothing is above the max
    for _ in range(33):
        mid = lo + ((hi - lo) >> 1)
        cnt, mass = above(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, _from_key(mid.to(tl.int32)),
                           True, LIST, BLOCK_V)  # fmt: skip
        # Once hi - lo == 1, mid == lo (a NaN key below -inf): nothing moves.
        ok = (cnt < lim) & (mass < p_lim)
        open_ = hi - lo > 1
        hi = tl.where(ok & open_, mid, hi)
        lo = tl.where(ok | ~open_, lo, mid)
    return _from_key(hi.to(tl.int32))


@triton.jit
def _rank_cut(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, lim, p_lim,
              LIST: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """The z of the last kept rank, rank r kept iff r < lim and the mass ahead of it <= p_lim (the
    pytorch rule): the largest t whose tokens z >= t reach lim or carry more than p_lim."""
    lo = _to_key(tl.full([], -float("inf"), tl.float32)).to(tl.int64)  # z >= -inf: always true
    hi = _to_key(m).to(tl.int64) + 1  # nothing is above the max: always false
    for _ in range(32):
        mid = lo + ((hi - lo) >> 1)
        cnt, mass = above(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, _from_key(mid.to(tl.int32)),
                           False, LIST, BLOCK_V)  # fmt: skip
        ok = (cnt >= lim) | (mass > p_lim)
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return _from_key(lo.to(tl.int32))


@triton.jit
def _rank_ties(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, z_star, lim, p_lim,
               LIST: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """(tie_end, kept mass) of the rank prefix ending at value z*: ranks G .. G+E-1 hold z* (lower
    ids first); tie j is kept iff G + j < lim and the mass ahead of it, M_gt + j * p(z*), <= p_lim."""
    n_gt, mass_gt = above(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, z_star, True, LIST, BLOCK_V)
    n_ge, mass_ge = above(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, z_star, False, LIST, BLOCK_V)
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
def wide_cut(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, k_eff, p_lim, floor,
             RANK: tl.constexpr, MIN_P: tl.constexpr, LIST: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    """(z*, tie_end, kept mass) of a row under its backend's rule (see target_filter). Over a list,
    exact when the kept set provably lies within it (the caller checks)."""
    if RANK:
        lim = k_eff
        if MIN_P:
            n_min, mass_min = above(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, floor, False, LIST, BLOCK_V)
            lim = tl.minimum(lim, tl.maximum(n_min, 1))
        z_star = _rank_cut(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, lim, p_lim, LIST, BLOCK_V)
        tie_end, mass = _rank_ties(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, z_star, lim, p_lim, LIST, BLOCK_V)
    else:
        lim_p = p_lim
        if MIN_P:
            # top-p is judged on the top-k renormalised row: mass ahead < top_p x (top-k mass).
            if (p_lim < float("inf")) & (k_eff < vocab):
                z_k = _value_cut(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, k_eff, float("inf"), LIST, BLOCK_V)
                n_k, mass_k = above(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, z_k, False, LIST, BLOCK_V)
                lim_p = p_lim * mass_k
        z_star = _value_cut(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, k_eff, lim_p, LIST, BLOCK_V)
        if MIN_P:
            z_star = tl.maximum(z_star, floor)
        # Kept: z >= z*, every tie; z > z* or (z == z* and any id) says the same.
        tie_end = vocab
        n_kept, mass = above(base_l, Ids, Zs, n_items, vocab, inv_t, m, inv_s, z_star, False, LIST, BLOCK_V)
    return z_star, tie_end, mass
