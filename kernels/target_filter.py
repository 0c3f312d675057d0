"""Stock SGLang's sampling distribution of every verify row, filtered and renormalised in one kernel.

The sampled verify needs, for every row of its [bs * (k + 1), V] logits, the distribution stock
decoding samples from (``spec/sampling.target_probs`` is the reference): temperature, then top-k /
top-p judged jointly on the softmax, or with min-p: top-k renorm -> top-p renorm -> min-p floor.
Before this kernel that was ``softmax_t_fwd`` (two reads + one write of each fp32 row) followed by
SGLang's ``top_k_renorm_prob`` / ``top_p_renorm_prob`` (multi-pass pivot searches): about ten
passes over each row, ~1.9 ms of accept phase per round at batch 256 x 9 rows x 49,152 tokens on
an H100 (measured). Here one program per row reads the logits once from HBM and writes the final
row once; the passes in between re-read the row, which stays in L2. Expected before measuring:
the accept phase 1.9 -> ~0.6 ms at batch 256 x 9 x 49,152 on an H100. Measured (H100, cb3888a,
``benchmarks.sampling_bench``): 1.78 ms with top-p 0.95 alone vs 1.85 ms for the old path, 1.60
vs 4.02 ms with top-k 50 + top-p, 8.78 ms when every row's nucleus exceeds C (the fallback). Each
program walks its 48 tiles serially about five times, so it is latency-bound, not at the one-read
ideal (~0.3 ms). ``patches/verify_sample`` therefore uses it only when every request's top_k <= C.

Every filter keeps a prefix of the row's tokens ordered by z = logit / T descending, ties by lower
id (the reference's stable sort), so the kernel finds that prefix's last value z* and how many of
the tokens equal to z* it keeps (n_tie, the lowest ids), then writes p_i / kept_mass there, 0
elsewhere. Passes, per row:
    1. the max m of z and the softmax normaliser S (online; a finite start so -inf logits of a
       grammar mask never compute exp(-inf - -inf));
    2. counts within the ladder m - DELTA_j of ``draft_sample`` and the finite tokens;
    3. the tokens of the widest rung holding at most C of them (the exact top-n, n <= C), gathered
       in id order into a scratch row, then ranked in registers: the kept prefix is read off the
       candidates when it provably ends inside them (the next token is cut by top-k, top-p or
       min-p, or only -inf tokens remain, and with min-p and top-p the top-k mass is known);
       otherwise (a flat row whose nucleus exceeds C, top_k > C with min-p) an exact
       vocabulary-wide bisection on z's bit pattern finds z* (32 passes; the rare path);
    4. the write.
Rows needing no filter (top_k off, top_p >= 1, min-p 0 or off) run passes 1 and 4; greedy rows
(T < GREEDY_EPS or top_k == 1) are one-hot at the first argmax. Shape-static and sync-free.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .draft_sample import DELTA_BASE, GREEDY_EPS, LADDER, candidate_ranks, load_z


@triton.jit
def _to_key(z):
    # float32 -> int32 whose signed order is z's order (negative floats count down in bits).
    b = z.to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF)


@triton.jit
def _from_key(k):
    return tl.where(k >= 0, k, k ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _min_p_floor(m, min_p):
    # p >= min_p x p_max  <=>  z >= m + log(min_p): judged on z, so it cuts the rank order exactly
    # (min_p = 0: no cut).
    return tl.where(min_p > 0.0, m + tl.log(tl.maximum(min_p, 1e-30)), -float("inf"))


@triton.jit
def _above(base_l, vocab, inv_t, m, inv_s, t, BLOCK_V: tl.constexpr):
    """(#tokens with z >= t, their probability mass)."""
    offs = tl.arange(0, BLOCK_V)
    cnt = 0
    mass = 0.0
    for start in range(0, vocab, BLOCK_V):
        z = load_z(base_l, start + offs, vocab, inv_t)
        ge = z >= t
        cnt += tl.sum(ge.to(tl.int32), axis=0)
        mass += tl.sum(tl.where(ge, tl.exp(z - m), 0.0), axis=0)
    return cnt, mass * inv_s


@triton.jit
def _prefix_end(base_l, vocab, inv_t, m, inv_s, lim, p_lim, BLOCK_V: tl.constexpr):
    """z* = the z of the last kept rank, where rank r is kept iff r < lim and the mass ahead of it
    <= p_lim. z >= t holds for z* iff the tokens with z >= t (ranks 0 .. cnt-1) reach lim or carry
    more than p_lim (rank cnt is then cut): bisection on z's int32 key for the largest such t."""
    lo = _to_key(tl.full([], -float("inf"), tl.float32)).to(tl.int64)  # z >= -inf: always true
    hi = _to_key(m).to(tl.int64) + 1  # nothing is above the max: always false
    for _ in range(32):
        mid = lo + ((hi - lo) >> 1)
        cnt, mass = _above(base_l, vocab, inv_t, m, inv_s, _from_key(mid.to(tl.int32)), BLOCK_V)
        ok = (cnt >= lim) | (mass > p_lim)
        lo = tl.where(ok, mid, lo)
        hi = tl.where(ok, hi, mid)
    return _from_key(lo.to(tl.int32))


@triton.jit
def _ties(base_l, vocab, inv_t, m, inv_s, z_star, lim, p_lim, BLOCK_V: tl.constexpr):
    """(n_tie, kept mass) of the prefix ending at value z*: ranks G .. G+E-1 hold z*; tie j is kept
    iff G + j < lim and the mass ahead of it, M_gt + j * p(z*), <= p_lim."""
    offs = tl.arange(0, BLOCK_V)
    n_gt = 0
    n_eq = 0
    mass_gt = 0.0
    for start in range(0, vocab, BLOCK_V):
        z = load_z(base_l, start + offs, vocab, inv_t)
        n_gt += tl.sum((z > z_star).to(tl.int32), axis=0)
        n_eq += tl.sum((z == z_star).to(tl.int32), axis=0)
        mass_gt += tl.sum(tl.where(z > z_star, tl.exp(z - m), 0.0), axis=0)
    mass_gt = mass_gt * inv_s
    v = tl.exp(z_star - m) * inv_s
    by_p = tl.where(v > 0.0, tl.floor((p_lim - mass_gt) / v) + 1.0, n_eq.to(tl.float32))
    n_tie = tl.minimum(lim - n_gt, tl.minimum(by_p, n_eq.to(tl.float32)).to(tl.int32))
    # z* is kept by construction, so at least one tie is, whatever the rounding of M_gt.
    n_tie = tl.maximum(n_tie, 1)
    return n_tie, mass_gt + n_tie.to(tl.float32) * v


@triton.jit
def _vocab_wide(base_l, vocab, inv_t, m, inv_s, k_eff, top_p, min_p, MIN_P: tl.constexpr, BLOCK_V: tl.constexpr):
    """(z*, n_tie, kept mass) over the whole row: the exact, slow path."""
    p_lim = tl.where(top_p >= 1.0, float("inf"), top_p)
    lim = k_eff
    if MIN_P:
        # top-p is judged on the top-k renormalised row: mass ahead <= top_p x (top-k mass).
        if (top_p < 1.0) & (k_eff < vocab):
            z_k = _prefix_end(base_l, vocab, inv_t, m, inv_s, k_eff, float("inf"), BLOCK_V)
            _, mass_k = _ties(base_l, vocab, inv_t, m, inv_s, z_k, k_eff, float("inf"), BLOCK_V)
            p_lim = top_p * mass_k
        # min-p: a prefix of n_min tokens.
        n_min, _ = _above(base_l, vocab, inv_t, m, inv_s, _min_p_floor(m, min_p), BLOCK_V)
        lim = tl.minimum(lim, tl.maximum(n_min, 1))
    z_star = _prefix_end(base_l, vocab, inv_t, m, inv_s, lim, p_lim, BLOCK_V)
    n_tie, mass = _ties(base_l, vocab, inv_t, m, inv_s, z_star, lim, p_lim, BLOCK_V)
    return z_star, n_tie, mass


@triton.jit
def _candidates(
    base_l, cand, vocab, inv_t, m, inv_s, k_eff, top_p, min_p,
    DELTA_BASE_C: tl.constexpr, LADDER_C: tl.constexpr, MIN_P: tl.constexpr,
    C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """(exact, z*, n_tie, kept mass) from the row's top-n tokens (n <= C); exact is False when
    the kept prefix may extend past them (the caller then takes the vocabulary-wide path)."""
    offs_v = tl.arange(0, BLOCK_V)
    offs_c = tl.arange(0, BLOCK_C)
    rungs = tl.arange(0, LADDER_C)
    cut = m - DELTA_BASE_C * tl.exp2(rungs.to(tl.float32) * 0.5)
    counts = tl.zeros([LADDER_C], dtype=tl.int32)
    n_finite = 0
    for start in range(0, vocab, BLOCK_V):
        z = load_z(base_l, start + offs_v, vocab, inv_t)
        counts += tl.sum((z[:, None] >= cut[None, :]).to(tl.int32), axis=0)
        n_finite += tl.sum((z > -float("inf")).to(tl.int32), axis=0)
    fits = tl.sum((counts <= C).to(tl.int32), axis=0)
    rung = tl.maximum(fits - 1, 0)
    thr = tl.max(tl.where(rungs == rung, cut, -float("inf")), axis=0)
    n = tl.minimum(tl.max(tl.where(rungs == rung, counts, 0), axis=0), C)

    # The first C ids with z >= thr (all of them when the rung fits), ascending.
    filled = 0
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs_v
        take = load_z(base_l, idx, vocab, inv_t) >= thr
        slot = filled + tl.cumsum(take.to(tl.int32), axis=0) - 1
        take = take & (slot < C)
        tl.store(cand + slot, idx, mask=take)
        filled += tl.sum(take.to(tl.int32), axis=0)
    tl.debug_barrier()
    valid = offs_c < n
    ids = tl.load(cand + offs_c, mask=valid, other=0)
    zc = tl.where(valid, load_z(base_l, ids, vocab, inv_t), -float("inf"))
    p = tl.where(valid, tl.exp(zc - m) * inv_s, 0.0)
    rank, mass_before = candidate_ranks(zc, p, valid, offs_c)
    cand_mass = tl.sum(p, axis=0)
    rest_is_masked = n >= n_finite  # every token outside has p = 0: kept or not, it writes 0
    p_lim = tl.where(top_p >= 1.0, float("inf"), top_p)
    keep = valid & (rank < k_eff)
    next_cut = (n >= k_eff) | rest_is_masked
    mass_known = True
    if MIN_P:
        # top-p on the top-k renormalised row; the top-k mass is known when top-k cuts inside the
        # candidates (or nothing is outside), and is 1 when top-k is off.
        mass_k = tl.where(k_eff >= vocab, 1.0, tl.sum(tl.where(keep, p, 0.0), axis=0))
        mass_known = (top_p >= 1.0) | (k_eff >= vocab) | next_cut
        p_lim = p_lim * mass_k
        floor_ok = zc >= _min_p_floor(m, min_p)
        keep = keep & floor_ok
        next_cut = next_cut | (tl.min(tl.where(valid, floor_ok, True).to(tl.int32), axis=0) == 0)
    keep = keep & (mass_before <= p_lim)
    next_cut = next_cut | (cand_mass > p_lim)
    # Keep exactly a rank prefix, even where rounding makes mass_before non-monotone.
    n_keep = tl.sum(keep.to(tl.int32), axis=0)
    keep = valid & (rank < n_keep)
    z_star = tl.min(tl.where(keep, zc, float("inf")), axis=0)
    n_tie = tl.sum((keep & (zc == z_star)).to(tl.int32), axis=0)
    mass = tl.sum(tl.where(keep, p, 0.0), axis=0)
    return (fits >= 1) & next_cut & mass_known, z_star, n_tie, mass


@triton.jit
def _target_filter_kernel(
    Logits, Temperature, Top_k, Top_p, Min_p, Cand, Probs,
    vocab, stride_l, stride_c, stride_p, repeats,
    GREEDY_EPS_C: tl.constexpr, DELTA_BASE_C: tl.constexpr, LADDER_C: tl.constexpr, MIN_P: tl.constexpr,
    C: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    req = row // repeats
    temp = tl.load(Temperature + req).to(tl.float32)
    top_k = tl.load(Top_k + req).to(tl.int32)
    top_p = tl.load(Top_p + req).to(tl.float32)
    min_p = 0.0
    if MIN_P:
        min_p = tl.load(Min_p + req).to(tl.float32)
    greedy = (temp < GREEDY_EPS_C) | (top_k == 1)
    inv_t = 1.0 / tl.where(greedy, 1.0, temp)
    k_eff = tl.where((top_k <= 0) | (top_k >= vocab), vocab, top_k)
    base_l = Logits + row * stride_l
    offs = tl.arange(0, BLOCK_V)

    m = -3.0e38
    s = 0.0
    for start in range(0, vocab, BLOCK_V):
        z = load_z(base_l, start + offs, vocab, inv_t)
        new_m = tl.maximum(m, tl.max(z, axis=0))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(z - new_m), axis=0)
        m = new_m
    inv_s = 1.0 / s

    # Defaults: keep everything (ties at -inf are masked tokens, written as 0 anyway).
    z_star = tl.full([], -float("inf"), tl.float32)
    n_tie = tl.full([], 0, tl.int32) + vocab
    scale = inv_s
    if greedy:
        # The first token at the max, written as exactly 1 (exp(m - m) = 1).
        z_star = m
        n_tie = tl.full([], 1, tl.int32)
        scale = tl.full([], 1.0, tl.float32)
    elif (k_eff < vocab) | (top_p < 1.0) | (min_p > 0.0):
        exact, z_star, n_tie, mass = _candidates(
            base_l, Cand + row * stride_c, vocab, inv_t, m, inv_s, k_eff, top_p, min_p,
            DELTA_BASE_C, LADDER_C, MIN_P, C, BLOCK_C, BLOCK_V,
        )  # fmt: skip
        if exact == 0:
            z_star, n_tie, mass = _vocab_wide(base_l, vocab, inv_t, m, inv_s, k_eff, top_p, min_p, MIN_P, BLOCK_V)
        scale = inv_s / mass

    seen = 0
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs
        z = load_z(base_l, idx, vocab, inv_t)
        eq = z == z_star
        keep = (z > z_star) | (eq & (seen + tl.cumsum(eq.to(tl.int32), axis=0) <= n_tie))
        tl.store(Probs + row * stride_p + idx, tl.where(keep, tl.exp(z - m) * scale, 0.0), mask=idx < vocab)
        seen += tl.sum(eq.to(tl.int32), axis=0)


def target_filter_fwd(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    repeats: int = 1,
    candidates: int = 64,
    block_v: int = 2048,
    num_warps: int = 4,
) -> torch.Tensor:
    """``target_probs`` on the GPU: [n, V] float32 rows, row i under request i // repeats.

    logits [n, V] (any float dtype, last dim contiguous); temperature, top_p [n / repeats] float;
    top_k [n / repeats] int (1: greedy; <= 0 or >= V: off); min_p [n / repeats] float, or None for
    a batch without min-p (top-k and top-p then judged jointly). ``candidates`` (C) sizes the fast
    path's register sort; ``block_v`` (the vocabulary tile) and ``num_warps`` are launch parameters
    only (``benchmarks.sampling_bench --tune`` times them; 2048 x 4 was the fastest at batch 32 and 256 x
    49,152 and 256 x 151,936 on the H100, ``kernels_tune_h100_0c83c86_*.json``). Shape-static, no host sync.
    """
    n, vocab = logits.shape
    bs = n // repeats if repeats >= 1 else -1
    params = [temperature, top_k, top_p] + ([] if min_p is None else [min_p])
    if repeats < 1 or n % repeats or any(t.shape != (bs,) for t in params) or logits.stride(-1) != 1:
        raise ValueError(f"logits [n, V] with contiguous rows and parameters [n / repeats], got {tuple(logits.shape)}, "
                         f"{[tuple(t.shape) for t in params]}, repeats {repeats}")  # fmt: skip
    if top_k.is_floating_point():
        raise ValueError(f"top_k must be an integer tensor, got {top_k.dtype}")
    probs = torch.empty((n, vocab), dtype=torch.float32, device=logits.device)
    cand = torch.empty((n, candidates), dtype=torch.int32, device=logits.device)
    if n:
        _target_filter_kernel[(n,)](
            logits, temperature, top_k, top_p, top_p if min_p is None else min_p, cand, probs,
            vocab, logits.stride(0), cand.stride(0), probs.stride(0), repeats,
            GREEDY_EPS_C=GREEDY_EPS, DELTA_BASE_C=DELTA_BASE, LADDER_C=LADDER, MIN_P=min_p is not None,
            C=candidates, BLOCK_C=triton.next_power_of_2(candidates), BLOCK_V=block_v, num_warps=num_warps,
        )  # fmt: skip
    return probs
