"""The sampling kernels vs their references: the draft sampler over its top candidates, and rejection sampling
against target rows (dense and compact, one draft count for the batch or one per request).

Without a GPU the kernels run in Triton's CPU interpreter (see triton_env.py); with CUDA they run compiled.
Outputs are pre-filled with poison so entries a kernel fails to write show up as mismatches.
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.draft_sample import DraftSampleInputs, draft_sample_fwd, draft_sample_ref
from sglang_sparsespec.kernels.logit_bins import RowPath
from sglang_sparsespec.kernels.target_filter import TargetRows, target_filter_fwd
from sglang_sparsespec.kernels.verify_accept import rejection_fwd
from target_rows import rows_from_probs
from triton_env import DEVICE

from sglang_sparsespec.sampling.rejection import DraftRecord, rejection_sample
from kernel_cases import POISON


@pytest.mark.parametrize("logit_dtype", [torch.float32, torch.bfloat16])
def test_draft_sample_matches_reference(logit_dtype):
    gen = torch.Generator().manual_seed(3)  # on the CPU: the same cases on either device
    vocab, c = 5000, 24  # vocab spans several 1024-wide blocks
    params = [  # (temperature, top_p, top_k, min_p), every filter and greedy encoding
        (1.0, 0.8, 0, 0.001),
        (1.0, 1.0, -1, 0.0),
        (0.6, 0.95, -1, 0.0),
        (1.3, 1.0, 3, 0.0),
        (0.0, 0.9, 20, 0.0),
        (1.0, 1.0, 1, 0.0),
        (2.0, 0.99, vocab, 0.3),
        (0.9, 1.0, 30, 1.0),
        (50.0, 1.0, -1, 0.0),
    ]
    temp, top_p, top_k, min_p = (torch.tensor(col, device=DEVICE) for col in zip(*params))
    top_k = top_k.to(torch.int32)
    n = len(params)
    # A peaked head (spread over the row) so that top-p and min-p cut inside the candidates; the
    # last row (T = 50) has more than C tokens tied at its max: its bin 0 alone overflows the list.
    logits = torch.randn(n, vocab, generator=gen) * 2
    head = torch.randperm(vocab, generator=gen)[:c]
    logits[:, head] += torch.linspace(14, 6, c)
    ties = torch.randperm(vocab, generator=gen)[: c + 16]
    logits[8, ties] = logits[8].max() + 1.0
    logits = logits.to(DEVICE, logit_dtype)
    noise = torch.empty((n, c)).exponential_(generator=gen).to(DEVICE)
    x = DraftSampleInputs(logits, temp, top_p, top_k, min_p, noise)
    token = torch.full((n,), POISON, dtype=torch.int64, device=DEVICE)
    cand_ids = torch.full((n, c), POISON, dtype=torch.int64, device=DEVICE)
    cand_q = torch.full((n, c), float("nan"), device=DEVICE)
    q_tok = torch.full((n,), float("nan"), device=DEVICE)
    draft_sample_fwd(x, token, cand_ids, cand_q, q_tok)
    ref_token, ref_ids, ref_q, ref_q_tok = draft_sample_ref(x)
    assert torch.equal(cand_ids, ref_ids)
    torch.testing.assert_close(cand_q, ref_q, atol=1e-6, rtol=1e-4)
    assert torch.equal(token, ref_token)
    torch.testing.assert_close(q_tok, ref_q_tok, atol=1e-6, rtol=1e-4)
    kept = (ref_q > 0).sum(dim=1).tolist()
    # Greedy rows one-hot at the argmax; the filters cut: top-p 0.8 and top-k 3 keep few, min-p 1.0 one.
    assert kept[4] == kept[5] == kept[7] == 1 and kept[3] == 3 and 1 < kept[0] < kept[1]
    assert torch.equal(ref_ids[[4, 5], 0], logits[[4, 5]].float().argmax(dim=-1))
    # Unfiltered (row 1) every candidate is kept: the top bins with at most C tokens, which are
    # exactly the top tokens (in ascending id order).
    n1 = kept[1]
    assert c // 2 <= n1 <= c and torch.equal(ref_ids[1, :n1], torch.topk(logits[1].float(), n1).indices.sort().values)
    # The tied row: bin 0 holds more than C tokens, so its first C in id order.
    assert torch.equal(ref_ids[8], ties.sort().values[:c].to(ref_ids.device))
    assert torch.allclose(ref_q.sum(dim=1), torch.ones(n, device=DEVICE))
    with pytest.raises(ValueError, match="noise must be"):
        DraftSampleInputs(logits, temp, top_p, top_k, min_p, noise[:3])
    with pytest.raises(ValueError, match="top_p must have shape"):
        DraftSampleInputs(logits, temp, top_p[:2], top_k, min_p, noise)


def _record_case(gen: torch.Generator, bs: int, k: int, vocab: int, c: int):
    """Target rows with holes (top-p style zeros) and draft records as the draft runner lays them
    out (step-major buffers seen through a transpose); some drafts equal a likely target token."""
    ids = torch.stack([torch.randperm(vocab, generator=gen)[:c] for _ in range(k * bs)]).view(k, bs, c)
    q = torch.softmax(torch.randn(k, bs, c, generator=gen) * 2, dim=-1)
    pick = torch.multinomial(q.view(-1, c), 1, generator=gen).view(k, bs)
    tokens = ids.gather(2, pick[..., None]).squeeze(-1).T.contiguous()
    # The target favours most drafted tokens (by a random margin), so every prefix length occurs.
    logits = torch.randn(bs, k + 1, vocab, generator=gen) * 3
    boost = torch.rand(bs, k, generator=gen) * 14
    logits[:, :k].scatter_add_(2, tokens[..., None], boost[..., None])
    target_p = torch.softmax(logits, dim=-1)
    target_p = torch.where(target_p < 1e-5, 0.0, target_p)
    target_p = target_p / target_p.sum(-1, keepdim=True)
    # Row 0: the rejected draft's q equals p on its ids and p lives only there: no residual left.
    target_p[0, 0] = 0.0
    target_p[0, 0, ids[0, 0]] = q[0, 0]
    rec = [
        t.to(DEVICE)
        for t in (tokens, ids.transpose(0, 1), q.transpose(0, 1), q.gather(2, pick[..., None]).squeeze(-1).T)
    ]
    coins = torch.rand(bs, k + 1, generator=gen).to(DEVICE)[:, :k]  # SGLang's coins are k + 1 wide
    # Row 0 rejects its first draft: p / q is 1 there up to the rounding of p's normalisation, which differs
    # between CPUs, so its coin lies past 1 (rejecting whatever that rounding).
    coins[0, 0] = 1.5
    return target_p.to(DEVICE), rec, coins, torch.rand(bs, generator=gen).to(DEVICE)


def _rows(target_p: torch.Tensor, listed: bool = False) -> tuple[TargetRows, torch.Tensor]:
    """(target rows of p [bs, k + 1, V], their dense p as the kernels compute it: the reference's input)."""
    rows = rows_from_probs(target_p, listed, list_cap=target_p.shape[-1])
    return rows, rows.dense().view(target_p.shape)


@pytest.mark.parametrize("listed", [False, True])  # the draw over the whole vocabulary / over the row's list
@pytest.mark.parametrize("num_drafts", [3, 1, 0])
def test_rejection_matches_reference(num_drafts, listed):
    gen = torch.Generator().manual_seed(11 + num_drafts)
    target_p, (tokens, ids, q, q_tok), coins, final = _record_case(gen, bs=24, k=3, vocab=1100, c=8)
    rows, target_p = _rows(target_p, listed)
    ref = rejection_sample(target_p, DraftRecord(tokens, ids, q, q_tok, num_drafts=num_drafts), coins, final)
    out = rejection_fwd(rows, tokens, ids, q, q_tok, num_drafts, coins, final, chunk=128, block_v=64)
    assert torch.equal(out[1], ref[1]) and torch.equal(out[0], ref[0])
    assert out[1].max() <= num_drafts and (num_drafts == 0 or len(set(out[1].tolist())) > 1)
    if num_drafts:
        assert out[1][0] == 0 and target_p[0, 0, out[0][0, 0]] > 0  # drawn from p itself
    with pytest.raises(ValueError, match="record shapes"):
        rejection_fwd(rows, tokens[:, :2], ids, q, q_tok, num_drafts, coins, final)


@pytest.mark.parametrize("logit_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rank_rule", [False, True])
def test_rejection_on_compact_rows_matches_reference(rank_rule, logit_dtype):
    """Target rows from the filter (most decided on their top list of <= 32 tokens; a flat one past it),
    drafts from the record: the kernel's accept and residual draw (over the list, or vocabulary-parallel)
    give the reference's tokens for the same coins, including a rejected draft whose q equals p (no
    residual left). Verify logits kept in bf16 (--pillar-verify-logits half; these values are exact in bf16)
    give the rows of their fp32 copy up to the order of fp32 sums, and the same tokens."""
    bs, k, vocab, c = 12, 3, 700, 8
    gen = torch.Generator().manual_seed(23)
    _, (tokens, ids, q, q_tok), coins, final = _record_case(gen, bs=bs, k=k, vocab=vocab, c=c)
    logits = torch.randn(bs * (k + 1), vocab, generator=gen) * 0.5
    logits.view(bs, k + 1, vocab)[:, :k].scatter_add_(2, tokens.cpu()[..., None], torch.full((bs, k, 1), 8.0))
    logits[:, :6] += 7.0
    logits[5] *= 0.01  # flat: its nucleus is wider than the candidates
    logits = (logits * 4).round().div(4).to(DEVICE).to(logit_dtype)  # ties at the cut
    t = torch.full((bs,), 0.8, device=DEVICE)
    top_k = torch.tensor([20, -1, 3, 1] * (bs // 4), dtype=torch.int32, device=DEVICE)
    top_p = torch.tensor([0.9, 0.95, 1.0, 1.0] * (bs // 4), device=DEVICE)
    launch = {"list_cap": 32, "chunk": 64, "block_v": 32, "num_warps": 1}
    rows = target_filter_fwd(logits, t, top_k, top_p, None, k + 1, rank_rule, **launch)
    dense = rows.dense().view(bs, k + 1, vocab)
    full = rows.path == RowPath.FULL
    assert full.sum() >= bs * (k + 1) - 2 and not full.all()
    # Request 0's first draft: q equal to p on p's support, so rejecting it leaves no residual.
    support = dense[0, 0].nonzero().view(-1)[:c]
    ids[0, 0] = torch.cat([support, torch.randperm(vocab, generator=gen)[: c - len(support)].to(DEVICE)])
    q[0, 0] = torch.cat(
        [dense[0, 0, support] / dense[0, 0, support].sum(), torch.zeros(c - len(support), device=DEVICE)]
    )
    tokens[0, 0], q_tok[0, 0], coins[0, 0] = ids[0, 0, 0], q[0, 0, 0], 1.0
    ref = rejection_sample(dense, DraftRecord(tokens, ids, q, q_tok), coins, final)
    out = rejection_fwd(rows, tokens, ids, q, q_tok, k, coins, final, chunk=64, block_v=32)
    assert torch.equal(out[1], ref[1]) and torch.equal(out[0], ref[0])
    assert len(set(out[1].tolist())) > 1 and out[1][0] == 0 and dense[0, 0, out[0][0, 0]] > 0
    if logit_dtype is torch.bfloat16:
        rows32 = target_filter_fwd(logits.float(), t, top_k, top_p, None, k + 1, rank_rule, **launch)
        torch.testing.assert_close(rows32.dense(), rows.dense(), rtol=1e-5, atol=1e-7)
        out32 = rejection_fwd(rows32, tokens, ids, q, q_tok, k, coins, final, chunk=64, block_v=32)
        assert torch.equal(out32[0], out[0]) and torch.equal(out32[1], out[1])


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_rejection_per_request_draft_counts(dtype):
    # Each request its own draft count (adaptive rounds that mix requests): the kernel must match the
    # reference given the same counts, and every request must come out as if verified alone with its
    # count as the batch's int (its stale columns never read, its residual its own).
    bs, k = 24, 3
    gen = torch.Generator().manual_seed(17)
    target_p, (tokens, ids, q, q_tok), coins, final = _record_case(gen, bs=bs, k=k, vocab=1100, c=8)
    rows, target_p = _rows(target_p)
    counts = torch.tensor([3, 0, 1, 2] * (bs // 4), dtype=dtype, device=DEVICE)
    ref = rejection_sample(target_p, DraftRecord(tokens, ids, q, q_tok, num_drafts=counts), coins, final)
    out = rejection_fwd(rows, tokens, ids, q, q_tok, counts, coins, final)
    assert torch.equal(out[1], ref[1]) and torch.equal(out[0], ref[0])
    assert (out[1] <= counts).all() and (out[1][counts == 0] == 0).all()
    # Not degenerate: accepted prefixes stop short of the count, reach it (the draw past the last
    # draft, from p itself) and every count is in play.
    assert (out[1] < counts).any() and (out[1][counts > 0] == counts[counts > 0]).any()
    for b, n in enumerate(counts.tolist()):
        one = (slice(b, b + 1),)
        alone = rejection_fwd(
            _rows(target_p[one])[0], tokens[one], ids[one], q[one], q_tok[one], n, coins[one], final[one]
        )
        assert torch.equal(out[0][b], alone[0][0]) and out[1][b] == alone[1][0], (b, n)
    # The case tells counts apart: the same drafts under other requests' counts come out otherwise.
    shifted = rejection_fwd(rows, tokens, ids, q, q_tok, counts.roll(1), coins, final)
    assert not torch.equal(shifted[0], out[0])
    with pytest.raises(ValueError, match="per-request num_drafts"):
        rejection_fwd(rows, tokens, ids, q, q_tok, counts[:-1], coins, final)
    with pytest.raises(ValueError, match="per-request num_drafts"):
        rejection_fwd(rows, tokens, ids, q, q_tok, counts.float(), coins, final)
    with pytest.raises(ValueError, match="per-request num_drafts"):
        DraftRecord(tokens, ids, q, q_tok, num_drafts=counts[:, None])
