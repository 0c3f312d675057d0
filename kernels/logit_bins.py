"""Vocabulary-parallel passes over rows of logits, shared by the verify's target filter and the draft sampler.

A row of V logits is cut into chunks of CHUNK tokens and every (row, chunk) is one program, so a batch
of n rows runs n x V / CHUNK programs and reads the logits at full bandwidth (one program per row
cannot: 64 rows fill half of an H200's 132 multiprocessors and wait on their own loads).

Log-mass bins. With m the row max of z = logit / T, token i lies d_i = m - z_i below the max (its
probability is exp(-d_i) / S, S the softmax normaliser) and falls in bin floor(d_i * R) for a
power-of-two resolution R. Bins are uniform in log-probability, so a bin's token count bounds its
mass within a factor exp(1 / R): counts alone (``tl.histogram``, a few instructions a token) say
which bins the cut of a filter can lie in. The first level picks R per row from the row's finite
depth (m - min z, at most DEPTH nats): bins 0 .. NB - 3 are uniform, NB - 2 holds everything deeper,
NB - 1 the -inf tokens and the padding past V. A later level splits a bracket of W bins of the level
before into W x S bins (S a power of two, W x S <= NB - 1) at resolution R x S: d x R is exact for a
power-of-two R, so floor(d R S) // S == floor(d R) and a token's bin at every level agrees with its
bin at the levels before. Every pass computes d and its bin with the same instructions, so all passes
agree bit for bit on which tokens a bin holds.

Passes (``stats``, ``histogram``, ``gather``); the per-row planning between them is ``cut_plan``, their
launches ``vocab_passes``:
    stats: per chunk the max, sum of exp(z - max), finite count, finite min and first argmax of z;
    histogram: per chunk the counts of one level's bins, and (past level 1) the exact count and
        mass of the row's tokens above that level's bins;
    gather: per chunk the ids and z of the tokens in a row's final bin range, written in id order
        at the chunk's offset, with the exact mass above the range and the range's min and max z.
Shape-static and sync-free (CUDA-graph safe).
"""

from __future__ import annotations

from enum import IntEnum

import triton
import triton.language as tl

# SGLang's cut-off below which a temperature means greedy (sampling_params._SAMPLING_EPS).
GREEDY_EPS = 1e-6
NB = 256  # bins per histogram level
CHUNK = 8192  # tokens per program
# Vocabulary tile of the target filter and the draft sampler. H200 sweeps at 151,936 tokens
# (benchmarks/results/kernels): 2048 against 1024 runs the accept phase at 64 x 9 rows in 1.00 against
# 1.12 ms and a draft step's sampling in 0.106 against 0.116 ms (kernels_accept_tune_h200_efb9674.json);
# the level-1 histogram pass alone at 576 rows in 303 against 386 us (vocab_passes_h200_2021a7f.json).
BLOCK_V = 2048
DEPTH = 32.0  # nats below the max resolved at level 1: exp(-32) of the max adds nothing to an fp32 sum
STATS = tl.constexpr(5)  # per (row, chunk): max, sum exp(z - max), finite count, finite min, first argmax
# Per-row plan state (``cut_plan``), int32 slots: 0 next level's first bin, 1 its bin count (0: no
# level to run), 2 the bracket stage's first level-1 bin, 3..6 the list's range (level base, lo, hi,
# level-1 flag), 7 tokens above the list, 8 tokens above the bracket stage's first bin; float32
# slots: 0 next level's resolution, 1 the list's level resolution, 2 mass above the bracket stage.
PLAN_I = tl.constexpr(9)
PLAN_F = tl.constexpr(3)


class RowPath(IntEnum):
    """How a target row's kept set was found (``TargetRows.path``)."""

    PENDING = -1  # below the top list: the bracket stage decides it
    FULL = 0  # every kept token is in the row's list
    WINDOW = 1  # the list is a window of bins, with the exact count and mass above it
    BIG = 2  # a bracket too large to list: resolved by the select as TIE or VOCAB
    NOFILTER = 3  # no top-k, top-p or min-p: the softmax itself
    TIE = 4  # the bracket's tokens all hold one value
    VOCAB = 5  # an exact pass over the whole row (the rare fallback)


# The kernels' copies (Triton reads module globals only as constexpr).
PENDING, FULL, WINDOW, BIG = (
    tl.constexpr(int(p)) for p in (RowPath.PENDING, RowPath.FULL, RowPath.WINDOW, RowPath.BIG)
)
NOFILTER, TIE, VOCAB = (tl.constexpr(int(p)) for p in (RowPath.NOFILTER, RowPath.TIE, RowPath.VOCAB))


