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
from sglang_sparsespec.rounds.warmup import WARMUP_RID_PREFIX
from planner_parts import DoneEvent, plain_sampling


class _Req:  # what the worker's round choice reads of SGLang's Req (weakly referenced by DenseChooser)
    def __init__(self, rid: str) -> None:
        self.rid, self.seqlen = rid, 2000


class _Agreement:
    """Hands the worker the round shapes the test scripts (TP agreement's place in the choice)."""

    def __init__(self) -> None:
        self.next: tuple[int, list[bool] | None] = (4, None)

    def agree(self, steps, dense, bs):
        return self.next


def _planner(adaptive: bool):
    """The worker's planner (its queue's one owner) and a launch / complete pair driving it as the worker does."""
    from sglang_sparsespec.patches.round_plan import RoundPlanner

    cfg = SimpleNamespace(num_steps=4, force_steps=-1, step_candidates=(0, 2, 4))
    planner = RoundPlanner(cfg, PillarMetrics(4), NoClock())
    if adaptive:
        policy = SpeculationPolicy(cfg.step_candidates, acceptance=AcceptanceTracker(decay=0.0, prior=0.5))
        planner = RoundPlanner(cfg, PillarMetrics(4), RoundClock(DoneEvent), policy=policy, agreement=_Agreement())
        planner.set_dense(DenseChooser(lambda n: min(n, 128), 23040, 30, lambda bs: 22))
    sampling = plain_sampling()

    def launch(reqs, steps=4, dense=None):
        if adaptive:
            planner.agreement.next = (steps, dense)
        idle = SimpleNamespace(is_idle=lambda: not reqs)
        return planner.shape(SimpleNamespace(reqs=reqs, forward_mode=idle, sampling_info=sampling))

    return planner, launch, planner.completed


def test_each_reader_gets_each_matched_round_once_as_with_its_own_queue():
    planner, launch, complete = _planner(adaptive=True)
    a, b, c = _Req("a"), _Req("b"), _Req("c")
    acc, chooser, metrics = planner.policy.acceptance, planner.dense, planner.metrics
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
    assert (chooser._acc[a].hits, chooser._acc[a].misses) == (3, 1)
    complete([1, 1])  # not the 3-request round: every reader drops it and starts afresh
    complete([2, 2, 2])  # nothing pending
    assert metrics.drafts == 2 and acc.alpha == pytest.approx(7 / 8) and c not in chooser._acc
    launch([a, b], 4, [False, True])  # b drafts densely: the dense estimate learns it, the batch's does not
    complete([1, 4])
    assert acc.alpha == pytest.approx(1 / 2) and (chooser._dense_acc.hits, chooser._dense_acc.misses) == (4, 0)
    assert (chooser._acc[b].hits, chooser._acc[b].misses) == (4, 0)  # b's own estimate: its one sparse round
    assert (chooser._acc[a].hits, chooser._acc[a].misses) == (pytest.approx(3.4), pytest.approx(1.8))
    assert chooser.dense_request_rounds == 1
    assert metrics.rounds_by_steps == {4: 2, 0: 1, 2: 1} and metrics.accepted_per_pos == [4, 3, 3, 2]


def test_metrics_read_the_queue_with_adaptive_speculation_off():
    planner, launch, complete = _planner(adaptive=False)
    launch([_Req(WARMUP_RID_PREFIX + "0")])
    complete([4])  # the warm-up round's counts match nothing
    assert planner.metrics.last_completed_steps is None and planner.metrics.drafts == 0
    launch([_Req("a"), _Req("b")])
    complete([2, 4])
    assert planner.metrics.last_completed_steps == 4 and planner.metrics.accepted_tokens == 6
    complete([1, 1])
    assert planner.metrics.last_completed_steps is None and planner.metrics.rounds_by_steps == {4: 1}


def test_requests_that_draft_nothing_teach_no_reader_and_are_credited_no_drafts():
    """A round where some requests hold per-token sampling state (here a repetition penalty): they draft
    nothing and take one token, so their 0 is not a rejection. The acceptance estimate, the dense
    chooser and the metrics skip them; the per-request proposed-draft count credits them none."""
    from sglang_sparsespec.patches.client_parity import PROPOSED, count_proposed_drafts

    planner, _, complete = _planner(adaptive=True)
    a, b, c = _Req("a"), _Req("b"), _Req("c")
    b.sampling_params = SimpleNamespace(frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.2,
                                        min_new_tokens=0)  # fmt: skip
    for r in (a, c):
        r.sampling_params = SimpleNamespace(frequency_penalty=0.0, presence_penalty=0.0, repetition_penalty=1.0,
                                            min_new_tokens=0)  # fmt: skip
    for r in (a, b, c):
        r.output_ids, r.retraction_count, r.custom_logit_processor = [1], 0, None
    penalized = plain_sampling()
    penalized.penalizer_orchestrator = SimpleNamespace(is_required=True)  # the scheduler's own batch
    batch = SimpleNamespace(reqs=[a, b, c], forward_mode=SimpleNamespace(is_idle=lambda: False), sampling_info=penalized)
    planner.agreement.next = (4, None)
    assert planner.shape(batch).num_drafts == [4, 0, 4]
    complete([4, 0, 4])
    acc, chooser, metrics = planner.policy.acceptance, planner.dense, planner.metrics
    assert acc.alpha == pytest.approx(0.999) and b not in chooser._acc  # 8 hits, no miss (capped) and chooser._acc[a].hits == 4
    assert (metrics.drafts, metrics.draft_tokens, metrics.accepted_tokens) == (2, 8, 8)
    assert metrics.accepted_per_pos == [2, 2, 2, 2]
    for r in (a, b, c):
        r.is_retracted, r.finished = False, lambda: False
    processor = SimpleNamespace(model_worker=SimpleNamespace(metrics=metrics))
    count_proposed_drafts(None, processor, None, batch)
    assert [getattr(r, PROPOSED) for r in (a, b, c)] == [4, 0, 4]
