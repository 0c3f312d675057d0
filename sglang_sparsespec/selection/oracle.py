"""ORACLE selection (analysis only): a draft query's own exact top-K per KV head.

At every draft step and layer this recomputes the full attention of the draft query over
its whole prefix, averages the probabilities over the GQA group, and keeps the ``count``
most-attended positions before ``tail_start`` — the best any selection with the same
budget could do for that step. It reads all of K once more per step (plus a dense score
matrix), so it exists to bound PillarAttn's acceptance, not to serve traffic.
"""

from __future__ import annotations

import torch

from sglang_sparsespec.kernels.topk_select import topk_select


def oracle_select(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    tail_start: torch.Tensor,
    count: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    out_pos: torch.Tensor,
    out_cnt: torch.Tensor,
) -> None:
    """Write each request's exact top-``count`` positions per KV head into ``out_pos``.

    q: [bs, H_q, D] draft queries; k_buffer: [slots, H_kv, D]; req_to_token: [rows, W] int32;
    seq_lens: [bs] positions < seq_len are attended (the current token included);
    tail_start, count: [bs] candidates are positions < tail_start, ``count`` of them kept.
    out_pos: [>= bs, H_kv, kmax] int32 (sorted positions, -1 padded); out_cnt: [>= bs] int32.
    Shape-static (W = req_to_token width), so it can be captured in a CUDA graph.
    """
    bs, h_q, d = q.shape
    h_kv = k_buffer.shape[1]
    width = req_to_token.shape[1]
    pos = torch.arange(width, device=q.device)
    slots = req_to_token[req_pool_indices.to(torch.int64)].to(torch.int64)  # [bs, W]
    keys = k_buffer[slots]  # [bs, W, H_kv, D]
    qg = q.to(keys.dtype).view(bs, h_kv, h_q // h_kv, d)
    logits = torch.einsum("bhgd,bwhd->bhgw", qg, keys).float() * sm_scale
    if logit_cap > 0:
        logits = logit_cap * torch.tanh(logits / logit_cap)
    visible = pos[None, None, None, :] < seq_lens.to(torch.int64)[:, None, None, None]
    probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1).mean(2)  # [bs, H_kv, W]
    rows = probs.transpose(0, 1).reshape(h_kv, bs * width)
    seg_start = torch.arange(bs, device=q.device) * width
    topk_select(rows, seg_start, tail_start, count, out_pos, out_cnt)
