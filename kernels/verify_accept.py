"""The sampled verify's acceptance: exact rejection sampling against the target rows' thresholds.

Per request: the accept test reads p at its k drafts, then one token is drawn from the residual
max(0, p - q) at the first rejection (or from p after the last draft). The target rows come from
``kernels/target_filter.py`` (``TargetRows``): p at any token is one logit read and the row's threshold,
so the accept test reads k logits. The draw reads the row's kept tokens: from the row's list when it
holds every kept token (peaked rows: a few hundred tokens at most), else vocabulary-parallel (one
program per (request, chunk) sums the chunk's residual mass, then one per request picks the chunk and
scans it: ``residual_draw``). ``sampling/rejection.rejection_sample`` is the reference.

Semantics are the reference's: draft j is accepted iff coin_j * q_tok_j < p_j(token_j) and j <
num_drafts (one count for the batch, or each request's own from a [bs] tensor the kernel reads on
the device), the accepted prefix ends at the first failure; the drawn token is the first id whose
cumulative residual mass exceeds final_coin * total (the last id with mass if rounding leaves none),
where the residual is p minus min(p, q) on the record's candidates (none past the request's last
draft) and p itself when nothing is left (p == q). Three launches, shape-static and sync-free
(CUDA-graph safe).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .logit_bins import CHUNK, FULL, GREEDY_EPS, inv_temperature, load_z
from .residual_draw import draft_record, draw_mass_kernel, draw_pick_kernel, num_drafts_at, record_overlap, scan_step
from .target_filter import TargetRows, kept_p, load_desc


@triton.jit
def _draw_list(
    base_l,
    Ids,
    n_items,
    vocab,
    inv_t,
    m,
    z_star,
    scale,
    tie_end,
    ids_q,
    q,
    sub,
    ids_row,
    q_row,
    target_u,
    RC: tl.constexpr,
    BLOCK_L: tl.constexpr,
):
    """The residual draw over a row's list (ascending ids) holding every kept token."""
    offs = tl.arange(0, BLOCK_L)
    total_p = 0.0
    total_r = 0.0
    for start in range(0, n_items, BLOCK_L):
        live = start + offs < n_items
        idx = tl.load(Ids + start + offs, mask=live, other=vocab)
        p = kept_p(load_z(base_l, idx, vocab, inv_t), idx, m, z_star, scale, tie_end)
        total_p += tl.sum(p, axis=0)
        total_r += tl.sum(p - record_overlap(idx, p, ids_q, q, sub, ids_row, q_row, RC), axis=0)
    # Rounding can leave no residual mass only when p == q; p itself is then exact.
    has_residual = total_r > 0.0
    target = target_u * tl.where(has_residual, total_r, total_p)
    cum = 0.0
    drawn = -1
    last = -1
    for start in range(0, n_items, BLOCK_L):
        idx = tl.load(Ids + start + offs, mask=start + offs < n_items, other=vocab)
        cum, drawn, last = scan_step(
            base_l,
            idx,
            vocab,
            inv_t,
            m,
            z_star,
            scale,
            tie_end,
            ids_q,
            q,
            sub,
            ids_row,
            q_row,
            has_residual,
            target,
            cum,
            drawn,
            last,
            RC,
        )
    return tl.where(drawn < 0, last, drawn)


