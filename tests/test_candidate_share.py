"""tools/candidate_share.py: the share of rows whose kept set lies among the candidates, and both first lists run
side by side on the same rows."""

from __future__ import annotations

import math

import pytest
import torch
from triton_env import INTERPRET

from tools.candidate_share import kernel_paths, nucleus_within

pytestmark = pytest.mark.skipif(not INTERPRET, reason="the tool runs its kernels interpreted, on CPU tensors")


def test_nucleus_within_counts_rows_whose_kept_tokens_all_hold_a_candidates_share():
    peaked = torch.full((4000,), -20.0)
    peaked[:3] = torch.tensor([5.0, 4.0, 3.0])  # the nucleus: three tokens far above 1 / 2047 each
    tail = torch.zeros(4000)
    tail[0] = math.log(3000.0)  # ~43 % on one token, the rest spread at ~1 / 7000 each
    rows = torch.stack([peaked, tail])
    assert nucleus_within(rows, 1.0, 0.95, 1 << 30) == 0.5
    assert nucleus_within(rows, 1.0, 0.95, 1) == 1.0  # top-k 1 keeps the max alone


def test_kernel_paths_report_both_first_lists_and_their_agreement():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 3000, generator=gen)
    logits[:2, :3] += 9.0
    out = kernel_paths(logits, 0.6, 0.95, 1 << 30)
    assert out["same_rows"] is True
    assert out["candidates"].get("FULL", 0.0) >= 0.5 and set(out) == {"top_bins", "candidates", "same_rows"}
