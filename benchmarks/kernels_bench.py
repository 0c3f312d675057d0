"""GPU microbenchmark of the PillarAttn kernels (one layer, one step).

    python -m benchmarks.kernels_bench --out benchmarks/results/kernels_h100.json

(a) sparse decode attention at a 5 % budget + a 16-token tail vs full-context decode with SGLang's
    Triton kernel and FlashInfer (if importable), plus SGLang's kernel on a head-shared index list of
    the same length (same bytes, no per-head lists), FlashInfer's page-table decode on the same
    per-head selections (each KV head its own row of one-head pages; output checked against ours),
    and PILLAR's verify kernel at one row per request over the full context (a plain-decoding
    round's attention); achieved bandwidth = K/V/index bytes gathered / time;
(b) verify attention of k + 1 = 9 causal rows per request over the prefix with the LSE output: PILLAR's
    split-KV kernel vs SGLang's Triton extend kernel (achieved bandwidth = prefix K/V/index bytes / time);
    score capture over the prefix, fp32 and fp16 output, as a fraction of either verify attention — the
    overhead PILLAR adds to every verify layer;
(c) top-K selection, one launch per layer and one launch for all layers (amortized per layer),
    against torch.topk + sort;
(d) mixed prefix lengths (spread over L/8 .. 2L - L/8, mean L): PILLAR's verify (k + 1 rows), its score
    capture, its plain round (one row), the draft step's sparse attention (static grid and planned work
    list) and SGLang's decode kernel, each against a uniform batch of the same mean.
Shapes: Qwen3-8B (H_q=32, H_kv=8, D=128, 36 layers) and SmolLM2-135M (9, 3, 64, 30 layers), L in
{4K, 16K, 32K}, batch 1..128. Every kernel is captured in a CUDA graph and replayed by
triton.testing.do_bench, which clears L2 before each run (medians, microseconds).
Writes JSON (device, date, git commit, versions, rows) to --out and prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import triton
import triton.testing
from sglang_sparsespec.kernels._common import default_num_splits, num_sms
from sglang_sparsespec.kernels.score_capture import score_capture
from sglang_sparsespec.kernels.draft_work import plan_work
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd
from sglang_sparsespec.kernels.topk_select import topk_select
from sglang_sparsespec.kernels.verify_attention import verify_attention_fwd

from benchmarks.meta import device_name, git_commit, package_version

BUDGET_RATIO = 0.05
TAIL = 16  # recent verified tokens + drafts + current token
VERIFY_ROWS = 9  # k = 8 drafts + 1
SGLANG_MAX_KV_SPLITS = 8  # SGLang's --triton-attention-num-kv-splits default
DEVICE = "cuda"


@dataclass(frozen=True)
class Shape:
    name: str
    h_q: int
    h_kv: int
    d: int
    num_layers: int


SHAPES = (Shape("qwen3-8b", 32, 8, 128, 36), Shape("smollm2-135m", 9, 3, 64, 30))


def bench_us(fn: Callable[[], object]) -> float:
    """Median GPU time of `fn` replayed from a CUDA graph, L2 flushed before each replay."""
    fn()  # compile / plan outside the capture
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    ms = triton.testing.do_bench(graph.replay, warmup=10, rep=60, return_mode="median")
    del graph
    return ms * 1e3


def budget(seq_len: int) -> int:
    return math.ceil(BUDGET_RATIO * seq_len)


def make_pool(shape: Shape, bs: int, seq_len: int):
    """KV pool with each request's tokens in one contiguous slot range, as a fresh prefill leaves them."""
    slots = bs * seq_len + 1
    k = torch.randn(slots, shape.h_kv, shape.d, device=DEVICE, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    req_to_token = (1 + torch.arange(bs * seq_len, device=DEVICE, dtype=torch.int32)).view(bs, seq_len)
    return k, v, req_to_token


def random_selection(bs: int, h_kv: int, cand: int, cnt: int, kmax: int) -> torch.Tensor:
    """Sorted random positions in [0, cand), `cnt` per (request, KV head), -1 padded to kmax."""
    pos = torch.rand(bs * h_kv, cand, device=DEVICE).topk(cnt, dim=1).indices.sort(dim=1).values
    sel = torch.full((bs, h_kv, kmax), -1, dtype=torch.int32, device=DEVICE)
    sel[:, :, :cnt] = pos.view(bs, h_kv, cnt).to(torch.int32)
    return sel


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
        splits, seq_lens, bs, 1, shape.h_q, shape.h_kv, SGLANG_MAX_KV_SPLITS, sms,
        MAX_NUM_SEQ=max(256, triton.next_power_of_2(bs)),
    )  # fmt: skip
    return lambda: decode_attention_fwd(
        q, k, v, o, kv_indptr, kv_indices, logits, lse, splits, SGLANG_MAX_KV_SPLITS, shape.d**-0.5, 1.0, 1.0
    )


