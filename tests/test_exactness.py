"""The statistics of benchmarks.exactness (the GPU run itself needs servers)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from benchmarks import exactness


def _draw(rng: random.Random, weights: list[float], n: int) -> Counter:
    return Counter(rng.choices(range(len(weights)), weights=weights, k=n))


def test_homogeneity_accepts_one_distribution_and_rejects_two():
    rng = random.Random(0)
    # A long tail of rare categories, as next-token pairs have: they are pooled, not dropped.
    weights = [0.5, 0.2, 0.1, 0.05] + [0.15 / 300] * 300
    same = exactness.homogeneity(_draw(rng, weights, 50_000), _draw(rng, weights, 50_000))
    assert same["p_value"] > 1e-3 and 4 <= same["cells"] <= 305 and same["df"] == same["cells"] - 1
    shifted = [0.46, 0.24] + weights[2:]
    diff = exactness.homogeneity(_draw(rng, weights, 50_000), _draw(rng, shifted, 50_000))
    assert diff["p_value"] < 1e-6
    # Unequal sample sizes are fine; a category seen by one sample only counts against it.
    lopsided = exactness.homogeneity(Counter({0: 900, 1: 100}), Counter({0: 90, 1: 10, 2: 40}))
    assert lopsided["p_value"] < 1e-6
    with pytest.raises(ValueError, match="non-empty"):
        exactness.homogeneity(Counter(), Counter({0: 1}))


def test_chi2_sf_and_pair_counts():
    assert exactness.chi2_sf(3.841, 1) == pytest.approx(0.05, abs=1e-3)
    assert exactness.chi2_sf(18.307, 10) == pytest.approx(0.05, abs=1e-3)
    outs = [[1, 2, 3], [1, 2, 4], [5, 2, 3]]
    assert exactness.pair_counts(outs, 1) == Counter({(1, 2): 2, (5, 2): 1})
    assert exactness.pair_counts(outs, 2) == Counter({(2, 3): 2, (2, 4): 1})


def test_parse_args_checks_settings(tmp_path):
    base = ["--model", "m", "--data-dir", str(tmp_path), "--out", str(tmp_path / "e.json")]
    args = exactness.parse_args(base + ["--settings", "0.6:0.95,1:1"])
    assert args.settings == [(0.6, 0.95), (1.0, 1.0)] and args.candidate == "pillar" and args.reference == "stock"
    assert args.controls == ["stock-flashinfer"]
    same_numerics = ["--reference", "pillar:adaptive_steps=off:budget_ratio=1", "--candidate", "pillar:adaptive_steps=off"]
    assert exactness.parse_args(base + same_numerics + ["--controls", ""]).reference.endswith("budget_ratio=1")
    for bad in (["--settings", "0:0.9"], ["--settings", "0.6"], ["--new-tokens", "1"], ["--candidate", "eagle"],
                ["--controls", "x"], ["--reference", "pillar:budget_ratio=2"], ["--reference", "pillar"],
                ["--controls", "stock"]):  # fmt: skip
        with pytest.raises(SystemExit):
            exactness.parse_args(base + bad)


def _tests(p_by_position: dict[int, float]) -> list[dict]:
    return [{"position": j, "p_value": p} for j, p in p_by_position.items()]


def test_verdict_separates_numerics_from_speculation():
    power = {"p_value": 1e-30}
    ok = {1: 0.3, 2: 0.5, 3: 0.02, 4: 0.9}
    assert exactness.verdict(_tests(ok), 4, power, 1e-3) == ("PASS", 2.5e-4)
    # A later token rejects while token 1 (drawn before any PILLAR code) agrees: the speculation is wrong.
    assert exactness.verdict(_tests(ok | {3: 1e-6}), 4, power, 1e-3)[0] == "FAIL"
    # Token 1 rejects: the servers round differently, so no token says anything about the speculation.
    assert exactness.verdict(_tests(ok | {1: 1e-8, 3: 1e-6}), 4, power, 1e-3)[0] == "NUMERICS"
    # A control that does not reject means the sample size has no power: no pass on that.
    assert exactness.verdict(_tests(ok), 4, {"p_value": 0.2}, 1e-3)[0] == "NO_POWER"
    assert exactness.verdict(_tests(ok), 8, power, 1e-3) == ("INCOMPLETE", None)
    assert exactness.verdict(_tests(ok), 4, None, 1e-3) == ("INCOMPLETE", None)


def test_tallies_round_trip_through_json_and_the_cut_finds_the_closest_call():
    outs = [[1, 2, 3], [1, 2, 4], [5, 2, 3]]
    cell = json.loads(json.dumps(exactness.tally(outs, 3)))
    assert cell["n"] == 3
    assert exactness.counters(cell) == [Counter({1: 2, 5: 1}), exactness.pair_counts(outs, 1), exactness.pair_counts(outs, 2)]
    # output_top_logprobs rows: [[logprob, id, text], ...]; index 3 is the nearest tie at or after lo = 2
    rows = [[[-0.1, 7, None], [-0.2, 8, None]], [[-0.1, 7, None], [-3.0, 8, None]], [[-0.5, 7, None], [-2.0, 9, None]],
            [[-0.6, 7, None], [-0.9, 9, None]], [[-0.01, 7, None]]]  # fmt: skip
    assert exactness.most_uncertain_cut(rows, 2) == (3, pytest.approx(0.3))
    with pytest.raises(ValueError, match="no output position"):
        exactness.most_uncertain_cut(rows, 5)