@triton.jit
def load_z(base_l, idx, vocab, inv_t):
    # One multiply, rounded once: every pass sees bit-identical z, so z == z* is exact across passes.
    return tl.load(base_l + idx, mask=idx < vocab, other=-float("inf")).to(tl.float32) * inv_t


@triton.jit
def inv_temperature(Temperature, req, GREEDY_EPS_C: tl.constexpr):
    temp = tl.load(Temperature + req).to(tl.float32)
    return 1.0 / tl.where(temp < GREEDY_EPS_C, 1.0, temp)


@triton.jit
def row_params(Temperature, Top_k, Top_p, Min_p, req, vocab, GREEDY_EPS_C: tl.constexpr, MIN_P: tl.constexpr):
    """(inv_t, k_eff, p_lim, min_p) of a request: greedy by temperature is top_k 1 at T 1; top_k <= 0 or
    >= V is off (k_eff V); top_p >= 1 is off (p_lim inf); min_p 0 without MIN_P."""
    temp = tl.load(Temperature + req).to(tl.float32)
    top_k = tl.load(Top_k + req).to(tl.int32)
    top_p = tl.load(Top_p + req).to(tl.float32)
    greedy = temp < GREEDY_EPS_C
    inv_t = 1.0 / tl.where(greedy, 1.0, temp)
    k_eff = tl.where(greedy, 1, tl.where((top_k <= 0) | (top_k >= vocab), vocab, top_k))
    p_lim = tl.where(top_p >= 1.0, float("inf"), top_p)
    min_p = tl.full([], 0.0, tl.float32)
    if MIN_P:
        min_p = tl.load(Min_p + req).to(tl.float32)
    return inv_t, k_eff, p_lim, min_p


@triton.jit
def unfiltered(k_eff, p_lim, min_p, vocab):
    """Whether a request's row has no filter (no top-k, top-p or min-p; ``row_params``' values): nothing to cut."""
    return (k_eff >= vocab) & (p_lim == float("inf")) & (min_p <= 0.0)


@triton.jit
def floor_depth(min_p):
    """The min-p floor as a depth below the row max: a token of d = m - z > -ln(min_p) lies under it (inf: none)."""
    return tl.where(min_p > 0.0, -tl.log(tl.maximum(min_p, 1e-30)), float("inf"))


@triton.jit
def row_stats(Stats, row, n_chunks, NCH: tl.constexpr):
    """(m, 1 / S, finite count, finite min, argmax) of a row from its chunks' statistics (argmax: the
    lowest id holding the max)."""
    chs = tl.arange(0, NCH)
    ok = chs < n_chunks
    st = Stats + (row * n_chunks + chs) * STATS
    m_c = tl.load(st, mask=ok, other=-3.0e38)
    m = tl.max(m_c, axis=0)
    s = tl.sum(tl.load(st + 1, mask=ok, other=0.0) * tl.exp(m_c - m), axis=0)
    fin = tl.sum(tl.load(st + 2, mask=ok, other=0.0), axis=0).to(tl.int32)
    zmin = tl.min(tl.load(st + 3, mask=ok, other=3.0e38), axis=0)
    arg_c = tl.load(st + 4, mask=ok, other=0.0).to(tl.int32)
    arg = tl.min(tl.where(ok & (m_c == m), arg_c, 2147483647), axis=0)
    return m, 1.0 / s, fin, zmin, arg


@triton.jit
def chunk_max(Stats, row, n_chunks, ch):
    """The max of z over one chunk of a row (-3e38 for a chunk of -inf logits), from the statistics."""
    return tl.load(Stats + (row * n_chunks + ch) * STATS)


