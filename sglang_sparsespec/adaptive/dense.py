"""Dense drafting for the requests their sparse plan serves badly.

A request whose drafts are often rejected gains little from a PILLAR round: at per-draft
acceptance a it emits E_k(a) tokens per round (``expected_tokens``), and a round of a full batch
costs several stock decode steps, so such a request decodes *slower* than under stock SGLang. In a
run with a fixed number of requests the batch ends with exactly those requests (H100, 256 x 7000,
sampled-8f4fce1-7000: 61 s at a full batch, then 32 s of drain at accept 2-3), and the slowest
request sets the makespan.

The same draft step can attend to a request's whole prefix instead of its plan (the draft kernel
reads positions [tail_start, seq_len) contiguously; tail_start = 0 makes it the full prefix). Its
drafts then come from the target distribution itself, up to kernel numerics, so they are accepted
with probability ~1 and the request emits ~k + 1 tokens per round. The verify stays exact either
way: only the proposal changes. The price, per draft step, is the extra KV read for that request
((L - budget) x bytes per position at the kernel's bandwidth) and, above all, the extra length of
its programs: the draft kernel's grid is static (one program per request, KV head and split; one
split once a batch fills the GPU), so a dense request's programs read L / splits positions one
tile after another while a sparse one reads budget / splits, and the layer's attention lasts as
long as its longest program. Each request is charged both, as if it alone set that length (an
overestimate when several share it): at a full batch that keeps every long context sparse, and
dense drafting pays at small batches, where a request's prefix is split over many programs.

Which requests draft densely is a fractional-knapsack choice per round: with the batch's expected
tokens S and round time T, request i adds g_i = E_k(a_dense) - E_k(a_i) tokens for c_i = k x
extra_ms_i; taking requests by decreasing g_i / c_i while g_i / c_i > S / T maximises S / T. At a
full batch with long contexts the round is long and S / T high, so few requests qualify; as the batch
drains the round shrinks and the low-acceptance requests switch.

Per-request acceptance counts only the rounds the request drafted sparsely (dense rounds say
nothing about its plan). Nothing here touches SGLang or the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any
from weakref import WeakKeyDictionary

from sglang_sparsespec.rounds.launch import AdaptiveRound, Matched

# Effective bandwidth (GB/s) at which the draft kernel reads a dense prefix. Measured for the
# split-KV attention kernels on the H100 (kernels_tune_h100.json: 2.54 TB/s at 256 x 7K); taken
# lower so that the estimate errs towards keeping a request sparse.
DENSE_READ_GBPS = 2000.0
# Time one draft-attention program spends per position it reads (one KV head, all layers counted
# separately). An estimate, to be measured: on the H100 the draft kernel took 54 us per layer at
# 256 x 7K (kernels_tune_sparse_h100.json), ~1.5 waves of programs reading ~450 positions each
# while sharing SMs, i.e. up to ~80 ns per position; a long program left alone on its SM runs faster.
SERIAL_NS_PER_POSITION = 40.0


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one request emits in a round of k drafts at per-draft acceptance ``alpha`` (geometric
    model): sum_{j=0..k} alpha^j, the bonus token included."""
    if k == 0:
        return 1.0
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


class RequestAcceptance:
    """One request's sparse-draft acceptance: decayed hits (accepted drafts) and misses (a
    rejection before the k-th draft) of the rounds it drafted sparsely."""

    __slots__ = ("hits", "misses")
    DECAY = 0.8

    def __init__(self) -> None:
        self.hits = 0.0
        self.misses = 0.0

    def add(self, accepted: int, k: int) -> None:
        self.hits = self.DECAY * self.hits + accepted
        self.misses = self.DECAY * self.misses + (1.0 if accepted < k else 0.0)

    def alpha(self, prior: float) -> float:
        """The estimate with one pseudo-observation of ``prior`` (the batch's acceptance)."""
        return (self.hits + prior) / (self.hits + self.misses + 1.0)


@dataclass(frozen=True)
class BatchView:
    """A decode batch as the speculation policy prices it.

    alpha:       [bs] each request's per-draft acceptance under its sparse plan;
    extra_ms:    [bs] what one draft step costs more when the request attends its whole prefix;
    alpha_dense: per-draft acceptance of dense drafts (~1: they come from the target model).
    """

    alpha: Sequence[float]
    extra_ms: Sequence[float]
    alpha_dense: float

    def __post_init__(self) -> None:
        if len(self.alpha) != len(self.extra_ms):
            raise ValueError(f"alpha has {len(self.alpha)} entries, extra_ms {len(self.extra_ms)}")


@dataclass(frozen=True)
class DensePlan:
    """tokens: the batch's expected tokens; ms: the round's expected time; dense: [bs] which
    requests draft over their whole prefix; each: [bs] each request's expected tokens (dense or
    sparse as ``dense`` says; they sum to ``tokens``)."""

    tokens: float
    ms: float
    dense: list[bool]
    each: list[float]


