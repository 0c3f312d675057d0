"""kernels/target_filter.py vs its reference, ``sampling/target.target_probs``, for both backends.

Without a GPU the kernels run in Triton's CPU interpreter (see triton_env.py); with CUDA they run
compiled on the same cases. Small vocabularies with C = 16 candidates, C2 = 48 listed tokens,
64-token chunks and 32-token tiles, so rows span many chunks and each path runs: the candidates,
the list (nuclei between C and C2) and the whole vocabulary (wider nuclei).
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.target_filter import TargetRows, target_filter_fwd
from triton_env import DEVICE

from sglang_sparsespec.sampling.target import SamplingBackend, SamplingRows, target_probs

C, C2, CHUNK, BLOCK_V = 16, 48, 64, 32
LAUNCH = {"candidates": C, "wide_candidates": C2, "chunk": CHUNK, "block_v": BLOCK_V}
BACKENDS = list(SamplingBackend)


def _run(logits, temps, top_ks, top_ps, min_ps=None, repeats=1, backend=SamplingBackend.FLASHINFER):
    """(kernel rows, reference rows) for per-request parameter lists."""
    rows = SamplingRows(
        temperature=torch.tensor(temps, dtype=torch.float32, device=DEVICE),
        top_p=torch.tensor(top_ps, dtype=torch.float32, device=DEVICE),
        top_k=torch.tensor(top_ks, dtype=torch.int32, device=DEVICE),
        min_p=None if min_ps is None else torch.tensor(min_ps, dtype=torch.float32, device=DEVICE),
        backend=backend,
    )
    logits = logits.to(DEVICE)
    out = target_filter_fwd(logits, rows.temperature, rows.top_k, rows.top_p, rows.min_p, repeats,
                            backend is SamplingBackend.PYTORCH, **LAUNCH)  # fmt: skip
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
    assert out.compact.any() and not out.compact.all()  # both paths ran
    _assert_same(out, ref)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_at_the_cut_follow_the_backend(backend):
    """Four tokens tied at the top-k cut: flashinfer keeps all, pytorch the lowest ids; the same on
    the candidate path (few tokens near the top) and past it (more ties than C)."""
    vocab = 300
    logits = torch.full((2, vocab), -5.0)
    logits[0, [3, 40, 41, 200, 250]] = torch.tensor([2.0, 1.0, 1.0, 1.0, 1.0])
    logits[1, :] = 1.0
    logits[1, 7] = 2.0
    out, ref = _run(logits, [1.0, 1.0], [3, 3], [1.0, 1.0], backend=backend)
    _assert_same(out, ref)
    support = out.dense()[0].nonzero().view(-1).tolist()
    assert support == ([3, 40, 41] if backend is SamplingBackend.PYTORCH else [3, 40, 41, 200, 250])
    assert out.compact.tolist() == [1, 0]


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
    assert not out.compact.any()
    _assert_same(out, ref)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("min_p", [None, [0.01, 0.0]])
def test_nucleus_between_the_candidates_and_the_list(min_p, backend):
    """About 30 tokens near the top (with ties): wider than C = 16, within C2 = 48."""
    gen = torch.Generator().manual_seed(8)
    logits = torch.randn(2, 600, generator=gen) - 4
    logits[:, 100:130] = (torch.rand(2, 30, generator=gen) * 4).round().div(4) + 4
    out, ref = _run(logits, [1.0, 0.7], [-1, 25], [0.9, 0.95], min_p, 1, backend)
    assert not out.compact.any()
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


def test_launch_parameters_do_not_change_the_rows():
    gen = torch.Generator().manual_seed(6)
    logits = _mixed_logits(gen, 8, 333).to(DEVICE)
    t = torch.tensor([0.6, 1.0, 0.8, 1.0], device=DEVICE)
    k = torch.tensor([20, -1, 3, 1], dtype=torch.int32, device=DEVICE)
    p = torch.tensor([0.95, 0.9, 1.0, 1.0], device=DEVICE)
    a = target_filter_fwd(logits, t, k, p, None, 2, **LAUNCH).dense()
    b = target_filter_fwd(logits, t, k, p, None, 2, **(LAUNCH | {"chunk": 128, "block_v": 64})).dense()
    assert torch.equal(a > 0, b > 0)  # the sums round differently per chunking, the support never
    torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
