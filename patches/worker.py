"""``PillarWorker``: SGLang's speculative-worker contract for PILLAR.

One decode round (all on the GPU, no host synchronisation, overlap-scheduler safe):

1. draft  — ``PillarDraftRunner``: k sparse DECODE steps of the target model (one CUDA
            graph), sampling each draft token from the sparse model's distribution;
2. verify — SGLang's own topk=1 EAGLE verify (TARGET_VERIFY graph of the target model,
            full attention over all k+1 tokens, exact rejection sampling against the
            recorded draft distributions, bonus token when all drafts pass);
3. select — the policy's ``Selector`` writes each request's next plan; PillarAttn takes
            the top-K positions per (layer, KV head) from the attention mass the verify
            pass captured (``VerifyScoreSink``, recorded inside the TARGET_VERIFY graph).

Prefill batches run the plain target forward and seed each request with a streaming
plan (sinks + recent window) so the first round after prefill is already sparse.

Adaptive speculation (``adaptive/policy.py``, on unless SPARSESPEC_ADAPTIVE_STEPS=off) picks each
round's draft count from the candidates: k >= 1 drafts k tokens (verify width stays k_max + 1,
the undrafted columns are never accepted); k = 0 is plain decoding: one forward of the pending
token through a second TARGET_VERIFY graph of width 1 (SGLang's own shape for EAGLE's zero-step
rounds), with its own attention backend, swapped in for that round only; with
SPARSESPEC_PLAIN_PATH=decode, a DECODE forward of the pending token over the whole prefix (the draft
step's graph) sampled by SGLang's own sampler, for the batches that sampler serves alone. Requests with
per-token sampling state draft nothing and take row 0's token (``request_rounds``); a batch of only
such requests runs a plain round.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import torch
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_utils import default_tree_mask_mode
from sglang.srt.speculative.eagle_worker_common import (
    build_eagle_verify_input,
    run_eagle_verify,
)
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
from sglang.srt.speculative.spec_utils import get_plan_stream
from sglang_sparsespec.kernels._common import default_num_splits

from sglang_sparsespec.config import (
    DraftGrid,
    PillarConfig,
    PlainPath,
    ScoreRows,
    SelectionPolicy,
    VerifyKernel,
)
from sglang_sparsespec.metrics import PillarMetrics
from sglang_sparsespec.selection.scores import VerifyScoreSink
from sglang_sparsespec.selection.selectors import Selector, make_selector
from sglang_sparsespec.selection.state import PlanState
from sglang_sparsespec.adaptive.policy import SpeculationPolicy
from sglang_sparsespec.adaptive.cost_cache import CostFile
from sglang_sparsespec.adaptive.dense import DenseChooser
from sglang_sparsespec.sampling.rejection import DraftRecord
from sglang_sparsespec.rounds.launch import AdaptiveRound, LaunchedRounds, RoundShape
from sglang_sparsespec.rounds.clock import make_clock
from sglang_sparsespec.rounds.timing import format_report
from sglang_sparsespec.rounds.warmup import is_warmup, warmup_steps

from .draft_runner import PillarDraftRunner
from .mixed_runner import MixedRunner, mixed_serves
from .request_rounds import decode_path_serves, draft_counts
from .sampler_warmup import build_sampling_kernels
from .slot_warmup import build_slot_kernels
from .tp_agree import RoundAgreement
from .triton_verify import VerifyHooks, attach_verify, new_verify_backend, verify_backend
from .verify_input import PillarVerifyInput

logger = logging.getLogger(__name__)
# Rounds between the log lines that count which draft count each round ran (and the cost-file writes).
PATH_LOG_EVERY = 2000


@dataclass
class PlainState:
    """The width-1 verify used by plain-decoding rounds: its own backend and graph runner (None
    without CUDA graphs)."""

    attn_backend: Any
    graph_runner: Any


def seeded_config(cfg: PillarConfig, server_args) -> PillarConfig:
    """Under deterministic inference every round drafts num_steps: round shapes chosen from measured
    times would make a seeded request's tokens depend on timing."""
    if not (server_args.enable_deterministic_inference and cfg.adaptive):
        return cfg
    logger.info("PILLAR: deterministic inference runs every round with %d drafts", cfg.num_steps)
    return replace(cfg, adaptive_steps="off", force_steps=-1, boost_ratio=0.0)


