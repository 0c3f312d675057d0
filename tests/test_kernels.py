"""Score capture and top-k selection vs their plain-torch references, the capture -> select -> decode pipeline,
and the kernels' input checks. The other kernels: test_sparse_decode.py, test_verify_attention.py,
test_sampling_kernels.py, test_target_filter.py.

Without a GPU the kernels run in Triton's CPU interpreter (see triton_env.py); with CUDA
available they run compiled, so `pytest tests/test_kernels.py` on an H100 checks the real
kernels with the same cases.
Outputs are pre-filled with NaN / poison so entries a kernel fails to write (or writes but must
not) show up as mismatches against the reference, which receives the same pre-filled buffers.
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.score_capture import score_capture, score_capture_ref
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd
from sglang_sparsespec.kernels.sparse_decode_ref import sparse_decode_ref
from sglang_sparsespec.kernels.topk_select import topk_select, topk_select_ref
from sglang_sparsespec.kernels.verify_attention import (
    verify_attention_fwd,
)
from triton_env import DEVICE

from kernel_cases import POISON, D, indptr, kv_pool, verify_lse


def _run_score_capture(
    group, prefix_lens, qo_lens, out_dtype, logit_cap, num_splits, transposed=None, last_row_only=False, max_splits=None
):
    h_kv = 2
    h_q = h_kv * group
    sm_scale = D**-0.5
    total = sum(prefix_lens)
    num_slots = total + 16
    k_buffer, _ = kv_pool(num_slots, h_kv)
    kv_indices = (torch.randperm(num_slots - 1, device=DEVICE)[:total] + 1).to(torch.int64)
    qo_indptr, kv_indptr = indptr(qo_lens), indptr(prefix_lens)
    q = torch.randn(sum(qo_lens), h_q, D, device=DEVICE).to(torch.bfloat16)
    k_ext = torch.randn(sum(qo_lens), h_kv, D, device=DEVICE).to(torch.bfloat16)
    lse = verify_lse(q, k_buffer, qo_indptr, kv_indptr, kv_indices, k_ext, sm_scale, logit_cap)
    out = torch.full((h_kv, total + 7), float("nan"), dtype=out_dtype, device=DEVICE)
    expected = out.clone()
    score_capture(
        q,
        k_buffer,
        lse,
        qo_indptr,
        kv_indptr,
        kv_indices,
        out,
        sm_scale,
        logit_cap,
        num_splits=num_splits,
        transposed=transposed,
        last_row_only=last_row_only,
        max_splits=max_splits,
    )
    score_capture_ref(
        q, k_buffer, lse, qo_indptr, kv_indptr, kv_indices, expected, sm_scale, logit_cap, last_row_only=last_row_only
    )
    return out, expected, kv_indptr


@pytest.mark.parametrize(
    "group, transposed, last_row_only",
    [(1, True, False), (3, True, False), (3, False, False), (3, True, True), (3, False, True)],
)
def test_score_capture_ragged(group, transposed, last_row_only):
    torch.manual_seed(10 + group)
    # Ragged prefixes including L = 1 and an empty prefix; ragged verify widths; both tile orientations;
    # all verify rows or only each request's last one.
    prefix_lens, qo_lens = [37, 1, 0, 200], [4, 3, 4, 1]
    out, expected, kv_indptr = _run_score_capture(
        group,
        prefix_lens,
        qo_lens,
        torch.float32,
        0.0,
        num_splits=2,
        transposed=transposed,
        last_row_only=last_row_only,
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
    last, _, kv_indptr = _run_score_capture(
        3, prefix_lens, qo_lens, torch.float32, 0.0, num_splits=2, last_row_only=True
    )
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
        out, expected, _ = _run_score_capture(
            3, [900, 40, 0, 60, 5], [4] * 5, torch.float32, 0.0, splits, max_splits=cap
        )
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
    k_buffer, _ = kv_pool(64, 2)
    kv_indices = (torch.randperm(63, device=DEVICE)[:37] + 1).to(torch.int64)
    qo_indptr, kv_indptr = indptr(qo_lens), indptr(prefix_lens)
    q = torch.randn(6, 6, D, device=DEVICE).to(torch.bfloat16)
    lse = verify_lse(
        q, k_buffer, qo_indptr, kv_indptr, kv_indices, torch.randn(6, 2, D, device=DEVICE).to(torch.bfloat16), D**-0.5
    )
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
    k_buffer, _ = kv_pool(total + 4, h_kv)
    kv_indices = (torch.randperm(total + 3, device=DEVICE)[:total] + 1).to(torch.int64)
    qo_indptr, kv_indptr = indptr(qo_lens), indptr(prefix_lens)
    out = torch.full((h_kv, total + 5), float("nan"), dtype=torch.float32, device=DEVICE)
    expected = out.clone()
    for layer in range(3):  # layer 0 overwrites the NaN poison, later layers add
        q = torch.randn(sum(qo_lens), h_kv * group, D, device=DEVICE).to(torch.bfloat16)
        k_ext = torch.randn(sum(qo_lens), h_kv, D, device=DEVICE).to(torch.bfloat16)
        lse = verify_lse(q, k_buffer, qo_indptr, kv_indptr, kv_indices, k_ext, D**-0.5)
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
    starts = indptr(lens)[:-1]
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


def test_capture_select_decode_pipeline():
    """Scores of two layers in one [L, H_kv, cap] buffer, one selection launch over all layers, then
    per-layer sparse decode on the layer slices: checks that the documented layouts compose."""
    torch.manual_seed(60)
    group, h_kv, num_layers, kmax = 3, 2, 2, 8
    prefix_lens, qo_lens = [30, 5], [3, 3]
    cap = sum(prefix_lens) + 4
    scores = torch.full((num_layers, h_kv, cap), float("nan"), device=DEVICE)
    qo_indptr, kv_indptr = indptr(qo_lens), indptr(prefix_lens)
    num_slots = 64
    kv_indices = (torch.randperm(num_slots - 1, device=DEVICE)[: sum(prefix_lens)] + 1).to(torch.int32)
    q = torch.randn(sum(qo_lens), h_kv * group, D, device=DEVICE).to(torch.bfloat16)
    k_ext = torch.randn(sum(qo_lens), h_kv, D, device=DEVICE).to(torch.bfloat16)
    buffers = [kv_pool(num_slots, h_kv) for _ in range(num_layers)]
    for layer, (k_buffer, _) in enumerate(buffers):
        lse = verify_lse(q, k_buffer, qo_indptr, kv_indptr, kv_indices, k_ext, D**-0.5)
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


def test_bad_inputs_raise_value_error():
    q = torch.zeros(4, 5, D, dtype=torch.bfloat16, device=DEVICE)
    k_buffer = torch.zeros(8, 2, D, dtype=torch.bfloat16, device=DEVICE)
    ind = torch.zeros(3, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="multiple"):
        score_capture(
            q, k_buffer, torch.zeros(4, 5, device=DEVICE), ind, ind, ind, torch.zeros(2, 8, device=DEVICE), 1.0
        )
    q = torch.zeros(4, 4, D, dtype=torch.bfloat16, device=DEVICE)
    with pytest.raises(ValueError, match="lse"):
        score_capture(
            q,
            k_buffer,
            torch.zeros(4, 4, device=DEVICE, dtype=torch.float16),
            ind,
            ind,
            ind,
            torch.zeros(2, 8, device=DEVICE),
            1.0,
        )
    scores = torch.zeros(2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="out must be int32"):
        topk_select(
            scores,
            ind,
            ind,
            ind,
            torch.zeros(3, 2, 4, dtype=torch.int64, device=DEVICE),
            torch.zeros(3, dtype=torch.int32, device=DEVICE),
        )
    with pytest.raises(ValueError, match="k_ext"):
        verify_attention_fwd(q, k_buffer[:3], k_buffer[:3], q, k_buffer, k_buffer, ind, ind, ind, 1, 1.0)
    with pytest.raises(ValueError, match="max_extend"):
        verify_attention_fwd(q, q[:, :2], q[:, :2], q, k_buffer, k_buffer, ind, ind, ind, 0, 1.0)
    with pytest.raises(ValueError, match="split count"):
        verify_attention_fwd(q, q[:, :2], q[:, :2], q, k_buffer, k_buffer, ind, ind, ind, 1, 1.0, num_kv_splits=0)
    with pytest.raises(ValueError, match="seg_len"):
        topk_select(
            scores,
            ind,
            ind[:2],
            ind,
            torch.zeros(3, 2, 4, dtype=torch.int32, device=DEVICE),
            torch.zeros(3, dtype=torch.int32, device=DEVICE),
        )
