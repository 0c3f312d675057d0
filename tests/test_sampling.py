"""Tests for sglang_sparsespec.spec.sampling: filtering, draft sampling, rejection sampling."""

from __future__ import annotations

import pytest
import torch

from sglang_sparsespec.spec import sampling
from sglang_sparsespec.spec.sampling import (
    PAD_TOKEN,
    SamplingRows,
    build_rows_from_sglang_like,
    rejection_sample,
    sample,
    target_probs,
)


def _rows(temps, top_ps, top_ks, min_ps=None, device="cpu") -> SamplingRows:
    return SamplingRows(
        temperature=torch.tensor(temps, dtype=torch.float32, device=device),
        top_p=torch.tensor(top_ps, dtype=torch.float32, device=device),
        top_k=torch.tensor(top_ks, dtype=torch.int32, device=device),
        min_p=None if min_ps is None else torch.tensor(min_ps, dtype=torch.float32, device=device),
    )


def _p_value(chi2: float, df: int) -> float:
    # Chi-square survival function: Q(df/2, chi2/2), the regularised upper incomplete gamma.
    half = torch.tensor([df / 2, chi2 / 2], dtype=torch.float64)
    return torch.special.gammaincc(half[0], half[1]).item()


# ---------------------------------------------------------------- filtering (target_probs)


def _reference_row(
    logits: torch.Tensor, temp: float, top_p: float, top_k: int, min_p: float
) -> torch.Tensor:
    """Straightforward per-row version of SGLang's joint top-k/top-p/min-p filter."""
    vocab = logits.shape[0]
    if temp < 1e-6 or top_k == 1:
        out = torch.zeros(vocab)
        out[int(torch.argmax(logits))] = 1.0
        return out
    probs = torch.softmax(logits.double() / temp, dim=0)
    order = sorted(range(vocab), key=lambda i: (-probs[i].item(), i))
    k = vocab if top_k <= 0 or top_k >= vocab else top_k
    keep = torch.zeros(vocab, dtype=torch.bool)
    mass_before = 0.0
    for rank, i in enumerate(order):
        if rank < k and (top_p >= 1.0 or mass_before <= top_p) and probs[i] >= min_p * probs[order[0]]:
            keep[i] = True
        mass_before += probs[i].item()
    kept = torch.where(keep, probs, 0.0)
    return (kept / kept.sum()).float()


def test_target_probs_matches_reference_filters():
    gen = torch.Generator().manual_seed(0)
    vocab, repeats = 37, 3
    params = [  # (temperature, top_p, top_k, min_p); includes every "disabled" encoding
        (0.7, 0.9, 5, 0.0),
        (1.3, 1.0, -1, 0.0),
        (1.0, 0.5, 0, 0.1),
        (0.5, 1.0, vocab, 0.2),
        (1.0, 0.95, 1 << 30, 0.0),
        (0.9, 0.3, 10, 0.05),
        (0.0, 0.8, 4, 0.3),  # greedy by temperature
        (1e-7, 1.0, -1, 0.0),  # greedy by tiny temperature
        (1.0, 1.0, 1, 0.0),  # greedy as SGLang encodes it
        (2.0, 1.0, 2, 0.0),
    ]
    rows = _rows(*map(list, zip(*params)))
    logits = torch.randn(len(params) * repeats, vocab, generator=gen) * 3
    got = target_probs(logits, rows, repeats=repeats)
    assert got.dtype == torch.float32 and got.shape == logits.shape
    for i in range(logits.shape[0]):
        ref = _reference_row(logits[i], *params[i // repeats])
        torch.testing.assert_close(got[i], ref, atol=1e-6, rtol=1e-5)


def test_target_probs_ties_break_to_lowest_id():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [3.0, 1.0, 3.0, 3.0]])
    greedy = target_probs(logits, _rows([0.0, 1.0], [1.0, 1.0], [-1, 1]))
    assert greedy.argmax(dim=-1).tolist() == [1, 0]
    assert torch.equal(greedy.sum(dim=-1), torch.ones(2))
    # top_k=2 among three tied maxima keeps the two lowest ids.
    top2 = target_probs(logits[1:], _rows([1.0], [1.0], [2]))
    torch.testing.assert_close(top2[0], torch.tensor([0.5, 0.0, 0.5, 0.0]))


