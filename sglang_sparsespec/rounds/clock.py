"""The one CUDA-event clock of decode rounds: each round's events are recorded once and feed both
readers of round times.

* The cost model (adaptive speculation): the worker ``announce``s the round it priced (cost cell and
  draft count); ``poll`` returns a ``RoundSample`` for every announced round whose last event has
  completed (``query()``, never a wait): draft = start to the end of the draft phase, rest = from there
  to the round's end, gap = the stream time since the previous announced round ended (a prefill in
  between voids it: ``interrupt``). A plain round (k = 0) and a mixed-phase iteration (rounds/mixed.py,
  drafts and verifies share its forwards) have no draft phase: their whole time is ``rest_ms``.
* The phase report (SPARSESPEC_STEP_TIMING=N, ``PhaseClock``): an event after every phase of a split
  or mixed round (PHASES; a mixed iteration ends them all at once), every N rounds one host
  synchronisation on the last event and a ``PhaseReport`` of the means through a callback (format:
  ``rounds/timing.py``). Its gap follows only split and mixed rounds: a plain round, like a prefill,
  interrupts it. Rounds nobody announced (start-up warm-up, idle batches) are timed here and not priced.

Events per round: the cost model alone records three (start, draft, end), unannounced rounds none;
the phase report five (start and each phase end), or two for a mixed iteration; ``NoClock``, with
both off, records nothing and holds nothing. Events come from a factory
(``torch.cuda.Event(enable_timing=True)`` on the GPU), so the bookkeeping is testable on the CPU.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from sglang_sparsespec.rounds.timing import PHASES, PhaseReport, phase_means


class Event(Protocol):
    def record(self) -> None: ...

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end: Any) -> float: ...


@dataclass
class RoundSample:
    """One finished round's measurement (ms); draft_ms is 0 for a plain round and for a mixed-phase
    iteration (``mixed``), whose whole time is rest_ms."""

    key: tuple[int, int]
    k: int
    draft_ms: float
    rest_ms: float
    gap_ms: float | None
    mixed: bool = False


class _Timed(NamedTuple):
    """An announced round waiting for its last event: its cell, draft count, start / draft-end / end
    events, the previous announced round's end (None: no decode gap) and whether it was mixed."""

    key: tuple[int, int]
    k: int
    start: Event
    drafted: Event
    end: Event
    prev: Event | None
    mixed: bool


class NoClock:
    """The clock when neither adaptive speculation nor step timing is on: the worker calls it as it
    calls ``RoundClock``; it records nothing, holds nothing and costs no branch in the serving path."""

    def announce(self, key: tuple[int, int], k: int) -> None:
        pass

    def start(self, batch_size: int) -> None:
        pass

    def start_plain(self) -> None:
        pass

    def drafted(self) -> None:
        pass

    def verified(self) -> None:
        pass

    def accepted(self) -> None:
        pass

    def end(self) -> None:
        pass

    def end_mixed(self) -> None:
        pass

    def interrupt(self) -> None:
        pass


class RoundClock:
    """The clock for the cost model alone (module docstring): events at an announced round's start,
    draft end and end, none after the verify forward nor after the accept."""

    def __init__(self, make_event: Callable[[], Event]):
        self.make_event = make_event
        self._pending: deque[_Timed] = deque()
        self._next: tuple[tuple[int, int], int] | None = None  # announced for the next round
        self._cur: tuple[tuple[int, int], int] | None = None  # the open round's, None: not priced
        self._open: list[Event] | None = None  # the open round's events so far
        self._prev_end: Event | None = None  # the last announced round's end

    def _event(self) -> Event:
        ev = self.make_event()
        ev.record()
        return ev

    def announce(self, key: tuple[int, int], k: int) -> None:
        """The next round to start runs k drafts, priced in cost cell ``key``: it becomes a sample."""
        self._next = (key, k)

    def _begin(self) -> None:
        self._cur, self._next = self._next, None
        self._open = None if self._cur is None else [self._event()]

    def start(self, batch_size: int) -> None:
        """A split or mixed round of ``batch_size`` requests begins."""
        self._begin()

    def start_plain(self) -> None:
        """A plain round (no drafts, no phases) begins."""
        self._begin()

    def drafted(self) -> None:
        if self._open is not None:
            self._open.append(self._event())

    def verified(self) -> None:
        pass

    def accepted(self) -> None:
        pass

    def end(self) -> None:
        if self._open is not None:
            self._open.append(self._event())
            self._sample(self._open, False)

    def end_mixed(self) -> None:
        """The open round ran as a mixed-phase iteration: timed whole, priced apart (CostCell.mixed)."""
        if self._open is not None:
            self._open.append(self._event())
            self._sample(self._open, True)

    def interrupt(self) -> None:
        """Another forward (a prefill) ran: the next round's gap is not a decode gap."""
        self._prev_end = None

    def _sample(self, evs: list[Event], mixed: bool) -> None:
        """Queue the open round's sample, if it was announced. ``evs``: start, the phase ends, end."""
        self._open = None
        if self._cur is None:
            return
        start, end = evs[0], evs[-1]
        drafted = evs[1] if len(evs) > 2 and not mixed else start  # plain and mixed: no draft phase
        self._pending.append(_Timed(self._cur[0], self._cur[1], start, drafted, end, self._prev_end, mixed))
        self._prev_end = end

    def poll(self) -> list[RoundSample]:
        """The announced rounds whose last event has completed, in launch order (never waits)."""
        out = []
        while self._pending and self._pending[0].end.query():
            t = self._pending.popleft()
            gap = t.prev.elapsed_time(t.start) if t.prev is not None else None
            draft_ms, rest_ms = t.start.elapsed_time(t.drafted), t.drafted.elapsed_time(t.end)
            out.append(RoundSample(t.key, t.k, draft_ms, rest_ms, gap, t.mixed))
        return out


