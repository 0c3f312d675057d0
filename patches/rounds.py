"""Every forward the PILLAR worker runs: a prefill, or one decode round, read top-down from ``decode``.

A decode round (``Rounds.decode``) is planned (``RoundPlanner.shape``: its draft count and dense drafters),
run as one of four kinds, and ended in one place (``_end``):

* ``SPECULATIVE``: k sparse draft steps of the target model (``PillarDraftRunner``, one CUDA graph
  replayed k times), then the verify of the k + 1 tokens (``verify.forward``: TARGET_VERIFY graph,
  full attention, score capture), accepted by the round's ``PillarVerifyInput.accept`` and booked by
  ``verify.result``, then the selector writes each request's next plan;
* ``MIXED`` (``--pillar-batch-phases mixed``): a mixed-phase iteration, k + 1 forwards in which every
  request drafts or verifies (``rounds/mixed.py``, ``MixedRunner``);
* ``PLAIN`` (k = 0): one forward of the pending token through a second TARGET_VERIFY graph of width 1,
  SGLang's own shape for EAGLE's zero-step rounds, on its own attention backend (``VerifyPass``);
* ``PLAIN_DECODE`` (k = 0 under SPARSESPEC_PLAIN_PATH=decode, for the batches SGLang's sampler serves
  alone): a DECODE forward of the pending token over the whole prefix, sampled by SGLang's sampler.

Requests with per-token sampling state draft nothing and take row 0's token (``request_rounds``).
Everything stays on the GPU without a host synchronisation, so the overlap scheduler keeps running ahead.
"""

from __future__ import annotations

from contextlib import nullcontext
from enum import Enum

import torch
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_utils import default_tree_mask_mode
from sglang.srt.speculative.eagle_worker_common import build_eagle_verify_input

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.metrics import PillarMetrics
from sglang_sparsespec.rounds.clock import NoClock, RoundClock
from sglang_sparsespec.rounds.launch import RoundShape
from sglang_sparsespec.rounds.warmup import is_probe, is_warmup
from sglang_sparsespec.sampling.rejection import DraftRecord
from sglang_sparsespec.selection.match_heads import TokenIds
from sglang_sparsespec.selection.selectors import Selector

from . import verify
from .decode_graphs import host_rows
from .draft_runner import PillarDraftRunner
from .mixed_runner import MixedRunner, mixed_serves
from .probe_capture import HeadProbe
from .request_rounds import decode_path_serves
from .round_plan import RoundPlanner
from .verify import Pools, VerifyPass
from .verify_input import PillarVerifyInput