def plan_dense(view: BatchView, k: int, round_ms: float) -> DensePlan:
    """The dense set maximising expected tokens per ms for a round of ``k`` drafts whose all-sparse
    cost is ``round_ms`` (see the module docstring)."""
    n = len(view.alpha)
    each = [expected_tokens(a, k) for a in view.alpha]
    e_dense = expected_tokens(view.alpha_dense, k)
    tokens, ms = sum(each), round_ms
    dense = [False] * n
    if k == 0 or n == 0:
        return DensePlan(tokens, ms, dense, each)

    # Per request (comprehensions: this runs for every candidate count of every round, on the
    # scheduler's thread): tokens gained and ms added by drafting densely, and their ratio. A request
    # with nothing to gain goes last in the order, where it ends the choice.
    gains = [e_dense - s for s in each]
    costs = [k * x for x in view.extra_ms]
    ratios = [-math.inf if g <= 0 else (g / c if c > 0 else math.inf) for g, c in zip(gains, costs)]
    if max(ratios) * ms <= tokens:  # the usual full batch: nobody raises the rate, skip the sort
        return DensePlan(tokens, ms, dense, each)
    for i in sorted(range(n), key=ratios.__getitem__, reverse=True):
        gain, cost = gains[i], costs[i]
        # Ratios only fall and tokens / ms only rises from here: the first request that does not
        # raise the rate ends the choice.
        if gain <= 0 or gain * ms <= tokens * cost:
            break
        dense[i] = True
        each[i] = e_dense
        tokens += gain
        ms += cost
    return DensePlan(tokens, ms, dense, each)


def floor_tokens(plan: DensePlan, quantile: float) -> float:
    """The expected tokens of the plan's request at ``quantile`` of them (0: the poorest; index
    floor(quantile x bs)); the plan must cover at least one request."""
    tokens = sorted(plan.each)
    return tokens[min(int(quantile * len(tokens)), len(tokens) - 1)]


def dense_extra_ms(
    context: int,
    budget: int,
    bytes_per_position: int,
    layers: int,
    splits: int,
    gbps: float = DENSE_READ_GBPS,
    serial_ns: float = SERIAL_NS_PER_POSITION,
) -> float:
    """Milliseconds one draft step costs more when a request attends its whole prefix: its extra KV
    at the kernel's bandwidth, plus the longer programs (``splits`` per request and KV head) in each
    of ``layers`` attention launches (see the module docstring)."""
    extra = max(context - budget, 0)
    longer = -(-context // splits) - -(-budget // splits) if extra else 0
    return extra * bytes_per_position / (gbps * 1e6) + layers * longer * serial_ns * 1e-6


class DenseChooser:
    """Tracks each request's sparse acceptance and prices batches for the speculation policy.

    Requests are any objects with a ``seqlen`` (SGLang's ``Req``); their state lives in weak maps,
    so a finished request takes it along. ``budget(L)`` is the plan's KV budget at context L;
    ``bytes_per_position`` the KV bytes of one position over all layers (K and V); ``layers`` the
    attention launches per draft step; ``splits(bs)`` the draft kernel's KV splits at batch size bs.
    """

    DENSE_PRIOR = 0.95  # dense drafts come from the target distribution up to kernel numerics

    def __init__(
        self,
        budget: Callable[[int], int],
        bytes_per_position: int,
        layers: int,
        splits: Callable[[int], int],
    ):
        self.budget = budget
        self.bytes_per_position = bytes_per_position
        self.layers = layers
        self.splits = splits
        self._acc: WeakKeyDictionary[Any, RequestAcceptance] = WeakKeyDictionary()
        self._dense_acc = RequestAcceptance()
        self.dense_request_rounds = 0

    def view(self, reqs: Sequence[Any], prior: float) -> BatchView:
        """The batch's acceptances (``prior``: the batch's, for requests without history) and costs."""
        alpha, extra = [], []
        splits = self.splits(len(reqs))
        for r in reqs:
            alpha.append(prior if (acc := self._acc.get(r)) is None else acc.alpha(prior))
            length = r.seqlen
            extra.append(dense_extra_ms(length, self.budget(length), self.bytes_per_position, self.layers, splits))
        return BatchView(alpha, extra, self._dense_acc.alpha(self.DENSE_PRIOR))

    def launched(self, k: int, dense: Sequence[bool] | None) -> None:
        """Counts a launched round's dense requests (a plain round drafts nothing)."""
        if k and dense is not None:
            self.dense_request_rounds += sum(dense)

    def completed(self, matched: Matched) -> None:
        """A round of k >= 1 drafts with its capped counts, matched by the worker's launch queue
        (``rounds/launch.py``): each sparse drafter's own acceptance, and the dense drafters' shared one."""
        launch: AdaptiveRound = matched.payload
        flags = launch.dense if launch.dense is not None else repeat(False)
        num_drafts = matched.num_drafts if matched.num_drafts is not None else repeat(matched.k)
        for r, dense, a, n in zip(launch.reqs, flags, matched.accepted, num_drafts):
            if n == 0:  # drafted nothing (per-token sampling state): no acceptance to learn
                continue
            if dense:
                self._dense_acc.add(a, matched.k)
                continue
            acc = self._acc.get(r)
            if acc is None:
                acc = self._acc[r] = RequestAcceptance()
            acc.add(a, matched.k)
