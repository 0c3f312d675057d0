"""The k sparse draft steps of a PILLAR round, run by the *target* model.

Each step is an ordinary SGLang DECODE forward of the target model under
``PillarDraftBackend``, whose attention reads, per layer and KV head, only the request's
planned positions plus the recent tail and this round's tokens (``PlanState``). Sampled
drafts come from a compact proposal over at most C of the most probable tokens (``kernels/draft_sample.py``),
recorded for the verify's rejection sampling. One draft step — a forward and its draft
sampling — is captured as one CUDA graph per batch-size bucket (greedy and sampled), and a
round of k drafts replays it k times: everything a step depends on (its index, its input
token) lives in device buffers the step itself advances, so the replays need no host work
between them. Batches larger than the largest bucket run the same step eagerly. A round may
draft any count up to k (adaptive speculation) from the same graphs; the columns past it keep
stale values that the verify never accepts (``DraftRecord.num_drafts``).

One step per graph rather than the whole loop for capture time: loop graphs needed a capture per draft
count (14 captured forwards per batch size, 54 s of a server start on an H100 for SmolLM2); the extra
graph launches and the eager round prologue cost ~0.1% of a 34 ms round at 256 x 4K.

Under deterministic inference (``--enable-deterministic-inference``: every request has a sampling seed)
the draft noise is a function of the request's seed, the round's start position, the step and the
candidate slot (``seeded_noise``), so a seeded request drafts, and so emits, the same tokens on every
run; otherwise it comes from the global CUDA generator.

With SPARSESPEC_PLAIN_PATH=decode, a plain-decoding round (adaptive draft count 0) is one more
captured step per bucket: the same DECODE forward of the pending token with every request attending
its whole prefix, whose logits are copied out for SGLang's own sampler (``decode_logits``).
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from sglang_sparsespec.kernels.draft_sample import DraftSampleInputs, draft_sample_fwd
from sglang_sparsespec.kernels.token_match import match_lists_fwd, token_match_fwd

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.modes import DraftMlp, Prologue, SelectionPolicy
from sglang_sparsespec.selection.match_heads import parse_match_heads
from sglang_sparsespec.selection.state import PlanState
from sglang_sparsespec.sampling.rejection import DraftRecord

from .decode_graphs import DecodeGraphs, DecodeRows, Kind, decode_forward
from .draft_attention import DraftStepInputs, PillarDraftBackend
from .draft_lm_head import use_draft_vocab
from .draft_logits import draft_step
from .draft_mlp import fused_mlp
from .draft_qk import QK_IN_KERNEL, deferred_qk


@dataclass
class DraftOutput:
    """tokens [bs, k] int64 (draft j is the token after position seq_len + j); record: the
    proposal each draft was sampled from, None for an all-greedy batch (drafted by argmax)."""

    tokens: torch.Tensor
    record: DraftRecord | None


# murmur_hash32 columns of the seeded draft noise start here: above every column SGLang's seeded
# sampler (token ids, < vocabulary size) and its seeded verify coins (0..k + 1) hash, so a draft's
# noise never shares a draw with a coin or a stock sample at any position (columns are 32-bit).
SEED_COLUMN_BASE = 1 << 31


def seeded_columns(k: int, c: int, device) -> torch.Tensor:
    """[k, C] int64: the hash columns of draft step j's C noise slots (row j), disjoint across steps."""
    return SEED_COLUMN_BASE + torch.arange(k * c, dtype=torch.int64, device=device).view(k, c)


