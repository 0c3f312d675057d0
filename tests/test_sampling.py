"""Tests for the sampling pipeline of a sampled PILLAR round, end to end on toy models.

The draft sampler over C candidates (``kernels/draft_sample.py``: its torch reference here, the
kernel against it in test_sampling_kernels.py) and exact rejection sampling against the compact draft
record: a chi-square test that every emitted token follows the target, with negative controls
that must fail it. On a GPU the verify is the path that ships (``kernels/target_filter.py`` and
``kernels/verify_accept.py``); under the interpreter the references (``sampling/target.target_probs``,
``sampling/rejection.rejection_sample``), which the kernels match token for token in
test_sampling_kernels.py.
Stock's filters themselves: test_stock_filters.py.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from sglang_sparsespec.kernels.draft_sample import DraftSampleInputs, draft_sample_fwd, draft_sample_ref
from sglang_sparsespec.kernels.target_filter import TargetRows, target_filter_fwd
from sglang_sparsespec.kernels.verify_accept import rejection_fwd
from triton_env import DEVICE, INTERPRET

from sglang_sparsespec.sampling.rejection import DraftRecord, rejection_sample
from sglang_sparsespec.sampling.target import SamplingRows, target_probs


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


# ---------------------------------------------------------------- drafts, records, rejection sampling


def _draft(logits: torch.Tensor, rows: SamplingRows, c: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """One draft step as the draft runner runs it: (token, cand_ids, cand_q, q_tok)."""
    n = logits.shape[0]
    noise = torch.empty((n, c), device=logits.device).exponential_(generator=gen)
    min_p = rows.min_p if rows.min_p is not None else torch.zeros_like(rows.top_p)
    x = DraftSampleInputs(logits, rows.temperature, rows.top_p, rows.top_k, min_p, noise)
    if INTERPRET:  # the compiled kernel is checked against this reference in test_sampling_kernels.py
        return draft_sample_ref(x)
    token = torch.empty(n, dtype=torch.int64, device=logits.device)
    cand_ids = torch.empty((n, c), dtype=torch.int64, device=logits.device)
    cand_q = torch.empty((n, c), device=logits.device)
    q_tok = torch.empty(n, device=logits.device)
    draft_sample_fwd(x, token, cand_ids, cand_q, q_tok)
    return token, cand_ids, cand_q, q_tok


def _verify(
    target_p: torch.Tensor | TargetRows, record: DraftRecord, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling with fresh coins, plus its bookkeeping checks (accepted tokens are drafts):
    the reference on dense rows, the GPU kernel on ``target_filter_fwd``'s rows."""
    bs, k = record.tokens.shape
    coins = torch.rand((bs, k), generator=gen, device=DEVICE)
    final_coins = torch.rand(bs, generator=gen, device=DEVICE)
    if isinstance(target_p, TargetRows):
        r = record
        emitted, n = rejection_fwd(target_p, r.tokens, r.cand_ids, r.cand_q, r.q_tok, r.num_drafts, coins, final_coins)
    else:
        emitted, n = rejection_sample(target_p, record, coins, final_coins)
    assert n.min() >= 0 and n.max() <= k
    col = torch.arange(k + 1, device=DEVICE)[None, :]
    assert torch.equal(emitted < 0, col > n[:, None])
    accepted = col[:, :-1] < n[:, None]
    assert torch.equal(torch.where(accepted, emitted[:, :-1], -1), torch.where(accepted, record.tokens, -1))
    return emitted, n


V, K, C = 7, 2, 4
# Non-greedy parameters whose filters zero some tokens, so p and q have holes in their support;
# C < V, so the proposal is also cut to the draft's four largest logits.
SAMPLED = ([0.9], [0.95], [5], [0.02])
N_CHECK = 200_000
N_CONTROL = 50_000


