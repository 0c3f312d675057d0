"""Tests for sglang_sparsespec.spec.sampling (filtering, draft sampling) and for what production
does with the drafts: SGLang's own rejection-sampling verify, ``chain_speculative_sampling_triton``.

The PILLAR worker samples each draft with ``sample(target_probs(...))`` and hands the drafts and
their distributions q to SGLang's verify, which (non-greedy batches, rejection sampling on) runs
that Triton kernel. Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py);
with CUDA available it runs compiled, with more Monte-Carlo samples.
"""

from __future__ import annotations

import pytest
import torch
from sglang.kernels.ops.speculative.reject_sampling import (
    chain_speculative_sampling_triton,
)
from triton_env import DEVICE, INTERPRET

from sglang_sparsespec.spec.sampling import SamplingRows, sample, target_probs


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


def test_bad_shapes_raise_value_error():
    rows = _rows([1.0, 1.0], [1.0, 1.0], [-1, -1])
    with pytest.raises(ValueError):
        target_probs(torch.zeros(3, 5), rows)
    with pytest.raises(ValueError):
        SamplingRows(torch.ones(2), torch.ones(3), torch.ones(2, dtype=torch.int32))
    with pytest.raises(ValueError):
        SamplingRows(torch.ones(2), torch.ones(2), torch.ones(2))  # float top_k
    with pytest.raises(ValueError):
        sample(torch.rand(2, 3, 5))


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


# ---------------------------------------------------------------- SGLang's verify of our drafts


