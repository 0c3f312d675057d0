"""``PillarDraftBackend``: SGLang's Triton backend with PillarAttn sparse decode attention.

The draft steps of a PILLAR round are ordinary DECODE forwards of the target model run
under this backend (through SGLang's forward context). Its decode attention attends, per layer and
KV head, only to that request's planned positions plus the recent tail (``kernels/sparse_decode.py``),
and writes the step's K/V in the same launch when the pool is SGLang's plain MHA pool in the K/V's own
dtype (the separate store: 1.7 us and one launch per layer of every draft step on the H200,
trace_qwen3-1.7b_round_h200_e8410c8); other pools get SGLang's own store first. A q/k norm and rotary
embedding the model left to it (``patches/draft_qk.py``) are applied in that launch too, or by SGLang's
kernels first where the store is not in-kernel.

The plain-decoding step (every prefix whole) attends through SGLang's own decode kernel and
split heuristic instead, on metadata this backend builds on the device (so it is captured in the
step's graph): profiled at 32 / 64 requests x 1K on the H200 (steps_plain_profile_h200_9aa0a6a.json),
the draft kernel over whole prefixes took 0.72 / 1.08 ms per step against SGLang's 0.56 / 1.01.

A mixed-phase forward (``SegmentMeta``, rounds/mixed.py) is the same DECODE forward with verify
segments after the draft rows: every row's K/V is written first, then the draft rows attend their
plans and the segments their whole prefix and own rows, through the verify kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from sglang.srt.layers.attention.triton_backend import (
    TritonAttnBackend,
    logit_capping_mod,
)
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd
from sglang_sparsespec.kernels.verify_attention import verify_attention_fwd

from sglang_sparsespec.selection.dense_heads import DENSE_SPLITS
from sglang_sparsespec.selection.oracle import oracle_select
from sglang_sparsespec.selection.scores import VerifyScoreSink
from sglang_sparsespec.selection.state import PlanState

from .contacts import create_flashinfer_kv_indices_triton
from .draft_qk import DeferredQK, take_deferred


@dataclass
class DraftStepInputs:
    """Static per-step buffers the draft runner fills before each forward ([max_bs] each).

    req_pool_indices int64; tail_start int32 (the plan's, gathered per round);
    sel_cnt int32 (the plan's, batch order); seq_lens int64 = current position + 1
    (the current token's K/V is written before it attends); with match heads, the step's token matches
    (``kernels/token_match.py``): match_pos [max_bs, 2 x latest] int32, match_cnt int32, and each listed head's
    copy without its plan's positions, match_lists [listed heads, max_bs, 2 x latest] int32.
    """

    req_pool_indices: torch.Tensor
    tail_start: torch.Tensor
    sel_cnt: torch.Tensor
    seq_lens: torch.Tensor
    match_pos: torch.Tensor | None = None
    match_cnt: torch.Tensor | None = None
    match_lists: torch.Tensor | None = None


@dataclass
class WholePrefixMeta:
    """SGLang's decode-kernel metadata for the plain step, refilled on the device before each one.

    kv_indptr int32 [max_bs + 1]; kv_indices int64 [max_bs x context length] (every row's KV slots,
    concatenated); num_kv_splits int32 [max_bs]; attn_logits fp32
    [max_bs, q heads, max splits, v dim]; attn_lse fp32 [max_bs, q heads, max splits].
    """

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    num_kv_splits: torch.Tensor
    attn_logits: torch.Tensor
    attn_lse: torch.Tensor


@dataclass
class SegmentMeta:
    """A mixed-phase forward's verify segments (rounds/mixed.py), after ``draft_rows`` draft rows:
    S segments of ``width`` (k + 1) rows, each attending its request's committed prefix and its own
    rows causally (``kernels/verify_attention.py``), the scores captured into ``sink`` when given.

    qo_indptr, kv_indptr int32 [S + 1]; kv_indices int64 (the prefixes' slots, concatenated).
    """

    draft_rows: int
    width: int
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    sink: VerifyScoreSink | None


def plain_mha_pool(pool, dcp_size: int) -> bool:
    """Whether a store into ``pool`` is exactly a row write of each layer's [slots, H_kv, D] buffers, as the
    sparse kernel does it: SGLang's MHA pool itself (no subclass store), unquantized, stored in its dtype,
    token-major, one decode-context-parallel rank. An attribute a release lacks counts as not plain."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    return (
        getattr(type(pool), "set_kv_buffer", None) is MHATokenToKVPool.set_kv_buffer
        and getattr(pool, "is_quantized_kv_cache", True) is False
        and getattr(pool, "store_dtype", None) == pool.dtype
        and getattr(pool, "use_hnd", True) is False
        and dcp_size == 1
    )


class PillarDraftBackend(TritonAttnBackend):
    """Decode attention of the draft steps; everything else is the stock Triton backend.

    With ``oracle`` the positions come from ``oracle_select`` on the step's own query
    (analysis only); otherwise from the plan of each request's pool row in ``state``.
    """

    def __init__(
        self,
        model_runner,
        state: PlanState,
        inputs: DraftStepInputs,
        oracle: bool,
        plain: bool = False,
        fused: bool = True,
    ):
        super().__init__(model_runner)
        self.state = state
        self.inputs = inputs
        self.req_to_token = model_runner.req_to_token_pool.req_to_token
        self.oracle = oracle
        self.whole_prefix = False  # the current step is the plain step
        self.segments: SegmentMeta | None = None  # the current step is a mixed-phase forward
        self.whole: WholePrefixMeta | None = None
        self.stores_in_kernel = (
            fused and not oracle and plain_mha_pool(self.token_to_kv_pool, getattr(self, "dcp_size", 1))
        )
        if plain:
            max_bs = inputs.req_pool_indices.shape[0]
            # Every row may reach the context length: with the radix cache, rows share prefix slots, so
            # the rows' lengths can sum past the KV pool's size (SGLang sizes its graph buffer so too).
            slots = max_bs * self.max_context_len
            splits = (max_bs, self.num_head, self.max_kv_splits)
            with torch.device(model_runner.device):
                self.whole = WholePrefixMeta(
                    kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32),
                    kv_indices=torch.zeros(slots, dtype=torch.int64),
                    num_kv_splits=torch.full((max_bs,), self.max_kv_splits, dtype=torch.int32),
                    attn_logits=torch.zeros((*splits, self.v_head_dim), dtype=torch.float32),
                    attn_lse=torch.zeros(splits, dtype=torch.float32),
                )
        if oracle:
            max_bs = inputs.req_pool_indices.shape[0]
            self.oracle_pos = torch.empty(
                (max_bs, state.num_kv_heads, state.kmax), dtype=torch.int32, device=model_runner.device
            )
            self.oracle_cnt = torch.empty(max_bs, dtype=torch.int32, device=model_runner.device)

    def plan(self, bs: int, whole_prefix: bool, segments: SegmentMeta | None = None) -> None:
        """Before a step's forward, what every layer's attention shares: for the plain step
        (``whole_prefix``), SGLang's decode metadata over the step's seq_lens; a draft step shares nothing;
        ``segments``: the verify segments after ``bs`` draft rows of a mixed-phase forward."""
        self.whole_prefix = whole_prefix
        self.segments = segments
        if not whole_prefix:
            return
        if self.whole is None:
            raise RuntimeError("PillarDraftBackend built without the plain step's metadata (plain=False)")
        inputs = self.inputs
        rpi, seq_lens, meta = inputs.req_pool_indices[:bs], inputs.seq_lens[:bs], self.whole
        kv_indptr = meta.kv_indptr[: bs + 1]
        kv_indptr[1:] = torch.cumsum(seq_lens, dim=0)
        create_flashinfer_kv_indices_triton[(bs,)](
            self.req_to_token, rpi, seq_lens, kv_indptr, None, meta.kv_indices, self.req_to_token.stride(0)
        )
        self.get_num_kv_splits(meta.num_kv_splits[:bs], seq_lens)

    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        if layer.sliding_window_size is not None and layer.sliding_window_size > -1:
            raise NotImplementedError("PILLAR drafting does not support sliding-window attention layers")
        if layer.qk_head_dim != layer.v_head_dim:
            raise NotImplementedError("PILLAR drafting needs equal K and V head dims")
        deferred = take_deferred()  # the model's q/k norm and rotary calls, left to this call (patches/draft_qk.py)
        loc = forward_batch.out_cache_loc
        # A draft step's own rows store their K/V inside the sparse kernel; the plain step (SGLang's decode
        # kernel) and mixed-phase forwards (every row written before any attends) store first.
        in_kernel = (
            save_kv_cache
            and self.stores_in_kernel
            and not self.whole_prefix
            and self.segments is None
            and isinstance(loc, torch.Tensor)
            and k.dtype == self.token_to_kv_pool.dtype
            and layer.k_scale is None
            and layer.v_scale is None
        )
        if deferred is not None and not in_kernel:
            q, k = deferred.apply(q, k)
        q = q.reshape(-1, layer.tp_q_head_num, layer.qk_head_dim)
        if save_kv_cache and not in_kernel:
            self._set_kv_buffer(forward_batch, layer, loc, k, v, layer.k_scale, layer.v_scale)
        k_buffer = self.token_to_kv_pool.get_key_buffer(layer.layer_id)
        v_buffer = self.token_to_kv_pool.get_value_buffer(layer.layer_id)
        logit_cap = logit_capping_mod(layer.logit_capping_method, layer.logit_cap)
        if self.whole_prefix:
            return self._whole_prefix_decode(q, k_buffer, v_buffer, layer, logit_cap)
        o = torch.empty_like(q)
        seg = self.segments
        n = q.shape[0] if seg is None else seg.draft_rows
        if seg is not None:
            self._verify_segments(q[n:], k, v, o[n:], layer, k_buffer, v_buffer, logit_cap, seg)
        new_kv = prologue = None
        if in_kernel:
            new_kv = (k.reshape(n, layer.tp_k_head_num, -1), v.reshape(n, layer.tp_v_head_num, -1), loc)
            prologue = deferred
        self._sparse_decode(q[:n], o[:n], layer, k_buffer, v_buffer, logit_cap, new_kv, prologue)
        return o.view(q.shape[0], -1)

    def _verify_segments(self, q, k, v, o, layer, k_buffer, v_buffer, logit_cap, seg: SegmentMeta) -> None:
        """The verify rows of a mixed-phase forward (their K/V already in the cache), as PILLAR's
        TARGET_VERIFY attends (``patches/triton_verify.py``), scores included."""
        n = seg.draft_rows
        k_ext = k.reshape(-1, layer.tp_k_head_num, layer.qk_head_dim)[n:]
        v_ext = v.reshape(-1, layer.tp_v_head_num, layer.v_head_dim)[n:]
        sink = seg.sink
        lse = sink.lse_buffer(q.shape[0], q.shape[1]) if sink is not None else None
        verify_attention_fwd(
            q, k_ext, v_ext, o, k_buffer, v_buffer, seg.qo_indptr, seg.kv_indptr, seg.kv_indices,
            seg.width, layer.scaling, logit_cap=logit_cap, lse=lse,
        )  # fmt: skip
        if sink is not None:
            sink.capture_layer(
                layer.layer_id, q, k_buffer, lse, seg.qo_indptr, seg.kv_indptr, seg.kv_indices, layer.scaling, logit_cap
            )

    def _sparse_decode(
        self, q, o, layer, k_buffer, v_buffer, logit_cap, new_kv=None, prologue: DeferredQK | None = None
    ) -> None:
        rope = norm = None
        if prologue is not None and prologue.rope is not None:
            rope = (prologue.rope.cos_sin, prologue.rope.positions)
        if prologue is not None and prologue.norm is not None:
            qk = prologue.norm
            norm = (qk.q_weight, qk.k_weight, qk.q_eps, qk.k_eps)
        bs = q.shape[0]
        inputs = self.inputs
        rpi, tail_start, seq_lens = inputs.req_pool_indices[:bs], inputs.tail_start[:bs], inputs.seq_lens[:bs]
        if self.oracle:
            oracle_select(
                q, k_buffer, self.req_to_token, rpi, seq_lens, tail_start, inputs.sel_cnt[:bs],
                layer.scaling, logit_cap, self.oracle_pos, self.oracle_cnt,
            )  # fmt: skip
            sel_pos, sel_cnt, sel_rows = self.oracle_pos, self.oracle_cnt, None
        else:
            sel_pos, sel_cnt, sel_rows = self.state.layer(layer.layer_id), self.state.sel_cnt, rpi
        dense = self.state.dense_heads(layer.layer_id)
        heads = self.state.match_heads(layer.layer_id)
        match = None if heads is None or self.oracle else (inputs.match_lists, inputs.match_cnt, heads)
        sparse_decode_fwd(
            q,
            k_buffer,
            v_buffer,
            o,
            self.req_to_token,
            rpi,
            sel_pos,
            sel_cnt,
            tail_start,
            seq_lens,
            layer.scaling,
            logit_cap=logit_cap,
            sel_rows=sel_rows,
            new_kv=new_kv,
            rope=rope,
            qk_norm=norm,
            dense_heads=dense,
            match=match,
            num_kv_splits=None if dense is None else DENSE_SPLITS,
        )

    def _whole_prefix_decode(self, q, k_buffer, v_buffer, layer, logit_cap):
        """The plain step's attention: SGLang's decode kernel as its Triton backend calls it (no KV
        scales: the draft backend serves unquantised KV only)."""
        meta, bs = self.whole, q.shape[0]
        o = torch.empty_like(q)
        self.decode_attention_fwd(
            q,
            k_buffer,
            v_buffer,
            o,
            meta.kv_indptr[: bs + 1],
            meta.kv_indices,
            meta.attn_logits,
            meta.attn_lse,
            meta.num_kv_splits[:bs],
            self.max_kv_splits,
            layer.scaling,
            1.0,
            1.0,
            logit_cap=logit_cap,
            sinks=None,
            xai_temperature_len=layer.xai_temperature_len,
            has_mla=False,
            use_pdl=self.use_pdl,
            page_size=self.page_size,
        )
        return o.view(bs, -1)