class PhaseClock(RoundClock):
    """The clock with step timing on (module docstring): an event after every phase of every split
    or mixed round, announced or not, and every ``every`` rounds one host sync and a ``report``.
    Phases must be marked in PHASES order: draft (``drafted``), verify (``verified``, once the verify
    forward's logits exist), accept (``accepted``), select (``end``)."""

    def __init__(self, make_event: Callable[[], Event], every: int, report: Callable[[PhaseReport], None]):
        if every < 1:
            raise ValueError(f"timing interval must be >= 1 round, got {every}")
        super().__init__(make_event)
        self.every = every
        self.report = report
        self._rounds: list[tuple[int, list[Event]]] = []
        self._gaps: list[tuple[Event, Event]] = []
        self._phase_prev: Event | None = None  # the last split or mixed round's end
        self._bs = 0

    def start(self, batch_size: int) -> None:
        self._cur, self._next = self._next, None
        start = self._event()
        self._open, self._bs = [start], batch_size
        if self._phase_prev is not None:
            self._gaps.append((self._phase_prev, start))

    def start_plain(self) -> None:
        self._phase_prev = None  # the phase report's next gap would span this round
        self._begin()
        self._bs = -1  # marks the open round as plain for ``end``

    def interrupt(self) -> None:
        self._prev_end = self._phase_prev = None

    def _mark(self, n: int) -> None:
        """End of phase PHASES[n - 1]: the open round must hold exactly its start and n - 1 phase ends."""
        if self._open is None or self._bs < 0 or len(self._open) != n:
            raise RuntimeError(f"phase {PHASES[n - 1]!r} marked out of order")
        self._open.append(self._event())

    def drafted(self) -> None:
        self._mark(1)

    def verified(self) -> None:
        self._mark(2)

    def accepted(self) -> None:
        self._mark(3)

    def end(self) -> None:
        if self._bs < 0:  # a plain round: a cost sample if announced, no phases
            super().end()
            return
        self._mark(len(PHASES))
        self._phased(self._open, False)

    def end_mixed(self) -> None:
        if self._open is None or self._bs < 0 or len(self._open) != 1:
            raise RuntimeError("a mixed iteration ends a round that has marked no phase")
        end = self._event()
        self._phased([self._open[0], *[end] * len(PHASES)], True)

    def _phased(self, evs: list[Event], mixed: bool) -> None:
        self._rounds.append((self._bs, evs))
        self._phase_prev = evs[-1]
        self._sample(evs, mixed)
        if len(self._rounds) == self.every:
            self._flush()

    def _flush(self) -> None:
        self._rounds[-1][1][-1].synchronize()  # every earlier event precedes it on the stream
        report = phase_means(self._rounds, self._gaps)
        self._rounds.clear()
        self._gaps.clear()
        self.report(report)


def make_clock(
    make_event: Callable[[], Event], every: int, report: Callable[[PhaseReport], None], adaptive: bool
) -> NoClock | RoundClock:
    """The worker's clock: ``PhaseClock`` with step timing on (``every`` >= 1 rounds), else
    ``RoundClock`` for adaptive speculation, else ``NoClock``."""
    if every:
        return PhaseClock(make_event, every, report)
    return RoundClock(make_event) if adaptive else NoClock()