def _markov_round(n: int, seed: int, tamper: str | None = None, num_drafts: int | torch.Tensor = K):
    """n independent speculative rounds on a Markov toy model, the worker's pipeline end to end.

    The target and draft logits at output position j depend on the token before it (position 0's
    context is token 0): t_logits[j, prev], d_logits[j, prev]. So p_0 and q_0 are fixed and
    p_j = p_j(. | d_{j-1}), q_j = q_j(. | d_{j-1}). Drafts are sampled step by step with the draft
    sampler; the verify rows are target_probs of the target logits after the drafted prefix.
    tamper: None; "shifted" hands the verify each draft's record one position off; "uniform"
    claims q is uniform over the candidates; "past_drafts" makes the verify subtract a stale
    record after each request's last real draft (told one draft more, whose accept test always
    fails). num_drafts < K (an int, or a [n] tensor of per-request counts): only that many drafts
    count, the columns after them hold garbage (as a round that drafts fewer than the verify width
    leaves them).
    Returns (p_table [K+1, V, V] with p_table[j, c] = p_j(. | c), emitted, num_accepted).
    """
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    table_gen = torch.Generator().manual_seed(1234)  # one fixed model for every test
    t_logits = (torch.randn(K + 1, V, V, generator=table_gen) * 1.5).to(DEVICE)
    d_logits = t_logits[:K] + (torch.randn(K, V, V, generator=table_gen) * 1.5).to(DEVICE)
    rows = _rows(*(col * n for col in SAMPLED), device=DEVICE)
    prev = torch.zeros(n, dtype=torch.int64, device=DEVICE)
    contexts, steps = [prev], []
    for j in range(K):
        step = _draft(d_logits[j, prev], rows, C, gen)
        prev = step[0]
        steps.append(step)
        contexts.append(prev)
    ctx = torch.stack(contexts, dim=1)  # [n, K+1]: the token before each output position
    t_rows = t_logits[torch.arange(K + 1, device=DEVICE)[None, :], ctx].reshape(-1, V)
    if INTERPRET:  # the kernels are checked against the references, token for token, in test_sampling_kernels.py
        target_p = target_probs(t_rows, rows, repeats=K + 1).view(n, K + 1, V)
    else:  # the path that ships; lists of 5 < V tokens, so both the top list and the brackets occur
        target_p = target_filter_fwd(t_rows, rows.temperature, rows.top_k, rows.top_p, rows.min_p, K + 1, list_cap=5)
    tokens, cand_ids, cand_q, q_tok = (torch.stack(parts, dim=1) for parts in zip(*steps))
    if tamper == "shifted":
        cand_ids, cand_q, q_tok = cand_ids.roll(1, dims=1), cand_q.roll(1, dims=1), q_tok.roll(1, dims=1)
    elif tamper == "uniform":
        cand_q, q_tok = torch.full_like(cand_q, 1 / C), torch.full_like(q_tok, 1 / C)
    counts = torch.full((n,), num_drafts, device=DEVICE) if isinstance(num_drafts, int) else num_drafts
    stale = torch.arange(K, device=DEVICE)[None, :] >= counts[:, None]
    if stale.any():  # full-width rounds draw no garbage: the seeded runs keep their coins
        tokens = torch.where(stale, torch.randint(0, V, (n, K), generator=gen, device=DEVICE), tokens)
        q_tok = torch.where(stale, torch.rand((n, K), generator=gen, device=DEVICE), q_tok)
        cand_q = torch.where(stale[..., None], 1.0, cand_q)
    if tamper == "past_drafts":
        q_tok = torch.where(stale, torch.inf, q_tok)
        num_drafts = (counts + 1).clamp(max=K)
    record = DraftRecord(tokens, cand_ids, cand_q, q_tok, num_drafts=num_drafts)
    emitted, n_acc = _verify(target_p, record, gen)
    assert (n_acc <= counts).all()
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
    # Not degenerate: every run length occurs often, so the residual max(p - q, 0) and the bonus
    # paths both produced many of the tested tokens.
    assert torch.bincount(n_acc, minlength=K + 1).min() > N_CHECK // 10


@pytest.mark.parametrize("num_drafts", [0, 1])
def test_fewer_drafts_than_the_verify_width_stay_exact(num_drafts):
    # Adaptive rounds draft fewer tokens than the verify graph's width: the stale columns must never
    # be accepted, and the token after the last real draft follows the target (no residual there).
    p_table, emitted, n_acc = _markov_round(N_CONTROL, seed=2, num_drafts=num_drafts)
    assert n_acc.max() == num_drafts
    for j in range(num_drafts + 1):
        p_value, df = _position_p_value(p_table, emitted, n_acc, j)
        assert df >= 3 and p_value > 1e-3, (j, p_value)


def _per_request_counts(n: int) -> torch.Tensor:
    # Every count 0..K, interleaved over the batch as an adaptive round mixing requests would.
    return torch.arange(n, device=DEVICE) % (K + 1)


def test_per_request_draft_counts_stay_exact():
    # Requests with their own draft counts in one verify: each group of one count must accept no
    # stale column, reach its count, and emit tokens that follow the target at every position,
    # the one after its last real draft included (drawn from the target, no residual there).
    counts = _per_request_counts(N_CONTROL)
    p_table, emitted, n_acc = _markov_round(N_CONTROL, seed=4, num_drafts=counts)
    for g in range(K + 1):
        sel = counts == g
        assert n_acc[sel].max() == g
        for j in range(g + 1):
            p_value, df = _position_p_value(p_table, emitted[sel], n_acc[sel], j)
            assert df >= 3 and p_value > 1e-3, (g, j, p_value)


def test_chi_square_detects_a_residual_past_the_drafts():
    # Negative control for the per-request counts: subtracting a stale record's q after a request's
    # last real draft (num_accepted == its count) skews that token, and the same check must see it.
    counts = _per_request_counts(N_CONTROL)
    p_table, emitted, n_acc = _markov_round(N_CONTROL, seed=4, tamper="past_drafts", num_drafts=counts)
    for g in range(K):
        sel = counts == g
        p_value = _position_p_value(p_table, emitted[sel], n_acc[sel], g)[0]
        assert p_value < 1e-6, (g, p_value)


