"""kernels/target_filter.py vs its reference, ``sampling/target.target_probs``, for both backends.

Without a GPU the kernels run in Triton's CPU interpreter (see triton_env.py); with CUDA they run
compiled on the same cases. Small vocabularies with lists of L = 48 tokens, 64-token chunks and
32-token tiles, so rows span many chunks and each path runs: the first list (peaked rows; level 1's top
bins and the candidate list, every case with each), a bracket under it (nuclei wider than L, one to
three histogram levels), a bracket of one tied value, and the whole row.
"""

from __future__ import annotations

import random

import pytest
import torch
from sglang_sparsespec.kernels.logit_bins import RowPath
from sglang_sparsespec.kernels.target_filter import TargetRows, target_filter_fwd
from triton_env import DEVICE

from sglang_sparsespec.sampling.target import SamplingBackend, SamplingRows, target_probs

L, CHUNK, BLOCK_V = 48, 64, 32
LAUNCH = {"list_cap": L, "chunk": CHUNK, "block_v": BLOCK_V, "num_warps": 1}  # a token a thread
BACKENDS = list(SamplingBackend)


@pytest.fixture(autouse=True, params=[False, True], ids=["top_bins", "candidates"])
def first_list(request, monkeypatch):
    """Every case with either first list: level 1's top bins and ``top_candidates``' (the server's default)."""
    monkeypatch.setitem(LAUNCH, "candidates", request.param)
    return request.param


def _run(logits, temps, top_ks, top_ps, min_ps=None, repeats=1, backend=SamplingBackend.FLASHINFER, **launch):
    """(kernel rows, reference rows) for per-request parameter lists."""
    rows = SamplingRows(
        temperature=torch.tensor(temps, dtype=torch.float32, device=DEVICE),
        top_p=torch.tensor(top_ps, dtype=torch.float32, device=DEVICE),
        top_k=torch.tensor(top_ks, dtype=torch.int32, device=DEVICE),
        min_p=None if min_ps is None else torch.tensor(min_ps, dtype=torch.float32, device=DEVICE),
        backend=backend,
    )
    logits = logits.to(DEVICE)
    out = target_filter_fwd(
        logits,
        rows.temperature,
        rows.top_k,
        rows.top_p,
        rows.min_p,
        repeats,
        backend is SamplingBackend.PYTORCH,
        **(LAUNCH | launch),
    )
    return out, target_probs(logits, rows, repeats)


def _assert_same(out: TargetRows, ref: torch.Tensor) -> None:
    got = out.dense()
    assert torch.equal(got > 0, ref > 0), ((got > 0).sum(1), (ref > 0).sum(1))
    torch.testing.assert_close(got, ref, atol=1e-6, rtol=1e-5)


