"""PILLAR's Triton kernels vs their plain-torch references.

Without a GPU the kernels run in Triton's CPU interpreter (see triton_env.py); with CUDA
available they run compiled, so `pytest tests/test_kernels.py` on an H100 checks the real
kernels with the same cases.
Outputs are pre-filled with NaN / poison so entries a kernel fails to write (or writes but must
not) show up as mismatches against the reference, which receives the same pre-filled buffers.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sglang_sparsespec.kernels.draft_sample import DraftSampleInputs, draft_sample_fwd, draft_sample_ref
from sglang_sparsespec.kernels.score_capture import score_capture, score_capture_ref
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd, sparse_decode_ref
from sglang_sparsespec.kernels.topk_select import topk_select, topk_select_ref
from sglang_sparsespec.kernels.logit_bins import RowPath
from sglang_sparsespec.kernels.target_filter import TargetRows, target_filter_fwd
from sglang_sparsespec.kernels.verify_accept import rejection_fwd
from sglang_sparsespec.kernels.verify_attention import (
    verify_attention_fwd,
    verify_attention_ref,
)
from target_rows import rows_from_probs
from triton_env import DEVICE

from sglang_sparsespec.sampling.rejection import DraftRecord, rejection_sample

D = 64
POISON = 777


def _indptr(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32, device=DEVICE)


def _kv_pool(num_slots: int, h_kv: int, dtype=torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.randn(num_slots, h_kv, D, device=DEVICE).to(dtype)
    v = torch.randn(num_slots, h_kv, D, device=DEVICE).to(dtype)
    return k, v


def _verify_lse(q, k_buffer, qo_indptr, kv_indptr, kv_indices, k_ext, sm_scale, logit_cap=0.0):
    """LSE of each verify row's full attention (prefix + causal chain), from the verify reference."""
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    max_extend = int((qo_indptr[1:] - qo_indptr[:-1]).max())
    args = (q, k_ext, k_ext, torch.empty_like(q), k_buffer, k_buffer, qo_indptr, kv_indptr, kv_indices)
    verify_attention_ref(*args, max_extend, sm_scale, logit_cap, lse=lse)
    return lse


def _run_score_capture(group, prefix_lens, qo_lens, out_dtype, logit_cap, num_splits, transposed=None, last_row_only=False,
                       max_splits=None):  # fmt: skip
    h_kv = 2
    h_q = h_kv * group
    sm_scale = D**-0.5
    total = sum(prefix_lens)
    num_slots = total + 16
    k_buffer, _ = _kv_pool(num_slots, h_kv)
    kv_indices = (torch.randperm(num_slots - 1, device=DEVICE)[:total] + 1).to(torch.int64)
    qo_indptr, kv_indptr = _indptr(qo_lens), _indptr(prefix_lens)
    q = torch.randn(sum(qo_lens), h_q, D, device=DEVICE).to(torch.bfloat16)
    k_ext = torch.randn(sum(qo_lens), h_kv, D, device=DEVICE).to(torch.bfloat16)
    lse = _verify_lse(q, k_buffer, qo_indptr, kv_indptr, kv_indices, k_ext, sm_scale, logit_cap)
    out = torch.full((h_kv, total + 7), float("nan"), dtype=out_dtype, device=DEVICE)
    expected = out.clone()
    score_capture(q, k_buffer, lse, qo_indptr, kv_indptr, kv_indices, out, sm_scale, logit_cap, num_splits=num_splits,
                  transposed=transposed, last_row_only=last_row_only, max_splits=max_splits)
    score_capture_ref(q, k_buffer, lse, qo_indptr, kv_indptr, kv_indices, expected, sm_scale, logit_cap,
                      last_row_only=last_row_only)
    return out, expected, kv_indptr


@pytest.mark.parametrize(
    "group, transposed, last_row_only", [(1, True, False), (3, True, False), (3, False, False), (3, True, True), (3, False, True)]
)
def test_score_capture_ragged(group, transposed, last_row_only):
    torch.manual_seed(10 + group)
    # Ragged prefixes including L = 1 and an empty prefix; ragged verify widths; both tile orientations;
    # all verify rows or only each request's last one.
    prefix_lens, qo_lens = [37, 1, 0, 200], [4, 3, 4, 1]
    out, expected, kv_indptr = _run_score_capture(
        group, prefix_lens, qo_lens, torch.float32, 0.0, num_splits=2, transposed=transposed, last_row_only=last_row_only
    )
    total = kv_indptr[-1].item()
    assert not out[:, :total].isnan().any()
    assert out[:, total:].isnan().all()  # beyond the batch's prefixes nothing is written
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-6, equal_nan=True)
    # The scores are mean softmax probabilities: in [0, 1] and each request's mass is at most 1.
    assert (expected[:, :total] >= 0).all() and (expected[:, :total] <= 1).all()
    for b in range(len(prefix_lens)):
        assert (expected[:, kv_indptr[b] : kv_indptr[b + 1]].sum(dim=1) <= 1 + 1e-5).all()


