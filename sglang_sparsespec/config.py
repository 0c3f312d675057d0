"""PILLAR run-time configuration.

The knobs SGLang already has keep their SGLang flags (``--speculative-num-steps`` is k). The
PILLAR-only knobs (``KNOBS``) are launch flags ``--pillar-<name>`` that the plugin adds to
SGLang's parser, with the variables ``SPARSESPEC_<NAME>`` as the fallback; the launcher turns the
flags it was given into those variables, which every scheduler process inherits, so each process
resolves the same ``PillarConfig`` (``patches/server_args_flags.py``). Each knob is described once,
in ``KNOBS``: the flag's --help and the README's knob table (``knob_table.py``) are made from it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from .modes import (
    AcceptList,
    BatchPhases,
    DraftLmHead,
    DraftMlp,
    PlainPath,
    Prologue,
    ScoreRows,
    SelectionPolicy,
    VerifyKernel,
    VerifyLogits,
)

# The name the plugin registers its algorithm under: --speculative-algorithm PILLAR.
ALGORITHM_NAME = "PILLAR"
ENV_PREFIX = "SPARSESPEC_"
# The folder of everything the package caches on disk (the built test model, measured round costs).
CACHE_ENV = "SPARSESPEC_CACHE"
# The draft sampler keeps a proposal's candidates in registers of one program.
MAX_DRAFT_CANDIDATES = 1024
# The smallest draft vocabulary: at 1,024 ids 16 % of SmolLM2's draft mass lay outside it (draft_vocab.py).
MIN_DRAFT_VOCAB = 1024


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
        raise ValueError(
            f"{ENV_PREFIX}ADAPTIVE_STEPS={raw!r}: every count must be in 0..{num_steps} (--speculative-num-steps)"
        )
    return tuple(sorted(steps | {num_steps}))


@dataclass(frozen=True)
class PillarConfig:
    """Knobs of one PILLAR server. Every field but ``num_steps`` (``--speculative-num-steps``) is a knob,
    described once, by its ``Knob`` in ``KNOBS``; ``__post_init__`` checks their ranges."""

    num_steps: int = 8
    budget_ratio: float = 0.05
    min_budget: int = 128
    recent_window: int = 128
    sink_tokens: int = 4
    policy: SelectionPolicy = SelectionPolicy.PILLAR
    timing_every: int = 0
    verify_kernel: VerifyKernel = VerifyKernel.SPLIT
    select_every: int = 8
    score_rows: ScoreRows = ScoreRows.ALL
    draft_candidates: int = 64
    adaptive_steps: str = "auto"
    force_steps: int = -1
    floor_quantile: float = 0.1
    spec_premium: float = 0.15
    plain_path: PlainPath = PlainPath.AUTO
    cost_cache: str = "auto"
    offload_host_gb: float = 0.0
    batch_phases: BatchPhases = BatchPhases.SPLIT
    draft_prologue: Prologue = Prologue.FUSED
    verify_prologue: Prologue = Prologue.FUSED
    draft_mlp: DraftMlp = DraftMlp.FUSED
    draft_lm_head: DraftLmHead = DraftLmHead.BF16
    draft_vocab: int = 0
    verify_logits: VerifyLogits = VerifyLogits.FP32
    accept_list: AcceptList = AcceptList.CANDIDATES
    dense_heads: str = ""
    match_heads: str = ""

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
        cache = self.cost_cache.strip()
        if cache.lower() in ("auto", "off"):
            object.__setattr__(self, "cost_cache", cache.lower())
        elif not Path(cache).name or Path(cache).expanduser().is_dir():
            raise ValueError(f"{ENV_PREFIX}COST_CACHE must be 'auto', 'off' or a file's path, got {self.cost_cache!r}")
        if self.plain_path is PlainPath.AUTO:
            oracle = self.policy is SelectionPolicy.ORACLE
            object.__setattr__(self, "plain_path", PlainPath.VERIFY if oracle else PlainPath.DECODE)
        elif self.plain_path is PlainPath.DECODE and self.policy is SelectionPolicy.ORACLE:
            # The oracle's draft backend selects from each query itself; it has no whole-prefix step.
            raise ValueError(f"{ENV_PREFIX}PLAIN_PATH=decode does not combine with {ENV_PREFIX}POLICY=oracle")
        if self.draft_vocab and self.draft_vocab < MIN_DRAFT_VOCAB:
            raise ValueError(f"{ENV_PREFIX}DRAFT_VOCAB must be 0 (off) or >= {MIN_DRAFT_VOCAB}, got {self.draft_vocab}")
        if self.draft_vocab and (self.mixed or self.draft_lm_head is not DraftLmHead.BF16):
            # Mixed forwards score draft and verify rows with one LM head call; the fp8 copy is another draft head.
            raise ValueError(
                f"{ENV_PREFIX}DRAFT_VOCAB runs with {ENV_PREFIX}BATCH_PHASES=split and {ENV_PREFIX}DRAFT_LM_HEAD=bf16, "
                f"got {self.batch_phases.value} and {self.draft_lm_head.value}"
            )
        if self.batch_phases is BatchPhases.MIXED and self.policy is SelectionPolicy.ORACLE:
            # The oracle selects inside each draft step from a batch of draft rows only.
            raise ValueError(f"{ENV_PREFIX}BATCH_PHASES=mixed does not combine with {ENV_PREFIX}POLICY=oracle")
        for name, value in (("RECENT_WINDOW", self.recent_window), ("SINK_TOKENS", self.sink_tokens),
                            ("STEP_TIMING", self.timing_every)):  # fmt: skip
            if value < 0:
                raise ValueError(f"{ENV_PREFIX}{name} must be >= 0, got {value}")

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
    help: str  # what it does and its unit, one line: the flag's --help text (for KNOBS, the README's row too)

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


# Every knob PillarConfig.from_env reads (all fields but num_steps, which is --speculative-num-steps): the one
# description of each, which the launch flag's --help prints and the README's knob table shows
# (``python -m sglang_sparsespec.knob_table README.md`` rewrites that table).
KNOBS: tuple[Knob, ...] = (
    Knob("BUDGET_RATIO", "budget_ratio", "draft KV budget per request, as a fraction (0, 1] of its context length"),
    Knob("MIN_BUDGET", "min_budget", "floor of the draft KV budget, in tokens"),
    Knob("RECENT_WINDOW", "recent_window", "latest verified tokens every draft step attends, in tokens"),
    Knob("SINK_TOKENS", "sink_tokens", "attention sinks of streaming and first-round plans, and the fewest a "
         "scored plan selects, in tokens"),
    Knob("POLICY", "policy", "KV positions a draft step attends: pillar = top-K per layer and KV head by "
         "verify attention, coarse = one set per request, streaming = sinks + recent window, oracle = exact "
         "top-K per draft query (analysis)"),
    Knob("SELECT_EVERY", "select_every", "re-select the draft KV positions every N-th verify pass "
         "(pillar/coarse), in verify passes"),
    Knob("SCORE_ROWS", "score_rows", "verify rows whose attention mass scores the prefix: all = the k + 1 "
         "rows averaged, last = the last row"),
    Knob("VERIFY_KERNEL", "verify_kernel", "verify attention kernel: split = PILLAR's split-KV kernel, "
         "sglang = SGLang's extend kernel (for A/B runs)"),
    Knob("DRAFT_CANDIDATES", "draft_candidates", "sampled drafts: the most probable tokens a draft step's "
         f"proposal keeps, in tokens (1-{MAX_DRAFT_CANDIDATES}); exact for any value"),
    Knob("ADAPTIVE_STEPS", "adaptive_steps", "draft counts a round may choose besides --speculative-num-steps "
         f"(by expected tokens per ms): auto = {','.join(map(str, AUTO_STEPS))}, a comma list (0 = plain "
         "decoding), or off"),
    Knob("FORCE_STEPS", "force_steps", "analysis: every round drafts this many tokens (0 = plain decoding); "
         "-1 = the adaptive policy's choice"),
    Knob("FLOOR_QUANTILE", "floor_quantile", "speculate only if the request at this quantile [0, 1) of "
         "expected tokens decodes at least as fast as plainly; 0 = off"),
    Knob("SPEC_PREMIUM", "spec_premium", "speculate only if the round promises this much more throughput "
         "than plain decoding, as a fraction (0.15 = 15%)"),
    Knob("PLAIN_PATH", "plain_path", "how plain-decoding rounds run: decode = a DECODE forward sampled by "
         "SGLang, verify = the width-1 verify graph, auto = decode (oracle policy: verify)"),
    Knob("COST_CACHE", "cost_cache", "where measured round costs persist: auto = a file per setup under "
         f"${CACHE_ENV}/costs, off, or a file path"),
    Knob("BATCH_PHASES", "batch_phases", "how full-length rounds share forwards: split = k draft forwards, "
         "then one verify; mixed = one group's verify and the others' draft step a forward (slower on H100/H200)"),
    Knob("DRAFT_PROLOGUE", "draft_prologue", "a draft step's K/V store, q/k norm and rotary: fused = in its sparse "
         "attention (SGLang's plain KV pool; Llama, Mistral, Qwen2, Qwen3), else and with sglang = SGLang's kernels"),
    Knob("VERIFY_PROLOGUE", "verify_prologue", "a verify's K/V store and copies, q/k norm and rotary: fused = one "
         "launch a layer (as DRAFT_PROLOGUE's), else and with sglang = SGLang's kernels"),
    Knob("DRAFT_MLP", "draft_mlp", "a draft step's gate/up and SiLU-and-mul: fused = one launch (unquantized, "
         "<= 64 rows), else and with sglang = SGLang's two"),
    Knob("DRAFT_LM_HEAD", "draft_lm_head", "a draft step's LM head: bf16 = the model's; fp8 = a copy with a scale "
         "a row (half the bytes; moves acceptance only)"),
    Knob("DRAFT_VOCAB", "draft_vocab", "draft steps score only the N ids the server commits most, in tokens "
         "(0 = all)"),
    Knob("VERIFY_LOGITS", "verify_logits", "a sampled verify's logits as the acceptance reads them: fp32 = SGLang's "
         "copy; half = the LM head's dtype (half the bytes; fp32 where anything else reads or changes them)"),
    Knob("ACCEPT_LIST", "accept_list", "a verify row's first token list: candidates = p >= 1/2047 in one read, "
         "bins = by a histogram (same tokens)"),
    Knob("DENSE_HEADS", "dense_heads", "KV heads drafting over the whole prefix, LAYER.HEAD+... "
         "(selection.head_probe names them)"),
    Knob("MATCH_HEADS", "match_heads", "N@LAYER.HEAD+... or N@auto[:C] (C heads probed at warm-up, 11): KV heads "
         "also attending a draft token's N latest occurrences and the next positions"),
    Knob("OFFLOAD_HOST_GB", "offload_host_gb", "pinned host GB for parking running requests' KV instead of "
         "retracting them (stock decoding too); 0 = off"),
    Knob("STEP_TIMING", "timing_every", "log the mean GPU ms of each round phase every N rounds (one host "
         "sync each), in rounds; 0 = off"),
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