def _mixed_logits(gen: torch.Generator, n: int, vocab: int) -> torch.Tensor:
    """Peaked rows (a few lifted tokens), flat rows (nucleus >> C), bf16-valued rows with many
    ties near the top, and a row whose first chunk is masked to -inf (a grammar mask)."""
    logits = torch.randn(n, vocab, generator=gen) * 3
    logits[0::4, :8] += 10
    logits[1::4] *= 0.1
    logits[2::4] = (logits[2::4] * 2).round().div(2).to(torch.bfloat16).float()
    logits[3, :CHUNK] = -torch.inf
    return logits


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("min_p", [None, [0.0, 0.05, 0.3, 0.1, 0.0, 0.02]])
def test_matches_target_probs(min_p, backend):
    gen = torch.Generator().manual_seed(0)
    vocab, repeats = 433, 2
    temps = [0.6, 1.0, 1.5, 0.6, 1.0, 0.0]  # the last is greedy by temperature
    top_ks = [-1, 5, 40, 1, 1 << 30, 20]  # off, inside C, > C, greedy, off, > C
    top_ps = [0.95, 1.0, 0.9, 1.0, 1.0, 0.8]
    out, ref = _run(_mixed_logits(gen, 12, vocab), temps, top_ks, top_ps, min_p, repeats, backend)
    paths = set(out.path.tolist())
    assert {RowPath.FULL, RowPath.WINDOW, RowPath.NOFILTER} <= paths, paths  # the top list, a bracket, no filter
    _assert_same(out, ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_at_the_cut_follow_the_backend(backend):
    """Four tokens tied at the top-k cut: flashinfer keeps all, pytorch the lowest ids; the same on
    the top list (few tokens near the top) and past it (more ties than the list holds: one tied value)."""
    vocab = 300
    logits = torch.full((2, vocab), -5.0)
    logits[0, [3, 40, 41, 200, 250]] = torch.tensor([2.0, 1.0, 1.0, 1.0, 1.0])
    logits[1, :] = 1.0
    logits[1, 7] = 2.0
    out, ref = _run(logits, [1.0, 1.0], [3, 3], [1.0, 1.0], backend=backend)
    _assert_same(out, ref)
    support = out.dense()[0].nonzero().view(-1).tolist()
    assert support == ([3, 40, 41] if backend is SamplingBackend.PYTORCH else [3, 40, 41, 200, 250])
    assert out.path.tolist() == [RowPath.FULL, RowPath.TIE]


@pytest.mark.parametrize("backend", BACKENDS)
def test_top_p_cut_inside_a_tie(backend):
    vocab = 200
    logits = torch.full((1, vocab), -30.0)
    logits[0, [5, 90, 91, 150]] = torch.tensor([1.2, 1.0, 1.0, 1.0])
    out, ref = _run(logits, [1.0], [-1], [0.5], backend=backend)
    _assert_same(out, ref)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("min_p", [None, [0.0]])
def test_nucleus_wider_than_the_candidates_takes_the_exact_path(min_p, backend):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 700, generator=gen) * 0.2
    out, ref = _run(logits, [1.0, 0.7, 1.0], [-1, 100, 1 << 30], [0.9, 0.95, 1.0], min_p and min_p * 3, 1, backend)
    assert (out.path != RowPath.FULL).all()
    _assert_same(out, ref)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("min_p", [None, [0.01, 0.0]])
def test_nucleus_between_the_candidates_and_the_list(min_p, backend, first_list):
    """About 30 tokens near the top (with ties) under a top list too small for them: a bracket under it."""
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(2, 600, generator=gen) - 4
    logits[:, 100:130] = (torch.rand(2, 30, generator=gen) * 4).round().div(4) + 4
    out, ref = _run(logits, [1.0, 0.7], [-1, 25], [0.9, 0.95], min_p, 1, backend, list_cap=24)
    # Row 1 under flashinfer's min-p rule judges top-p on its top-25 mass, which a 24-token list cannot
    # hold: the whole row decides it after a top list of bins, the bracket stage from bin 0 after candidates.
    joint = min_p is not None and backend is SamplingBackend.FLASHINFER and not first_list
    assert out.path.tolist() == [RowPath.WINDOW, RowPath.VOCAB if joint else RowPath.WINDOW]
    _assert_same(out, ref)


def test_min_p_with_top_k_above_the_candidates():
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 500, generator=gen)
    for backend in BACKENDS:
        out, ref = _run(logits, [1.0, 0.8], [100, 60], [0.9, 0.7], [0.05, 0.2], 1, backend)
        _assert_same(out, ref)


def test_rejects_bad_shapes():
    logits = torch.zeros(4, 50, device=DEVICE)
    one = torch.ones(2, device=DEVICE)
    k = torch.ones(2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="parameters"):
        target_filter_fwd(logits, one, k, one, None, repeats=3)
    with pytest.raises(ValueError, match="integer"):
        target_filter_fwd(logits, one, one, one, None, repeats=2)
    with pytest.raises(ValueError, match="multiple"):
        target_filter_fwd(logits, one, k, one, None, repeats=2, chunk=48, block_v=32)
    with pytest.raises(ValueError, match="a token a thread"):  # 32 tokens over 4 warps' 128 threads
        target_filter_fwd(logits, one, k, one, None, repeats=2, chunk=64, block_v=32)


