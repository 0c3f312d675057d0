"""The split-KV verify attention kernel vs its reference and vs SGLang's own extend kernel (ragged prefixes,
mixed lengths, split caps, softcap).

Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs compiled.
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.verify_attention import (
    verify_attention_fwd,
    verify_attention_ref,
)
from triton_env import DEVICE

from kernel_cases import D, indptr, kv_pool


def _make_verify_case(group, prefix_lens, qo_lens, pad_rows=3):
    h_kv = 2
    total = sum(prefix_lens)
    k_buffer, v_buffer = kv_pool(total + 16, h_kv)
    kv_indices = (torch.randperm(total + 15, device=DEVICE)[:total] + 1).to(torch.int64)
    t = sum(qo_lens) + pad_rows  # padded rows no request owns: must stay untouched
    q = torch.randn(t, h_kv * group, D, device=DEVICE).to(torch.bfloat16)
    k_ext, v_ext = (torch.randn(t, h_kv, D, device=DEVICE).to(torch.bfloat16) for _ in range(2))
    return (q, k_ext, v_ext), (k_buffer, v_buffer, indptr(qo_lens), indptr(prefix_lens), kv_indices)


def _run_verify(group, prefix_lens, qo_lens, max_extend, logit_cap=0.0, num_kv_splits=None, max_kv_splits=None):
    (q, k_ext, v_ext), rest = _make_verify_case(group, prefix_lens, qo_lens)
    o = torch.full_like(q, float("nan"))
    lse = torch.full(q.shape[:2], float("nan"), device=DEVICE)
    exp_o, exp_lse = o.clone(), lse.clone()
    verify_attention_fwd(
        q,
        k_ext,
        v_ext,
        o,
        *rest,
        max_extend,
        D**-0.5,
        logit_cap,
        lse=lse,
        num_kv_splits=num_kv_splits,
        max_kv_splits=max_kv_splits,
    )
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
    extend_attention_fwd(
        q,
        k_ext,
        v_ext,
        o,
        k_buffer,
        v_buffer,
        qo_indptr,
        kv_indptr,
        kv_indices,
        None,
        True,
        None,
        4,
        1.0,
        1.0,
        D**-0.5,
        lse_extend=lse,
    )
    verify_attention_fwd(
        q, k_ext, v_ext, ours, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, 4, D**-0.5, lse=our_lse
    )
    torch.testing.assert_close(ours.float(), o.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(our_lse, lse, rtol=1e-3, atol=1e-3)
