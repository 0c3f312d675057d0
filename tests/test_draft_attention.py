"""The draft steps' attention as the GPU runs it: the draft runner's round prologue writes the plans'
KV slots (``kernels/plan_slots.py``), and ``PillarDraftBackend.forward_decode`` reads them per layer
(``PlanState.layer_of``). Checked against the plain-torch sparse attention over each layer's planned
positions, for per-(layer, KV head) plans and for one plan shared by every layer and head."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang_sparsespec.kernels.plan_slots import plan_slots_fwd
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_ref
from sglang_sparsespec.patches.draft_attention import DraftStepInputs, PillarDraftBackend
from triton_env import DEVICE

from sglang_sparsespec.selection.state import PlanState

LAYERS, H_KV, GROUP, D, KMAX = 3, 2, 3, 64, 24


@pytest.mark.parametrize("per_head", [True, False])
def test_forward_decode_reads_each_layers_plan_through_the_round_slots(per_head: bool) -> None:
    torch.manual_seed(7)
    bs, rows, slots_n, ctx = 3, 6, 600, 128
    rpi = torch.tensor([4, 1, 5], device=DEVICE)
    seq_lens = torch.tensor([90, 40, 120], device=DEVICE)
    tail_start = torch.tensor([70, 30, 0], dtype=torch.int32, device=DEVICE)  # request 2 drafts densely
    req_to_token = torch.zeros(rows, ctx, dtype=torch.int32, device=DEVICE)
    req_to_token[rpi] = torch.randperm(slots_n - 1, device=DEVICE)[: bs * ctx].view(bs, ctx).to(torch.int32) + 1
    state = PlanState.allocate(rows, LAYERS, H_KV, per_head, KMAX, torch.device(DEVICE))
    for b in range(bs):
        r, ts = int(rpi[b]), int(tail_start[b]) or 60
        for g in range(state.sel_pos.shape[1]):
            state.sel_pos[r, g, :20] = torch.randperm(ts, device=DEVICE)[:20].sort().values.to(torch.int32)
        state.sel_cnt[r], state.tail_start[r] = 20, int(tail_start[b])
    inputs = DraftStepInputs(
        req_pool_indices=rpi, tail_start=tail_start, sel_cnt=torch.zeros(bs, dtype=torch.int32, device=DEVICE),
        seq_lens=seq_lens, sel_slots=torch.full((bs, *state.sel_pos.shape[1:]), -1, dtype=torch.int32, device=DEVICE),
    )  # fmt: skip
    # The round's prologue (PillarDraftRunner._begin_round), then one decode attention per layer.
    plan_slots_fwd(state.sel_pos, state.sel_cnt, rpi, tail_start, req_to_token, rpi, inputs.sel_slots)
    kv = [(torch.randn(slots_n, H_KV, D, device=DEVICE).bfloat16(), torch.randn(slots_n, H_KV, D, device=DEVICE).bfloat16())
          for _ in range(LAYERS)]  # fmt: skip
    backend = SimpleNamespace(
        state=state, inputs=inputs, req_to_token=req_to_token, oracle=False,
        token_to_kv_pool=SimpleNamespace(get_key_buffer=lambda i: kv[i][0], get_value_buffer=lambda i: kv[i][1]),
    )  # fmt: skip
    for layer_id in range(LAYERS):
        layer = SimpleNamespace(
            layer_id=layer_id, sliding_window_size=None, qk_head_dim=D, v_head_dim=D, tp_q_head_num=H_KV * GROUP,
            logit_capping_method="tanh", logit_cap=0.0, scaling=D**-0.5,
        )  # fmt: skip
        q = torch.randn(bs, H_KV * GROUP * D, device=DEVICE).bfloat16()
        out = PillarDraftBackend.forward_decode(backend, q, None, None, layer, None, save_kv_cache=False)
        expected = torch.empty(bs, H_KV * GROUP, D, dtype=q.dtype, device=DEVICE)
        sparse_decode_ref(
            q.view(bs, -1, D), *kv[layer_id], expected, req_to_token, rpi, state.layer(layer_id), state.sel_cnt,
            tail_start, seq_lens, D**-0.5, sel_rows=rpi,
        )  # fmt: skip
        torch.testing.assert_close(out.view_as(expected).float(), expected.float(), rtol=2e-2, atol=2e-2)
