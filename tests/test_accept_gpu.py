"""GPU: the accept phase samples what stock SGLang's own samplers draw from, ties included, and
captures in a CUDA graph without a host sync, with either first list (the candidates, the top bins).

Needs CUDA with SGLang's sampling kernels (flashinfer, sgl_kernel). On bf16-valued logits (few
distinct values near the top, so the top-k / top-p cut often falls inside a group of equal tokens,
and tied maxima for greedy rows) each row is sampled many times by stock's own code path for the
backend (``Sampler._sample_from_probs``: flashinfer's joint ``top_k_top_p_sampling_from_probs``, or
``top_k_renorm_prob`` -> ``top_p_renorm_prob`` -> ``min_p_sampling_from_probs`` with min-p; the
pytorch backend's ``top_k_top_p_min_p_sampling_from_probs_torch``), and the counts are tested
against ``kernels/target_filter.py``'s rows: nothing drawn outside their support, chi-square p >
1e-4. The rows also equal the torch reference (``sampling/target.target_probs``).

    python -m pytest tests/test_accept_gpu.py -q -s
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.target_filter import target_filter_fwd
from sglang_sparsespec.kernels.verify_accept import rejection_fwd
from test_sampling import _chi2, _p_value

from sglang_sparsespec.sampling.target import SamplingBackend, SamplingRows, target_probs

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and SGLang's sampling kernels")

TOP_K_ALL = 1 << 30
VOCAB, ROWS, DRAWS, CHUNK_ROWS = 32_768, 4, 400_000, 8_192
# (temperature, top_k, top_p, min_p or None for a batch without min-p); greedy is top_k 1 at T 1.
CASES = [
    (0.6, 20, 0.95, None),
    (0.6, 50, 0.9, None),
    (0.6, TOP_K_ALL, 0.95, None),
    (1.0, 1, 1.0, None),
    (0.6, 20, 0.95, 0.05),
    (0.8, TOP_K_ALL, 0.9, 0.1),
]


def _tied_logits(seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(ROWS, VOCAB, generator=gen) * 2
    logits[:, :64] += 8
    logits[:, 100:103] = logits.max(dim=-1, keepdim=True).values + 1  # three tied maxima per row
    return logits.to(torch.bfloat16).float().cuda()


def _stock_draws(probs: torch.Tensor, top_k: int, top_p: float, min_p: float | None, backend: SamplingBackend):
    """One row's token counts under stock's sampler of ``backend``, DRAWS draws."""
    from flashinfer.sampling import min_p_sampling_from_probs, top_k_top_p_sampling_from_probs
    from sgl_kernel import top_k_renorm_prob, top_p_renorm_prob
    from sglang.srt.layers.sampler import top_k_top_p_min_p_sampling_from_probs_torch

    counts = torch.zeros(VOCAB, dtype=torch.int64, device="cuda")
    for start in range(0, DRAWS, CHUNK_ROWS):
        n = min(CHUNK_ROWS, DRAWS - start)
        rows = probs.expand(n, -1).contiguous()
        ks = torch.full((n,), top_k, dtype=torch.int32, device="cuda")
        ps = torch.full((n,), top_p, dtype=torch.float32, device="cuda")
        mins = torch.full((n,), min_p or 0.0, dtype=torch.float32, device="cuda")
        if backend is SamplingBackend.PYTORCH:
            pos = torch.zeros(n, dtype=torch.int64, device="cuda")
            ids = top_k_top_p_min_p_sampling_from_probs_torch(rows, ks, ps, mins, min_p is not None, None, pos)
        elif min_p is None:
            ids = top_k_top_p_sampling_from_probs(rows, ks, ps, filter_apply_order="joint")
        else:
            ids = min_p_sampling_from_probs(top_p_renorm_prob(top_k_renorm_prob(rows, ks), ps), mins)
        counts += torch.bincount(ids.long(), minlength=VOCAB)
    return counts


@pytest.mark.parametrize("backend", list(SamplingBackend))
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"T{c[0]}-k{c[1]}-p{c[2]}-minp{c[3]}")
def test_target_rows_are_what_stock_samples(case, backend):
    temp, top_k, top_p, min_p = case
    logits = _tied_logits(CASES.index(case))
    one = torch.ones(ROWS, device="cuda")
    rows = SamplingRows(
        one * temp,
        one * top_p,
        torch.full((ROWS,), top_k, dtype=torch.int32, device="cuda"),
        None if min_p is None else one * min_p,
        backend,
    )
    ref = target_probs(logits, rows)
    # Both first lists (the server's candidates, the top bins) must give the reference's rows; the draws below are
    # checked against the candidates' rows, the server's default.
    for candidates in (False, True):
        ours = target_filter_fwd(
            logits,
            rows.temperature,
            rows.top_k,
            rows.top_p,
            rows.min_p,
            1,
            backend is SamplingBackend.PYTORCH,
            candidates=candidates,
        ).dense()
        assert torch.equal(ours > 0, ref > 0), candidates
        torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)
    probs = torch.softmax(logits / temp, dim=-1)
    for r in range(ROWS):
        want = ours[r].double().cpu()
        counts = _stock_draws(probs[r : r + 1], top_k, top_p, min_p, backend).cpu()
        support = want > 0
        p_row = probs[r].cpu()
        tied = int((p_row == p_row[support].min()).sum())
        print(
            f"{case} {backend.value} row {r}: keeps {int(support.sum())} ({tied} tokens at the cut value), stock "
            f"drew {int((counts > 0).sum())} ids, outside the support: {int(counts[~support].sum())}"
        )
        assert counts[~support].sum() == 0, (r, int(counts[~support].sum()))
        stat, df = _chi2(counts, want * DRAWS)
        # A one-token support (greedy under the pytorch rule) leaves no degree of freedom: the support
        # check above is then the whole test.
        assert df == 0 or _p_value(stat, df) > 1e-4, (r, stat, df)
        if top_k == 1:  # the three tied maxima: all of them under flashinfer, the first under pytorch
            assert support.nonzero().view(-1).tolist() == (
                [100] if backend is SamplingBackend.PYTORCH else [100, 101, 102]
            )


@pytest.mark.parametrize("candidates", [False, True])
@pytest.mark.parametrize("rank_rule", [False, True])
def test_accept_phase_captures_in_a_cuda_graph_without_sync(rank_rule, candidates):
    """target_filter_fwd + rejection_fwd (the mixed runner captures them): no synchronising call,
    and a replay gives the eager tokens for the same coins, wide rows (the fallbacks) included."""
    bs, k, vocab, c = 8, 3, 5000, 16
    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    logits = torch.randn(bs * (k + 1), vocab, device=dev, generator=gen) * 3
    logits[:, :10] += 8
    logits[::3] *= 0.02  # flat: nuclei wider than both candidate lists
    temp = torch.full((bs,), 0.7, device=dev)
    top_k = torch.tensor([20, 1 << 30, 1, 50] * 2, dtype=torch.int32, device=dev)
    top_p = torch.tensor([0.95, 0.9, 1.0, 1.0] * 2, device=dev)
    min_p = torch.tensor([0.0, 0.05] * 4, device=dev)
    ids = torch.stack([torch.randperm(vocab, device=dev)[:c] for _ in range(bs * k)]).view(bs, k, c)
    q = torch.softmax(torch.randn(bs, k, c, device=dev, generator=gen), -1)
    record = (ids[:, :, 0].contiguous(), ids, q, q[:, :, 0].contiguous())
    coins, final = torch.rand(bs, k, device=dev, generator=gen), torch.rand(bs, device=dev, generator=gen)

    def accept():
        target = target_filter_fwd(
            logits, temp, top_k, top_p, min_p, k + 1, rank_rule, list_cap=256, candidates=candidates
        )
        return rejection_fwd(target, *record, k, coins, final)

    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = accept()  # raises on any synchronising call
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        accept()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = accept()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1])
