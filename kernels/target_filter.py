"""Stock SGLang's sampling distribution of every verify row, vocabulary-parallel, as thresholds on the logits.

The sampled verify needs, for every row of its [n = bs * (k + 1), V] logits, the distribution stock
decoding samples from (``sampling/target.target_probs`` is the reference, for either sampling backend).
Rejection sampling then reads p at the drafts and draws once per request from a residual, so a row
is returned as its kept set's threshold (``TargetRows``: token i is kept iff z_i > z*, or z_i == z* and
i <= tie_end; p_i = exp(z_i - m) x scale) plus, where every kept token fits, their list.

Launches (grid rows x vocabulary chunks unless said; ``logit_bins`` and ``cut_plan`` hold them):
    1. statistics per chunk (max, sum-exp, finite count and min), a histogram of log-mass bins, the
       plan of each row's top list (the top bins holding at most ``list_cap`` tokens) and its gather;
    2. select (one program per row): a row whose cut provably lies inside its top list (exact sums:
       the list holds top_k tokens or top_p of the mass, or the next token is under the min-p floor)
       gets its exact threshold over the list (``target_wide``): the peaked rows;
    3. the other rows' bracket stage: per level (``levels``, default 3) a plan of the bracket of bins
       that can hold the cut (bin counts bound its mass; the top list's mass is exact), split into
       the next level's finer bins while it holds more than ``list_cap`` tokens; then its gather;
    4. select: the exact threshold over the bracket's list, with the exact count and mass above it;
       a bracket too large to list is one tied value (decided from its count) or, rarely, the row.
Each pass reads the logits once at full bandwidth: peaked rows take three reads, near-uniform rows
(a nucleus of most of the vocabulary) four or five, in the same launches. Expected at 64 x 9 x
151,936 fp32 logits (350 MB) on an H200 (~4 TB/s): ~90 us a read, ~0.35 ms for peaked rows and
~0.55 ms for near-uniform ones with the small launches.

Rules (``RANK`` selects the pytorch backend's): flashinfer keeps x iff #{z > z_x} < top_k and the
mass of {z > z_x} < top_p (with min-p: top-p judged on the top-k renormalised row, then p >=
min_p x p_max), every tie at the cut; pytorch keeps rank r (ties by lower id) iff r < top_k, the
mass before it <= top_p and p >= min_p x p_max. Greedy by temperature (T < GREEDY_EPS) is top_k 1.
Shape-static and sync-free (CUDA-graph safe).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .cut_plan import PassRows, VocabPasses
from .logit_bins import (
    BIG,
    CHUNK,
    FULL,
    GREEDY_EPS,
    NB,
    NOFILTER,
    PENDING,
    PLAN_F,
    PLAN_I,
    TIE,
    VOCAB,
    WINDOW,
    inv_temperature,
    load_z,
    row_params,
    row_stats,
)
from .target_wide import above, next_up, tie_cut, wide_cut

LIST_CAP = 2048
LEVELS = 3
_SLACK_SELECT = tl.constexpr(1e-4)  # the min-p floor's bin test, as the plan's
_ALL_ABOVE_SELECT = tl.constexpr(-1073741824)  # a list range that holds every token above it


@dataclass
class TargetRows:
    """The target distribution of n rows over V tokens, row i under request i // repeats.

    logits [n, V]: the filter's input, read again for p (z_i = logit_i x inv_t, inv_t = 1 / the request's
    temperature, 1 when greedy; ``temperature`` [n / repeats]);
    desc [n, 4] float32 (m, z*, scale, tie_end): token i is kept iff z_i > z* or (z_i == z* and
    i <= tie_end), its p = exp(z_i - m) x scale, else 0;
    list_ids [n, L] int32, list_n [n] int32: where path is FULL, every kept token is among the row's
    first list_n ids (ascending);
    path [n] int32: how the row was decided (``logit_bins``: FULL, WINDOW, NOFILTER, TIE, VOCAB).
    """

    logits: torch.Tensor
    temperature: torch.Tensor
    repeats: int
    desc: torch.Tensor
    list_ids: torch.Tensor
    list_n: torch.Tensor
    path: torch.Tensor

    def dense(self) -> torch.Tensor:
        """[n, V] float32 rows, computed on the device with the kernels' own z (bit for bit)."""
        n, vocab = self.logits.shape
        out = torch.empty((n, vocab), dtype=torch.float32, device=self.logits.device)
        if n:
            block = 1024
            _dense_kernel[(n, triton.cdiv(vocab, block))](
                self.logits, self.temperature, self.desc, out, vocab, self.logits.stride(0), self.repeats,
                GREEDY_EPS_C=GREEDY_EPS, BLOCK_V=block,
            )  # fmt: skip
        return out


