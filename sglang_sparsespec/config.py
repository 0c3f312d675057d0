"""PILLAR run-time configuration.

The knobs SGLang already has keep their SGLang flags (``--speculative-num-steps`` is k). The
PILLAR-only knobs (``KNOBS``) are launch flags ``--pillar-<name>`` that the plugin adds to
SGLang's parser, with the variables ``SPARSESPEC_<NAME>`` as the fallback; the launcher turns the
flags it was given into those variables, which every scheduler process inherits, so each process
resolves the same ``PillarConfig`` (``patches/server_args_flags.py``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

ENV_PREFIX = "SPARSESPEC_"
# The folder of everything the package caches on disk (the built test model, measured round costs).
CACHE_ENV = "SPARSESPEC_CACHE"
# The draft sampler keeps a proposal's candidates in registers of one program.
MAX_DRAFT_CANDIDATES = 1024


class SelectionPolicy(str, Enum):
    """Which KV positions a draft step attends to, besides the recent tail."""

    # PillarAttn: top-K per (layer, KV head) by the attention mass of the previous verify pass.
    PILLAR = "pillar"
    # The same scores summed over layers and KV heads: one set per request shared by all.
    COARSE = "coarse"
    # Attention sinks + a recent window of the same budget (the MagicDec baseline).
    STREAMING = "streaming"
    # Analysis only: each draft query's own exact top-K per (layer, KV head), recomputed
    # from full attention at every draft step (an upper bound on what selection can do).
    ORACLE = "oracle"

    @property
    def uses_verify_scores(self) -> bool:
        return self in (SelectionPolicy.PILLAR, SelectionPolicy.COARSE)


class ScoreRows(str, Enum):
    """Which verify queries' attention mass the PillarAttn scores average (with the GQA group)."""

    # All k + 1 verify rows (the paper's rule).
    ALL = "all"
    # Only the last verify row: the query furthest ahead, nearest to the next round's drafts.
    LAST = "last"


class VerifyKernel(str, Enum):
    """Attention kernel of the verify pass (Triton backend)."""

    # kernels/verify_attention.py: split-KV, one K/V read per KV head for the whole GQA group
    # and all k + 1 rows; falls back to SGLANG for the cases it does not serve.
    SPLIT = "split"
    # SGLang's own extend kernel (for A/B measurements).
    SGLANG = "sglang"


class PlainPath(str, Enum):
    """How a plain-decoding round (adaptive draft count 0) runs its one forward. PillarConfig resolves
    AUTO, so a built config holds VERIFY or DECODE."""

    # DECODE, except under the oracle policy, whose draft backend has no whole-prefix step: VERIFY.
    AUTO = "auto"

    # A TARGET_VERIFY forward of width 1 through SGLang's EAGLE verify path (its zero-step rounds' shape).
    VERIFY = "verify"
    # A DECODE forward: the draft step's graph with every request attending its whole prefix, sampled by
    # SGLang's own sampler, as stock decodes; batches that need logprobs, hidden states, a grammar,
    # penalties, a logit bias or custom logit processors keep the verify path.
    DECODE = "decode"


class BatchPhases(str, Enum):
    """How the requests of a full-length round (k drafts) share forwards (rounds/mixed.py)."""

    # The whole batch drafts k forwards, then verifies in one.
    SPLIT = "split"
    # Requests staggered over k + 1 phase groups: each forward carries one group's verify and every
    # other request's draft step, so the verify shares the draft step's weight read.
    MIXED = "mixed"


# The draft counts "auto" adds below --speculative-num-steps: plain decoding and two short rounds.
AUTO_STEPS = (0, 2, 4)


