"""Per-phase GPU timing of PILLAR rounds (SPARSESPEC_STEP_TIMING=N), for step-time breakdowns: the
phases, the report and its log line.

The round clock (``rounds/clock.py``, ``PhaseClock``) records an event at each round's start and after
every phase: draft (k sparse steps and their sampling), verify (the full-attention forward), accept
(sampling the target rows and rejection sampling, then SGLang's bookkeeping of the result), select
(PillarAttn's next plans). ``gap`` is the stream time from the end of the previous decode round to the
start of this one: SGLang's scheduler work between rounds plus any time the GPU waited for the host (a
prefill or a plain round in between voids it). Every N rounds the clock waits for the last event (one
host synchronisation per N rounds, so the overlap scheduler is barely disturbed) and reports, per
phase, the mean milliseconds per round and the mean batch size (``phase_means``), through a callback
(the worker logs it as one parseable line, ``format_report``; benchmarks read it back with
``parse_reports``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

PHASES = ("draft", "verify", "accept", "select")
GAP = "gap"
REPORT_PREFIX = "PILLAR step timing:"


@dataclass
class PhaseReport:
    """Means over ``rounds`` rounds: ms[phase] per round (PHASES, plus GAP averaged over the rounds
    that followed another decode round; 0 when none did), batch = requests per round."""

    rounds: int
    batch: float
    ms: dict[str, float]


def phase_means(rounds: Sequence[tuple[int, Sequence[Any]]], gaps: Sequence[tuple[Any, Any]]) -> PhaseReport:
    """The report of ``rounds`` (batch size, [start, one event per phase end]) and ``gaps`` (previous
    round's end, this round's start); every event must have completed."""
    n = len(rounds)
    ms = {p: sum(evs[i].elapsed_time(evs[i + 1]) for _, evs in rounds) / n for i, p in enumerate(PHASES)}
    ms[GAP] = sum(a.elapsed_time(b) for a, b in gaps) / len(gaps) if gaps else 0.0
    return PhaseReport(rounds=n, batch=sum(bs for bs, _ in rounds) / n, ms=ms)


_REPORTED = (*PHASES, GAP)


def format_report(r: PhaseReport) -> str:
    phases = " ".join(f"{p}_ms={r.ms[p]:.4f}" for p in _REPORTED)
    return f"{REPORT_PREFIX} rounds={r.rounds} batch={r.batch:.2f} {phases}"


_LINE = re.compile(
    re.escape(REPORT_PREFIX) + r" rounds=(\d+) batch=([\d.]+) " + " ".join(rf"{p}_ms=([\d.]+)" for p in _REPORTED)
)


def parse_reports(text: str) -> list[PhaseReport]:
    """Every report line in a server log, in order."""
    out = []
    for m in _LINE.finditer(text):
        values = [float(x) for x in m.groups()[2:]]
        out.append(PhaseReport(rounds=int(m.group(1)), batch=float(m.group(2)), ms=dict(zip(_REPORTED, values))))
    return out
