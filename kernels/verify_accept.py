"""The sampled verify's acceptance, fused: exact rejection sampling against compact target rows.

Per request (one program each): the accept test reads p at its k drafts, then one token is drawn
from the residual max(0, p - q) at the first rejection (or from p after the last draft). The target
rows come from ``kernels/target_filter.py`` (``TargetRows``): on a compact row p lives on its C
candidates, so p at a draft is a C-wide compare and the residual draw an inverse CDF over the C
candidates (in id order) with q matched from the draft record's C ids ([C, C] compare): nothing
vocabulary-wide. A row given in full (no filter, a nucleus wider than C) is read from ``full``: the
residual differs from p only on the record's ids, written into that row in place (``full`` is
consumed), and the draw reads the row twice (its total mass, then the inverse CDF).
``sampling/rejection.rejection_sample`` is the reference.

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

from .target_filter import TargetRows


@triton.jit
def _draw_compact(Cand_ids, Cand_p, row, ids_q, q, sub, target_u, C: tl.constexpr, BLOCK_C: tl.constexpr):
    offs = tl.arange(0, BLOCK_C)
    in_c = offs < C
    tids = tl.load(Cand_ids + row * C + offs, mask=in_c, other=-1)
    tp = tl.load(Cand_p + row * C + offs, mask=in_c, other=0.0)
    q_at = tl.sum(tl.where((tids[:, None] == ids_q[None, :]) & sub[None, :], q[None, :], 0.0), axis=1)
    res = tp - tl.minimum(tp, q_at)
    total = tl.sum(res, axis=0)
    # Rounding can leave no residual mass only when p == q; p itself is then exact.
    has_residual = total > 0.0
    res = tl.where(has_residual, res, tp)
    total = tl.where(has_residual, total, tl.sum(tp, axis=0))
    cum = tl.cumsum(res, axis=0)
    first = tl.min(tl.where((cum > target_u * total) & (res > 0.0), offs, BLOCK_C), axis=0)
    last = tl.max(tl.where(res > 0.0, offs, -1), axis=0)
    slot = tl.where(first < BLOCK_C, first, last)
    return tl.sum(tl.where(offs == slot, tids, 0), axis=0)


@triton.jit
def _draw_full(row_p, vocab, ids_q, q, sub, target_u, BLOCK_V: tl.constexpr):
    overlap = tl.where(sub, tl.minimum(tl.load(row_p + ids_q, mask=sub, other=0.0), q), 0.0)
    offs_v = tl.arange(0, BLOCK_V)
    total_p = 0.0
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs_v
        total_p += tl.sum(tl.load(row_p + idx, mask=idx < vocab, other=0.0), axis=0)
    residual_mass = total_p - tl.sum(overlap, axis=0)
    has_residual = residual_mass > 0.0
    total = tl.where(has_residual, residual_mass, total_p)
    # The residual in place: the row is consumed. Only slots with q > 0 write (their ids are
    # distinct; unused slots repeat ids).
    write = tl.where(has_residual, sub & (q > 0.0), False)
    tl.store(row_p + ids_q, tl.load(row_p + ids_q, mask=sub, other=0.0) - overlap, mask=write)
    tl.debug_barrier()
    target = target_u * total
    cum = 0.0
    drawn = -1
    last = -1
    for start in range(0, vocab, BLOCK_V):
        idx = start + offs_v
        r = tl.load(row_p + idx, mask=idx < vocab, other=0.0)
        c = cum + tl.cumsum(r, axis=0)
        first = tl.min(tl.where((c > target) & (r > 0.0), idx, vocab), axis=0)
        drawn = tl.where((drawn < 0) & (first < vocab), first, drawn)
        last = tl.maximum(last, tl.max(tl.where(r > 0.0, idx, -1), axis=0))
        cum += tl.sum(r, axis=0)
    return tl.where(drawn < 0, last, drawn)


@triton.jit
def _rejection_kernel(
    Cand_ids, Cand_p, Compact, Full, Tokens, Rec_ids, Rec_q, Q_tok, Coins, Final_coins, Emitted, Num_accepted,
    vocab, Num_drafts, stride_n, stride_f, stride_tb, stride_cb, stride_cj, stride_db, stride_dj,
    stride_qb, stride_qj, stride_ob, stride_oj, stride_fc, stride_eb,
    K: tl.constexpr, BLOCK_K: tl.constexpr, C: tl.constexpr, BLOCK_C: tl.constexpr,
    RC: tl.constexpr, BLOCK_RC: tl.constexpr, BLOCK_V: tl.constexpr, PER_ROW: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    # PER_ROW: Num_drafts points at each request's count; else it is the batch's count itself.
    if PER_ROW:
        num_drafts = tl.load(Num_drafts + b * stride_n)
    else:
        num_drafts = Num_drafts
    offs_k = tl.arange(0, BLOCK_K)
    in_k = offs_k < K
    rows = b * (K + 1) + offs_k
    tok = tl.load(Tokens + b * stride_tb + offs_k, mask=in_k, other=0)
    q_tok = tl.load(Q_tok + b * stride_qb + offs_k * stride_qj, mask=in_k, other=1.0)
    coin = tl.load(Coins + b * stride_ob + offs_k * stride_oj, mask=in_k, other=1.0)
    compact = tl.load(Compact + rows, mask=in_k, other=1)
    offs_c = tl.arange(0, BLOCK_C)
    cand = in_k[:, None] & (offs_c[None, :] < C)
    cids = tl.load(Cand_ids + rows[:, None] * C + offs_c[None, :], mask=cand, other=-1)
    cp = tl.load(Cand_p + rows[:, None] * C + offs_c[None, :], mask=cand, other=0.0)
    p_compact = tl.sum(tl.where(cids == tok[:, None], cp, 0.0), axis=1)
    p_full = tl.load(Full + rows * stride_f + tok, mask=in_k & (compact == 0), other=0.0)
    p_tok = tl.where(compact != 0, p_compact, p_full)
    ok = (coin * q_tok < p_tok) & (offs_k < num_drafts)
    n_acc = tl.min(tl.where(in_k & ~ok, offs_k, K), axis=0)

    # The rejected draft's record (nothing to subtract past the last draft).
    offs_r = tl.arange(0, BLOCK_RC)
    j = tl.minimum(n_acc, K - 1)
    sub = (offs_r < RC) & (n_acc < num_drafts)
    ids_q = tl.load(Rec_ids + b * stride_cb + j * stride_cj + offs_r, mask=sub, other=0)
    q = tl.load(Rec_q + b * stride_db + j * stride_dj + offs_r, mask=sub, other=0.0)
    row = b * (K + 1) + n_acc
    target_u = tl.load(Final_coins + b * stride_fc).to(tl.float32)
    if tl.load(Compact + row) != 0:
        drawn = _draw_compact(Cand_ids, Cand_p, row, ids_q, q, sub, target_u, C, BLOCK_C).to(tl.int64)
    else:
        drawn = _draw_full(Full + row * stride_f, vocab, ids_q, q, sub, target_u, BLOCK_V).to(tl.int64)

    offs_e = tl.arange(0, BLOCK_K * 2)
    draft = tl.load(Tokens + b * stride_tb + offs_e, mask=offs_e < tl.minimum(n_acc, K), other=0)
    out = tl.where(offs_e < n_acc, draft, tl.where(offs_e == n_acc, drawn, -1))
    tl.store(Emitted + b * stride_eb + offs_e, out, mask=offs_e <= K)
    tl.store(Num_accepted + b, n_acc.to(tl.int64))


def rejection_fwd(
    target: TargetRows,
    tokens: torch.Tensor,
    cand_ids: torch.Tensor,
    cand_q: torch.Tensor,
    q_tok: torch.Tensor,
    num_drafts: int | torch.Tensor,
    coins: torch.Tensor,
    final_coins: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rejection_sample`` of ``sampling/rejection.py`` (the record unpacked): target: the
    bs * (k + 1) rows of ``target_filter_fwd``, request-major (row b * (k + 1) + j scores draft j;
    its ``full`` is overwritten: a non-compact final row becomes its residual); tokens [bs, k] int64;
    cand_ids / cand_q [bs, k, C']; q_tok [bs, k]; num_drafts: an int for the batch or a [bs] int64 /
    int32 tensor on the same device, values in 0..k (as ``DraftRecord.num_drafts``; unchecked, to
    stay sync-free); coins [bs, k]; final_coins [bs]. Returns (emitted [bs, k+1] int64,
    num_accepted [bs])."""
    bs, k = tokens.shape
    rc = cand_ids.shape[-1]
    n, c = target.cand_ids.shape
    vocab = target.full.shape[-1]
    if n != bs * (k + 1) or cand_ids.shape != (bs, k, rc) or cand_q.shape != (bs, k, rc):
        raise ValueError(f"record shapes {tuple(tokens.shape)}, {tuple(cand_ids.shape)} do not match {n} target rows")
    if k < 1 or any(t.stride(-1) != 1 for t in (target.full, tokens, cand_ids, cand_q)):
        raise ValueError("rejection_fwd needs k >= 1 and contiguous last dimensions")
    per_row = isinstance(num_drafts, torch.Tensor)
    if per_row and (num_drafts.shape != (bs,) or num_drafts.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"per-request num_drafts must be a [{bs}] int32 / int64 tensor, got "
                         f"{tuple(num_drafts.shape)} {num_drafts.dtype}")  # fmt: skip
    emitted = torch.empty((bs, k + 1), dtype=torch.int64, device=tokens.device)
    num_accepted = torch.empty(bs, dtype=torch.int64, device=tokens.device)
    if bs:
        _rejection_kernel[(bs,)](
            target.cand_ids, target.cand_p, target.compact, target.full, tokens, cand_ids, cand_q, q_tok, coins,
            final_coins, emitted, num_accepted, vocab, num_drafts, num_drafts.stride(0) if per_row else 0,
            target.full.stride(0), tokens.stride(0), cand_ids.stride(0), cand_ids.stride(1),
            cand_q.stride(0), cand_q.stride(1), q_tok.stride(0), q_tok.stride(1), coins.stride(0), coins.stride(1),
            final_coins.stride(0), emitted.stride(0),
            K=k, BLOCK_K=triton.next_power_of_2(k), C=c, BLOCK_C=triton.next_power_of_2(c),
            RC=rc, BLOCK_RC=triton.next_power_of_2(rc), BLOCK_V=2048, PER_ROW=per_row,
        )  # fmt: skip
    return emitted, num_accepted
