"""rounds/timing.py: the phase report's line round trip and its knob (the clock: tests/test_clock.py)."""

from __future__ import annotations

import pytest

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.rounds.timing import PhaseReport, format_report, parse_reports


def test_report_line_round_trip_and_config_knob():
    r = PhaseReport(
        rounds=50, batch=31.5, ms={"draft": 1.25, "verify": 2.5, "accept": 0.5, "select": 0.125, "gap": 0.25}
    )
    log = f"[2026-11-23] INFO {format_report(r)}\nnoise\n[x] {format_report(r)}"
    assert parse_reports(log) == [r, r]
    assert PillarConfig.from_env(8, {"SPARSESPEC_STEP_TIMING": "50"}).timing_every == 50
    with pytest.raises(ValueError, match="STEP_TIMING"):
        PillarConfig.from_env(8, {"SPARSESPEC_STEP_TIMING": "-1"})
