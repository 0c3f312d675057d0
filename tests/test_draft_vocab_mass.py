"""The draft-vocabulary probe (tools/draft_vocab_mass.py): the mass a draft distribution puts past each subset size,
and how often its argmax lies there."""

from __future__ import annotations

import pytest
import torch

from tools.draft_vocab_mass import mass_past


def test_mass_past_each_size() -> None:
    q = torch.tensor([[0.5, 0.2, 0.2, 0.1], [0.1, 0.1, 0.1, 0.7]])
    out = mass_past(q, (1, 2, 3, 4))
    assert out[1]["mean"] == pytest.approx((0.5 + 0.9) / 2)
    assert out[3]["mean"] == pytest.approx((0.1 + 0.7) / 2) and out[3]["max"] == pytest.approx(0.7)
    assert out[4]["mean"] == 0.0  # the whole vocabulary: nothing past it
    assert out[1]["argmax_past"] == 0.5 and out[3]["argmax_past"] == 0.5 and out[4]["argmax_past"] == 0.0