def seeded_noise(seed: torch.Tensor, round_start: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """Exp(1) draft noise [n, C] float32 from SGLang's murmur_hash32 (as its seeded verify coins):
    row i hashes (seed[i], round_start[i], columns) with seed / round_start [n] int64 and columns
    [C] int64 (``seeded_columns``' row of the step). The round's start position keys the draw, not
    the draft's own position: a later round drafts at positions an earlier round drafted past its
    rejection, and those drafts shaped that round's selection, which the later round's proposal
    reads. U = (h + 1/2) / 2^32 is uniform on (0, 1) to within 2^-33 and never 0 or 1, so -log U is
    finite and positive. Device tensors in, device tensors out, no host sync: safe inside a CUDA graph."""
    from sglang.kernels.ops.sampling.murmur_hash import murmur_hash32

    hashed = murmur_hash32(seed.to(torch.uint64), round_start.to(torch.uint64), columns)
    u = (hashed.to(torch.float64) + 0.5) * (1.0 / 2**32)
    return u.log_().neg_().to(torch.float32)


def sample_drafts(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_p: torch.Tensor,
    top_k: torch.Tensor,
    min_p: torch.Tensor,
    cand_ids: torch.Tensor,
    cand_q: torch.Tensor,
    q_tok: torch.Tensor,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """One draft token per row of ``logits`` [n, V] from its compact proposal (``kernels/draft_sample.py``),
    which is written into cand_ids / cand_q [n, C] and q_tok [n]; returns the tokens [n] int64.
    ``noise`` [n, C] Exp(1): the draw's noise (``seeded_noise``); None: from the default generator.

    Under tensor parallelism every rank must draft the same tokens (they are the next step's and the
    verify's inputs, paired across ranks by the model's all-reduces). They are equal by construction, as
    SGLang's own sampler relies on (no SYNC_TOKEN_IDS_ACROSS_TP by default): the logits are all-gathered to
    the full vocabulary on every rank, and the noise comes from the default CUDA generator, seeded on every
    rank with the random seed rank 0 broadcasts (TpModelWorker) and advanced by the same sequence of draws
    and graph replays on each rank (seeded noise is a function of values every rank holds).
    """
    n, c = cand_ids.shape
    if noise is None:
        noise = torch.empty((n, c), dtype=torch.float32, device=logits.device).exponential_()
    tokens = torch.empty(n, dtype=torch.int64, device=logits.device)
    draft_sample_fwd(
        DraftSampleInputs(logits, temperature, top_p, top_k, min_p, noise), tokens, cand_ids, cand_q, q_tok
    )
    return tokens


class PillarDraftRunner:
    def __init__(
        self,
        model_runner,
        cfg: PillarConfig,
        state: PlanState,
        max_bs: int,
        capture_bs: list[int],
        plain_decode: bool = False,
        seeded: bool = False,
    ):
        self.mr = model_runner
        self.cfg = cfg
        self.state = state
        self.k = cfg.num_steps
        self.max_bs = max_bs
        self.device = model_runner.device
        # The proposal's support: at most C of the most probable tokens (any proposal keeps verify exact).
        self.num_cand = min(cfg.draft_candidates, model_runner.model_config.vocab_size)
        self.seeded = seeded  # deterministic inference: draft noise from each request's seed
        with torch.device(self.device):
            self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int64)
            self.seq_lens = torch.ones(max_bs, dtype=torch.int64)
            self.temperature = torch.ones(max_bs, dtype=torch.float32)
            self.top_p = torch.ones(max_bs, dtype=torch.float32)
            self.top_k = torch.ones(max_bs, dtype=torch.int32)
            self.min_p = torch.zeros(max_bs, dtype=torch.float32)
            self.seed = torch.zeros(max_bs, dtype=torch.int64)  # read only when seeded
            self.noise_columns = seeded_columns(self.k, self.num_cand, self.device)
            # 1 = attend the plan, 0 = attend the whole prefix (dense drafting, adaptive/dense.py).
            self.sparse = torch.ones(max_bs, dtype=torch.int32)
            latest, _ = parse_match_heads(cfg.match_heads)
            self.inputs = DraftStepInputs(
                req_pool_indices=self.req_pool_indices,
                tail_start=torch.zeros(max_bs, dtype=torch.int32),
                sel_cnt=torch.zeros(max_bs, dtype=torch.int32),
                seq_lens=torch.ones(max_bs, dtype=torch.int64),
                match_pos=torch.full((max_bs, 2 * latest), -1, dtype=torch.int32) if latest else None,
                match_cnt=torch.zeros(max_bs, dtype=torch.int32) if latest else None,
                match_lists=torch.full((state.match.count, max_bs, 2 * latest), -1, dtype=torch.int32)
                if latest
                else None,
            )
            # The step body's state: the index of the next draft step ([1], for index_copy_) and its
            # input token (the bonus token, loaded by run(), then each step's draft).
            self.step = torch.zeros(1, dtype=torch.int64)
            self.tokens = torch.zeros(max_bs, dtype=torch.int64)
            self.out_tokens = torch.zeros((max_bs, self.k), dtype=torch.int64)
            # Step-major, so each draft step fills one contiguous [bs, ...] block.
            self.cand_ids = torch.zeros((self.k, max_bs, self.num_cand), dtype=torch.int64)
            self.cand_q = torch.zeros((self.k, max_bs, self.num_cand), dtype=torch.float32)
            self.q_tok = torch.ones((self.k, max_bs), dtype=torch.float32)
            # One step's proposal, written by the sampler and copied into the step's block above.
            self.step_ids = torch.zeros((max_bs, self.num_cand), dtype=torch.int64)
            self.step_q = torch.zeros((max_bs, self.num_cand), dtype=torch.float32)
            self.step_q_tok = torch.ones(max_bs, dtype=torch.float32)
            # Plain-decoding rounds as DECODE forwards (PlainPath.DECODE): the step's logits, copied out of
            # its graph for SGLang's sampler ([max_bs, V] fp32; only when that path is on).
            self.plain_logits = (
                torch.zeros((max_bs, model_runner.model_config.vocab_size), dtype=torch.float32)
                if plain_decode
                else None
            )
        # A private backend: draft attention never touches the target backend's metadata,
        # which the verify graph was captured with.
        self.backend = PillarDraftBackend(
            model_runner,
            state,
            self.inputs,
            oracle=cfg.policy is SelectionPolicy.ORACLE,
            plain=plain_decode,
            fused=cfg.draft_prologue is Prologue.FUSED,
        )
        # One draft step per (batch-size bucket, GREEDY / SAMPLED): all-greedy batches draft by argmax
        # and skip the draft records, which their verify never reads; PLAIN: the plain-decoding step.
        # The draft steps' attention normalizes and rotates q and k itself where it stores K/V in-kernel
        # (patches/draft_qk.py).
        self.qk_in_kernel = self.backend.stores_in_kernel and type(model_runner.model).__name__ in QK_IN_KERNEL
        self.fuse_mlp = cfg.draft_mlp is DraftMlp.FUSED  # gate/up and SiLU-and-mul in one launch (draft_mlp.py)
        # Draft steps score only the draft vocabulary's ids (draft_lm_head.py), before their graphs capture it.
        head = getattr(model_runner.model, "lm_head", None)
        self.vocab = use_draft_vocab(head, cfg.draft_vocab) if cfg.draft_vocab else None
        self.graphs = DecodeGraphs(model_runner, capture_bs, max_bs, "draft")
        self.capture_bs = self.graphs.capture_bs

    # ---- one draft step (eager body == captured body) -------------------------------
    def _begin_round(self, bs: int) -> None:
        """Per round, before the first step: the plans' tail starts in batch order and step 0."""
        rpi = self.req_pool_indices[:bs]
        # A dense row's tail starts at 0: its draft attention reads the whole prefix.
        self.inputs.tail_start[:bs] = self.state.tail_start[rpi] * self.sparse[:bs]
        if self.backend.oracle:  # only the oracle reads the counts in batch order
            self.inputs.sel_cnt[:bs] = self.state.sel_cnt[rpi]
        self.step.zero_()

    def _forward(self, bs: int, positions: torch.Tensor, whole_prefix: bool = False) -> torch.Tensor:
        """One DECODE forward of ``self.tokens`` at ``positions`` (its K/V written to the request's slot
        of each position) under the draft attention backend; the next-token logits [bs, V].
        ``whole_prefix``: every request attends its whole prefix (the plain-decoding step)."""
        self.inputs.seq_lens[:bs] = positions + 1
        self.backend.plan(bs, whole_prefix)
        rows = DecodeRows(self.tokens[:bs], positions, self.req_pool_indices[:bs], self.inputs.seq_lens[:bs])
        return decode_forward(self.mr, self.backend, rows)

    def _step(self, bs: int, greedy: bool) -> None:
        """Draft step ``self.step`` of the round: reads only device buffers and advances them (the
        step index, the input token), so replaying its graph k times runs k steps."""
        tokens = self.tokens[:bs]
        if self.inputs.match_pos is not None:  # the step's input token, looked up below each plan's tail
            inputs, state, rpi = self.inputs, self.state, self.req_pool_indices[:bs]
            token_match_fwd(
                state.token_ids.ids, rpi, tokens, inputs.tail_start[:bs], inputs.match_pos, inputs.match_cnt
            )
            match_lists_fwd(
                inputs.match_pos, inputs.match_cnt, state.sel_pos, state.sel_cnt, rpi, state.match.groups,
                inputs.match_lists,
            )  # fmt: skip
        with (
            draft_step(),
            deferred_qk() if self.qk_in_kernel else nullcontext(),
            fused_mlp() if self.fuse_mlp else nullcontext(),
        ):
            logits = self._forward(bs, self.seq_lens[:bs] + self.step)  # in the LM head's dtype
        drafted = logits.argmax(dim=-1) if greedy else self._sample_step(logits, bs)
        if self.vocab is not None and logits.shape[1] == self.vocab.size:  # picks over the draft vocabulary's ids
            drafted = self.vocab.to_ids(drafted)
            if not greedy:
                self.step_ids[:bs] = self.vocab.to_ids(self.step_ids[:bs])
        self.out_tokens[:bs].index_copy_(1, self.step, drafted.view(bs, 1))
        if not greedy:
            self.cand_ids[:, :bs].index_copy_(0, self.step, self.step_ids[:bs].unsqueeze(0))
            self.cand_q[:, :bs].index_copy_(0, self.step, self.step_q[:bs].unsqueeze(0))
            self.q_tok[:, :bs].index_copy_(0, self.step, self.step_q_tok[:bs].unsqueeze(0))
        tokens.copy_(drafted)
        self.step.add_(1)

    def _plain_step(self, bs: int) -> None:
        """A plain-decoding round's forward: the pending token at each request's ``seq_len``, attending
        its whole prefix through SGLang's decode kernel (``PillarDraftBackend.plan(whole_prefix=True)``),
        logits into ``plain_logits``."""
        self.plain_logits[:bs].copy_(self._forward(bs, self.seq_lens[:bs], whole_prefix=True))

    def _sample_step(self, logits: torch.Tensor, bs: int) -> torch.Tensor:
        noise = None
        if self.seeded:  # the step's columns picked on the device: the replays need no host work
            columns = self.noise_columns.index_select(0, self.step).view(-1)
            noise = seeded_noise(self.seed[:bs], self.seq_lens[:bs], columns)
        return sample_drafts(
            logits,
            self.temperature[:bs],
            self.top_p[:bs],
            self.top_k[:bs],
            self.min_p[:bs],
            self.step_ids[:bs],
            self.step_q[:bs],
            self.step_q_tok[:bs],
            noise,
        )

    # ---- capture / run -------------------------------------------------------------
    def capture(self) -> None:
        plain = self.plain_logits is not None
        with self.graphs.capturing("draft-step graphs" + (" and plain-decoding steps" if plain else "")):
            for bs in reversed(self.capture_bs):
                for kind in (Kind.GREEDY, Kind.SAMPLED):
                    greedy = kind is Kind.GREEDY
                    self.graphs.capture((bs, kind), lambda: self._step(bs, greedy), lambda: self._prepare(bs))
                if plain:
                    self.graphs.capture(
                        (bs, Kind.PLAIN), lambda: self._plain_step(bs), lambda: self._load_padding(0, bs)
                    )

    def _prepare(self, bs: int) -> None:
        """A capture's inputs: all padding, at step 0."""
        self._load_padding(0, bs)
        self._begin_round(bs)

    def _load_padding(self, start: int, end: int) -> None:
        """Padding rows read the all-zero request row 0 and sample greedily."""
        self.req_pool_indices[start:end] = 0
        self.seq_lens[start:end] = 1
        self.tokens[start:end] = 0
        self.temperature[start:end] = 1.0
        self.top_p[start:end] = 1.0
        self.top_k[start:end] = 1
        self.min_p[start:end] = 0.0
        self.seed[start:end] = 0
        self.sparse[start:end] = 1

    def _load(self, req_pool_indices, seq_lens, tokens) -> tuple[int, int | None, int]:
        """Copy a batch's pool rows, lengths and input tokens into the static buffers and pad them up to the
        captured batch size that serves it. Returns (bs, that size or None to run eagerly, padded size)."""
        bs = req_pool_indices.shape[0]
        graph_bs, padded = self.graphs.bucket(bs)
        self.req_pool_indices[:bs] = req_pool_indices
        self.seq_lens[:bs] = seq_lens
        self.tokens[:bs] = tokens
        if padded > bs:
            self._load_padding(bs, padded)
        return bs, graph_bs, padded

    def decode_logits(self, req_pool_indices, seq_lens, tokens) -> tuple[torch.Tensor, bool]:
        """A plain-decoding round (PlainPath.DECODE): one DECODE forward of ``tokens`` (the pending token
        of each request, at position ``seq_lens``) over every request's whole prefix, which writes that
        token's K/V. Returns the logits [bs, V] (fp32, valid until the next call) and whether a captured
        graph ran; no host synchronisation."""
        if self.plain_logits is None:
            raise RuntimeError("PILLAR plain decode path is off (SPARSESPEC_PLAIN_PATH=verify)")
        bs, graph_bs, _ = self._load(req_pool_indices, seq_lens, tokens)
        key = (graph_bs, Kind.PLAIN) if graph_bs is not None else None
        graphed = self.graphs.run(key, lambda: self._plain_step(bs))
        return self.plain_logits[:bs], graphed

    def run(
        self, req_pool_indices, seq_lens, bonus, sampling_info, steps: int, dense: torch.Tensor | None = None
    ) -> DraftOutput:
        """Draft ``steps`` (1..k) tokens for a decode batch; no host synchronisation. The output has
        k columns; those past ``steps`` are stale. ``dense``: [bs] int32 on the device, 1 where the
        request drafts over its whole prefix (None: every request uses its plan)."""
        if not 1 <= steps <= self.k:
            raise ValueError(f"draft count {steps} not in 1..{self.k}")
        bs, graph_bs, padded = self._load(req_pool_indices, seq_lens, bonus)
        self.temperature[:bs] = sampling_info.temperatures.view(-1)
        self.top_p[:bs] = sampling_info.top_ps
        self.top_k[:bs] = sampling_info.top_ks
        if dense is None:
            self.sparse[:bs] = 1
        else:
            torch.sub(1, dense, out=self.sparse[:bs])
        if sampling_info.min_ps is not None:
            self.min_p[:bs] = sampling_info.min_ps
        else:
            self.min_p[:bs] = 0.0
        if self.seeded:  # SGLang gives every request a seed under deterministic inference
            self.seed[:bs] = sampling_info.sampling_seed
        kind = Kind.of(sampling_info)
        greedy = kind is Kind.GREEDY
        self._begin_round(padded)
        key = (graph_bs, kind) if graph_bs is not None else None
        for _ in range(steps):
            self.graphs.run(key, lambda: self._step(bs, greedy))
        record = None
        if not greedy:
            record = DraftRecord(
                tokens=self.out_tokens[:bs],
                cand_ids=self.cand_ids[:, :bs].transpose(0, 1),
                cand_q=self.cand_q[:, :bs].transpose(0, 1),
                q_tok=self.q_tok[:, :bs].transpose(0, 1),
                num_drafts=steps,
            )
        return DraftOutput(tokens=self.out_tokens[:bs], record=record)
