"""Adaptive speculation: how many drafts each decode round runs (k = 0 is plain decoding).

PILLAR pays where a draft step is much cheaper than a decode step (large batches, long contexts)
and loses where both cost about the same (few requests, where weights and launches dominate), so
no fixed k is right for a server whose batch drains and refills. Each round picks the k that
maximises the expected emitted tokens per GPU millisecond:

    k = 0:   1 token per request, cost  plain + gap
    k >= 1:  E_k = (1 - a^(k+1)) / (1 - a) tokens per request, cost  draft(k) + verify + gap

where ``a`` is the per-draft acceptance probability (geometric model, estimated from the accept
counts SGLang already copies to the host, ``AcceptanceTracker``), and the costs are measured on
this server: every round records CUDA events, and ``RoundClock`` reads them once they have
completed (``query()``, never a wait), feeding ``CostTable`` cells keyed by the batch-size bucket
and the context-length bucket. ``draft(k)`` is the draft phase measured at k drafts, or, until a
round of k ran in the cell, the nearest measured count's scaled by k (the phase has a small fixed
part, so the cell keeps one figure per k). ``verify`` covers the verify pass, acceptance and
selection, whose cost does not depend on k because the verify graph has one width (k_max + 1; a
round with fewer drafts caps their acceptance, see ``DraftRecord.num_drafts``).

Calibration. The expected tokens are estimates, and the rounds that run are the ones whose
estimates looked best; so the tracker keeps, per draft count, the ratio of the tokens the rounds
emitted to the tokens they were chosen for, and the policy scales every speculative expectation by
it. Measured 0.97-1.02 at 8-64 requests x 2K (calib-5e3bb34-h200-2048): a guard, not a correction
that run needed.

The premium. A speculative count must promise ``premium`` (15%) more throughput than plain
decoding. In the same run, 32 / 64 requests x 2K went at 0.98 / 0.97x stock with every round plain
and at 0.93 / 0.89x when the rounds with a predicted gain of a few percent speculated: their tokens
matched the estimates, so the loss is in costs the cells do not see (not measured apart yet; the
wave ends thinner, 31.4 requests in flight on average against 31.9).

The floor. Priced per request (``dense.BatchView``), a speculative count must also leave the
batch's request at ``floor_quantile`` of expected tokens (10% by default) at least its plain speed:
E_k(a_q) / (draft(k) + verify + gap) >= 1 / (plain + gap). Throughput alone weighs a good drafter's
gain against a poor one's loss, but with a fixed number of requests the poor ones end the run.

Probes. A cell prices its two modes (plain, speculative) once, speculating at k_max the first time.
After that it re-probes the mode it is not using every ``reprobe_every`` rounds, which also keeps
the acceptance estimate fresh while plain decoding runs; a speculative re-probe drafts the fewest
candidate count, since any round with drafts refreshes the verify cost and the acceptance: where
plain decoding wins (few requests), a k = 8 probe costs ~7 plain rounds for ~2.7 tokens, a k = 2
probe ~2.5 for ~2. A new cell starts from the costs of the nearest cell of its batch bucket within
an octave of context (contexts grow through a half-octave every few hundred tokens), so it needs no
first probes.

Nothing here touches SGLang or the GPU directly: events come from a factory (testable on CPU).
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from .dense import BatchView, DensePlan, expected_tokens, floor_tokens, plan_dense
from .rounds import LaunchedRounds


class Event(Protocol):
    def record(self) -> None: ...

    def query(self) -> bool: ...

    def elapsed_time(self, end: Any) -> float: ...


class AcceptanceTracker:
    """Per-draft acceptance probability ``alpha``, an EMA over recent speculative rounds, and the
    calibration of the policy's expected tokens per draft count (``calibrated``).

    One round with k drafts and per-request accepted counts a_i contributes the truncated-geometric
    estimate sum(a_i) / (sum(a_i) + #{a_i < k}) over the requests that drafted with their sparse plan
    (dense drafts, ``spec/dense.py``, are accepted ~always and say nothing about the plans). Rounds
    are matched with their counts by ``LaunchedRounds`` (``launched``, then ``completed`` with
    SGLang's host copy of the counts).
    """

    # Calibration: per draft count, an EMA of emitted / expected tokens over the rounds that ran, so
    # the policy prices with what its estimates have delivered. Slower than ``decay``: one round at a
    # small batch is noisy. Clamped so that a run of bad luck cannot switch speculation off for good
    # (the re-probes keep measuring) nor promise more than the estimates do by much.
    CAL_DECAY = 0.95
    CAL_RANGE = (0.5, 1.2)

    def __init__(self, decay: float = 0.8, prior: float = 0.7):
        if not 0.0 <= decay < 1.0 or not 0.0 < prior < 1.0:
            raise ValueError("decay must be in [0, 1) and prior in (0, 1)")
        self.decay = decay
        self.alpha = prior
        self.calibration: dict[int, float] = {}
        self._rounds = LaunchedRounds()

    def launched(
        self, k: int, batch_size: int, dense: Sequence[bool] | None = None, expected: float | None = None
    ) -> None:
        """``expected``: the tokens the round was chosen for (the batch's sum, bonus tokens included,
        uncalibrated), or None where it was not priced so (forced or changed counts)."""
        self._rounds.launched(k, batch_size, (dense, expected))

    def calibrated(self, k: int) -> float:
        """Emitted / expected tokens of the rounds of k drafts so far (1 before the first)."""
        return self.calibration.get(k, 1.0)

    def completed(self, accepted: Sequence[int]) -> None:
        matched = self._rounds.completed(accepted)
        if matched is None:
            return
        k, capped, (dense, expected) = matched
        if expected:
            ratio = (sum(capped) + len(capped)) / expected
            cal = self.CAL_DECAY * self.calibrated(k) + (1.0 - self.CAL_DECAY) * ratio
            self.calibration[k] = min(max(cal, self.CAL_RANGE[0]), self.CAL_RANGE[1])
        if dense is not None:
            capped = [a for a, d in zip(capped, dense) if not d]
        hits = sum(capped)
        misses = sum(1 for a in capped if a < k)
        if hits + misses == 0:
            return
        self.alpha = self.decay * self.alpha + (1.0 - self.decay) * hits / (hits + misses)
        self.alpha = min(max(self.alpha, 1e-3), 0.999)


class _Ema:
    """Exponential moving average; ``None`` until the first sample."""

    __slots__ = ("decay", "value")

    def __init__(self, decay: float):
        self.decay = decay
        self.value: float | None = None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.decay * self.value + (1.0 - self.decay) * x


@dataclass
class CostCell:
    """Measured milliseconds of one (batch bucket, context bucket): plain = a k = 0 round;
    draft[k] = the draft phase of a round of k drafts; verify = the rest of a k >= 1 round; mixed = a
    whole mixed-phase iteration (spec/mixed.py: drafts and verifies share its forwards, so it has no
    phases to split); gap = stream idle time before a round that followed another decode round. Bookkeeping: rounds chosen
    here, the round each mode (0, or SPECULATE for every k >= 1) last ran, and the last non-probe
    choice (for the hysteresis) and the round it was priced at."""

    plain: _Ema
    verify: _Ema
    gap: _Ema
    mixed: _Ema
    draft: dict[int, _Ema] = field(default_factory=dict)
    rounds: int = 0
    last_probe: dict[int, int] = field(default_factory=dict)
    last_choice: int | None = None
    last_priced: int = 0  # the round whose choice last priced every count

    @classmethod
    def empty(cls, decay: float) -> CostCell:
        return cls(_Ema(decay), _Ema(decay), _Ema(decay), _Ema(decay))

    def seeded(self) -> CostCell:
        """A new cell holding this one's costs and last choice, its measured modes counted as probed
        at its round 0 (so they are re-probed on the usual schedule, not at once)."""
        cell = copy.deepcopy(self)
        cell.rounds = cell.last_priced = 0
        cell.last_probe = dict.fromkeys(self.last_probe, 0)
        return cell

    def draft_ms(self, k: int) -> float | None:
        """The draft phase of k drafts: measured at k, else the nearest measured count's scaled by k."""
        measured = {j: e.value for j, e in self.draft.items() if e.value is not None}
        if k in measured:
            return measured[k]
        if not measured:
            return None
        near = min(measured, key=lambda j: (abs(j - k), -j))
        return measured[near] * k / near


_CELL_EMAS = ("plain", "verify", "gap", "mixed")
SPECULATE = -1  # CostCell.last_probe's key for the speculative mode (every k >= 1)


def batch_bucket(batch_size: int) -> int:
    """Next power of two (CUDA-graph buckets are close to it)."""
    return 1 << max(0, math.ceil(math.log2(max(batch_size, 1))))


def context_bucket(mean_len: float) -> int:
    """Half-octave of the mean context length (step cost grows about linearly with it)."""
    return round(2.0 * math.log2(max(mean_len, 1.0)))


def cell_key(batch_size: int, mean_len: float) -> tuple[int, int]:
    """The cost cell of a batch: (batch bucket, context bucket)."""
    return batch_bucket(batch_size), context_bucket(mean_len)


def cell_label(key: tuple[int, int]) -> str:
    """A cell as /server_info and the reports name it: "<batch bucket>x<context ~tokens>"."""
    bs, ctx = key
    return f"{bs}x{round(2 ** (ctx / 2))}"


def _ms(value: Any) -> float:
    ms = float(value)
    if not 0.0 <= ms < 1e6:  # NaN fails both
        raise ValueError(f"{value!r} is not a round time in ms")
    return ms


SEED_SPAN = 2  # a new cell borrows costs from a cell at most this many half-octaves of context away


class CostTable:
    """CostCells by (batch bucket, context bucket); a new cell is seeded from the nearest cell of its
    batch bucket within SEED_SPAN context buckets (the shorter context on a tie), or starts empty:
    step costs grow with the context, so a far neighbour would mislead more than a probe costs.

    ``export`` / ``restore``: the measured costs as JSON-ready data, ``{"<bs bucket>,<ctx bucket>":
    {"plain": ms, "verify": ms, "gap": ms, "mixed": ms, "draft": {"<k>": ms}}}`` (unmeasured entries left out), so a
    restarted server starts from them (``spec/cost_cache.py``)."""

    def __init__(self, decay: float = 0.7):
        self.decay = decay
        self.cells: dict[tuple[int, int], CostCell] = {}

    def export(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for (bs, ctx), c in sorted(self.cells.items()):
            entry: dict[str, Any] = {n: e.value for n in _CELL_EMAS if (e := getattr(c, n)).value is not None}
            draft = {str(k): e.value for k, e in sorted(c.draft.items()) if e.value is not None}
            if draft:
                entry["draft"] = draft
            if "plain" in entry or "mixed" in entry or ("verify" in entry and draft):
                out[f"{bs},{ctx}"] = entry
        return out

    def restore(self, cells: dict[str, Any]) -> int:
        """Take an export's cells as starting costs; each priced mode counts as probed at round 0, so it is
        re-probed on the usual schedule. Cells measured here already are kept. Returns the cells taken;
        ValueError on a malformed entry (nothing is taken then)."""
        taken: dict[tuple[int, int], CostCell] = {}
        try:
            for label, entry in cells.items():
                bs, ctx = (int(x) for x in label.split(","))
                c = CostCell.empty(self.decay)
                for name in _CELL_EMAS:
                    if name in entry:
                        getattr(c, name).add(_ms(entry[name]))
                for k, ms in entry.get("draft", {}).items():
                    c.draft.setdefault(int(k), _Ema(self.decay)).add(_ms(ms))
                if c.plain.value is not None:
                    c.last_probe[0] = 0
                if (c.verify.value is not None and c.draft) or c.mixed.value is not None:
                    c.last_probe[SPECULATE] = 0
                if bs < 1 or not c.last_probe:
                    raise ValueError(f"cell {label!r} prices no mode")
                taken[(bs, ctx)] = c
        except (AttributeError, TypeError, ValueError) as e:
            raise ValueError(f"malformed cost cells: {e}") from None
        for key, c in taken.items():
            self.cells.setdefault(key, c)
        return len(taken)

    def cell(self, key: tuple[int, int]) -> CostCell:
        c = self.cells.get(key)
        if c is None:
            bs, ctx = key
            near = [k for k, cell in self.cells.items() if k[0] == bs and abs(k[1] - ctx) <= SEED_SPAN and cell.last_probe]
            if near:
                c = self.cells[min(near, key=lambda k: (abs(k[1] - ctx), k[1]))].seeded()
            else:
                c = CostCell.empty(self.decay)
            self.cells[key] = c
        return c


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


class RoundClock:
    """CUDA events around each round, read back without waiting: ``poll`` returns the rounds whose
    last event has completed. Events come from ``make_event`` (``torch.cuda.Event(enable_timing=True)``
    on the GPU)."""

    def __init__(self, make_event: Callable[[], Event]):
        self.make_event = make_event
        self._pending: deque[tuple[tuple[int, int], int, list[Event], Event | None, bool]] = deque()
        self._open: tuple[tuple[int, int], int, list[Event], Event | None] | None = None
        self._mixed = False  # the open round is a mixed-phase iteration
        self._prev_end: Event | None = None

    def _event(self) -> Event:
        ev = self.make_event()
        ev.record()
        return ev

    def start(self, key: tuple[int, int], k: int) -> None:
        self._open = (key, k, [self._event()], self._prev_end)
        self._mixed = False

    def mark_mixed(self) -> None:
        """The open round runs as a mixed-phase iteration: timed whole, priced apart (CostCell.mixed)."""
        self._mixed = True

    def drafted(self) -> None:
        if self._open is not None:
            self._open[2].append(self._event())

    def end(self) -> None:
        if self._open is None:
            return
        key, k, evs, prev = self._open
        if len(evs) == 1:  # a plain round and a mixed iteration have no draft phase
            evs.append(evs[0])
        evs.append(self._event())
        self._pending.append((key, k, evs, prev, self._mixed))
        self._prev_end = evs[-1]
        self._open = None

    def interrupt(self) -> None:
        """Another forward (a prefill) ran: the next round's gap is not a decode gap."""
        self._prev_end = None

    def poll(self) -> list[RoundSample]:
        out = []
        while self._pending and self._pending[0][2][-1].query():
            key, k, (s, d, e), prev, mixed = self._pending.popleft()
            gap = prev.elapsed_time(s) if prev is not None else None
            out.append(RoundSample(key, k, s.elapsed_time(d), d.elapsed_time(e), gap, mixed))
        return out


class _Priced(NamedTuple):
    """One candidate count as ``SpeculationPolicy`` prices it: calibrated expected tokens per request
    per ms, the dense plan it assumes (None: unplanned), and whether the floor allows it."""

    rate: float
    plan: DensePlan | None
    allowed: bool


class Choice(NamedTuple):
    """One round's decision: ``steps`` drafts (0 = plain decoding), the cost cell ``key`` its time is
    measured into, ``dense`` ([bs] per request, or None: all sparse / not planned), and ``expected``:
    the batch's expected tokens it was chosen for, uncalibrated (None for plain rounds and unpriced
    ones), for ``AcceptanceTracker.launched``."""

    steps: int
    key: tuple[int, int]
    dense: list[bool] | None
    expected: float | None = None


class SpeculationPolicy:
    """Chooses k per round from ``candidates`` (0 = plain decoding; the largest is the verify width
    - 1) by expected tokens per millisecond; see the module docstring.

    ``margin``: a different k must promise this much more throughput than the cell's last choice
    (hysteresis against noise). ``premium`` and ``floor_quantile`` (0 = off): the module docstring;
    the floor's request is the plan's at that quantile of expected tokens (``floor_tokens``). At 64
    x 2K the throughput choice alone gave per-request TPOT 1.68-2.75 ms against stock's 2.11-2.22 and
    a 6% longer run although its mean request finished 3% sooner (plainkernel-f6f40a8-h200-2048): the
    batch-wide k speeds the good drafters, slows the poor ones, and the slowest set the wall.
    ``settle``: once a cell's priced choice is plain decoding, the next ``settle - 1`` rounds there
    take it again without pricing: plain rounds are the shortest (1-3 ms where they win), so the
    per-request pricing (~0.2 ms at 32 requests, ``policy_host``) is a share of them the GPU waits
    for, while the costs and acceptances it reads move over tens of rounds.
    """

    def __init__(
        self,
        candidates: Iterable[int],
        reprobe_every: int = 64,
        margin: float = 0.03,
        acceptance: AcceptanceTracker | None = None,
        settle: int = 8,
        floor_quantile: float = 0.1,
        premium: float = 0.15,
        mixed_steps: int | None = None,
    ):
        self.candidates = tuple(sorted(set(candidates)))
        if not self.candidates or self.candidates[0] < 0 or self.candidates[-1] < 1:
            raise ValueError(f"candidates need a k >= 1 and no negative k, got {self.candidates}")
        if settle < 1:
            raise ValueError(f"settle must be >= 1, got {settle}")
        if not 0.0 <= floor_quantile < 1.0:
            raise ValueError(f"floor_quantile must be in [0, 1), got {floor_quantile}")
        if premium < 0.0:
            raise ValueError(f"premium must be >= 0, got {premium}")
        self.reprobe_every = reprobe_every
        # The draft count whose rounds run as mixed-phase iterations (priced by CostCell.mixed once measured).
        self.mixed_steps = mixed_steps
        self.margin = margin
        self.settle = settle
        self.floor_quantile = floor_quantile
        self.premium = premium
        self.floored = 0  # priced rounds where the floor or the premium turned the throughput choice down
        self.table = CostTable()
        self.acceptance = acceptance or AcceptanceTracker()

    @property
    def k_max(self) -> int:
        return self.candidates[-1]

    @property
    def k_min(self) -> int:
        """The fewest drafts a round may run (the speculative re-probe's count)."""
        return next(k for k in self.candidates if k >= 1)

    def observe(self, samples: list[RoundSample]) -> None:
        for s in samples:
            c = self.table.cell(s.key)
            if s.k == 0:
                c.plain.add(s.rest_ms)
            elif s.mixed:
                c.mixed.add(s.draft_ms + s.rest_ms)
            else:
                c.draft.setdefault(s.k, _Ema(self.table.decay)).add(s.draft_ms)
                c.verify.add(s.rest_ms)
            if s.gap_ms is not None:
                c.gap.add(s.gap_ms)

    def round_ms(self, key: tuple[int, int], k: int) -> float | None:
        """The cell's measured cost of a round of k drafts (k = 0: plain), gap included; None if unpriced."""
        c = self.table.cell(key)
        gap = c.gap.value or 0.0
        if k == 0:
            return None if c.plain.value is None else c.plain.value + gap
        if k == self.mixed_steps and c.mixed.value is not None:
            return c.mixed.value + gap
        draft = c.draft_ms(k)
        if draft is None or c.verify.value is None:
            return None
        return draft + c.verify.value + gap

    def rates(self, key: tuple[int, int], view: BatchView | None = None) -> dict[int, float]:
        """Expected tokens per request per ms for every candidate the cell can price. With a
        ``view``, each request's own acceptance and the best dense set count (``dense.plan_dense``);
        without, the batch's acceptance."""
        return {k: p.rate for k, p in self._priced(key, view).items()}

    def _priced(self, key: tuple[int, int], view: BatchView | None) -> dict[int, _Priced]:
        out: dict[int, _Priced] = {}
        plain = self.round_ms(key, 0) if 0 in self.candidates else None
        for k in self.candidates:
            ms = plain if k == 0 else self.round_ms(key, k)
            if ms is None:
                continue
            if k == 0:
                out[k] = _Priced(1.0 / ms, None, True)
                continue
            cal = self.acceptance.calibrated(k)
            if view is not None and len(view.alpha):
                plan = plan_dense(view, k, ms)
                # The floor's request keeps its plain speed: floor tokens per plan.ms >= 1 per plain ms.
                ok = plain is None or not self.floor_quantile or (
                    cal * floor_tokens(plan, self.floor_quantile) * plain >= plan.ms
                )
                out[k] = _Priced(cal * plan.tokens / len(view.alpha) / plan.ms, plan, ok)
            else:
                out[k] = _Priced(cal * expected_tokens(self.acceptance.alpha, k) / ms, None, True)
        return out

    def choose(self, batch_size: int, mean_len: float, view: Callable[[], BatchView] | None = None) -> Choice:
        """This round's draft count, the cost cell it will be measured into, and (with a ``view``
        and a priced cell) which requests draft densely: the plan the count was chosen by. ``view``
        builds the batch's per-request view; it is called only when a choice prices requests."""
        key = cell_key(batch_size, mean_len)
        c = self.table.cell(key)
        c.rounds += 1
        probe = self._probe(c)
        if probe is None and c.last_choice == 0 and c.rounds - c.last_priced < self.settle:
            k, plan = 0, None
        elif probe is None:
            k, plan = self._best(key, c, view() if view is not None else None)
            c.last_priced = c.rounds
        else:
            ms = self.round_ms(key, probe) if probe and view is not None else None
            batch = view() if ms is not None else None
            k, plan = probe, (plan_dense(batch, probe, ms) if batch is not None and len(batch.alpha) else None)
        # Any round with drafts measures the verify and the acceptance, so it refreshes every k >= 1.
        c.last_probe[0 if k == 0 else SPECULATE] = c.rounds
        if k == 0:
            return Choice(0, key, None)
        if plan is not None:
            return Choice(k, key, plan.dense, plan.tokens)
        return Choice(k, key, None, batch_size * expected_tokens(self.acceptance.alpha, k))

    def _probe(self, c: CostCell) -> int | None:
        # Unpriced modes first (plain, then k_max), then the stalest every reprobe_every rounds, the
        # speculative mode at the fewest drafts (see the module docstring).
        modes = [m for m in (0, SPECULATE) if m != 0 or 0 in self.candidates]
        unpriced = [m for m in modes if m not in c.last_probe]
        if unpriced:
            return self.k_max if unpriced[0] == SPECULATE else 0
        stalest = min(modes, key=lambda m: c.last_probe[m])
        if c.rounds - c.last_probe[stalest] >= self.reprobe_every:
            return self.k_min if stalest == SPECULATE else 0
        return None

    def _best(self, key: tuple[int, int], c: CostCell, view: BatchView | None) -> tuple[int, DensePlan | None]:
        priced = self._priced(key, view)
        if not priced:
            return self.k_max, None
        plain = priced[0].rate * (1.0 + self.premium) if 0 in priced else 0.0
        allowed = {k: p for k, p in priced.items() if p.allowed and (k == 0 or p.rate >= plain)}
        best = max(allowed, key=lambda k: allowed[k].rate)
        if allowed[best].rate < max(p.rate for p in priced.values()):
            self.floored += 1
        prev = c.last_choice
        if prev in allowed and allowed[best].rate <= allowed[prev].rate * (1.0 + self.margin):
            best = prev
        c.last_choice = best
        return best, allowed[best].plan

    def summary(self) -> dict[str, Any]:
        """The acceptance estimate and the measured cost of every cell that ran, as
        ``"<batch bucket>x<context ~tokens>"`` -> ms (for the log line and /server_info; the path
        counts are ``PillarMetrics.rounds_by_steps``)."""
        return {
            "alpha": round(self.acceptance.alpha, 4),
            "floored_rounds": self.floored,
            "calibration": {str(k): round(v, 3) for k, v in sorted(self.acceptance.calibration.items())},
            "cells": {
                cell_label(key): {
                    "rounds": c.rounds,
                    **{n: round(e.value, 3) for n, e in vars(c).items() if isinstance(e, _Ema) and e.value is not None},
                    **{f"draft_{k}": round(e.value, 3) for k, e in sorted(c.draft.items()) if e.value is not None},
                }
                for key, c in sorted(self.table.cells.items())
                if c.rounds
            },
        }
