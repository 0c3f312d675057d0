"""Tensor parallelism on CPU: each rank's PILLAR state, selection and draft attention over its own
heads, identical draft tokens and round shapes across ranks (``--tp-size`` validation: test_plugin)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang_sparsespec.kernels.score_capture import score_capture
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd
from sglang_sparsespec.kernels.topk_select import topk_select
from sglang_sparsespec.patches.draft_runner import PillarDraftRunner
from sglang_sparsespec.patches.tp_agree import RoundAgreement
from kernel_cases import D, indptr, kv_pool, verify_lse
from triton_env import DEVICE

from sglang_sparsespec.selection.scores import VerifyScoreSink
from sglang_sparsespec.selection.state import PlanState

# 8 query heads over 4 KV heads (group 2), as a GQA model; tp = 8 replicates the KV heads.
H_Q, H_KV = 8, 4


def _local_heads(tp: int) -> tuple[int, int]:
    """(query heads, KV heads) per rank, from SGLang's own rule (num_kv_heads = max(1, total // tp))."""
    from sglang.srt.configs.model_config import ModelConfig

    mc = SimpleNamespace(get_total_num_kv_heads=lambda: H_KV, is_draft_model=False)  # read from 0.5.23 (DCP)
    return H_Q // tp, ModelConfig.get_num_kv_heads(mc, tp)


@pytest.mark.parametrize("tp, local", [(1, (8, 4)), (2, (4, 2)), (4, (2, 1)), (8, (1, 1))])
def test_rank_local_state_and_sink_shapes(tp, local):
    h_q, h_kv = _local_heads(tp)
    assert (h_q, h_kv) == local
    # As init_attention_backends sizes them, from the rank's backend (num_head, num_kv_head).
    state = PlanState.allocate(5, 3, h_kv, True, 16, torch.device(DEVICE))
    assert state.sel_pos.shape == (5, 3 * h_kv, 16) and state.layer(2).shape == (5, h_kv, 16)
    sink = VerifyScoreSink(3, h_kv, h_q, 100, max_q_rows=36, per_layer=True, device=torch.device(DEVICE))
    assert sink.mass.shape == (3, h_kv, 100)


def _rank_slice(t: torch.Tensor, rank: int, tp: int) -> torch.Tensor:
    per = t.shape[1] // tp
    return t[:, rank * per : (rank + 1) * per].contiguous()


@pytest.mark.parametrize("tp", [2, 4])
def test_per_rank_selection_and_draft_attention_equal_the_tp1_slices(tp):
    """Each rank captures scores, selects and decodes over its own KV heads (its slice of q, the KV
    pool and the verify LSE); the results equal the same heads of the single-rank run."""
    gen = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    prefix_lens, qo_lens, kmax, splits = [30, 12], [3, 3], 8, 2
    total, num_slots = sum(prefix_lens), 64
    k_buffer, v_buffer = kv_pool(num_slots, H_KV)
    kv_indices = (torch.randperm(num_slots - 1, generator=gen)[:total] + 1).to(torch.int32).to(DEVICE)
    qo_indptr, kv_indptr = indptr(qo_lens), indptr(prefix_lens)
    q = torch.randn(sum(qo_lens), H_Q, D, device=DEVICE).to(torch.bfloat16)
    k_ext = torch.randn(sum(qo_lens), H_KV, D, device=DEVICE).to(torch.bfloat16)
    lse = verify_lse(q, k_buffer, qo_indptr, kv_indptr, kv_indices, k_ext, D**-0.5)
    req_to_token = torch.zeros(2, 40, dtype=torch.int32, device=DEVICE)
    for b in range(2):
        req_to_token[b, : prefix_lens[b]] = kv_indices[kv_indptr[b] : kv_indptr[b + 1]]
    seq_lens = torch.tensor(prefix_lens, device=DEVICE)
    tail_start = (seq_lens - 2).to(torch.int32)
    qd = torch.randn(2, H_Q, D, device=DEVICE).to(torch.bfloat16)
    rpi = torch.arange(2, device=DEVICE)
    budget, cand = torch.tensor([6, 9], device=DEVICE), seq_lens - 2

    def run(q, k_buffer, v_buffer, lse, qd):
        h_kv = k_buffer.shape[1]
        scores = torch.zeros((h_kv, total + 4), device=DEVICE)
        score_capture(q, k_buffer, lse, qo_indptr, kv_indptr, kv_indices, scores, D**-0.5, num_splits=splits)
        sel = torch.empty(2, h_kv, kmax, dtype=torch.int32, device=DEVICE)
        cnt = torch.empty(2, dtype=torch.int32, device=DEVICE)
        topk_select(scores, kv_indptr[:-1], cand, budget, sel, cnt)
        o = torch.empty_like(qd)
        sparse_decode_fwd(
            qd, k_buffer, v_buffer, o, req_to_token, rpi, sel, cnt, tail_start, seq_lens, D**-0.5, num_kv_splits=splits
        )
        return scores, sel, cnt, o

    full = run(q, k_buffer, v_buffer, lse, qd)
    for rank in range(tp):
        scores, sel, cnt, o = run(*(_rank_slice(t, rank, tp) for t in (q, k_buffer, v_buffer, lse, qd)))
        per = H_KV // tp
        assert torch.equal(scores, full[0][rank * per : (rank + 1) * per])
        assert torch.equal(sel, _rank_slice(full[1], rank, tp))
        assert torch.equal(cnt, full[2])
        assert torch.equal(o, _rank_slice(full[3], rank, tp))


