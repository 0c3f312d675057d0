"""``sampling/target.target_probs`` against stock SGLang's sampling rules, written out independently.

flashinfer (the default backend): a literal per-token form of its kernels' tests (count and mass
of the strictly greater tokens); pytorch: SGLang's ``top_k_top_p_min_p_sampling_from_probs_torch``
filtering as written. On bf16-rounded logits with many ties at the cut, top_k 20 / 50, top_p 0.9 /
0.95, min-p and greedy rows inside sampled batches.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_sampling import _rows

from sglang_sparsespec.sampling.target import SamplingBackend, SamplingRows, target_probs


def stock_flashinfer_row(probs: torch.Tensor, top_k: int, top_p: float, min_p: float | None) -> torch.Tensor:
    """Stock's flashinfer sampler written literally, one token at a time (a second reference):
    joint: x is drawn iff #{p > p_x} < top_k and mass{p > p_x} < top_p; with min-p, top-k renorm,
    top-p renorm (each keeping the tokens that pass that test), then p >= min_p x max."""

    def greater(p: torch.Tensor, x: int) -> tuple[int, float]:
        above = p > p[x]
        return int(above.sum()), float(p[above].sum())

    vocab = probs.shape[0]
    k = vocab if top_k <= 0 or top_k >= vocab else top_k
    lim = float("inf") if top_p >= 1.0 else top_p
    if min_p is None:
        keep = torch.tensor([greater(probs, x)[0] < k and greater(probs, x)[1] < lim for x in range(vocab)])
        return torch.where(keep, probs, 0.0) / torch.where(keep, probs, 0.0).sum()
    p = torch.where(torch.tensor([greater(probs, x)[0] < k for x in range(vocab)]), probs, 0.0)
    p = p / p.sum()
    p = torch.where(torch.tensor([greater(p, x)[1] < lim for x in range(vocab)]), p, 0.0)
    p = p / p.sum()
    p = torch.where(p >= min_p * p.max(), p, 0.0)
    return p / p.sum()


def stock_pytorch_rows(probs: torch.Tensor, top_ks, top_ps, min_ps) -> torch.Tensor:
    """``top_k_top_p_min_p_sampling_from_probs_torch``'s filtering as SGLang writes it (the draw is
    a multinomial over what survives), the sort stable: equal probabilities rank by lower id."""
    probs_sort, probs_idx = probs.sort(dim=-1, descending=True, stable=True)
    probs_sum = torch.cumsum(probs_sort, dim=-1)
    probs_sort[torch.arange(0, probs.shape[-1]).view(1, -1) >= top_ks.view(-1, 1)] = 0.0
    probs_sort[(probs_sum - probs_sort) > top_ps.view(-1, 1)] = 0.0
    if min_ps is not None:
        probs_sort[probs_sort < (probs_sort[:, 0] * min_ps).view(-1, 1)] = 0.0
    out = torch.zeros_like(probs).scatter_(1, probs_idx, probs_sort)
    return out / out.sum(dim=-1, keepdim=True)


def _bf16_tied_logits(gen: torch.Generator, n: int, vocab: int) -> torch.Tensor:
    """Logits as a bf16 model emits them: few distinct values near the top, so the cut often
    falls inside a group of equal tokens."""
    logits = torch.randn(n, vocab, generator=gen) * 2
    logits[:, : vocab // 8] += 4
    return (logits * 2).round().div(2).to(torch.bfloat16).float()


# (temperature, top_p, top_k, min_p) in SGLang's encoding: off is top_k 1 << 30, top_p 1.0, min_p 0;
# greedy is top_k 1 at temperature 1.
PARAMS = [
    (0.6, 0.95, 20, 0.0),
    (1.0, 0.9, 50, 0.05),
    (0.8, 0.9, 1 << 30, 0.0),
    (1.0, 1.0, 1, 0.0),  # a greedy request inside a sampled batch
    (0.6, 0.95, 5, 0.2),
    (1.3, 1.0, 1 << 30, 0.1),
    (0.7, 0.5, 3, 0.0),
    (1.0, 1.0, 1 << 30, 0.0),
]


@pytest.mark.parametrize("with_min_p", [False, True])
def test_flashinfer_rule_matches_a_literal_reference_on_tied_rows(with_min_p):
    gen = torch.Generator().manual_seed(0)
    vocab, repeats = 64, 2
    logits = _bf16_tied_logits(gen, len(PARAMS) * repeats, vocab)
    temps, top_ps, top_ks, min_ps = map(list, zip(*PARAMS))
    got = target_probs(logits, _rows(temps, top_ps, top_ks, min_ps if with_min_p else None), repeats=repeats)
    ties_at_cut = 0
    for i in range(logits.shape[0]):
        temp, top_p, top_k, min_p = PARAMS[i // repeats]
        probs = torch.softmax(logits[i] / temp, dim=0)
        want = stock_flashinfer_row(probs, top_k, top_p, min_p if with_min_p else None)
        assert torch.equal(got[i] > 0, want > 0), i
        torch.testing.assert_close(got[i], want, atol=1e-6, rtol=1e-5)
        kept = want > 0
        ties_at_cut += int(((probs == probs[kept].min()) & kept).sum() > 1)
    assert ties_at_cut >= 4  # the rows do exercise ties at the cut


@pytest.mark.parametrize("with_min_p", [False, True])
def test_pytorch_rule_matches_sglangs_torch_sampler(with_min_p):
    gen = torch.Generator().manual_seed(1)
    vocab, repeats = 64, 2
    logits = _bf16_tied_logits(gen, len(PARAMS) * repeats, vocab)
    temps, top_ps, top_ks, min_ps = map(list, zip(*PARAMS))
    rows = replace(_rows(temps, top_ps, top_ks, min_ps if with_min_p else None), backend=SamplingBackend.PYTORCH)
    got = target_probs(logits, rows, repeats=repeats)
    per_row = [torch.tensor(c).repeat_interleave(repeats) for c in (temps, top_ps, top_ks, min_ps)]
    probs = torch.softmax(logits / per_row[0][:, None], dim=-1)
    want = stock_pytorch_rows(probs, per_row[2], per_row[1], per_row[3] if with_min_p else None)
    assert torch.equal(got > 0, want > 0)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)


def test_the_backends_differ_where_stock_does():
    """[.4, .2, .2, .2], top_k 2, top_p .6, min_p .01: the pytorch sampler keeps ranks 0 and 1
    ({0, 1}); flashinfer keeps every token tied at the cut ({0, 1, 2, 3}), with min-p or without."""
    logits = torch.tensor([[0.4, 0.2, 0.2, 0.2]]).log()
    for min_p, backend, support in [
        ([0.01], SamplingBackend.PYTORCH, [0, 1]),
        (None, SamplingBackend.PYTORCH, [0, 1]),
        ([0.01], SamplingBackend.FLASHINFER, [0, 1, 2, 3]),
        (None, SamplingBackend.FLASHINFER, [0, 1, 2, 3]),
    ]:
        rows = replace(_rows([1.0], [0.6], [2], min_p), backend=backend)
        got = target_probs(logits, rows)[0]
        assert (got > 0).nonzero().view(-1).tolist() == support, (min_p, backend)


def test_greedy_rows_in_a_sampled_batch():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [3.0, 1.0, 3.0, 3.0]])
    # flashinfer: uniform among the tied maxima; pytorch: the first of them.
    got = target_probs(logits, _rows([1.0, 0.0], [1.0, 1.0], [1, -1]))
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.5, 0.5, 0.0], [1 / 3, 0.0, 1 / 3, 1 / 3]]))
    rows = replace(_rows([1.0, 0.0], [1.0, 1.0], [1, -1]), backend=SamplingBackend.PYTORCH)
    assert target_probs(logits, rows).tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]


def test_bad_shapes_raise_value_error():
    rows = _rows([1.0, 1.0], [1.0, 1.0], [-1, -1])
    with pytest.raises(ValueError):
        target_probs(torch.zeros(3, 5), rows)
    with pytest.raises(ValueError):
        SamplingRows(torch.ones(2), torch.ones(3), torch.ones(2, dtype=torch.int32))
    with pytest.raises(ValueError):
        SamplingRows(torch.ones(2), torch.ones(2), torch.ones(2))  # float top_k
    with pytest.raises(ValueError):
        SamplingRows(torch.ones(2), torch.ones(2), torch.ones(2, dtype=torch.int32), backend="ascend")