def test_score_capture_last_row_only_scores_one_query():
    torch.manual_seed(15)
    prefix_lens, qo_lens = [37, 50], [4, 1]
    last, _, kv_indptr = _run_score_capture(3, prefix_lens, qo_lens, torch.float32, 0.0, num_splits=2, last_row_only=True)
    torch.manual_seed(15)
    every, _, _ = _run_score_capture(3, prefix_lens, qo_lens, torch.float32, 0.0, num_splits=2)
    a, b = kv_indptr[1].item(), kv_indptr[2].item()
    assert not torch.allclose(last[:, :a], every[:, :a])  # four verify rows: the last one alone differs
    torch.testing.assert_close(last[:, a:b], every[:, a:b])  # one verify row: the same thing


def test_score_capture_mixed_lengths_split_by_the_mean():
    torch.manual_seed(18)
    # One split for a uniform batch, cut to the mean (block 128 for this row block): the 900-token prefix
    # spreads over the default cap of 2 splits (512 + 388 positions), every position written once.
    out, expected, _ = _run_score_capture(3, [900, 40, 0, 60, 5], [4] * 5, torch.float32, 0.0, num_splits=1)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-6, equal_nan=True)
    # No balancing (cap = splits) and finer chunks of the mean (2 splits, up to 8).
    for splits, cap in ((1, 1), (2, 8)):
        out, expected, _ = _run_score_capture(3, [900, 40, 0, 60, 5], [4] * 5, torch.float32, 0.0, splits, max_splits=cap)
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-6, equal_nan=True)


@pytest.mark.parametrize("transposed", [True, False])
def test_score_capture_wide_request_softcap_fp16(transposed):
    torch.manual_seed(20)
    # One request far wider than the batch mean takes several row blocks of the kernel.
    out, expected, _ = _run_score_capture(
        3, [9, 40, 5, 1], [1, 12, 1, 1], torch.float16, 5.0, num_splits=3, transposed=transposed
    )
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-3, atol=1e-5, equal_nan=True)


def test_score_capture_device_flag_skips_the_launch():
    torch.manual_seed(25)
    prefix_lens, qo_lens = [30, 7], [3, 3]
    k_buffer, _ = _kv_pool(64, 2)
    kv_indices = (torch.randperm(63, device=DEVICE)[:37] + 1).to(torch.int64)
    qo_indptr, kv_indptr = _indptr(qo_lens), _indptr(prefix_lens)
    q = torch.randn(6, 6, D, device=DEVICE).to(torch.bfloat16)
    lse = _verify_lse(q, k_buffer, qo_indptr, kv_indptr, kv_indices, torch.randn(6, 2, D, device=DEVICE).to(torch.bfloat16),
                      D**-0.5)  # fmt: skip
    args = (q, k_buffer, lse, qo_indptr, kv_indptr, kv_indices)
    expected = score_capture_ref(*args, torch.full((2, 40), float("nan"), device=DEVICE), D**-0.5)
    for flag in (0, 1):
        out = torch.full((2, 40), float("nan"), device=DEVICE)
        score_capture(*args, out, D**-0.5, enabled=torch.tensor([flag], dtype=torch.int32, device=DEVICE))
        if flag:
            torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-6, equal_nan=True)
        else:
            assert out.isnan().all()  # skipped: nothing written


def test_score_capture_accumulates_layers():
    torch.manual_seed(30)
    prefix_lens, qo_lens = [23, 5, 64], [3, 3, 3]
    h_kv, group = 2, 3
    total = sum(prefix_lens)
    k_buffer, _ = _kv_pool(total + 4, h_kv)
    kv_indices = (torch.randperm(total + 3, device=DEVICE)[:total] + 1).to(torch.int64)
    qo_indptr, kv_indptr = _indptr(qo_lens), _indptr(prefix_lens)
    out = torch.full((h_kv, total + 5), float("nan"), dtype=torch.float32, device=DEVICE)
    expected = out.clone()
    for layer in range(3):  # layer 0 overwrites the NaN poison, later layers add
        q = torch.randn(sum(qo_lens), h_kv * group, D, device=DEVICE).to(torch.bfloat16)
        k_ext = torch.randn(sum(qo_lens), h_kv, D, device=DEVICE).to(torch.bfloat16)
        lse = _verify_lse(q, k_buffer, qo_indptr, kv_indptr, kv_indices, k_ext, D**-0.5)
        args = (q, k_buffer, lse, qo_indptr, kv_indptr, kv_indices)
        score_capture(*args, out, D**-0.5, accumulate=layer > 0, num_splits=2)
        score_capture_ref(*args, expected, D**-0.5, accumulate=layer > 0)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-6, equal_nan=True)
    assert not out[:, :total].isnan().any() and out[:, total:].isnan().all()
    # Three layers of mean probabilities: every request's summed mass is at most 3.
    for b in range(len(prefix_lens)):
        assert (expected[:, kv_indptr[b] : kv_indptr[b + 1]].sum(dim=1) <= 3 + 1e-4).all()


