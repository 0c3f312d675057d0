"""What the kernel tests share: the head dim, the poison that unwritten outputs hold, ragged index pointers, a
random KV pool, the verify rows' log-sum-exp and a ragged draft-attention case, on the tests' device
(triton_env.DEVICE)."""

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


def decode_case(group, specs, kmax, h_kv=2, max_ctx=160):
    """specs: per request (seq_len, tail_start, cnt, n_beyond_tail), n_beyond_tail of the selected
    positions placed at or after tail_start (the kernel must drop them: the tail already has them)."""
    bs = len(specs)
    num_slots = sum(s[0] for s in specs) + 8
    k_buffer, v_buffer = kv_pool(num_slots, h_kv)
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
        q=q,
        k_buffer=k_buffer,
        v_buffer=v_buffer,
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices,
        sel_pos=sel_pos,
        sel_cnt=sel_cnt,
        tail_start=ints(1),
        seq_lens=ints(0),
        sm_scale=D**-0.5,
        sel_rows=sel_rows,
    )