@pytest.mark.parametrize("tamper", ["shifted", "uniform"])
def test_chi_square_detects_wrong_draft_records(tamper):
    # Negative controls: the same check must reject when the verify is fed records misaligned by
    # one position, or a q other than the one the drafts were drawn from.
    p_table, emitted, n_acc = _markov_round(N_CONTROL, seed=1, tamper=tamper)
    worst = min(_position_p_value(p_table, emitted, n_acc, j)[0] for j in (0, 1))
    assert worst < 1e-6, worst


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
    draft_rows = _rows(
        *(r.repeat_interleave(k).tolist() for r in (rows.temperature, rows.top_p, rows.top_k)), device=DEVICE
    )
    t_logits = torch.randn(bs * (k + 1), vocab, generator=gen, device=DEVICE)
    # Drafts are the target argmax unless noise flips them, so all run lengths occur.
    d_logits = t_logits.view(bs, k + 1, vocab)[:, :k].reshape(bs * k, vocab)
    d_logits = d_logits + torch.randn(bs * k, vocab, generator=gen, device=DEVICE) * 0.6
    target_p = target_probs(t_logits, rows, repeats=k + 1).view(bs, k + 1, vocab)
    token, cand_ids, cand_q, q_tok = (t.view(bs, k, *t.shape[1:]) for t in _draft(d_logits, draft_rows, 5, gen))
    assert torch.equal(token, d_logits.argmax(dim=-1).view(bs, k)) and torch.all(q_tok == 1.0)
    emitted, n_acc = _verify(target_p, DraftRecord(token, cand_ids, cand_q, q_tok), gen)
    ref_tokens, ref_n = _greedy_reference(target_p, token)
    assert emitted.tolist() == ref_tokens and n_acc.tolist() == ref_n
    assert len(set(ref_n)) >= 3  # the case mix is not degenerate


def test_record_size_at_qwen3_scale():
    # The memory bound: the draft record at batch 256, k = 8 must stay <= 256 MB (full fp32 rows
    # over Qwen3's 151,936-token vocabulary: 1.24 GB). C = 64: ids int64 + q float32 per candidate.
    bs, k, c = 256, 8, 64
    record_bytes = bs * k * (c * (8 + 4) + 8 + 4)
    assert record_bytes <= 256 * 2**20 and bs * k * 151_936 * 4 > 1.2e9


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
    bs, k, vocab, c = 3, 4, 11, 5
    rows = _rows([0.0, 0.7, 1.0], [1.0, 0.9, 0.5], [-1, 5, 1], [0.0, 0.1, 0.0], device="meta")
    logits = torch.empty(bs * (k + 1), vocab, device="meta", dtype=torch.bfloat16)
    probs = target_probs(logits, rows, repeats=k + 1)
    assert probs.shape == (bs * (k + 1), vocab) and probs.dtype == torch.float32
    record = DraftRecord(
        tokens=torch.empty(bs, k, dtype=torch.int64, device="meta"),
        cand_ids=torch.empty(bs, k, c, dtype=torch.int64, device="meta"),
        cand_q=torch.empty(bs, k, c, device="meta"),
        q_tok=torch.empty(bs, k, device="meta"),
    )
    coins, final = torch.empty(bs, k, device="meta"), torch.empty(bs, device="meta")
    emitted, n = rejection_sample(probs.view(bs, k + 1, vocab), record, coins, final)
    assert emitted.shape == (bs, k + 1) and n.shape == (bs,)
    # Per-request draft counts are device data too: validated and used without reading them.
    record = replace(record, num_drafts=torch.empty(bs, dtype=torch.int32, device="meta"))
    emitted, n = rejection_sample(probs.view(bs, k + 1, vocab), record, coins, final)
    assert emitted.shape == (bs, k + 1) and n.shape == (bs,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graph_capture_without_sync():
    bs, vocab, c = 8, 1000, 64
    dev = "cuda"
    rows = _rows([0.0, 0.7] * 4, [1.0, 0.9] * 4, [-1, 50] * 4, [0.0, 0.05] * 4, device=dev)
    logits = torch.randn(bs, vocab, device=dev)
    gen = torch.Generator(device=dev).manual_seed(0)

    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = _draft(logits, rows, c, gen)  # raises on any synchronising call
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        _draft(logits, rows, c, torch.cuda.default_generators[0])
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        token, cand_ids, cand_q, _ = _draft(logits, rows, c, torch.cuda.default_generators[0])
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(cand_q, eager[2])
    greedy = torch.arange(bs, device=dev) % 2 == 0
    assert torch.equal(token[greedy], eager[0][greedy])
    # Sampled rows draw fresh noise on replay but stay inside their proposal's support.
    assert (cand_q.gather(1, (cand_ids == token[:, None]).int().argmax(1, keepdim=True)) > 0).all()
