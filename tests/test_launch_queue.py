"""The worker's one launch queue (rounds/launch.py): each decode round is matched once with SGLang's
late accept counts and handed to every reader (metrics always; acceptance and dense choice with
adaptive speculation), each reading its own part of the one entry."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from sglang_sparsespec.adaptive.acceptance import AcceptanceTracker
from sglang_sparsespec.adaptive.dense import DenseChooser
from sglang_sparsespec.adaptive.policy import SpeculationPolicy
from sglang_sparsespec.metrics import PillarMetrics
from sglang_sparsespec.rounds.clock import NoClock, RoundClock
from sglang_sparsespec.rounds.launch import LaunchedRounds
from sglang_sparsespec.rounds.warmup import WARMUP_RID_PREFIX


class _Req:  # what the worker's round choice reads of SGLang's Req (weakly referenced by DenseChooser)
    def __init__(self, rid: str) -> None:
        self.rid, self.seqlen = rid, 2000


class _Event:
    def record(self) -> None: ...

    def query(self) -> bool:
        return True

    def elapsed_time(self, end) -> float:
        return 1.0


class _Agreement:
    """Hands the worker the round shapes the test scripts (TP agreement's place in the choice)."""

    def __init__(self) -> None:
        self.next: tuple[int, list[bool] | None] = (4, None)

    def agree(self, steps, dense, bs):
        return self.next


def _worker(adaptive: bool):
    from sglang_sparsespec.patches.worker import PillarWorker

    cfg = SimpleNamespace(num_steps=4, force_steps=-1, step_candidates=(0, 2, 4))
    worker = SimpleNamespace(cfg=cfg, metrics=PillarMetrics(4), rounds=LaunchedRounds(), warmup_rounds=0, plain=None,
                             policy=None, clock=NoClock())  # fmt: skip
    if adaptive:
        worker.policy = SpeculationPolicy(cfg.step_candidates, acceptance=AcceptanceTracker(decay=0.0, prior=0.5))
        worker.clock, worker.agreement = RoundClock(_Event), _Agreement()
        worker.dense = DenseChooser(lambda n: min(n, 128), 23040, 30, lambda bs: 22)
    worker._choose_steps = lambda batch: PillarWorker._choose_steps(worker, batch)

    def launch(reqs, steps=4, dense=None):
        if adaptive:
            worker.agreement.next = (steps, dense)
        batch = SimpleNamespace(reqs=reqs, forward_mode=SimpleNamespace(is_idle=lambda: not reqs))
        return PillarWorker._round_shape(worker, batch)

    def complete(counts):
        PillarWorker.on_verify_complete_cpu(worker, counts, len(counts))

    return worker, launch, complete


def test_each_reader_gets_each_matched_round_once_as_with_its_own_queue():
    worker, launch, complete = _worker(adaptive=True)
    a, b, c = _Req("a"), _Req("b"), _Req("c")
    acc, chooser, metrics = worker.policy.acceptance, worker.dense, worker.metrics
    launch([_Req(WARMUP_RID_PREFIX + str(i)) for i in range(3)])  # start-up warm-up: never queued
    complete([4, 4, 4])
    assert metrics.last_completed_steps is None and acc.alpha == 0.5 and not chooser._acc
    launch([])  # an idle batch: not queued
    launch([a, b], 4)
    launch([a, b], 0)
    launch([a, b, c], 2)
    complete([3, 9])  # the k = 4 round; a greedy verify past k is capped at k
    assert metrics.last_completed_steps == 4
    assert (metrics.drafts, metrics.draft_tokens, metrics.accepted_tokens) == (2, 8, 7)
    assert acc.alpha == pytest.approx(7 / 8)  # 7 hits, a's one miss
    assert (chooser._acc[a].hits, chooser._acc[a].misses, chooser._acc[b].hits, chooser._acc[b].misses) == (3, 1, 4, 0)
    complete([0, 0])  # the plain round: counted at launch, nothing to learn
    assert metrics.last_completed_steps is None and metrics.drafts == 2 and acc.alpha == pytest.approx(7 / 8)
    assert chooser._acc[a].rounds == 1
    complete([1, 1])  # not the 3-request round: every reader drops it and starts afresh
    complete([2, 2, 2])  # nothing pending
    assert metrics.drafts == 2 and acc.alpha == pytest.approx(7 / 8) and c not in chooser._acc
    launch([a, b], 4, [False, True])  # b drafts densely: the dense estimate learns it, the batch's does not
    complete([1, 4])
    assert acc.alpha == pytest.approx(1 / 2) and chooser._dense_acc.rounds == 1 and chooser._acc[b].rounds == 1
    assert chooser._acc[a].rounds == 2 and chooser.dense_request_rounds == 1
    assert metrics.rounds_by_steps == {4: 2, 0: 1, 2: 1} and metrics.accepted_per_pos == [4, 3, 3, 2]


def test_metrics_read_the_queue_with_adaptive_speculation_off():
    worker, launch, complete = _worker(adaptive=False)
    launch([_Req(WARMUP_RID_PREFIX + "0")])
    complete([4])  # the warm-up round's counts match nothing
    assert worker.metrics.last_completed_steps is None and worker.metrics.drafts == 0
    launch([_Req("a"), _Req("b")])
    complete([2, 4])
    assert worker.metrics.last_completed_steps == 4 and worker.metrics.accepted_tokens == 6
    complete([1, 1])
    assert worker.metrics.last_completed_steps is None and worker.metrics.rounds_by_steps == {4: 1}
