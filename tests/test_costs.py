"""adaptive/costs.py: round costs that warm-up and one-off spikes cannot move (adaptive speculation's prices)."""

from __future__ import annotations

import json

import pytest

from sglang_sparsespec.adaptive.acceptance import AcceptanceTracker
from sglang_sparsespec.adaptive.policy import SpeculationPolicy
from sglang_sparsespec.adaptive.costs import PROBE_ROUNDS, CostTable, RobustCost, cell_key
from sglang_sparsespec.rounds.clock import RoundSample

SPIKE = 100.0


def test_a_cost_drops_its_warm_up_and_prices_by_the_lower_median():
    cost = RobustCost()
    cost.add(150.0)  # the first call: compile / cold graph
    assert cost.value is None
    cost.add(1.2)
    cost.add(1.0)
    assert cost.value is None  # two kept samples are not a price
    cost.add(1.1)
    assert cost.value == 1.1  # the median of (1.2, 1.0, 1.1)
    cost.add(1.0 * SPIKE)
    assert cost.value == 1.1  # the lower median of (1.2, 1.0, 1.1, 100): never the spike
    for _ in range(RobustCost.WINDOW):
        cost.add(2.0)  # a real change of cost takes over within the window
    assert cost.value == 2.0 and len(cost.recent) == RobustCost.WINDOW
    primed = RobustCost()
    primed.prime(3.0)
    primed.add(3.0 * SPIKE)
    assert primed.value == 3.0


@pytest.mark.parametrize("outlier", [1.0 / SPIKE, 1.0 * SPIKE])
@pytest.mark.parametrize("position", [0, 1, 2])
def test_one_outlier_high_or_low_never_prices_a_mode(outlier, position):
    """The first price comes from three kept samples: of two, the lower median is the smaller, so one
    low round (1 % of the cost) alone would have priced the mode."""
    cost = RobustCost()
    cost.add(150.0)  # the warm-up, dropped
    kept = [1.0, 1.0, 1.0]
    kept[position] = outlier
    for ms in kept:
        assert cost.value is None
        cost.add(ms)
    assert cost.value == 1.0


def _policy(alpha: float) -> SpeculationPolicy:
    return SpeculationPolicy((0, 2, 4, 8), reprobe_every=10_000, acceptance=AcceptanceTracker(prior=alpha))


def _round(key: tuple[int, int], k: int, plain: float, step: float, verify: float) -> RoundSample:
    if k == 0:
        return RoundSample(key, 0, 0.0, plain, 0.1)
    return RoundSample(key, k, k * step, verify, 0.1)


def _path(policy: SpeculationPolicy, bs: int, ctx: float, rounds: int = 12) -> list[int]:
    return [policy.choose(bs, ctx).steps for _ in range(rounds)]


# (batch, context, plain ms, draft step ms, verify ms, acceptance, the path the costs give)
CASES = [
    (1, 4000, 1.0, 0.85, 1.2, 0.85, 0),  # few requests: plain decoding; a spiked plain round would flip it
    (256, 7000, 20.0, 2.5, 21.0, 0.85, 8),  # long contexts: speculation; a spiked verify would flip it
]


@pytest.mark.parametrize(("bs", "ctx", "plain", "step", "verify", "alpha", "want"), CASES)
@pytest.mark.parametrize("position", [0, 2, 5])
def test_a_100x_spike_in_one_round_cannot_change_the_path(bs, ctx, plain, step, verify, alpha, want, position):
    """A priced cell gets one round 100x its cost (the winning mode's, the one that would flip the
    path: plain where plain wins, the verify where speculation wins) among normal rounds: the path
    stays. An EMA or a mean would have flipped it (a 0.3-weight EMA puts plain at 30 ms)."""
    policy = _policy(alpha)
    key = cell_key(bs, ctx)
    normal = [_round(key, 0, plain, step, verify), _round(key, 8, plain, step, verify)]
    for _ in range(PROBE_ROUNDS):
        policy.observe(normal)
    _path(policy, bs, ctx, 2 * PROBE_ROUNDS)  # the cell's probes
    assert _path(policy, bs, ctx) == [want] * 12
    spiked_k = 0 if want == 0 else 8
    for i in range(6):
        rounds = [_round(key, 0, plain, step, verify), _round(key, 8, plain, step, verify)]
        if i == position:
            rounds[spiked_k != 0] = _round(key, spiked_k, plain * SPIKE, step, verify * SPIKE)
        policy.observe(rounds)
        assert _path(policy, bs, ctx, 3) == [want] * 3, i
    cell = policy.summary()["cells"]
    assert max(v for c in cell.values() for n, v in c.items() if n != "rounds") < SPIKE


@pytest.mark.parametrize(("bs", "ctx", "plain", "step", "verify", "alpha", "want"), CASES)
def test_a_first_call_spike_is_never_priced(bs, ctx, plain, step, verify, alpha, want):
    """A new cell whose first round of each mode costs 100x (compile, cold graphs, SGLang's start-up
    request) prices both modes from the rounds after it and takes the same path as without the spike."""
    policy = _policy(alpha)
    key = cell_key(bs, ctx)
    probes = _path(policy, bs, ctx, 2 * PROBE_ROUNDS)
    assert probes == [0] * PROBE_ROUNDS + [8] * PROBE_ROUNDS
    for i, k in enumerate(probes):
        first = i in (0, PROBE_ROUNDS)
        scale = SPIKE if first else 1.0
        policy.observe([_round(key, k, plain * scale, step * scale, verify * scale)])
    assert policy.round_ms(key, 0) == pytest.approx(plain + 0.1)
    assert policy.round_ms(key, 8) == pytest.approx(8 * step + verify + 0.1)
    assert _path(policy, bs, ctx) == [want] * 12


def test_the_cost_file_carries_the_robust_estimates():
    """The export holds each estimate's value (a spike is not in it); a restored cell is primed, so one
    spiked round after the restart does not move its price either."""
    policy = _policy(0.85)
    key = cell_key(1, 4000)
    rounds = [_round(key, 0, 1.0, 0.85, 1.2) for _ in range(4)] + [_round(key, 0, SPIKE, 0.0, 0.0)]
    policy.observe(rounds + [_round(key, 8, 1.0, 0.85, 1.2) for _ in range(PROBE_ROUNDS)])
    cells = json.loads(json.dumps(policy.table.export()))
    assert cells[f"{key[0]},{key[1]}"]["plain"] == 1.0
    table = CostTable()
    assert table.restore(cells) == 1
    cell = table.cell(key)
    cell.plain.add(SPIKE)
    assert cell.plain.value == 1.0 and table.export() == cells
