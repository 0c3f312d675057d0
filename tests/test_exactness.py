"""The statistics and arguments of benchmarks.checks.exactness (the GPU run itself needs servers)."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from benchmarks.checks import exactness, exactness_contexts, exactness_plan, exactness_stats as stats


def _draw(rng: random.Random, weights: list[float], n: int) -> Counter:
    return Counter(rng.choices(range(len(weights)), weights=weights, k=n))


def test_homogeneity_accepts_one_distribution_and_rejects_two():
    rng = random.Random(0)
    # A long tail of rare categories, as next-token pairs have: they are pooled, not dropped.
    weights = [0.5, 0.2, 0.1, 0.05] + [0.15 / 300] * 300
    same = stats.homogeneity(_draw(rng, weights, 50_000), _draw(rng, weights, 50_000))
    assert same["p_value"] > 1e-3 and 4 <= same["cells"] <= 305 and same["df"] == same["cells"] - 1
    shifted = [0.46, 0.24] + weights[2:]
    diff = stats.homogeneity(_draw(rng, weights, 50_000), _draw(rng, shifted, 50_000))
    assert diff["p_value"] < 1e-6
    # Unequal sample sizes are fine; a category seen by one sample only counts against it.
    lopsided = stats.homogeneity(Counter({0: 900, 1: 100}), Counter({0: 90, 1: 10, 2: 40}))
    assert lopsided["p_value"] < 1e-6
    assert lopsided["largest"][0] == [["pool", 1], 100, 50]  # category 2 (40 in b only) joined category 1
    # The category only one sample has adds the most; pair categories come back as lists (JSON).
    support = stats.homogeneity(Counter({(0, 1): 900, (0, 2): 100}), Counter({(0, 1): 450, (0, 2): 50, (5, 5): 200}))
    assert support["largest"][0] == [[5, 5], 0, 200] and len(support["largest"]) == 3
    with pytest.raises(ValueError, match="non-empty"):
        stats.homogeneity(Counter(), Counter({0: 1}))


def test_chi2_sf_and_pair_counts():
    assert stats.chi2_sf(3.841, 1) == pytest.approx(0.05, abs=1e-3)
    assert stats.chi2_sf(18.307, 10) == pytest.approx(0.05, abs=1e-3)
    outs = [[1, 2, 3], [1, 2, 4], [5, 2, 3]]
    assert stats.pair_counts(outs, 1) == Counter({(1, 2): 2, (5, 2): 1})
    assert stats.pair_counts(outs, 2) == Counter({(2, 3): 2, (2, 4): 1})


def test_parse_args_takes_one_sampling_setting_against_a_reference_without_speculation(tmp_path):
    base = ["--model", "m", "--data-dir", str(tmp_path), "--out", str(tmp_path / "e.json")]
    args = exactness.parse_args(base + ["--temperature", "0.6", "--top-p", "0.95", "--top-k", "20"])
    assert (args.reference, args.candidate, args.controls, args.mem_fraction_static) == ("stock", "pillar", [], 0.4)
    assert exactness_plan.sampling_params(args) == {
        "temperature": 0.6,
        "top_p": 0.95,
        "top_k": 20,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repetition_penalty": 1.0,
        "min_new_tokens": 0,
        "max_new_tokens": 4,
        "ignore_eos": True,
    }
    assert exactness_plan.power_checks(args) == [("hot", "token 2")]
    assert exactness_plan.statistics(args) == ["token 1", "token 2", "token 3", "token 4", "length", "repeats"]
    three = exactness.parse_args(base + ["--controls", "stock-flashinfer", "--candidate", "pillar:adaptive_steps=off"])
    assert three.mem_fraction_static == pytest.approx(0.267)
    # Started one after another, each server is sized on what the ones before left free (SGLang's rule: a server
    # holds its fraction of the memory free at its start), so each ends up holding its share of the card.
    fractions = exactness.launch_fractions(three.mem_fraction_static, 3)
    assert fractions == [0.267, 0.364, 0.573]
    free = 1.0
    for fraction in fractions:
        held = free * fraction
        assert held == pytest.approx(0.267, abs=1e-3)
        free -= held
    pen = exactness.parse_args(base + ["--presence-penalty", "0.3", "--min-new-tokens", "2", "--stop-at-eos"])
    assert exactness_plan.power_checks(pen) == [("hot", "token 2"), ("plain", "repeats"), ("plain", "length")]
    assert (
        exactness_plan.part_params(pen, "plain")["presence_penalty"] == 0.0
        and exactness_plan.part_params(pen, "plain")["min_new_tokens"] == 0
    )
    assert exactness_plan.part_params(pen, "hot")["temperature"] == pytest.approx(1.3)
    assert [(p, c) for p, c, _ in exactness_plan.cell_plan(pen)] == [("main", 0), ("hot", 0), ("plain", 0)]
    # A PILLAR reference shares the candidate's target filter and verify: refused, as is any bad setting.
    for bad in (
        ["--reference", "pillar:budget_ratio=1", "--candidate", "pillar"],
        ["--temperature", "0"],
        ["--new-tokens", "1"],
        ["--candidate", "eagle"],
        ["--controls", "x"],
        ["--controls", "stock"],
        ["--min-p", "1"],
        ["--frequency-penalty", "3"],
        ["--min-new-tokens", "1"],
        ["--prompts", "data"],
        ["--mem-fraction-static", "0.5"],
        ["--samples", "1"],
    ):
        argv = [a for a in base if a not in ("--data-dir", str(tmp_path))] if bad == ["--prompts", "data"] else base
        with pytest.raises(SystemExit):
            exactness.parse_args(argv + bad)


def _tests(p_by_statistic: dict[str, float]) -> list[dict]:
    return [{"statistic": s, "p_value": p} for s, p in p_by_statistic.items()]


def test_verdict_separates_numerics_from_speculation_and_needs_every_power_check():
    power = [{"p_value": 1e-30}, {"p_value": 1e-20}]
    ok = {"token 1": 0.3, "token 2": 0.5, "length": 0.02, "repeats": 0.9}
    assert stats.verdict(_tests(ok), 4, power, 1e-3) == ("PASS", 2.5e-4)
    # A later statistic rejects while token 1 (drawn with stock's sampler in both) agrees: the speculation is wrong.
    assert stats.verdict(_tests(ok | {"repeats": 1e-6}), 4, power, 1e-3)[0] == "FAIL"
    # Token 1 rejects: the servers round differently, so no statistic says anything about the speculation.
    assert stats.verdict(_tests(ok | {"token 1": 1e-8, "length": 1e-6}), 4, power, 1e-3)[0] == "NUMERICS"
    # A power check that does not reject (e.g. dropping the penalties shows nowhere): no pass on that.
    assert stats.verdict(_tests(ok), 4, [power[0], {"p_value": 0.2}], 1e-3)[0] == "NO_POWER"
    assert stats.verdict(_tests(ok), 8, power, 1e-3) == ("INCOMPLETE", None)
    assert stats.verdict(_tests(ok), 4, [power[0], None], 1e-3) == ("INCOMPLETE", None)
    assert stats.verdict(_tests(ok), 4, [], 1e-3) == ("INCOMPLETE", None)


def test_tallies_pad_stopped_outputs_and_round_trip_through_json():
    outs = [[1, 2, 3], [1, 2, 2], [5, 3], [1]]
    cell = json.loads(json.dumps(stats.tally(outs, 3)))
    assert cell["n"] == 4
    c = stats.counters(cell)
    assert c["token 1"] == Counter({1: 3, 5: 1})
    assert c["token 2"] == Counter({(1, 2): 2, (5, 3): 1, (1, stats.END): 1})
    assert c["token 3"] == Counter({(2, 3): 1, (2, 2): 1, (3, stats.END): 1, (stats.END, stats.END): 1})
    assert c["length"] == Counter({3: 2, 2: 1, 1: 1}) and c["repeats"] == Counter({0: 3, 1: 1})
    assert stats.total_variation(Counter({0: 1, 1: 1}), Counter({0: 3, 2: 1})) == pytest.approx(0.5)
    # A server that answers past max_new_tokens, or with nothing, shows in the lengths (no crash).
    odd = stats.counters(stats.tally([[1, 2, 3, 4], []], 3))
    assert odd["length"] == Counter({4: 1, 0: 1}) and odd["token 1"] == Counter({1: 1, stats.END: 1})


def test_the_cut_finds_the_closest_call():
    # output_top_logprobs rows: [[logprob, id, text], ...]; index 3 is the nearest tie at or after lo = 2
    rows = [
        [[-0.1, 7, None], [-0.2, 8, None]],
        [[-0.1, 7, None], [-3.0, 8, None]],
        [[-0.5, 7, None], [-2.0, 9, None]],
        [[-0.6, 7, None], [-0.9, 9, None]],
        [[-0.01, 7, None]],
    ]
    assert exactness_contexts.most_uncertain_cut(rows, 2) == (3, pytest.approx(0.3))
    with pytest.raises(ValueError, match="no output position"):
        exactness_contexts.most_uncertain_cut(rows, 5)


def _test(config: str, statistic: str, p_value: float, tv: float) -> dict:
    return {
        "config": config,
        "context": 0,
        "statistic": statistic,
        "stat": 9.0,
        "df": 3,
        "p_value": p_value,
        "total_variation": tv,
    }


def test_parity_sets_each_control_beside_the_candidate():
    tests = [
        _test("pillar", "token 1", 0.5, 0.004),
        _test("pillar", "token 3", 1e-9, 0.009),
        _test("ngram", "token 1", 0.6, 0.002),
        _test("ngram", "token 3", 1e-20, 0.024),
        _test("stock-flashinfer", "token 1", 0.7, 0.001),
        _test("stock-flashinfer", "token 3", 0.2, 0.003),
    ]
    p = stats.parity(tests, "pillar", ["ngram", "stock-flashinfer"], 1e-4)
    assert p["verdict"] == "WITHIN" and [r["statistic"] for r in p["rows"]] == ["token 1", "token 3"]
    # Token 1 passes, so its TV above both controls' is no deviation; token 3 rejects within ngram's.
    first, third = p["rows"]
    assert first["within"] and not first["rejects"] and third["within"] and third["rejects"]
    assert third["candidate"] == {"stat": 9.0, "df": 3, "p_value": 1e-9, "total_variation": 0.009}
    assert (
        third["controls"]["ngram"]["total_variation"] == 0.024
        and third["controls"]["stock-flashinfer"]["p_value"] == 0.2
    )
    assert stats.parity_line(p) == (
        "parity: pillar WITHIN the controls' deviation at every statistic it rejects: "
        "ctx 0 token 3: TV 0.0090 (ngram 0.0240, stock-flashinfer 0.0030)"
    )
    worse = [*tests[:1], _test("pillar", "token 3", 1e-12, 0.031), *tests[2:]]
    beyond = stats.parity(worse, "pillar", ["ngram", "stock-flashinfer"], 1e-4)
    assert beyond["verdict"] == "BEYOND" and not beyond["rows"][1]["within"]
    assert stats.parity_line(beyond).startswith(
        "parity: pillar BEYOND the controls' deviation at ctx 0 token 3: TV 0.0310"
    )
    assert stats.parity(tests, "pillar", [], 1e-4)["verdict"] == "NO_CONTROLS"
    assert stats.parity(tests[:4], "pillar", ["ngram", "stock-flashinfer"], 1e-4)["verdict"] == "INCOMPLETE"
    assert stats.parity(tests[2:], "pillar", ["ngram"], 1e-4)["verdict"] == "INCOMPLETE"  # no candidate cell yet
    assert "(it rejects no statistic)" in stats.parity_line(
        stats.parity(tests[:1] + tests[2:3], "pillar", ["ngram"], 1e-4)
    )


def test_an_untimed_group_is_expected_to_take_its_share_of_the_samples(tmp_path):
    """The power check's group draws half the main group's samples: it is expected to take half the main's time,
    not the whole (which skips a check that fits), and its own time once it has one."""
    base = ["--model", "m", "--data-dir", str(tmp_path), "--out", str(tmp_path / "e.json"), "--samples", "1000"]
    args = exactness.parse_args(base + ["--temperature", "0.6", "--top-p", "0.95"])
    seconds = {"main | context 0": 140.0}
    assert exactness.part_samples(args, "main") == 1000 and exactness.part_samples(args, "hot") == 500
    assert exactness.group_estimate(seconds, "hot | context 0", args) == pytest.approx(70.0)
    assert exactness.group_estimate(seconds, "main | context 1", args) == pytest.approx(140.0)
    assert exactness.group_estimate({**seconds, "hot | context 0": 30.0}, "hot | context 0", args) == 30.0
    assert exactness.group_estimate({}, "main | context 0", args) == 0.0
