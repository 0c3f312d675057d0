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
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.eagle_utils import default_tree_mask_mode
from sglang.srt.speculative.eagle_worker_common import (
    build_eagle_verify_input,
    run_eagle_verify,
)
from sglang.srt.speculative.spec_utils import get_plan_stream

from sglang_sparsespec.config import (
    PillarConfig,
    ScoreRows,
    SelectionPolicy,
    VerifyKernel,
)
from sglang_sparsespec.selection.scores import VerifyScoreSink
from sglang_sparsespec.selection.selectors import Selector, make_selector
from sglang_sparsespec.selection.state import PlanState
from sglang_sparsespec.spec.timing import RoundTimer, format_report

from .draft_runner import PillarDraftRunner
from .triton_verify import VerifyHooks, attach_verify
from .verify_sample import PillarRound, attach_round

logger = logging.getLogger(__name__)


class PillarWorker(BaseSpecWorker):
    def __init__(self, server_args, gpu_id, ps, nccl_port, target_worker):
        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.device = server_args.device
        self.cfg = PillarConfig.from_env(server_args.speculative_num_steps)
        self.topk = 1
        self.speculative_num_steps = self.cfg.num_steps
        self.speculative_num_draft_tokens = self.cfg.num_steps + 1
        self.plan_stream, self.plan_stream_ctx = get_plan_stream(self.device)
        self.state: PlanState | None = None
        self.selector: Selector | None = None
        self.draft_runner: PillarDraftRunner | None = None
        self.timer: RoundTimer | None = None
        if self.cfg.timing_every:
            self.timer = RoundTimer(
                self.cfg.timing_every,
                lambda: torch.cuda.Event(enable_timing=True),
                lambda report: logger.info(format_report(report)),
            )
        logger.info("PILLAR config: %s", self.cfg)

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
        k_idx = torch.arange(self.cfg.num_steps, dtype=torch.long, device=self.device)
        self._chain_parents = (k_idx - 1).repeat(self.max_bs, 1)
        self._chain_scores_index = k_idx.repeat(self.max_bs, 1)

    def init_attention_backends(self):
        mc = self.model_runner.model_config
        backend = self.model_runner.attn_backend
        rows = self.req_to_token_pool.req_to_token.shape[0]
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
        )
        if capture_bs:
            self.draft_runner.capture()

    # ---- per step --------------------------------------------------------------------
    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None):
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return self._prefill(batch, on_publish)
        return self._decode_round(batch, on_publish, grammar_barrier)

    def _prefill(self, batch, on_publish):
        if self.timer is not None:
            self.timer.interrupt()
        result = self._target_worker.forward_batch_generation(batch)
        # spec-v2 convention: seq_lens counts tokens with KV; the sampled token has none yet.
        result.new_seq_lens = batch.seq_lens
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        self.selector.after_prefill(batch.req_pool_indices, batch.seq_lens)
        result.next_draft_input = self._next_draft_input(result.next_token_ids)
        return result

    def _decode_round(self, batch, on_publish, grammar_barrier):
        draft_input = batch.spec_info
        bs = batch.seq_lens.shape[0]
        verify_lens = batch.seq_lens
        if self.timer is not None:
            self.timer.start(bs)
        drafts = self.draft_runner.run(
            batch.req_pool_indices, batch.seq_lens, draft_input.bonus_tokens, batch.sampling_info
        )
        if self.timer is not None:
            self.timer.mark("draft")
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
        on_logits = None if self.timer is None else (lambda: self.timer.mark("verify"))
        attach_round(batch.spec_info, PillarRound(drafts.record, on_logits))
        result = run_eagle_verify(
            batch,
            target_worker=self._target_worker,
            req_to_token_pool=self.req_to_token_pool,
            token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
            plan_stream=self.plan_stream,
            plan_stream_ctx=self.plan_stream_ctx,
            topk=1,
            num_steps=self.speculative_num_steps,
            num_draft_tokens=self.speculative_num_draft_tokens,
            device=self.device,
            metadata_ready_pre_pad=False,
            finalize_tree_path=True,
            grammar_barrier=grammar_barrier,
        )
        if self.timer is not None:
            self.timer.mark("accept")
        # Before on_publish: publishing lets the schedule stream start preparing the next
        # batch, and the selection must read this round's seq_lens before anything reuses them.
        self.selector.after_verify(batch.req_pool_indices, verify_lens, result.new_seq_lens)
        if self.timer is not None:
            self.timer.mark("select")
        if on_publish is not None:
            on_publish(result.new_seq_lens)
        result.next_draft_input = self._next_draft_input(result.next_draft_input.bonus_tokens)
        return result

    @staticmethod
    def _next_draft_input(bonus_tokens: torch.Tensor) -> EagleDraftInput:
        # topk_p / topk_index are sliced unconditionally by the non-overlap scheduler's
        # filter/merge, so they must exist even though PILLAR relays only the bonus token.
        return EagleDraftInput(
            bonus_tokens=bonus_tokens,
            topk_index=bonus_tokens.view(-1, 1).to(torch.int64),
            topk_p=torch.ones((bonus_tokens.shape[0], 1), dtype=torch.float32, device=bonus_tokens.device),
        )

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
