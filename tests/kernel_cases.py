"""What the kernel tests share: the head dim, the poison that unwritten outputs hold, ragged index pointers, a
random KV pool and the verify rows' log-sum-exp, on the tests' device (triton_env.DEVICE)."""

from __future__ import annotations

import numpy as np
import torch
from sglang_sparsespec.kernels.verify_attention import verify_attention_ref
from triton_env import DEVICE

D = 64
POISON = 777


def indptr(lens: list[int]) -> torch.Tensor:
    """[0, cumsum(lens)...] int32: the offsets of ragged rows of these lengths."""
    return torch.tensor([0] + np.cumsum(lens).tolist(), dtype=torch.int32, device=DEVICE)


def kv_pool(num_slots: int, h_kv: int, dtype=torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
    """Random K and V buffers [num_slots, h_kv, D]."""
    k = torch.randn(num_slots, h_kv, D, device=DEVICE).to(dtype)
    v = torch.randn(num_slots, h_kv, D, device=DEVICE).to(dtype)
    return k, v


def verify_lse(q, k_buffer, qo_indptr, kv_indptr, kv_indices, k_ext, sm_scale, logit_cap=0.0):
    """LSE of each verify row's full attention (prefix + causal chain), from the verify reference."""
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    max_extend = int((qo_indptr[1:] - qo_indptr[:-1]).max())
    args = (q, k_ext, k_ext, torch.empty_like(q), k_buffer, k_buffer, qo_indptr, kv_indptr, kv_indices)
    verify_attention_ref(*args, max_extend, sm_scale, logit_cap, lse=lse)
    return lse
