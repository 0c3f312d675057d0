"""Draft-plan math (budget, PillarAttn top-K, streaming seed, per-step KV lists) vs plain Python."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.selection.policy import budget, pillar_plan, streaming_plan
from sglang_sparsespec.spec.draft_layout import round_slots, step_indices


def _budget_ref(cfg: PillarConfig, length: int) -> int:
    return min(length, max(cfg.min_budget, math.ceil(cfg.budget_ratio * length)))


def test_budget_rule():
    cfg = PillarConfig(budget_ratio=0.05, min_budget=128)
    lens = torch.tensor([1, 100, 128, 2560, 2561, 8192])
    assert budget(cfg, lens).tolist() == [_budget_ref(cfg, n) for n in lens.tolist()] == [1, 100, 128, 128, 129, 410]
    assert cfg.budget(8192) == 410


@pytest.mark.parametrize("seed", range(5))
def test_pillar_plan_matches_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    cfg = PillarConfig(num_steps=4, budget_ratio=0.1, min_budget=8, recent_window=3)
    bs, width, kmax = 6, 96, cfg.max_budget(96)
    verify = torch.randint(1, 90, (bs,), generator=gen)
    accepted = torch.randint(1, cfg.num_steps + 2, (bs,), generator=gen)
    new = verify + accepted
    scores = torch.rand(bs, width, generator=gen)  # distinct values: no ties
    plan = pillar_plan(cfg, scores, verify, new, kmax)
    for b in range(bs):
        v, n = int(verify[b]), int(new[b])
        tail = max(0, v - cfg.recent_window)
        count = max(0, min(_budget_ref(cfg, n) - (n - tail), tail, kmax))
        best = sorted(sorted(range(tail), key=lambda t: -float(scores[b, t]))[:count])
        assert int(plan.tail_start[b]) == tail
        assert int(plan.sel_cnt[b]) == count
        assert plan.sel_pos[b, :count].tolist() == best
        assert (plan.sel_pos[b, count:] == -1).all()
        # Selected + tail never exceeds the budget, and the tail covers every new token.
        assert count + (n - tail) <= max(_budget_ref(cfg, n), n - tail)


def test_streaming_plan_is_sinks_plus_recent():
    cfg = PillarConfig(min_budget=10, budget_ratio=0.05, sink_tokens=4)
    plan = streaming_plan(cfg, torch.tensor([3, 10, 50, 1000]), kmax=cfg.max_budget(1000))
    assert plan.sel_cnt.tolist() == [3, 4, 4, 4]
    assert plan.sel_pos[1, :5].tolist() == [0, 1, 2, 3, -1]
    # budget: 3 -> 3, 10 -> 10, 50 -> 10, 1000 -> 50; tail takes what the sinks leave.
    assert plan.tail_start.tolist() == [3, 4, 44, 954]


def test_draft_lists_are_selection_then_contiguous_tail():
    k, kmax, width = 3, 4, 16
    req_to_token = torch.arange(5 * 64, dtype=torch.int32).view(5, 64) + 1000
    rpi = torch.tensor([2, 4])
    seq_lens = torch.tensor([20, 7])
    sel_pos = torch.tensor([[1, 5, 9, -1], [-1, -1, -1, -1]], dtype=torch.int32)
    sel_cnt = torch.tensor([3, 0], dtype=torch.int32)
    tail_start = torch.tensor([17, 0], dtype=torch.int32)
    slots, base = round_slots(req_to_token, rpi, seq_lens, sel_pos, sel_cnt, tail_start, k, width)
    assert base.tolist() == [6, 7]
    indptr = torch.full((3,), -5, dtype=torch.int32)
    indices = torch.full((2 * width + 1,), -9, dtype=torch.int64)
    for step in range(k):
        lens = step_indices(slots, base, step, indptr, indices)
        expect = [
            [1, 5, 9] + list(range(17, 20 + step + 1)),
            list(range(0, 7 + step + 1)),
        ]
        assert lens.tolist() == [len(e) for e in expect]
        assert indptr.tolist() == [0, len(expect[0]), len(expect[0]) + len(expect[1])]
        flat = [1000 + 64 * int(r) + p for r, e in zip(rpi, expect) for p in e]
        assert indices[: len(flat)].tolist() == flat


def test_config_from_env_rejects_bad_values():
    with pytest.raises(ValueError, match="MIN_BUDGET"):
        PillarConfig.from_env(8, {"SPARSESPEC_MIN_BUDGET": "x"})
    cfg = PillarConfig.from_env(4, {"SPARSESPEC_POLICY": "STREAMING", "SPARSESPEC_MIN_BUDGET": "64"})
    assert (cfg.num_steps, cfg.policy.value, cfg.min_budget) == (4, "streaming", 64)
