"""kernels/top_candidates.py: the target filter's candidate list (every token of p >= 1 / (L - 1), and the row's
maxima) and the select's use of it, against the definition computed with torch."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from sglang_sparsespec.kernels.logit_bins import RowPath
from sglang_sparsespec.kernels.target_filter import target_filter_fwd
from sglang_sparsespec.kernels.top_candidates import sort_list
from triton_env import DEVICE

L = 48
LAUNCH = {"list_cap": L, "chunk": 64, "block_v": 32, "num_warps": 1, "candidates": True}


def _filter(logits, temps, top_ks, top_ps, **launch):
    t = torch.tensor(temps, dtype=torch.float32, device=DEVICE)
    k = torch.tensor(top_ks, dtype=torch.int32, device=DEVICE)
    p = torch.tensor(top_ps, dtype=torch.float32, device=DEVICE)
    return target_filter_fwd(logits.to(DEVICE), t, k, p, None, 1, **(LAUNCH | launch))


def _candidates(logits: torch.Tensor, temp: float, cap: int) -> list[int]:
    """The definition: ids of p >= 1 / (cap - 1) at temperature temp, or at the row's max, ascending."""
    z = logits.double() / temp
    p = torch.softmax(z, dim=-1)
    return torch.nonzero((p >= 1.0 / (cap - 1)) | (z == z.max())).flatten().tolist()


def test_peaked_rows_list_their_candidates_in_id_order_and_decide_from_them():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 700, generator=gen)
    for r, hot in enumerate(([3, 650, 90], [12], [699, 0, 345, 346, 200], [500, 7])):
        logits[r, hot] += 9.0 - torch.arange(len(hot), dtype=torch.float32)
    temps = [0.6, 1.0, 0.7, 1.0]
    out = _filter(logits, temps, [1 << 30, 1, 20, -1], [0.95, 1.0, 0.9, 0.8])
    assert out.path.tolist() == [RowPath.FULL] * 4
    for r, temp in enumerate(temps):
        want = _candidates(logits[r], temp, L)
        assert out.list_n[r].item() == len(want) and out.list_ids[r, : len(want)].tolist() == want
    kept = out.dense().cpu() > 0
    assert kept[1].nonzero().flatten().tolist() == [12]  # greedy: the max alone


def test_rows_the_candidates_cannot_decide_go_to_the_bracket_stage():
    """A flat row (its nucleus deeper than any candidate), a top-k row with fewer candidates than k, and a
    constant row (every token tied at the max: the list overflows) all leave the candidate list."""
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 900, generator=gen) * 0.3
    logits[1, :5] += 8.0
    logits[2] = 0.25
    out = _filter(logits, [1.0, 1.0, 1.0], [-1, 40, -1], [0.9, 1.0, 0.5])
    assert RowPath.FULL not in out.path.tolist()
    assert out.path[2].item() == RowPath.TIE  # the constant row: one tied value


@triton.jit
def _sort_rows(Ids, Zs, N, width, CAP_P2: tl.constexpr):
    row = tl.program_id(0)
    sort_list(Ids + row * width, Zs + row * width, tl.load(N + row), CAP_P2)


def test_sort_list_orders_by_id_and_keeps_each_z():
    gen = torch.Generator().manual_seed(3)
    width = 128
    sizes = [0, 1, 17, 64, 65, 128]
    ids = torch.stack([torch.randperm(5000, generator=gen)[:width] for _ in sizes]).to(torch.int32)
    zs = torch.randn(len(sizes), width, generator=gen)
    n = torch.tensor(sizes, dtype=torch.int32)
    got_ids, got_zs = ids.clone().to(DEVICE), zs.clone().to(DEVICE)
    _sort_rows[(len(sizes),)](got_ids, got_zs, n.to(DEVICE), width, CAP_P2=width)
    got_ids, got_zs = got_ids.cpu(), got_zs.cpu()
    for r, size in enumerate(sizes):
        order = torch.argsort(ids[r, :size])
        assert torch.equal(got_ids[r, :size], ids[r, :size][order])
        assert torch.equal(got_zs[r, :size], zs[r, :size][order])
        assert torch.equal(got_ids[r, size:], ids[r, size:]) and torch.equal(got_zs[r, size:], zs[r, size:])


@pytest.mark.parametrize("launch", [{}, {"chunk": 128, "block_v": 64, "num_warps": 2}])
def test_both_first_lists_give_the_same_rows(launch):
    """The candidate list and level 1's top bins are two ways to the same exact rows."""
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(6, 800, generator=gen) * 2
    logits[::2, 100:104] += 8
    args = (logits, [0.6, 1.0, 0.6, 0.0, 1.5, 1.0], [1 << 30, 20, 5, 1, -1, 1 << 30], [0.95, 0.9, 1.0, 1.0, 0.9, 0.5])
    new = _filter(*args, **launch)
    old = _filter(*args, candidates=False, **launch)
    a, b = new.dense(), old.dense()
    assert torch.equal(a > 0, b > 0)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    assert (new.path == RowPath.FULL).sum() >= 3


