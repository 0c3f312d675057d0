"""adaptive/policy.py: the per-round draft-count policy, its acceptance estimate and its clock."""

from __future__ import annotations

import pytest
from sglang_sparsespec.patches.server_info import add_pillar_state

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.metrics import PillarMetrics
from sglang_sparsespec.adaptive.dense import BatchView, floor_tokens, plan_dense
from sglang_sparsespec.rounds.launch import AdaptiveRound, LaunchedRounds
from sglang_sparsespec.adaptive.policy import (
    AcceptanceTracker,
    RoundSample,
    SpeculationPolicy,
    batch_bucket,
    context_bucket,
    PROBE_ROUNDS,
    cell_key,
    expected_tokens,
)


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(1.0, 8) == 9.0
    assert expected_tokens(0.9, 8) == pytest.approx(sum(0.9**j for j in range(9)))


def _verified(acc: AcceptanceTracker, k: int, accepted: list[int], dense=None, expected=None) -> None:
    """One round of k >= 1 drafts through the worker's launch queue into the tracker."""
    rounds = LaunchedRounds()
    rounds.launched(k, len(accepted), AdaptiveRound([None] * len(accepted), dense, expected))
    acc.completed(rounds.completed(accepted))


def test_acceptance_is_the_truncated_geometric_estimate():
    acc = AcceptanceTracker(decay=0.0, prior=0.5)
    _verified(acc, 4, [4, 4, 1])  # 9 hits, one miss
    assert acc.alpha == pytest.approx(9 / 10)
    _verified(acc, 2, [5, 0])  # greedy stale acceptance past k counts as k; 2 hits, 1 miss
    assert acc.alpha == pytest.approx(2 / 3)


def test_acceptance_counts_only_the_sparse_drafters():
    acc = AcceptanceTracker(decay=0.0, prior=0.5)
    # The dense row's 4 accepted drafts are left out: (1 + 3) / (4 + 2).
    _verified(acc, 4, [1, 4, 3], [False, True, False])
    assert acc.alpha == pytest.approx(4 / 6)
    _verified(acc, 4, [4, 4], [True, True])  # all rows dense: nothing learned
    assert acc.alpha == pytest.approx(4 / 6)


def _rounds(*samples: RoundSample) -> list[RoundSample]:
    """Each sample as the PROBE_ROUNDS rounds that price it (a warm-up round, then the three kept)."""
    return [s for s in samples for _ in range(PROBE_ROUNDS)]


def _feed(policy: SpeculationPolicy, key, plain: float, step: float, verify: float, k: int = 8) -> None:
    policy.observe(_rounds(RoundSample(key, 0, 0.0, plain, 0.1), RoundSample(key, k, k * step, verify, 0.1)))


def test_policy_probes_unpriced_modes_first():
    """A new cell runs each mode until its cost is priced: the warm-up round plus two kept ones."""
    policy = SpeculationPolicy((0, 2, 4, 8))
    assert [policy.choose(64, 4000)[0] for _ in range(2 * PROBE_ROUNDS)] == [0] * PROBE_ROUNDS + [8] * PROBE_ROUNDS
    assert policy.choose(64, 4000)[0] == 8  # no measurement back yet: speculate
    assert policy.choose(3, 4000)[0] == 0  # another cell probes again
    key = cell_key(3, 4000)
    policy.observe(_rounds(RoundSample(key, 0, 0.0, 1.0, None)))  # plain priced before its probes ended
    assert policy.choose(3, 4000)[0] == 8


@pytest.mark.parametrize(
    ("plain", "step", "verify", "alpha", "want"),
    [
        (1.0, 0.85, 1.2, 0.85, 0),  # draft step ~ decode step (small batch): plain decoding
        (20.0, 2.5, 21.0, 0.85, 8),  # long contexts, cheap sparse steps: the longest round
        (11.0, 2.0, 11.0, 0.45, 2),  # poor acceptance: a short round
    ],
)
def test_policy_picks_the_best_expected_rate(plain, step, verify, alpha, want):
    policy = SpeculationPolicy((0, 2, 4, 8), acceptance=AcceptanceTracker(prior=alpha))
    key = policy.choose(256, 7000)[1]
    policy.choose(256, 7000)
    _feed(policy, key, plain, step, verify)
    rates = policy.rates(key)
    assert max(rates, key=rates.__getitem__) == want
    assert policy.choose(256, 7000)[0] == want