def _verify(
    target_p: torch.Tensor, drafts: torch.Tensor, draft_p: torch.Tensor, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run SGLang's chain verify on k drafts per request, called as eagle_sample calls it.

    target_p: [bs, k+1, V]; drafts: [bs, k] int64; draft_p: [bs, k, V].
    Returns (emitted [bs, k+1] int64, -1 after each request's last emitted token; num_accepted
    [bs] int64 in 0..k). Also checks the kernel's bookkeeping: accept_index lists the accepted
    chain slots, and the accepted tokens are the drafts themselves.
    """
    bs, k1, _ = target_p.shape
    dev = target_p.device
    # Slot 0 is the last verified token (the kernel never reads it), slots 1..k the drafts.
    root = torch.randint(0, target_p.shape[-1], (bs, 1), generator=gen, device=dev)
    candidates = torch.cat([root, drafts], dim=1)
    retrive_index = torch.arange(bs * k1, device=dev).view(bs, k1)
    predicts = torch.zeros(bs * k1, dtype=torch.int32, device=dev)
    accept_index = torch.full((bs, k1), -1, dtype=torch.int32, device=dev)
    accept_token_num = torch.empty(bs, dtype=torch.int32, device=dev)
    chain_speculative_sampling_triton(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_token_num,
        candidates=candidates,
        retrive_index=retrive_index,
        retrive_next_token=None,
        retrive_next_sibling=None,
        uniform_samples=torch.rand(candidates.shape, generator=gen, device=dev),
        uniform_samples_for_final_sampling=torch.rand(bs, generator=gen, device=dev),
        target_probs=target_p,
        draft_probs=draft_p,
        threshold_single=1.0,
        threshold_acc=1.0,
        deterministic=True,
    )
    n = accept_token_num.long()
    assert n.min() >= 0 and n.max() <= k1 - 1
    col = torch.arange(k1, device=dev)[None, :]
    emitted_slot = col <= n[:, None]
    assert torch.equal(accept_index.long(), torch.where(emitted_slot, retrive_index, -1))
    emitted = torch.where(emitted_slot, predicts.long()[accept_index.long().clamp(min=0)], -1)
    accepted = col[:, :-1] < n[:, None]
    assert torch.equal(torch.where(accepted, emitted[:, :-1], -1), torch.where(accepted, drafts, -1))
    return emitted, n


V, K = 6, 2
# Non-greedy parameters whose filters zero some tokens, so p and q have holes in their support.
SAMPLED = ([0.9], [0.95], [5], [0.02])
# The interpreter runs one kernel program (= one Monte-Carlo row) in about 5 ms.
N_CHECK = 3000 if INTERPRET else 200_000
N_CONTROL = 400 if INTERPRET else 50_000


def _markov_round(n: int, seed: int, tamper: str | None = None):
    """n independent speculative rounds on a Markov toy model, the worker's pipeline end to end.

    The target and draft logits at output position j depend on the token before it (position 0's
    context is token 0): t_logits[j, prev], d_logits[j, prev]. So p_0 and q_0 are fixed and
    p_j = p_j(. | d_{j-1}), q_j = q_j(. | d_{j-1}). Drafts are sampled step by step with
    sample(target_probs(draft logits)); the verify rows are target_probs of the target logits
    after the drafted prefix. tamper: None; "shifted" passes the draft distributions one row off
    (row j gets q_{j-1}, row 0 gets q_{K-1}); "zero" passes q = 0.
    Returns (p_table [K+1, V, V] with p_table[j, c] = p_j(. | c), emitted, num_accepted).
    """
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    table_gen = torch.Generator().manual_seed(1234)  # one fixed model for every test
    t_logits = (torch.randn(K + 1, V, V, generator=table_gen) * 1.5).to(DEVICE)
    d_logits = t_logits[:K] + (torch.randn(K, V, V, generator=table_gen) * 1.5).to(DEVICE)
    rows = _rows(*(col * n for col in SAMPLED), device=DEVICE)
    prev = torch.zeros(n, dtype=torch.int64, device=DEVICE)
    contexts, drafts, draft_p = [prev], [], []
    for j in range(K):
        q = target_probs(d_logits[j, prev], rows)
        prev = sample(q, generator=gen)
        draft_p.append(q)
        drafts.append(prev)
        contexts.append(prev)
    ctx = torch.stack(contexts, dim=1)  # [n, K+1]: the token before each output position
    t_rows = t_logits[torch.arange(K + 1, device=DEVICE)[None, :], ctx].reshape(-1, V)
    target_p = target_probs(t_rows, rows, repeats=K + 1).view(n, K + 1, V)
    drafts, draft_p = torch.stack(drafts, dim=1), torch.stack(draft_p, dim=1)
    if tamper == "shifted":
        draft_p = draft_p.roll(1, dims=1)
    elif tamper == "zero":
        draft_p = torch.zeros_like(draft_p)
    emitted, n_acc = _verify(target_p, drafts, draft_p, gen)
    one = _rows(*SAMPLED, device=DEVICE)
    p_table = target_probs(t_logits.reshape(-1, V), one, repeats=(K + 1) * V).view(K + 1, V, V)
    return p_table, emitted, n_acc


def _chi2(observed: torch.Tensor, expected: torch.Tensor) -> tuple[float, int]:
    """Chi-square statistic and degrees of freedom over the cells with expected > 0.

    The smallest cells are merged until every bin expects at least 5 (the chi-square
    approximation needs it); a group with fewer than two such bins contributes nothing.
    """
    support = expected > 0
    obs, exp = observed[support].double().tolist(), expected[support].double().tolist()
    bins: list[list[float]] = []
    acc_o = acc_e = 0.0
    for i in sorted(range(len(exp)), key=exp.__getitem__):
        acc_o, acc_e = acc_o + obs[i], acc_e + exp[i]
        if acc_e >= 5:
            bins.append([acc_o, acc_e])
            acc_o = acc_e = 0.0
    if bins and acc_e > 0:
        bins[-1][0] += acc_o
        bins[-1][1] += acc_e
    if len(bins) < 2:
        return 0.0, 0
    return sum((o - e) ** 2 / e for o, e in bins), len(bins) - 1


def _position_p_value(p_table, emitted, n_acc, j) -> tuple[float, int]:
    """p-value that emitted token j follows p_j(. | emitted token j-1); also its df.

    Token j exists iff num_accepted >= j, and then token j-1 was the accepted draft d_{j-1}, so
    conditioned on its value c token j must follow p_j(. | c): the chi-square of every c is summed.
    """
    chi2, df = 0.0, 0
    for c in range(V) if j else [0]:
        sel = (n_acc >= j) & ((emitted[:, j - 1] == c) if j else True)
        observed = torch.bincount(emitted[sel, j], minlength=V).cpu()
        p = p_table[j, c].double().cpu()
        assert observed[p == 0].sum() == 0, f"token outside the target support at position {j}"
        stat, d = _chi2(observed, p * sel.sum().item())
        chi2, df = chi2 + stat, df + d
    return _p_value(chi2, df), df


def test_verify_of_our_drafts_preserves_target_distribution():
    p_table, emitted, n_acc = _markov_round(N_CHECK, seed=0)
    # The first emitted token follows p_0; given it was the accepted draft d_0 = c, the second
    # follows p_1(. | c); given d_1 = c was accepted too, the bonus follows p_2(. | c).
    for j in range(K + 1):
        p_value, df = _position_p_value(p_table, emitted, n_acc, j)
        assert df >= (3 if j == 0 else 10), (j, df)
        assert p_value > 1e-3, (j, p_value)
    # Not degenerate: every run length occurs often, so the kernel's recovery (residual
    # max(p - q, 0)) and bonus paths both produced many of the tested tokens.
    assert torch.bincount(n_acc, minlength=K + 1).min() > N_CHECK // 10


@pytest.mark.parametrize("tamper", ["shifted", "zero"])
def test_chi_square_detects_wrong_draft_distributions(tamper):
    # Negative controls: the same check must reject when the verify is fed draft distributions
    # misaligned by one row, or q = 0 (every draft in the target's support accepted).
    p_table, emitted, n_acc = _markov_round(N_CONTROL, seed=1, tamper=tamper)
    for j in (0, 1):  # the first token, and the second given the first was an accepted draft
        p_value, _ = _position_p_value(p_table, emitted, n_acc, j)
        assert p_value < 1e-6, (j, p_value)


def _greedy_reference(target_p: torch.Tensor, drafts: torch.Tensor) -> tuple[list[list[int]], list[int]]:
    """Longest prefix of drafts equal to the target argmaxes, then the target argmax; -1 after."""
    tokens, n_acc = [], []
    best = target_p.argmax(dim=-1).tolist()
    for b, row in enumerate(drafts.tolist()):
        n = 0
        while n < len(row) and row[n] == best[b][n]:
            n += 1
        n_acc.append(n)
        tokens.append(row[:n] + [best[b][n]] + [-1] * (len(row) - n))
    return tokens, n_acc


@pytest.mark.parametrize("seed", [0, 1])
def test_verify_of_one_hot_rows_accepts_longest_matching_prefix(seed):
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    bs, k, vocab = 48, 3, 8
    # Half the rows greedy by temperature, half as SGLang encodes greedy (top_k 1): one-hot p and q.
    rows = _rows([0.0, 1.0] * (bs // 2), [0.9] * bs, [7, 1] * (bs // 2), device=DEVICE)
    t_logits = torch.randn(bs * (k + 1), vocab, generator=gen, device=DEVICE)
    # Drafts are the target argmax unless noise flips them, so all run lengths occur.
    d_logits = t_logits.view(bs, k + 1, vocab)[:, :k].reshape(bs * k, vocab)
    d_logits = d_logits + torch.randn(bs * k, vocab, generator=gen, device=DEVICE) * 0.6
    target_p = target_probs(t_logits, rows, repeats=k + 1).view(bs, k + 1, vocab)
    draft_p = target_probs(d_logits, rows, repeats=k).view(bs, k, vocab)
    drafts = sample(draft_p.view(bs * k, vocab), generator=gen).view(bs, k)
    assert torch.equal(drafts, draft_p.argmax(dim=-1))
    emitted, n_acc = _verify(target_p, drafts, draft_p, gen)
    ref_tokens, ref_n = _greedy_reference(target_p, drafts)
    assert emitted.tolist() == ref_tokens and n_acc.tolist() == ref_n
    assert len(set(ref_n)) >= 3  # the case mix is not degenerate


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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_capture_without_sync():
    bs, k, vocab = 8, 4, 1000
    dev = "cuda"
    rows = _rows([0.0, 0.7] * 4, [1.0, 0.9] * 4, [-1, 50] * 4, [0.0, 0.05] * 4, device=dev)
    t_logits = torch.randn(bs * (k + 1), vocab, device=dev)
    d_logits = t_logits.view(bs, k + 1, vocab)[:, :k].reshape(bs * k, vocab)
    d_logits = d_logits + 0.3 * torch.randn(bs * k, vocab, device=dev)

    def step():
        # The drafting half of a round, as the draft runner captures it.
        draft_p = target_probs(d_logits, rows, repeats=k)
        return sample(draft_p).view(bs, k), draft_p.view(bs, k, vocab)

    torch.cuda.set_sync_debug_mode("error")
    try:
        eager_drafts, eager_probs = step()  # raises on any synchronising call
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        drafts, probs = step()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(probs, eager_probs)
    greedy = torch.arange(bs, device=dev) % 2 == 0
    assert torch.equal(drafts[greedy], eager_drafts[greedy])
    # Sampled rows draw fresh noise on replay but stay inside their filtered support.
    assert probs.gather(2, drafts[..., None]).gt(0).all()
