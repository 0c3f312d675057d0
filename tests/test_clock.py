"""rounds/clock.py: one set of CUDA events per round feeds the cost model's samples and the phase report.

Fake events: ``record`` takes the fake stream's time, ``query`` is true once the fake GPU has finished
past it, ``synchronize`` counts the host waits."""

from __future__ import annotations

import pytest

from sglang_sparsespec.rounds.clock import NoClock, PhaseClock, RoundClock, RoundSample, make_clock
from sglang_sparsespec.rounds.timing import PhaseReport

KEY = (8, 20)


class FakeStream:
    def __init__(self) -> None:
        self.now = 0.0  # the time the next event records
        self.done = -1.0  # the time the GPU has finished up to
        self.recorded = 0
        self.synced = 0

    def event(self):
        stream = self

        class Ev:
            def record(self) -> None:
                self.t = stream.now
                stream.recorded += 1

            def query(self) -> bool:
                return self.t <= stream.done

            def synchronize(self) -> None:
                stream.synced += 1
                stream.done = max(stream.done, self.t)

            def elapsed_time(self, end) -> float:
                return end.t - self.t

        return Ev()


def split_round(clock, s: FakeStream, bs: int, phases: tuple[float, float, float, float], gap: float = 0.0) -> None:
    """One speculative round as the worker drives it: start, draft, verify (after the verify forward),
    accept, select; ``gap`` ms of stream time before it."""
    s.now += gap
    clock.start(bs)
    marks = (clock.drafted, clock.verified, clock.accepted, clock.end)
    for mark, dt in zip(marks, phases):
        s.now += dt
        mark()


def plain_round(clock, s: FakeStream, ms: float, gap: float = 0.0) -> None:
    s.now += gap
    clock.start_plain()
    s.now += ms
    clock.end()


def test_cost_samples_only_of_finished_announced_rounds_with_decode_gaps():
    s = FakeStream()
    clock = RoundClock(s.event)
    clock.announce(KEY, 4)
    split_round(clock, s, 8, (3.0, 1.0, 0.5, 0.5))
    clock.announce(KEY, 0)
    plain_round(clock, s, 2.0, gap=1.0)
    assert s.recorded == 3 + 2  # start, draft, end; a plain round has no draft phase
    assert clock.poll() == []  # nothing finished on the GPU yet
    s.done = 5.0
    assert clock.poll() == [RoundSample(KEY, 4, 3.0, 2.0, None)]
    s.done = 100.0
    assert clock.poll() == [RoundSample(KEY, 0, 0.0, 2.0, 1.0)]  # plain rounds are priced, gap and all
    clock.interrupt()  # a prefill: the next round has no decode gap
    clock.announce(KEY, 4)
    split_round(clock, s, 8, (1.0, 1.0, 1.0, 1.0), gap=3.0)
    assert clock.poll()[0].gap_ms is None
    # An unannounced round (start-up warm-up, an idle batch) records nothing and keeps the last gap.
    n = s.recorded
    split_round(clock, s, 3, (1.0, 1.0, 1.0, 1.0), gap=1.0)
    plain_round(clock, s, 1.0)
    clock.start(3)
    clock.end_mixed()
    assert s.recorded == n and clock.poll() == []
    clock.announce(KEY, 2)
    split_round(clock, s, 8, (1.0, 1.0, 1.0, 1.0), gap=0.5)
    s.done = 1e9
    assert clock.poll()[0].gap_ms == pytest.approx(1.0 + 4.0 + 1.0 + 0.5)  # spans the unpriced rounds


def test_a_mixed_iteration_is_one_sample_timed_whole():
    s = FakeStream()
    clock = RoundClock(s.event)
    clock.announce((64, 24), 8)
    clock.start(64)
    s.now += 30.0
    clock.end_mixed()
    s.done = 31.0
    sample = clock.poll()[0]
    assert (sample.mixed, sample.draft_ms, sample.rest_ms) == (True, 0.0, 30.0)
    assert s.recorded == 2