def test_policy_reprobes_the_unused_mode_and_counts_paths():
    policy = SpeculationPolicy((0, 8), reprobe_every=10, acceptance=AcceptanceTracker(prior=0.9))
    key = policy.choose(256, 7000)[1]
    policy.choose(256, 7000)
    _feed(policy, key, plain=20.0, step=2.0, verify=20.0)
    picks = [policy.choose(256, 7000)[0] for _ in range(30)]
    assert picks.count(0) in (2, 3) and picks.count(8) >= 27
    summary = policy.summary()
    # The cell's measured costs, keyed by batch bucket x context (7000 tokens: the 2^13 half-octave).
    cell = summary["cells"]["256x8192"]
    assert cell["rounds"] == 32
    assert (cell["plain"], cell["draft_8"], cell["verify"]) == pytest.approx((20.0, 16.0, 20.0))


def test_speculative_reprobes_draft_the_fewest_and_price_each_count_by_its_own_rounds():
    """Where plain decoding wins, the speculative re-probe drafts k_min (2), not k_max: it refreshes the
    verify and the acceptance for a third of the cost. A count not yet run is priced from the nearest
    measured one, scaled; once run, by its own draft phase (the phase has a fixed part)."""
    policy = SpeculationPolicy((0, 2, 4, 8), reprobe_every=10, acceptance=AcceptanceTracker(prior=0.6))
    key = policy.choose(1, 7000)[1]
    probes = [policy.choose(1, 7000)[0] for _ in range(2 * PROBE_ROUNDS - 1)]
    assert probes[-PROBE_ROUNDS:] == [8] * PROBE_ROUNDS  # the first speculative probes price k_max
    _feed(policy, key, plain=1.8, step=1.4, verify=1.7)
    picks = [policy.choose(1, 7000)[0] for _ in range(30)]
    assert picks.count(2) == 3 and picks.count(0) == 27 and 8 not in picks
    assert policy.round_ms(key, 4) == pytest.approx(4 * 1.4 + 1.7 + 0.1)  # from k = 8's phase, scaled
    policy.observe(_rounds(RoundSample(key, 2, 3.3, 1.7, 0.1)))  # k = 2's own phase: 1.65 ms per draft
    assert policy.round_ms(key, 2) == pytest.approx(3.3 + 1.7 + 0.1)
    assert policy.round_ms(key, 8) == pytest.approx(8 * 1.4 + 1.7 + 0.1)
    assert policy.round_ms(key, 4) == pytest.approx(2 * 3.3 + 1.7 + 0.1)  # nearest: 2 (the shorter on a tie)


def test_a_new_context_bucket_starts_from_its_neighbours_costs():
    """Contexts cross a half-octave every few hundred tokens: the new cell is priced from the nearest cell
    of the same batch bucket and decides at once (no probe of either mode); its costs are its own after
    that, and another batch bucket still probes."""
    policy = SpeculationPolicy((0, 2, 4, 8), reprobe_every=10, acceptance=AcceptanceTracker(prior=0.85))
    key = policy.choose(256, 4000)[1]
    policy.choose(256, 4000)
    _feed(policy, key, plain=12.0, step=2.2, verify=16.0)
    assert policy.choose(256, 4000)[0] == 8
    new_key = policy.choose(256, 5800)[1]
    assert new_key != key and policy.choose(256, 5800)[0] == 8 and policy.choose(256, 5800)[0] == 8
    assert policy.round_ms(new_key, 8) == pytest.approx(policy.round_ms(key, 8))
    _feed(policy, new_key, plain=10.0, step=2.0, verify=12.0)
    assert policy.round_ms(new_key, 8) != pytest.approx(policy.round_ms(key, 8))
    picks = [policy.choose(256, 5800)[0] for _ in range(12)]
    assert picks.count(0) == 1  # the plain re-probe comes on the usual schedule
    assert policy.choose(128, 5800)[0] == 0  # a new batch bucket: probed from scratch
    assert policy.choose(256, 16000)[0] == 0  # two octaves away: too far to borrow from


