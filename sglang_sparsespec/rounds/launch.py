"""Decode rounds matched with their accept counts, which SGLang reports a round or two late: one
queue, owned by the worker, whose matched rounds go to every reader of accept counts (the metrics, and
with adaptive speculation the acceptance estimate and the per-request dense choice)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple


class Matched(NamedTuple):
    """A launched round with its accept counts: k, each request's accepted drafts (capped at its own
    draft count), what the launcher attached to it (``AdaptiveRound`` for a round the speculation policy
    chose, None with adaptive speculation off), and ``num_drafts`` [bs] each request's own draft count
    where some drafted fewer than k (None: all k). A request that drafted nothing (per-token sampling
    state, ``patches/request_rounds.py``) took one token from the target: its 0 says nothing about
    acceptance, and the readers of acceptance skip it."""

    k: int
    accepted: list[int]
    payload: Any
    num_drafts: list[int] | None = None


class AdaptiveRound(NamedTuple):
    """What the adaptive readers keep of a launched round until its counts arrive: ``reqs`` [bs] its
    requests (SGLang's Req), ``dense`` [bs] which drafted over their whole prefix (None: nobody),
    ``expected`` the tokens it was chosen for (None: it did not run as priced; AcceptanceTracker)."""

    reqs: list[Any]
    dense: list[bool] | None
    expected: float | None


class RoundShape(NamedTuple):
    """How one decode round runs: ``steps`` drafts per request (0 = plain decoding); ``dense`` [bs]
    1 where a request drafts over its whole prefix (None = nobody). ``num_drafts`` [bs] each request's
    own draft count where some draft fewer than ``steps`` (``patches/request_rounds.num_drafts_for``; None:
    every request drafts ``steps``)."""

    steps: int
    dense: list[bool] | None = None
    num_drafts: list[int] | None = None


class LaunchedRounds:
    """Decode rounds in launch order, matched with the accept counts SGLang copies to the host for
    them (``on_verify_complete_cpu``: in launch order, one or two rounds late under the overlap
    scheduler). Idle rounds (batch size 0) are not queued. A batch-size mismatch means a round went
    by unseen: the queue is dropped and matching starts afresh with the next launch."""

    def __init__(self) -> None:
        self._pending: deque[tuple[int, int, Any, list[int] | None]] = deque()

    def launched(self, k: int, batch_size: int, payload: Any = None, num_drafts: list[int] | None = None) -> None:
        if batch_size > 0:
            self._pending.append((k, batch_size, payload, num_drafts))

    def completed(self, accepted: Sequence[int]) -> Matched | None:
        """The oldest launched round with its counts capped at k; None when nothing is pending, the
        sizes disagree, or the round had no drafts. The cap: a greedy verify may match stale columns
        past the k drafted ones."""
        if not self._pending:
            return None
        k, bs, payload, num_drafts = self._pending.popleft()
        if bs != len(accepted):
            self._pending.clear()
            return None
        if k == 0:
            return None
        # A comparison per count, no builtin calls: this runs once per round over the batch.
        capped = [a if 0 <= a <= k else (k if a > k else 0) for a in accepted]
        if num_drafts is not None:
            capped = [a if a <= d else d for a, d in zip(capped, num_drafts)]
        return Matched(k, capped, payload, num_drafts)