def _parse_steps(raw: str, num_steps: int) -> tuple[int, ...]:
    text = raw.strip().lower()
    if text in ("off", ""):
        return (num_steps,)
    if text == "auto":
        return tuple(sorted({s for s in AUTO_STEPS if s < num_steps} | {num_steps}))
    try:
        steps = {int(x) for x in text.split(",")}
    except ValueError:
        raise ValueError(f"{ENV_PREFIX}ADAPTIVE_STEPS={raw!r}: give 'auto', 'off' or draft counts like 0,2,4") from None
    if any(not 0 <= s <= num_steps for s in steps):
        raise ValueError(f"{ENV_PREFIX}ADAPTIVE_STEPS={raw!r}: every count must be in 0..{num_steps} (--speculative-num-steps)")
    return tuple(sorted(steps | {num_steps}))


@dataclass(frozen=True)
class PillarConfig:
    """Knobs of one PILLAR server.

    Invariants: ``num_steps >= 1``; ``0 < budget_ratio <= 1``; ``min_budget >= 1``;
    ``recent_window >= 0``; ``sink_tokens >= 0``; ``select_every >= 1``.
    """

    num_steps: int = 8
    budget_ratio: float = 0.05
    min_budget: int = 128
    # Measured on SmolLM2-135M, 4096 tokens (benchmarks/results/acceptance/acceptance_h100_*.json): a
    # 64-token tail beats 16 (accept 6.02/6.82 vs 4.78/5.54 at T=0/0.6) and 128 (5.33/4.39,
    # which leaves no budget for the selection, sinks included, below 2.5K tokens).
    recent_window: int = 64
    sink_tokens: int = 4
    policy: SelectionPolicy = SelectionPolicy.PILLAR
    # > 0: log the mean GPU time of the draft, verify and select phases every this many
    # rounds (one host sync each time); for step-time breakdowns, off in serving.
    timing_every: int = 0
    verify_kernel: VerifyKernel = VerifyKernel.SPLIT
    # Re-select every N-th verify (pillar/coarse); the verify passes in between skip the score
    # capture, and their plans keep the last selection while the recent tail grows. Measured on the
    # H100 (benchmarks/results): capture + selection is 20-35% of a Qwen3-1.7B verify step at N = 1
    # and 6-13% at N = 4. N = 8: the SmolLM2 256 x 2K verify 9.35 -> 8.99 ms (1.27-1.29x stock's step
    # instead of 1.34x), 256 x 7000 sampled two waves 1.76x against 1.72x stock (accept 4.78 vs 4.69;
    # sel8b-af052b7-7000) and 1.77x against 1.74x (sel8-32ab36a-7000); the CPU policy_sim accept length
    # on AIME24 prompts 1-3 at 4096 tokens 6.93/5.89/6.35 vs 6.63/5.56/6.06.
    select_every: int = 8
    # Which verify rows score the prefix. CPU reference (policy_sim, AIME24 prompts 1-3, fp32, select
    # every verify): 4096 tokens 6.62/5.89/6.56 (all) vs 7.39/5.80/6.46 (last); 1500 tokens
    # 7.65/7.08/7.81 vs 7.86/7.77/7.57. One prompt gains 10-12%, the others move by -3..+3%: the
    # default stays the paper's until the GPU acceptance run says otherwise.
    score_rows: ScoreRows = ScoreRows.ALL
    # Sampled drafts: the proposal's support, at most C of the most probable tokens of each draft
    # step. The verify is exact for any C; C only trades acceptance (the target mass outside them can
    # never be drafted) for record size (k x C x 12 bytes per request).
    draft_candidates: int = 64
    # Adaptive speculation (adaptive/policy.py): the draft counts a round may run besides num_steps,
    # 0 = plain decoding, as a comma list; "auto" = AUTO_STEPS below num_steps; "off" = always num_steps.
    adaptive_steps: str = "auto"
    # Analysis only: every round runs this draft count (one of the candidates; 0 = plain decoding) while
    # the policy still prices its cells, so a step-time run can time one path alone; -1 = the policy's.
    force_steps: int = -1
    # Adaptive speculation speculates only if the batch's request at this quantile of expected tokens
    # decodes at least as fast as under plain decoding (adaptive/policy.py, SpeculationPolicy); 0 = the
    # throughput choice alone.
    floor_quantile: float = 0.1
    # ... and only if it promises this much more throughput than plain decoding (SpeculationPolicy).
    spec_premium: float = 0.15
    # Plain-decoding rounds: the decode path since its same-run A/B (plain-c4a7753-h200-2048: 1.04x
    # stock at 64 x 2048 against the verify path's 0.99x, lossless PASS; docs/results.md).
    plain_path: PlainPath = PlainPath.AUTO
    # Where adaptive speculation keeps the round costs it measured, so a restarted server of the same
    # setup starts priced (adaptive/cost_cache.py): "auto" = a file per setup under $SPARSESPEC_CACHE/costs
    # (default ~/.cache/sglang_sparsespec), "off", or a file path.
    cost_cache: str = "auto"
    # Pinned host memory (GB) for parking running requests' KV instead of retracting them when the
    # GPU pool runs out (patches/offload.py, docs/offload.md); 0 = off. Applies to stock decoding too.
    offload_host_gb: float = 0.0
    # Full-length rounds as split phases or mixed-phase iterations (rounds/mixed.py). Mixed is not the
    # default until a same-run A/B on the GPU says it pays: its measured ceiling is -5% of a Qwen3-8B
    # round at batch 64 and ~0 on SmolLM2 (tools.mixed_gemm).
    batch_phases: BatchPhases = BatchPhases.SPLIT

    def __post_init__(self) -> None:
        _parse_steps(self.adaptive_steps, self.num_steps)
        if self.num_steps < 1:
            raise ValueError(f"PILLAR needs --speculative-num-steps >= 1, got {self.num_steps}")
        if self.force_steps != -1 and self.force_steps not in self.step_candidates:
            raise ValueError(
                f"{ENV_PREFIX}FORCE_STEPS must be -1 (off) or one of the draft counts {list(self.step_candidates)}, "
                f"got {self.force_steps}"
            )
        if not 0.0 <= self.floor_quantile < 1.0:
            raise ValueError(f"{ENV_PREFIX}FLOOR_QUANTILE must be in [0, 1) (0 = off), got {self.floor_quantile}")
        if not 0.0 <= self.spec_premium < float("inf"):
            raise ValueError(f"{ENV_PREFIX}SPEC_PREMIUM must be a finite number >= 0, got {self.spec_premium}")
        if not 0.0 < self.budget_ratio <= 1.0:
            raise ValueError(f"{ENV_PREFIX}BUDGET_RATIO must be in (0, 1], got {self.budget_ratio}")
        if self.min_budget < 1:
            raise ValueError(f"{ENV_PREFIX}MIN_BUDGET must be >= 1, got {self.min_budget}")
        if self.select_every < 1:
            raise ValueError(f"{ENV_PREFIX}SELECT_EVERY must be >= 1, got {self.select_every}")
        if not 1 <= self.draft_candidates <= MAX_DRAFT_CANDIDATES:
            raise ValueError(
                f"{ENV_PREFIX}DRAFT_CANDIDATES must be in [1, {MAX_DRAFT_CANDIDATES}], got {self.draft_candidates}"
            )
        if not 0.0 <= self.offload_host_gb < float("inf"):
            raise ValueError(f"{ENV_PREFIX}OFFLOAD_HOST_GB must be a finite number >= 0, got {self.offload_host_gb}")
        if not self.cost_cache.strip():
            raise ValueError(f"{ENV_PREFIX}COST_CACHE must be 'auto', 'off' or a file path")
        if self.plain_path is PlainPath.AUTO:
            oracle = self.policy is SelectionPolicy.ORACLE
            object.__setattr__(self, "plain_path", PlainPath.VERIFY if oracle else PlainPath.DECODE)
        elif self.plain_path is PlainPath.DECODE and self.policy is SelectionPolicy.ORACLE:
            # The oracle's draft backend selects from each query itself; it has no whole-prefix step.
            raise ValueError(f"{ENV_PREFIX}PLAIN_PATH=decode does not combine with {ENV_PREFIX}POLICY=oracle")
        if self.batch_phases is BatchPhases.MIXED and self.policy is SelectionPolicy.ORACLE:
            # The oracle selects inside each draft step from a batch of draft rows only.
            raise ValueError(f"{ENV_PREFIX}BATCH_PHASES=mixed does not combine with {ENV_PREFIX}POLICY=oracle")
        if self.recent_window < 0 or self.sink_tokens < 0 or self.timing_every < 0:
            raise ValueError(
                f"{ENV_PREFIX}RECENT_WINDOW, {ENV_PREFIX}SINK_TOKENS and {ENV_PREFIX}STEP_TIMING must be >= 0"
            )

    @property
    def step_candidates(self) -> tuple[int, ...]:
        """Sorted draft counts the adaptive policy chooses from; always ends with num_steps."""
        return _parse_steps(self.adaptive_steps, self.num_steps)

    @property
    def adaptive(self) -> bool:
        return len(self.step_candidates) > 1

    @property
    def mixed(self) -> bool:
        return self.batch_phases is BatchPhases.MIXED

    def budget(self, context_len: int) -> int:
        """Draft KV budget B(L) = max(min_budget, ceil(ratio * L)), never above L."""
        return min(context_len, max(self.min_budget, math.ceil(self.budget_ratio * context_len)))

    def max_budget(self, max_context_len: int) -> int:
        """Largest budget any request can reach; sizes the static selection buffers."""
        return self.budget(max_context_len)

    @classmethod
    def from_env(cls, num_steps: int, env: Mapping[str, str] | None = None) -> PillarConfig:
        """The knobs from ``SPARSESPEC_<NAME>`` variables (``KNOBS``), defaults for the unset ones."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for knob in KNOBS:
            raw = env.get(knob.env)
            if raw is not None and raw != "":
                values[knob.field] = knob.parse(raw)
        return cls(num_steps=num_steps, **values)


@dataclass(frozen=True)
class Knob:
    """One PILLAR knob: the ``PillarConfig`` field, its variable (``env``) and launch flag (``flag``)."""

    name: str  # upper case, e.g. BUDGET_RATIO
    field: str
    help: str  # what it does and its unit, one line: the launch flag's --help text

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name

    @property
    def flag(self) -> str:
        return "--pillar-" + self.name.lower().replace("_", "-")

    @property
    def kind(self) -> type:
        return type(getattr(PillarConfig, self.field))

    @property
    def choices(self) -> tuple[str, ...] | None:
        return tuple(e.value for e in self.kind) if issubclass(self.kind, Enum) else None

    @property
    def default(self) -> Any:
        value = getattr(PillarConfig, self.field)
        return value.value if isinstance(value, Enum) else value

    def parse(self, raw: str) -> Any:
        """The field's value from its text; ValueError naming the variable on a bad one."""
        if self.choices is not None:
            try:
                return self.kind(raw.lower())
            except ValueError:
                raise ValueError(f"{self.env}={raw!r}; choose one of: {', '.join(self.choices)}") from None
        try:
            return self.kind(raw)
        except ValueError:
            raise ValueError(f"{self.env}={raw!r} is not a valid {self.kind.__name__}") from None