def test_policy_hysteresis_keeps_a_near_tie():
    policy = SpeculationPolicy((0, 8), margin=0.05, acceptance=AcceptanceTracker(prior=0.5))
    key = policy.choose(16, 1000)[1]
    policy.choose(16, 1000)
    # k = 8 at alpha 0.5: ~1.996 tokens per 2.0 ms vs plain 1 per 1.0 ms: within 5%.
    _feed(policy, key, plain=0.9, step=0.1, verify=1.1)
    first = policy.choose(16, 1000)[0]
    _feed(policy, key, plain=0.95, step=0.1, verify=1.05)
    assert policy.choose(16, 1000)[0] == first


def test_buckets():
    assert [batch_bucket(b) for b in (1, 2, 3, 200, 256)] == [1, 2, 4, 256, 256]
    assert context_bucket(4096) == 24 and context_bucket(5800) == 25


def test_adaptive_steps_knob():
    assert PillarConfig(num_steps=8).step_candidates == (0, 2, 4, 8)
    assert PillarConfig(num_steps=3).step_candidates == (0, 2, 3)
    assert PillarConfig(num_steps=1).step_candidates == (0, 1)
    assert PillarConfig(num_steps=8, adaptive_steps="off").step_candidates == (8,)
    assert not PillarConfig(num_steps=8, adaptive_steps="off").adaptive
    assert PillarConfig(num_steps=4, adaptive_steps="0").step_candidates == (0, 4)
    with pytest.raises(ValueError, match="ADAPTIVE_STEPS"):
        PillarConfig(num_steps=4, adaptive_steps="0,6")
    with pytest.raises(ValueError, match="ADAPTIVE_STEPS"):
        PillarConfig(num_steps=4, adaptive_steps="two")


def test_force_steps_knob_takes_a_candidate():
    assert PillarConfig(num_steps=8, force_steps=0).force_steps == 0
    with pytest.raises(ValueError, match="FORCE_STEPS"):
        PillarConfig(num_steps=8, force_steps=3)  # not among (0, 2, 4, 8)
    with pytest.raises(ValueError, match="FORCE_STEPS"):
        PillarConfig(num_steps=8, adaptive_steps="off", force_steps=0)


def test_server_info_gets_the_worker_summary():
    class Worker:
        metrics = PillarMetrics(4)

        def summary(self):
            return {"rounds_by_k": {"0": 3}}

    class Out:
        def __init__(self) -> None:
            self.internal_state = {"x": 1}

    out = Out()
    scheduler = type("S", (), {"draft_worker": Worker()})()
    Worker.metrics.launched(0, 2)
    pillar = add_pillar_state(out, scheduler, None).internal_state["pillar"]
    assert pillar["rounds_by_k"] == {"0": 3} and pillar["metrics"]["rounds_by_steps"] == {"0": 1}
    stock = Out()
    assert add_pillar_state(stock, type("S", (), {"draft_worker": None})(), None).internal_state == {"x": 1}


def test_a_settled_plain_choice_skips_the_per_request_pricing():
    """Where plain decoding won its last priced choice, the next settle - 1 rounds take it without
    building the batch's view (host time the GPU waits for in the shortest rounds); probes still come
    on schedule and a re-pricing can switch back to speculation."""
    policy = SpeculationPolicy((0, 2, 4, 8), reprobe_every=100, settle=4, acceptance=AcceptanceTracker(prior=0.5))
    key = policy.choose(32, 1000)[1]
    policy.choose(32, 1000)
    _feed(policy, key, plain=1.0, step=0.9, verify=1.2)
    views: list[int] = []

    def view() -> BatchView:
        views.append(1)
        return BatchView([0.5] * 32, [0.01] * 32, 0.97)

    picks = [policy.choose(32, 1000, view).steps for _ in range(12)]
    assert picks == [0] * 12 and len(views) == 3  # priced at rounds 1, 5 and 9 of the twelve
    _feed(policy, key, plain=30.0, step=0.1, verify=1.0)  # speculation now wins by far
    picks = [policy.choose(32, 1000, view).steps for _ in range(4)]
    assert picks[-1] != 0 and len(views) >= 4