def test_min_p_without_sort_matches_sorted_path():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 50, generator=gen) * 2
    rows = _rows([0.8] * 8, [1.0] * 8, [-1] * 8, [0.0, 0.01, 0.05, 0.1, 0.2, 0.5, 0.9, 1.0])
    unsorted = SamplingRows(rows.temperature, rows.top_p, rows.top_k, rows.min_p, filter_top=False)
    torch.testing.assert_close(target_probs(logits, unsorted), target_probs(logits, rows))


def test_build_rows_from_sglang_like():
    # SGLang: temperatures [bs, 1]; greedy stored as temperature 1 with top_k 1; TOP_K_ALL = 2**30.
    rows = build_rows_from_sglang_like(
        torch.tensor([[1.0], [0.7]]),
        torch.tensor([1.0, 0.9]),
        torch.tensor([1, 1 << 30]),
        torch.zeros(2),
    )
    assert rows.temperature.shape == (2,) and rows.top_k.dtype == torch.int32
    logits = torch.tensor([[0.0, 2.0, 1.0], [0.0, 2.0, 1.0]])
    probs = target_probs(logits, rows)
    assert probs[0].tolist() == [0.0, 1.0, 0.0]
    assert (probs[1] > 0).sum().item() == 2  # top_p 0.9 drops the smallest token
    with pytest.raises(ValueError):
        build_rows_from_sglang_like(torch.ones(2, 2), torch.ones(2), torch.ones(2, dtype=torch.int32))


def test_bad_shapes_raise_value_error():
    rows = _rows([1.0, 1.0], [1.0, 1.0], [-1, -1])
    with pytest.raises(ValueError):
        target_probs(torch.zeros(3, 5), rows)
    with pytest.raises(ValueError):
        SamplingRows(torch.ones(2), torch.ones(3), torch.ones(2, dtype=torch.int32))
    with pytest.raises(ValueError):
        rejection_sample(torch.rand(2, 3, 5), torch.zeros(2, 3, dtype=torch.int64), torch.rand(2, 2, 5))
    with pytest.raises(ValueError):
        rejection_sample(torch.rand(2, 1, 5), torch.zeros(2, 0, dtype=torch.int64), torch.rand(2, 0, 5))


# ---------------------------------------------------------------- sample


def test_sample_exponential_race_distribution():
    gen = torch.Generator().manual_seed(2)
    probs = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.05, 0.0])
    n = 60_000
    tokens = sample(probs.expand(n, -1).contiguous(), generator=gen)
    assert tokens.dtype == torch.int64 and tokens.shape == (n,)
    counts = torch.bincount(tokens, minlength=6).double()
    support = probs > 0
    assert counts[~support].sum() == 0
    expected = probs.double()[support] * n
    chi2 = ((counts[support] - expected) ** 2 / expected).sum().item()
    assert _p_value(chi2, int(support.sum()) - 1) > 1e-4


# ---------------------------------------------------------------- rejection sampling