# Every knob PillarConfig.from_env reads (all fields but num_steps, which is --speculative-num-steps), each
# with what it does and its unit in one line: the launch flag's --help text.
KNOBS: tuple[Knob, ...] = (
    Knob("BUDGET_RATIO", "budget_ratio", "draft KV budget per request, as a fraction (0, 1] of its context length"),
    Knob("MIN_BUDGET", "min_budget", "floor of the draft KV budget, in tokens"),
    Knob("RECENT_WINDOW", "recent_window", "latest verified tokens every draft step attends, in tokens"),
    Knob("SINK_TOKENS", "sink_tokens", "first tokens (attention sinks) the streaming policy and a request's "
         "first round attend, in tokens"),
    Knob("POLICY", "policy", "KV positions a draft step attends: pillar = top-K per layer and KV head by the "
         "last verify's attention, coarse = one set per request, streaming = sinks + window, oracle = analysis"),
    Knob("STEP_TIMING", "timing_every", "log the mean GPU ms of the draft, verify, accept and select phases "
         "every N rounds (one host sync each), in rounds; 0 = off"),
    Knob("VERIFY_KERNEL", "verify_kernel", "verify attention kernel: split = kernels/verify_attention.py, "
         "sglang = SGLang's Triton extend kernel (for A/B runs)"),
    Knob("SELECT_EVERY", "select_every", "re-select the draft KV positions every N-th verify pass "
         "(pillar/coarse), in verify passes; the passes between skip the score capture"),
    Knob("SCORE_ROWS", "score_rows", "verify rows whose attention mass scores the prefix: all = the k + 1 "
         "rows averaged, last = the last row only"),
    Knob("DRAFT_CANDIDATES", "draft_candidates", "sampled drafts: the most probable tokens a draft step's "
         f"proposal keeps, in tokens (1-{MAX_DRAFT_CANDIDATES}); exact for any value"),
    Knob("ADAPTIVE_STEPS", "adaptive_steps", "draft counts (tokens per round) a round may run besides "
         f"--speculative-num-steps: auto = {','.join(map(str, AUTO_STEPS))}, a comma list (0 = plain decoding), "
         "or off"),
    Knob("FORCE_STEPS", "force_steps", "analysis: every round runs this draft count, in tokens per round "
         "(one of the adaptive counts; 0 = plain decoding); -1 = the adaptive policy's choice"),
    Knob("FLOOR_QUANTILE", "floor_quantile", "speculate only if the request at this quantile [0, 1) of "
         "expected tokens decodes at least as fast as under plain decoding; 0 = off"),
    Knob("SPEC_PREMIUM", "spec_premium", "speculate only if the round promises this much more throughput "
         "than plain decoding, as a fraction (0.15 = 15%)"),
    Knob("PLAIN_PATH", "plain_path", "how plain-decoding rounds run: decode = a DECODE forward and SGLang's "
         "sampler, verify = the width-1 verify graph, auto = decode (oracle policy: verify)"),
    Knob("COST_CACHE", "cost_cache", "where measured round costs persist across restarts: auto = a file per "
         f"setup under ${CACHE_ENV}/costs, off, or a file path"),
    Knob("OFFLOAD_HOST_GB", "offload_host_gb", "pinned host memory for parking running requests' KV instead "
         "of retracting them, in GB (stock decoding too); 0 = off"),
    Knob("BATCH_PHASES", "batch_phases", "how full-length rounds share forwards: split = k draft forwards "
         "then one verify, mixed = each forward carries one group's verify and the others' draft step"),
)  # fmt: skip


