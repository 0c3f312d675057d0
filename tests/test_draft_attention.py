"""``PillarDraftBackend``'s attention (Triton's CPU interpreter without a GPU): the plain step's, SGLang's decode
kernel over metadata the backend builds on the device (``plan(whole_prefix=True)``), equals attention over each
request's whole prefix, read through its own ``req_to_token`` row; a draft step's stores its K/V once, inside the
sparse kernel only on SGLang's plain MHA pool, and attends as the sparse reference does."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang_sparsespec.kernels.qk_prologue import rms_norm_ref, rope_neox_ref
from sglang_sparsespec.kernels.sparse_decode_ref import sparse_decode_ref
from sglang_sparsespec.kernels.token_match import match_lists_fwd
from sglang_sparsespec.patches import draft_qk as dq
from sglang_sparsespec.patches.draft_attention import (
    DraftStepInputs,
    PillarDraftBackend,
    WholePrefixMeta,
    plain_mha_pool,
)
from triton_env import DEVICE

H_Q, H_KV, D, SPLITS = 6, 2, 64, 4


def _backend(max_bs: int, req_to_token: torch.Tensor) -> PillarDraftBackend:
    # Only the fields the plain step reads: TritonAttnBackend.__init__ needs a whole model runner.
    be = PillarDraftBackend.__new__(PillarDraftBackend)
    be.req_to_token = req_to_token
    zeros = lambda dtype: torch.zeros(max_bs, dtype=dtype, device=DEVICE)  # noqa: E731
    be.inputs = DraftStepInputs(zeros(torch.int64), zeros(torch.int32), zeros(torch.int32), zeros(torch.int64))
    be.whole = WholePrefixMeta(
        kv_indptr=torch.zeros(max_bs + 1, dtype=torch.int32, device=DEVICE),
        kv_indices=torch.zeros(req_to_token.numel(), dtype=torch.int64, device=DEVICE),
        num_kv_splits=torch.zeros(max_bs, dtype=torch.int32, device=DEVICE),
        attn_logits=torch.zeros((max_bs, H_Q, SPLITS, D), dtype=torch.float32, device=DEVICE),
        attn_lse=torch.zeros((max_bs, H_Q, SPLITS), dtype=torch.float32, device=DEVICE),
    )
    be.oracle = False
    be.max_kv_splits, be.num_head, be.num_kv_head = SPLITS, H_Q, H_KV
    be.static_kv_splits, be.enable_deterministic, be.split_tile_size = False, False, None
    be.device_core_count = 132  # an H100/H200's SM count: the split heuristic's input
    be.decode_attention_fwd = decode_attention_fwd
    be.use_pdl, be.page_size = False, 1
    return be


def test_whole_prefix_step_attends_every_position_of_its_row():
    gen = torch.Generator().manual_seed(3)
    rows, width, slots = 4, 40, 200
    # Each pool row maps its positions to distinct scattered slots of the KV pool.
    req_to_token = torch.randperm(slots, generator=gen)[: rows * width].view(rows, width).to(torch.int32).to(DEVICE)
    k_buf = torch.randn(slots, H_KV, D, generator=gen).to(torch.bfloat16).to(DEVICE)
    v_buf = torch.randn(slots, H_KV, D, generator=gen).to(torch.bfloat16).to(DEVICE)
    be = _backend(max_bs=4, req_to_token=req_to_token)
    rpi, lens = [2, 0, 3], [33, 5, 17]
    bs = len(rpi)
    be.inputs.req_pool_indices[:bs] = torch.tensor(rpi)
    be.inputs.seq_lens[:bs] = torch.tensor(lens)
    be.plan(bs, whole_prefix=True)
    assert be.whole_prefix and be.whole.kv_indptr[: bs + 1].tolist() == [0, 33, 38, 55]
    q = torch.randn(bs, H_Q, D, generator=gen).to(torch.bfloat16).to(DEVICE)
    layer = SimpleNamespace(scaling=D**-0.5, xai_temperature_len=-1)
    out = be._whole_prefix_decode(q, k_buf, v_buf, layer, 0.0).view(bs, H_Q, D).float()
    group = H_Q // H_KV
    for b, (row, n) in enumerate(zip(rpi, lens)):
        slots_b = req_to_token[row, :n].long()
        for h in range(H_Q):
            k, v = k_buf[slots_b, h // group].float(), v_buf[slots_b, h // group].float()
            p = torch.softmax(q[b, h].float() @ k.T * layer.scaling, dim=-1)
            torch.testing.assert_close(out[b, h], p @ v, atol=2e-2, rtol=2e-2)


class _Pool(MHATokenToKVPool):
    """SGLang's MHA pool as the draft backend sees it: its own store, unquantized bf16 [slots, H_KV, D] rows."""

    is_quantized_kv_cache = False  # the class's property reads a quant method this stand-in does not build

    def __init__(self, slots: int, gen: torch.Generator):
        self.dtype = self.store_dtype = torch.bfloat16
        self.use_hnd = False
        self.k = torch.randn(slots, H_KV, D, generator=gen).to(torch.bfloat16).to(DEVICE)
        self.v = torch.randn(slots, H_KV, D, generator=gen).to(torch.bfloat16).to(DEVICE)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v