def test_launch_parameters_do_not_change_the_rows():
    gen = torch.Generator().manual_seed(6)
    logits = _mixed_logits(gen, 8, 333).to(DEVICE)
    t = torch.tensor([0.6, 1.0, 0.8, 1.0], device=DEVICE)
    k = torch.tensor([20, -1, 3, 1], dtype=torch.int32, device=DEVICE)
    p = torch.tensor([0.95, 0.9, 1.0, 1.0], device=DEVICE)
    a = target_filter_fwd(logits, t, k, p, None, 2, **LAUNCH).dense()
    b = target_filter_fwd(logits, t, k, p, None, 2, **(LAUNCH | {"chunk": 128, "block_v": 64, "num_warps": 2})).dense()
    assert torch.equal(a > 0, b > 0)  # the sums round differently per chunking, the support never
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_near_uniform_rows_are_refined_not_scanned(backend):
    """Rows whose nucleus holds most of the vocabulary (random weights' logits), with a 16-token list: the
    bracket under the top list holds more than the list at level 1 and is split into finer bins until it
    fits (levels 2-3); with one level it is resolved over the whole row instead. Both exact."""
    gen = torch.Generator().manual_seed(12)
    logits = torch.randn(4, 3000, generator=gen) * 1e-3
    logits[2:] = logits[2:].to(torch.bfloat16).float()  # bf16 values: ties at the cut
    args = (logits, [0.6, 1.0, 0.6, 1.0], [-1, -1, -1, 2000], [0.95, 0.9, 0.95, 0.99], None, 1, backend)
    out, ref = _run(*args, list_cap=16, chunk=256, block_v=64, num_warps=2)
    _assert_same(out, ref)
    assert set(out.path.tolist()) <= {RowPath.WINDOW, RowPath.TIE} and RowPath.WINDOW in out.path.tolist()
    one, ref = _run(*args, list_cap=16, chunk=256, block_v=64, num_warps=2, levels=1)
    _assert_same(one, ref)
    assert RowPath.VOCAB in one.path.tolist()


KINDS = ("peaked", "flat", "tiny", "bf16", "const", "zipf", "masked")


def _random_case(rng: random.Random, gen: torch.Generator, kind: str, n: int, vocab: int) -> torch.Tensor:
    if kind == "peaked":
        logits = torch.randn(n, vocab, generator=gen) * 3
        logits[:, : rng.randint(1, 30)] += rng.uniform(3, 12)
    elif kind == "flat":
        logits = torch.randn(n, vocab, generator=gen) * rng.choice([0.01, 0.1, 0.5])
    elif kind == "tiny":
        logits = torch.randn(n, vocab, generator=gen) * 1e-4 + 1.0
    elif kind == "bf16":
        logits = (torch.randn(n, vocab, generator=gen) * rng.choice([0.02, 0.3, 2.0])).to(torch.bfloat16).float()
    elif kind == "const":
        logits = torch.full((n, vocab), 0.5)
        logits[:, rng.randrange(vocab)] += rng.choice([0.0, 1.0])
    elif kind == "zipf":
        rank = torch.arange(1, vocab + 1).float().log()
        logits = torch.stack(
            [
                (-rng.uniform(0.5, 2.0) * rank + torch.randn(vocab, generator=gen) * 0.3)[
                    torch.randperm(vocab, generator=gen)
                ]
                for _ in range(n)
            ]
        )
    else:
        logits = torch.randn(n, vocab, generator=gen) * 2
        logits[:, : vocab // 3] = -torch.inf
    return logits


@pytest.mark.parametrize("seed", [0, 1])
def test_random_rows_match_target_probs(seed):
    """Every kind of row (peaked, flat, near-constant, bf16 ties, constant, Zipf-like, a third masked) under
    random parameters, list sizes and chunkings: the same kept sets and probabilities as the reference."""
    rng, gen = random.Random(seed), torch.Generator().manual_seed(seed)
    for kind in KINDS:
        n, vocab = 6, rng.choice([300, 700, 1500])
        temps = [rng.choice([0.0, 0.6, 1.0, 1.5, 3.0]) for _ in range(n)]
        top_ks = [rng.choice([-1, 1, 5, 40, 200, vocab - 1, 1 << 30]) for _ in range(n)]
        top_ps = [rng.choice([1.0, 0.99, 0.95, 0.9, 0.5, 0.2]) for _ in range(n)]
        min_ps = None if rng.random() < 0.5 else [rng.choice([0.0, 0.001, 0.05, 0.3]) for _ in range(n)]
        chunk, block_v = rng.choice([(64, 32), (128, 64), (256, 64)])
        out, ref = _run(
            _random_case(rng, gen, kind, n, vocab),
            temps,
            top_ks,
            top_ps,
            min_ps,
            1,
            rng.choice(BACKENDS),
            list_cap=rng.choice([16, 48, 128]),
            chunk=chunk,
            block_v=block_v,
            num_warps=block_v // 32,
        )
        _assert_same(out, ref)