def test_a_seeded_cell_prices_its_own_choice_on_the_settle_schedule():
    """A cell seeded from a neighbour late in its life restarts the settle count with its own rounds."""
    policy = SpeculationPolicy((0, 8), reprobe_every=1000, settle=4, acceptance=AcceptanceTracker(prior=0.5))
    key = policy.choose(32, 1000)[1]
    policy.choose(32, 1000)
    _feed(policy, key, plain=1.0, step=0.9, verify=1.2)
    for _ in range(50):
        policy.choose(32, 1000)
    views: list[int] = []
    view = lambda: views.append(1) or BatchView([0.5] * 32, [0.01] * 32, 0.97)  # noqa: E731
    picks = [policy.choose(32, 1300, view).steps for _ in range(8)]  # the next half-octave: seeded
    assert picks == [0] * 8 and len(views) == 2


def test_the_floor_keeps_the_poor_drafters_at_their_plain_speed():
    """32 requests, an eighth of them poor drafters: the mean says speculate (7.5 tokens per request
    per 12.6 ms round against 1 per 1.9 ms), but the floor's request (the 4th poorest) would emit
    ~1.7 tokens per round, slower than plain decoding, so the policy decodes plainly and counts the
    round as floored; floor_quantile 0 gives the throughput choice."""
    view = lambda: BatchView([0.4] * 4 + [0.98] * 28, [10.0] * 32, 0.97)  # noqa: E731 (dense never pays)

    def policy_with(q: float) -> tuple[SpeculationPolicy, tuple[int, int]]:
        policy = SpeculationPolicy((0, 8), floor_quantile=q, premium=0.0, acceptance=AcceptanceTracker(prior=0.9))
        key = policy.choose(32, 2000)[1]
        policy.choose(32, 2000)
        _feed(policy, key, plain=1.8, step=1.1, verify=3.7)
        return policy, key

    floored, key = policy_with(0.1)
    rates = floored.rates(key, view())
    assert rates[8] > rates[0]  # the throughput choice
    assert floor_tokens(plan_dense(view(), 8, floored.round_ms(key, 8)), 0.1) == pytest.approx(expected_tokens(0.4, 8))
    assert [floored.choose(32, 2000, view).steps for _ in range(3)] == [0, 0, 0]
    assert floored.summary()["floored_rounds"] >= 1
    free, _ = policy_with(0.0)
    assert [free.choose(32, 2000, view).steps for _ in range(3)] == [8, 8, 8]
    assert free.summary()["floored_rounds"] == 0
    # Long contexts, a full batch: a round of 8 costs ~2 plain steps, so a drafter at 0.6 gains too.
    deep = SpeculationPolicy((0, 8), acceptance=AcceptanceTracker(prior=0.9))
    key = deep.choose(256, 7000)[1]
    deep.choose(256, 7000)
    _feed(deep, key, plain=15.0, step=2.2, verify=14.0)
    many = lambda: BatchView([0.6] * 26 + [0.9] * 230, [10.0] * 256, 0.97)  # noqa: E731
    assert deep.choose(256, 7000, many).steps == 8


def test_floor_tokens_counts_dense_requests_at_the_dense_acceptance():
    alpha = [0.2, 0.5, 0.9, 0.95]
    sparse = plan_dense(BatchView(alpha, [100.0] * 4, 0.99), 4, 10.0)  # dense never pays
    first = plan_dense(BatchView(alpha, [0.0] + [100.0] * 3, 0.99), 4, 10.0)  # free for the first only
    assert sparse.dense == [False] * 4 and first.dense == [True, False, False, False]
    assert sum(first.each) == pytest.approx(first.tokens)
    assert floor_tokens(sparse, 0.0) == pytest.approx(expected_tokens(0.2, 4))
    assert floor_tokens(first, 0.0) == pytest.approx(expected_tokens(0.5, 4))
    assert floor_tokens(sparse, 0.5) == pytest.approx(expected_tokens(0.9, 4))
    assert floor_tokens(sparse, 0.99) == pytest.approx(expected_tokens(0.95, 4))
    with pytest.raises(ValueError, match="floor_quantile"):
        SpeculationPolicy((0, 8), floor_quantile=1.0)
    with pytest.raises(ValueError, match="FLOOR_QUANTILE"):
        PillarConfig(num_steps=8, floor_quantile=-0.1)


