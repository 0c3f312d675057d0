"""The choices of PILLAR's enumerated knobs (``config.KNOBS``): each value is the flag's and the variable's text."""

from __future__ import annotations

from enum import Enum


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


class Prologue(str, Enum):
    """Where a draft step's or a verify's K/V store, q/k norm and rotary embedding run (patches/draft_qk.py)."""

    # In PILLAR's kernels (the draft's sparse attention, the verify's prologue), where SGLang's KV pool and the
    # model allow it; else SGLang's kernels.
    FUSED = "fused"
    # SGLang's own kernels, one launch each a layer.
    SGLANG = "sglang"


class DraftMlp(str, Enum):
    """How a draft step's MLP runs its gate/up projection and SiLU-and-mul (patches/draft_mlp.py)."""

    # One Triton launch with the activation as the GEMM's epilogue, where the layer allows it; else SGLang's.
    FUSED = "fused"
    # SGLang's GEMM, then its activation kernel.
    SGLANG = "sglang"


class DraftLmHead(str, Enum):
    """The weights a draft step's LM head reads (patches/draft_lm_head.py)."""

    # The target's own LM head.
    BF16 = "bf16"
    # An fp8 copy with one scale an output row (half the bytes; drafts only, so acceptance only).
    FP8 = "fp8"


class VerifyLogits(str, Enum):
    """The dtype the verify's logits reach the acceptance in (patches/draft_logits.py)."""

    # SGLang's fp32 copy of every row, which every consumer reads.
    FP32 = "fp32"
    # In the LM head's dtype (bf16 / fp16): the acceptance's kernels widen each value as they load it (exact);
    # batches whose logits something else reads or changes (penalties, logit bias, grammars, logprobs, custom
    # processors, greedy verifies) get the fp32 copy first.
    HALF = "half"


class AcceptList(str, Enum):
    """How the target filter builds each verify row's first list (kernels/target_filter.py): same tokens either way."""

    # The tokens of p >= 1 / (list cap - 1), one read (kernels/top_candidates.py): half BINS's time on peaked rows.
    CANDIDATES = "candidates"
    # Level 1's top bins: a histogram sizes the list, a scan gathers it.
    BINS = "bins"
