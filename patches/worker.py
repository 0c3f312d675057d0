"""``PillarWorker``: SGLang's speculative-worker contract for PILLAR.

The scheduler builds it (``SpeculativeAlgorithm.register``), starts it up in the order below, then
calls ``forward_batch_generation`` for every batch and ``on_verify_complete_cpu`` with each decode
round's accept counts. Start-up builds the parts a round runs on: the plan state and selector
(``selection/``), the verify hooks with score capture (``triton_verify``), the draft and mixed-phase
runners with their CUDA graphs, and the width-1 verify graphs of plain rounds. The rounds themselves
are read top-down in ``rounds.py`` (prefill, and a decode round planned by ``round_plan.py``, run as
one of four kinds and ended in one place); their accept counts go back to the planner.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.spec_utils import get_plan_stream
from sglang_sparsespec.kernels._common import default_num_splits

from sglang_sparsespec.adaptive.cost_cache import CostFile
from sglang_sparsespec.adaptive.dense import DenseChooser
from sglang_sparsespec.adaptive.policy import SpeculationPolicy
from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.modes import (
    AcceptList,
    PlainPath,
    Prologue,
    ScoreRows,
    SelectionPolicy,
    DraftLmHead,
    VerifyKernel,
    VerifyLogits,
)
from sglang_sparsespec.metrics import PillarMetrics
from sglang_sparsespec.rounds.clock import make_clock
from sglang_sparsespec.rounds.timing import format_report
from sglang_sparsespec.sampling.accept import use_candidates
from sglang_sparsespec.selection.dense_heads import dense_head_mask
from sglang_sparsespec.selection.match_heads import TokenIds, match_heads_of
from sglang_sparsespec.selection.scores import VerifyScoreSink
from sglang_sparsespec.selection.selectors import Selector, make_selector
from sglang_sparsespec.selection.state import PlanState

from .contacts import resolved
from .draft_lm_head import prepare_fp8_lm_head
from .draft_logits import keep_verify_logits
from .draft_qk import QK_IN_KERNEL
from .draft_runner import PillarDraftRunner
from .mixed_runner import MixedRunner
from .probe_capture import HeadProbe
from .round_plan import RoundPlanner, seeded_config, setup_identity
from .rounds import Rounds
from .sampler_warmup import build_sampling_kernels, compile_ahead
from .slot_warmup import build_slot_kernels
from .tp_agree import RoundAgreement
from .triton_verify import VerifyHooks, attach_verify, new_verify_backend, verify_backend
from .verify import Pools, VerifyPass

logger = logging.getLogger(__name__)


class PillarWorker(BaseSpecWorker):
    def __init__(self, server_args, gpu_id, nccl_port, target_worker, ps=None):  # ps: passed up to 0.5.20
        super().__init__()
        self.server_args = server_args = resolved(server_args)  # the resolved values (contacts.resolved)
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        kv_dtype = getattr(self.model_runner, "kv_cache_dtype", torch.bfloat16)
        if kv_dtype not in (torch.bfloat16, torch.float16):
            # --kv-cache-dtype auto follows a checkpoint that asks for an fp8 cache (ModelOpt's kv_cache_quant_algo),
            # past the launch check on the flag: PILLAR's kernels read K/V unscaled.
            raise ValueError(
                f"--speculative-algorithm PILLAR: needs a 16-bit KV cache, and this model's checkpoint makes it "
                f"{kv_dtype}; pass --kv-cache-dtype bf16"
            )
        self.device = server_args.device
        self.cfg = seeded_config(PillarConfig.from_env(server_args.speculative_num_steps), server_args)
        # Before the target's verify graphs are captured (Scheduler.init_cuda_graphs, after the workers).
        keep_verify_logits(self.cfg.verify_logits is VerifyLogits.HALF)
        use_candidates(self.cfg.accept_list is AcceptList.CANDIDATES)
        if self.cfg.draft_lm_head is DraftLmHead.FP8:  # before the draft steps' graphs capture its use
            prepare_fp8_lm_head(getattr(self.model_runner.model, "lm_head", None))
        self.topk = 1
        self.speculative_num_steps = self.cfg.num_steps
        self.speculative_num_draft_tokens = self.cfg.num_steps + 1
        self.plan_stream, self.plan_stream_ctx = get_plan_stream(self.device)
        self.state: PlanState | None = None
        self.selector: Selector | None = None
        self.sink: VerifyScoreSink | None = None
        self.draft_runner: PillarDraftRunner | None = None
        self.mixed: MixedRunner | None = None  # --pillar-batch-phases mixed
        self.rounds: Rounds | None = None  # built once the runners exist (init_cuda_graphs)
        self.metrics = PillarMetrics(self.cfg.num_steps)  # /server_info and Prometheus (patches/metrics.py)
        # One clock times every round for the cost model (adaptive) and the phase report (step timing).
        self.clock = make_clock(
            lambda: torch.cuda.Event(enable_timing=True), self.cfg.timing_every, self._phase_report, self.cfg.adaptive
        )
        policy = agreement = cost_file = None
        if self.cfg.adaptive:
            policy = SpeculationPolicy(
                self.cfg.step_candidates,
                floor_quantile=self.cfg.floor_quantile,
                premium=self.cfg.spec_premium,
                mixed_steps=self.cfg.num_steps if self.cfg.mixed else None,
            )
            agreement = RoundAgreement.for_tp_group()
            cost_file = CostFile.resolve(self.cfg.cost_cache, setup_identity(self.cfg, server_args, self.model_runner))
        self.planner = RoundPlanner(
            self.cfg, self.metrics, self.clock, policy=policy, agreement=agreement, cost_file=cost_file
        )
        logger.info("PILLAR config: %s", self.cfg)
        # Compiled while SGLang sets up the KV pool and captures its graphs; loaded at the end of init_cuda_graphs.
        self.sampling_compile = compile_ahead(server_args.sampling_backend, self.device)

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
        # One GPU only (spec_algo.py), so the model's KV head indices are this rank's.
        self.state.dense = dense_head_mask(self.cfg.dense_heads, mc.num_hidden_layers, backend.num_kv_head, self.device)
        self.state.match = match_heads_of(self.cfg.match_heads, mc.num_hidden_layers, backend.num_kv_head, self.device)
        if self.state.match is not None:  # as wide as req_to_token plus a round's chain past the context
            self.state.token_ids = TokenIds(rows, self.max_context_len + self.speculative_num_draft_tokens, self.device)
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
        attach_verify(backend, self._verify_hooks(sink))
        self.selector = make_selector(self.cfg, self.state, sink)
        self.sink = sink
        if self.planner.policy is not None:
            h_kv, dev = backend.num_kv_head, torch.device(self.device)
            kv_bytes = mc.num_hidden_layers * h_kv * mc.head_dim * 2 * self.model_runner.kv_cache_dtype.itemsize
            # The draft kernel's own split rule (sparse_decode_fwd's default), so the policy prices
            # a dense request's programs as the kernel will cut them.
            splits = lambda bs: default_num_splits(bs * h_kv, dev)  # noqa: E731
            dense = DenseChooser(self.cfg.budget, kv_bytes, mc.num_hidden_layers, splits)
            self.planner.set_dense(dense)

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
        plain = self._build_plain_pass() if 0 in self.cfg.step_candidates else None
        pools = Pools(self._target_worker, self.req_to_token_pool, self.plan_stream, self.plan_stream_ctx)
        match = self.state.match  # with N@auto, named by the warm-up's probe (patches/probe_capture.py)
        self.rounds = Rounds(
            self.cfg, pools, self.planner, self.clock, self.metrics, self.selector, self.draft_runner, self.mixed,
            plain, self.max_bs, self.device, token_ids=self.state.token_ids,
            probe=None if match is None or match.table is None else HeadProbe(self.model_runner.model, match),
        )  # fmt: skip
        # Every capture is over (the target's before this call, PILLAR's above): load and call them here.
        build_sampling_kernels(
            self.server_args.sampling_backend, self.model_runner.model_config.vocab_size, self.device,
            self.sampling_compile,
        )  # fmt: skip

    def _verify_hooks(self, sink: VerifyScoreSink | None) -> VerifyHooks:
        prologue = self.cfg.verify_prologue is Prologue.FUSED
        return VerifyHooks(
            sink,
            split_kernel=self.cfg.verify_kernel is VerifyKernel.SPLIT,
            prologue=prologue,
            qk=prologue and type(self.model_runner.model).__name__ in QK_IN_KERNEL,
        )

    def _build_plain_pass(self) -> VerifyPass:
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
            attach_verify(backend, self._verify_hooks(None))
            runner = None
            if not self.server_args.disable_cuda_graph:
                runner = DecodeCudaGraphRunner(
                    mr, attn_backend=backend, speculative_num_steps=0, speculative_num_draft_tokens=1
                )
        finally:
            get_context().override("sparsespec.plain_restore", **widths)
        logger.info("PILLAR plain-decoding graphs (verify width 1) captured")
        return VerifyPass(backend, runner, own=False)

    # ---- per step --------------------------------------------------------------------
    def forward_batch_generation(self, batch, on_publish=None, grammar_barrier=None, pp_proxy_tensors=None):
        # pp_proxy_tensors: what SGLang's scheduler passes a speculative worker under --disable-overlap-schedule from
        # 0.5.19; always None here (pipeline parallelism is refused at launch).
        if batch.forward_mode.is_extend() or batch.is_extend_in_batch:
            return self.rounds.prefill(batch, on_publish)
        return self.rounds.decode(batch, on_publish, grammar_barrier)

    def on_verify_complete_cpu(self, num_correct_drafts_per_req: list[int], batch_size: int = 0) -> None:
        # SGLang calls this with each decode round's accept counts once they are on the host.
        self.planner.completed(num_correct_drafts_per_req)

    def summary(self) -> dict:
        """PILLAR's live numbers for /server_info."""
        return self.planner.summary()

    # ---- the rest of the BaseSpecWorker contract ---------------------------------------
    def clear_cache_pool(self):
        # The KV pool is the target's and is cleared by the scheduler; stale plans are
        # harmless because every request's first forward (prefill) rewrites its row.
        pass

    # Up to 0.5.20 the scheduler loads disk and IPC weights into its target worker, then asks the speculative worker
    # to load its draft's: PILLAR's draft is the target, already updated, and passing the call on loaded it twice.
    # Tensors go to the speculative worker alone, so it passes them on. From 0.5.21 the scheduler updates the
    # runners each worker lists (weight_update_runners: none here) and calls none of these.
    def update_weights_from_disk(self, recv_req):
        return True, "PILLAR drafts with the target's weights, which the scheduler has updated"

    def update_weights_from_tensor(self, recv_req):
        return self._target_worker.update_weights_from_tensor(recv_req)

    def update_weights_from_ipc(self, recv_req):
        return True, "PILLAR drafts with the target's weights, which the scheduler has updated"