def test_calibration_scales_the_expectation_by_what_the_rounds_delivered():
    """Rounds of 4 drafts chosen for 4.5 tokens per request that emit 3 each pull the calibration of
    k = 4 towards 2/3 (clamped at CAL_RANGE), and the policy's rate for k = 4 with it; rounds that were
    not chosen as priced (expected None) and other counts leave it alone."""
    acc = AcceptanceTracker(prior=0.9)
    for _ in range(200):
        _verified(acc, 4, [2, 2], expected=9.0)
    assert acc.calibrated(4) == pytest.approx(6.0 / 9.0, rel=1e-3)
    assert acc.calibrated(8) == 1.0
    _verified(acc, 4, [4, 4])
    assert acc.calibrated(4) == pytest.approx(6.0 / 9.0, rel=1e-3)
    for _ in range(200):
        _verified(acc, 8, [8], expected=1.0)
    assert acc.calibrated(8) == AcceptanceTracker.CAL_RANGE[1]

    policy = SpeculationPolicy((0, 4), acceptance=AcceptanceTracker(prior=0.9))
    key = policy.choose(8, 3000)[1]
    policy.choose(8, 3000)
    _feed(policy, key, plain=2.0, step=1.0, verify=3.0, k=4)
    choice = policy.choose(8, 3000)
    assert choice.steps == 4 and choice.expected == pytest.approx(8 * expected_tokens(0.9, 4))
    for _ in range(100):
        _verified(policy.acceptance, 4, [1] * 8, expected=choice.expected)  # 2 tokens each against ~4.1 expected
    acc = policy.acceptance
    assert acc.calibrated(4) < 0.6
    want = acc.calibrated(4) * expected_tokens(acc.alpha, 4) / policy.round_ms(key, 4)
    assert policy.rates(key)[4] == pytest.approx(want)
    assert policy.choose(8, 3000).steps == 0  # calibrated, plain decoding wins
    assert policy.summary()["calibration"] == {"4": round(policy.acceptance.calibrated(4), 3)}


def test_the_premium_keeps_plain_decoding_where_speculation_gains_little():
    """k = 8 at acceptance 0.9 promises 6.1 tokens per 11.1 ms round, 10% more than plain decoding's
    one per 2.0 ms: below the 15% premium, so the policy decodes plainly; at 0.95 (7.4 tokens, +33%) it
    speculates."""
    for alpha, want in ((0.9, 0), (0.95, 8)):
        policy = SpeculationPolicy((0, 8), acceptance=AcceptanceTracker(prior=alpha))
        key = policy.choose(32, 2000)[1]
        policy.choose(32, 2000)
        policy.observe(_rounds(RoundSample(key, 0, 0.0, 2.0, 0.0), RoundSample(key, 8, 8.0, 3.1, 0.0)))
        assert policy.choose(32, 2000).steps == want
    with pytest.raises(ValueError, match="SPEC_PREMIUM"):
        PillarConfig(num_steps=8, spec_premium=-1.0)


def test_mixed_iterations_price_the_full_length_round_whole():
    """A mixed-phase iteration has no draft / verify phases: its whole time prices the full-length
    round (CostCell.mixed), leaves the split rounds' verify cost alone, and survives the cost file.
    (The clock's mixed samples: tests/test_clock.py.)"""
    sample = RoundSample((64, 24), 8, 0.0, 30.0, None, mixed=True)
    policy = SpeculationPolicy((0, 4, 8), mixed_steps=8)
    key = (64, 24)
    policy.observe(_rounds(RoundSample(key, 4, 12.0, 10.0, 0.0)))  # a split k = 4 round prices verify at 10
    assert policy.round_ms(key, 8) == pytest.approx(24.0 + 10.0)  # before any mixed one: scaled drafts
    policy.observe(_rounds(sample))
    assert policy.round_ms(key, 8) == pytest.approx(30.0)
    assert policy.round_ms(key, 4) == pytest.approx(22.0)  # untouched
    cells = policy.table.export()
    assert cells["64,24"]["mixed"] == 30.0
    fresh = SpeculationPolicy((0, 4, 8), mixed_steps=8)
    fresh.table.restore({"64,24": {"mixed": 30.0}})
    assert fresh.round_ms(key, 8) == pytest.approx(30.0)
    # Without mixed iterations (mixed_steps None) the same measurements price k = 8 from split phases.
    split = SpeculationPolicy((0, 4, 8))
    split.observe(_rounds(RoundSample(key, 4, 12.0, 10.0, 0.0), sample))
    assert split.round_ms(key, 8) == pytest.approx(24.0 + 10.0)