def test_only_a_plain_mha_pool_takes_the_store_inside_the_sparse_kernel():
    gen = torch.Generator().manual_seed(4)
    pool = _Pool(8, gen)
    assert plain_mha_pool(pool, dcp_size=1)
    assert not plain_mha_pool(pool, dcp_size=2)
    for name, value in (("store_dtype", torch.uint8), ("use_hnd", True), ("is_quantized_kv_cache", True)):
        changed = _Pool(8, gen)
        setattr(changed, name, value)
        assert not plain_mha_pool(changed, dcp_size=1), name

    class OwnStore(_Pool):
        def set_kv_buffer(self, *args, **kwargs) -> None:  # e.g. a pool that tracks what it stores
            raise AssertionError

    assert not plain_mha_pool(OwnStore(8, gen), dcp_size=1)
    release_without = SimpleNamespace(dtype=torch.bfloat16, store_dtype=torch.bfloat16, set_kv_buffer=None)
    assert not plain_mha_pool(release_without, dcp_size=1)


def _draft_step_backend(
    pool: _Pool,
    req_to_token: torch.Tensor,
    sel_pos: torch.Tensor,
    sel_cnt: torch.Tensor,
    dense: torch.Tensor | None,
    match: torch.Tensor | None = None,
):
    be = _backend(max_bs=4, req_to_token=req_to_token)
    be.token_to_kv_pool = pool
    be.state = SimpleNamespace(
        layer=lambda layer_id: sel_pos,
        sel_cnt=sel_cnt,
        dense_heads=lambda layer_id: dense,
        match_heads=lambda layer_id: match,
    )
    be.whole_prefix, be.segments = False, None
    be.stores_in_kernel = plain_mha_pool(pool, dcp_size=1)
    return be


