"""The k sparse draft steps of a PILLAR round, run by the *target* model.

Each step is an ordinary SGLang DECODE forward of the target model whose attention
reads a short per-request KV list (selected positions + recent tail + this round's
tokens, see ``sglang_sparsespec.spec.draft_layout``) through a private instance of
SGLang's Triton attention backend. The whole k-step loop — index building, k forwards,
draft sampling — is captured as one CUDA graph per batch-size bucket, so a round costs
one graph launch for drafting plus the target's own TARGET_VERIFY graph for verifying.
Batches larger than the largest bucket run the same loop eagerly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.spec.draft_layout import round_slots, step_indices
from sglang_sparsespec.spec.sampling import SamplingRows, sample, target_probs

logger = logging.getLogger(__name__)


@dataclass
class PlanState:
    """Per-request draft plans, indexed by ``req_pool_idx`` (row 0 = padding row).

    sel_pos [rows, kmax] int32, sel_cnt [rows] int32, tail_start [rows] int32.
    Row 0 stays all-zero: padded graph rows read an empty selection.
    """

    sel_pos: torch.Tensor
    sel_cnt: torch.Tensor
    tail_start: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, kmax: int, device: torch.device) -> PlanState:
        return cls(
            sel_pos=torch.full((rows, kmax), -1, dtype=torch.int32, device=device),
            sel_cnt=torch.zeros(rows, dtype=torch.int32, device=device),
            tail_start=torch.zeros(rows, dtype=torch.int32, device=device),
        )


@dataclass
class DraftOutput:
    """tokens [bs, k] int64 (draft j is the token after position seq_len + j);
    probs [bs, k, V] float32 — the distribution each draft token was sampled from."""

    tokens: torch.Tensor
    probs: torch.Tensor


class PillarDraftRunner:
    def __init__(
        self,
        model_runner,
        cfg: PillarConfig,
        state: PlanState,
        max_bs: int,
        capture_bs: list[int],
        list_width: int,
    ):
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        self.mr = model_runner
        self.cfg = cfg
        self.state = state
        self.k = cfg.num_steps
        self.width = list_width
        self.max_bs = max_bs
        self.device = model_runner.device
        vocab = model_runner.model_config.vocab_size
        # A private backend: its forward_metadata is ours alone, so draft planning never
        # disturbs the target backend that the verify graph was captured with.
        self.backend = TritonAttnBackend(model_runner)
        num_heads = self.backend.num_head
        v_dim = model_runner.model_config.v_head_dim
        splits = self.backend.max_kv_splits
        with torch.device(self.device):
            self.req_pool_indices = torch.zeros(max_bs, dtype=torch.int64)
            self.seq_lens = torch.ones(max_bs, dtype=torch.int64)
            self.bonus = torch.zeros(max_bs, dtype=torch.int64)
            self.temperature = torch.ones(max_bs, dtype=torch.float32)
            self.top_p = torch.ones(max_bs, dtype=torch.float32)
            self.top_k = torch.ones(max_bs, dtype=torch.int32)
            self.min_p = torch.zeros(max_bs, dtype=torch.float32)
            self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32)
            self.kv_indices = torch.zeros(max_bs * list_width + 1, dtype=torch.int64)
            self.num_kv_splits = torch.ones(max_bs, dtype=torch.int32)
            self.attn_logits = torch.empty((max_bs, num_heads, splits, v_dim), dtype=torch.float32)
            self.attn_lse = torch.empty((max_bs, num_heads, splits), dtype=torch.float32)
            self.out_tokens = torch.zeros((max_bs, self.k), dtype=torch.int64)
            self.out_probs = torch.zeros((max_bs, self.k, vocab), dtype=torch.float32)
        # Keyed by (batch-size bucket, greedy): all-greedy batches draft by argmax and
        # skip the draft distributions, which their verify never reads.
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self.capture_bs = sorted(b for b in capture_bs if b <= max_bs)
        self._forward_batches: dict[int, object] = {}

    # ---- forward-batch scaffolding -------------------------------------------------
    def _metadata(self, bs: int):
        from sglang.srt.layers.attention.triton_backend import ForwardMetadata

        return ForwardMetadata(
            attn_logits=self.attn_logits[:bs],
            attn_lse=self.attn_lse[:bs],
            max_extend_len=None,
            num_kv_splits=self.num_kv_splits[:bs],
            kv_indptr=self.kv_indptr[: bs + 1],
            kv_indices=self.kv_indices,
            qo_indptr=None,
            custom_mask=None,
            mask_indptr=None,
            window_kv_indptr=None,
            window_kv_indices=None,
            window_num_kv_splits=None,
            window_kv_offsets=None,
        )

    def _forward_batch(self, bs: int):
        from sglang.srt.layers.dp_attention import DpPaddingMode
        from sglang.srt.model_executor.forward_batch_info import (
            CaptureHiddenMode,
            ForwardBatch,
            ForwardMode,
        )

        fb = self._forward_batches.get(bs)
        if fb is None:
            fb = ForwardBatch(
                forward_mode=ForwardMode.DECODE,
                batch_size=bs,
                input_ids=self.bonus[:bs],
                req_pool_indices=self.req_pool_indices[:bs],
                seq_lens=self.seq_lens[:bs],
                seq_lens_cpu=None,
                out_cache_loc=self.bonus[:bs],
                seq_lens_sum=0,
                return_logprob=False,
                positions=self.seq_lens[:bs],
                dp_padding_mode=DpPaddingMode.get_default_mode_in_cuda_graph(),
                spec_algorithm=self.mr.spec_algorithm,
                spec_info=None,
                capture_hidden_mode=CaptureHiddenMode.NULL,
            )
            self._forward_batches[bs] = fb
        return fb

    # ---- the k-step loop (eager body == captured body) ----------------------------
    def _run_steps(self, bs: int, greedy: bool) -> None:
        from sglang.srt.layers.dp_attention import set_dp_buffer_len, set_is_extend_in_batch
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        req_to_token = self.mr.req_to_token_pool.req_to_token
        rpi = self.req_pool_indices[:bs]
        lens = self.seq_lens[:bs]
        slots, base_len = round_slots(
            req_to_token,
            rpi,
            lens,
            self.state.sel_pos[rpi],
            self.state.sel_cnt[rpi],
            self.state.tail_start[rpi],
            self.k,
            self.width,
        )
        rows = SamplingRows(
            temperature=self.temperature[:bs],
            top_p=self.top_p[:bs],
            top_k=self.top_k[:bs],
            min_p=self.min_p[:bs],
        )
        fb = self._forward_batch(bs)
        self.backend.forward_metadata = self._metadata(bs)
        fb.mark_forward_metadata_ready()
        set_dp_buffer_len(None, bs, False, None)
        set_is_extend_in_batch(False)
        tokens = self.bonus[:bs]
        with forward_context(ForwardContext(attn_backend=self.backend)):
            for step in range(self.k):
                list_lens = step_indices(slots, base_len, step, self.kv_indptr, self.kv_indices)
                self.backend.get_num_kv_splits(self.num_kv_splits[:bs], list_lens)
                positions = lens + step
                fb.input_ids = tokens
                fb.positions = positions
                fb.out_cache_loc = req_to_token[rpi, positions].to(torch.int64)
                logits = self.mr.model.forward(tokens, positions, fb).next_token_logits
                if greedy:
                    tokens = logits.argmax(dim=-1)
                else:
                    probs = target_probs(logits, rows)
                    tokens = sample(probs)
                    self.out_probs[:bs, step] = probs
                self.out_tokens[:bs, step] = tokens

    # ---- capture / run -------------------------------------------------------------
    def capture(self) -> None:
        from sglang.srt.model_executor.runner import model_capture_mode

        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream()
        with model_capture_mode():
            for bs in reversed(self.capture_bs):
                for greedy in (True, False):
                    self._load_padding(0, bs)
                    stream.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(stream):
                        # One eager warm-up: Triton JIT must not run under capture (the
                        # kernels involved do not autotune, so a second pass adds nothing).
                        self._run_steps(bs, greedy)
                    torch.cuda.current_stream().wait_stream(stream)
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=stream):
                        self._run_steps(bs, greedy)
                    self.graphs[(bs, greedy)] = graph
        logger.info("PILLAR draft graphs captured for batch sizes %s", self.capture_bs)

    def _load_padding(self, start: int, end: int) -> None:
        """Padding rows read the all-zero request row 0 and sample greedily."""
        self.req_pool_indices[start:end] = 0
        self.seq_lens[start:end] = 1
        self.bonus[start:end] = 0
        self.temperature[start:end] = 1.0
        self.top_p[start:end] = 1.0
        self.top_k[start:end] = 1
        self.min_p[start:end] = 0.0

    def run(self, req_pool_indices, seq_lens, bonus, sampling_info) -> DraftOutput:
        """Draft k tokens for a decode batch; no host synchronisation."""
        bs = req_pool_indices.shape[0]
        graph_bs = next((b for b in self.capture_bs if b >= bs), None)
        padded = graph_bs if graph_bs is not None else bs
        if padded > self.max_bs:
            raise RuntimeError(f"PILLAR draft batch {bs} exceeds max running requests {self.max_bs}")
        self.req_pool_indices[:bs] = req_pool_indices
        self.seq_lens[:bs] = seq_lens
        self.bonus[:bs] = bonus
        self.temperature[:bs] = sampling_info.temperatures.view(-1)
        self.top_p[:bs] = sampling_info.top_ps
        self.top_k[:bs] = sampling_info.top_ks
        if sampling_info.min_ps is not None:
            self.min_p[:bs] = sampling_info.min_ps
        else:
            self.min_p[:bs] = 0.0
        if padded > bs:
            self._load_padding(bs, padded)
        greedy = bool(sampling_info.is_all_greedy)
        if graph_bs is not None:
            self.graphs[(graph_bs, greedy)].replay()
        else:
            self._run_steps(bs, greedy)
        return DraftOutput(tokens=self.out_tokens[:bs], probs=self.out_probs[:bs])
