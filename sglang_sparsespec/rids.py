"""Request ids at the scheduler: which requests an abort reaches, and which ids are still live.

SGLang's scheduler aborts every request whose id *starts with* the aborted one: with random hex ids,
an abort of a one-character id reaches a sixteenth of everyone's requests. ``abort_matches`` is the
rule the plugin applies instead: the id itself, or its own children (``<id>_...``: the requests
SGLang makes of one request with ``n`` > 1, or of one batch under a single id).

With several tokenizer workers (``--tokenizer-worker-num``) each checks duplicate ids only among its
own requests, so two live requests can share an id at the scheduler. ``RidBook`` keeps the ids a
scheduler accepted, so that a new request needs the scheduler's full list of live requests only when
its id was seen before (a retry, or a duplicate), not on every arrival.

Nothing here touches SGLang.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable


def abort_matches(rid: str, target: str) -> bool:
    """Whether an abort of ``target`` reaches the request ``rid``: the same id, or one of its children."""
    return rid == target or (bool(target) and rid.startswith(target + "_"))


class RidBook:
    """Ids accepted by one scheduler: a superset of its live ids, pruned to them when it grows."""

    MIN_PRUNE = 4096  # ids kept before the first pruning

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.prune_at = self.MIN_PRUNE

    def maybe_live(self, rid: str) -> bool:
        """False: ``rid`` is surely not live. True: it was accepted before; ask the scheduler."""
        return rid in self.seen

    def accept(self, rid: str, live_ids: Callable[[], Iterable[str]]) -> None:
        """Record an accepted ``rid``; past ``prune_at`` ids, keep only the live ones (amortised O(1))."""
        self.seen.add(rid)
        if len(self.seen) > self.prune_at:
            self.seen = {*live_ids(), rid}
            self.prune_at = max(self.MIN_PRUNE, 2 * len(self.seen))
