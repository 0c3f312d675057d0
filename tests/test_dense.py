"""adaptive/dense.py: which requests draft over their whole prefix, and the policy pricing it."""

from __future__ import annotations

import itertools
import random

import pytest

from sglang_sparsespec.adaptive.policy import PROBE_ROUNDS, RoundSample, SpeculationPolicy
from sglang_sparsespec.adaptive.dense import (
    BatchView,
    DenseChooser,
    dense_extra_ms,
    expected_tokens,
    plan_dense,
)
from sglang_sparsespec.rounds.launch import AdaptiveRound, LaunchedRounds


def _rate(view: BatchView, k: int, round_ms: float, dense: tuple[bool, ...]) -> float:
    e_dense = expected_tokens(view.alpha_dense, k)
    tokens = sum(e_dense if d else expected_tokens(a, k) for a, d in zip(view.alpha, dense))
    return tokens / (round_ms + sum(k * x for x, d in zip(view.extra_ms, dense) if d))


@pytest.mark.parametrize("seed", range(6))
def test_plan_dense_is_the_best_subset(seed):
    rng = random.Random(seed)
    n, k = 8, rng.choice([2, 4, 8])
    view = BatchView([rng.uniform(0.2, 0.98) for _ in range(n)], [rng.uniform(0.01, 0.6) for _ in range(n)], 0.97)
    round_ms = rng.uniform(2.0, 40.0)
    plan = plan_dense(view, k, round_ms)
    best = max(_rate(view, k, round_ms, d) for d in itertools.product((False, True), repeat=n))
    assert plan.tokens / plan.ms == pytest.approx(best)
    assert plan.tokens / plan.ms == pytest.approx(_rate(view, k, round_ms, tuple(plan.dense)))


def test_plan_dense_keeps_long_contexts_sparse_at_a_full_batch_and_switches_small_batches():
    # SmolLM2: 23,040 KV bytes per position, 30 layers; an H100 has 132 SMs: one KV split per
    # (request, KV head) at batch 256, 22 at batch 4 (sparse_decode_fwd's default for 3 KV heads).
    full_extra = dense_extra_ms(7000, 350, 23040, layers=30, splits=1)
    # 0.08 ms of extra KV, but each layer's attention waits for 6650 more positions in one program.
    assert full_extra == pytest.approx(6650 * 23040 / 2e9 + 30 * 6650 * 40e-6)
    full = BatchView([0.5, 0.5] + [0.92] * 254, [full_extra] * 256, 0.97)
    assert not any(plan_dense(full, 8, 42.8).dense)
    small_extra = dense_extra_ms(2000, 128, 23040, layers=30, splits=22)
    assert small_extra == pytest.approx(1872 * 23040 / 2e9 + 30 * (91 - 6) * 40e-6)
    small = BatchView([0.5, 0.5, 0.92, 0.92], [small_extra] * 4, 0.97)
    plan = plan_dense(small, 8, 9.0)  # four requests left: a 9 ms round
    assert plan.dense[:2] == [True, True]
    assert plan_dense(small, 0, 9.0).dense == [False] * 4


def test_short_contexts_draft_densely_for_free():
    # Below the budget the plan already holds the whole prefix: no extra cost, no gain either.
    assert dense_extra_ms(100, 128, 23040, layers=30, splits=1) == 0.0
    plan = plan_dense(BatchView([0.6], [0.0], 0.97), 4, 5.0)
    assert plan.dense == [True] and plan.ms == 5.0


def test_a_request_that_gains_nothing_does_not_stop_the_others():
    # The first request's context fits its budget (no extra cost) and its plan already drafts better
    # than a dense draft would: it gains nothing and goes last, not first, where it would end the
    # choice before the second request (which gains ~3 tokens for 0.08 ms).
    view = BatchView([0.99, 0.3], [0.0, 0.01], 0.97)
    assert plan_dense(view, 8, 5.0).dense == [False, True]


class _Req:  # SGLang's Req as the planner sees it: a seqlen (weakly referenced by the chooser) and a rid
    def __init__(self, seqlen: int) -> None:
        self.seqlen, self.rid = seqlen, "9f1c2ab0e4"


def _round(chooser: DenseChooser, reqs: list, k: int, accepted: list[int], dense=None) -> None:
    """One round as the worker runs it: launched, then its counts matched through the launch queue and
    handed to the chooser when the round had drafts."""
    chooser.launched(k, dense)
    rounds = LaunchedRounds()
    rounds.launched(k, len(reqs), AdaptiveRound(list(reqs), dense, None))
    matched = rounds.completed(accepted)
    if matched is not None:
        chooser.completed(matched)


