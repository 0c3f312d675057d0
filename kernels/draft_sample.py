"""Draft-token sampling with a compact record of the proposal, in one kernel per draft step.

A PILLAR draft token may come from *any* proposal distribution q as long as the verify knows q
exactly: rejection sampling then returns the target's distribution whatever q is. So the draft
samples from q = SGLang's temperature / top-k / top-p / min-p filter restricted to a small set of
the row's most probable tokens (at most C, e.g. 64), and records q on those slots only: [C] ids +
[C] probabilities per draft instead of a full-vocabulary fp32 row (k x V x 4 bytes per request:
1.24 GB at batch 256, k = 8 and Qwen3's 151,936 tokens).

The candidate set needs no sort and no ``torch.topk`` (whose radix passes cost more than the rest
of the sampling, ~0.28 ms per step at batch 256 x 49K on an H100): three reads of the logits row,
    1. the max m of z = logits / T and the softmax normaliser S = sum exp(z - m) (online);
    2. for the ladder DELTA_j = 0.25 * 2^(j/2), j < 16: how many tokens have z >= m - DELTA_j;
    3. the tokens with z >= m - DELTA_j* for the widest rung j* holding at most C of them (rung 0
       if none does), collected in ascending id order, the first C of them.
So the set is exactly the top-n tokens (n <= C) unless more than C tie within 0.25 of the max.

Semantics per row (slot c holds candidate id_c, ascending; unused slots hold id 0 and q = 0):
    greedy (T < GREEDY_EPS or top_k == 1): q = one-hot at slot 0, id_0 = argmax (lowest id on ties);
    else p_c = exp(z_c - m) / S; rank_c = candidates ahead of c (larger z, ties: lower id); c is
        kept iff rank_c < top_k (top_k <= 0 or >= V: no limit), the mass of the candidates ahead of
        it <= top_p (top_p >= 1: no limit) and p_c >= min_p * max p; rank 0 is always kept;
    q = kept p renormalised; the token is id of argmax_c q_c / E_c with E_c ~ Exp(1) from ``noise``
    (an exact draw from q).
Everything is shape-static and sync-free, so it runs inside the draft CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# SGLang's cut-off below which a temperature means greedy (sampling_params._SAMPLING_EPS).
GREEDY_EPS = 1e-6
# The candidate-threshold ladder: DELTA_j = DELTA_BASE * 2^(j / 2), j < LADDER (in units of z).
DELTA_BASE = 0.25
LADDER = 16


@triton.jit
def load_z(base_l, idx, vocab, inv_t):
    # One multiply, rounded once: every pass sees bit-identical z, so z == z* is exact across passes.
    return tl.load(base_l + idx, mask=idx < vocab, other=-float("inf")).to(tl.float32) * inv_t


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
def _draft_sample_kernel(
    Logits,
    Temperature,
    Top_p,
    Top_k,
    Min_p,
    Noise,
    Token,
    Cand_ids,
    Cand_q,
    Q_tok,
    vocab,
    stride_l,
    stride_n,
    stride_ci,
    stride_q,
    GREEDY_EPS_C: tl.constexpr,
    DELTA_BASE_C: tl.constexpr,
    LADDER_C: tl.constexpr,
    C: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    temp = tl.load(Temperature + row).to(tl.float32)
    top_k = tl.load(Top_k + row).to(tl.int32)
    greedy = (temp < GREEDY_EPS_C) | (top_k == 1)
    inv_t = 1.0 / tl.where(greedy, 1.0, temp)
    offs_v = tl.arange(0, BLOCK_V)
    offs_c = tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    base_l = Logits + row * stride_l

    # Pass 1: max (and its lowest id) and the online softmax normaliser of z = logits / T.
    # A finite start: a block of -inf logits (a grammar mask) must not make exp(-inf - -inf).
    m = -3.0e38
    arg = 0
    s = 0.0
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs_v
        z = load_z(base_l, idx, vocab, inv_t)
        bm = tl.max(z, axis=0)
        barg = start + tl.argmax(z, axis=0)
        arg = tl.where(bm > m, barg, arg)
        new_m = tl.maximum(m, bm)
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(z - new_m), axis=0)
        m = new_m

    ids_out = Cand_ids + row * stride_ci + offs_c
    q_out = Cand_q + row * stride_q + offs_c
    if greedy:
        q = tl.where(offs_c == 0, 1.0, 0.0)
        tl.store(ids_out, tl.where(offs_c == 0, arg, 0).to(tl.int64), mask=mask_c)
        tl.store(q_out, q, mask=mask_c)
        tl.store(Token + row, arg.to(tl.int64))
        tl.store(Q_tok + row, 1.0)
    else:
        # Pass 2: token counts within each rung of the ladder below the max.
        rungs = tl.arange(0, LADDER_C)
        cut = m - DELTA_BASE_C * tl.exp2(rungs.to(tl.float32) * 0.5)
        counts = tl.zeros([LADDER_C], dtype=tl.int32)
        for start in range(0, vocab, BLOCK_V):
            idx = start + offs_v
            z = load_z(base_l, idx, vocab, inv_t)
            counts += tl.sum((z[:, None] >= cut[None, :]).to(tl.int32), axis=0)
        fits = tl.sum((counts <= C).to(tl.int32), axis=0)
        thr = tl.max(tl.where(rungs == tl.maximum(fits - 1, 0), cut, -float("inf")), axis=0)

        # Pass 3: collect the first C ids with z >= thr; their z waits in the q slots.
        tl.store(ids_out, tl.zeros([BLOCK_C], dtype=tl.int64), mask=mask_c)
        tl.store(q_out, tl.full([BLOCK_C], -float("inf"), tl.float32), mask=mask_c)
        tl.debug_barrier()
        filled = 0
        for start in range(0, vocab, BLOCK_V):
            idx = start + offs_v
            z = load_z(base_l, idx, vocab, inv_t)
            take = z >= thr
            slot = filled + tl.cumsum(take.to(tl.int32), axis=0) - 1
            take = take & (slot < C)
            tl.store(Cand_ids + row * stride_ci + slot, idx.to(tl.int64), mask=take)
            tl.store(Cand_q + row * stride_q + slot, z, mask=take)
            filled += tl.sum(take.to(tl.int32), axis=0)
        tl.debug_barrier()

        zc = tl.load(q_out, mask=mask_c, other=-float("inf"))
        valid = mask_c & (offs_c < filled)
        p = tl.where(valid, tl.exp(zc - m) / s, 0.0)
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
        tok = tl.load(Cand_ids + row * stride_ci + pick)
        tl.store(q_out, q, mask=mask_c)
        tl.store(Token + row, tok)
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
    block_v: int = 8192,
    num_warps: int = 8,
) -> None:
    """Fill token [n] int64, cand_ids [n, C] int64, cand_q [n, C] float32, q_tok [n] float32
    (see the module docstring). ``block_v`` (the vocabulary tile) and ``num_warps`` are launch
    parameters only (``benchmarks.sampling_bench --tune`` times them); the result does not change.
    The defaults were the fastest or within 2% of it at batch 32 and 256 x 49,152 and 256 x 151,936
    on the H100 (``kernels_tune_h100_0c83c86_*.json``: 0.149 vs 0.188 ms for 1024 x 4 at 256 x 49,152)."""
    n, c = x.noise.shape
    if n == 0:
        return
    for t in (x.logits, x.noise, cand_ids, cand_q):
        if t.stride(-1) != 1:
            raise ValueError("draft_sample_fwd needs a contiguous last dimension")
    _draft_sample_kernel[(n,)](
        x.logits, x.temperature, x.top_p, x.top_k, x.min_p, x.noise, token, cand_ids, cand_q, q_tok,
        x.logits.shape[1], x.logits.stride(0), x.noise.stride(0), cand_ids.stride(0), cand_q.stride(0),
        GREEDY_EPS_C=GREEDY_EPS, DELTA_BASE_C=DELTA_BASE, LADDER_C=LADDER, C=c,
        BLOCK_C=triton.next_power_of_2(c), BLOCK_V=block_v, num_warps=num_warps,
    )  # fmt: skip


def draft_sample_ref(x: DraftSampleInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain-torch reference: returns (token, cand_ids, cand_q, q_tok) as the kernel writes them."""
    n, vocab = x.logits.shape
    c, dev = x.num_slots, x.logits.device
    greedy = (x.temperature < GREEDY_EPS) | (x.top_k == 1)
    inv_t = 1.0 / torch.where(greedy, 1.0, x.temperature.float())
    z = x.logits.float() * inv_t[:, None]
    m, arg = z.max(dim=-1)
    lse = torch.logsumexp(z, dim=-1)
    cut = m[:, None] - DELTA_BASE * torch.exp2(torch.arange(LADDER, device=dev, dtype=torch.float32) * 0.5)
    counts = (z[:, :, None] >= cut[:, None, :]).sum(dim=1)
    rung = ((counts <= c).sum(dim=1) - 1).clamp(min=0)
    take = z >= cut.gather(1, rung[:, None])
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
