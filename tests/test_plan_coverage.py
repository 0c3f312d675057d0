"""tools.plan_coverage on a tiny random Llama: the shares it reads are masses, and a query's own top positions
hold at least what any plan of the same count holds."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import tiny_llama

from sglang_sparsespec.config import PillarConfig
from tools.plan_coverage import coverage_at, widest_gaps

CFG = PillarConfig(num_steps=4, budget_ratio=0.1, min_budget=8, recent_window=2, sink_tokens=2)


@pytest.fixture(scope="module")
def tiny_model():
    return tiny_llama()


def test_shares_are_masses_and_the_own_top_holds_the_most(tiny_model):
    seq = [(7 * i) % 90 + 3 for i in range(160)]
    shares = coverage_at(tiny_model, seq, 120, CFG, advance=3)
    layers, h_kv = tiny_model.config.num_hidden_layers, tiny_model.config.num_key_value_heads
    assert all(s.shape == (layers, h_kv) for s in shares.values())
    assert (shares["tail"] > 0).all() and (shares["plan"] > 0).all()
    assert (shares["own"] >= shares["plan"] - 1e-6).all()
    assert (shares["tail"] + shares["own"] <= 1 + 1e-5).all()


def test_a_plan_of_the_whole_prefix_holds_all_of_it(tiny_model):
    seq = [(5 * i) % 90 + 3 for i in range(160)]
    full = PillarConfig(num_steps=4, budget_ratio=1.0, min_budget=8, recent_window=2, sink_tokens=2)
    shares = coverage_at(tiny_model, seq, 120, full, advance=3)
    assert torch.allclose(shares["tail"] + shares["plan"], torch.ones_like(shares["tail"]), atol=1e-5)
    assert torch.allclose(shares["plan"], shares["own"], atol=1e-6)


def test_the_widest_gaps_are_named_as_the_servers_dense_heads():
    plan = torch.tensor([[0.5, 0.5, 0.5], [0.1, 0.2, 0.3]])
    own = plan + torch.tensor([[0.0, 0.3, 0.01], [0.2, 0.0, 0.02]])
    assert widest_gaps({"plan": plan, "own": own}, 2) == "0.1+1.0"
    assert widest_gaps({"plan": plan, "own": own}, 3) == "0.1+1.0+1.2"
    assert widest_gaps({"plan": plan, "own": own}, 99).count("+") == 5