@pytest.mark.parametrize("rope, norm", [(False, False), (True, False), (True, True)])
@pytest.mark.parametrize("plain_pool", [True, False])
@pytest.mark.parametrize("listed", [None, "dense", "match"])
def test_a_draft_step_stores_its_kv_once_and_attends_as_the_reference(monkeypatch, plain_pool, rope, norm, listed):
    """forward_decode of a draft step: with SGLang's plain pool the sparse kernel writes the step's K/V (SGLang's
    store is not called), otherwise SGLang's store runs first; the cache and the output are the same either way.
    A q/k norm and rotary embedding the model deferred (``norm``, ``rope``) are applied in the kernel, or by their
    own calls before the store. A dense KV head (``listed``: the second) attends its whole prefix, a match head its
    plan and the step's token matches."""
    gen = torch.Generator().manual_seed(5)
    rows, width, slots = 3, 48, 160
    req_to_token = torch.randperm(slots, generator=gen)[: rows * width].view(rows, width).to(torch.int32).to(DEVICE)
    pool = _Pool(slots, gen)
    if not plain_pool:
        pool.use_hnd = True  # any non-plain pool: SGLang's own store must write it
    sel_pos = torch.full((rows, H_KV, 8), -1, dtype=torch.int32, device=DEVICE)
    sel_pos[:, :, :3] = torch.tensor([1, 4, 9], dtype=torch.int32)
    sel_cnt = torch.full((rows,), 3, dtype=torch.int32, device=DEVICE)
    second = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)
    list_rows = torch.tensor([-1, 0], dtype=torch.int32, device=DEVICE)  # the second head reads the first list
    dense, heads = (second if listed == "dense" else None), (list_rows if listed == "match" else None)
    be = _draft_step_backend(pool, req_to_token, sel_pos, sel_cnt, dense, heads)
    assert be.stores_in_kernel is plain_pool
    stored = []

    def sglang_store(forward_batch, layer, loc, k, v, k_scale, v_scale):
        stored.append(loc)
        pool.k[loc], pool.v[loc] = k.view(-1, H_KV, D), v.view(-1, H_KV, D)

    monkeypatch.setattr(be, "_set_kv_buffer", sglang_store)
    rpi, lens, tails = [2, 0], [40, 12], [30, 10]
    bs = len(rpi)
    be.inputs.req_pool_indices[:bs], be.inputs.seq_lens[:bs] = torch.tensor(rpi), torch.tensor(lens)
    be.inputs.tail_start[:bs] = torch.tensor(tails, dtype=torch.int32)
    match = None
    if heads is not None:  # request 0: two fresh positions, a selected one and one in the tail; request 1: none
        be.inputs.match_pos = torch.tensor([[20, 4, 33, 7], [-1, -1, -1, -1]], dtype=torch.int32, device=DEVICE)
        be.inputs.match_cnt = torch.tensor([4, 0], dtype=torch.int32, device=DEVICE)
        be.inputs.match_lists = torch.full((1, 2, 4), -1, dtype=torch.int32, device=DEVICE)
        match_lists_fwd(
            be.inputs.match_pos, be.inputs.match_cnt, sel_pos, sel_cnt, torch.tensor(rpi, device=DEVICE),
            torch.tensor([1], dtype=torch.int32, device=DEVICE), be.inputs.match_lists,
        )  # fmt: skip
        assert be.inputs.match_lists[0, 0].tolist() == [20, -1, 33, 7]  # 4 is in the plan
        match = (be.inputs.match_lists, be.inputs.match_cnt, heads)
    loc = req_to_token[torch.tensor(rpi), torch.tensor(lens) - 1].long()
    q = torch.randn(bs, H_Q * D, generator=gen).to(torch.bfloat16).to(DEVICE)
    k = torch.randn(bs, H_KV * D, generator=gen).to(torch.bfloat16).to(DEVICE)
    v = torch.randn(bs, H_KV * D, generator=gen).to(torch.bfloat16).to(DEVICE)
    ref_k, ref_v = pool.k.clone(), pool.v.clone()
    layer = SimpleNamespace(
        layer_id=0, scaling=D**-0.5, sliding_window_size=None, qk_head_dim=D, v_head_dim=D, tp_q_head_num=H_Q,
        tp_k_head_num=H_KV, tp_v_head_num=H_KV, k_scale=None, v_scale=None, logit_capping_method="tanh", logit_cap=0.0,
    )  # fmt: skip
    kernel_rope = kernel_norm = deferred_norm = deferred_rope = None
    if norm:
        weights = [(torch.rand(D, generator=gen) + 0.5).to(torch.bfloat16).to(DEVICE) for _ in range(2)]
        kernel_norm = (*weights, 1e-6, 1e-6)

        def sglang_norm(q_, k_):
            return (
                rms_norm_ref(q_.view(bs, -1, D), weights[0], 1e-6).view(bs, -1),
                rms_norm_ref(k_.view(bs, -1, D), weights[1], 1e-6).view(bs, -1),
            )

        deferred_norm = dq.DeferredNorm(*kernel_norm, sglang_norm)
    if rope:
        half = D // 2
        angles = torch.arange(64, dtype=torch.float32)[:, None] / 10000 ** (torch.arange(half) / half)[None, :]
        cos_sin = torch.cat([angles.cos(), angles.sin()], dim=-1).to(DEVICE)
        positions = be.inputs.seq_lens[:bs] - 1

        def sglang_rope(pos, q_, k_):
            return (
                rope_neox_ref(q_.view(bs, -1, D), cos_sin, pos).view(bs, -1),
                rope_neox_ref(k_.view(bs, -1, D), cos_sin, pos).view(bs, -1),
            )

        kernel_rope = (cos_sin, positions)
        deferred_rope = dq.DeferredRope(cos_sin, positions, sglang_rope)
    dq._NORM.set(deferred_norm)
    dq._ROPE.set(deferred_rope)
    out = be.forward_decode(q, k, v, layer, SimpleNamespace(out_cache_loc=loc))
    assert dq.take_deferred() is None
    assert len(stored) == (0 if plain_pool else 1)
    expected = torch.empty(bs, H_Q, D, dtype=torch.bfloat16, device=DEVICE)
    sparse_decode_ref(
        q.view(bs, H_Q, D), ref_k, ref_v, expected, req_to_token, be.inputs.req_pool_indices[:bs], sel_pos, sel_cnt,
        be.inputs.tail_start[:bs], be.inputs.seq_lens[:bs], D**-0.5, sel_rows=be.inputs.req_pool_indices[:bs],
        new_kv=(k.view(bs, H_KV, D), v.view(bs, H_KV, D), loc), rope=kernel_rope, qk_norm=kernel_norm,
        dense_heads=dense, match=match,
    )  # fmt: skip
    # normalized and rotated keys: bf16 rounding after each step, in whatever order the sums ran
    torch.testing.assert_close(pool.k.float(), ref_k.float(), atol=2e-2, rtol=2e-2)
    assert torch.equal(pool.v, ref_v)
    torch.testing.assert_close(out.view(bs, H_Q, D).float(), expected.float(), atol=2e-2, rtol=2e-2)