def _draft_step(seed: int, logits: torch.Tensor) -> torch.Tensor:
    """One rank's draft sampling step: the runner's own ``_sample_step`` after SGLang's seeding."""
    bs, num_cand = logits.shape[0], 16
    runner = SimpleNamespace(
        num_cand=num_cand,
        seeded=False,  # no deterministic inference: the default generator draws the noise
        temperature=torch.full((bs,), 1.0),
        top_p=torch.full((bs,), 0.95),
        top_k=torch.full((bs,), 40, dtype=torch.int32),
        min_p=torch.zeros(bs),
        step_ids=torch.zeros((bs, num_cand), dtype=torch.int64),
        step_q=torch.zeros((bs, num_cand)),
        step_q_tok=torch.ones(bs),
    )
    torch.manual_seed(seed)  # set_random_seed(random_seed rank 0 broadcast) on every rank
    return torch.stack([PillarDraftRunner._sample_step(runner, logits, bs) for _ in range(3)])


def test_ranks_with_the_same_seed_draft_the_same_tokens():
    logits = torch.randn(8, 500, generator=torch.Generator().manual_seed(3)) * 3  # all-gathered: equal on all ranks
    rank0, rank1 = _draft_step(42, logits), _draft_step(42, logits)
    assert torch.equal(rank0, rank1)
    # The draws do depend on the generator state: a rank seeded differently would diverge.
    assert not torch.equal(rank0, _draft_step(43, logits))


def test_ranks_run_rank0s_round_shape():
    sent: list[torch.Tensor] = []

    def from_rank0(t: torch.Tensor) -> None:  # rank 0's message lands in every rank's buffer
        if not sent:
            sent.append(t.clone())
        t.copy_(sent[0])

    rank0, rank1 = RoundAgreement(from_rank0), RoundAgreement(from_rank0)
    assert rank0.agree(4, [False, True, False], 3) == (4, [False, True, False])
    assert rank1.agree(2, None, 3) == (4, [False, True, False])
    # Every rank gets exactly rank 0's choice, None and all-False apart: the worker calibrates a round
    # only when it ran as chosen, (steps, dense) == (choice.steps, choice.dense), at any TP size.
    for dense in ([False, False], None, [True, False]):
        sent.clear()
        assert rank0.agree(8, dense, 2) == (8, dense)
        assert rank1.agree(2, [True, True], 2) == (8, dense)
    assert RoundAgreement(None).agree(2, [True], 1) == (2, [True])