def sglang_verify_attention(shape: Shape, q, k_ext, v_ext, k, v, qo_indptr, kv_indptr, kv_indices, lse) -> Callable[[], object] | str:
    """One layer of the verify pass on SGLang's kernel: extend attention of k + 1 causal rows over the prefix."""
    try:
        from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    except Exception as exc:
        return f"unavailable: {exc!r}"
    o = torch.empty_like(q)

    def run() -> torch.Tensor:
        extend_attention_fwd(
            q, k_ext, v_ext, o, k, v, qo_indptr, kv_indptr, kv_indices, None, True, None, VERIFY_ROWS,
            1.0, 1.0, shape.d**-0.5, lse_extend=lse,
        )  # fmt: skip
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
                kv_indptr, kv_indices.to(torch.int32), last_page_len, shape.h_q, shape.h_kv, shape.d, 1,
                q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16,
            )  # fmt: skip
            cache = (k.unsqueeze(1), v.unsqueeze(1))  # [slots, page_size=1, H_kv, D]
            wrapper.run(q, cache)
            return lambda: wrapper.run(q, cache)
        except Exception as exc:
            errors.append(repr(exc))
    return "failed: " + " | ".join(errors)


def timed_or_note(fn: Callable[[], object] | str) -> float | str:
    """Time a baseline; one that cannot be captured in a CUDA graph is timed eagerly (L2 still flushed)."""
    if isinstance(fn, str):
        return fn
    try:
        return bench_us(fn)
    except Exception as exc:
        print(f"note: baseline timed without a CUDA graph ({exc!r})", flush=True)
        torch.cuda.synchronize()
        return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3


def draft_selection(shape: Shape, bs: int, seq_len: int, kv_bytes: int) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """A draft step's random per-head selections at the 5 % budget: (sel [bs, H_kv, Kmax] int32, sel_cnt [bs],
    positions per head, bytes the sparse kernel gathers: K/V + slot index per attended token incl. the TAIL,
    and the selected positions themselves)."""
    cnt = budget(seq_len)
    sel = random_selection(bs, shape.h_kv, seq_len - TAIL, cnt, triton.cdiv(cnt, 128) * 128)
    sel_cnt = torch.full((bs,), cnt, dtype=torch.int32, device=DEVICE)
    gathered = bs * shape.h_kv * ((cnt + TAIL) * (2 * shape.d * kv_bytes + 4) + cnt * 4)
    return sel, sel_cnt, cnt, gathered


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
    """FlashInfer's paged decode on PILLAR's per-head selections (issue 23: its page-table decode as the
    draft kernel). Kernel time only: in a draft loop its ``plan`` needs host-side row lengths every step."""
    bs, group, n = q.shape[0], shape.h_q // shape.h_kv, cnt + TAIL
    rows = replace(shape, name=f"{shape.name}/per-head", h_q=group, h_kv=1)
    q_rows = q.view(bs, shape.h_kv, group, shape.d).reshape(bs * shape.h_kv, group, shape.d)
    indptr = torch.arange(0, bs * shape.h_kv + 1, device=DEVICE, dtype=torch.int32) * n
    pages = per_head_pages(req_to_token, sel, cnt, tail_start)
    return flashinfer_decode(rows, q_rows, k.view(-1, 1, shape.d), v.view(-1, 1, shape.d), indptr, pages)