@triton.jit
def pow2_exponent(x):
    """floor(log2(x)) of a positive normal float, read from its exponent bits (exact)."""
    return ((x.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127


@triton.jit
def first_resolution(m, zmin, NB_C: tl.constexpr, DEPTH_C: tl.constexpr):
    """Level 1's resolution: the largest power of two R with depth x R <= NB - 2, depth = min(m - zmin,
    DEPTH) (R = 1 for a row of one finite value). Only exact operations (exponent bits, products by powers
    of two, comparisons), so ``first_resolution_ref`` computes the same R bit for bit."""
    depth = tl.minimum(tl.maximum(m - zmin, 0.0), DEPTH_C)
    # depth x 2^e lies in [2^top, 2^(top+1)), top = floor(log2(NB - 2)): right, or one too high.
    e = pow2_exponent(tl.full([], NB_C - 2, tl.float32)) - pow2_exponent(tl.maximum(depth, 1e-30))
    r = ((e + 127) << 23).to(tl.float32, bitcast=True)
    r = tl.where(depth * r > NB_C - 2, r * 0.5, r)
    return tl.where(depth > 0.0, r, 1.0)


@triton.jit
def level_bin(z, m, r, base, w, FIRST: tl.constexpr):
    """A token's bin index relative to a level's first bin (base): floor((m - z) * r) - base; at level 1
    (base 0) everything past the last real bin w - 1 lands in it. -inf goes far past every bin."""
    x = tl.minimum((m - z) * r, 1.0e9)  # exact for a power-of-two r; the cap keeps -inf's bin defined
    j = x.to(tl.int32) - base  # x >= 0: truncation is floor
    if FIRST:
        j = tl.minimum(j, w - 1)
    return j


@triton.jit
def _stats_kernel(
    Logits,
    Temperature,
    Stats,
    vocab,
    stride_l,
    repeats,
    n_chunks,
    GREEDY_EPS_C: tl.constexpr,
    CHUNK_C: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row, ch = tl.program_id(0).to(tl.int64), tl.program_id(1)
    inv_t = inv_temperature(Temperature, row // repeats, GREEDY_EPS_C)
    base_l = Logits + row * stride_l
    offs = tl.arange(0, BLOCK_V)
    m = -3.0e38  # finite: a chunk of -inf logits (a grammar mask) must not compute exp(-inf - -inf)
    s = 0.0
    fin = 0
    zmin = 3.0e38
    arg = 0
    for sub in range(0, CHUNK_C, BLOCK_V):
        idx = ch * CHUNK_C + sub + offs
        z = load_z(base_l, idx, vocab, inv_t)
        bm = tl.max(z, axis=0)
        arg = tl.where(bm > m, tl.min(tl.where(z == bm, idx, 2147483647), axis=0), arg)
        new_m = tl.maximum(m, bm)
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(z - new_m), axis=0)
        m = new_m
        finite = z > -float("inf")
        fin += tl.sum(finite.to(tl.int32), axis=0)
        zmin = tl.minimum(zmin, tl.min(tl.where(finite, z, 3.0e38), axis=0))
    out = Stats + (row * n_chunks + ch) * STATS
    tl.store(out, m)
    tl.store(out + 1, s)
    tl.store(out + 2, fin.to(tl.float32))
    tl.store(out + 3, zmin)
    tl.store(out + 4, arg.to(tl.float32))  # ids < 2^24 are exact in fp32


@triton.jit
def _hist_kernel(
    Logits,
    Temperature,
    Top_k,
    Top_p,
    Min_p,
    Stats,
    PlanI,
    PlanF,
    Hist,
    AboveCnt,
    AboveMass,
    Path,
    vocab,
    stride_l,
    repeats,
    n_chunks,
    GREEDY_EPS_C: tl.constexpr,
    NB_C: tl.constexpr,
    DEPTH_C: tl.constexpr,
    NCH: tl.constexpr,
    CHUNK_C: tl.constexpr,
    BLOCK_V: tl.constexpr,
    FIRST: tl.constexpr,
    MIN_P: tl.constexpr,
    SKIP_UNFILTERED: tl.constexpr,
    PENDING_ONLY: tl.constexpr,
):
    """One level's bin counts of a chunk (tokens outside the level: not counted) and, past level 1,
    the chunk's exact count and mass exp(z - m) of the tokens above the level's first bin. Level 1 skips
    rows with no filter when SKIP_UNFILTERED (the target filter: nothing to cut), and every row its
    candidate list decided when PENDING_ONLY."""
    row, ch = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if FIRST:
        w = tl.full([], NB_C - 1, tl.int32)
        if SKIP_UNFILTERED:
            inv_t, k_eff, p_lim, min_p = row_params(
                Temperature, Top_k, Top_p, Min_p, row // repeats, vocab, GREEDY_EPS_C, MIN_P
            )
            w = tl.where(unfiltered(k_eff, p_lim, min_p, vocab), 0, w)
        if PENDING_ONLY:
            w = tl.where(tl.load(Path + row) == PENDING, w, 0)
    else:
        w = tl.load(PlanI + row * PLAN_I + 1)
    if w > 0:
        inv_t = inv_temperature(Temperature, row // repeats, GREEDY_EPS_C)
        m, inv_s, fin, zmin, arg = row_stats(Stats, row, n_chunks, NCH)
        if FIRST:
            r = first_resolution(m, zmin, NB_C, DEPTH_C)
            base = 0
        else:
            r = tl.load(PlanF + row * PLAN_F)
            base = tl.load(PlanI + row * PLAN_I)
        base_l = Logits + row * stride_l
        offs = tl.arange(0, BLOCK_V)
        hist = tl.zeros([NB_C], dtype=tl.int32)
        n_above = 0
        mass_above = 0.0
        for sub in range(0, CHUNK_C, BLOCK_V):
            z = load_z(base_l, ch * CHUNK_C + sub + offs, vocab, inv_t)
            finite = z > -float("inf")
            j = level_bin(z, m, r, base, w, FIRST)
            inside = finite & (j >= 0) & (j < w)
            # Masked: the tokens outside the level (most of them, past level 1) add no atomics to one bin.
            hist += tl.histogram(tl.where(inside, j, 0), NB_C, mask=inside)
            if not FIRST:
                above = finite & (j < 0)
                n_above += tl.sum(above.to(tl.int32), axis=0)
                mass_above += tl.sum(tl.where(above, tl.exp(z - m), 0.0), axis=0)
        tl.store(Hist + (row * n_chunks + ch) * NB_C + tl.arange(0, NB_C), hist)
        if not FIRST:
            tl.store(AboveCnt + row * NCH + ch, n_above)
            tl.store(AboveMass + row * NCH + ch, mass_above)


@triton.jit
def _gather_kernel(
    Logits,
    Temperature,
    Stats,
    PlanI,
    PlanF,
    Path,
    Offsets,
    ListIds,
    ListZ,
    AboveMass,
    RangeZ,
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
    STAGE: tl.constexpr,
):
    """A chunk's tokens in its row's range [lo, hi] (level bins; lo very negative: everything above too),
    written in id order from the chunk's offset (BIG rows, too many to list, write none); the exact mass
    exp(z - m) above the range and the range's min and max z. Stage 1 gathers the top lists (FULL rows),
    stage 2 the brackets (WINDOW and BIG rows)."""
    row, ch = tl.program_id(0).to(tl.int64), tl.program_id(1)
    path = tl.load(Path + row)
    if STAGE == 1:
        mine = path == FULL
    else:
        mine = (path == WINDOW) | (path == BIG)
    if mine:
        inv_t = inv_temperature(Temperature, row // repeats, GREEDY_EPS_C)
        m, inv_s, fin, zmin, arg = row_stats(Stats, row, n_chunks, NCH)
        r = tl.load(PlanF + row * PLAN_F + 1)
        plan = PlanI + row * PLAN_I
        base, lo, hi, first = tl.load(plan + 3), tl.load(plan + 4), tl.load(plan + 5), tl.load(plan + 6)
        filled = tl.load(Offsets + row * NCH + ch)
        base_l = Logits + row * stride_l
        offs = tl.arange(0, BLOCK_V)
        mass_above = 0.0
        z_lo = float("inf")
        z_hi = -float("inf")
        for sub in range(0, CHUNK_C, BLOCK_V):
            idx = ch * CHUNK_C + sub + offs
            z = load_z(base_l, idx, vocab, inv_t)
            finite = z > -float("inf")
            x = tl.minimum((m - z) * r, 1.0e9)  # level_bin's instructions, the level chosen per row
            j = x.to(tl.int32) - base
            j = tl.where(first != 0, tl.minimum(j, NB_C - 2), j)
            take = finite & (j >= lo) & (j <= hi)
            if STAGE == 2:  # a bracket's list: the exact mass above it, and its values' range (one tie?)
                mass_above += tl.sum(tl.where(finite & (j < lo), tl.exp(z - m), 0.0), axis=0)
                z_lo = tl.minimum(z_lo, tl.min(tl.where(take, z, float("inf")), axis=0))
                z_hi = tl.maximum(z_hi, tl.max(tl.where(take, z, -float("inf")), axis=0))
            n_take = tl.sum(take.to(tl.int32), axis=0)
            if (path != BIG) & (n_take > 0):  # most tiles of a short list take nothing: no scan for them
                slot = filled + tl.cumsum(take.to(tl.int32), axis=0) - 1
                take = take & (slot < list_cap)
                tl.store(ListIds + row * list_cap + slot, idx, mask=take)
                tl.store(ListZ + row * list_cap + slot, z, mask=take)
            filled += n_take
        if STAGE == 2:
            tl.store(AboveMass + row * NCH + ch, mass_above)
            tl.store(RangeZ + (row * NCH + ch) * 2, z_lo)
            tl.store(RangeZ + (row * NCH + ch) * 2 + 1, z_hi)