@triton.jit
def _accept_kernel(
    Logits,
    Temperature,
    Desc,
    Path,
    ListIds,
    ListN,
    Tokens,
    Rec_ids,
    Rec_q,
    Q_tok,
    Coins,
    Final_coins,
    Emitted,
    Num_accepted,
    Pending,
    vocab,
    stride_l,
    list_cap,
    Num_drafts,
    stride_n,
    stride_tb,
    stride_cb,
    stride_cj,
    stride_db,
    stride_dj,
    stride_qb,
    stride_qj,
    stride_ob,
    stride_oj,
    stride_fc,
    stride_eb,
    GREEDY_EPS_C: tl.constexpr,
    K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    RC: tl.constexpr,
    BLOCK_RC: tl.constexpr,
    BLOCK_L: tl.constexpr,
    PER_ROW: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    num_drafts = num_drafts_at(Num_drafts, b, stride_n, PER_ROW)
    inv_t = inv_temperature(Temperature, b, GREEDY_EPS_C)
    offs_k = tl.arange(0, BLOCK_K)
    in_k = offs_k < K
    rows = b * (K + 1) + offs_k
    tok = tl.load(Tokens + b * stride_tb + offs_k, mask=in_k, other=0)
    q_tok = tl.load(Q_tok + b * stride_qb + offs_k * stride_qj, mask=in_k, other=1.0)
    coin = tl.load(Coins + b * stride_ob + offs_k * stride_oj, mask=in_k, other=1.0)
    z_tok = tl.load(Logits + rows * stride_l + tok, mask=in_k, other=-float("inf")).to(tl.float32) * inv_t
    d = Desc + rows * 4
    p_tok = kept_p(
        z_tok,
        tok,
        tl.load(d, mask=in_k, other=0.0),
        tl.load(d + 1, mask=in_k, other=0.0),
        tl.load(d + 2, mask=in_k, other=0.0),
        tl.load(d + 3, mask=in_k, other=0.0).to(tl.int32),
    )
    ok = (coin * q_tok < p_tok) & (offs_k < num_drafts)
    n_acc = tl.min(tl.where(in_k & ~ok, offs_k, K), axis=0)
    row = b * (K + 1) + n_acc
    drawn = tl.full([], -1, tl.int64)
    if tl.load(Path + row) == FULL:
        ids_q, q, sub, ids_row, q_row = draft_record(
            Rec_ids, Rec_q, b, n_acc, num_drafts, stride_cb, stride_cj, stride_db, stride_dj, K, RC, BLOCK_RC
        )
        m, z_star, scale, tie_end = load_desc(Desc, row)
        target_u = tl.load(Final_coins + b * stride_fc).to(tl.float32)
        drawn = _draw_list(
            Logits + row * stride_l,
            ListIds + row * list_cap,
            tl.load(ListN + row),
            vocab,
            inv_t,
            m,
            z_star,
            scale,
            tie_end,
            ids_q,
            q,
            sub,
            ids_row,
            q_row,
            target_u,
            RC,
            BLOCK_L,
        ).to(tl.int64)
        tl.store(Pending + b, -1)
    else:
        tl.store(Pending + b, row)  # the vocabulary-parallel draw fills slot n_acc
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
    chunk: int = CHUNK,
    block_v: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``rejection_sample`` of ``sampling/rejection.py`` (the record unpacked): target: the
    bs * (k + 1) rows of ``target_filter_fwd`` at repeats k + 1, request-major (row b * (k + 1) + j
    scores draft j); tokens [bs, k] int64; cand_ids / cand_q [bs, k, C']; q_tok [bs, k]; num_drafts:
    an int for the batch or a [bs] int64 / int32 tensor on the same device, values in 0..k (as
    ``DraftRecord.num_drafts``; unchecked, to stay sync-free); coins [bs, k]; final_coins [bs].
    ``chunk`` (tokens per program of the vocabulary-parallel draw, a multiple of ``block_v``) and ``block_v``
    (its tile) are launch parameters only.
    Returns (emitted [bs, k+1] int64, num_accepted [bs])."""
    bs, k = tokens.shape
    rc = cand_ids.shape[-1]
    n, vocab = target.logits.shape
    if n != bs * (k + 1) or target.repeats != k + 1 or cand_ids.shape != (bs, k, rc) or cand_q.shape != (bs, k, rc):
        raise ValueError(
            f"record shapes {tuple(tokens.shape)}, {tuple(cand_ids.shape)} do not match {n} target rows "
            f"at repeats {target.repeats}"
        )
    if k < 1 or any(t.stride(-1) != 1 for t in (target.logits, tokens, cand_ids, cand_q)):
        raise ValueError("rejection_fwd needs k >= 1 and contiguous last dimensions")
    if chunk % block_v:
        raise ValueError(f"chunk {chunk} must be a multiple of block_v {block_v}")
    per_row = isinstance(num_drafts, torch.Tensor)
    if per_row and (num_drafts.shape != (bs,) or num_drafts.dtype not in (torch.int32, torch.int64)):
        raise ValueError(
            f"per-request num_drafts must be a [{bs}] int32 / int64 tensor, got "
            f"{tuple(num_drafts.shape)} {num_drafts.dtype}"
        )
    dev = tokens.device
    emitted = torch.empty((bs, k + 1), dtype=torch.int64, device=dev)
    num_accepted = torch.empty(bs, dtype=torch.int64, device=dev)
    if bs == 0:
        return emitted, num_accepted
    n_chunks = triton.cdiv(vocab, chunk)
    pending = torch.empty(bs, dtype=torch.int64, device=dev)
    chunk_mass = torch.empty((bs, n_chunks, 2), dtype=torch.float32, device=dev)
    drafts = (num_drafts, num_drafts.stride(0) if per_row else 0)
    record = (cand_ids.stride(0), cand_ids.stride(1), cand_q.stride(0), cand_q.stride(1))
    common = {"GREEDY_EPS_C": GREEDY_EPS, "K": k, "RC": rc, "BLOCK_RC": triton.next_power_of_2(rc), "PER_ROW": per_row}
    lg = (target.logits, target.temperature, target.desc)
    _accept_kernel[(bs,)](
        *lg,
        target.path,
        target.list_ids,
        target.list_n,
        tokens,
        cand_ids,
        cand_q,
        q_tok,
        coins,
        final_coins,
        emitted,
        num_accepted,
        pending,
        vocab,
        target.logits.stride(0),
        target.list_ids.shape[1],
        *drafts,
        tokens.stride(0),
        *record,
        q_tok.stride(0),
        q_tok.stride(1),
        coins.stride(0),
        coins.stride(1),
        final_coins.stride(0),
        emitted.stride(0),
        BLOCK_K=triton.next_power_of_2(k),
        BLOCK_L=min(64, block_v),
        **common,
    )
    draw_mass_kernel[(bs, n_chunks)](
        *lg,
        pending,
        num_accepted,
        cand_ids,
        cand_q,
        chunk_mass,
        vocab,
        target.logits.stride(0),
        n_chunks,
        *drafts,
        *record,
        CHUNK_C=chunk,
        BLOCK_S=block_v,
        **common,
    )
    draw_pick_kernel[(bs,)](
        *lg,
        pending,
        num_accepted,
        cand_ids,
        cand_q,
        final_coins,
        chunk_mass,
        emitted,
        vocab,
        target.logits.stride(0),
        n_chunks,
        *drafts,
        *record,
        final_coins.stride(0),
        emitted.stride(0),
        NCH=triton.next_power_of_2(n_chunks),
        CHUNK_C=chunk,
        BLOCK_S=block_v,
        **common,
    )
    return emitted, num_accepted