class PillarWorker(BaseSpecWorker):
    def __init__(self, server_args, gpu_id, ps, nccl_port, target_worker):
        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.device = server_args.device
        self.cfg = seeded_config(PillarConfig.from_env(server_args.speculative_num_steps), server_args)
        self.topk = 1
        self.speculative_num_steps = self.cfg.num_steps
        self.speculative_num_draft_tokens = self.cfg.num_steps + 1
        self.plan_stream, self.plan_stream_ctx = get_plan_stream(self.device)
        self.state: PlanState | None = None
        self.selector: Selector | None = None
        self.draft_runner: PillarDraftRunner | None = None
        self.plain: PlainState | None = None
        self.policy: SpeculationPolicy | None = None
        self.dense: DenseChooser | None = None  # with the policy: which requests draft densely
        self.metrics = PillarMetrics(self.cfg.num_steps)  # /server_info and Prometheus (patches/metrics.py)
        self.rounds = LaunchedRounds()  # decode rounds awaiting their accept counts (on_verify_complete_cpu)
        self.warmup_rounds = 0  # start-up warm-up rounds so far (patches/serve_warmup.py)
        self.mixed: MixedRunner | None = None  # --pillar-batch-phases mixed
        self.sink: VerifyScoreSink | None = None
        self.cost_file: CostFile | None = None  # where the policy's measured costs persist (rank 0 writes)
        if self.cfg.adaptive:
            self.policy = SpeculationPolicy(
                self.cfg.step_candidates,
                floor_quantile=self.cfg.floor_quantile,
                premium=self.cfg.spec_premium,
                mixed_steps=self.cfg.num_steps if self.cfg.mixed else None,
            )
            self.agreement = RoundAgreement.for_tp_group()
            self.cost_file = CostFile.resolve(self.cfg.cost_cache, self._setup_identity())
            self._restore_costs()
        # One clock times every round for the cost model (adaptive) and the phase report (step timing).
        self.clock = make_clock(
            lambda: torch.cuda.Event(enable_timing=True), self.cfg.timing_every, self._phase_report, self.cfg.adaptive
        )
        logger.info("PILLAR config: %s", self.cfg)
        build_sampling_kernels(
            server_args.sampling_backend, self.model_runner.model_config.vocab_size, self.device
        )

    def _setup_identity(self) -> dict[str, Any]:
        """What moves this server's round costs (``adaptive/cost_cache.py``)."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            plugin = version("sglang-sparsespec")
        except PackageNotFoundError:
            plugin = "unknown"
        sa = self.server_args
        return {
            "gpu": torch.cuda.get_device_name(self.model_runner.gpu_id),
            "model": sa.model_path,
            "tp_size": sa.tp_size,
            "attention_backend": sa.attention_backend,
            "kv_dtype": str(self.model_runner.kv_cache_dtype),
            "step_candidates": list(self.cfg.step_candidates),
            "plain_path": self.cfg.plain_path.value,
            # The selection's cadence and budget move the verify (capture passes) and draft (plan size) costs.
            "policy": self.cfg.policy.value,
            "select_every": self.cfg.select_every,
            "budget_ratio": self.cfg.budget_ratio,
            "min_budget": self.cfg.min_budget,
            "batch_phases": self.cfg.batch_phases.value,  # a mixed iteration prices the full-length round
            "plugin": plugin,
        }

    def _restore_costs(self) -> None:
        cells = self.cost_file.load() if self.cost_file is not None else None
        if not cells:
            return
        try:
            n = self.policy.table.restore(cells)
        except ValueError as e:  # a hand-edited or truncated file: measure from scratch
            logger.warning("PILLAR costs in %s not used: %s", self.cost_file.path, e)
            return
        logger.info("PILLAR costs: %d measured cells from %s", n, self.cost_file.path)

    def _save_costs(self) -> None:
        # Rank 0's costs decide every rank's round (tp_agree), so only rank 0 writes.
        if self.cost_file is None or self.agreement.rank != 0:
            return
        try:
            self.cost_file.save(self.policy.table.export())
        except OSError as e:
            logger.warning("PILLAR costs not saved to %s (%s); not trying again", self.cost_file.path, e)
            self.cost_file = None

    def _phase_report(self, report) -> None:
        logger.info(format_report(report))
        self.metrics.phases_timed(report)

    @property
    def draft_worker(self):
        # The target model drafts for itself: there is no draft worker or draft model.
        return None

    # ---- start-up, in the order the scheduler calls it ------------------------------
    def alloc_memory_pool(self, **kwargs):
        self.req_to_token_pool, self.token_to_kv_pool_allocator = self._target_worker.get_memory_pool()
        self.max_context_len = self.req_to_token_pool.req_to_token.shape[1]
        self.kmax = self.cfg.max_budget(self.max_context_len)
        self.max_bs = self.model_runner.max_running_requests
        if torch.device(self.device).type == "cuda":
            try:
                build_slot_kernels(self.req_to_token_pool.req_to_token)
            except Exception as exc:  # a warm-up: serving still works, the first unaligned prefill compiles
                logger.warning("PILLAR: KV slot kernels not pre-built (%s); a prefill may compile them", exc)
        k_idx = torch.arange(self.cfg.num_steps, dtype=torch.long, device=self.device)
        self._chain_parents = (k_idx - 1).repeat(self.max_bs, 1)
        self._chain_scores_index = k_idx.repeat(self.max_bs, 1)
        # Constant per-request rows handed to the scheduler each round (see _next_draft_input and the plain
        # round's accept lengths): views of these instead of a fresh tensor, and a launch, per round.
        self._relay_index = torch.zeros((self.max_bs, 1), dtype=torch.int64, device=self.device)
        self._relay_p = torch.ones((self.max_bs, 1), dtype=torch.float32, device=self.device)
        self._ones = torch.ones(self.max_bs, dtype=torch.int32, device=self.device)

    def init_attention_backends(self):
        mc = self.model_runner.model_config
        backend = verify_backend(self.model_runner.attn_backend)
        rows = self.req_to_token_pool.req_to_token.shape[0]
        if self.cfg.mixed:  # a spare last row that padded verify segments select into
            rows += 1
        per_head = self.cfg.policy is SelectionPolicy.PILLAR
        self.state = PlanState.allocate(
            rows, mc.num_hidden_layers, backend.num_kv_head, per_head, self.kmax, self.device
        )
        sink = None
        if self.cfg.policy.uses_verify_scores:
            # The total prefix of one verify batch is bounded by the KV pool and by the
            # widest batch times the context length (+1 slot per padded graph row).
            max_rows = self._max_graph_bs()
            cap = min(self.token_to_kv_pool_allocator.size, max_rows * self.max_context_len) + max_rows + 1
            sink = VerifyScoreSink(
                num_layers=mc.num_hidden_layers,
                num_kv_heads=backend.num_kv_head,
                num_q_heads=backend.num_head,
                cap=cap,
                max_q_rows=max_rows * self.speculative_num_draft_tokens,
                per_layer=per_head,
                device=self.device,
                last_row_only=self.cfg.score_rows is ScoreRows.LAST,
            )
        # Must precede the target's CUDA-graph capture (the scheduler calls init_cuda_graphs
        # after every backend is initialised), so the verify kernels are recorded into the
        # TARGET_VERIFY graph.
        attach_verify(backend, VerifyHooks(sink, split_kernel=self.cfg.verify_kernel is VerifyKernel.SPLIT))
        self.selector = make_selector(self.cfg, self.state, sink)
        self.sink = sink
        if self.policy is not None:
            h_kv, dev = backend.num_kv_head, torch.device(self.device)
            kv_bytes = mc.num_hidden_layers * h_kv * mc.head_dim * 2 * self.model_runner.kv_cache_dtype.itemsize
            # The draft kernel's own split rule (sparse_decode_fwd's default), so the policy prices
            # a dense request's programs as the kernel will cut them; the planned grid spreads a long
            # plan over more programs instead (its pool's limit is left to the measured round times).
            splits = None
            if self.cfg.draft_grid is DraftGrid.STATIC:
                splits = lambda bs: default_num_splits(bs * h_kv, dev)  # noqa: E731
            self.dense = DenseChooser(
                self.cfg.budget, kv_bytes, mc.num_hidden_layers, splits, self.cfg.num_steps, self.cfg.boosts
            )

    def _capture_bs(self) -> list[int]:
        from sglang.srt.model_executor.runner import get_batch_sizes_to_capture

        if self.server_args.disable_cuda_graph:
            return []
        return list(get_batch_sizes_to_capture(self.model_runner)[0])

    def _max_graph_bs(self) -> int:
        # Padded verify graphs may run wider than max_running_requests.
        return max([self.max_bs, *self._capture_bs()])

    def init_cuda_graphs(self):
        capture_bs = self._capture_bs()
        self.draft_runner = PillarDraftRunner(
            self.model_runner,
            self.cfg,
            self.state,
            max_bs=self.max_bs,
            capture_bs=capture_bs,
            plain_decode=0 in self.cfg.step_candidates and self.cfg.plain_path is PlainPath.DECODE,
            seeded=self.server_args.enable_deterministic_inference,
        )
        if capture_bs:
            self.draft_runner.capture()
        if self.cfg.mixed:
            scratch = self.state.sel_cnt.shape[0] - 1
            self.mixed = MixedRunner(self.draft_runner, self.state, self.selector, self.sink, scratch)
            if capture_bs:
                self.mixed.capture()
        if 0 in self.cfg.step_candidates:
            self.plain = self._build_plain_state()

    def _build_plain_state(self) -> PlainState:
        # As SGLang builds EAGLE's per-step-count states: the backend and the graph runner read the
        # verify width from the spec config at construction, so it is overridden around them.
        from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
        from sglang.srt.runtime_context import get_context, get_spec

        mr = self.model_runner
        widths = {
            "speculative_num_steps": get_spec().speculative_num_steps,
            "speculative_num_draft_tokens": get_spec().speculative_num_draft_tokens,
        }
        get_context().override("sparsespec.plain_capture", speculative_num_steps=0, speculative_num_draft_tokens=1)
        try:
            backend = new_verify_backend(mr)
            attach_verify(backend, VerifyHooks(None, split_kernel=self.cfg.verify_kernel is VerifyKernel.SPLIT))
            runner = None
            if not self.server_args.disable_cuda_graph:
                runner = DecodeCudaGraphRunner(
                    mr, attn_backend=backend, speculative_num_steps=0, speculative_num_draft_tokens=1
                )
        finally:
            get_context().override("sparsespec.plain_restore", **widths)
        logger.info("PILLAR plain-decoding graphs (verify width 1) captured")
        return PlainState(backend, runner)

    # ---- per step --------------------------------------------------------------------
    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None):
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return self._prefill(batch, on_publish)
        return self._decode_round(batch, on_publish, grammar_barrier)

    def _prefill(self, batch, on_publish):
        self.clock.interrupt()
        result = self._target_worker.forward_batch_generation(batch)
        # spec-v2 convention: seq_lens counts tokens with KV; the sampled token has none yet.
        result.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        self.selector.after_prefill(batch.req_pool_indices, batch.seq_lens)
        if self.mixed is not None:
            self.mixed.tracker.forget([r.rid for r in batch.reqs])
        result.next_draft_input = self._next_draft_input(result.next_token_ids)
        return result

    def _choose_steps(self, batch) -> RoundShape:
        """This round's draft count, which requests draft densely and which select boosted plans
        (host-side only: sizes and the accept counts SGLang already copied to the host); the round
        joins the launch queue, with what the adaptive readers need of it."""
        if self.policy is None or batch.forward_mode.is_idle():
            self.rounds.launched(self.cfg.num_steps, len(batch.reqs))
            return RoundShape(self.cfg.num_steps)
        samples = self.clock.poll()
        self.policy.observe(samples)
        self.metrics.rounds_timed(samples)
        reqs = batch.reqs
        alpha = self.policy.acceptance.alpha
        # Boosts change only how many positions a selection buys, not the round's shape: each TP rank
        # may decide its own (they see the same accept counts) without a hang.
        boost = self.dense.boost(reqs, alpha)
        mean_len = sum(r.seqlen for r in reqs) / max(len(reqs), 1)
        choice = self.policy.choose(len(reqs), mean_len, lambda: self.dense.view(reqs, alpha))
        steps, key, dense = choice.steps, choice.key, choice.dense
        if self.cfg.force_steps >= 0:  # analysis: the cell still measures what runs, which is forced
            steps, dense = self.cfg.force_steps, None
        elif steps and self.plain is not None and (counts := draft_counts(batch, steps)) and not any(counts):
            steps, dense = 0, None  # nobody would draft (request_rounds): a plain round takes the same tokens
        steps, dense = self.agreement.agree(steps, dense, len(reqs))  # TP ranks must run one round shape
        # The calibration compares a round with what it was chosen for: only a round that ran as chosen.
        expected = choice.expected if (steps, dense) == (choice.steps, choice.dense) else None
        self.dense.launched(steps, dense, boost)
        launch = AdaptiveRound(list(reqs), None if dense is None else list(dense), expected)
        self.rounds.launched(steps, len(reqs), launch)
        self.clock.announce(key, steps)
        rounds = sum(self.metrics.rounds_by_steps.values()) + 1  # this round is counted at launch
        if rounds % PATH_LOG_EVERY == 0:
            logger.info("PILLAR adaptive: %s", self.summary())
            self._save_costs()
        return RoundShape(steps, dense if dense is not None and any(dense) else None, boost)

    def on_verify_complete_cpu(self, num_correct_drafts_per_req: list[int], batch_size: int = 0) -> None:
        # SGLang calls this with each decode round's accept counts once they are on the host.
        matched = self.rounds.completed(num_correct_drafts_per_req)
        self.metrics.completed(matched)
        if matched is not None and matched.payload is not None:  # a round of drafts the policy chose
            self.policy.acceptance.completed(matched)
            self.dense.completed(matched)

    def summary(self) -> dict[str, Any]:
        """PILLAR's live numbers for /server_info."""
        out: dict[str, Any] = {
            "step_candidates": list(self.cfg.step_candidates),
            "rounds_by_k": {str(k): self.metrics.rounds_by_steps[k] for k in self.cfg.step_candidates},
        }
        if self.cfg.plain_path is PlainPath.DECODE:  # which of the plain rounds the decode path served
            out["plain_decode_rounds"] = self.metrics.plain_decode_rounds
        if self.cfg.mixed:  # which of the full-length rounds ran as mixed-phase iterations
            out["mixed_rounds"] = self.metrics.mixed_rounds
        if self.policy is not None:
            out.update(self.policy.summary(), dense_request_rounds=self.dense.dense_request_rounds)
            if self.cfg.boosts:
                out["boosted_request_rounds"] = self.dense.boosted_request_rounds
        return out

    def _round_shape(self, batch) -> RoundShape:
        """This round's shape (``_choose_steps``), counted in the metrics; a start-up warm-up batch
        (``rounds/warmup.py``) takes every draft count in turn, so each count's kernels build, and the
        policy, its clock and the metrics never see it (its late accept counts match no launched round)."""
        if is_warmup(batch.reqs):
            self.warmup_rounds += 1
            return RoundShape(warmup_steps(self.cfg.step_candidates, self.warmup_rounds - 1))
        shape = self._choose_steps(batch)
        self.metrics.launched(shape.steps, len(batch.reqs))
        return shape

    def _decode_round(self, batch, on_publish, grammar_barrier):
        steps, dense, boost = self._round_shape(batch)
        if self.mixed is not None:
            full = steps == self.cfg.num_steps and dense is None and boost is None
            if full and not batch.forward_mode.is_idle() and mixed_serves(batch):
                return self._mixed_round(batch, on_publish)
            self.mixed.tracker.invalidate()  # this round rewrites the KV past every committed length
        if steps == 0:
            return self._plain_round(batch, on_publish, grammar_barrier)
        draft_input = batch.spec_info
        bs = batch.seq_lens.shape[0]
        verify_lens = batch.seq_lens
        self.clock.start(bs)
        if dense is not None:
            dense = self._to_device(dense, torch.int32)
        ratio = None
        if boost is not None:  # the budget ratio of each request's next selection
            ratio = self._to_device([self.cfg.boost_ratio if b else self.cfg.budget_ratio for b in boost], torch.float64)
        drafts = self.draft_runner.run(
            batch.req_pool_indices, batch.seq_lens, draft_input.bonus_tokens, batch.sampling_info, steps, dense
        )
        counts = draft_counts(batch, steps)  # requests with per-token sampling state take row 0 only
        self.clock.drafted()
        batch.spec_info = build_eagle_verify_input(
            batch,
            draft_input,
            self._chain_parents[:bs],
            self._chain_scores_index[:bs],
            drafts.tokens,
            None,  # the draft record below replaces full-vocabulary draft distributions
            target_worker=self._target_worker,
            topk=1,
            num_steps=self.speculative_num_steps,
            num_draft_tokens=self.speculative_num_draft_tokens,
            tree_mask_mode=default_tree_mask_mode(),
            device=self.device,
        )
        counts = None if counts is None else self._to_device(counts, torch.int32)
        batch.spec_info = PillarVerifyInput.extend(batch.spec_info, drafts.record, counts, self.clock.verify_callback)
        result = self._verify(batch, grammar_barrier, self.speculative_num_steps)
        self.clock.accepted()
        # Before on_publish: publishing lets the schedule stream start preparing the next
        # batch, and the selection must read this round's seq_lens before anything reuses them.
        self.selector.after_verify(batch.req_pool_indices, verify_lens, result.new_seq_lens, ratio)
        self.clock.end()
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        result.next_draft_input = self._next_draft_input(result.next_draft_input.bonus_tokens)
        return result

    def _mixed_round(self, batch, on_publish):
        """A mixed-phase iteration (rounds/mixed.py): k + 1 forwards, each request verified once. Its
        whole time is timed as the draft phase (the verify shares the draft forwards)."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        bs = batch.seq_lens.shape[0]
        self.clock.start(bs)
        out = self.mixed.run(batch)
        self.clock.end_mixed()
        if not is_warmup(batch.reqs):
            self.metrics.mixed_rounds += 1
        result = GenerationBatchResult(
            logits_output=LogitsProcessorOutput(next_token_logits=None),
            next_token_ids=out.emitted.to(torch.int32).view(-1),
            can_run_cuda_graph=out.graphed,
            speculative_num_draft_tokens=self.speculative_num_draft_tokens,
            next_draft_input=self._next_draft_input(out.root.to(torch.int32)),
            accept_lens=out.accept_len.to(torch.int32),
            new_seq_lens=out.length.to(batch.seq_lens.dtype),
        )
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        return result

    def _plain_round(self, batch, on_publish, grammar_barrier):
        """One token per request from the target's full forward (no drafts, plans unchanged: their
        recent tail grows by the new token)."""
        if self.draft_runner.plain_logits is not None and decode_path_serves(batch):
            if not is_warmup(batch.reqs):
                self.metrics.plain_decode_rounds += 1
            return self._plain_decode_round(batch, on_publish)
        self.clock.start_plain()
        mr = self.model_runner
        saved = mr.attn_backend, mr.decode_cuda_graph_runner
        mr.attn_backend, mr.decode_cuda_graph_runner = self.plain.attn_backend, self.plain.graph_runner
        try:
            # SGLang's one-token verify input rooted at the pending (bonus) token, as EAGLE builds it
            # for its zero-step rounds; it reads only the fields PillarWorker shares (_target_worker,
            # device, topk) and the backend swapped in above.
            record = None if batch.sampling_info.is_all_greedy else self._no_drafts(batch.seq_lens.shape[0])
            batch.spec_info = PillarVerifyInput.extend(EAGLEWorkerV2._build_trivial_verify_input(self, batch), record)
            result = self._verify(batch, grammar_barrier, 0)
        finally:
            mr.attn_backend, mr.decode_cuda_graph_runner = saved
        self.clock.end()
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        result.next_draft_input = self._next_draft_input(result.next_draft_input.bonus_tokens)
        return result

    def _plain_decode_round(self, batch, on_publish):
        """A plain round as stock decodes (PlainPath.DECODE): one DECODE forward of the pending tokens
        over every request's whole prefix (the draft step's graph), then SGLang's own sampler on its
        logits: the token stock would sample from these logits, so the output stays the target's.
        Result layout as the width-1 verify's: one token per request, accept length 1."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        self.clock.start_plain()
        logits, graphed = self.draft_runner.decode_logits(
            batch.req_pool_indices, batch.seq_lens, batch.spec_info.bonus_tokens
        )
        out = LogitsProcessorOutput(next_token_logits=logits)
        # The pending token's position seeds deterministic sampling, as stock's decode positions do.
        tokens = self.model_runner.sampler(out, batch.sampling_info, False, [], [], batch.seq_lens).to(torch.int32)
        self.clock.end()
        result = GenerationBatchResult(
            logits_output=out,
            next_token_ids=tokens,
            can_run_cuda_graph=graphed,
            speculative_num_draft_tokens=1,
            next_draft_input=self._next_draft_input(tokens),
            accept_lens=self._rows(self._ones, tokens.shape[0]),  # read only (copied to the host)
            new_seq_lens=batch.seq_lens + 1,
        )
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        return result

    def _to_device(self, values: list, dtype: torch.dtype) -> torch.Tensor:
        """A per-request host list on the device. Pinned, so the copy is asynchronous; the caching host
        allocator keeps the block until it is done."""
        return torch.tensor(values, dtype=dtype, pin_memory=True).to(self.device, non_blocking=True)

    def _verify(self, batch, grammar_barrier, num_steps: int):
        """SGLang's topk=1 EAGLE verify of a chain of ``num_steps`` + 1 tokens per request."""
        return run_eagle_verify(
            batch,
            target_worker=self._target_worker,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
            plan_stream=self.plan_stream,
            plan_stream_ctx=self.plan_stream_ctx,
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

    def _next_draft_input(self, bonus_tokens: torch.Tensor) -> EagleDraftInput:
        # topk_p / topk_index must exist, one row per request, though PILLAR relays only the bonus token:
        # the scheduler slices and concatenates them (filter/merge), copies them into its future map and
        # tells an idle input by their length; nothing reads their values, so constant rows serve.
        bs = bonus_tokens.shape[0]
        return EagleDraftInput(
            bonus_tokens=bonus_tokens,
            topk_index=self._rows(self._relay_index, bs),
            topk_p=self._rows(self._relay_p, bs),
        )

    def _rows(self, constant: torch.Tensor, bs: int) -> torch.Tensor:
        """The first ``bs`` rows of a constant per-request buffer (sized by --max-running-requests)."""
        if bs > constant.shape[0]:
            raise RuntimeError(f"PILLAR: a batch of {bs} requests exceeds max running requests {constant.shape[0]}")
        return constant[:bs]

    # ---- the rest of the BaseSpecWorker contract ---------------------------------------
    def clear_cache_pool(self):
        # The KV pool is the target's and is cleared by the scheduler; stale plans are
        # harmless because every request's first forward (prefill) rewrites its row.
        pass

    def update_weights_from_disk(self, recv_req):
        return self._target_worker.update_weights_from_disk(recv_req)

    def update_weights_from_tensor(self, recv_req):
        return self._target_worker.update_weights_from_tensor(recv_req)

    def update_weights_from_ipc(self, recv_req):
        return self._target_worker.update_weights_from_ipc(recv_req)
