"""Every forward the PILLAR worker runs: a prefill, or one decode round, read top-down from ``decode``.

A decode round (``Rounds.decode``) is planned (``RoundPlanner.shape``: its draft count, dense drafters and
boosted selections), run as one of four kinds, and ended in one place (``_end``):

* ``SPECULATIVE``: k sparse draft steps of the target model (``PillarDraftRunner``, one CUDA graph
  replayed k times), then SGLang's topk=1 EAGLE verify of the k + 1 tokens (TARGET_VERIFY graph,
  full attention, score capture) whose acceptance runs in ``verify_sample`` from the round's
  ``PillarVerifyInput``, then the selector writes each request's next plan;
* ``MIXED`` (``--pillar-batch-phases mixed``): a mixed-phase iteration, k + 1 forwards in which every
  request drafts or verifies (``rounds/mixed.py``, ``MixedRunner``);
* ``PLAIN`` (k = 0): one forward of the pending token through a second TARGET_VERIFY graph of width 1,
  SGLang's own shape for EAGLE's zero-step rounds, on its own attention backend swapped in for the round;
* ``PLAIN_DECODE`` (k = 0 under SPARSESPEC_PLAIN_PATH=decode, for the batches SGLang's sampler serves
  alone): a DECODE forward of the pending token over the whole prefix, sampled by SGLang's sampler.

Requests with per-token sampling state draft nothing and take row 0's token (``request_rounds``).
Everything stays on the GPU without a host synchronisation, so the overlap scheduler keeps running ahead.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

import torch
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_utils import default_tree_mask_mode
from sglang.srt.speculative.eagle_worker_common import build_eagle_verify_input
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.metrics import PillarMetrics
from sglang_sparsespec.rounds.clock import NoClock, RoundClock
from sglang_sparsespec.rounds.launch import RoundShape
from sglang_sparsespec.rounds.warmup import is_warmup
from sglang_sparsespec.sampling.rejection import DraftRecord
from sglang_sparsespec.selection.selectors import Selector

from .contacts import run_eagle_verify
from .decode_graphs import host_rows
from .draft_runner import PillarDraftRunner
from .mixed_runner import MixedRunner, mixed_serves
from .request_rounds import decode_path_serves
from .round_plan import RoundPlanner
from .verify_input import PillarVerifyInput


class RoundKind(Enum):
    SPECULATIVE = "speculative"
    MIXED = "mixed"
    PLAIN = "plain"
    PLAIN_DECODE = "plain_decode"


@dataclass
class PlainState:
    """The width-1 verify used by plain rounds: its own backend and graph runner (None without CUDA graphs)."""

    attn_backend: Any
    graph_runner: Any


@dataclass
class Pools:
    """What SGLang's verify reads besides the batch: the target worker, its KV pools and plan stream."""

    target_worker: Any
    req_to_token_pool: Any
    token_to_kv_pool_allocator: Any
    plan_stream: Any
    plan_stream_ctx: Any