def _run_topk(scores, lens, ks, kmax, out_rows=None, n_out=None, block_n=4096):
    bs = len(lens)
    starts = _indptr(lens)[:-1]
    seg_len = torch.tensor(lens, dtype=torch.int64, device=DEVICE)
    k = torch.tensor(ks, dtype=torch.int32, device=DEVICE)
    n_out = n_out or bs
    out = torch.full((n_out, scores.shape[0], kmax), POISON, dtype=torch.int32, device=DEVICE)
    cnt = torch.full((n_out,), POISON, dtype=torch.int32, device=DEVICE)
    exp_out, exp_cnt = out.clone(), cnt.clone()
    topk_select(scores, starts, seg_len, k, out, cnt, out_rows, block_n=block_n)
    topk_select_ref(scores, starts, seg_len, k, exp_out, exp_cnt, out_rows)
    return out, cnt, exp_out, exp_cnt


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_topk_select_edge_cases(dtype):
    torch.manual_seed(30)
    # K < n, K == n, K > n, n = 0, K = 0, K > Kmax, n = 1 with K = 1.
    lens = [50, 7, 3, 0, 30, 40, 1]
    ks = [10, 7, 5, 3, 0, 100, 1]
    kmax = 16
    rows = 3  # e.g. 1 layer x 3 KV heads
    scores = torch.randn(rows, sum(lens) + 5, device=DEVICE)
    scores = (scores * 4).round() / 4  # many ties
    scores[1, 3:9] = float("-inf")
    scores[2, :20] = -0.0
    scores = scores.to(dtype)
    out_rows = torch.tensor([5, 0, 8, 2, 7, 3, 1], dtype=torch.int64, device=DEVICE)
    out, cnt, exp_out, exp_cnt = _run_topk(scores, lens, ks, kmax, out_rows, n_out=10)
    assert torch.equal(cnt, exp_cnt) and torch.equal(out, exp_out)
    assert cnt[4].item() == POISON and cnt[6].item() == POISON  # rows no request maps to stay untouched
    assert cnt[5].item() == 10 and cnt[0].item() == 7 and cnt[8].item() == 3 and cnt[2].item() == 0
    assert cnt[7].item() == 0 and cnt[3].item() == kmax and cnt[1].item() == 1
    assert (out[0, :, :7] == torch.arange(7, device=DEVICE, dtype=torch.int32)).all()
    assert (out[2] == -1).all() and (out[7] == -1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_select_long_rows_and_ties(dtype):
    torch.manual_seed(31)
    lens = [2500, 1100]
    scores = torch.rand(2, sum(lens), device=DEVICE)
    # Request 1, row 1: 200 clear winners at 0.9 and a 600-long tie block at 0.5 that the cut splits.
    scores[1, lens[0] : lens[0] + 600] = 0.5
    scores[1, lens[0] + 600 : lens[0] + 900] = 0.1
    scores[1, lens[0] + 900 :] = 0.9
    scores = scores.to(dtype)
    # Small tiles: the row spans many loop steps, so the carries between steps are exercised.
    out, cnt, exp_out, exp_cnt = _run_topk(scores, lens, [137, 250], kmax=256, block_n=256)
    assert torch.equal(cnt, exp_cnt) and torch.equal(out, exp_out)
    sel = out[0, 0, :137]
    assert (sel[1:] > sel[:-1]).all()  # sorted ascending, no duplicates
    kth = scores[0, : lens[0]].float().topk(137).values[-1]
    assert (scores[0, sel.long()] >= kth).all()
    # Ties at the cut go to the lowest positions.
    want = torch.cat([torch.arange(50), torch.arange(900, 1100)]).to(device=DEVICE, dtype=torch.int32)
    assert torch.equal(out[1, 1, :250], want)


def _make_decode_case(group, specs, kmax, h_kv=2, max_ctx=160):
    """specs: per request (seq_len, tail_start, cnt, n_beyond_tail), n_beyond_tail of the selected
    positions placed at or after tail_start (the kernel must drop them: the tail already has them)."""
    bs = len(specs)
    num_slots = sum(s[0] for s in specs) + 8
    k_buffer, v_buffer = _kv_pool(num_slots, h_kv)
    pool_reqs = bs + 3
    req_to_token = torch.zeros(pool_reqs, max_ctx, dtype=torch.int32, device=DEVICE)
    req_pool_indices = torch.randperm(pool_reqs, device=DEVICE)[:bs]
    free = (torch.randperm(num_slots - 1, device=DEVICE) + 1).to(torch.int32)
    n_sel_rows = bs + 2
    sel_rows = torch.randperm(n_sel_rows, device=DEVICE)[:bs]
    sel_pos = torch.full((n_sel_rows, h_kv, kmax), -1, dtype=torch.int32, device=DEVICE)
    sel_cnt = torch.full((n_sel_rows,), POISON, dtype=torch.int32, device=DEVICE)
    used = 0
    for b, (seq_len, tail_start, cnt, beyond) in enumerate(specs):
        req_to_token[req_pool_indices[b], :seq_len] = free[used : used + seq_len]
        used += seq_len
        row = sel_rows[b]
        sel_cnt[row] = cnt
        for h in range(h_kv):
            inside = torch.randperm(tail_start, device=DEVICE)[: cnt - beyond]
            outside = torch.randint(tail_start, max(seq_len, tail_start + 1), (beyond,), device=DEVICE).unique()
            pos = torch.cat([inside, outside]).sort().values
            sel_pos[row, h, : pos.numel()] = pos.to(torch.int32)
    q = torch.randn(bs, h_kv * group, D, device=DEVICE).to(torch.bfloat16)
    ints = lambda i: torch.tensor([s[i] for s in specs], dtype=torch.int64, device=DEVICE)  # noqa: E731
    return dict(
        q=q, k_buffer=k_buffer, v_buffer=v_buffer, req_to_token=req_to_token, req_pool_indices=req_pool_indices,
        sel_pos=sel_pos, sel_cnt=sel_cnt, tail_start=ints(1), seq_lens=ints(0), sm_scale=D**-0.5, sel_rows=sel_rows,
    )


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("num_kv_splits", [1, 3])  # 1: stage 1 writes the output, no merge launch
@pytest.mark.parametrize("group", [1, 3])
def test_sparse_decode_ragged(group, num_kv_splits, prefetch):
    torch.manual_seed(40 + group)
    kmax = 48
    specs = [
        (150, 90, 40, 3),  # 100 entries over 2 splits; a few selections fall in the tail: not counted twice
        (40, 33, 0, 0),  # budget 0: tail only
        (1, 0, 0, 0),  # L = 1: only the current token
        (70, 60, 48, 0),  # full budget (cnt == Kmax)
        (25, 25, 5, 0),  # empty tail: selections only
        (30, 30, 0, 0),  # nothing to attend to: zero output
    ]
    case = _make_decode_case(group, specs, kmax)
    o = torch.full_like(case["q"], float("nan"))
    expected = o.clone()
    sparse_decode_fwd(o=o, num_kv_splits=num_kv_splits, prefetch=prefetch, block_n=16, **case)
    sparse_decode_ref(o=expected, **case)
    assert not o.isnan().any()
    assert (o[5] == 0).all()
    torch.testing.assert_close(o.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_sparse_decode_dense_row_is_full_attention():
    """tail_start = 0 (a request drafting densely): its selections are ignored, whatever the count,
    and the output is plain attention over the whole prefix."""
    torch.manual_seed(45)
    group, h_kv = 3, 2
    case = _make_decode_case(group, [(120, 0, 20, 20), (64, 40, 10, 0)], kmax=24, h_kv=h_kv)
    o = torch.full_like(case["q"], float("nan"))
    sparse_decode_fwd(o=o, num_kv_splits=2, **case)
    slots = case["req_to_token"][case["req_pool_indices"][0], :120].long()
    k, v = case["k_buffer"][slots].float(), case["v_buffer"][slots].float()  # [120, H_kv, D]
    q = case["q"][0].float().view(h_kv, group, D)
    p = torch.softmax(torch.einsum("hgd,nhd->hgn", q, k) * case["sm_scale"], dim=-1)
    full = torch.einsum("hgn,nhd->hgd", p, v).reshape(h_kv * group, D)
    torch.testing.assert_close(o[0].float(), full, rtol=2e-2, atol=2e-2)
    expected = torch.full_like(o, float("nan"))
    sparse_decode_ref(o=expected, **case)
    torch.testing.assert_close(o.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_sparse_decode_softcap_default_rows_and_splits():
    torch.manual_seed(50)
    case = _make_decode_case(2, [(70, 60, 16, 0), (9, 4, 4, 0)], kmax=16)
    case["sel_pos"], case["sel_cnt"] = case["sel_pos"][case["sel_rows"]], case["sel_cnt"][case["sel_rows"]]
    case["sel_rows"] = None
    case["logit_cap"] = 2.0
    o = torch.full_like(case["q"], float("nan"))
    expected = o.clone()
    sparse_decode_fwd(o=o, **case)
    sparse_decode_ref(o=expected, **case)
    torch.testing.assert_close(o.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_capture_select_decode_pipeline():
    """Scores of two layers in one [L, H_kv, cap] buffer, one selection launch over all layers, then
    per-layer sparse decode on the layer slices: checks that the documented layouts compose."""
    torch.manual_seed(60)
    group, h_kv, num_layers, kmax = 3, 2, 2, 8
    prefix_lens, qo_lens = [30, 5], [3, 3]
    cap = sum(prefix_lens) + 4
    scores = torch.full((num_layers, h_kv, cap), float("nan"), device=DEVICE)
    qo_indptr, kv_indptr = _indptr(qo_lens), _indptr(prefix_lens)
    num_slots = 64
    kv_indices = (torch.randperm(num_slots - 1, device=DEVICE)[: sum(prefix_lens)] + 1).to(torch.int32)
    q = torch.randn(sum(qo_lens), h_kv * group, D, device=DEVICE).to(torch.bfloat16)
    k_ext = torch.randn(sum(qo_lens), h_kv, D, device=DEVICE).to(torch.bfloat16)
    buffers = [_kv_pool(num_slots, h_kv) for _ in range(num_layers)]
    for layer, (k_buffer, _) in enumerate(buffers):
        lse = _verify_lse(q, k_buffer, qo_indptr, kv_indptr, kv_indices, k_ext, D**-0.5)
        score_capture(q, k_buffer, lse, qo_indptr, kv_indptr, kv_indices, scores[layer], D**-0.5)
    budget = torch.tensor([6, 9], device=DEVICE)
    # Candidates: all but the last 2 prefix positions of each request.
    cand = torch.tensor(prefix_lens, device=DEVICE) - 2
    sel = torch.empty(2, num_layers * h_kv, kmax, dtype=torch.int32, device=DEVICE)
    cnt = torch.empty(2, dtype=torch.int32, device=DEVICE)
    exp_sel, exp_cnt = torch.empty_like(sel), torch.empty_like(cnt)
    flat = scores.view(num_layers * h_kv, cap)
    topk_select(flat, kv_indptr[:-1], cand, budget, sel, cnt)
    topk_select_ref(flat, kv_indptr[:-1], cand, budget, exp_sel, exp_cnt)
    assert cnt.tolist() == [6, 3] and torch.equal(sel, exp_sel)

    req_to_token = torch.zeros(2, 40, dtype=torch.int32, device=DEVICE)
    for b in range(2):
        req_to_token[b, : prefix_lens[b]] = kv_indices[kv_indptr[b] : kv_indptr[b + 1]]
    seq_lens = torch.tensor(prefix_lens, device=DEVICE)
    tail_start = seq_lens - 2
    qd = torch.randn(2, h_kv * group, D, device=DEVICE).to(torch.bfloat16)
    rpi = torch.arange(2, device=DEVICE)
    for layer, (k_buffer, v_buffer) in enumerate(buffers):
        sel_layer = sel[:, layer * h_kv : (layer + 1) * h_kv]
        o = torch.full_like(qd, float("nan"))
        expected = o.clone()
        args = (qd, k_buffer, v_buffer)
        sparse_decode_fwd(*args, o, req_to_token, rpi, sel_layer, cnt, tail_start, seq_lens, D**-0.5)
        sparse_decode_ref(*args, expected, req_to_token, rpi, sel_layer, cnt, tail_start, seq_lens, D**-0.5)
        torch.testing.assert_close(o.float(), expected.float(), rtol=2e-2, atol=2e-2)


def _make_verify_case(group, prefix_lens, qo_lens, pad_rows=3):
    h_kv = 2
    total = sum(prefix_lens)
    k_buffer, v_buffer = _kv_pool(total + 16, h_kv)
    kv_indices = (torch.randperm(total + 15, device=DEVICE)[:total] + 1).to(torch.int64)
    t = sum(qo_lens) + pad_rows  # padded rows no request owns: must stay untouched
    q = torch.randn(t, h_kv * group, D, device=DEVICE).to(torch.bfloat16)
    k_ext, v_ext = (torch.randn(t, h_kv, D, device=DEVICE).to(torch.bfloat16) for _ in range(2))
    return (q, k_ext, v_ext), (k_buffer, v_buffer, _indptr(qo_lens), _indptr(prefix_lens), kv_indices)


def _run_verify(group, prefix_lens, qo_lens, max_extend, logit_cap=0.0, num_kv_splits=None, max_kv_splits=None):
    (q, k_ext, v_ext), rest = _make_verify_case(group, prefix_lens, qo_lens)
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], float("nan"), device=DEVICE)
    exp_o, exp_lse = o.clone(), lse.clone()
    verify_attention_fwd(q, k_ext, v_ext, o, *rest, max_extend, D**-0.5, logit_cap, lse=lse, num_kv_splits=num_kv_splits,
                         max_kv_splits=max_kv_splits)  # fmt: skip
    verify_attention_ref(q, k_ext, v_ext, exp_o, *rest, max_extend, D**-0.5, logit_cap, lse=exp_lse)
    torch.testing.assert_close(o.float(), exp_o.float(), rtol=2e-2, atol=2e-2, equal_nan=True)
    torch.testing.assert_close(lse, exp_lse, rtol=1e-4, atol=1e-4, equal_nan=True)
    return o, lse


@pytest.mark.parametrize("group", [1, 3])
def test_verify_attention_ragged(group):
    torch.manual_seed(70 + group)
    # Ragged prefixes (L = 1, an empty prefix, several BLOCK_N tiles over 3 splits), ragged widths.
    o, lse = _run_verify(group, [37, 1, 0, 200], [4, 3, 4, 1], max_extend=4, num_kv_splits=3)
    assert not o[:12].isnan().any() and not lse[:12].isnan().any()
    assert o[12:].isnan().all() and lse[12:].isnan().all()


@pytest.mark.parametrize("prefix_lens", [[900, 40, 0, 60, 5], [2000, 10, 10, 10]])
def test_verify_attention_mixed_lengths_split_by_the_mean(prefix_lens):
    torch.manual_seed(75)
    # One split for a uniform batch, but cut to the mean: the long request spreads over the default cap of
    # two splits (900 -> 512 + 388; 2000 -> 1024 + 976), the short ones leave their second one empty.
    _run_verify(3, prefix_lens, [4] * len(prefix_lens), max_extend=4, num_kv_splits=1)


@pytest.mark.parametrize("splits,cap", [(1, 1), (2, 8)])
def test_verify_attention_split_cap(splits, cap):
    torch.manual_seed(76)
    # cap = splits: no balancing, every request in its own splits; a wider cap: smaller chunks of the mean.
    _run_verify(3, [900, 40, 0, 60, 5], [4] * 5, max_extend=4, num_kv_splits=splits, max_kv_splits=cap)
    with pytest.raises(ValueError, match="cap"):
        _run_verify(3, [9, 4], [4, 4], max_extend=4, num_kv_splits=4, max_kv_splits=2)


def test_verify_attention_softcap_default_splits_and_row_bound():
    torch.manual_seed(80)
    # The second request has more rows than max_extend: rows past the bound are not written.
    o, _ = _run_verify(2, [70, 9, 130], [3, 5, 3], max_extend=3, logit_cap=3.0)
    assert o[3:6].isfinite().all() and o[6:8].isnan().all() and o[8:11].isfinite().all()


def test_verify_attention_matches_sglang_extend_kernel():
    """Same numbers as SGLang's own extend kernel on a topk=1 verify batch (causal, no custom mask)."""
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd

    torch.manual_seed(90)
    prefix_lens, qo_lens = [50, 3, 120], [4, 4, 4]
    (q, k_ext, v_ext), (k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices) = _make_verify_case(
        3, prefix_lens, qo_lens, pad_rows=0
    )
    o, ours = torch.empty_like(q), torch.empty_like(q)
    lse, our_lse = (torch.empty(q.shape[:2], device=DEVICE) for _ in range(2))
    extend_attention_fwd(q, k_ext, v_ext, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, None, True,
                         None, 4, 1.0, 1.0, D**-0.5, lse_extend=lse)  # fmt: skip
    verify_attention_fwd(q, k_ext, v_ext, ours, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, 4, D**-0.5,
                         lse=our_lse)  # fmt: skip
    torch.testing.assert_close(ours.float(), o.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(our_lse, lse, rtol=1e-3, atol=1e-3)


def test_bad_inputs_raise_value_error():
    q = torch.zeros(4, 5, D, dtype=torch.bfloat16, device=DEVICE)
    k_buffer = torch.zeros(8, 2, D, dtype=torch.bfloat16, device=DEVICE)
    ind = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="multiple"):
        score_capture(q, k_buffer, torch.zeros(4, 5, device=DEVICE), ind, ind, ind,
                      torch.zeros(2, 8, device=DEVICE), 1.0)
    q = torch.zeros(4, 4, D, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="lse"):
        score_capture(q, k_buffer, torch.zeros(4, 4, device=DEVICE, dtype=torch.float16), ind, ind, ind,
                      torch.zeros(2, 8, device=DEVICE), 1.0)
    scores = torch.zeros(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="out must be int32"):
        topk_select(scores, ind, ind, ind, torch.zeros(3, 2, 4, dtype=torch.int64, device=DEVICE),
                    torch.zeros(3, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="k_ext"):
        verify_attention_fwd(q, k_buffer[:3], k_buffer[:3], q, k_buffer, k_buffer, ind, ind, ind, 1, 1.0)
    with pytest.raises(ValueError, match="max_extend"):
        verify_attention_fwd(q, q[:, :2], q[:, :2], q, k_buffer, k_buffer, ind, ind, ind, 0, 1.0)
    with pytest.raises(ValueError, match="split count"):
        verify_attention_fwd(q, q[:, :2], q[:, :2], q, k_buffer, k_buffer, ind, ind, ind, 1, 1.0, num_kv_splits=0)
    with pytest.raises(ValueError, match="seg_len"):
        topk_select(scores, ind, ind[:2], ind, torch.zeros(3, 2, 4, dtype=torch.int32, device=DEVICE),
                    torch.zeros(3, dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("logit_dtype", [torch.float32, torch.bfloat16])
def test_draft_sample_matches_reference(logit_dtype):
    gen = torch.Generator().manual_seed(3)  # on the CPU: the same cases on either device
    vocab, c = 5000, 24  # vocab spans several 1024-wide blocks
    params = [  # (temperature, top_p, top_k, min_p), every filter and greedy encoding
        (1.0, 0.8, 0, 0.001), (1.0, 1.0, -1, 0.0), (0.6, 0.95, -1, 0.0), (1.3, 1.0, 3, 0.0),
        (0.0, 0.9, 20, 0.0), (1.0, 1.0, 1, 0.0), (2.0, 0.99, vocab, 0.3), (0.9, 1.0, 30, 1.0),
        (50.0, 1.0, -1, 0.0),
    ]  # fmt: skip
    temp, top_p, top_k, min_p = (torch.tensor(col, device=DEVICE) for col in zip(*params))
    top_k = top_k.to(torch.int32)
    n = len(params)
    # A peaked head (spread over the row) so that top-p and min-p cut inside the candidates; the
    # last row (T = 50) has more than C tokens tied at its max: its bin 0 alone overflows the list.
    logits = torch.randn(n, vocab, generator=gen) * 2
    head = torch.randperm(vocab, generator=gen)[:c]
    logits[:, head] += torch.linspace(14, 6, c)
    ties = torch.randperm(vocab, generator=gen)[: c + 16]
    logits[8, ties] = logits[8].max() + 1.0
    logits = logits.to(DEVICE, logit_dtype)
    noise = torch.empty((n, c)).exponential_(generator=gen).to(DEVICE)
    x = DraftSampleInputs(logits, temp, top_p, top_k, min_p, noise)
    token = torch.full((n,), POISON, dtype=torch.int64, device=DEVICE)
    cand_ids = torch.full((n, c), POISON, dtype=torch.int64, device=DEVICE)
    cand_q = torch.full((n, c), float("nan"), device=DEVICE)
    q_tok = torch.full((n,), float("nan"), device=DEVICE)
    draft_sample_fwd(x, token, cand_ids, cand_q, q_tok)
    ref_token, ref_ids, ref_q, ref_q_tok = draft_sample_ref(x)
    assert torch.equal(cand_ids, ref_ids)
    torch.testing.assert_close(cand_q, ref_q, atol=1e-6, rtol=1e-4)
    assert torch.equal(token, ref_token)
    torch.testing.assert_close(q_tok, ref_q_tok, atol=1e-6, rtol=1e-4)
    kept = (ref_q > 0).sum(dim=1).tolist()
    # Greedy rows one-hot at the argmax; the filters cut: top-p 0.8 and top-k 3 keep few, min-p 1.0 one.
    assert kept[4] == kept[5] == kept[7] == 1 and kept[3] == 3 and 1 < kept[0] < kept[1]
    assert torch.equal(ref_ids[[4, 5], 0], logits[[4, 5]].float().argmax(dim=-1))
    # Unfiltered (row 1) every candidate is kept: the top bins with at most C tokens, which are
    # exactly the top tokens (in ascending id order).
    n1 = kept[1]
    assert c // 2 <= n1 <= c and torch.equal(ref_ids[1, :n1], torch.topk(logits[1].float(), n1).indices.sort().values)
    # The tied row: bin 0 holds more than C tokens, so its first C in id order.
    assert torch.equal(ref_ids[8], ties.sort().values[:c].to(ref_ids.device))
    assert torch.allclose(ref_q.sum(dim=1), torch.ones(n, device=DEVICE))
    with pytest.raises(ValueError, match="noise must be"):
        DraftSampleInputs(logits, temp, top_p, top_k, min_p, noise[:3])
    with pytest.raises(ValueError, match="top_p must have shape"):
        DraftSampleInputs(logits, temp, top_p[:2], top_k, min_p, noise)


def _record_case(gen: torch.Generator, bs: int, k: int, vocab: int, c: int):
    """Target rows with holes (top-p style zeros) and draft records as the draft runner lays them
    out (step-major buffers seen through a transpose); some drafts equal a likely target token."""
    ids = torch.stack([torch.randperm(vocab, generator=gen)[:c] for _ in range(k * bs)]).view(k, bs, c)
    q = torch.softmax(torch.randn(k, bs, c, generator=gen) * 2, dim=-1)
    pick = torch.multinomial(q.view(-1, c), 1, generator=gen).view(k, bs)
    tokens = ids.gather(2, pick[..., None]).squeeze(-1).T.contiguous()
    # The target favours most drafted tokens (by a random margin), so every prefix length occurs.
    logits = torch.randn(bs, k + 1, vocab, generator=gen) * 3
    boost = torch.rand(bs, k, generator=gen) * 14
    logits[:, :k].scatter_add_(2, tokens[..., None], boost[..., None])
    target_p = torch.softmax(logits, dim=-1)
    target_p = torch.where(target_p < 1e-5, 0.0, target_p)
    target_p = target_p / target_p.sum(-1, keepdim=True)
    # Row 0: the rejected draft's q equals p on its ids and p lives only there: no residual left.
    target_p[0, 0] = 0.0
    target_p[0, 0, ids[0, 0]] = q[0, 0]
    rec = [t.to(DEVICE) for t in (tokens, ids.transpose(0, 1), q.transpose(0, 1), q.gather(2, pick[..., None]).squeeze(-1).T)]
    coins = torch.rand(bs, k + 1, generator=gen).to(DEVICE)[:, :k]  # SGLang's coins are k + 1 wide
    coins[0, 0] = 1.0  # row 0 rejects its first draft (p == q there: only a coin of 1 can)
    return target_p.to(DEVICE), rec, coins, torch.rand(bs, generator=gen).to(DEVICE)


def _rows(target_p: torch.Tensor, listed: bool = False) -> tuple[TargetRows, torch.Tensor]:
    """(target rows of p [bs, k + 1, V], their dense p as the kernels compute it: the reference's input)."""
    rows = rows_from_probs(target_p, listed, list_cap=target_p.shape[-1])
    return rows, rows.dense().view(target_p.shape)


@pytest.mark.parametrize("listed", [False, True])  # the draw over the whole vocabulary / over the row's list
@pytest.mark.parametrize("num_drafts", [3, 1, 0])
def test_rejection_matches_reference(num_drafts, listed):
    gen = torch.Generator().manual_seed(11 + num_drafts)
    target_p, (tokens, ids, q, q_tok), coins, final = _record_case(gen, bs=24, k=3, vocab=1100, c=8)
    rows, target_p = _rows(target_p, listed)
    ref = rejection_sample(target_p, DraftRecord(tokens, ids, q, q_tok, num_drafts=num_drafts), coins, final)
    out = rejection_fwd(rows, tokens, ids, q, q_tok, num_drafts, coins, final, chunk=128, block_v=64)
    assert torch.equal(out[1], ref[1]) and torch.equal(out[0], ref[0])
    assert out[1].max() <= num_drafts and (num_drafts == 0 or len(set(out[1].tolist())) > 1)
    if num_drafts:
        assert out[1][0] == 0 and target_p[0, 0, out[0][0, 0]] > 0  # drawn from p itself
    with pytest.raises(ValueError, match="record shapes"):
        rejection_fwd(rows, tokens[:, :2], ids, q, q_tok, num_drafts, coins, final)


@pytest.mark.parametrize("rank_rule", [False, True])
def test_rejection_on_compact_rows_matches_reference(rank_rule):
    """Target rows from the filter (most decided on their top list of <= 32 tokens; a flat one past it),
    drafts from the record: the kernel's accept and residual draw (over the list, or vocabulary-parallel)
    give the reference's tokens for the same coins, including a rejected draft whose q equals p (no
    residual left)."""
    bs, k, vocab, c = 12, 3, 700, 8
    gen = torch.Generator().manual_seed(23)
    _, (tokens, ids, q, q_tok), coins, final = _record_case(gen, bs=bs, k=k, vocab=vocab, c=c)
    logits = torch.randn(bs * (k + 1), vocab, generator=gen) * 0.5
    logits.view(bs, k + 1, vocab)[:, :k].scatter_add_(2, tokens.cpu()[..., None], torch.full((bs, k, 1), 8.0))
    logits[:, :6] += 7.0
    logits[5] *= 0.01  # flat: its nucleus is wider than the candidates
    logits = (logits * 4).round().div(4).to(DEVICE)  # ties at the cut
    t = torch.full((bs,), 0.8, device=DEVICE)
    top_k = torch.tensor([20, -1, 3, 1] * (bs // 4), dtype=torch.int32, device=DEVICE)
    top_p = torch.tensor([0.9, 0.95, 1.0, 1.0] * (bs // 4), device=DEVICE)
    rows = target_filter_fwd(logits, t, top_k, top_p, None, k + 1, rank_rule, list_cap=32, chunk=64, block_v=32)
    dense = rows.dense().view(bs, k + 1, vocab)
    full = rows.path == RowPath.FULL
    assert full.sum() >= bs * (k + 1) - 2 and not full.all()
    # Request 0's first draft: q equal to p on p's support, so rejecting it leaves no residual.
    support = dense[0, 0].nonzero().view(-1)[:c]
    ids[0, 0] = torch.cat([support, torch.randperm(vocab, generator=gen)[: c - len(support)].to(DEVICE)])
    q[0, 0] = torch.cat([dense[0, 0, support] / dense[0, 0, support].sum(), torch.zeros(c - len(support), device=DEVICE)])
    tokens[0, 0], q_tok[0, 0], coins[0, 0] = ids[0, 0, 0], q[0, 0, 0], 1.0
    ref = rejection_sample(dense, DraftRecord(tokens, ids, q, q_tok), coins, final)
    out = rejection_fwd(rows, tokens, ids, q, q_tok, k, coins, final, chunk=64, block_v=32)
    assert torch.equal(out[1], ref[1]) and torch.equal(out[0], ref[0])
    assert len(set(out[1].tolist())) > 1 and out[1][0] == 0 and dense[0, 0, out[0][0, 0]] > 0


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_rejection_per_request_draft_counts(dtype):
    # Each request its own draft count (adaptive rounds that mix requests): the kernel must match the
    # reference given the same counts, and every request must come out as if verified alone with its
    # count as the batch's int (its stale columns never read, its residual its own).
    bs, k = 24, 3
    gen = torch.Generator().manual_seed(17)
    target_p, (tokens, ids, q, q_tok), coins, final = _record_case(gen, bs=bs, k=k, vocab=1100, c=8)
    rows, target_p = _rows(target_p)
    counts = torch.tensor([3, 0, 1, 2] * (bs // 4), dtype=dtype, device=DEVICE)
    ref = rejection_sample(target_p, DraftRecord(tokens, ids, q, q_tok, num_drafts=counts), coins, final)
    out = rejection_fwd(rows, tokens, ids, q, q_tok, counts, coins, final)
    assert torch.equal(out[1], ref[1]) and torch.equal(out[0], ref[0])
    assert (out[1] <= counts).all() and (out[1][counts == 0] == 0).all()
    # Not degenerate: accepted prefixes stop short of the count, reach it (the draw past the last
    # draft, from p itself) and every count is in play.
    assert (out[1] < counts).any() and (out[1][counts > 0] == counts[counts > 0]).any()
    for b, n in enumerate(counts.tolist()):
        one = (slice(b, b + 1),)
        alone = rejection_fwd(_rows(target_p[one])[0], tokens[one], ids[one], q[one], q_tok[one], n, coins[one], final[one])
        assert torch.equal(out[0][b], alone[0][0]) and out[1][b] == alone[1][0], (b, n)
    # The case tells counts apart: the same drafts under other requests' counts come out otherwise.
    shifted = rejection_fwd(rows, tokens, ids, q, q_tok, counts.roll(1), coins, final)
    assert not torch.equal(shifted[0], out[0])
    with pytest.raises(ValueError, match="per-request num_drafts"):
        rejection_fwd(rows, tokens, ids, q, q_tok, counts[:-1], coins, final)
    with pytest.raises(ValueError, match="per-request num_drafts"):
        rejection_fwd(rows, tokens, ids, q, q_tok, counts.float(), coins, final)
    with pytest.raises(ValueError, match="per-request num_drafts"):
        DraftRecord(tokens, ids, q, q_tok, num_drafts=counts[:, None])