def test_phase_report_means_per_phase_and_syncs_once_per_interval():
    s, reports = FakeStream(), []
    clock = PhaseClock(s.event, 2, reports.append)
    rounds = [(4, 0.7, (3.0, 2.0, 0.25, 0.5)), (8, 0.3, (5.0, 4.0, 0.75, 1.5)), (2, 9.0, (1.0, 1.0, 1.0, 1.0))]
    for i, (bs, gap, phases) in enumerate(rounds):
        if i == 2:
            clock.interrupt()  # a prefill ran in between: no gap for the third round
        split_round(clock, s, bs, phases, gap)
    assert s.recorded == 15 and s.synced == 1 and len(reports) == 1  # the third round waits for the next interval
    # The first round follows no decode round, so the gap mean is the second round's alone.
    ms = {"draft": 4.0, "verify": 3.0, "accept": 0.5, "select": 1.0, "gap": 0.3}
    assert reports[0] == PhaseReport(rounds=2, batch=6.0, ms=pytest.approx(ms))
    split_round(clock, s, 1, (1.0, 1.0, 1.0, 1.0), gap=1.0)
    assert reports[1].ms["gap"] == pytest.approx(1.0)  # the interrupted third round has none, the fourth 1 ms
    assert clock.poll() == []  # nobody announced a round: no cost samples

    with pytest.raises(RuntimeError, match="out of order"):
        clock.start(1)
        clock.accepted()
    with pytest.raises(ValueError, match=">= 1 round"):
        PhaseClock(s.event, 0, print)


def test_plain_rounds_are_priced_but_interrupt_the_phase_report():
    s, reports = FakeStream(), []
    clock = PhaseClock(s.event, 2, reports.append)
    clock.announce(KEY, 4)
    split_round(clock, s, 4, (2.0, 1.0, 1.0, 1.0))
    clock.announce(KEY, 0)
    plain_round(clock, s, 3.0, gap=0.5)
    assert s.recorded == 5 + 2  # each phase end once, shared by both readers; the plain round's two
    plain_round(clock, s, 3.0, gap=0.5)  # unannounced (a warm-up): nothing recorded, still no phase gap
    assert s.recorded == 7
    clock.announce(KEY, 4)
    split_round(clock, s, 6, (2.0, 2.0, 1.0, 1.0), gap=0.25)
    assert len(reports) == 1 and reports[0].ms["gap"] == 0.0  # the plain rounds voided the phase gap
    assert reports[0].batch == 5.0 and reports[0].ms["draft"] == pytest.approx(2.0)
    samples = clock.poll()
    assert [(x.k, x.draft_ms, x.rest_ms) for x in samples] == [(4, 2.0, 3.0), (0, 0.0, 3.0), (4, 2.0, 4.0)]
    # The cost model's gap spans only the unannounced plain round: its own last round ended there.
    assert [x.gap_ms for x in samples] == [None, pytest.approx(0.5), pytest.approx(0.5 + 3.0 + 0.25)]


def test_a_mixed_iteration_marks_every_phase_at_once_and_is_a_mixed_sample():
    s, reports = FakeStream(), []
    clock = PhaseClock(s.event, 1, reports.append)
    clock.announce(KEY, 8)
    clock.start(16)
    s.now += 12.0
    clock.end_mixed()
    assert s.recorded == 2
    assert reports[0].ms == pytest.approx({"draft": 12.0, "verify": 0.0, "accept": 0.0, "select": 0.0, "gap": 0.0})
    assert clock.poll() == [RoundSample(KEY, 8, 0.0, 12.0, None, mixed=True)]
    clock.start(16)  # a warm-up mixed iteration: in the report, not priced
    s.now += 10.0
    clock.end_mixed()
    assert reports[1].ms["draft"] == pytest.approx(10.0) and clock.poll() == []
    with pytest.raises(RuntimeError, match="mixed"):
        clock.start(16)
        clock.drafted()
        clock.end_mixed()


def test_make_clock_picks_by_what_is_on_and_no_clock_records_nothing():
    s = FakeStream()
    assert isinstance(make_clock(s.event, 0, print, adaptive=False), NoClock)
    assert type(make_clock(s.event, 0, print, adaptive=True)) is RoundClock
    assert isinstance(make_clock(s.event, 5, print, adaptive=False), PhaseClock)
    assert isinstance(make_clock(s.event, 5, print, adaptive=True), PhaseClock)
    clock = NoClock()
    clock.announce(KEY, 4)
    split_round(clock, s, 4, (1.0, 1.0, 1.0, 1.0))
    plain_round(clock, s, 1.0)
    clock.start(4)
    clock.end_mixed()
    clock.interrupt()
    assert not vars(clock) and s.recorded == 0
