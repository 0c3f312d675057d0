"""Stock SGLang's sampling distribution of every verify row, vocabulary-parallel and compact.

The sampled verify needs, for every row of its [n = bs * (k + 1), V] logits, the distribution stock
decoding samples from (``sampling/target.target_probs`` is the reference, for either sampling backend).
Rejection sampling then reads p at the drafts and draws once per request from a residual, so the
rows are returned compact (``TargetRows``): a row whose kept set lies within its top-C tokens is
those C ids (ascending) and their final p; only the other rows (no filter at all, a nucleus wider
than C) are written out in full.

Passes (grid rows x vocabulary chunks of CHUNK tokens, so each row is spread over many programs):
    1. per chunk: max and sum-exp of z = logit / T and the finite-token count;
    2. per chunk: counts at the ladder of cuts m - DELTA_j of ``draft_sample`` (m: the row max);
    3. per chunk: the ids with z >= the widest cut holding <= C tokens, written at the chunk's
       offset (the counts of the chunks before it), so the candidates come out in id order;
    4. per row: the filter on the candidates (a [C, C] comparison), and whether the kept set
       provably ends inside them (the next token is cut, or only -inf tokens remain); the rows where
       it may not find their cut with ``target_wide.wide_cut``: over their top C2 = 2048 tokens
       (listed in pass 3 too) when those provably hold the kept set, else over the whole
       vocabulary (exact, serial: the rare path);
    5. per chunk of the rows not decided in 4: the full row, p_i / kept mass where kept, else 0.
Expected cost on an H100 (3.35 TB/s; bf16 logits): passes 1-3 read the logits three times
(3 x 175 MB at 64 x 9 x 151,936 = 0.16 ms, x 4 at 256 requests), pass 4 reads C ids per row, pass 5
exits at once on compact rows; five launches. About 0.2 ms at 64 x 9 rows, 0.7 ms at 256 x 9.
Measured (H100, ``kernels_accept_h100_4f49555.json``, fp32 logits, so 350 MB a pass at 64 x 9): 1.01-1.05
ms at 64 x 9 and 3.93-3.97 ms at 256 x 9, about 3x the three passes' fp32 read; the one-program-per-row
kernel it replaced took 3.21 and 6.14 ms (``kernels_accept_old_h100_a0e6fce_b*.json``).

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

from .draft_sample import DELTA_BASE, GREEDY_EPS, LADDER, candidate_ranks, load_z
from .target_wide import above, wide_cut

CANDIDATES = 64
WIDE_CANDIDATES = 2048
CHUNK = 8192


@dataclass
class TargetRows:
    """The target distribution of n rows over V tokens.

    cand_ids [n, C] int32: row r's top tokens in ascending id order (slots past them: any id, p 0);
    cand_p [n, C] float32: the final p on them where ``compact[r]``; compact [n] int32: 1 when row
    r's p is zero outside cand_ids; full [n, V] float32: row r's p where not compact (else unset).
    """

    cand_ids: torch.Tensor
    cand_p: torch.Tensor
    compact: torch.Tensor
    full: torch.Tensor

    def dense(self) -> torch.Tensor:
        """[n, V] float32 rows (a copy)."""
        out = torch.where(self.compact[:, None].bool(), 0.0, self.full)
        scattered = torch.zeros_like(out).scatter_add_(1, self.cand_ids.long(), self.cand_p)
        return torch.where(self.compact[:, None].bool(), scattered, out)


@triton.jit
def _row_params(Temperature, Top_k, Top_p, Min_p, req, vocab, GREEDY_EPS_C: tl.constexpr, MIN_P: tl.constexpr):
    """(inv_t, k_eff, p_lim, min_p) of a request: greedy by temperature is top_k 1 at T 1."""
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
def _inv_t(Temperature, req, GREEDY_EPS_C: tl.constexpr):
    temp = tl.load(Temperature + req).to(tl.float32)
    return 1.0 / tl.where(temp < GREEDY_EPS_C, 1.0, temp)


@triton.jit
def _row_max(Stats, row, n_chunks, NCH: tl.constexpr):
    offs = tl.arange(0, NCH)
    return tl.max(tl.load(Stats + (row * n_chunks + offs) * 3, mask=offs < n_chunks, other=-3.0e38), axis=0)


@triton.jit
def _stats_kernel(Logits, Temperature, Stats, vocab, stride_l, repeats, n_chunks,
                  GREEDY_EPS_C: tl.constexpr, CHUNK_C: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    row, ch = tl.program_id(0).to(tl.int64), tl.program_id(1)
    inv_t = _inv_t(Temperature, row // repeats, GREEDY_EPS_C)
    base_l = Logits + row * stride_l
    offs = tl.arange(0, BLOCK_V)
    m = -3.0e38  # finite: a chunk of -inf logits (a grammar mask) must not compute exp(-inf - -inf)
    s = 0.0
    fin = 0
    for sub in range(0, CHUNK_C, BLOCK_V):
        z = load_z(base_l, ch * CHUNK_C + sub + offs, vocab, inv_t)
        new_m = tl.maximum(m, tl.max(z, axis=0))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(z - new_m), axis=0)
        m = new_m
        fin += tl.sum((z > -float("inf")).to(tl.int32), axis=0)
    out = Stats + (row * n_chunks + ch) * 3
    tl.store(out, m)
    tl.store(out + 1, s)
    tl.store(out + 2, fin.to(tl.float32))


@triton.jit
def _ladder_kernel(Logits, Temperature, Stats, Counts, vocab, stride_l, repeats, n_chunks,
                   GREEDY_EPS_C: tl.constexpr, DELTA_BASE_C: tl.constexpr, LADDER_C: tl.constexpr,
                   NCH: tl.constexpr, CHUNK_C: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    row, ch = tl.program_id(0).to(tl.int64), tl.program_id(1)
    inv_t = _inv_t(Temperature, row // repeats, GREEDY_EPS_C)
    m = _row_max(Stats, row, n_chunks, NCH)
    rungs = tl.arange(0, LADDER_C)
    cut = m - DELTA_BASE_C * tl.exp2(rungs.to(tl.float32) * 0.5)
    base_l = Logits + row * stride_l
    offs = tl.arange(0, BLOCK_V)
    counts = tl.zeros([LADDER_C], dtype=tl.int32)
    for sub in range(0, CHUNK_C, BLOCK_V):
        z = load_z(base_l, ch * CHUNK_C + sub + offs, vocab, inv_t)
        counts += tl.sum((z[:, None] >= cut[None, :]).to(tl.int32), axis=0)
    tl.store(Counts + (row * n_chunks + ch) * LADDER_C + rungs, counts)


@triton.jit
def _rung(Counts, row, n_chunks, C: tl.constexpr, LADDER_C: tl.constexpr, NCH: tl.constexpr):
    """(fits, rung, per-chunk counts at the rung [NCH], total at the rung): the widest cut of the
    ladder holding at most C tokens of the row (rung 0 when none does: then fits == 0)."""
    chs = tl.arange(0, NCH)
    rungs = tl.arange(0, LADDER_C)
    counts = tl.load(Counts + (row * n_chunks + chs[:, None]) * LADDER_C + rungs[None, :],
                     mask=chs[:, None] < n_chunks, other=0)  # fmt: skip
    totals = tl.sum(counts, axis=0)
    fits = tl.sum((totals <= C).to(tl.int32), axis=0)
    rung = tl.maximum(fits - 1, 0)
    col = tl.sum(tl.where(rungs[None, :] == rung, counts, 0), axis=1)
    return fits, rung, col, tl.sum(col, axis=0)


@triton.jit
def _gather_list(base_l, Out_ids, Out_z, Counts, row, ch, m, inv_t, vocab, n_chunks,
                 DELTA_BASE_C: tl.constexpr, LADDER_C: tl.constexpr, CAP: tl.constexpr,
                 NCH: tl.constexpr, CHUNK_C: tl.constexpr, BLOCK_V: tl.constexpr, WITH_Z: tl.constexpr):  # fmt: skip
    """This chunk's ids with z >= the widest cut holding <= CAP tokens of the row, at its offset."""
    fits_cap, rung, col, n_cap = _rung(Counts, row, n_chunks, CAP, LADDER_C, NCH)
    # The same cut as the ladder pass computed, bit for bit.
    rungs = tl.arange(0, LADDER_C)
    thr = tl.max(tl.where(rungs == rung, m - DELTA_BASE_C * tl.exp2(rungs.to(tl.float32) * 0.5), -float("inf")), axis=0)
    filled = tl.sum(tl.where(tl.arange(0, NCH) < ch, col, 0), axis=0)
    offs = tl.arange(0, BLOCK_V)
    for sub in range(0, CHUNK_C, BLOCK_V):
        idx = ch * CHUNK_C + sub + offs
        z = load_z(base_l, idx, vocab, inv_t)
        take = z >= thr
        slot = filled + tl.cumsum(take.to(tl.int32), axis=0) - 1
        take = take & (slot < CAP)
        tl.store(Out_ids + row * CAP + slot, idx, mask=take)
        if WITH_Z:
            tl.store(Out_z + row * CAP + slot, z, mask=take)
        filled += tl.sum(take.to(tl.int32), axis=0)


