"""Stock SGLang's sampling distribution of every verify row, vocabulary-parallel, as thresholds on the logits.

The sampled verify needs, for every row of its [n = bs * (k + 1), V] logits, the distribution stock
decoding samples from (``sampling/target.target_probs`` is the reference, for either sampling backend).
Rejection sampling then reads p at the drafts and draws once per request from a residual, so a row
is returned as its kept set's threshold (``TargetRows``: token i is kept iff z_i > z*, or z_i == z* and
i <= tie_end; p_i = exp(z_i - m) x scale) plus, where every kept token fits, their list.

Launches (grid rows x vocabulary chunks unless said; ``logit_bins`` and ``cut_plan`` hold the passes,
``target_select`` the two selects):
    1. statistics per chunk (max, sum-exp, finite count and min), then the row's first list: level 1's
       histogram of log-mass bins, the plan of its top bins holding at most ``list_cap`` tokens and their
       gather; or, with ``candidates`` (the server's), the bins whose tokens hold >= 1 / (list_cap - 1) of
       the mass, at most list_cap tokens by construction, gathered in one read of the chunks that can hold
       them (``top_candidates``);
    2. select (one program per row): a row whose cut provably lies inside its list (exact sums: the list
       holds top_k tokens or top_p of the mass, or the first token under it lies below the min-p floor)
       gets its exact threshold over the list (``target_wide``): the peaked rows;
    3. the other rows' bracket stage, from the bin under the list with the list's exact count and mass
       above it where every listed token is surely kept, else from bin 0: per level (``levels``, default
       3) a plan of the bracket of bins that can hold the cut (bin counts bound its mass), split into the
       next level's finer bins while it holds more than ``list_cap`` tokens; then its gather (with
       ``candidates``, level 1's histogram is counted here, for these rows alone);
    4. select: the exact threshold over the bracket's list, with the exact count and mass above it;
       a bracket too large to list is one tied value (decided from its count) or, rarely, the row.
Each pass reads the logits once at full bandwidth; peaked rows take three reads (with ``candidates`` the
statistics' read and the few chunks holding candidates), near-uniform rows (a nucleus of most of the
vocabulary) four or five. Measured on an H200 at 64 x 9 x 151,936 (``kernels_accept_h200_ce8b8fd.json``), the
histogram and the scanned gather take two reads' time each, so the candidate list halves the peaked rows'
filter.

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

from .logit_bins import BLOCK_V, CHUNK, GREEDY_EPS, NB, inv_temperature, load_z
from .target_select import select_kernel, select_top_kernel
from .vocab_passes import PassRows, VocabPasses

LIST_CAP = 2048
LEVELS = 3


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
                self.logits,
                self.temperature,
                self.desc,
                out,
                vocab,
                self.logits.stride(0),
                self.repeats,
                GREEDY_EPS_C=GREEDY_EPS,
                BLOCK_V=block,
            )
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
def _dense_kernel(
    Logits, Temperature, Desc, Out, vocab, stride_l, repeats, GREEDY_EPS_C: tl.constexpr, BLOCK_V: tl.constexpr
):
    row, blk = tl.program_id(0).to(tl.int64), tl.program_id(1)
    inv_t = inv_temperature(Temperature, row // repeats, GREEDY_EPS_C)
    m, z_star, scale, tie_end = load_desc(Desc, row)
    idx = blk * BLOCK_V + tl.arange(0, BLOCK_V)
    z = load_z(Logits + row * stride_l, idx, vocab, inv_t)
    tl.store(Out + row * vocab + idx, kept_p(z, idx, m, z_star, scale, tie_end), mask=idx < vocab)


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
    block_v: int = BLOCK_V,
    levels: int = LEVELS,
    num_warps: int = 4,
    candidates: bool = False,
) -> TargetRows:
    """``target_probs`` on the GPU, as thresholds: row i under request i // repeats.

    logits [n, V] (any float dtype, last dim contiguous); temperature, top_p [n / repeats] float;
    top_k [n / repeats] int (1: greedy; <= 0 or >= V: off); min_p [n / repeats] float, or None for
    a batch without min-p; rank_rule: the pytorch backend's rule, else flashinfer's. ``list_cap`` sizes
    the per-row list, ``levels`` the histogram levels; ``chunk`` (tokens per program, a multiple of
    ``block_v``), ``block_v`` and ``num_warps`` (of the vocabulary-parallel passes) are launch parameters
    only; ``candidates``: the first list is ``top_candidates``' instead of level 1's top bins
    (the server's unless ``--pillar-accept-list bins``; the same thresholds either way). Shape-static, no host sync.
    """
    n, vocab = logits.shape
    bs = n // repeats if repeats >= 1 else -1
    params = [temperature, top_k, top_p] + ([] if min_p is None else [min_p])
    if repeats < 1 or n % repeats or any(t.shape != (bs,) for t in params) or logits.stride(-1) != 1:
        raise ValueError(
            f"logits [n, V] with contiguous rows and parameters [n / repeats], got {tuple(logits.shape)}, "
            f"{[tuple(t.shape) for t in params]}, repeats {repeats}"
        )
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
        if candidates:
            passes.candidates(rows)
        else:
            passes.top_list(rows, target=True)
        common = (
            logits,
            temperature,
            *rows.params,
            passes.stats,
            passes.plan_i,
            passes.plan_f,
            passes.path,
            passes.list_n,
            passes.list_ids,
            passes.list_z,
        )
        flags = {
            "GREEDY_EPS_C": GREEDY_EPS,
            "NCH": nch,
            "BLOCK_V": block_v,
            "RANK": rank_rule,
            "MIN_P": min_p is not None,
        }
        sizes = (desc, vocab, logits.stride(0), repeats, n_chunks, list_cap)  # both selects' last tensor and sizes
        select_top_kernel[(n,)](
            *common,
            passes.list_mass,
            *sizes,
            **flags,
            CANDIDATES=candidates,
            CAP_P2=triton.next_power_of_2(list_cap),
        )
        passes.bracket(rows, rank_rule, levels, level1=candidates)
        select_kernel[(n,)](
            *common,
            passes.offsets,
            passes.above_mass,
            passes.range_z,
            *sizes,
            NB_C=NB,
            CHUNK_C=chunk,
            **flags,
        )
    return TargetRows(logits, temperature, repeats, desc, passes.list_ids, passes.list_n, passes.path)