class RoundKind(Enum):
    SPECULATIVE = "speculative"
    MIXED = "mixed"
    PLAIN = "plain"
    PLAIN_DECODE = "plain_decode"


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
        plain: VerifyPass | None,
        max_bs: int,
        device: str,
        token_ids: TokenIds | None = None,
        probe: HeadProbe | None = None,
    ) -> None:
        self.cfg, self.pools, self.planner, self.clock, self.metrics = cfg, pools, planner, clock, metrics
        self.token_ids = token_ids  # with match heads: every token written at its position as it becomes known
        self.probe = probe  # with N@auto match heads: scores the heads in the warm-up's probe prefills
        self.selector, self.draft_runner, self.mixed, self.plain = selector, draft_runner, mixed, plain
        self.device = device
        mr = pools.target_worker.model_runner
        # The speculative rounds' verify: the target's own backend and TARGET_VERIFY graphs of width k + 1
        # (plain rounds verify on ``plain``, width 1).
        self.full = VerifyPass(mr.attn_backend, mr.decode_cuda_graph_runner, own=True)
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
        probing = self.probe is not None and is_probe(batch.reqs)
        with self.probe.capture(len(batch.reqs[0].origin_input_ids)) if probing else nullcontext():
            result = self.pools.target_worker.forward_batch_generation(batch)
        # spec-v2 convention: seq_lens counts tokens with KV; the sampled token has none yet.
        result.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        self.selector.after_prefill(batch.req_pool_indices, batch.seq_lens)
        if self.token_ids is not None:  # each request's whole known sequence (a cached prefix's ids included)
            self.token_ids.write_sequences(
                [r.req_pool_idx for r in batch.reqs], [[*r.origin_input_ids, *r.output_ids] for r in batch.reqs]
            )
        if self.draft_runner.vocab is not None and batch.input_ids is not None:  # prompt ids rank it too
            self.draft_runner.vocab.observe(batch.input_ids)
        if self.mixed is not None:
            self.mixed.tracker.forget([r.rid for r in batch.reqs])
        result.next_draft_input = self._relay(result.next_token_ids)
        return result

    # ---- one decode round ----------------------------------------------------------------
    def decode(self, batch, on_publish, grammar_barrier):
        shape = self.planner.shape(batch)
        kind = self._kind(batch, shape)
        if self.token_ids is not None and kind is not RoundKind.SPECULATIVE and batch.seq_lens.shape[0]:
            # The pending token, committed at seq_len (a speculative round writes it with its drafts).
            self.token_ids.write_chain(batch.req_pool_indices, batch.seq_lens, batch.spec_info.bonus_tokens[:, None])
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
            full = shape.steps == self.cfg.num_steps and shape.dense is None
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
        if self.draft_runner.vocab is not None:  # each request's committed token of the round (from p)
            self.draft_runner.vocab.observe(bonus)
        return result

    # ---- the four kinds: each returns (SGLang's batch result, each request's next pending token [bs]) --
    def _speculative(self, batch, shape: RoundShape, grammar_barrier):
        steps, dense, num_drafts = shape
        draft_input = batch.spec_info
        bs = batch.seq_lens.shape[0]
        verify_lens = batch.seq_lens
        self.clock.start(bs)
        if dense is not None:
            dense = host_rows(dense, torch.int32, self.device)
        chain = self.draft_runner.run(
            batch.req_pool_indices, batch.seq_lens, draft_input.bonus_tokens, batch.sampling_info, steps, dense
        )
        self.clock.drafted()
        if self.token_ids is not None:  # the pending token at seq_len, its drafts at the positions they are verified
            # at: one write after the draft steps, whose scans read only below the tail (seq_len is in it).
            pending = torch.cat([draft_input.bonus_tokens[:, None].to(chain.tokens.dtype), chain.tokens], dim=1)
            self.token_ids.write_chain(batch.req_pool_indices, batch.seq_lens, pending)
        verify_input = build_eagle_verify_input(
            batch,
            draft_input,
            self._chain_parents[:bs],
            self._chain_scores_index[:bs],
            chain.tokens,
            None,  # the draft record below replaces full-vocabulary draft distributions
            target_worker=self.pools.target_worker,
            topk=1,
            num_steps=self.num_steps,
            num_draft_tokens=self.num_draft_tokens,
            tree_mask_mode=default_tree_mask_mode(),
            device=self.device,
        )
        # Requests with per-token sampling state take row 0 only (``RoundShape.num_drafts``).
        num_drafts = None if num_drafts is None else host_rows(num_drafts, torch.int32, self.device)
        batch.spec_info = PillarVerifyInput.extend(verify_input, chain.record, num_drafts)
        fwd = verify.forward(batch, self.pools, self.full, grammar_barrier)
        self.clock.verified()
        result, bonus = self._accept(batch, fwd, self.num_steps)
        self.clock.accepted()
        # Before the round's end publishes: the selection must read this round's seq_lens before the
        # schedule stream reuses them.
        self.selector.after_verify(batch.req_pool_indices, verify_lens, result.new_seq_lens)
        return result, bonus

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
        recent tail grows by the new token), verified on the plain rounds' own width-1 pass."""
        self.clock.start_plain()
        record = None if batch.sampling_info.is_all_greedy else self._no_drafts(batch.seq_lens.shape[0])
        batch.spec_info = PillarVerifyInput.plain(batch, self.plain.attn_backend, record, self.device)
        return self._accept(batch, verify.forward(batch, self.pools, self.plain, grammar_barrier), 0)

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
    @staticmethod
    def _accept(batch, fwd: verify.VerifyForward, num_steps: int):
        """The verify input's acceptance of a verify forward of ``num_steps`` + 1 tokens per request,
        and its result."""
        predict, accept_lens, accept_index = batch.spec_info.accept(batch, fwd.logits_output, fwd.grammar_mask)
        return verify.result(batch, fwd, predict, accept_lens, accept_index, num_steps)

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
