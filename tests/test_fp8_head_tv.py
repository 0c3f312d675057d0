"""The fp8 LM head's distance probe (tools/fp8_head_tv.py): its draft distribution, the emulated fp8 product and the
acceptance it solves for."""

from __future__ import annotations

import pytest
import torch

from sglang_sparsespec.fp8 import quantize_rows
from tools.fp8_head_tv import draft_q, fp8_logits, solve_acceptance


def test_draft_q_keeps_the_top_p_nucleus_of_the_top_candidates() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])) * 0.6  # at T 0.6: probabilities 0.5, 0.3, 0.15, 0.05
    q = draft_q(logits, temperature=0.6, top_p=0.7, candidates=3)
    torch.testing.assert_close(q, torch.tensor([[0.625, 0.375, 0.0, 0.0]]))  # 0.8 ahead of the third: cut
    q = draft_q(logits, temperature=0.6, top_p=0.95, candidates=3)
    torch.testing.assert_close(q, torch.tensor([[0.5, 0.3, 0.15, 0.0]]) / 0.95)  # the fourth is past C


def test_fp8_logits_are_the_product_within_e4m3_rounding() -> None:
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(4, 64, generator=g).bfloat16(), torch.randn(32, 64, generator=g).bfloat16()
    exact = x.float() @ w.float().t()
    got = fp8_logits(x, *quantize_rows(w)).float()
    bound = 2 * 2**-4 * (x.float().abs() @ w.float().abs().t())  # each operand within half an ulp of 3 bits
    assert ((got - exact).abs() <= bound + 0.05).all()
    assert not torch.equal(got, exact.bfloat16().float())  # fp8 moved something


@pytest.mark.parametrize("k, a", [(8, 0.8), (4, 0.5)])
def test_solve_acceptance_inverts_the_mean_accept_length(k: int, a: float) -> None:
    length = 1 + sum(a**i for i in range(1, k + 1))
    assert solve_acceptance(length, k) == pytest.approx(a, abs=1e-9)
