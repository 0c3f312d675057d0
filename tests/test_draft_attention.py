"""The plain step's attention in ``PillarDraftBackend``: SGLang's decode kernel over metadata the
backend builds on the device (``plan(whole_prefix=True)``) equals attention over each request's whole
prefix, read through its own ``req_to_token`` row (Triton's CPU interpreter without a GPU)."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
from sglang_sparsespec.patches.draft_attention import DraftStepInputs, PillarDraftBackend, WholePrefixMeta
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