def bench_decode(shape: Shape, bs: int, seq_len: int) -> dict:
    k, v, req_to_token = make_pool(shape, bs, seq_len)
    q = torch.randn(bs, shape.h_q, shape.d, device=DEVICE, dtype=torch.bfloat16)
    seq_lens = torch.full((bs,), seq_len, dtype=torch.int64, device=DEVICE)
    tail_start = seq_lens - TAIL
    sel, sel_cnt, cnt, gathered = draft_selection(shape, bs, seq_len, k.element_size())
    rpi = torch.arange(bs, device=DEVICE)
    o = torch.empty_like(q)
    row: dict = dict(shape=shape.name, bs=bs, seq_len=seq_len, selected=cnt, tail=TAIL)
    row["sparse_us"] = bench_us(
        lambda: sparse_decode_fwd(q, k, v, o, req_to_token, rpi, sel, sel_cnt, tail_start, seq_lens, shape.d**-0.5)
    )
    n = cnt + TAIL
    row["sparse_GBps"] = gathered / row["sparse_us"] / 1e3

    full_indptr = torch.arange(0, bs + 1, device=DEVICE, dtype=torch.int32) * seq_len
    full_indices = req_to_token.flatten().to(torch.int64)
    row["sglang_full_us"] = timed_or_note(sglang_decode(shape, q, k, v, full_indptr, full_indices, seq_lens))
    if isinstance(row["sglang_full_us"], float):  # K/V plus the int64 slot index each KV-head program reads
        full_bytes = bs * shape.h_kv * seq_len * (2 * shape.d * k.element_size() + 8)
        row["sglang_full_GBps"] = full_bytes / row["sglang_full_us"] / 1e3
    row["flashinfer_full_us"] = timed_or_note(flashinfer_decode(shape, q, k, v, full_indptr, full_indices))
    # Same number of tokens per request but one list for all heads: what a shared-index sparse path costs.
    shared_pos = torch.cat([sel[:, 0, :cnt].long(), tail_start[:, None] + torch.arange(TAIL, device=DEVICE)], dim=1)
    shared_indices = torch.gather(req_to_token, 1, shared_pos).flatten().to(torch.int64)
    shared_indptr = torch.arange(0, bs + 1, device=DEVICE, dtype=torch.int32) * n
    row["sglang_shared_sparse_us"] = timed_or_note(
        sglang_decode(shape, q, k, v, shared_indptr, shared_indices, torch.full_like(seq_lens, n))
    )
    # A plain-decoding round (adaptive k = 0) attends through the verify kernel at one row per request:
    # against SGLang's decode kernel (stock's step) it must not cost more.
    qo_one = torch.arange(0, bs + 1, device=DEVICE, dtype=torch.int32)
    k_one = torch.randn(bs, shape.h_kv, shape.d, device=DEVICE, dtype=torch.bfloat16)
    v_one, o_one = torch.randn_like(k_one), torch.empty_like(q)
    row["plain_verify_us"] = bench_us(lambda: verify_attention_fwd(
        q, k_one, v_one, o_one, k, v, qo_one, full_indptr, full_indices, 1, shape.d**-0.5))  # fmt: skip
    if isinstance(row["sglang_full_us"], float):
        row["plain_verify_vs_sglang_decode"] = row["plain_verify_us"] / row["sglang_full_us"]
    fi_sparse = flashinfer_head_sparse(shape, q, k, v, req_to_token, sel, cnt, tail_start)
    if not isinstance(fi_sparse, str):  # same positions, same scale: the outputs must agree to bf16 rounding
        row["flashinfer_sparse_max_err"] = (fi_sparse().view_as(o).float() - o.float()).abs().max().item()
    row["flashinfer_sparse_us"] = timed_or_note(fi_sparse)
    if isinstance(row["sglang_full_us"], float):
        row["speedup_vs_sglang_full"] = row["sglang_full_us"] / row["sparse_us"]
    return row


def bench_score_capture(shape: Shape, bs: int, seq_len: int) -> dict:
    k, v, req_to_token = make_pool(shape, bs, seq_len)
    tokens = bs * VERIFY_ROWS
    q = torch.randn(tokens, shape.h_q, shape.d, device=DEVICE, dtype=torch.bfloat16)
    lse = torch.full((tokens, shape.h_q), 10.0, device=DEVICE)
    qo_indptr = torch.arange(0, bs + 1, device=DEVICE, dtype=torch.int32) * VERIFY_ROWS
    kv_indptr = torch.arange(0, bs + 1, device=DEVICE, dtype=torch.int32) * seq_len
    kv_indices = req_to_token.flatten().to(torch.int64)
    row = dict(shape=shape.name, bs=bs, seq_len=seq_len, verify_rows=VERIFY_ROWS)
    for dtype, name in ((torch.float32, "fp32"), (torch.float16, "fp16")):
        out = torch.empty(shape.h_kv, bs * seq_len, device=DEVICE, dtype=dtype)
        us = bench_us(lambda o=out: score_capture(q, k, lse, qo_indptr, kv_indptr, kv_indices, o, shape.d**-0.5))
        moved = bs * seq_len * shape.h_kv * (shape.d * k.element_size() + 8) + out.numel() * out.element_size()
        row[f"{name}_out_us"] = us
        row[f"{name}_out_GBps"] = moved / us / 1e3
    verify_lse = torch.empty(tokens, shape.h_q, device=DEVICE)
    k_ext = torch.randn(tokens, shape.h_kv, shape.d, device=DEVICE, dtype=torch.bfloat16)
    v_ext = torch.randn_like(k_ext)
    o = torch.empty_like(q)
    row["split_verify_attn_us"] = bench_us(
        lambda: verify_attention_fwd(q, k_ext, v_ext, o, k, v, qo_indptr, kv_indptr, kv_indices, VERIFY_ROWS,
                                     shape.d**-0.5, lse=verify_lse)  # fmt: skip
    )
    prefix_bytes = bs * shape.h_kv * seq_len * (2 * shape.d * k.element_size() + 8)
    row["split_verify_GBps"] = prefix_bytes / row["split_verify_attn_us"] / 1e3
    row["fp16_capture_frac_of_split_verify"] = row["fp16_out_us"] / row["split_verify_attn_us"]
    # SGLang's extend kernel, which PILLAR's verify ran before the split kernel (SPARSESPEC_VERIFY_KERNEL=sglang).
    sglang_lse = torch.empty_like(verify_lse)
    baseline = sglang_verify_attention(shape, q, k_ext, v_ext, k, v, qo_indptr, kv_indptr, kv_indices, sglang_lse)
    row["verify_attn_us"] = timed_or_note(baseline)
    if isinstance(row["verify_attn_us"], float):
        row["fp16_capture_frac_of_verify_attn"] = row["fp16_out_us"] / row["verify_attn_us"]
        row["split_verify_speedup"] = row["verify_attn_us"] / row["split_verify_attn_us"]
        # The compiled split kernel against SGLang's at full size (the CPU tests cover small sizes only).
        sglang_o = baseline()
        verify_attention_fwd(q, k_ext, v_ext, o, k, v, qo_indptr, kv_indptr, kv_indices, VERIFY_ROWS,
                             shape.d**-0.5, lse=verify_lse)  # fmt: skip
        row["split_vs_sglang_max_abs_diff_out"] = (o.float() - sglang_o.float()).abs().max().item()
        row["split_vs_sglang_max_abs_diff_lse"] = (verify_lse - sglang_lse).abs().max().item()
    return row


