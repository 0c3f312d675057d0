"""RoundTimer bookkeeping with fake events, and the report line round trip."""

from __future__ import annotations

import pytest

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.rounds.timing import (
    NoTimer,
    PhaseReport,
    RoundTimer,
    format_report,
    parse_reports,
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.synced = 0

    def event(self):
        clock = self

        class Ev:
            def record(self) -> None:
                self.t = clock.now

            def synchronize(self) -> None:
                clock.synced += 1

            def elapsed_time(self, end) -> float:
                return end.t - self.t

        return Ev()


def test_round_timer_means_per_phase_and_syncs_once_per_interval():
    clock, reports = FakeClock(), []
    timer = RoundTimer(2, clock.event, reports.append)
    rounds = [(4, 0.7, (3.0, 2.0, 0.25, 0.5)), (8, 0.3, (5.0, 4.0, 0.75, 1.5)), (2, 9.0, (1.0, 1.0, 1.0, 1.0))]
    for i, (bs, gap, phases) in enumerate(rounds):
        clock.now += gap
        if i == 2:
            timer.interrupt()  # a prefill ran in between: no gap for the third round
        timer.start(bs)
        for phase, dt in zip(("draft", "verify", "accept", "select"), phases):
            clock.now += dt
            # The sampling hook ends the verify phase through the callback, as in the worker.
            timer.verify_callback() if phase == "verify" else timer.mark(phase)
    assert clock.synced == 1 and len(reports) == 1  # the third round waits for the next interval
    # The first round follows no decode round, so the gap mean is the second round's alone.
    ms = {"draft": 4.0, "verify": 3.0, "accept": 0.5, "select": 1.0, "gap": 0.3}
    assert reports[0] == PhaseReport(rounds=2, batch=6.0, ms=pytest.approx(ms))
    clock.now += 1.0
    timer.start(1)
    for phase in ("draft", "verify", "accept", "select"):
        timer.mark(phase)
    assert reports[1].ms["gap"] == pytest.approx(1.0)  # the interrupted third round has none, the fourth 1 ms

    with pytest.raises(RuntimeError, match="out of order"):
        timer.start(1)
        timer.mark("verify")


def test_report_line_round_trip_and_config_knob():
    r = PhaseReport(rounds=50, batch=31.5, ms={"draft": 1.25, "verify": 2.5, "accept": 0.5, "select": 0.125, "gap": 0.25})
    log = f"[2026-11-23] INFO {format_report(r)}\nnoise\n[x] {format_report(r)}"
    assert parse_reports(log) == [r, r]
    assert PillarConfig.from_env(8, {"SPARSESPEC_STEP_TIMING": "50"}).timing_every == 50
    with pytest.raises(ValueError, match="STEP_TIMING"):
        PillarConfig.from_env(8, {"SPARSESPEC_STEP_TIMING": "-1"})
    with pytest.raises(ValueError, match=">= 1 round"):
        RoundTimer(0, FakeClock().event, print)


def test_no_timer_takes_the_same_calls_and_records_nothing():
    timer = NoTimer()
    timer.start(4)
    for phase in ("accept", "draft"):  # any order: it checks nothing
        timer.mark(phase)
    timer.interrupt()
    assert timer.verify_callback is None and not vars(timer)
