"""Adaptive speculation: how many drafts each decode round runs (k = 0 is plain decoding).

PILLAR pays where a draft step is much cheaper than a decode step (large batches, long contexts)
and loses where both cost about the same (few requests, where weights and launches dominate), so
no fixed k is right for a server whose batch drains and refills. Each round picks the k that
maximises the expected emitted tokens per GPU millisecond:

    k = 0:   1 token per request, cost  plain + gap
    k >= 1:  E_k = (1 - a^(k+1)) / (1 - a) tokens per request, cost  draft(k) + verify + gap

where ``a`` is the per-draft acceptance probability (geometric model, estimated from the accept
counts SGLang already copies to the host, ``adaptive/acceptance.py``), and the costs are measured on
this server (``adaptive/costs.py``: CUDA events per round, robust per-phase estimates in cells keyed by
the batch-size bucket and the context-length bucket, blind to warm-up and one-off spikes).
``draft(k)`` is the draft phase measured at k drafts, or, until a round of k ran in the cell, the
nearest measured count's scaled by k (the phase has a small fixed part, so the cell keeps one figure
per k). ``verify`` covers the verify pass, acceptance and selection, whose cost does not depend on k
because the verify graph has one width (k_max + 1; a round with fewer drafts caps their acceptance,
see ``DraftRecord.num_drafts``).

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

Probes. A new cell prices its two modes (plain, speculative) first, speculating at k_max, each for
``PROBE_ROUNDS`` rounds (a cost is priced once its warm-up round is dropped and three rounds are kept).
After that it re-probes the mode it is not using every ``reprobe_every`` rounds, which also keeps
the acceptance estimate fresh while plain decoding runs; a speculative re-probe drafts the fewest
candidate count, since any round with drafts refreshes the verify cost and the acceptance: where
plain decoding wins (few requests), a k = 8 probe costs ~7 plain rounds for ~2.7 tokens, a k = 2
probe ~2.5 for ~2. A new cell starts from the costs of the nearest cell of its batch bucket within
an octave of context (contexts grow through a half-octave every few hundred tokens), so it needs no
first probes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from sglang_sparsespec.rounds.clock import RoundSample

from .acceptance import AcceptanceTracker
from .costs import (
    CELL_COSTS,
    PROBE_ROUNDS,
    SPECULATE,
    CostCell,
    CostTable,
    RobustCost,
    batch_bucket,
    cell_key,
    cell_label,
    context_bucket,
)
from .dense import BatchView, DensePlan, expected_tokens, floor_tokens, plan_dense

# The policy's building blocks, importable from here as from their own modules.
__all__ = [
    "PROBE_ROUNDS",
    "AcceptanceTracker",
    "Choice",
    "CostCell",
    "CostTable",
    "RobustCost",
    "RoundSample",
    "SpeculationPolicy",
    "batch_bucket",
    "cell_key",
    "cell_label",
    "context_bucket",
    "expected_tokens",
]


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
                c.draft.setdefault(s.k, RobustCost()).add(s.draft_ms)
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
                ok = (
                    plain is None
                    or not self.floor_quantile
                    or (cal * floor_tokens(plan, self.floor_quantile) * plain >= plan.ms)
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
        probe = self._probe(key, c)
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
        mode = 0 if k == 0 else SPECULATE
        c.last_probe[mode] = c.rounds
        c.probes[mode] = c.probes.get(mode, 0) + 1
        if k == 0:
            return Choice(0, key, None)
        if plan is not None:
            return Choice(k, key, plan.dense, plan.tokens)
        return Choice(k, key, None, batch_size * expected_tokens(self.acceptance.alpha, k))

    def _probe(self, key: tuple[int, int], c: CostCell) -> int | None:
        # Unpriced modes first (plain, then k_max; each until priced or PROBE_ROUNDS rounds ran, the
        # samples of the last ones may still be in flight), then the stalest every reprobe_every rounds,
        # the speculative mode at the fewest drafts (see the module docstring).
        modes = [m for m in (0, SPECULATE) if m != 0 or 0 in self.candidates]
        unpriced = [
            m
            for m in modes
            if self.round_ms(key, self.k_max if m == SPECULATE else 0) is None and c.probes.get(m, 0) < PROBE_ROUNDS
        ]
        if unpriced:
            return self.k_max if unpriced[0] == SPECULATE else 0
        stalest = min(modes, key=lambda m: c.last_probe.get(m, 0))
        if c.rounds - c.last_probe.get(stalest, 0) >= self.reprobe_every:
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
                    **{n: round(v, 3) for n in CELL_COSTS if (v := getattr(c, n).value) is not None},
                    **{f"draft_{k}": round(e.value, 3) for k, e in sorted(c.draft.items()) if e.value is not None},
                }
                for key, c in sorted(self.table.cells.items())
                if c.rounds
            },
        }
