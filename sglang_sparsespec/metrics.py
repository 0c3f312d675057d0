"""PILLAR's round counters and timings, for Prometheus and ``/server_info``.

The worker reports, on the host only (no GPU synchronisation):

* ``launched(k, batch_size)`` when a decode round starts with k drafts (0 = plain decoding);
* ``completed(matched)`` with the oldest launched round and its accepted draft counts, once SGLang
  has copied them to the host (``on_verify_complete_cpu``; the round planner's launch queue,
  ``rounds/launch.py``, matches them: rounds complete in launch order, one or two rounds late under
  the overlap scheduler), or None where it matched no round with drafts;
* ``rounds_timed(samples)`` with the finished rounds' CUDA-event times (``rounds/clock.py``, adaptive
  speculation): draft = the k sparse steps, verify = verify pass + acceptance + selection;
* ``phases_timed(report)`` with SPARSESPEC_STEP_TIMING's per-phase means (draft, verify, accept,
  select), when that is on.

Counted as vLLM counts speculative decoding: a *draft* is one request's drafts in one round (plain
rounds have none), *draft tokens* the drafted tokens, *accepted tokens* the accepted drafted tokens
(the bonus token not included; a request that drafted nothing in a round is not a draft), and accepted per position j the drafts whose first j+1 tokens were
all accepted. ``sink`` (optional) receives the same increments; ``patches/metrics.py`` supplies a
Prometheus one.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from sglang_sparsespec.rounds.clock import RoundSample
from sglang_sparsespec.rounds.launch import Matched
from sglang_sparsespec.rounds.timing import PhaseReport


class MetricsSink(Protocol):
    def round_started(self, steps: int) -> None: ...

    def drafts_verified(
        self, drafts: int, draft_tokens: int, accepted: int, accepted_per_pos: Sequence[int]
    ) -> None: ...

    def round_timed(self, draft_s: float, verify_s: float) -> None: ...

    def phases_timed(self, phase_s: dict[str, float]) -> None: ...


@dataclass
class PillarMetrics:
    """Lifetime totals since the server started. ``accepted_per_pos`` has ``max_steps`` entries
    and never increases with the position; ``accepted_tokens`` is its sum."""

    max_steps: int
    sink: MetricsSink | None = None
    rounds_by_steps: Counter[int] = field(default_factory=Counter)
    # Plain rounds (rounds_by_steps[0]) that took the decode path (SPARSESPEC_PLAIN_PATH=decode).
    plain_decode_rounds: int = 0
    # Full-length rounds (rounds_by_steps[max_steps]) run as mixed-phase iterations (rounds/mixed.py).
    mixed_rounds: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    timed_rounds: int = 0
    draft_ms_total: float = 0.0
    verify_ms_total: float = 0.0
    last_phase_ms: dict[str, float] = field(default_factory=dict)
    # The draft count of the round ``completed`` last matched (None: it matched none or had no drafts), which SGLang's
    # result processing credits to each request it served (patches/client_parity.py).
    last_completed_steps: int | None = None
    last_completed_num_drafts: list[int] | None = None  # that round's per-request draft counts (None: all k)

    def __post_init__(self) -> None:
        if self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        self.accepted_per_pos = [0] * self.max_steps

    def launched(self, steps: int, batch_size: int) -> None:
        if not 0 <= steps <= self.max_steps:
            raise ValueError(f"a round runs 0..{self.max_steps} drafts, got {steps}")
        if batch_size == 0:
            return  # an idle batch: SGLang reports no accept counts for it
        self.rounds_by_steps[steps] += 1
        if self.sink is not None:
            self.sink.round_started(steps)

    def completed(self, matched: Matched | None) -> None:
        self.last_completed_steps = None if matched is None else matched.k
        self.last_completed_num_drafts = None if matched is None else matched.num_drafts
        if matched is None:
            return
        steps, accepted = matched.k, matched.accepted
        if matched.num_drafts is not None:  # requests that drafted nothing verified no draft
            accepted = [a for a, d in zip(accepted, matched.num_drafts) if d]
        # per_pos[j] = requests that accepted more than j drafts: a histogram of the counts (capped at
        # steps), summed from the top; one pass over the batch instead of one per position.
        hist = [0] * (steps + 1)
        for a in accepted:
            hist[a] += 1
        per_pos, more = [0] * steps, 0
        for j in range(steps - 1, -1, -1):
            more += hist[j + 1]
            per_pos[j] = more
        total = sum(accepted)
        draft_tokens = steps * len(accepted) if matched.num_drafts is None else sum(matched.num_drafts)
        self.drafts += len(accepted)
        self.draft_tokens += draft_tokens
        self.accepted_tokens += total
        for j, n in enumerate(per_pos):
            self.accepted_per_pos[j] += n
        if self.sink is not None:
            self.sink.drafts_verified(len(accepted), draft_tokens, total, per_pos)

    def rounds_timed(self, samples: Iterable[RoundSample]) -> None:
        for s in samples:
            self.timed_rounds += 1
            self.draft_ms_total += s.draft_ms
            self.verify_ms_total += s.rest_ms
            if self.sink is not None:
                self.sink.round_timed(s.draft_ms / 1e3, s.rest_ms / 1e3)

    def phases_timed(self, report: PhaseReport) -> None:
        self.last_phase_ms = dict(report.ms)
        if self.sink is not None:
            self.sink.phases_timed({p: ms / 1e3 for p, ms in report.ms.items()})

    def summary(self) -> dict[str, Any]:
        rate = self.accepted_tokens / self.draft_tokens if self.draft_tokens else None
        timed = self.timed_rounds
        return {
            "rounds_by_steps": {str(k): n for k, n in sorted(self.rounds_by_steps.items())},
            "plain_decode_rounds": self.plain_decode_rounds,
            "mixed_rounds": self.mixed_rounds,
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_per_position": list(self.accepted_per_pos),
            "acceptance_rate": rate,
            "mean_draft_ms": self.draft_ms_total / timed if timed else None,
            "mean_verify_ms": self.verify_ms_total / timed if timed else None,
            "last_phase_ms": dict(self.last_phase_ms),
        }
