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

Boosted plans (``--pillar-boost-ratio``) are the cheap middle ground: a poor drafter keeps drafting
sparsely but its next selections buy ``boost_ratio`` x L positions instead of ``budget_ratio`` x L.
A global 10% budget lifted the slowest requests and slowed the good ones (H200, 256 x 7000 sampled:
E2E p99 65.0 -> 54.7 s, p10 25.9 -> 28.8 s); spending it on the tail alone keeps the good drafters'
rounds as cheap as before. A request is boosted once BOOST_AFTER sparse rounds say its expected
tokens per round at k = num_steps fall below BOOST_BELOW x the batch's mean, poorest first and at
most BOOST_MAX_SHARE of the batch, and stays boosted for its life (its own estimate stops there:
boosted rounds are counted apart, as dense ones are, and price it from then on). The bar is the
mean of the estimates under the normal budget: judged by their boosted estimates, the boosted
requests raised the mean until nearly every request was boosted (the first A/B). The larger plans
make the request's programs in the draft kernel longer (static grid); that cost reaches the policy
through the measured round times, not through a model here.
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
# A request is a poor drafter when its expected tokens per round are below this share of the
# batch's mean: at the headline point on the H200 (c4a7753, mean accept 6.1) the requests around
# accept 2.5-3.5 that end the run.
BOOST_BELOW = 0.6
# Sparse rounds a request's estimate needs before it decides (the estimate decays by 0.8 a round).
BOOST_AFTER = 8
# At most this share of a batch is boosted: the cost is per boosted request (boosted-404b58c-h200-7000:
# with nearly every request boosted at 0.15 the 8-step draft at 256 x 4K took 29.8 ms instead of 17.4).
BOOST_MAX_SHARE = 0.125


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

    __slots__ = ("hits", "misses", "rounds")
    DECAY = 0.8

    def __init__(self) -> None:
        self.hits = 0.0
        self.misses = 0.0
        self.rounds = 0

    def add(self, accepted: int, k: int) -> None:
        self.rounds += 1
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
    splits: int | None,
    gbps: float = DENSE_READ_GBPS,
    serial_ns: float = SERIAL_NS_PER_POSITION,
) -> float:
    """Milliseconds one draft step costs more when a request attends its whole prefix: its extra KV
    at the kernel's bandwidth, plus the longer programs (``splits`` per request and KV head) in each
    of ``layers`` attention launches (see the module docstring). ``splits`` None: the programs follow
    the plan lengths (the planned grid), so a dense request adds programs, not length: its KV only."""
    extra = max(context - budget, 0)
    longer = -(-context // splits) - -(-budget // splits) if extra and splits is not None else 0
    return extra * bytes_per_position / (gbps * 1e6) + layers * longer * serial_ns * 1e-6


class DenseChooser:
    """Tracks each request's sparse acceptance and prices batches for the speculation policy.

    Requests are any objects with a ``seqlen`` (SGLang's ``Req``); their state lives in weak maps,
    so a finished request takes it along. ``budget(L)`` is the plan's KV budget at context L;
    ``bytes_per_position`` the KV bytes of one position over all layers (K and V); ``layers`` the
    attention launches per draft step; ``splits(bs)`` the draft kernel's KV splits at batch size bs
    (None: the planned grid, whose programs follow the plan lengths);
    ``num_steps`` the longest round (whose expected tokens decide a boost); ``boosts`` whether poor
    drafters get boosted plans (module docstring).
    """

    DENSE_PRIOR = 0.95  # dense drafts come from the target distribution up to kernel numerics

    def __init__(
        self,
        budget: Callable[[int], int],
        bytes_per_position: int,
        layers: int,
        splits: Callable[[int], int] | None,
        num_steps: int = 8,
        boosts: bool = False,
    ):
        self.budget = budget
        self.bytes_per_position = bytes_per_position
        self.layers = layers
        self.splits = splits
        self.num_steps = num_steps
        self.boosts = boosts
        self._acc: WeakKeyDictionary[Any, RequestAcceptance] = WeakKeyDictionary()
        # Boosted requests: their acceptance under the boosted plan (their _acc entry stays frozen).
        self._boosted: WeakKeyDictionary[Any, RequestAcceptance] = WeakKeyDictionary()
        self._dense_acc = RequestAcceptance()
        self.dense_request_rounds = 0
        self.boosted_request_rounds = 0

    def _alpha(self, r: Any, prior: float) -> float:
        acc = self._acc.get(r)
        base = prior if acc is None else acc.alpha(prior)
        boosted = self._boosted.get(r)
        return base if boosted is None else boosted.alpha(base)

    def view(self, reqs: Sequence[Any], prior: float) -> BatchView:
        """The batch's acceptances (``prior``: the batch's, for requests without history; a boosted
        request's under its boosted plan) and costs."""
        alpha, extra = [], []
        splits = self.splits(len(reqs)) if self.splits is not None else None
        for r in reqs:
            alpha.append(self._alpha(r, prior))
            length = r.seqlen
            extra.append(dense_extra_ms(length, self.budget(length), self.bytes_per_position, self.layers, splits))
        return BatchView(alpha, extra, self._dense_acc.alpha(self.DENSE_PRIOR))

    def boost(self, reqs: Sequence[Any], prior: float) -> list[bool] | None:
        """[bs] which requests' next selections take the boosted budget (None: nobody, or boosts off).
        Every request is judged by its estimate under the normal budget (``prior`` for those without
        one; a boosted request's stays where it was), so a boost that works cannot raise the bar for
        the others. Poorest first while at most BOOST_MAX_SHARE of the batch is boosted; a boosted
        request stays boosted."""
        if not self.boosts or not reqs:
            return None
        k = self.num_steps
        base = [prior if (acc := self._acc.get(r)) is None else acc.alpha(prior) for r in reqs]
        tokens = [expected_tokens(a, k) for a in base]
        bar = BOOST_BELOW * sum(tokens) / len(reqs)
        flags = [r in self._boosted for r in reqs]
        room = int(BOOST_MAX_SHARE * len(reqs)) - sum(flags)
        for i in sorted(range(len(reqs)), key=tokens.__getitem__):
            if room <= 0 or tokens[i] >= bar:
                break
            acc = self._acc.get(reqs[i])
            if not flags[i] and acc is not None and acc.rounds >= BOOST_AFTER:
                flags[i] = True
                self._boosted[reqs[i]] = RequestAcceptance()
                room -= 1
        return flags if any(flags) else None

    def launched(self, k: int, dense: Sequence[bool] | None, boosted: Sequence[bool] | None = None) -> None:
        """Counts a launched round's dense and boosted requests (a plain round drafts nothing)."""
        if k:
            self.dense_request_rounds += sum(dense) if dense is not None else 0
            self.boosted_request_rounds += sum(boosted) if boosted is not None else 0

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
            acc = self._boosted.get(r)
            if acc is None:
                acc = self._acc.get(r)
                if acc is None:
                    acc = self._acc[r] = RequestAcceptance()
            acc.add(a, matched.k)
