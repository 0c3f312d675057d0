"""The sampled verify's acceptance, fused: exact rejection sampling against the target rows.

SGLang's logits rows of one verify are [bs * (k + 1), V]. Stock-exact acceptance needs the target
distribution p of every row (``kernels/target_filter.py`` in one kernel when every request's top_k
is small, else ``softmax_t_fwd`` below and SGLang's renorm kernels) and then, per request, the
accepted prefix of the drafts and one token drawn from the residual max(0, p - q) at the first
rejection (or from p after the last draft). In plain torch the last part
(``spec/rejection.rejection_sample``, the reference) costs ~1.5 ms at batch 256 x 49K tokens on an
H100, mostly in vocabulary-wide temporaries. Here:

``softmax_t_fwd``: probs = softmax(logits / T_row), one program per row, two reads and one write;
    the first stage of the renorm path (batches with top-p alone or a large top_k).
``rejection_fwd``: one program per request; the accept test reads k probabilities; the residual
    differs from p only on the C candidate ids of the rejected draft's record, so it is written into
    the final row in place (``target_p`` is consumed), and the draw reads that row twice (its total
    mass, then the inverse CDF at u * total). A per-element match against the C ids instead costs
    4.6 ms at batch 256 x 49K on an H100 (measured), six times the torch reference.

Semantics are the reference's: draft j is accepted iff coin_j * q_tok_j < p_j(token_j) and j <
num_drafts (one count for the batch, or each request's own from a [bs] tensor the kernel reads on
the device), the accepted prefix ends at the first failure; the drawn token is the first id whose
cumulative residual mass exceeds final_coin * total (the last id with mass if rounding leaves none),
where the residual is p minus min(p, q) on the record's candidates (none past the request's last
draft) and p itself when nothing is left (p == q). Shape-static and sync-free (CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _softmax_t_kernel(Logits, Temperature, Probs, vocab, stride_l, stride_p, repeats, BLOCK_V: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    inv_t = 1.0 / tl.load(Temperature + row // repeats).to(tl.float32)
    offs = tl.arange(0, BLOCK_V)
    m = -3.0e38  # finite: a block of -inf logits (a grammar mask) must not make exp(-inf - -inf)
    s = 0.0
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs
        z = tl.load(Logits + row * stride_l + idx, mask=idx < vocab, other=-float("inf")).to(tl.float32) * inv_t
        new_m = tl.maximum(m, tl.max(z, axis=0))
        s = s * tl.exp(m - new_m) + tl.sum(tl.exp(z - new_m), axis=0)
        m = new_m
    inv_s = 1.0 / s
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs
        z = tl.load(Logits + row * stride_l + idx, mask=idx < vocab, other=-float("inf")).to(tl.float32) * inv_t
        tl.store(Probs + row * stride_p + idx, tl.exp(z - m) * inv_s, mask=idx < vocab)


def softmax_t_fwd(logits: torch.Tensor, temperature: torch.Tensor, repeats: int = 1) -> torch.Tensor:
    """[n, V] float32 softmax(logits / T) where row i uses temperature[i // repeats] (T > 0)."""
    n, vocab = logits.shape
    if repeats < 1 or n % repeats or temperature.shape != (n // repeats,) or logits.stride(-1) != 1:
        raise ValueError(f"logits [n, V] contiguous rows and temperature [n / repeats], got {tuple(logits.shape)}, "
                         f"{tuple(temperature.shape)}, repeats {repeats}")  # fmt: skip
    probs = torch.empty((n, vocab), dtype=torch.float32, device=logits.device)
    if n:
        _softmax_t_kernel[(n,)](logits, temperature, probs, vocab, logits.stride(0), probs.stride(0), repeats, BLOCK_V=2048)
    return probs


def softmax_t_ref(logits: torch.Tensor, temperature: torch.Tensor, repeats: int = 1) -> torch.Tensor:
    return torch.softmax(logits.float() / temperature.float().repeat_interleave(repeats)[:, None], dim=-1)


@triton.jit
def _rejection_kernel(
    P,
    Tokens,
    Cand_ids,
    Cand_q,
    Q_tok,
    Coins,
    Final_coins,
    Emitted,
    Num_accepted,
    vocab,
    Num_drafts,
    stride_n,
    stride_pb,
    stride_pj,
    stride_tb,
    stride_cb,
    stride_cj,
    stride_db,
    stride_dj,
    stride_qb,
    stride_qj,
    stride_ob,
    stride_oj,
    stride_f,
    stride_eb,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    C: tl.constexpr,
    BLOCK_C: tl.constexpr,
    BLOCK_V: tl.constexpr,
    PER_ROW: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    # PER_ROW: Num_drafts points at each request's count; else it is the batch's count itself.
    if PER_ROW:
        num_drafts = tl.load(Num_drafts + b * stride_n)
    else:
        num_drafts = Num_drafts
    offs_k = tl.arange(0, BLOCK_K)
    in_k = offs_k < K
    tok = tl.load(Tokens + b * stride_tb + offs_k, mask=in_k, other=0)
    q_tok = tl.load(Q_tok + b * stride_qb + offs_k * stride_qj, mask=in_k, other=1.0)
    coin = tl.load(Coins + b * stride_ob + offs_k * stride_oj, mask=in_k, other=1.0)
    p_tok = tl.load(P + b * stride_pb + offs_k * stride_pj + tok, mask=in_k, other=0.0)
    ok = (coin * q_tok < p_tok) & (offs_k < num_drafts)
    n_acc = tl.min(tl.where(in_k & ~ok, offs_k, K), axis=0)

    # The rejected draft's record (nothing to subtract past the last draft).
    offs_c = tl.arange(0, BLOCK_C)
    j = tl.minimum(n_acc, K - 1)
    sub = (offs_c < C) & (n_acc < num_drafts)
    ids = tl.load(Cand_ids + b * stride_cb + j * stride_cj + offs_c, mask=sub, other=0)
    q = tl.load(Cand_q + b * stride_db + j * stride_dj + offs_c, mask=sub, other=0.0)
    row = P + b * stride_pb + n_acc * stride_pj
    overlap = tl.where(sub, tl.minimum(tl.load(row + ids, mask=sub, other=0.0), q), 0.0)

    offs_v = tl.arange(0, BLOCK_V)
    total_p = 0.0
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs_v
        total_p += tl.sum(tl.load(row + idx, mask=idx < vocab, other=0.0), axis=0)
    residual_mass = total_p - tl.sum(overlap, axis=0)
    # Rounding can leave no residual mass only when p == q; p itself is then exact.
    has_residual = residual_mass > 0.0
    total = tl.where(has_residual, residual_mass, total_p)
    # The residual in place: the row is this request's own scratch copy of p and nothing reads it
    # after this kernel. Only slots with q > 0 write (their ids are distinct; unused slots repeat ids).
    write = tl.where(has_residual, sub & (q > 0.0), False)
    tl.store(row + ids, tl.load(row + ids, mask=sub, other=0.0) - overlap, mask=write)
    tl.debug_barrier()
    target = tl.load(Final_coins + b * stride_f).to(tl.float32) * total

    cum = 0.0
    drawn = -1
    last = -1
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs_v
        r = tl.load(row + idx, mask=idx < vocab, other=0.0)
        c = cum + tl.cumsum(r, axis=0)
        first = tl.min(tl.where((c > target) & (r > 0.0), idx, vocab), axis=0)
        drawn = tl.where((drawn < 0) & (first < vocab), first, drawn)
        last = tl.maximum(last, tl.max(tl.where(r > 0.0, idx, -1), axis=0))
        cum += tl.sum(r, axis=0)
    drawn = tl.where(drawn < 0, last, drawn)

    offs_e = tl.arange(0, BLOCK_K * 2)
    draft = tl.load(Tokens + b * stride_tb + offs_e, mask=offs_e < tl.minimum(n_acc, K), other=0)
    out = tl.where(offs_e < n_acc, draft, tl.where(offs_e == n_acc, drawn.to(tl.int64), -1))
    tl.store(Emitted + b * stride_eb + offs_e, out, mask=offs_e <= K)
    tl.store(Num_accepted + b, n_acc.to(tl.int64))


def rejection_fwd(
    target_p: torch.Tensor,
    tokens: torch.Tensor,
    cand_ids: torch.Tensor,
    cand_q: torch.Tensor,
    q_tok: torch.Tensor,
    num_drafts: int | torch.Tensor,
    coins: torch.Tensor,
    final_coins: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rejection_sample`` of ``spec/rejection.py`` (same arguments, the record unpacked): target_p
    [bs, k+1, V] float32 (last dim contiguous; overwritten: each request's final row becomes its
    residual); tokens [bs, k] int64; cand_ids / cand_q [bs, k, C]; q_tok [bs, k]; num_drafts: an
    int for the batch or a [bs] int64 / int32 tensor on the same device, values in 0..k (as
    ``DraftRecord.num_drafts``; unchecked, to stay sync-free); coins [bs, k]; final_coins [bs].
    Returns (emitted [bs, k+1] int64, num_accepted [bs])."""
    bs, k1, vocab = target_p.shape
    k, c = k1 - 1, cand_ids.shape[-1]
    if tokens.shape != (bs, k) or cand_ids.shape != (bs, k, c) or cand_q.shape != (bs, k, c):
        raise ValueError(f"record shapes {tuple(tokens.shape)}, {tuple(cand_ids.shape)} do not match target_p "
                         f"{tuple(target_p.shape)}")  # fmt: skip
    if k < 1 or any(t.stride(-1) != 1 for t in (target_p, tokens, cand_ids, cand_q)):
        raise ValueError("rejection_fwd needs k >= 1 and contiguous last dimensions")
    per_row = isinstance(num_drafts, torch.Tensor)
    if per_row and (num_drafts.shape != (bs,) or num_drafts.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"per-request num_drafts must be a [{bs}] int32 / int64 tensor, got "
                         f"{tuple(num_drafts.shape)} {num_drafts.dtype}")  # fmt: skip
    emitted = torch.empty((bs, k1), dtype=torch.int64, device=target_p.device)
    num_accepted = torch.empty(bs, dtype=torch.int64, device=target_p.device)
    if bs:
        _rejection_kernel[(bs,)](
            target_p, tokens, cand_ids, cand_q, q_tok, coins, final_coins, emitted, num_accepted, vocab, num_drafts,
            num_drafts.stride(0) if per_row else 0,
            target_p.stride(0), target_p.stride(1), tokens.stride(0), cand_ids.stride(0), cand_ids.stride(1),
            cand_q.stride(0), cand_q.stride(1),
            q_tok.stride(0), q_tok.stride(1), coins.stride(0), coins.stride(1), final_coins.stride(0), emitted.stride(0),
            K=k, BLOCK_K=triton.next_power_of_2(k), C=c, BLOCK_C=triton.next_power_of_2(c), BLOCK_V=2048,
            PER_ROW=per_row,
        )  # fmt: skip
    return emitted, num_accepted
