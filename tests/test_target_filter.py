"""kernels/target_filter.py vs its reference, ``spec/sampling.target_probs``.

Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs
compiled on the same cases. Small vocabularies with C = 16 candidates and 128-token tiles, so
rows cross tiles and both the candidate path and the vocabulary-wide fallback run.
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.target_filter import target_filter_fwd
from triton_env import DEVICE

from sglang_sparsespec.spec.sampling import SamplingRows, target_probs

C, BLOCK_V = 16, 128


def _run(logits, temps, top_ks, top_ps, min_ps=None, repeats=1):
    """(kernel, reference) rows for per-request parameter lists."""
    rows = SamplingRows(
        temperature=torch.tensor(temps, dtype=torch.float32, device=DEVICE),
        top_p=torch.tensor(top_ps, dtype=torch.float32, device=DEVICE),
        top_k=torch.tensor(top_ks, dtype=torch.int32, device=DEVICE),
        min_p=None if min_ps is None else torch.tensor(min_ps, dtype=torch.float32, device=DEVICE),
    )
    logits = logits.to(DEVICE)
    out = target_filter_fwd(logits, rows.temperature, rows.top_k, rows.top_p, rows.min_p, repeats, C, BLOCK_V)
    return out, target_probs(logits, rows, repeats)


def _assert_same(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert torch.equal(out > 0, ref > 0), ((out > 0).sum(1), (ref > 0).sum(1))
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)


def _mixed_logits(gen: torch.Generator, n: int, vocab: int) -> torch.Tensor:
    """Peaked rows (a few lifted tokens), flat rows (nucleus >> C), rows with exact ties (integer
    logits) and a row whose first tile is masked to -inf (a grammar mask)."""
    logits = torch.randn(n, vocab, generator=gen) * 3
    logits[0::4, :8] += 10
    logits[1::4] *= 0.1
    logits[2::4] = logits[2::4].round()
    logits[3, :BLOCK_V] = -torch.inf
    return logits


@pytest.mark.parametrize("min_p", [None, [0.0, 0.05, 0.3, 0.1, 0.0, 0.02]])
def test_matches_target_probs(min_p):
    gen = torch.Generator().manual_seed(0)
    vocab, repeats = 433, 2
    temps = [0.6, 1.0, 1.5, 0.6, 1.0, 0.0]  # the last is greedy by temperature
    top_ks = [-1, 5, 40, 0, 1 << 30, 20]  # off, inside C, > C, off, off, > C
    top_ps = [0.95, 1.0, 0.9, 0.5, 1.0, 0.8]
    out, ref = _run(_mixed_logits(gen, 12, vocab), temps, top_ks, top_ps, min_p, repeats)
    _assert_same(out, ref)


def test_greedy_rows_are_one_hot_at_the_first_max():
    logits = torch.randn(3, 300, generator=torch.Generator().manual_seed(1))
    logits[:, [7, 150, 299]] = 50.0  # the max three times, across tiles
    out, ref = _run(logits, [1.0, 0.0, 0.7], [1, -1, 1], [0.9, 0.9, 1.0], [0.0, 0.1, 0.0])
    _assert_same(out, ref)
    assert torch.equal(out.argmax(1).cpu(), torch.tensor([7, 7, 7]))
    assert torch.equal(out.sum(1), torch.ones(3, device=DEVICE))


def test_top_k_boundary_tie_keeps_the_lowest_ids():
    vocab = 300
    logits = torch.full((1, vocab), -5.0)
    logits[0, [3, 200]] = 4.0
    tied = [20, 130, 140, 250]  # the 3rd..6th ranks tie, in two tiles
    logits[0, tied] = 2.0
    out, ref = _run(logits, [1.0], [4], [1.0])
    _assert_same(out, ref)
    assert set((out[0] > 0).nonzero().flatten().tolist()) == {3, 200, 20, 130}


@pytest.mark.parametrize("min_p", [None, [0.01]])
def test_top_p_boundary_tie_keeps_the_lowest_ids(min_p):
    vocab = 300
    logits = torch.full((1, vocab), -30.0)
    logits[0, 250] = 1.0
    tied = [10, 100, 130, 260]
    logits[0, tied] = 0.0
    p = torch.softmax(logits[0], 0)
    # The cut falls after the second tied token: mass ahead of it < top_p < mass ahead of the third.
    top_p = float(p[250] + 1.5 * p[10])
    out, ref = _run(logits, [1.0], [-1], [top_p], min_p)
    _assert_same(out, ref)
    assert set((out[0] > 0).nonzero().flatten().tolist()) == {250, 10, 100}


@pytest.mark.parametrize("min_p", [None, [0.0]])
def test_nucleus_wider_than_the_candidates_takes_the_exact_path(min_p):
    """A flat row: the nucleus holds far more than C tokens, so only the vocabulary-wide path can
    produce it (the candidate path would keep at most C)."""
    logits = torch.randn(2, 600, generator=torch.Generator().manual_seed(2)) * 0.5
    out, ref = _run(logits, [1.0, 0.6], [-1, 200], [0.9, 0.95], None if min_p is None else min_p * 2)
    _assert_same(out, ref)
    assert ((out > 0).sum(1) > 4 * C).all()


def test_min_p_with_top_k_above_the_candidates():
    # min-p renormalises top-k first: top_k in (C, V) with top_p < 1 needs the top-k mass outside C.
    logits = torch.randn(4, 500, generator=torch.Generator().manual_seed(3))
    out, ref = _run(logits, [1.0, 0.6], [100, 30], [0.7, 0.9], [0.01, 0.0], repeats=2)
    _assert_same(out, ref)


def test_rejects_bad_shapes():
    logits = torch.randn(6, 50, device=DEVICE)
    t = torch.ones(3, device=DEVICE)
    k = torch.full((3,), -1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="repeats"):
        target_filter_fwd(logits, t[:2], k, t, None, repeats=2)
    with pytest.raises(ValueError, match="integer"):
        target_filter_fwd(logits, t, t, t, None, repeats=2)


def test_launch_tiles_do_not_change_either_sampled_kernel():
    """``sampling_bench --tune`` times other tiles and warp counts; they must give the same rows (up to
    the order of the normaliser's float sums: same support, same draws)."""
    from sglang_sparsespec.kernels.draft_sample import DraftSampleInputs, draft_sample_fwd

    gen = torch.Generator().manual_seed(5)
    bs, vocab = 3, 700
    logits = (torch.randn(bs, vocab, generator=gen) * 3).to(DEVICE)
    temp, top_p = torch.full((bs,), 0.6, device=DEVICE), torch.full((bs,), 0.95, device=DEVICE)
    top_k = torch.full((bs,), 1 << 30, dtype=torch.int32, device=DEVICE)
    rows = [target_filter_fwd(logits, temp, top_k, top_p, None, 1, C, bv, num_warps=nw) for bv, nw in ((128, 4), (512, 8))]
    _assert_same(*rows)
    noise = torch.empty(bs, C, device=DEVICE).exponential_(generator=None)
    x = DraftSampleInputs(logits, temp, top_p, -torch.ones_like(top_k), torch.zeros_like(temp), noise)
    draws = []
    for bv, nw in ((128, 4), (512, 8)):
        outs = (torch.empty(bs, dtype=torch.int64, device=DEVICE), torch.empty(bs, C, dtype=torch.int64, device=DEVICE),
                torch.empty(bs, C, device=DEVICE), torch.empty(bs, device=DEVICE))  # fmt: skip
        draft_sample_fwd(x, *outs, block_v=bv, num_warps=nw)
        draws.append(outs)
    (tok_a, ids_a, q_a, qt_a), (tok_b, ids_b, q_b, qt_b) = draws
    assert torch.equal(tok_a, tok_b) and torch.equal(ids_a, ids_b)
    torch.testing.assert_close(q_a, q_b)
    torch.testing.assert_close(qt_a, qt_b)