def _greedy_reference(target_p: torch.Tensor, drafts: torch.Tensor) -> tuple[list[list[int]], list[int]]:
    tokens, lens = [], []
    for b in range(drafts.shape[0]):
        out = []
        for j in range(drafts.shape[1] + 1):
            best = int(torch.argmax(target_p[b, j]))
            if j < drafts.shape[1] and int(drafts[b, j]) == best:
                out.append(best)
                continue
            out.append(best)
            break
        lens.append(len(out))
        tokens.append(out + [PAD_TOKEN] * (drafts.shape[1] + 1 - len(out)))
    return tokens, lens


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_greedy_accepts_longest_matching_prefix(seed):
    gen = torch.Generator().manual_seed(seed)
    bs, k, vocab = 48, 5, 20
    # Half the rows greedy by temperature, half as SGLang encodes greedy (top_k 1).
    rows = _rows([0.0, 1.0] * (bs // 2), [0.9] * bs, [7, 1] * (bs // 2))
    t_logits = torch.randn(bs * (k + 1), vocab, generator=gen)
    # Drafts are the target argmax unless noise flips them, so all run lengths occur.
    d_logits = t_logits.view(bs, k + 1, vocab)[:, :k].reshape(bs * k, vocab)
    d_logits = d_logits + torch.randn(bs * k, vocab, generator=gen) * 0.6
    target_p = target_probs(t_logits, rows, repeats=k + 1).view(bs, k + 1, vocab)
    draft_p = target_probs(d_logits, rows, repeats=k).view(bs, k, vocab)
    drafts = sample(draft_p.view(bs * k, vocab), generator=gen).view(bs, k)
    assert torch.equal(drafts, draft_p.argmax(dim=-1))
    tokens, lens = rejection_sample(target_p, drafts, draft_p, generator=gen)
    ref_tokens, ref_lens = _greedy_reference(target_p, drafts)
    assert tokens.dtype == torch.int64 and lens.dtype == torch.int32
    assert tokens.tolist() == ref_tokens and lens.tolist() == ref_lens
    assert len(set(ref_lens)) >= 3  # the case mix is not degenerate


def test_zero_draft_probability_is_guarded():
    p = torch.tensor([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]])
    # Draft token 1 has q = 0 but p > 0: accepted (ratio is +inf), no nan anywhere.
    tokens, lens = rejection_sample(p, torch.tensor([[1]]), torch.tensor([[[1.0, 0.0, 0.0]]]))
    assert lens.tolist() == [2] and tokens[0, 0].item() == 1
    # p == q and the draft outside both supports: rejected, max(p - q, 0) is all zero, so
    # the recovered token falls back to p.
    gen = torch.Generator().manual_seed(3)
    n = 2000
    same = torch.tensor([0.0, 0.4, 0.6])
    target_p = same.expand(n, 2, 3).contiguous()
    outside = torch.zeros(n, 1, dtype=torch.int64)
    tokens, lens = rejection_sample(target_p, outside, same.expand(n, 1, 3), generator=gen)
    assert lens.eq(1).all() and tokens[:, 1].eq(PAD_TOKEN).all()
    assert tokens[:, 0].ne(0).all() and tokens[:, 0].eq(1).any() and tokens[:, 0].eq(2).any()


V, K = 6, 3


def _chain_trial(n_trials: int, seed: int):
    """Vectorised speculative rounds on a Markov toy model, the worker's own pipeline.

    The target (and draft) logits at output position j depend on the token at j - 1
    (position 0 has one fixed context, token 0). Drafts are sampled step by step from
    target_probs of the draft logits, then the verify rows are built for the drafted
    prefix. Trials with i % 5 == 0 are greedy, the rest use temperature/top-k/top-p/min-p.
    Returns (t_table, rows, greedy mask, target_p, drafts, tokens, lens).
    """
    gen = torch.Generator().manual_seed(seed)
    t_table = torch.randn(K + 1, V, V, generator=gen)  # [position, previous token, V]
    d_table = t_table[:K] + torch.randn(K, V, V, generator=gen) * 0.7
    greedy = torch.arange(n_trials) % 5 == 0
    rows = SamplingRows(
        temperature=torch.where(greedy, 0.0, 0.8),
        top_p=torch.full((n_trials,), 0.9),
        top_k=torch.full((n_trials,), 5, dtype=torch.int32),
        min_p=torch.full((n_trials,), 0.05),
    )
    prev = torch.zeros(n_trials, dtype=torch.int64)
    contexts, drafts, draft_p = [prev], [], []
    for j in range(K):
        q = target_probs(d_table[j, prev], rows)
        prev = sample(q, generator=gen)
        draft_p.append(q)
        drafts.append(prev)
        contexts.append(prev)
    ctx = torch.stack(contexts, dim=1)  # [n, K+1]: the token before each output position
    t_logits = t_table[torch.arange(K + 1)[None, :], ctx]  # [n, K+1, V]
    target_p = target_probs(t_logits.reshape(-1, V), rows, repeats=K + 1).view(n_trials, K + 1, V)
    drafts, draft_p = torch.stack(drafts, 1), torch.stack(draft_p, 1)
    tokens, lens = rejection_sample(target_p, drafts, draft_p, generator=gen)
    return t_table, rows, greedy, target_p, drafts, tokens, lens


def _chain_p_value(t_table, rows, greedy, tokens, lens) -> tuple[float, int]:
    """Chi-square p-value of every emitted token against p_j(. | previous emitted token).

    Token j exists iff lens > j, and then token j-1 was an accepted draft, so conditioned on
    its value c token j must follow p_j(. | c). Groups whose smallest expected cell is below
    5 are skipped (chi-square needs it). Returns (p-value, number of groups tested).
    """
    i = int(torch.nonzero(~greedy)[0])  # any sampled trial: they all share one parameter set
    one = slice(i, i + 1)
    sampled_rows = SamplingRows(rows.temperature[one], rows.top_p[one], rows.top_k[one], rows.min_p[one])
    chi2, df, groups = 0.0, 0, 0
    keep = ~greedy
    for j in range(K + 1):
        for c in range(V if j else 1):
            sel = keep & (lens > j) & ((tokens[:, j - 1] == c) if j else True)
            obs = torch.bincount(tokens[sel, j], minlength=V).double()
            p = target_probs(t_table[j, c][None], sampled_rows)[0].double()
            assert obs[p == 0].sum() == 0, f"token outside the target support at position {j}"
            exp = p * sel.sum()
            support = p > 0
            if exp[support].min() < 5:
                continue
            chi2 += ((obs[support] - exp[support]) ** 2 / exp[support]).sum().item()
            df += int(support.sum()) - 1
            groups += 1
    return _p_value(chi2, df), groups


def test_rejection_sampling_preserves_target_distribution():
    t_table, rows, greedy, target_p, drafts, tokens, lens = _chain_trial(100_000, seed=4)
    p_value, groups = _chain_p_value(t_table, rows, greedy, tokens, lens)
    assert groups >= 10
    assert p_value > 1e-4
    # Every run length occurs, and drafts were really rejected and recovered.
    assert set(lens[~greedy].tolist()) == {1, 2, 3, 4}
    # Greedy trials of the same (mixed) batch follow the argmax rule exactly.
    ref_tokens, ref_lens = _greedy_reference(target_p[greedy][:500], drafts[greedy][:500])
    assert tokens[greedy][:500].tolist() == ref_tokens and lens[greedy][:500].tolist() == ref_lens


def test_chi_square_detects_a_wrong_recovery_distribution(monkeypatch):
    # Negative control: recovering from p instead of max(p - q, 0) must fail the same test.
    monkeypatch.setattr(sampling, "_residual", lambda p, q: p)
    t_table, rows, greedy, _, _, tokens, lens = _chain_trial(100_000, seed=4)
    p_value, _ = _chain_p_value(t_table, rows, greedy, tokens, lens)
    assert p_value < 1e-9


# ---------------------------------------------------------------- no host sync / static shapes


def test_meta_tensors_catch_host_syncs():
    # The meta-device test below relies on these refusing to run without data.
    m = torch.zeros(4, 3, device="meta")
    with pytest.raises(RuntimeError):
        m.sum().item()
    with pytest.raises(RuntimeError):
        bool((m > 0).any())
    with pytest.raises(NotImplementedError):
        m[m > 0]


def test_runs_on_meta_device_with_static_shapes():
    bs, k, vocab = 3, 4, 11
    rows = _rows([0.0, 0.7, 1.0], [1.0, 0.9, 0.5], [-1, 5, 1], [0.0, 0.1, 0.0], device="meta")
    logits = torch.empty(bs * (k + 1), vocab, device="meta", dtype=torch.bfloat16)
    probs = target_probs(logits, rows, repeats=k + 1)
    assert probs.shape == (bs * (k + 1), vocab) and probs.dtype == torch.float32
    tok = sample(probs)
    assert tok.shape == (bs * (k + 1),) and tok.dtype == torch.int64
    tokens, lens = rejection_sample(
        probs.view(bs, k + 1, vocab), tok.view(bs, k + 1)[:, :k], probs.view(bs, k + 1, vocab)[:, :k]
    )
    assert tokens.shape == (bs, k + 1) and tokens.dtype == torch.int64
    assert lens.shape == (bs,) and lens.dtype == torch.int32


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_capture_without_sync():
    bs, k, vocab = 8, 4, 1000
    dev = "cuda"
    rows = _rows([0.0, 0.7] * 4, [1.0, 0.9] * 4, [-1, 50] * 4, [0.0, 0.05] * 4, device=dev)
    t_logits = torch.randn(bs * (k + 1), vocab, device=dev)
    d_logits = t_logits.view(bs, k + 1, vocab)[:, :k].reshape(bs * k, vocab)
    d_logits = d_logits + 0.3 * torch.randn(bs * k, vocab, device=dev)

    def step():
        draft_p = target_probs(d_logits, rows, repeats=k)
        drafts = sample(draft_p).view(bs, k)
        target_p = target_probs(t_logits, rows, repeats=k + 1).view(bs, k + 1, vocab)
        return rejection_sample(target_p, drafts, draft_p.view(bs, k, vocab))

    torch.cuda.set_sync_debug_mode("error")
    try:
        eager_tokens, eager_lens = step()  # raises on any synchronising call
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tokens, lens = step()
    graph.replay()
    torch.cuda.synchronize()
    greedy = torch.arange(bs, device=dev) % 2 == 0
    assert torch.equal(tokens[greedy], eager_tokens[greedy])
    assert torch.equal(lens[greedy], eager_lens[greedy])
    assert lens.min() >= 1 and lens.max() <= k + 1
