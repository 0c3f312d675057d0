"""GPU microbenchmark of the PillarAttn kernels (one layer, one step).

    python -m tools.kernels_bench --out benchmarks/results/kernels/kernels_h100.json

(a) sparse decode attention at a 5 % budget + a 16-token tail (and with one KV head reading its whole prefix, as
    ``--pillar-dense-heads`` makes it) vs full-context decode with SGLang's
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
    capture, its plain round (one row), the draft step's sparse attention and SGLang's decode kernel, each
    against a uniform batch of the same mean.
Shapes: Qwen3-8B (H_q=32, H_kv=8, D=128, 36 layers) and SmolLM2-135M (9, 3, 64, 30 layers), L in
{4K, 16K, 32K}, batch 1..128. Every kernel is captured in a CUDA graph and replayed by
triton.testing.do_bench, which clears L2 before each run (medians, microseconds).
Writes JSON (device, date, git commit, versions, rows) to --out and prints markdown tables.
Shapes, pools and timing: ``kernels_setup``; SGLang and FlashInfer baselines: ``kernels_baselines``;
``--tune`` sweeps: ``kernels_tune``.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
import triton
from sglang_sparsespec.kernels.score_capture import score_capture
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd
from sglang_sparsespec.kernels.token_match import match_lists_fwd, token_match_fwd
from sglang_sparsespec.kernels.topk_select import topk_select
from sglang_sparsespec.kernels.verify_attention import verify_attention_fwd

from tools.kernels_baselines import flashinfer_decode, flashinfer_head_sparse, sglang_decode, sglang_verify_attention
from tools.kernels_setup import (
    BUDGET_RATIO,
    DEVICE,
    SGLANG_MAX_KV_SPLITS,
    SHAPES,
    TAIL,
    VERIFY_ROWS,
    Shape,
    bench_us,
    budget,
    draft_selection,
    make_pool,
    mixed_lengths,
    provenance,
    prefix_index,
    random_selection,
    request_table,
    timed_or_note,
)
from tools.kernels_tune import TUNE_POINTS, tune
from benchmarks.meta import package_version


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
    # One KV head of the layer reading its whole prefix (--pillar-dense-heads), the others their plans: at the
    # default split count (sized for plans) its programs are the layer's longest, so more splits are timed too.
    dense = (torch.arange(shape.h_kv, device=DEVICE) == 0).to(torch.int32)
    args = (q, k, v, o, req_to_token, rpi, sel, sel_cnt, tail_start, seq_lens, shape.d**-0.5)
    for splits in (None, 4, 8, 16):
        row[f"sparse_dense1_s{splits or 'default'}_us"] = bench_us(
            lambda n=splits: sparse_decode_fwd(*args, dense_heads=dense, num_kv_splits=n)
        )
    # The same head attending 32 token matches and their successors instead (--pillar-match-heads 32@...); the
    # draft step's scan that lists them: one program a request over its ids below the tail, none of them a hit
    # (an id past the vocabulary), so every program reads all of them; and the copies of the list without each
    # listed head's plan, for 11 listed heads (the head probe's count on SmolLM2).
    match_pos = torch.randint(0, seq_len - TAIL, (bs, 64), dtype=torch.int32, device=DEVICE)
    match_cnt = torch.full((bs,), 64, dtype=torch.int32, device=DEVICE)
    first = dense - 1  # head 0 reads list 0, the others none
    row["sparse_match1_us"] = bench_us(
        lambda: sparse_decode_fwd(*args, match=(match_pos.unsqueeze(0), match_cnt, first))
    )
    ids = torch.randint(0, 49152, (bs, seq_len), dtype=torch.int32, device=DEVICE)
    token = torch.full((bs,), 49152, dtype=torch.int64, device=DEVICE)
    tails = tail_start.to(torch.int32)
    found = (torch.empty_like(match_pos), torch.empty_like(match_cnt))
    row["token_match_scan_us"] = bench_us(lambda: token_match_fwd(ids, rpi, token, tails, *found))
    groups = torch.arange(11, dtype=torch.int32, device=DEVICE) % shape.h_kv
    lists = torch.empty(11, bs, 64, dtype=torch.int32, device=DEVICE)
    row["match_lists11_us"] = bench_us(lambda: match_lists_fwd(match_pos, match_cnt, sel, sel_cnt, rpi, groups, lists))

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
    row["plain_verify_us"] = bench_us(
        lambda: verify_attention_fwd(q, k_one, v_one, o_one, k, v, qo_one, full_indptr, full_indices, 1, shape.d**-0.5)
    )
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
        lambda: verify_attention_fwd(
            q, k_ext, v_ext, o, k, v, qo_indptr, kv_indptr, kv_indices, VERIFY_ROWS, shape.d**-0.5, lse=verify_lse
        )
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
        verify_attention_fwd(
            q, k_ext, v_ext, o, k, v, qo_indptr, kv_indptr, kv_indices, VERIFY_ROWS, shape.d**-0.5, lse=verify_lse
        )
        row["split_vs_sglang_max_abs_diff_out"] = (o.float() - sglang_o.float()).abs().max().item()
        row["split_vs_sglang_max_abs_diff_lse"] = (verify_lse - sglang_lse).abs().max().item()
    return row


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
            row[f"{name}_{kind}_us"] = bench_us(
                lambda ip=kv_indptr, ix=kv_indices: verify_attention_fwd(
                    q, k_ext, v_ext, o, k, v, qo_indptr, ip, ix, rows, shape.d**-0.5, lse=lse
                )
            )
            if rows > 1:  # the verify's score capture, over the same prefixes
                scores = torch.empty(shape.h_kv, bs * seq_len, device=DEVICE, dtype=torch.float16)
                row[f"capture_{kind}_us"] = bench_us(
                    lambda ip=kv_indptr, ix=kv_indices: score_capture(
                        q, k, lse, qo_indptr, ip, ix, scores, shape.d**-0.5
                    )
                )
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
    the mixed prefixes (``draft_static_*``: the draft kernel's grid, one split count per batch)."""
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
        row[f"draft_static_{kind}_us"] = bench_us(
            lambda: sparse_decode_fwd(q, k, v, o, table, rpi, sel, sel_cnt, tail_start, seq_lens, shape.d**-0.5)
        )
    row["draft_static_mixed_over_uniform"] = row["draft_static_mixed_us"] / row["draft_static_uniform_us"]
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
    parser.add_argument(
        "--batches",
        type=int,
        nargs="+",
        default=None,
        help="default 1 4 16 64 128; with --tune: tune at every (batch, len) instead of TUNE_POINTS",
    )
    parser.add_argument("--lens", type=int, nargs="+", default=None, help="default 4096 16384 32768")
    parser.add_argument(
        "--sections",
        nargs="+",
        default=None,
        choices=["sparse_decode", "score_capture", "selection", "mixed_lengths"],
        help="run only these sections (default: all)",
    )
    parser.add_argument("--shapes", nargs="+", default=[s.name for s in SHAPES], choices=[s.name for s in SHAPES])
    parser.add_argument(
        "--tune",
        nargs="+",
        choices=["verify", "sparse", "sparse_fused", "dense", "mixed"],
        default=None,
        help="instead: sweep these kernels' launch parameters at TUNE_POINTS (verify: + capture; sparse_fused: the "
        "draft attention with its K/V store, rotary and q/k norm prologue; "
        "mixed: the verify's and the capture's split count on mixed and uniform prefixes)",
    )
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
        **provenance("kernels"),
        "flashinfer": package_version("flashinfer-python") or package_version("flashinfer"),
        "config": dict(
            budget_ratio=BUDGET_RATIO,
            tail=TAIL,
            verify_rows=VERIFY_ROWS,
            sglang_max_kv_splits=SGLANG_MAX_KV_SPLITS,
            shapes=[asdict(s) for s in SHAPES if s.name in args.shapes],
            timing="CUDA graph replay, L2 flushed, median",
        ),
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
            for kernel in (
                "verify",
                "capture",
                "sparse",
                "dense",
                "verify_uniform",
                "verify_mixed",
                "capture_uniform",
                "capture_mixed",
            ):
                best = sorted((r for r in rows if r["kernel"] == kernel), key=lambda r: r["us"])[:3]
                if not best:
                    continue
                print(
                    f"{shape.name} bs={bs} L={seq_len} sglang_decode={rows[0]['us']}: {kernel} best", best, flush=True
                )
            torch.cuda.empty_cache()
    for shape in (s for s in SHAPES if s.name in args.shapes and not args.tune):
        for seq_len in args.lens:
            for bs in args.batches:
                for name, bench in (
                    ("sparse_decode", bench_decode),
                    ("score_capture", bench_score_capture),
                    ("selection", bench_selection),
                    ("mixed_lengths", bench_mixed),
                ):
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