@pytest.mark.parametrize("rank_rule", [False, True])
def test_a_nucleus_past_the_candidates_is_bracketed_under_them_not_over_the_row(rank_rule):
    """Rows whose top-p nucleus runs past the candidates into a dense tail (twenty lifted tokens over 20,000,
    T 0.6): the bracket stage starts under the candidates with their exact count and mass and lists the
    rest of the nucleus. From bin 0, without them, the same rows end in a pass of one program over the
    whole row (VOCAB)."""
    gen = torch.Generator().manual_seed(7)
    rows = torch.randn(256, 20000, generator=gen) * 3
    rows[:, :20] += 9.0
    p = torch.softmax(rows.double() / 0.6, -1)
    cap = 256
    logits = rows[(p * (p >= 1 / (cap - 1))).sum(-1) < 0.95][:2]  # the candidates alone hold < top_p
    args = (logits, [0.6, 0.6], [1 << 30, 1 << 30], [0.95, 0.95])
    launch = {"list_cap": cap, "chunk": 2048, "block_v": 256, "num_warps": 2, "rank_rule": rank_rule}
    out = _filter(*args, **launch)
    assert len(logits) == 2 and out.path.tolist() == [RowPath.FULL] * 2  # everything above the cut listed
    a, b = out.dense(), _filter(*args, candidates=False, **launch).dense()
    assert torch.equal(a > 0, b > 0)
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def _candidate_pass(seed: int, peaked: list[bool]):
    """(logits, VocabPasses after their candidate pass): near-uniform rows of 2,000 tokens at T 1 / top-p 0.9,
    the peaked ones with token 7 raised by 9, in 64-token chunks."""
    from sglang_sparsespec.kernels.vocab_passes import PassRows, VocabPasses

    n = len(peaked)
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, 2000, generator=gen) * 1e-3).to(DEVICE)
    logits[:, 7] += 9.0 * torch.tensor(peaked, dtype=torch.float32, device=DEVICE)
    one = torch.ones(n, device=DEVICE)
    top_k = torch.full((n,), 1 << 30, dtype=torch.int32, device=DEVICE)
    passes = VocabPasses.allocate(n, 2000 // 64 + 1, L, logits.device)
    passes.candidates(PassRows(logits, one, top_k, one * 0.9, None, 1, 64, 32, 1))
    return logits, passes


def test_near_uniform_rows_skip_the_candidate_pass():
    """A near-uniform row (random weights' logits) cannot be decided by 47 tokens of ~1 / 2000 each: the pass
    skips it, listing nothing; a peaked row beside it lists its candidates."""
    logits, passes = _candidate_pass(seed=9, peaked=[False, True])
    assert passes.list_n.tolist()[0] == 0 and passes.list_n.tolist()[1] >= 1
    # What the select reads instead of deciding again: the skip (every chunk's mass negative) and the bounds
    # the pass listed by (level 1's resolution r, the first bin under the list j0).
    n_chunks = passes.stats.shape[1]
    assert (passes.list_mass[0, :n_chunks] < 0).all() and (passes.list_mass[1, :n_chunks] >= 0).all()
    r, j0 = passes.plan_f[1, 1].item(), passes.plan_i[1, 5].item() + 1
    z = logits[1].cpu()
    listed = sorted(passes.list_ids[1, : passes.list_n[1]].tolist())
    assert listed == torch.nonzero(((z.max() - z) * r).floor() < j0).flatten().tolist()
    out = _filter(logits.cpu(), [1.0, 1.0], [1 << 30, 1 << 30], [0.9, 0.9])
    ref = _filter(logits.cpu(), [1.0, 1.0], [1 << 30, 1 << 30], [0.9, 0.9], candidates=False)
    torch.testing.assert_close(out.dense(), ref.dense(), atol=1e-6, rtol=1e-5)


def test_chunks_whose_max_lies_under_the_list_are_not_read(monkeypatch):
    """The pass knows from a chunk's max (the statistics) that it holds no candidate and leaves it unread: a
    token raised in such a chunk after the statistics is not listed, while the peak's chunk is read."""
    from sglang_sparsespec.kernels.vocab_passes import VocabPasses

    stats = VocabPasses._stats

    def stats_then_raise(self, rows_):
        stats(self, rows_)
        rows_.logits[0, 1500] += 9.0  # in chunk 23, whose max the statistics put ~9 under the row's

    monkeypatch.setattr(VocabPasses, "_stats", stats_then_raise)
    _, passes = _candidate_pass(seed=5, peaked=[True])
    assert passes.list_ids[0, : passes.list_n[0]].tolist() == [7]
