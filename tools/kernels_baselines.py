"""The kernels PILLAR's are measured against: SGLang's Triton decode and extend (verify) kernels and
FlashInfer's paged decode, on full contexts and on PILLAR's per-head selections. Each returns a closure to
time, or a note saying why the baseline is missing (an optional baseline never fails the run)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import torch
import triton
from sglang_sparsespec.kernels._common import num_sms

from tools.kernels_setup import DEVICE, SGLANG_MAX_KV_SPLITS, TAIL, VERIFY_ROWS, Shape


def sglang_decode(shape: Shape, q, k, v, kv_indptr, kv_indices, seq_lens) -> Callable[[], object] | str:
    try:
        from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
        from sglang.kernels.ops.attention.metadata import get_num_kv_splits_triton
    except Exception as exc:  # an optional baseline: report why it is missing instead of failing
        return f"unavailable: {exc!r}"
    bs = q.shape[0]
    o = torch.empty_like(q)
    logits = torch.empty(bs, shape.h_q, SGLANG_MAX_KV_SPLITS, shape.d, dtype=torch.float32, device=DEVICE)
    lse = torch.empty(bs, shape.h_q, SGLANG_MAX_KV_SPLITS, dtype=torch.float32, device=DEVICE)
    splits = torch.empty(bs, dtype=torch.int32, device=DEVICE)
    sms = num_sms(q.device)
    # The split heuristic SGLang's Triton backend runs each step (triton_backend.get_num_kv_splits).
    get_num_kv_splits_triton[(1,)](
        splits,
        seq_lens,
        bs,
        1,
        shape.h_q,
        shape.h_kv,
        SGLANG_MAX_KV_SPLITS,
        sms,
        MAX_NUM_SEQ=max(256, triton.next_power_of_2(bs)),
    )
    return lambda: decode_attention_fwd(
        q, k, v, o, kv_indptr, kv_indices, logits, lse, splits, SGLANG_MAX_KV_SPLITS, shape.d**-0.5, 1.0, 1.0
    )


def sglang_verify_attention(
    shape: Shape, q, k_ext, v_ext, k, v, qo_indptr, kv_indptr, kv_indices, lse
) -> Callable[[], object] | str:
    """One layer of the verify pass on SGLang's kernel: extend attention of k + 1 causal rows over the prefix."""
    try:
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    except Exception as exc:
        return f"unavailable: {exc!r}"
    o = torch.empty_like(q)

    def run() -> torch.Tensor:
        extend_attention_fwd(
            q,
            k_ext,
            v_ext,
            o,
            k,
            v,
            qo_indptr,
            kv_indptr,
            kv_indices,
            None,
            True,
            None,
            VERIFY_ROWS,
            1.0,
            1.0,
            shape.d**-0.5,
            lse_extend=lse,
        )
        return o

    return run


def flashinfer_decode(shape: Shape, q, k, v, kv_indptr, kv_indices) -> Callable[[], object] | str:
    try:
        import flashinfer
    except Exception as exc:
        return f"unavailable: {exc!r}"
    bs = q.shape[0]
    workspace = torch.empty(256 << 20, dtype=torch.uint8, device=DEVICE)
    last_page_len = torch.ones(bs, dtype=torch.int32, device=DEVICE)
    errors = []
    for tensor_cores in (False, True):
        try:
            wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, "NHD", use_tensor_cores=tensor_cores)
            wrapper.plan(
                kv_indptr,
                kv_indices.to(torch.int32),
                last_page_len,
                shape.h_q,
                shape.h_kv,
                shape.d,
                1,
                q_data_type=torch.bfloat16,
                kv_data_type=torch.bfloat16,
            )
            cache = (k.unsqueeze(1), v.unsqueeze(1))  # [slots, page_size=1, H_kv, D]
            wrapper.run(q, cache)
            return lambda: wrapper.run(q, cache)
        except Exception as exc:
            errors.append(repr(exc))
    return "failed: " + " | ".join(errors)


def per_head_pages(req_to_token: torch.Tensor, sel: torch.Tensor, cnt: int, tail_start: torch.Tensor) -> torch.Tensor:
    """Page ids of every (request, KV head)'s selected positions and tail, row-major over (request, KV head),
    for the KV cache viewed as [slots x H_kv] pages of one token and one head: FlashInfer's page table is
    shared by a row's heads, so per-head selections need one row per KV head."""
    bs, h_kv = sel.shape[:2]
    tail = (tail_start[:, None] + torch.arange(TAIL, device=sel.device))[:, None, :].expand(bs, h_kv, TAIL)
    pos = torch.cat([sel[:, :, :cnt].long(), tail], dim=2)
    slots = torch.gather(req_to_token.long()[:, None, :].expand(bs, h_kv, -1), 2, pos)
    return (slots * h_kv + torch.arange(h_kv, device=sel.device)[None, :, None]).flatten()


def flashinfer_head_sparse(shape: Shape, q, k, v, req_to_token, sel, cnt, tail_start) -> Callable[[], object] | str:
    """FlashInfer's paged decode on PILLAR's per-head selections (its page-table decode as a candidate draft
    kernel). Kernel time only: in a draft loop its ``plan`` needs host-side row lengths every step."""
    bs, group, n = q.shape[0], shape.h_q // shape.h_kv, cnt + TAIL
    rows = replace(shape, name=f"{shape.name}/per-head", h_q=group, h_kv=1)
    q_rows = q.view(bs, shape.h_kv, group, shape.d).reshape(bs * shape.h_kv, group, shape.d)
    indptr = torch.arange(0, bs * shape.h_kv + 1, device=DEVICE, dtype=torch.int32) * n
    pages = per_head_pages(req_to_token, sel, cnt, tail_start)
    return flashinfer_decode(rows, q_rows, k.view(-1, 1, shape.d), v.view(-1, 1, shape.d), indptr, pages)
