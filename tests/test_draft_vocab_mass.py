"""The draft-vocabulary probe (tools/draft_vocab_mass.py): the mass a draft distribution puts past each subset size,
and how often its argmax lies there."""

from __future__ import annotations

import pytest
import torch

from tools.draft_vocab_mass import mass_past, seen_ranking


def test_mass_past_each_size() -> None:
    q = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7]])
    out = mass_past(q, (1, 2, 3, 4))
    assert out[1]["mean"] == pytest.approx((0.5 + 0.9) / 2)
    assert out[3]["mean"] == pytest.approx((0.1 + 0.7) / 2) and out[3]["max"] == pytest.approx(0.7)
    assert out[4]["mean"] == 0.0  # the whole vocabulary: nothing past it
    assert out[1]["argmax_past"] == 0.5 and out[3]["argmax_past"] == 0.5 and out[4]["argmax_past"] == 0.0


def test_the_seen_ranking_puts_drafted_ids_first_and_the_rest_in_id_order() -> None:
    q = torch.tensor([[0.0, 0.0, 0.3, 0.0, 0.7], [0.0, 0.0, 0.6, 0.0, 0.4]])
    assert seen_ranking(q).tolist() == [4, 2, 0, 1, 3]  # 4 sums 1.1, 2 sums 0.9; the unseen in id order
