"""tools.policy_sim on a tiny random Llama: lossless, exact with a full budget, sparse otherwise."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import tiny_llama

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.modes import ScoreRows, SelectionPolicy
from tools.policy_sim import (
    Sampling,
    SimResult,
    _verify,
    first_divergence_from_greedy,
    simulate,
)


@pytest.fixture(scope="module")
def tiny_model():
    return tiny_llama(head_scale=30)  # decisive argmax: no near-ties between 1- and 9-token numerics


PROMPT = list(range(3, 43))


@pytest.mark.parametrize(
    "policy, select_every, score_rows",
    [
        (SelectionPolicy.PILLAR, 1, ScoreRows.ALL),
        (SelectionPolicy.COARSE, 1, ScoreRows.ALL),
        (SelectionPolicy.STREAMING, 1, ScoreRows.ALL),
        (SelectionPolicy.PILLAR, 3, ScoreRows.ALL),
        (SelectionPolicy.PILLAR, 1, ScoreRows.LAST),
    ],
)
def test_outputs_equal_plain_greedy(tiny_model, policy, select_every, score_rows):
    cfg = PillarConfig(
        num_steps=4, min_budget=8, recent_window=4, policy=policy, select_every=select_every, score_rows=score_rows
    )
    res = simulate(tiny_model, PROMPT, 48, cfg)
    assert len(res.output_ids) == 48 and sum(res.accepts) >= 48
    assert all(1 <= a <= cfg.num_steps + 1 for a in res.accepts)
    assert first_divergence_from_greedy(tiny_model, PROMPT, res.output_ids) is None


def test_full_budget_accepts_every_draft_and_small_budget_does_not(tiny_model):
    full = simulate(tiny_model, PROMPT, 40, PillarConfig(num_steps=4, budget_ratio=1.0, min_budget=1))
    assert full.accepts == [5] * len(full.accepts)
    sparse = simulate(tiny_model, PROMPT, 40, PillarConfig(num_steps=4, min_budget=2, recent_window=0, sink_tokens=0))
    assert sparse.accept_length < 5


def test_draft_set_counts_the_prefix_a_draft_attends(tiny_model):
    # A full budget attends the whole prefix: len(PROMPT) - 1 positions, then each round's committed tokens more.
    full = simulate(tiny_model, PROMPT, 24, PillarConfig(num_steps=4, budget_ratio=1.0, min_budget=1))
    prefix = [len(PROMPT) - 1 + sum(full.accepts[:i]) for i in range(len(full.accepts))]
    assert full.draft_sets == pytest.approx(prefix)
    # Between selections the plan stands and its tail takes every token committed since.
    cfg = PillarConfig(num_steps=4, min_budget=8, recent_window=4, select_every=3)
    res = simulate(tiny_model, PROMPT, 48, cfg)
    assert len(res.draft_sets) == len(res.accepts) >= 6
    for i in range(1, len(res.accepts)):
        if i % 3:
            assert res.draft_sets[i] == pytest.approx(res.draft_sets[i - 1] + res.accepts[i - 1])
    assert 8 <= min(res.draft_sets) and res.mean_draft_set < full.mean_draft_set


def test_oracle_is_refused(tiny_model):
    with pytest.raises(ValueError, match="policy_sim supports"):
        simulate(tiny_model, PROMPT, 8, PillarConfig(policy=SelectionPolicy.ORACLE))


def test_per_segment_statistics():
    res = SimResult(
        "pillar", output_ids=[1, 2, 3, 4] * 3 + list(range(10, 22)), accepts=[5, 5, 2, 1, 3, 4, 4], wall_s=0.0
    )
    # Rounds start at output tokens 0, 5, 10, 12, 13, 16, 20: slices of 10 hold 2, 4 and 1 of them.
    assert res.accept_by_segment(10) == [5.0, (2 + 1 + 3 + 4) / 4, 4.0]
    # A 4-token loop has 4 distinct 4-grams out of 9; fresh tokens have all distinct ones.
    assert res.distinct_ngrams_by_segment(12) == [4 / 9, 1.0]
    assert res.accept_length == pytest.approx(24 / 7)


def test_fp16_scores_round_like_the_gpu_and_ties_go_to_the_lower_position() -> None:
    from tools.policy_sim import next_plan

    # One layer, one KV head, 5 candidate positions below the window (tail_start 5); keep 2. Positions 3
    # and 4 differ by less than fp16 resolves at 1e-6 (subnormal there): fp32 keeps 4, fp16 ties keep 3.
    scores = torch.tensor([[[0.5, 1e-7, 1e-7, 1.000e-6, 1.001e-6, 9.0]]])
    cfg = PillarConfig(num_steps=2)
    sel32, tail = next_plan(cfg, scores, (5, 2), 6, 8)
    sel16, _ = next_plan(cfg, scores, (5, 2), 6, 8, torch.float16)
    assert tail == 5 and sorted(sel32[0, 0].tolist()) == [0, 4] and sorted(sel16[0, 0].tolist()) == [0, 3]


def test_sampled_verify_draws_the_target_distribution():
    # Whatever q proposes, rejection sampling's first token follows p: accepted drafts plus residual draws.
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = torch.log(p).expand(2, 4)  # the verify's rows: p at temperature 1, no filter
    sampling, gen = Sampling(temperature=1.0), torch.Generator().manual_seed(7)
    counts = torch.zeros(4)
    for _ in range(20000):
        x = int(torch.multinomial(q, 1, generator=gen))
        accepted, after = _verify([x], logits, [q], sampling, gen)
        counts[x if accepted else after] += 1
    assert torch.allclose(counts / counts.sum(), p, atol=0.015)


def test_sampled_rounds_accept_every_draft_at_a_full_budget_only(tiny_model):
    sampling = Sampling(temperature=3.0, top_p=0.95, seed=3)  # rows spread over several tokens (sharpened head)
    full = simulate(
        tiny_model, PROMPT, 40, PillarConfig(num_steps=4, budget_ratio=1.0, min_budget=1), sampling=sampling
    )
    assert full.accept_length > 4.9  # q equals p up to fp32 rounding between one-row and five-row forwards
    sparse_cfg = PillarConfig(num_steps=4, min_budget=2, recent_window=0, sink_tokens=0)
    sparse = simulate(tiny_model, PROMPT, 40, sparse_cfg, sampling=sampling)
    assert sparse.accept_length < full.accept_length
    again = simulate(tiny_model, PROMPT, 40, sparse_cfg, sampling=sampling)
    assert again.output_ids == sparse.output_ids and again.accepts == sparse.accepts  # one seed, one run