def mixed_lengths(bs: int, seq_len: int) -> list[int]:
    """A serving batch's prefix lengths: spread evenly over [L/8, 2L - L/8] (mean L) in a fixed random order,
    as requests that started one after another hold them (one request: L itself)."""
    if bs == 1:
        return [seq_len]
    lo, hi = seq_len // 8, 2 * seq_len - seq_len // 8
    lens = [lo + (hi - lo) * i // (bs - 1) for i in range(bs)]
    order = torch.randperm(bs, generator=torch.Generator().manual_seed(0)).tolist()
    return [lens[i] for i in order]


def prefix_index(per_req: list[int], req_to_token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_indptr, kv_indices) of prefixes of these lengths, laid over the pool's first sum(per_req) slots
    (the pool holds bs x seq_len of them)."""
    kv_indptr = torch.tensor([0] + per_req, device=DEVICE, dtype=torch.int32).cumsum(0).to(torch.int32)
    return kv_indptr, req_to_token.flatten()[: sum(per_req)].to(torch.int64)


def request_table(per_req: list[int], req_to_token: torch.Tensor) -> torch.Tensor:
    """A req_to_token table [bs, max(per_req)] for prefixes of these lengths, laid one after another over the
    pool's slots as ``prefix_index`` lays them (padding: slot 1)."""
    flat = req_to_token.flatten()
    table = torch.ones((len(per_req), max(per_req)), dtype=torch.int32, device=DEVICE)
    start = 0
    for i, n in enumerate(per_req):
        table[i, :n] = flat[start : start + n]
        start += n
    return table


def bench_mixed(shape: Shape, bs: int, seq_len: int) -> dict:
    """One layer's verify (k + 1 rows) and score capture, plain round (one row) and stock decode attention
    over a batch of mixed prefix lengths against a uniform batch of the same mean, on the same KV pool: a
    kernel that splits by length costs about the same on both (ratio ~1); one whose longest requests set
    its time costs more."""
    k, v, req_to_token = make_pool(shape, bs, seq_len)
    lens = mixed_lengths(bs, seq_len)
    uniform = [seq_len] * bs
    row: dict = dict(shape=shape.name, bs=bs, seq_len=seq_len, mixed_min=min(lens), mixed_max=max(lens))
    for rows in (VERIFY_ROWS, 1):
        tokens = bs * rows
        q = torch.randn(tokens, shape.h_q, shape.d, device=DEVICE, dtype=torch.bfloat16)
        k_ext = torch.randn(tokens, shape.h_kv, shape.d, device=DEVICE, dtype=torch.bfloat16)
        v_ext, o = torch.randn_like(k_ext), torch.empty_like(q)
        lse = torch.empty(tokens, shape.h_q, device=DEVICE) if rows > 1 else None
        qo_indptr = torch.arange(0, bs + 1, device=DEVICE, dtype=torch.int32) * rows
        name = "verify" if rows > 1 else "plain_verify"
        for kind, per_req in (("uniform", uniform), ("mixed", lens)):
            kv_indptr, kv_indices = prefix_index(per_req, req_to_token)
            row[f"{name}_{kind}_us"] = bench_us(lambda ip=kv_indptr, ix=kv_indices: verify_attention_fwd(
                q, k_ext, v_ext, o, k, v, qo_indptr, ip, ix, rows, shape.d**-0.5, lse=lse))  # fmt: skip
            if rows > 1:  # the verify's score capture, over the same prefixes
                scores = torch.empty(shape.h_kv, bs * seq_len, device=DEVICE, dtype=torch.float16)
                row[f"capture_{kind}_us"] = bench_us(lambda ip=kv_indptr, ix=kv_indices: score_capture(
                    q, k, lse, qo_indptr, ip, ix, scores, shape.d**-0.5))  # fmt: skip
            else:
                seq_lens = torch.tensor(per_req, device=DEVICE, dtype=torch.int64)
                decode = sglang_decode(shape, q, k, v, kv_indptr, kv_indices, seq_lens)
                row[f"sglang_decode_{kind}_us"] = timed_or_note(decode)
        row[f"{name}_mixed_over_uniform"] = row[f"{name}_mixed_us"] / row[f"{name}_uniform_us"]
    row.update(bench_mixed_draft(shape, k, v, req_to_token, uniform, lens))
    row["capture_mixed_over_uniform"] = row["capture_mixed_us"] / row["capture_uniform_us"]
    if isinstance(row["sglang_decode_mixed_us"], float) and isinstance(row["sglang_decode_uniform_us"], float):
        row["sglang_decode_mixed_over_uniform"] = row["sglang_decode_mixed_us"] / row["sglang_decode_uniform_us"]
    return row


def bench_mixed_draft(shape: Shape, k, v, req_to_token, uniform: list[int], lens: list[int]) -> dict:
    """A draft step's sparse attention (5 % budget + TAIL per request, random per-head selections) on the uniform and
    the mixed prefixes: the static grid (``draft_static_*``) and the planned work list the worker builds with
    SPARSESPEC_DRAFT_GRID=planned (``draft_planned_*``; its planning, once per draft step: ``draft_plan_*``)."""
    from sglang_sparsespec.patches.draft_attention import DRAFT_CHUNK, DRAFT_PROGRAMS_PER_REQUEST, MAX_CHUNKS

    bs = len(lens)
    q = torch.randn(bs, shape.h_q, shape.d, device=DEVICE, dtype=torch.bfloat16)
    o, rpi = torch.empty_like(q), torch.arange(bs, device=DEVICE)
    row: dict = {}
    for kind, per_req in (("uniform", uniform), ("mixed", lens)):
        counts = [budget(n) for n in per_req]
        kmax = triton.cdiv(max(counts), 128) * 128
        sel = torch.cat([random_selection(1, shape.h_kv, n - TAIL, c, kmax) for n, c in zip(per_req, counts)])
        sel_cnt = torch.tensor(counts, dtype=torch.int32, device=DEVICE)
        seq_lens = torch.tensor(per_req, dtype=torch.int64, device=DEVICE)
        tail_start, table = seq_lens - TAIL, request_table(per_req, req_to_token)
        row[f"draft_static_{kind}_us"] = bench_us(lambda: sparse_decode_fwd(
            q, k, v, o, table, rpi, sel, sel_cnt, tail_start, seq_lens, shape.d**-0.5))  # fmt: skip

        plan = lambda: plan_work(sel_cnt, rpi, tail_start, seq_lens, kmax, DRAFT_PROGRAMS_PER_REQUEST * bs,  # noqa: E731
                                 DRAFT_CHUNK, MAX_CHUNKS)  # fmt: skip
        work = plan()
        row[f"draft_planned_{kind}_us"] = bench_us(lambda: sparse_decode_fwd(
            q, k, v, o, table, rpi, sel, sel_cnt, tail_start, seq_lens, shape.d**-0.5, work=work))  # fmt: skip
        row[f"draft_plan_{kind}_us"] = bench_us(plan)  # once per draft step, for every layer
    for grid in ("static", "planned"):
        row[f"draft_{grid}_mixed_over_uniform"] = row[f"draft_{grid}_mixed_us"] / row[f"draft_{grid}_uniform_us"]
    return row


def bench_selection(shape: Shape, bs: int, seq_len: int) -> dict:
    cand = seq_len - TAIL
    cnt = budget(seq_len)
    kmax = triton.cdiv(cnt, 128) * 128
    rows_all = shape.num_layers * shape.h_kv
    scores = torch.rand(rows_all, bs * seq_len, device=DEVICE)
    scores16 = scores.half()
    seg_start = torch.arange(bs, device=DEVICE, dtype=torch.int32) * seq_len
    seg_len = torch.full((bs,), cand, dtype=torch.int32, device=DEVICE)
    k = torch.full((bs,), cnt, dtype=torch.int32, device=DEVICE)
    out_cnt = torch.empty(bs, dtype=torch.int32, device=DEVICE)
    out_layer = torch.empty(bs, shape.h_kv, kmax, dtype=torch.int32, device=DEVICE)
    out_all = torch.empty(bs, rows_all, kmax, dtype=torch.int32, device=DEVICE)
    layer_scores = scores[: shape.h_kv]
    row = dict(shape=shape.name, bs=bs, seq_len=seq_len, candidates=cand, k=cnt)
    row["per_layer_launch_us"] = bench_us(lambda: topk_select(layer_scores, seg_start, seg_len, k, out_layer, out_cnt))
    all_us = bench_us(lambda: topk_select(scores, seg_start, seg_len, k, out_all, out_cnt))
    row["all_layers_launch_us"] = all_us
    row["all_layers_per_layer_us"] = all_us / shape.num_layers
    # fp16 scores: 16-bit keys, two radix passes instead of four; also a smaller tile.
    for block_n in (4096, 1024):
        us = bench_us(lambda bn=block_n: topk_select(scores16, seg_start, seg_len, k, out_all, out_cnt, block_n=bn))
        row[f"all_layers_per_layer_fp16_bn{block_n}_us"] = us / shape.num_layers
    padded = layer_scores.view(shape.h_kv, bs, seq_len)[:, :, :cand]
    row["torch_topk_sort_per_layer_us"] = bench_us(lambda: padded.topk(cnt, dim=2, sorted=False).indices.sort(dim=2))
    return row


TUNE_POINTS = {"smollm2-135m": ((256, 7000), (256, 2048), (64, 4096), (16, 7000), (256, 4096)),
               "qwen3-8b": ((64, 4096), (16, 16384))}  # fmt: skip


def tune(shape: Shape, bs: int, seq_len: int, kernels: list[str]) -> list[dict]:
    """``kernels`` ("verify": verify attention and score capture; "mixed": their split count on mixed prefixes;
    "sparse": the draft step's sparse attention)
    over their launch parameters at one (bs, L), with SGLang's decode kernel on the same pool as the bandwidth
    yardstick (one row per request, same prefix bytes)."""
    k, v, req_to_token = make_pool(shape, bs, seq_len)
    tokens = bs * VERIFY_ROWS
    q = torch.randn(tokens, shape.h_q, shape.d, device=DEVICE, dtype=torch.bfloat16)
    k_ext, lse = torch.randn(tokens, shape.h_kv, shape.d, device=DEVICE, dtype=torch.bfloat16), torch.empty(tokens, shape.h_q, device=DEVICE)
    v_ext, o = torch.randn_like(k_ext), torch.empty_like(q)
    qo_indptr = torch.arange(0, bs + 1, device=DEVICE, dtype=torch.int32) * VERIFY_ROWS
    kv_indptr = torch.arange(0, bs + 1, device=DEVICE, dtype=torch.int32) * seq_len
    kv_indices = req_to_token.flatten().to(torch.int64)
    seq_lens = torch.full((bs,), seq_len, dtype=torch.int64, device=DEVICE)
    out = torch.empty(shape.h_kv, bs * seq_len, device=DEVICE, dtype=torch.float16)
    prefix_bytes = bs * shape.h_kv * seq_len * 2 * shape.d * k.element_size()
    base = dict(shape=shape.name, bs=bs, seq_len=seq_len, prefix_GB=prefix_bytes / 1e9)
    stock = timed_or_note(sglang_decode(shape, q[:bs], k, v, kv_indptr, kv_indices, seq_lens))
    rows = [dict(base, kernel="sglang_decode", us=stock)]
    for splits in (1, 2, 4, 8, 16) if "verify" in kernels else ():
        for block_n in (32, 64, 128):
            for warps in (4, 8):
                for stages in (2, 3):
                    us = bench_us(lambda: verify_attention_fwd(
                        q, k_ext, v_ext, o, k, v, qo_indptr, kv_indptr, kv_indices, VERIFY_ROWS, shape.d**-0.5, lse=lse,
                        num_kv_splits=splits, block_n=block_n, num_warps=warps, num_stages=stages))  # fmt: skip
                    rows.append(dict(base, kernel="verify", splits=splits, block_n=block_n, warps=warps, stages=stages, us=us))
                us = bench_us(lambda: score_capture(q, k, lse, qo_indptr, kv_indptr, kv_indices, out, shape.d**-0.5,
                                                    num_splits=splits, block_n=block_n, num_warps=warps))  # fmt: skip
                rows.append(dict(base, kernel="capture", splits=splits, block_n=block_n, warps=warps, us=us))
    if "mixed" in kernels:
        rows += tune_mixed(shape, bs, seq_len, q, k_ext, v_ext, o, lse, k, v, req_to_token, qo_indptr, out)
    if "sparse" in kernels:
        rows += tune_sparse(shape, bs, seq_len, q[:bs], k, v, req_to_token, seq_lens, stock)
    if "dense" in kernels:
        rows += tune_dense(shape, bs, seq_len, q[:bs], k, v, req_to_token, seq_lens)
    for r in rows:
        if isinstance(r["us"], float) and r["kernel"] != "sparse":
            r["GBps"] = prefix_bytes / (2 if r["kernel"].startswith("capture") else 1) / r["us"] / 1e3
            r["vs_sglang_decode"] = r["us"] / stock if isinstance(stock, float) else None
    return rows


def tune_mixed(shape: Shape, bs: int, seq_len: int, q, k_ext, v_ext, o, lse, k, v, req_to_token, qo_indptr, out) -> list[dict]:
    """The verify and its score capture on mixed prefixes (``mixed_lengths``) and on the uniform batch of the same
    mean, over the split count of a request at the mean and the per-request cap (``mean_prefix_chunk``; default
    tiles; cap = splits is a grid without balancing): which grid keeps the mixed batch at the uniform one's cost."""
    rows = []
    grids = [(1, 1), (1, 2), (1, 4), (2, 2), (2, 4), (2, 8), (3, 6), (4, 4), (4, 8), (8, 8), (8, 16)]
    for kind, per_req in (("uniform", [seq_len] * bs), ("mixed", mixed_lengths(bs, seq_len))):
        kv_indptr, kv_indices = prefix_index(per_req, req_to_token)
        for splits, cap in grids:
            us = bench_us(lambda: verify_attention_fwd(
                q, k_ext, v_ext, o, k, v, qo_indptr, kv_indptr, kv_indices, VERIFY_ROWS, shape.d**-0.5, lse=lse,
                num_kv_splits=splits, max_kv_splits=cap))  # fmt: skip
            base = dict(shape=shape.name, bs=bs, seq_len=seq_len, splits=splits, cap=cap)
            rows.append(dict(base, kernel=f"verify_{kind}", us=us))
            us = bench_us(lambda: score_capture(q, k, lse, qo_indptr, kv_indptr, kv_indices, out, shape.d**-0.5,
                                                num_splits=splits, max_splits=cap))  # fmt: skip
            rows.append(dict(base, kernel=f"capture_{kind}", us=us))
    return rows


def tune_sparse(shape: Shape, bs: int, seq_len: int, q, k, v, req_to_token, seq_lens, stock) -> list[dict]:
    """The draft step's sparse attention (5 % budget + tail, random per-head selections) over its launch parameters."""
    sel, sel_cnt, cnt, gathered = draft_selection(shape, bs, seq_len, k.element_size())
    rpi, o = torch.arange(bs, device=DEVICE), torch.empty_like(q)
    rows = []
    for splits in (1, 2, 4, 8):
        for block_n in (16, 32, 64):
            for stages in (2, 3):
                us = bench_us(lambda: sparse_decode_fwd(
                    q, k, v, o, req_to_token, rpi, sel, sel_cnt, seq_lens - TAIL, seq_lens, shape.d**-0.5,
                    num_kv_splits=splits, block_n=block_n, num_stages=stages))  # fmt: skip
                rows.append(dict(shape=shape.name, bs=bs, seq_len=seq_len, kernel="sparse", selected=cnt, splits=splits,
                                 block_n=block_n, warps=4, stages=stages, us=us, GBps=gathered / us / 1e3,
                                 vs_sglang_decode=us / stock if isinstance(stock, float) else None))  # fmt: skip
    return rows


def tune_dense(shape: Shape, bs: int, seq_len: int, q, k, v, req_to_token, seq_lens) -> list[dict]:
    """The plain-decoding step's attention: the draft kernel over every request's whole prefix (tail
    at 0, nothing selected), over its split count and tile; SGLang's decode kernel on the same pool is
    the row ``tune`` adds (stock's step attends the same bytes)."""
    rpi, o = torch.arange(bs, device=DEVICE), torch.empty_like(q)
    sel = torch.full((bs, shape.h_kv, 1), -1, dtype=torch.int32, device=DEVICE)
    sel_cnt, tail_start = torch.zeros(bs, dtype=torch.int32, device=DEVICE), torch.zeros_like(seq_lens)
    rows = []
    for splits in (1, 2, 3, 4, 6, 8, 12, 16):
        for block_n in (32, 64):
            for stages in (2, 3):
                us = bench_us(lambda: sparse_decode_fwd(
                    q, k, v, o, req_to_token, rpi, sel, sel_cnt, tail_start, seq_lens, shape.d**-0.5,
                    num_kv_splits=splits, block_n=block_n, num_stages=stages))  # fmt: skip
                rows.append(dict(shape=shape.name, bs=bs, seq_len=seq_len, kernel="dense", splits=splits,
                                 default_splits=default_num_splits(bs * shape.h_kv, q.device), block_n=block_n,
                                 warps=4, stages=stages, us=us))  # fmt: skip
    # The planned grid (SPARSESPEC_DRAFT_GRID=planned): the work list is planned once per step, so it
    # is timed apart from the attention of one layer.
    for chunk in (128, 256, 512):
        for per_request in (4, 8, 16):
            plan = lambda: plan_work(sel_cnt, rpi, tail_start, seq_lens, 1, per_request * bs, chunk, 16)  # noqa: E731
            work = plan()
            us = bench_us(lambda: sparse_decode_fwd(
                q, k, v, o, req_to_token, rpi, sel, sel_cnt, tail_start, seq_lens, shape.d**-0.5, work=work))  # fmt: skip
            rows.append(dict(shape=shape.name, bs=bs, seq_len=seq_len, kernel="dense_planned", chunk=chunk,
                             programs_per_request=per_request, us=us, plan_us=bench_us(plan)))  # fmt: skip
    return rows


def markdown(rows: list[dict]) -> str:
    if not rows:
        return ""
    keys = list(rows[0])
    fmt = lambda x: f"{x:.1f}" if isinstance(x, float) else str(x)  # noqa: E731
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    lines += ["| " + " | ".join(fmt(r.get(key, "")) for key in keys) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="JSON result path")
    parser.add_argument("--batches", type=int, nargs="+", default=None, help="default 1 4 16 64 128; with --tune: "
                        "tune at every (batch, len) instead of TUNE_POINTS")
    parser.add_argument("--lens", type=int, nargs="+", default=None, help="default 4096 16384 32768")
    parser.add_argument("--sections", nargs="+", default=None, choices=["sparse_decode", "score_capture", "selection",
                        "mixed_lengths"], help="run only these sections (default: all)")  # fmt: skip
    parser.add_argument("--shapes", nargs="+", default=[s.name for s in SHAPES], choices=[s.name for s in SHAPES])
    parser.add_argument("--tune", nargs="+", choices=["verify", "sparse", "dense", "mixed"], default=None,
                        help="instead: sweep these kernels' launch parameters at TUNE_POINTS (verify: + capture; "
                        "mixed: the verify's and the capture's split count on mixed and uniform prefixes)")
    args = parser.parse_args()
    explicit = args.batches is not None or args.lens is not None
    args.batches, args.lens = args.batches or [1, 4, 16, 64, 128], args.lens or [4096, 16384, 32768]
    if not torch.cuda.is_available():
        raise SystemExit("kernels_bench needs a CUDA GPU")
    started = time.time()
    sections: dict[str, list[dict]] = (
        {"tune": []} if args.tune else {"sparse_decode": [], "score_capture": [], "selection": [], "mixed_lengths": []}
    )
    result = {
        "kind": "kernels",
        "device": device_name(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_commit": git_commit(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "sglang": package_version("sglang"),
        "flashinfer": package_version("flashinfer-python") or package_version("flashinfer"),
        "config": dict(
            budget_ratio=BUDGET_RATIO, tail=TAIL, verify_rows=VERIFY_ROWS, sglang_max_kv_splits=SGLANG_MAX_KV_SPLITS,
            shapes=[asdict(s) for s in SHAPES if s.name in args.shapes], timing="CUDA graph replay, L2 flushed, median",
        ),  # fmt: skip
        "complete": False,
        **sections,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for shape in (s for s in SHAPES if s.name in args.shapes and args.tune):
        points = [(b, n) for b in args.batches for n in args.lens] if explicit else TUNE_POINTS[shape.name]
        for bs, seq_len in points:
            rows = tune(shape, bs, seq_len, args.tune)
            sections["tune"] += rows
            result["wall_s"] = time.time() - started
            args.out.write_text(json.dumps(result, indent=1))
            for kernel in ("verify", "capture", "sparse", "dense", "dense_planned", "verify_uniform", "verify_mixed",
                           "capture_uniform", "capture_mixed"):
                best = sorted((r for r in rows if r["kernel"] == kernel), key=lambda r: r["us"])[:3]
                if not best:
                    continue
                print(f"{shape.name} bs={bs} L={seq_len} sglang_decode={rows[0]['us']}: {kernel} best", best, flush=True)
            torch.cuda.empty_cache()
    for shape in (s for s in SHAPES if s.name in args.shapes and not args.tune):
        for seq_len in args.lens:
            for bs in args.batches:
                for name, bench in (("sparse_decode", bench_decode), ("score_capture", bench_score_capture),
                                    ("selection", bench_selection), ("mixed_lengths", bench_mixed)):  # fmt: skip
                    if args.sections is None or name in args.sections:
                        sections[name].append(bench(shape, bs, seq_len))
                if sections["score_capture"] and sections["selection"]:
                    capture, select = sections["score_capture"][-1], sections["selection"][-1]
                    # What PILLAR adds per verify layer: fp16 capture + its share of one all-layer selection.
                    added = capture["fp16_out_us"] + select["all_layers_per_layer_fp16_bn4096_us"]
                    capture["capture_plus_select_frac_of_split_verify"] = added / capture["split_verify_attn_us"]
                    if isinstance(capture.get("verify_attn_us"), float):
                        capture["capture_plus_select_frac_of_verify_attn"] = added / capture["verify_attn_us"]
                torch.cuda.empty_cache()
                result["wall_s"] = time.time() - started
                # Rewritten after every shape point, so a killed run keeps what it measured.
                args.out.write_text(json.dumps(result, indent=1))
                print(f"done {shape.name} L={seq_len} bs={bs} ({time.time() - started:.0f}s)", flush=True)
    result["complete"] = True
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\n{result['device']}  {result['date_utc']}  commit {result['git_commit']}  wall {result['wall_s']:.0f}s")
    for name, rows in sections.items():
        print(f"\n### {name} (microseconds per layer per step)\n\n{markdown(rows)}")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