@triton.jit
def kept_p(z, idx, m, z_star, scale, tie_end):
    """p of tokens (z, id) under a row's descriptor (0 where cut)."""
    keep = (z > z_star) | ((z == z_star) & (idx <= tie_end))
    return tl.where(keep, tl.exp(z - m) * scale, 0.0)


@triton.jit
def load_desc(Desc, row):
    d = Desc + row * 4
    return tl.load(d), tl.load(d + 1), tl.load(d + 2), tl.load(d + 3).to(tl.int32)


@triton.jit
def _dense_kernel(Logits, Temperature, Desc, Out, vocab, stride_l, repeats,
                  GREEDY_EPS_C: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    row, blk = tl.program_id(0).to(tl.int64), tl.program_id(1)
    inv_t = inv_temperature(Temperature, row // repeats, GREEDY_EPS_C)
    m, z_star, scale, tie_end = load_desc(Desc, row)
    idx = blk * BLOCK_V + tl.arange(0, BLOCK_V)
    z = load_z(Logits + row * stride_l, idx, vocab, inv_t)
    tl.store(Out + row * vocab + idx, kept_p(z, idx, m, z_star, scale, tie_end), mask=idx < vocab)


@triton.jit
def _nth_in_range(base_l, Offsets, row, nth, n_chunks, m, r, base, lo, hi, first, vocab, inv_t,
                  NB_C: tl.constexpr, NCH: tl.constexpr, CHUNK_C: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
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
def _select_top_kernel(Logits, Temperature, Top_k, Top_p, Min_p, Stats, PlanI, PlanF, Path, ListN, ListIds, ListZ,
                       Desc, vocab, stride_l, repeats, n_chunks, list_cap, GREEDY_EPS_C: tl.constexpr,
                       NCH: tl.constexpr, BLOCK_V: tl.constexpr, RANK: tl.constexpr, MIN_P: tl.constexpr):  # fmt: skip
    """The rows with a complete top list: the exact threshold when the cut provably lies inside it, else the
    row becomes PENDING with the list's exact count and mass as the bracket stage's start. NOFILTER rows
    get the softmax itself."""
    row = tl.program_id(0).to(tl.int64)
    path = tl.load(Path + row)
    m, inv_s, fin, zmin, arg = row_stats(Stats, row, n_chunks, NCH)
    if path == NOFILTER:
        _store_desc(Desc, row, m, -float("inf"), inv_s, vocab)
    if path == FULL:
        inv_t, k_eff, p_lim, min_p = row_params(Temperature, Top_k, Top_p, Min_p, row // repeats, vocab,
                                                GREEDY_EPS_C, MIN_P)  # fmt: skip
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
                z_k, tie_k, mass_k = wide_cut(zs, ids, zs, n_items, vocab, inv_t, m, inv_s, k_eff, float("inf"),
                                              -float("inf"), top, 0, 0.0, False, False, True, BLOCK_V)  # fmt: skip
                p_lim_eff = p_lim * mass_k
            # The top-k mass that scales top_p needs the top-k tokens past the list: the whole row, exactly.
            whole_row = joint & (n_items < k_eff)
        if RANK:
            by_mass = mass > p_lim_eff
        else:
            by_mass = mass >= p_lim_eff
        floor_d = tl.where(min_p > 0.0, -tl.log(tl.maximum(min_p, 1e-30)), float("inf"))
        by_floor = (hi + 1.0) / r * (1.0 - _SLACK_SELECT) > floor_d
        if whole_row:
            base_l = Logits + row * stride_l
            z_star, tie_end, kept = wide_cut(base_l, base_l, base_l, vocab, vocab, inv_t, m, inv_s, k_eff, p_lim, floor,
                                             m, 0, 0.0, RANK, MIN_P, False, BLOCK_V)  # fmt: skip
            _store_desc(Desc, row, m, z_star, inv_s / kept, tie_end)
            tl.store(Path + row, VOCAB)
        elif (n_items >= k_eff) | (n_items >= fin) | by_mass | by_floor:
            z_star, tie_end, kept = wide_cut(zs, ids, zs, n_items, vocab, inv_t, m, inv_s, k_eff, p_lim, floor, top, 0,
                                             0.0, RANK, MIN_P, True, BLOCK_V)  # fmt: skip
            _store_desc(Desc, row, m, z_star, inv_s / kept, tie_end)
        else:
            tl.store(Path + row, PENDING)
            tl.store(plan + 2, hi + 1)
            tl.store(plan + 8, n_items)
            tl.store(PlanF + row * PLAN_F + 2, mass)


@triton.jit
def _select_kernel(Logits, Temperature, Top_k, Top_p, Min_p, Stats, PlanI, PlanF, Path, ListN, ListIds, ListZ,
                   Offsets, AboveMass, RangeZ, Desc, vocab, stride_l, repeats, n_chunks, list_cap,
                   GREEDY_EPS_C: tl.constexpr, NB_C: tl.constexpr, NCH: tl.constexpr, CHUNK_C: tl.constexpr,
                   BLOCK_V: tl.constexpr, RANK: tl.constexpr, MIN_P: tl.constexpr):  # fmt: skip
    """The bracket stage's rows: the exact threshold over the list with the offsets above it (WINDOW; FULL
    once the list holds everything above it too), or, for a bracket too large to list, one tied value (TIE)
    or the whole row (VOCAB)."""
    row = tl.program_id(0).to(tl.int64)
    path = tl.load(Path + row)
    if (path == WINDOW) | (path == BIG):
        inv_t, k_eff, p_lim, min_p = row_params(Temperature, Top_k, Top_p, Min_p, row // repeats, vocab,
                                                GREEDY_EPS_C, MIN_P)  # fmt: skip
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
                z_star, tie_end, mass = wide_cut(base_l, ids, zs, n_items, vocab, inv_t, m, inv_s, k_eff, p_lim, floor,
                                                 top, cnt_off, mass_off, RANK, MIN_P, True, BLOCK_V)  # fmt: skip
            new_path = tl.where(tl.load(plan + 4) == _ALL_ABOVE_SELECT, FULL, WINDOW)
        else:
            rng = RangeZ + (row * NCH + chs) * 2
            z_lo = tl.min(tl.load(rng, mask=chs < n_chunks, other=float("inf")), axis=0)
            z_hi = tl.max(tl.load(rng + 1, mask=chs < n_chunks, other=-float("inf")), axis=0)
            if z_lo == z_hi:
                new_path = TIE
                n_tie, mass = tie_cut(z_lo, n_items, cnt_off, mass_off, m, inv_s, k_eff, p_lim, floor, vocab, RANK, MIN_P)
                z_star = tl.where(n_tie > 0, z_lo, next_up(z_lo))
                if RANK:
                    if (n_tie > 0) & (n_tie < n_items):
                        tie_end = _nth_in_range(base_l, Offsets, row, n_tie, n_chunks, m,
                                                tl.load(PlanF + row * PLAN_F + 1), tl.load(plan + 3), tl.load(plan + 4),
                                                tl.load(plan + 5), tl.load(plan + 6), vocab, inv_t, NB_C, NCH, CHUNK_C,
                                                BLOCK_V)  # fmt: skip
            else:
                new_path = VOCAB
                z_star, tie_end, mass = wide_cut(base_l, base_l, base_l, vocab, vocab, inv_t, m, inv_s, k_eff, p_lim,
                                                 floor, m, 0, 0.0, RANK, MIN_P, False, BLOCK_V)  # fmt: skip
        _store_desc(Desc, row, m, z_star, inv_s / mass, tie_end)
        tl.store(Path + row, new_path)


def target_filter_fwd(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    repeats: int = 1,
    rank_rule: bool = False,
    list_cap: int = LIST_CAP,
    chunk: int = CHUNK,
    block_v: int = 1024,
    levels: int = LEVELS,
    num_warps: int = 4,
) -> TargetRows:
    """``target_probs`` on the GPU, as thresholds: row i under request i // repeats.

    logits [n, V] (any float dtype, last dim contiguous); temperature, top_p [n / repeats] float;
    top_k [n / repeats] int (1: greedy; <= 0 or >= V: off); min_p [n / repeats] float, or None for
    a batch without min-p; rank_rule: the pytorch backend's rule, else flashinfer's. ``list_cap`` sizes
    the per-row list, ``levels`` the histogram levels; ``chunk`` (tokens per program, a multiple of
    ``block_v``), ``block_v`` and ``num_warps`` (of the vocabulary-parallel passes) are launch parameters
    only. Shape-static, no host sync.
    """
    n, vocab = logits.shape
    bs = n // repeats if repeats >= 1 else -1
    params = [temperature, top_k, top_p] + ([] if min_p is None else [min_p])
    if repeats < 1 or n % repeats or any(t.shape != (bs,) for t in params) or logits.stride(-1) != 1:
        raise ValueError(f"logits [n, V] with contiguous rows and parameters [n / repeats], got {tuple(logits.shape)}, "
                         f"{[tuple(t.shape) for t in params]}, repeats {repeats}")  # fmt: skip
    if top_k.is_floating_point():
        raise ValueError(f"top_k must be an integer tensor, got {top_k.dtype}")
    if chunk % block_v:
        raise ValueError(f"chunk {chunk} must be a multiple of block_v {block_v}")
    if levels < 1 or list_cap < 1:
        raise ValueError(f"levels ({levels}) and list_cap ({list_cap}) must be >= 1")
    dev = logits.device
    n_chunks = triton.cdiv(vocab, chunk)
    nch = triton.next_power_of_2(n_chunks)
    desc = torch.empty((n, 4), dtype=torch.float32, device=dev)
    passes = VocabPasses.allocate(n, n_chunks, list_cap, dev)
    if n:
        rows = PassRows(logits, temperature, top_k, top_p, min_p, repeats, chunk, block_v, num_warps)
        passes.top_list(rows, target=True)
        common = (logits, temperature, *rows.params, passes.stats, passes.plan_i, passes.plan_f, passes.path,
                  passes.list_n, passes.list_ids, passes.list_z)  # fmt: skip
        flags = {"GREEDY_EPS_C": GREEDY_EPS, "NCH": nch, "BLOCK_V": block_v, "RANK": rank_rule, "MIN_P": min_p is not None}
        _select_top_kernel[(n,)](*common, desc, vocab, logits.stride(0), repeats, n_chunks, list_cap, **flags)
        passes.bracket(rows, rank_rule, levels)
        _select_kernel[(n,)](*common, passes.offsets, passes.above_mass, passes.range_z, desc, vocab,
                             logits.stride(0), repeats, n_chunks, list_cap, NB_C=NB, CHUNK_C=chunk, **flags)  # fmt: skip
    return TargetRows(logits, temperature, repeats, desc, passes.list_ids, passes.list_n, passes.path)
