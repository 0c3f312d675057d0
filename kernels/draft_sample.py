"""Draft-token sampling over a fixed candidate set, with a compact record of the proposal.

A PILLAR draft token may come from *any* proposal distribution q as long as the verify knows q
exactly: rejection sampling then returns the target's distribution whatever q is. So the draft
samples from q = SGLang's temperature / top-k / top-p / min-p filter restricted to the row's C
largest logits (C static, e.g. 64), and records q on those C candidates only. That record is
[C] ids + [C] probabilities per draft instead of a full-vocabulary fp32 row (k x V x 4 bytes per
request: 1.24 GB at batch 256, k = 8 and Qwen3's 151,936 tokens), and no full-vocabulary sort is
needed: the caller takes the candidates with ``torch.topk`` (a radix select), this kernel does
the rest in one read of the logits row (the softmax normaliser at 1/T, so top-p and min-p are
judged against the row's true mass) plus O(C) work.

Semantics per row (candidates sorted by descending logit, as ``torch.topk`` returns them):
    greedy (T < GREEDY_EPS or top_k == 1): q = one-hot at candidate 0;
    else p_c = exp(l_c / T - logsumexp(l / T)), and candidate c is kept iff
        rank c < top_k (top_k <= 0 or >= V: no limit)
        and the mass of the candidates before it <= top_p (top_p >= 1: no limit)
        and p_c >= min_p * p_0;
    q = kept p renormalised over the kept candidates (candidate 0 is always kept);
    the token is argmax_c q_c / E_c with E_c ~ Exp(1) from ``noise`` (an exact draw from q).
Outputs: token [n] int64, cand_q [n, C] float32 (0 where dropped), q_tok [n] float32 = q of the
token. Everything is shape-static and sync-free, so it runs inside the draft CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# SGLang's cut-off below which a temperature means greedy (sampling_params._SAMPLING_EPS).
GREEDY_EPS = 1e-6


@triton.jit
def _draft_sample_kernel(
    Logits,
    Cand_logits,
    Cand_ids,
    Temperature,
    Top_p,
    Top_k,
    Min_p,
    Noise,
    Token,
    Cand_q,
    Q_tok,
    vocab,
    stride_l,
    stride_cl,
    stride_ci,
    stride_n,
    stride_q,
    GREEDY_EPS_C: tl.constexpr,
    C: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    temp = tl.load(Temperature + row).to(tl.float32)
    top_k = tl.load(Top_k + row).to(tl.int32)
    greedy = (temp < GREEDY_EPS_C) | (top_k == 1)
    inv_t = 1.0 / tl.where(greedy, 1.0, temp)

    offs_c = tl.arange(0, BLOCK_C)
    mask_c = offs_c < C
    cand_l = tl.load(Cand_logits + row * stride_cl + offs_c, mask=mask_c, other=float("-inf")).to(tl.float32)
    z_c = cand_l * inv_t
    # The largest logit is candidate 0, so the online softmax needs no running max.
    m = tl.max(z_c, axis=0)

    if greedy:
        q = tl.where(offs_c == 0, 1.0, 0.0)
    else:
        denom = 0.0
        offs_v = tl.arange(0, BLOCK_V)
        for start in range(0, vocab, BLOCK_V):
            idx = start + offs_v
            lv = tl.load(Logits + row * stride_l + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32)
            denom += tl.sum(tl.exp(lv * inv_t - m), axis=0)
        p = tl.where(mask_c, tl.exp(z_c - m) / denom, 0.0)
        mass_before = tl.cumsum(p, axis=0) - p
        top_p = tl.load(Top_p + row).to(tl.float32)
        min_p = tl.load(Min_p + row).to(tl.float32)
        k_eff = tl.where((top_k <= 0) | (top_k >= vocab), vocab, top_k)
        p0 = tl.max(p, axis=0)
        in_top_p = mass_before <= tl.where(top_p >= 1.0, float("inf"), top_p)
        keep = (offs_c < k_eff) & in_top_p & (p >= min_p * p0)
        q = tl.where(mask_c & (keep | (offs_c == 0)), p, 0.0)
        q = q / tl.sum(q, axis=0)

    noise = tl.load(Noise + row * stride_n + offs_c, mask=mask_c, other=1.0).to(tl.float32)
    race = tl.where(mask_c, q / tl.maximum(noise, 1.1754943508222875e-38), -1.0)
    pick = tl.argmax(race, axis=0)
    tok = tl.load(Cand_ids + row * stride_ci + pick).to(tl.int64)
    q_pick = tl.sum(tl.where(offs_c == pick, q, 0.0), axis=0)
    tl.store(Cand_q + row * stride_q + offs_c, q, mask=mask_c)
    tl.store(Token + row, tok)
    tl.store(Q_tok + row, q_pick)


@dataclass(frozen=True)
class DraftSampleInputs:
    """One draft step's sampling inputs, n rows.

    logits [n, V] (last dim contiguous); cand_logits / cand_ids [n, C]: ``torch.topk(logits, C)``
    (sorted by descending logit, distinct ids); temperature, top_p, min_p [n] float32; top_k [n]
    int; noise [n, C] Exp(1) draws. Shapes are checked at construction (metadata only, no sync).
    """

    logits: torch.Tensor
    cand_logits: torch.Tensor
    cand_ids: torch.Tensor
    temperature: torch.Tensor
    top_p: torch.Tensor
    top_k: torch.Tensor
    min_p: torch.Tensor
    noise: torch.Tensor

    def __post_init__(self) -> None:
        n, c = self.cand_ids.shape
        if self.logits.dim() != 2 or self.logits.shape[0] != n:
            raise ValueError(f"logits must be [{n}, V], got {tuple(self.logits.shape)}")
        if tuple(self.cand_logits.shape) != (n, c) or tuple(self.noise.shape) != (n, c):
            raise ValueError("cand_logits and noise must have cand_ids' shape")
        for name in ("temperature", "top_p", "top_k", "min_p"):
            t = getattr(self, name)
            if tuple(t.shape) != (n,):
                raise ValueError(f"{name} must have shape ({n},), got {tuple(t.shape)}")
        if self.top_k.is_floating_point():
            raise ValueError("top_k must be an integer tensor")


def draft_sample_fwd(x: DraftSampleInputs, token: torch.Tensor, cand_q: torch.Tensor, q_tok: torch.Tensor) -> None:
    """Fill token [n] int64, cand_q [n, C] float32, q_tok [n] float32 (see the module docstring)."""
    n, c = x.cand_ids.shape
    if n == 0:
        return
    for t in (x.logits, x.cand_logits, x.cand_ids, x.noise, cand_q):
        if t.stride(-1) != 1:
            raise ValueError("draft_sample_fwd needs a contiguous last dimension")
    _draft_sample_kernel[(n,)](
        x.logits, x.cand_logits, x.cand_ids, x.temperature, x.top_p, x.top_k, x.min_p, x.noise,
        token, cand_q, q_tok,
        x.logits.shape[1], x.logits.stride(0), x.cand_logits.stride(0), x.cand_ids.stride(0), x.noise.stride(0),
        cand_q.stride(0),
        GREEDY_EPS_C=GREEDY_EPS, C=c, BLOCK_C=triton.next_power_of_2(c), BLOCK_V=4096,
    )  # fmt: skip


def draft_sample_ref(x: DraftSampleInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain-torch reference: returns (token, cand_q, q_tok) as the kernel writes them."""
    vocab, c = x.logits.shape[1], x.cand_ids.shape[1]
    greedy = (x.temperature < GREEDY_EPS) | (x.top_k == 1)
    inv_t = 1.0 / torch.where(greedy, 1.0, x.temperature.float())
    lse = torch.logsumexp(x.logits.float() * inv_t[:, None], dim=-1)
    p = torch.exp(x.cand_logits.float() * inv_t[:, None] - lse[:, None])
    rank = torch.arange(c, device=x.logits.device)
    k_eff = torch.where((x.top_k <= 0) | (x.top_k >= vocab), vocab, x.top_k.long())
    keep = rank[None, :] < k_eff[:, None]
    keep &= ((p.cumsum(-1) - p) <= x.top_p[:, None]) | (x.top_p[:, None] >= 1.0)
    keep &= p >= x.min_p[:, None] * p[:, :1]
    keep[:, 0] = True
    q = torch.where(keep, p, 0.0)
    q = q / q.sum(-1, keepdim=True)
    one_hot = (rank == 0).float().expand_as(q)
    q = torch.where(greedy[:, None], one_hot, q)
    pick = (q / x.noise.clamp(min=torch.finfo(torch.float32).tiny)).argmax(-1)
    token = x.cand_ids.gather(1, pick[:, None]).squeeze(1).long()
    return token, q, q.gather(1, pick[:, None]).squeeze(1)
