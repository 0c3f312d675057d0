"""Per-phase GPU timing of PILLAR rounds (SPARSESPEC_STEP_TIMING=N), for step-time breakdowns.

Each round records an event at its start and after every phase: draft (k sparse steps and their
sampling), verify (the full-attention forward), accept (sampling the target rows and rejection
sampling, then SGLang's bookkeeping of the result), select (PillarAttn's next plans). ``gap`` is
the stream time from the end of the previous decode round to the start of this one: SGLang's
scheduler work between rounds plus any time the GPU waited for the host (a prefill in between
voids it: ``interrupt``). Every N rounds the timer waits for the last event (one host
synchronisation per N rounds, so the overlap scheduler is barely disturbed) and reports, per phase,
the mean milliseconds per round and the mean batch size, through a callback (the worker logs it as
one parseable line, see ``format_report``). Events come from a factory, so the bookkeeping is
testable without a GPU.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

PHASES = ("draft", "verify", "accept", "select")
GAP = "gap"
REPORT_PREFIX = "PILLAR step timing:"


class Event(Protocol):
    def record(self) -> None: ...

    def synchronize(self) -> None: ...

    def elapsed_time(self, end: Any) -> float: ...


@dataclass
class PhaseReport:
    """Means over ``rounds`` rounds: ms[phase] per round (PHASES, plus GAP averaged over the rounds
    that followed another decode round; 0 when none did), batch = requests per round."""

    rounds: int
    batch: float
    ms: dict[str, float]


class NoTimer:
    """The phase timer when step timing is off: the worker calls it as it calls ``RoundTimer``, and
    it records nothing, holds no events and costs no branch in the serving path."""

    verify_callback: Callable[[], None] | None = None

    def start(self, batch_size: int) -> None:
        pass

    def interrupt(self) -> None:
        pass

    def mark(self, phase: str) -> None:
        pass


@dataclass
class RoundTimer:
    """CUDA events at each phase boundary of a round; every ``every`` rounds one host sync reads them
    and ``report`` gets the means. ``verify_callback`` marks the verify's end from the sampling hook."""

    every: int
    make_event: Callable[[], Event]
    report: Callable[[PhaseReport], None]
    _rounds: list[tuple[int, list[Event]]] = field(default_factory=list)
    _gaps: list[tuple[Event, Event]] = field(default_factory=list)
    _open: list[Event] | None = None
    _prev_end: Event | None = None
    _bs: int = 0

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError(f"timing interval must be >= 1 round, got {self.every}")
        self.verify_callback: Callable[[], None] | None = functools.partial(self.mark, "verify")

    def start(self, batch_size: int) -> None:
        self._open, self._bs = [self._event()], batch_size
        if self._prev_end is not None:
            self._gaps.append((self._prev_end, self._open[0]))

    def interrupt(self) -> None:
        """Another forward (a prefill) ran since the last round: the next round has no gap."""
        self._prev_end = None

    def mark(self, phase: str) -> None:
        """End of ``phase``; phases must be marked in ``PHASES`` order."""
        if self._open is None or len(self._open) > len(PHASES) or PHASES[len(self._open) - 1] != phase:
            raise RuntimeError(f"phase {phase!r} marked out of order")
        self._open.append(self._event())
        if len(self._open) == len(PHASES) + 1:
            self._rounds.append((self._bs, self._open))
            self._prev_end = self._open[-1]
            self._open = None
            if len(self._rounds) == self.every:
                self._flush()

    def _event(self) -> Event:
        ev = self.make_event()
        ev.record()
        return ev

    def _flush(self) -> None:
        self._rounds[-1][1][-1].synchronize()  # every earlier event precedes it on the stream
        n = len(self._rounds)
        ms = {p: sum(evs[i].elapsed_time(evs[i + 1]) for _, evs in self._rounds) / n for i, p in enumerate(PHASES)}
        ms[GAP] = sum(a.elapsed_time(b) for a, b in self._gaps) / len(self._gaps) if self._gaps else 0.0
        batch = sum(bs for bs, _ in self._rounds) / n
        self._rounds.clear()
        self._gaps.clear()
        self.report(PhaseReport(rounds=n, batch=batch, ms=ms))


_REPORTED = (*PHASES, GAP)


def format_report(r: PhaseReport) -> str:
    phases = " ".join(f"{p}_ms={r.ms[p]:.4f}" for p in _REPORTED)
    return f"{REPORT_PREFIX} rounds={r.rounds} batch={r.batch:.2f} {phases}"


_LINE = re.compile(re.escape(REPORT_PREFIX) + r" rounds=(\d+) batch=([\d.]+) " + " ".join(rf"{p}_ms=([\d.]+)" for p in _REPORTED))


def parse_reports(text: str) -> list[PhaseReport]:
    """Every report line in a server log, in order."""
    out = []
    for m in _LINE.finditer(text):
        values = [float(x) for x in m.groups()[2:]]
        out.append(PhaseReport(rounds=int(m.group(1)), batch=float(m.group(2)), ms=dict(zip(_REPORTED, values))))
    return out