class Rounds:
    """The module docstring's forwards, for one worker whose start-up built the parts they run on."""

    def __init__(
        self,
        cfg: PillarConfig,
        pools: Pools,
        planner: RoundPlanner,
        clock: RoundClock | NoClock,
        metrics: PillarMetrics,
        selector: Selector,
        draft_runner: PillarDraftRunner,
        mixed: MixedRunner | None,
        plain: PlainState | None,
        max_bs: int,
        device: str,
    ) -> None:
        self.cfg, self.pools, self.planner, self.clock, self.metrics = cfg, pools, planner, clock, metrics
        self.selector, self.draft_runner, self.mixed, self.plain = selector, draft_runner, mixed, plain
        # EAGLEWorkerV2._build_trivial_verify_input (the plain round's verify input) is called on this
        # object and reads exactly these three fields.
        self._target_worker = pools.target_worker
        self.device = device
        self.topk = 1
        k, k_idx = cfg.num_steps, torch.arange(cfg.num_steps, dtype=torch.long, device=device)
        # The chain's tree (topk=1: each draft's parent is the one before it), for every request row.
        self._chain_parents = (k_idx - 1).repeat(max_bs, 1)  # [max_bs, k]
        self._chain_scores_index = k_idx.repeat(max_bs, 1)  # [max_bs, k]
        self.num_steps, self.num_draft_tokens = k, k + 1
        # Constant per-request rows handed to the scheduler each round (``_relay`` and the plain decode
        # round's accept lengths): views of these instead of a fresh tensor, and a launch, per round.
        self._relay_index = torch.zeros((max_bs, 1), dtype=torch.int64, device=device)
        self._relay_p = torch.ones((max_bs, 1), dtype=torch.float32, device=device)
        self._ones = torch.ones(max_bs, dtype=torch.int32, device=device)

    # ---- prefill -------------------------------------------------------------------------
    def prefill(self, batch, on_publish):
        """SGLang's own prefill forward; each request's plan starts as a streaming plan (sinks + recent
        window), so its first round already drafts sparsely."""
        self.clock.interrupt()
        result = self.pools.target_worker.forward_batch_generation(batch)
        # spec-v2 convention: seq_lens counts tokens with KV; the sampled token has none yet.
        result.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        self.selector.after_prefill(batch.req_pool_indices, batch.seq_lens)
        if self.mixed is not None:
            self.mixed.tracker.forget([r.rid for r in batch.reqs])
        result.next_draft_input = self._relay(result.next_token_ids)
        return result

    # ---- one decode round ----------------------------------------------------------------
    def decode(self, batch, on_publish, grammar_barrier):
        shape = self.planner.shape(batch)
        kind = self._kind(batch, shape)
        if self.mixed is not None and kind is not RoundKind.MIXED:
            self.mixed.tracker.invalidate()  # this round rewrites the KV past every committed length
        if not is_warmup(batch.reqs):
            if kind is RoundKind.MIXED:
                self.metrics.mixed_rounds += 1
            elif kind is RoundKind.PLAIN_DECODE:
                self.metrics.plain_decode_rounds += 1
        if kind is RoundKind.SPECULATIVE:
            result, bonus = self._speculative(batch, shape, grammar_barrier)
        elif kind is RoundKind.MIXED:
            result, bonus = self._mixed(batch)
        elif kind is RoundKind.PLAIN:
            result, bonus = self._plain(batch, grammar_barrier)
        else:
            result, bonus = self._plain_decode(batch)
        return self._end(result, bonus, on_publish, mixed=kind is RoundKind.MIXED)

    def _kind(self, batch, shape: RoundShape) -> RoundKind:
        if self.mixed is not None:
            full = shape.steps == self.cfg.num_steps and shape.dense is None and shape.boost is None
            if full and not batch.forward_mode.is_idle() and mixed_serves(batch):
                return RoundKind.MIXED
        if shape.steps > 0:
            return RoundKind.SPECULATIVE
        if self.draft_runner.plain_logits is not None and decode_path_serves(batch):
            return RoundKind.PLAIN_DECODE
        return RoundKind.PLAIN

    def _end(self, result, bonus: torch.Tensor, on_publish, mixed: bool):
        """Every decode round ends here: the clock's last event, then the new lengths published (which
        lets the schedule stream start preparing the next batch), then the token each request's next
        round starts from relayed to the scheduler."""
        if mixed:
            self.clock.end_mixed()
        else:
            self.clock.end()
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        result.next_draft_input = self._relay(bonus)
        return result

    # ---- the four kinds: each returns (SGLang's batch result, each request's next pending token [bs]) --
    def _speculative(self, batch, shape: RoundShape, grammar_barrier):
        steps, dense, boost, counts = shape
        draft_input = batch.spec_info
        bs = batch.seq_lens.shape[0]
        verify_lens = batch.seq_lens
        self.clock.start(bs)
        if dense is not None:
            dense = host_rows(dense, torch.int32, self.device)
        ratio = None
        if boost is not None:  # the budget ratio of each request's next selection
            ratio = host_rows([self.cfg.boost_ratio if b else self.cfg.budget_ratio for b in boost], torch.float64, self.device)
        drafts = self.draft_runner.run(
            batch.req_pool_indices, batch.seq_lens, draft_input.bonus_tokens, batch.sampling_info, steps, dense
        )
        self.clock.drafted()
        chain = build_eagle_verify_input(
            batch,
            draft_input,
            self._chain_parents[:bs],
            self._chain_scores_index[:bs],
            drafts.tokens,
            None,  # the draft record below replaces full-vocabulary draft distributions
            target_worker=self.pools.target_worker,
            topk=1,
            num_steps=self.num_steps,
            num_draft_tokens=self.num_draft_tokens,
            tree_mask_mode=default_tree_mask_mode(),
            device=self.device,
        )
        # Requests with per-token sampling state take row 0 only (``RoundShape.drafts``).
        counts = None if counts is None else host_rows(counts, torch.int32, self.device)
        batch.spec_info = PillarVerifyInput.extend(chain, drafts.record, counts, self.clock.verify_callback)
        result = self._verify(batch, grammar_barrier, self.num_steps)
        self.clock.accepted()
        # Before the round's end publishes: the selection must read this round's seq_lens before the
        # schedule stream reuses them.
        self.selector.after_verify(batch.req_pool_indices, verify_lens, result.new_seq_lens, ratio)
        return result, result.next_draft_input.bonus_tokens

    def _mixed(self, batch):
        """k + 1 forwards, each request verified once; timed whole (the verify shares the draft forwards)."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        self.clock.start(batch.seq_lens.shape[0])
        out = self.mixed.run(batch)
        result = GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=None),
            next_token_ids=out.emitted.to(torch.int32).view(-1),
            can_run_cuda_graph=out.graphed,
            speculative_num_draft_tokens=self.num_draft_tokens,
            accept_lens=out.accept_len.to(torch.int32),
            new_seq_lens=out.length.to(batch.seq_lens.dtype),
        )
        return result, out.root.to(torch.int32)

    def _plain(self, batch, grammar_barrier):
        """One token per request from the target's full forward (no drafts, plans unchanged: their
        recent tail grows by the new token)."""
        self.clock.start_plain()
        mr = self.pools.target_worker.model_runner
        saved = mr.attn_backend, mr.decode_cuda_graph_runner
        mr.attn_backend, mr.decode_cuda_graph_runner = self.plain.attn_backend, self.plain.graph_runner
        try:
            # SGLang's one-token verify input rooted at the pending (bonus) token, as EAGLE builds it for
            # its zero-step rounds, under the backend swapped in above.
            record = None if batch.sampling_info.is_all_greedy else self._no_drafts(batch.seq_lens.shape[0])
            batch.spec_info = PillarVerifyInput.extend(EAGLEWorkerV2._build_trivial_verify_input(self, batch), record)
            result = self._verify(batch, grammar_barrier, 0)
        finally:
            mr.attn_backend, mr.decode_cuda_graph_runner = saved
        return result, result.next_draft_input.bonus_tokens

    def _plain_decode(self, batch):
        """A plain round as stock decodes: one DECODE forward of the pending tokens over every request's
        whole prefix (the draft step's graph), then SGLang's own sampler on its logits: the token stock
        would sample from these logits, so the output stays the target's. Result layout as the width-1
        verify's: one token per request, accept length 1."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        self.clock.start_plain()
        logits, graphed = self.draft_runner.decode_logits(
            batch.req_pool_indices, batch.seq_lens, batch.spec_info.bonus_tokens
        )
        out = LogitsProcessorOutput(next_token_logits=logits)
        # The pending token's position seeds deterministic sampling, as stock's decode positions do.
        sampler = self.pools.target_worker.model_runner.sampler
        tokens = sampler(out, batch.sampling_info, False, [], [], batch.seq_lens).to(torch.int32)
        result = GenerationBatchResult(
            logits_output=out,
            next_token_ids=tokens,
            can_run_cuda_graph=graphed,
            speculative_num_draft_tokens=1,
            accept_lens=self._head(self._ones, tokens.shape[0]),  # read only (copied to the host)
            new_seq_lens=batch.seq_lens + 1,
        )
        return result, tokens

    # ---- helpers ---------------------------------------------------------------------------
    def _verify(self, batch, grammar_barrier, num_steps: int):
        """SGLang's topk=1 EAGLE verify of a chain of ``num_steps`` + 1 tokens per request."""
        p = self.pools
        return run_eagle_verify(
            batch,
            target_worker=p.target_worker,
            req_to_token_pool=p.req_to_token_pool,
            token_to_kv_pool_allocator=p.token_to_kv_pool_allocator,
            plan_stream=p.plan_stream,
            plan_stream_ctx=p.plan_stream_ctx,
            topk=1,
            num_steps=num_steps,
            num_draft_tokens=num_steps + 1,
            device=self.device,
            metadata_ready_pre_pad=False,
            finalize_tree_path=True,
            grammar_barrier=grammar_barrier,
        )

    def _no_drafts(self, bs: int) -> DraftRecord:
        # Zero drafts: every row's token comes from the target distribution itself.
        c = self.draft_runner.num_cand
        with torch.device(self.device):
            return DraftRecord(
                tokens=torch.zeros((bs, 0), dtype=torch.int64),
                cand_ids=torch.zeros((bs, 0, c), dtype=torch.int64),
                cand_q=torch.zeros((bs, 0, c), dtype=torch.float32),
                q_tok=torch.zeros((bs, 0), dtype=torch.float32),
            )

    def _relay(self, bonus_tokens: torch.Tensor) -> EagleDraftInput:
        # topk_p / topk_index must exist, one row per request, though PILLAR relays only the bonus token:
        # the scheduler slices and concatenates them (filter/merge), copies them into its future map and
        # tells an idle input by their length; nothing reads their values, so constant rows serve.
        bs = bonus_tokens.shape[0]
        return EagleDraftInput(
            bonus_tokens=bonus_tokens,
            topk_index=self._head(self._relay_index, bs),
            topk_p=self._head(self._relay_p, bs),
        )

    @staticmethod
    def _head(constant: torch.Tensor, bs: int) -> torch.Tensor:
        """The first ``bs`` rows of a constant per-request buffer (sized by --max-running-requests)."""
        if bs > constant.shape[0]:
            raise RuntimeError(f"PILLAR: a batch of {bs} requests exceeds max running requests {constant.shape[0]}")
        return constant[:bs]
