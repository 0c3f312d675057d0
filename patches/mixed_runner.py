"""Mixed-phase iterations on the GPU (``rounds/mixed.py``, ``--pillar-batch-phases mixed``).

An iteration is k + 1 forwards. Each is one DECODE forward of the target model under the draft
backend: a row per request that drafts (its plan, ``kernels/sparse_decode.py``), then one phase
group's verify segments of k + 1 rows (full prefix, ``kernels/verify_attention.py``, scores captured
for the selection); then, in the same CUDA graph, the drafts are sampled (``kernels/draft_sample.py``)
and the group's drafts accepted: greedily, or by exact rejection sampling against the target
distribution stock decoding samples from (``sampling/accept.stock_accept``, the split round's, whatever
filters the batch uses). One graph per (batch-size bucket, greedy or sampled: ``decode_graphs.Kind``)
is replayed k + 1 times; the step index and every input live in device buffers the body advances.
After each forward the selector sees the group's verify, as after a split round's verify.

Served batches: one GPU, no logprobs, hidden states, grammars, penalties, logit biases, custom logit
processors, sampling masks, sampling seeds or min-p (``mixed_serves``); the others run split rounds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_sparsespec.selection.scores import VerifyScoreSink
from sglang_sparsespec.selection.selectors import Selector
from sglang_sparsespec.selection.state import PlanState
from sglang_sparsespec.rounds.mixed import (
    ChainBuffers,
    ChainStore,
    ChainTracker,
    Record,
    RowInputs,
    mixed_step,
    segments_per_forward,
)
from sglang_sparsespec.sampling.accept import greedy_accept, stock_accept
from sglang_sparsespec.sampling.rejection import DraftRecord
from sglang_sparsespec.sampling.target import SamplingRows

from .contacts import create_flashinfer_kv_indices_triton
from .decode_graphs import DecodeGraphs, DecodeRows, Kind, decode_forward, host_rows
from .draft_attention import SegmentMeta
from .draft_runner import PillarDraftRunner, sample_drafts
from .request_rounds import decode_path_serves
from .verify_input import sampling_backend


def mixed_serves(batch) -> bool:
    """Whether a mixed iteration may serve ``batch``: its acceptance samples every row from the
    joint top-k / top-p filter with fresh coins (and its drafts' noise from the global generator),
    and SGLang's verify path applies the rest; penalized and processor batches are not served
    (``decode_path_serves``), so no request here needs single-token rounds (``request_rounds``)."""
    si = batch.sampling_info
    return decode_path_serves(batch) and si.sampling_seed is None and not si.need_min_p_sampling


@dataclass
class MixedOutput:
    """One iteration's result, batch order: emitted [bs, k + 1] int64 (accepted drafts, the drawn
    token, then -1), accept_len [bs] int64, length [bs] int64 (committed after the verify), root
    [bs] int64 (the token after them, pending), graphed (a captured graph ran)."""

    emitted: torch.Tensor
    accept_len: torch.Tensor
    length: torch.Tensor
    root: torch.Tensor
    graphed: bool


class MixedRunner:
    """Mixed-phase iterations for one worker: shares the draft runner's model runner, backend and
    batch-size buckets, the plans and the selector; keeps the chains (``ChainBuffers`` in batch order
    for the iteration, ``ChainStore`` by pool row between iterations) and one graph per (bucket, Kind)."""

    def __init__(
        self,
        draft_runner: PillarDraftRunner,
        state: PlanState,
        selector: Selector,
        sink: VerifyScoreSink | None,
        scratch_row: int,
    ):
        self.mr = draft_runner.mr
        self.backend = draft_runner.backend
        self.state = state
        self.selector = selector
        self.sink = sink
        self.k = draft_runner.k
        self.max_bs = draft_runner.max_bs
        self.device = draft_runner.device
        # Padded segments select into this plan row, never a request's (PlanState has one spare row).
        self.scratch_row = scratch_row
        self.num_cand = draft_runner.num_cand
        self.req_to_token = self.mr.req_to_token_pool.req_to_token
        self.buf = ChainBuffers.allocate(self.max_bs, self.k, self.num_cand, self.device)
        self.store = ChainStore.allocate(self.req_to_token.shape[0], self.k, self.num_cand, self.device)
        self.tracker = ChainTracker(self.k)
        n, k1 = self.max_bs + 1, self.k + 1
        s_max = self.buf.seg.shape[1]
        with torch.device(self.device):
            # Per batch row (the last: the segment pad row, greedy): SGLang's sampling parameters.
            self.temperature = torch.ones(n, dtype=torch.float32)
            self.top_p = torch.ones(n, dtype=torch.float32)
            self.top_k = torch.ones(n, dtype=torch.int32)
            # The draft sampler's input, never set: min-p batches split.
            self.min_p = torch.zeros(n, dtype=torch.float32)
            self.step_ids = torch.zeros((self.max_bs, self.num_cand), dtype=torch.int64)
            self.step_q = torch.zeros((self.max_bs, self.num_cand), dtype=torch.float32)
            self.step_q_tok = torch.ones(self.max_bs, dtype=torch.float32)
            self.qo_indptr = torch.arange(s_max + 1, dtype=torch.int32) * k1
            self.kv_indptr = torch.zeros(s_max + 1, dtype=torch.int32)
            # Every segment's prefix may reach the context length (radix-shared slots can sum past the pool).
            self.kv_indices = torch.zeros(s_max * self.req_to_token.shape[1], dtype=torch.int64)
        self.graphs = DecodeGraphs(self.mr, draft_runner.capture_bs, self.max_bs, "mixed")

    # ---- one forward (eager body == captured body) -----------------------------------
    def _segments(self, rows: RowInputs, bs: int, segments: int) -> SegmentMeta:
        kv_indptr = self.kv_indptr[: segments + 1]
        kv_indptr[1:] = torch.cumsum(rows.seg_len, 0)
        # Contiguous: a Triton kernel reads it by index from its base pointer.
        seg_rpi = rows.rpi[bs:].view(segments, self.k + 1)[:, 0].contiguous()
        create_flashinfer_kv_indices_triton[(segments,)](
            self.req_to_token, seg_rpi, rows.seg_len, kv_indptr, None, self.kv_indices, self.req_to_token.stride(0)
        )
        return SegmentMeta(bs, self.k + 1, self.qo_indptr[: segments + 1], kv_indptr, self.kv_indices, self.sink)

    def _forward(self, rows: RowInputs, bs: int, segments: int) -> torch.Tensor:
        """The forward of ``rows`` (``bs`` draft rows, then the segments); logits [rows, V]."""
        inputs = self.backend.inputs
        rpi = rows.rpi[:bs]
        inputs.req_pool_indices[:bs] = rpi
        inputs.seq_lens[:bs] = rows.positions[:bs] + 1
        # Per forward: a group's verify re-selects its plans in the middle of the iteration.
        inputs.tail_start[:bs] = self.state.tail_start[rpi]
        self.backend.plan(bs, False, self._segments(rows, bs, segments))
        decode_rows = DecodeRows(rows.tokens, rows.positions, rows.rpi, rows.positions + 1)
        return decode_forward(self.mr, self.backend, decode_rows)

    def _accept(self, logits: torch.Tensor, rows: RowInputs, kind: Kind) -> tuple[torch.Tensor, torch.Tensor]:
        buf, seg, k = self.buf, rows.seg, self.k
        drafts = buf.tokens.index_select(0, seg)[:, 1:]
        num_drafts = buf.pending.index_select(0, seg)
        if kind is Kind.GREEDY:
            return greedy_accept(logits.argmax(dim=-1).view(-1, k + 1), drafts, num_drafts)
        # The split round's acceptance (mixed batches have no min-p): one filter for both runners, and one
        # graph for every sampled batch (top-k, top-p and temperature are per-row tensors).
        params = (self.temperature, self.top_p, self.top_k)
        sampling = SamplingRows(*(t.index_select(0, seg) for t in params), None, sampling_backend())
        record = DraftRecord(
            drafts,
            buf.cand_ids.index_select(0, seg),
            buf.cand_q.index_select(0, seg),
            buf.q_tok.index_select(0, seg),
            num_drafts,
        )
        coins = torch.rand((seg.shape[0], k), dtype=torch.float32, device=logits.device)
        final_coins = torch.rand(seg.shape[0], dtype=torch.float32, device=logits.device)
        return stock_accept(logits, sampling, record, coins, final_coins)

    def _draft(self, logits: torch.Tensor, greedy: bool) -> tuple[torch.Tensor, Record | None]:
        if greedy:
            return logits.argmax(dim=-1), None
        bs = logits.shape[0]
        record = (self.step_ids[:bs], self.step_q[:bs], self.step_q_tok[:bs])
        drafted = sample_drafts(
            logits, self.temperature[:bs], self.top_p[:bs], self.top_k[:bs], self.min_p[:bs], *record
        )
        return drafted, record

    def _body(self, bs: int, segments: int, kind: Kind) -> None:
        """Forward ``buf.step`` of the iteration for ``bs`` (padded) batch rows; advances the step."""
        mixed_step(
            self.buf,
            bs,
            segments,
            lambda rows: self._forward(rows, bs, segments),
            lambda logits: self._draft(logits, kind is Kind.GREEDY),
            lambda logits, rows: self._accept(logits, rows, kind),
        )

    # ---- capture / run -------------------------------------------------------------
    def _pad(self, start: int, end: int) -> None:
        self.buf.pad(start, end)
        for rows in (slice(start, end), slice(self.max_bs, self.max_bs + 1)):
            self.temperature[rows] = 1.0
            self.top_p[rows] = 1.0
            self.top_k[rows] = 1

    def capture(self) -> None:
        with self.graphs.capturing("mixed-phase graphs"):
            for bs in reversed(self.graphs.capture_bs):
                segments = segments_per_forward(bs, self.k)
                for kind in (Kind.GREEDY, Kind.SAMPLED):
                    self.graphs.capture(
                        (bs, kind), lambda: self._body(bs, segments, kind), lambda: self._prepare(bs, segments)
                    )

    def _prepare(self, bs: int, segments: int) -> None:
        """A capture's inputs: every row and segment padding, at step 0."""
        self._pad(0, bs)
        self.buf.seg[:, :segments] = self.buf.pad_row
        self.buf.step.zero_()

    def run(self, batch) -> MixedOutput:
        """One iteration for ``batch`` (``mixed_serves``); no host synchronisation."""
        buf, k = self.buf, self.k
        reqs = batch.reqs
        bs = len(reqs)
        graph_bs, padded = self.graphs.bucket(bs)
        kind = Kind.of(batch.sampling_info)
        greedy = kind is Kind.GREEDY
        plan = self.tracker.plan([r.rid for r in reqs], not greedy, padded, buf.pad_row)
        segments = plan.segments
        si = batch.sampling_info
        self.temperature[:bs] = si.temperatures.view(-1)
        self.top_p[:bs] = si.top_ps
        self.top_k[:bs] = si.top_ks
        self._pad(bs, padded)
        buf.seg[:, :segments] = host_rows(plan.table, torch.int64, self.device)
        buf.group[:bs] = host_rows(plan.groups, torch.int64, self.device)
        self.store.load(
            buf,
            batch.req_pool_indices,
            batch.seq_lens,
            batch.spec_info.bonus_tokens,
            host_rows(plan.carried, torch.bool, self.device),
            sampled=not greedy,
        )
        buf.step.zero_()
        key = (graph_bs, kind) if graph_bs is not None else None
        for j in range(k + 1):
            graphed = self.graphs.run(key, lambda: self._body(padded, segments, kind))
            seg = buf.seg[j, :segments]
            sel_rows = torch.where(seg == buf.pad_row, self.scratch_row, buf.rpi.index_select(0, seg))
            self.selector.after_verify(sel_rows, buf.seg_before[j, :segments], buf.seg_after[j, :segments])
        self.store.save(buf, batch.req_pool_indices, sampled=not greedy)
        return MixedOutput(
            emitted=buf.emitted[:bs].clone(),
            accept_len=buf.accept_len[:bs].clone(),
            length=buf.length[:bs].clone(),
            root=buf.tokens[:bs, 0].clone(),
            graphed=graphed,
        )