@triton.jit
def _gather_kernel(Logits, Temperature, Stats, Counts, Cand, Cand2, Cand2_z, vocab, stride_l, repeats, n_chunks,
                   GREEDY_EPS_C: tl.constexpr, DELTA_BASE_C: tl.constexpr, LADDER_C: tl.constexpr, C: tl.constexpr,
                   C2: tl.constexpr, NCH: tl.constexpr, CHUNK_C: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    row, ch = tl.program_id(0).to(tl.int64), tl.program_id(1)
    inv_t = _inv_t(Temperature, row // repeats, GREEDY_EPS_C)
    m = _row_max(Stats, row, n_chunks, NCH)
    base_l = Logits + row * stride_l
    # Both lists in one pass (the second re-reads the chunk from L2): the top C for the per-row
    # comparison, the top C2 (ids and z) for the rows the first cannot decide.
    _gather_list(base_l, Cand, Cand, Counts, row, ch, m, inv_t, vocab, n_chunks,
                 DELTA_BASE_C, LADDER_C, C, NCH, CHUNK_C, BLOCK_V, False)  # fmt: skip
    _gather_list(base_l, Cand2, Cand2_z, Counts, row, ch, m, inv_t, vocab, n_chunks,
                 DELTA_BASE_C, LADDER_C, C2, NCH, CHUNK_C, BLOCK_V, True)  # fmt: skip


@triton.jit
def _select_kernel(Logits, Temperature, Top_k, Top_p, Min_p, Stats, Counts, Cand, Cand_p, Compact, Wide,
                   Cand2, Cand2_z, vocab, stride_l, repeats, n_chunks,
                   GREEDY_EPS_C: tl.constexpr, LADDER_C: tl.constexpr, MIN_P: tl.constexpr, RANK: tl.constexpr,
                   C: tl.constexpr, BLOCK_C: tl.constexpr, C2: tl.constexpr, NCH: tl.constexpr,
                   BLOCK_V: tl.constexpr):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    inv_t, k_eff, p_lim, min_p = _row_params(Temperature, Top_k, Top_p, Min_p, row // repeats, vocab, GREEDY_EPS_C, MIN_P)
    chs = tl.arange(0, NCH)
    st = Stats + (row * n_chunks + chs) * 3
    m_c = tl.load(st, mask=chs < n_chunks, other=-3.0e38)
    m = tl.max(m_c, axis=0)
    inv_s = 1.0 / tl.sum(tl.load(st + 1, mask=chs < n_chunks, other=0.0) * tl.exp(m_c - m), axis=0)
    n_finite = tl.sum(tl.load(st + 2, mask=chs < n_chunks, other=0.0), axis=0).to(tl.int32)
    fits, rung_c, col_c, n_total = _rung(Counts, row, n_chunks, C, LADDER_C, NCH)
    base_l = Logits + row * stride_l

    offs_c = tl.arange(0, BLOCK_C)
    valid = offs_c < tl.minimum(n_total, C)
    ids = tl.load(Cand + row * C + offs_c, mask=valid, other=0)
    zc = tl.where(valid, load_z(base_l, ids, vocab, inv_t), -float("inf"))
    p = tl.where(valid, tl.exp(zc - m) * inv_s, 0.0)
    cand_mass = tl.sum(p, axis=0)
    # p >= min_p x p_max  <=>  z >= m + log(min_p), judged on z so it cuts the value order exactly.
    floor = tl.where(min_p > 0.0, m + tl.log(tl.maximum(min_p, 1e-30)), -float("inf"))
    floor_ok = zc >= floor
    # The token after the candidates (z below all of them) is cut if ...
    top_k_inside = (n_total >= k_eff) | (n_total >= n_finite)  # ... top-k cuts it, or only -inf tokens remain
    next_cut = top_k_inside | (tl.min(tl.where(valid, floor_ok, True).to(tl.int32), axis=0) == 0)  # min-p cuts it
    known = n_total >= 0
    p_lim_row = p_lim
    if RANK:
        rank, mass_before = candidate_ranks(zc, p, valid, offs_c)
        keep = valid & (rank < k_eff) & (mass_before <= p_lim) & floor_ok
        keep = valid & (rank < tl.sum(keep.to(tl.int32), axis=0))  # a rank prefix, whatever the rounding
        next_cut |= cand_mass > p_lim
    else:
        gt = valid[None, :] & (zc[None, :] > zc[:, None])
        n_gt = tl.sum(gt.to(tl.int32), axis=1)
        mass_gt = tl.sum(tl.where(gt, p[None, :], 0.0), axis=1)
        keep_k = valid & (n_gt < k_eff)
        if MIN_P:
            # top-p on the top-k renormalised row: its mass is known when top-k cuts inside.
            mass_k = tl.where(k_eff >= vocab, 1.0, tl.sum(tl.where(keep_k, p, 0.0), axis=0))
            known = (p_lim == float("inf")) | (k_eff >= vocab) | top_k_inside
            p_lim = p_lim * mass_k
        keep = keep_k & (mass_gt < p_lim) & floor_ok
        next_cut |= cand_mass >= p_lim
    kept = tl.sum(tl.where(keep, p, 0.0), axis=0)
    exact = (fits >= 1) & next_cut & known
    tl.store(Cand_p + row * C + offs_c, tl.where(keep & exact, p / kept, 0.0), mask=offs_c < C)
    tl.store(Compact + row, exact.to(tl.int32))
    if exact == 0:
        if (k_eff >= vocab) & (p_lim_row == float("inf")) & (min_p <= 0.0):
            # No filter: the softmax itself.
            z_star = tl.full([], -float("inf"), tl.float32)
            tie_end = vocab
            mass = tl.full([], 1.0, tl.float32)
        else:
            # The top C2: the same proof that nothing past them is kept, on their count and mass
            # (with min-p and top-p, top_p x the top-k mass <= top_p: the test below suffices).
            fits2, rung2, col2, n2 = _rung(Counts, row, n_chunks, C2, LADDER_C, NCH)
            n_items = tl.minimum(n2, C2)
            ids2, zs2 = Cand2 + row * C2, Cand2_z + row * C2
            n_all2, mass2 = above(base_l, ids2, zs2, n_items, vocab, inv_t, m, inv_s, -float("inf"), False, True, BLOCK_V)
            n_floor, mass_floor = above(base_l, ids2, zs2, n_items, vocab, inv_t, m, inv_s, floor, False, True, BLOCK_V)
            next2 = (n2 >= k_eff) | (n2 >= n_finite) | (n_floor < n_items)
            if RANK:
                next2 |= mass2 > p_lim_row
            else:
                next2 |= mass2 >= p_lim_row
                if MIN_P:  # the top-k mass must be known: top-k cuts inside the list
                    next2 &= (p_lim_row == float("inf")) | (k_eff >= vocab) | (n2 >= k_eff) | (n2 >= n_finite)
            if (fits2 >= 1) & next2:
                z_star, tie_end, mass = wide_cut(base_l, ids2, zs2, n_items, vocab, inv_t, m, inv_s, k_eff, p_lim_row,
                                                 floor, RANK, MIN_P, True, BLOCK_V)  # fmt: skip
            else:
                z_star, tie_end, mass = wide_cut(base_l, base_l, base_l, vocab, vocab, inv_t, m, inv_s, k_eff,
                                                 p_lim_row, floor, RANK, MIN_P, False, BLOCK_V)  # fmt: skip
        tl.store(Wide + row * 4, m)
        tl.store(Wide + row * 4 + 1, z_star)
        tl.store(Wide + row * 4 + 2, inv_s / mass)
        tl.store(Wide + row * 4 + 3, tie_end.to(tl.float32))


@triton.jit
def _write_kernel(Logits, Temperature, Compact, Wide, Full, vocab, stride_l, stride_f, repeats,
                  GREEDY_EPS_C: tl.constexpr, CHUNK_C: tl.constexpr, BLOCK_V: tl.constexpr):  # fmt: skip
    row, ch = tl.program_id(0).to(tl.int64), tl.program_id(1)
    if tl.load(Compact + row) == 0:
        inv_t = _inv_t(Temperature, row // repeats, GREEDY_EPS_C)
        m = tl.load(Wide + row * 4)
        z_star = tl.load(Wide + row * 4 + 1)
        scale = tl.load(Wide + row * 4 + 2)
        tie_end = tl.load(Wide + row * 4 + 3).to(tl.int32)
        base_l = Logits + row * stride_l
        offs = tl.arange(0, BLOCK_V)
        for sub in range(0, CHUNK_C, BLOCK_V):
            idx = ch * CHUNK_C + sub + offs
            z = load_z(base_l, idx, vocab, inv_t)
            keep = (z > z_star) | ((z == z_star) & (idx <= tie_end))
            tl.store(Full + row * stride_f + idx, tl.where(keep, tl.exp(z - m) * scale, 0.0), mask=idx < vocab)


def target_filter_fwd(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    min_p: torch.Tensor | None,
    repeats: int = 1,
    rank_rule: bool = False,
    candidates: int = CANDIDATES,
    wide_candidates: int = WIDE_CANDIDATES,
    chunk: int = CHUNK,
    block_v: int = 1024,
) -> TargetRows:
    """``target_probs`` on the GPU, compact: row i under request i // repeats.

    logits [n, V] (any float dtype, last dim contiguous); temperature, top_p [n / repeats] float;
    top_k [n / repeats] int (1: greedy; <= 0 or >= V: off); min_p [n / repeats] float, or None for
    a batch without min-p; rank_rule: the pytorch backend's rule, else flashinfer's. ``candidates``
    (C) sizes the per-row comparison; ``chunk`` (tokens per program, a multiple of ``block_v``) and
    ``block_v`` are launch parameters only. Shape-static, no host sync.
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
    dev = logits.device
    n_chunks = triton.cdiv(vocab, chunk)
    rows = TargetRows(
        torch.zeros((n, candidates), dtype=torch.int32, device=dev),
        torch.empty((n, candidates), dtype=torch.float32, device=dev),
        torch.empty(n, dtype=torch.int32, device=dev),
        torch.empty((n, vocab), dtype=torch.float32, device=dev),
    )
    if n == 0:
        return rows
    stats = torch.empty((n, n_chunks, 3), dtype=torch.float32, device=dev)
    counts = torch.empty((n, n_chunks, LADDER), dtype=torch.int32, device=dev)
    wide = torch.empty((n, 4), dtype=torch.float32, device=dev)
    cand2 = torch.empty((n, wide_candidates), dtype=torch.int32, device=dev)
    cand2_z = torch.empty((n, wide_candidates), dtype=torch.float32, device=dev)
    grid = (n, n_chunks)
    nch = triton.next_power_of_2(n_chunks)
    common = {"GREEDY_EPS_C": GREEDY_EPS, "CHUNK_C": chunk, "BLOCK_V": block_v}
    _stats_kernel[grid](logits, temperature, stats, vocab, logits.stride(0), repeats, n_chunks, **common)
    ladder = {"DELTA_BASE_C": DELTA_BASE, "LADDER_C": LADDER, "NCH": nch, **common}
    _ladder_kernel[grid](logits, temperature, stats, counts, vocab, logits.stride(0), repeats, n_chunks, **ladder)
    _gather_kernel[grid](logits, temperature, stats, counts, rows.cand_ids, cand2, cand2_z, vocab, logits.stride(0),
                         repeats, n_chunks, C=candidates, C2=wide_candidates, **ladder)  # fmt: skip
    _select_kernel[(n,)](
        logits, temperature, top_k, top_p, top_p if min_p is None else min_p, stats, counts, rows.cand_ids,
        rows.cand_p, rows.compact, wide, cand2, cand2_z, vocab, logits.stride(0), repeats, n_chunks,
        GREEDY_EPS_C=GREEDY_EPS, LADDER_C=LADDER, MIN_P=min_p is not None, RANK=rank_rule, C=candidates,
        BLOCK_C=triton.next_power_of_2(candidates), C2=wide_candidates, NCH=nch, BLOCK_V=block_v,
    )  # fmt: skip
    _write_kernel[grid](logits, temperature, rows.compact, wide, rows.full, vocab, logits.stride(0),
                        rows.full.stride(0), repeats, **common)  # fmt: skip
    return rows