def test_chooser_tracks_sparse_acceptance_per_request_and_dense_rounds_apart():
    chooser = DenseChooser(lambda n: min(n, 128), 1000, layers=2, splits=lambda bs: 4 * bs)
    a, b = _Req(5000), _Req(64)
    view = chooser.view([a, b], prior=0.8)  # 8 splits at batch 2
    assert view.alpha == [0.8, 0.8] and view.extra_ms[1] == 0.0
    assert view.extra_ms[0] == pytest.approx((5000 - 128) * 1000 / 2e9 + 2 * (625 - 16) * 40e-6)
    for _ in range(20):  # a's drafts always fail at the first position; b drafts densely and passes
        _round(chooser, [a, b], 4, [0, 4], [False, True])
    view = chooser.view([a, b], prior=0.8)
    assert view.alpha[0] < 0.15 and view.alpha[1] == 0.8  # b's dense rounds say nothing about its plan
    assert view.alpha_dense > 0.95 and chooser.dense_request_rounds == 20
    _round(chooser, [a], 0, [1])  # a plain round has no drafts: nothing to learn
    assert chooser.view([a], 0.8).alpha[0] == view.alpha[0]
    assert len(chooser._acc) == 1  # only a drafted sparsely
    del a  # a finished request takes its state along
    assert len(chooser._acc) == 0


def test_policy_prices_dense_drafting_per_request():
    policy = SpeculationPolicy((0, 2, 4, 8))
    key = policy.choose(4, 6000)[1]
    policy.choose(4, 6000)
    policy.observe([RoundSample(key, 0, 0.0, 2.0, 0.2), RoundSample(key, 8, 8 * 1.0, 2.0, 0.2)] * PROBE_ROUNDS)
    poor = BatchView([0.4] * 4, [0.05] * 4, 0.97)
    # Sparse only, four requests at 0.4 emit 1.67 tokens per 10.2 ms round: plain decoding wins ...
    assert policy.rates(key)[0] > expected_tokens(0.4, 8) / 10.2
    # ... but drafting all four densely emits ~8 tokens per 11.8 ms, and the policy sees it.
    rates = policy.rates(key, poor)
    assert rates[8] == pytest.approx(expected_tokens(0.97, 8) / (10.2 + 4 * 8 * 0.05))
    assert max(rates, key=rates.__getitem__) == 8
    # The choice carries the plan it was priced with: the worker plans no second time.
    choice = policy.choose(4, 6000, lambda: poor)
    assert choice.steps == 8 and choice.dense == plan_dense(poor, 8, policy.round_ms(key, 8)).dense == [True] * 4
    assert policy.round_ms(key, 8) == pytest.approx(10.2) and policy.round_ms(key, 0) == pytest.approx(2.2)


def test_round_planner_hands_the_dense_set_to_the_draft_runner():
    from types import SimpleNamespace

    from sglang_sparsespec.metrics import PillarMetrics
    from sglang_sparsespec.patches.round_plan import RoundPlanner
    from sglang_sparsespec.patches.tp_agree import RoundAgreement
    from sglang_sparsespec.rounds.clock import RoundClock
    from planner_parts import DoneEvent, plain_sampling

    policy = SpeculationPolicy((0, 2, 4, 8))
    cfg = SimpleNamespace(num_steps=8, force_steps=-1, step_candidates=(0, 2, 4, 8))
    planner = RoundPlanner(cfg, PillarMetrics(8), RoundClock(DoneEvent), policy=policy, agreement=RoundAgreement(None))
    planner.set_dense(DenseChooser(lambda n: min(n, 128), 23040, 30, lambda bs: 22))
    reqs = [_Req(2000) for _ in range(4)]
    batch = SimpleNamespace(reqs=reqs, forward_mode=SimpleNamespace(is_idle=lambda: False), sampling_info=plain_sampling())
    key = policy.choose(4, 2000)[1]
    policy.choose(4, 2000)
    policy.observe([RoundSample(key, 0, 0.0, 2.0, 0.2), RoundSample(key, 8, 8.0, 2.0, 0.2)] * PROBE_ROUNDS)
    for r in reqs:  # every request's plan drafts badly
        _round(planner.dense, [r], 8, [0])
    steps, dense, drafts = planner.shape(batch)
    assert drafts is None  # nobody holds per-token sampling state
    assert steps in (4, 8) and dense == [True] * 4  # plain decoding would emit 1 token per 2.2 ms
    planner.completed([steps] * 4)  # that round all accepted: dense acceptance
    assert planner.dense.dense_request_rounds == 4
    # Dense rows teach the dense acceptance, never the batch's sparse one (the prior of new requests).
    assert planner.policy.acceptance.alpha == pytest.approx(0.7)
    assert planner.dense.view(reqs, 0.7).alpha_dense > 0.95
