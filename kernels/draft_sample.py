"""Draft-token sampling with a compact record of the proposal, vocabulary-parallel.

A PILLAR draft token may come from *any* proposal distribution q as long as the verify knows q
exactly: rejection sampling then returns the target's distribution whatever q is. So the draft
samples from q = SGLang's temperature / top-k / top-p / min-p filter restricted to a small set of
the row's most probable tokens (at most C, e.g. 64), and records q on those slots only: [C] ids +
[C] probabilities per draft instead of a full-vocabulary fp32 row (k x V x 4 bytes per request:
1.24 GB at batch 256, k = 8 and Qwen3's 151,936 tokens).

The candidate set needs no sort and no ``torch.topk``: the vocabulary-parallel passes of
``logit_bins`` (statistics, one level of log-mass bins, gather; the plan in ``cut_plan``'s top-C
mode) find the top bins holding at most C tokens and gather them in ascending id order (the first C
of bin 0 when it alone holds more). Bins are uniform in log-probability (``logit_bins``), so the set
is the top-n tokens (n <= C) down to a bin edge. One program per row then filters and samples.

Semantics per row (slot c holds candidate id_c, ascending; unused slots hold id 0 and q = 0):
    greedy (T < GREEDY_EPS or top_k == 1): q = one-hot at slot 0, id_0 = argmax (lowest id on ties);
    else p_c = exp(z_c - m) / S; rank_c = candidates ahead of c (larger z, ties: lower id); c is
        kept iff rank_c < top_k (top_k <= 0 or >= V: no limit), the mass of the candidates ahead of
        it <= top_p (top_p >= 1: no limit) and p_c >= min_p * max p; rank 0 is always kept;
    q = kept p renormalised; the token is id of argmax_c q_c / E_c with E_c ~ Exp(1) from ``noise``
    (an exact draw from q).
Five small launches per step (64 rows x 151,936 fp32: ~40 us on an H200, where one program per row
took 214 us), shape-static and sync-free, so they run inside the draft CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .logit_bins import BLOCK_V, CHUNK, DEPTH, GREEDY_EPS, NB, row_stats
from .vocab_passes import PassRows, VocabPasses


@triton.jit
def candidate_ranks(zc, p, valid, offs_c):
    """(rank, mass ahead) of each candidate slot: c' ranks before c when its z is larger, ties by the
    lower slot (= the lower id, candidates being gathered in id order); invalid slots rank nothing."""
    ahead = valid[:, None] & (
        (zc[:, None] > zc[None, :]) | ((zc[:, None] == zc[None, :]) & (offs_c[:, None] < offs_c[None, :]))
    )
    rank = tl.sum(ahead.to(tl.int32), axis=0)
    mass_before = tl.sum(tl.where(ahead, p[:, None], 0.0), axis=0)
    return rank, mass_before


@triton.jit
def _draft_select_kernel(
    Temperature,
    Top_p,
    Top_k,
    Min_p,
    Noise,
    Stats,
    ListIds,
    ListZ,
    ListN,
    Token,
    Cand_ids,
    Cand_q,
    Q_tok,
    vocab,
    n_chunks,
    stride_n,
    stride_ci,
    stride_q,
    GREEDY_EPS_C: tl.constexpr,
    C: tl.constexpr,
    BLOCK_C: tl.constexpr,
    NCH: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    temp = tl.load(Temperature + row).to(tl.float32)
    top_k = tl.load(Top_k + row).to(tl.int32)
    greedy = (temp < GREEDY_EPS_C) | (top_k == 1)
    m, inv_s, fin, zmin, arg = row_stats(Stats, row, n_chunks, NCH)
    offs_c = tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    ids_out = Cand_ids + row * stride_ci + offs_c
    q_out = Cand_q + row * stride_q + offs_c
    if greedy:
        tl.store(ids_out, tl.where(offs_c == 0, arg, 0).to(tl.int64), mask=mask_c)
        tl.store(q_out, tl.where(offs_c == 0, 1.0, 0.0), mask=mask_c)
        tl.store(Token + row, arg.to(tl.int64))
        tl.store(Q_tok + row, 1.0)
    else:
        valid = mask_c & (offs_c < tl.load(ListN + row))
        ids = tl.load(ListIds + row * C + offs_c, mask=valid, other=0)
        zc = tl.load(ListZ + row * C + offs_c, mask=valid, other=-float("inf"))
        p = tl.where(valid, tl.exp(zc - m) * inv_s, 0.0)
        rank, mass_before = candidate_ranks(zc, p, valid, offs_c)
        top_p = tl.load(Top_p + row).to(tl.float32)
        min_p = tl.load(Min_p + row).to(tl.float32)
        k_eff = tl.where((top_k <= 0) | (top_k >= vocab), vocab, top_k)
        p_max = tl.max(p, axis=0)
        in_top_p = mass_before <= tl.where(top_p >= 1.0, float("inf"), top_p)
        keep = valid & (((rank < k_eff) & in_top_p & (p >= min_p * p_max)) | (rank == 0))
        q = tl.where(keep, p, 0.0)
        q = q / tl.sum(q, axis=0)
        noise = tl.load(Noise + row * stride_n + offs_c, mask=mask_c, other=1.0).to(tl.float32)
        race = tl.where(mask_c, q / tl.maximum(noise, 1.1754943508222875e-38), -1.0)
        pick = tl.argmax(race, axis=0)
        tl.store(ids_out, ids.to(tl.int64), mask=mask_c)
        tl.store(q_out, q, mask=mask_c)
        tl.store(Token + row, tl.sum(tl.where(offs_c == pick, ids, 0), axis=0).to(tl.int64))
        tl.store(Q_tok + row, tl.sum(tl.where(offs_c == pick, q, 0.0), axis=0))


@dataclass(frozen=True)
class DraftSampleInputs:
    """One draft step's sampling inputs, n rows.

    logits [n, V] (last dim contiguous); temperature, top_p, min_p [n] float32; top_k [n] int;
    noise [n, C] Exp(1) draws (C = the record's slots). Shapes are checked at construction
    (metadata only, no sync).
    """

    logits: torch.Tensor
    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor
    noise: torch.Tensor

    def __post_init__(self) -> None:
        if self.logits.dim() != 2:
            raise ValueError(f"logits must be [n, V], got {tuple(self.logits.shape)}")
        n = self.logits.shape[0]
        if self.noise.dim() != 2 or self.noise.shape[0] != n:
            raise ValueError(f"noise must be [{n}, C], got {tuple(self.noise.shape)}")
        for name in ("temperature", "top_p", "top_k", "min_p"):
            t = getattr(self, name)
            if tuple(t.shape) != (n,):
                raise ValueError(f"{name} must have shape ({n},), got {tuple(t.shape)}")
        if self.top_k.is_floating_point():
            raise ValueError("top_k must be an integer tensor")

    @property
    def num_slots(self) -> int:
        return self.noise.shape[1]


def draft_sample_fwd(
    x: DraftSampleInputs,
    token: torch.Tensor,
    cand_ids: torch.Tensor,
    cand_q: torch.Tensor,
    q_tok: torch.Tensor,
    chunk: int = CHUNK,
    block_v: int = BLOCK_V,
    num_warps: int = 4,
) -> None:
    """Fill token [n] int64, cand_ids [n, C] int64, cand_q [n, C] float32, q_tok [n] float32
    (see the module docstring). ``chunk`` (tokens per program, a multiple of ``block_v``), ``block_v``
    (the vocabulary tile) and ``num_warps`` are launch parameters only; the result does not change."""
    n, c = x.noise.shape
    if n == 0:
        return
    for t in (x.logits, x.noise, cand_ids, cand_q):
        if t.stride(-1) != 1:
            raise ValueError("draft_sample_fwd needs a contiguous last dimension")
    if chunk % block_v:
        raise ValueError(f"chunk {chunk} must be a multiple of block_v {block_v}")
    vocab, dev = x.logits.shape[1], x.logits.device
    n_chunks = triton.cdiv(vocab, chunk)
    passes = VocabPasses.allocate(n, n_chunks, c, dev)
    passes.top_list(
        PassRows(x.logits, x.temperature, x.top_k, x.top_p, None, 1, chunk, block_v, num_warps), target=False
    )
    _draft_select_kernel[(n,)](
        x.temperature,
        x.top_p,
        x.top_k,
        x.min_p,
        x.noise,
        passes.stats,
        passes.list_ids,
        passes.list_z,
        passes.list_n,
        token,
        cand_ids,
        cand_q,
        q_tok,
        vocab,
        n_chunks,
        x.noise.stride(0),
        cand_ids.stride(0),
        cand_q.stride(0),
        GREEDY_EPS_C=GREEDY_EPS,
        C=c,
        BLOCK_C=triton.next_power_of_2(c),
        NCH=triton.next_power_of_2(n_chunks),
    )


def first_resolution_ref(depth: torch.Tensor) -> torch.Tensor:
    """``logit_bins.first_resolution`` in torch ([n] float32 finite depths m - min z): the same exact steps."""
    d = depth.clamp(0.0, DEPTH)
    top = int(torch.tensor(NB - 2.0).view(torch.int32)) >> 23 & 0xFF
    e = top - ((d.clamp(min=1e-30).view(torch.int32) >> 23) & 0xFF)
    r = ((e + 127) << 23).to(torch.int32).view(torch.float32)
    r = torch.where(d * r > NB - 2, r * 0.5, r)
    return torch.where(d > 0, r, torch.ones_like(r))


def draft_sample_ref(x: DraftSampleInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain-torch reference: returns (token, cand_ids, cand_q, q_tok) as the kernel writes them."""
    n, vocab = x.logits.shape
    c, dev = x.num_slots, x.logits.device
    greedy = (x.temperature < GREEDY_EPS) | (x.top_k == 1)
    inv_t = 1.0 / torch.where(greedy, 1.0, x.temperature.float())
    z = x.logits.float() * inv_t[:, None]
    m, arg = z.max(dim=-1)
    lse = torch.logsumexp(z, dim=-1)
    # Level-1 log-mass bins (``logit_bins``): the top bins holding <= C tokens, or bin 0's first C.
    finite = z > -torch.inf
    zmin = torch.where(finite, z, torch.inf).amin(dim=-1)
    r = first_resolution_ref(m - zmin)
    bins = torch.minimum(((m[:, None] - z) * r[:, None]).clamp(max=1.0e9).to(torch.int32), torch.tensor(NB - 2))
    bins = torch.where(finite, bins, NB - 1)
    counts = torch.zeros((n, NB), dtype=torch.int64, device=dev).scatter_add_(
        1, bins.long(), torch.ones_like(bins, dtype=torch.int64)
    )
    c_le = counts[:, : NB - 1].cumsum(dim=1)
    over = c_le > c
    hi = torch.where(over.any(dim=1), over.int().argmax(dim=1) - 1, NB - 2).clamp(min=0)
    take = finite & (bins <= hi[:, None])
    slot = take.cumsum(dim=1) - 1
    take &= slot < c
    cand_ids = torch.zeros((n, c + 1), dtype=torch.int64, device=dev)
    vocab_ids = torch.arange(vocab, device=dev).expand(n, vocab)
    cand_ids.scatter_(1, torch.where(take, slot, c), torch.where(take, vocab_ids, 0))
    cand_ids = cand_ids[:, :c]
    valid = torch.arange(c, device=dev)[None, :] < take.sum(dim=1, keepdim=True)
    zc = torch.where(valid, z.gather(1, cand_ids), -torch.inf)
    p = torch.where(valid, torch.exp(zc - lse[:, None]), 0.0)
    slots = torch.arange(c, device=dev)
    ahead = valid[:, :, None] & (
        (zc[:, :, None] > zc[:, None, :]) | ((zc[:, :, None] == zc[:, None, :]) & (slots[:, None] < slots[None, :]))
    )
    rank = ahead.sum(dim=1)
    mass_before = (ahead * p[:, :, None]).sum(dim=1)
    k_eff = torch.where((x.top_k <= 0) | (x.top_k >= vocab), vocab, x.top_k.long())
    keep = (rank < k_eff[:, None]) & ((mass_before <= x.top_p[:, None]) | (x.top_p[:, None] >= 1.0))
    keep &= p >= x.min_p[:, None] * p.amax(dim=1, keepdim=True)
    keep = valid & (keep | (rank == 0))
    q = torch.where(keep, p, 0.0)
    q = q / q.sum(-1, keepdim=True)
    one_hot = (slots == 0).float().expand_as(q)
    q = torch.where(greedy[:, None], one_hot, q)
    cand_ids = torch.where(greedy[:, None], torch.where(slots == 0, arg[:, None], 0), cand_ids)
    pick = (q / x.noise.clamp(min=torch.finfo(torch.float32).tiny)).argmax(-1)
    token = cand_ids.gather(1, pick[:, None]).squeeze(1)
    return token, cand_ids, q, q.gather(1, pick[:, None]).squeeze(1)
