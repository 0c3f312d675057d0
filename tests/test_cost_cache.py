"""Measured round costs kept across server starts (``adaptive/cost_cache.py``, ``CostTable.export/restore``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from sglang_sparsespec.metrics import PillarMetrics
from sglang_sparsespec.patches.round_plan import RoundPlanner
from sglang_sparsespec.rounds.clock import NoClock
from sglang_sparsespec.patches.tp_agree import RoundAgreement

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.adaptive.policy import PROBE_ROUNDS, RoundSample, SpeculationPolicy, cell_key
from sglang_sparsespec.adaptive.cost_cache import CostFile

IDENTITY = {"gpu": "NVIDIA H100 80GB HBM3", "model": "/m", "tp_size": 1, "step_candidates": [0, 2, 4, 8]}


def measured_policy() -> tuple[SpeculationPolicy, tuple[int, int]]:
    policy = SpeculationPolicy((0, 2, 4, 8))
    key = cell_key(256, 4000)
    policy.observe([RoundSample(key, 0, 0.0, 11.8, 0.05), RoundSample(key, 8, 18.0, 16.2, 0.05)] * PROBE_ROUNDS)
    policy.observe([RoundSample(cell_key(4, 300), 0, 0.0, 1.6, None)] * PROBE_ROUNDS)  # plain only: still exported
    return policy, key


def test_a_restored_table_prices_its_cells_without_probing_them_again():
    policy, key = measured_policy()
    cells = json.loads(json.dumps(policy.table.export()))  # through JSON, as in the file
    assert cells[f"{key[0]},{key[1]}"] == {"plain": 11.8, "verify": 16.2, "gap": 0.05, "draft": {"8": 18.0}}
    fresh = SpeculationPolicy((0, 2, 4, 8))
    assert fresh.table.restore(cells) == 2
    assert fresh.round_ms(key, 8) == pytest.approx(18.0 + 16.2 + 0.05)
    # A fresh server would first probe plain, then k = 8 (test_adaptive); a restored cell goes straight
    # to its best count, and re-probes the other mode only on the usual schedule.
    rates = fresh.rates(key)
    best = max(rates, key=rates.__getitem__)
    assert best != 0 and [fresh.choose(256, 4000).steps for _ in range(3)] == [best] * 3
    assert [fresh.choose(4, 300).steps for _ in range(PROBE_ROUNDS)] == [8] * PROBE_ROUNDS  # plain only: probe k_max
    # Cells this server measured already are kept; a malformed export is refused whole.
    mine = SpeculationPolicy((0, 2, 4, 8))
    mine.observe([RoundSample(key, 0, 0.0, 9.0, None)] * PROBE_ROUNDS)
    mine.table.restore(cells)
    assert mine.round_ms(key, 0) == pytest.approx(9.0)
    for bad in (
        {"x": {"plain": 1.0}},
        {"8,3": {"plain": "fast"}},
        {"8,3": {"verify": 1.0}},
        {"8,3": {"plain": -1}},
        {"0,3": {"plain": 1.0}},
        {"8,3": {"plain": 1.0, "draft": {"two": 1.0}}},
    ):
        with pytest.raises(ValueError, match="malformed cost cells"):
            SpeculationPolicy((0, 8)).table.restore(bad)


def test_the_cost_file_belongs_to_one_setup(tmp_path: Path):
    assert CostFile.resolve("off", IDENTITY) is None
    auto = CostFile.resolve("auto", IDENTITY, root=tmp_path)
    assert auto.path.parent == tmp_path / "costs" and auto.path.name.startswith("NVIDIA-H100-80GB-HBM3-")
    other = CostFile.resolve("auto", IDENTITY | {"tp_size": 2}, root=tmp_path)
    assert other.path != auto.path  # another setup, another file
    assert CostFile.resolve("~/x.json", IDENTITY).path == Path.home() / "x.json"
    assert auto.load() is None  # nothing written yet
    policy, _ = measured_policy()
    auto.save(policy.table.export())
    assert auto.load() == json.loads(json.dumps(policy.table.export()))
    assert [p.name for p in auto.path.parent.iterdir()] == [auto.path.name]  # no temporary left behind
    # The same path under another identity, a truncated file or another schema: not read.
    assert CostFile(auto.path, IDENTITY | {"model": "/other"}).load() is None
    auto.path.write_text('{"schema": 1, "ident')
    assert auto.load() is None
    auto.path.write_text(json.dumps({"schema": 99, "identity": IDENTITY, "cells": {}}))
    assert auto.load() is None


def test_the_knob(tmp_path: Path):
    assert PillarConfig().cost_cache == "auto"
    assert PillarConfig.from_env(8, {"SPARSESPEC_COST_CACHE": "off"}).cost_cache == "off"
    assert PillarConfig(cost_cache=" OFF").cost_cache == "off" and PillarConfig(cost_cache="Auto").cost_cache == "auto"
    assert CostFile.resolve("OFF", IDENTITY) is None  # any case, as the enumerated knobs take theirs
    for bad in (" ", ".", "/", "..", str(tmp_path)):  # no file name, or a folder: refused at launch
        with pytest.raises(ValueError, match="COST_CACHE must be 'auto', 'off' or a file's path"):
            PillarConfig(cost_cache=bad)


def test_a_failed_save_leaves_no_temporary_file(tmp_path: Path):
    file = CostFile(tmp_path / "costs.json", IDENTITY)
    file.path.mkdir()  # the path became a folder after launch
    with pytest.raises(OSError):
        file.save({})
    assert [p.name for p in tmp_path.iterdir()] == ["costs.json"]


def _planner(policy, file, agreement) -> RoundPlanner:
    return RoundPlanner(PillarConfig(), PillarMetrics(8), NoClock(), policy=policy, agreement=agreement, cost_file=file)


def test_the_planner_restores_at_start_and_rank_0_saves(tmp_path: Path, caplog: pytest.LogCaptureFixture):
    policy, key = measured_policy()
    file = CostFile(tmp_path / "c.json", IDENTITY)
    planner = _planner(policy, file, RoundAgreement(None))  # nothing to restore yet
    planner.save_costs()
    planner.agreement = RoundAgreement(lambda t: None, rank=1)  # another TP rank: rank 0 writes
    file.path.write_text("{}")
    planner.save_costs()
    assert file.path.read_text() == "{}"
    planner.agreement = RoundAgreement(None)
    planner.save_costs()
    with caplog.at_level(logging.INFO):
        fresh = _planner(SpeculationPolicy((0, 2, 4, 8)), file, RoundAgreement(None))
    assert fresh.policy.round_ms(key, 0) == pytest.approx(11.8 + 0.05) and "2 measured cells" in caplog.text
    # A folder that cannot be written: one warning, then the server stops trying.
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder should be")
    planner.cost_file = CostFile(blocked / "c.json", IDENTITY)
    with caplog.at_level(logging.WARNING):
        planner.save_costs()
    assert planner.cost_file is None and "not saved" in caplog.text
    planner.save_costs()  # no file: nothing to do