def knob_named(name: str) -> Knob:
    """The knob of ``KNOBS`` named ``name`` (upper case, e.g. ``BATCH_PHASES``)."""
    return next(k for k in KNOBS if k.name == name)


def cache_root(env: Mapping[str, str] | None = None) -> Path:
    """$SPARSESPEC_CACHE, else ~/.cache/sglang_sparsespec."""
    env = os.environ if env is None else env
    return Path(env.get(CACHE_ENV) or Path.home() / ".cache" / "sglang_sparsespec").expanduser()


def batch_phases(env: Mapping[str, str] | None = None) -> BatchPhases:
    """The batch-phase knob alone (read where the KV reserve is sized, which has no PillarConfig)."""
    env = os.environ if env is None else env
    raw = env.get(ENV_PREFIX + "BATCH_PHASES", "")
    return knob_named("BATCH_PHASES").parse(raw) if raw != "" else PillarConfig.batch_phases


def offload_host_gb(env: Mapping[str, str] | None = None) -> float:
    """The offload host budget alone (it also serves stock decoding, which has no PillarConfig)."""
    env = os.environ if env is None else env
    raw = env.get(ENV_PREFIX + "OFFLOAD_HOST_GB", "")
    value = knob_named("OFFLOAD_HOST_GB").parse(raw) if raw != "" else 0.0
    PillarConfig(offload_host_gb=value)  # the same range check as the PILLAR path
    return value
