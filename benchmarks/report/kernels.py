"""Kernel results: the verify kernels beside SGLang's and FlashInfer's, the launch sweeps (each kernel's fastest
launch, static and planned) and uniform against mixed prefix lengths."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .common import _num, _pct, _ratio, fmt, markdown_table


def verify_kernel_table(d: dict[str, Any]) -> str:
    """Verify attention of a kernels_bench file: SGLang's extend kernel vs the split kernel, plus what PILLAR adds."""
    rows = [
        [
            r["shape"],
            r["bs"],
            r["seq_len"],
            fmt(_num(r.get("verify_attn_us")), ".1f"),
            fmt(_num(r.get("split_verify_attn_us")), ".1f"),
            fmt(_num(r.get("split_verify_GBps")), ".0f"),
            fmt(_ratio(r.get("verify_attn_us"), r.get("split_verify_attn_us")), ".1f", "x"),
            fmt(r["fp16_out_us"], ".1f"),
            fmt(_pct(r.get("capture_plus_select_frac_of_split_verify")), ".0f", "%"),
            fmt(_pct(r.get("capture_plus_select_frac_of_verify_attn")), ".0f", "%"),
        ]
        for r in d["score_capture"]
    ]
    return (
        "Verify attention (k+1 = 9 causal rows per request over the prefix, LSE on), microseconds per layer: "
        "SGLang's Triton extend kernel vs PILLAR's split-KV kernel (GB/s = prefix K/V/index bytes / time), and "
        "what PILLAR adds per verify layer (fp16 score capture + the per-layer share of one all-layer top-K) "
        "relative to each:\n\n"
        + markdown_table(
            (
                "shape",
                "bs",
                "L",
                "SGLang verify us",
                "split verify us",
                "split GB/s",
                "speedup",
                "capture us",
                "capture + select / split",
                "capture + select / SGLang",
            ),
            rows,
        )
    )


def kernels_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """Kernel microbenchmarks: sparse draft attention vs full decode, score-capture and selection cost; then the
    launch sweeps."""
    parts = []
    for d in (d for d in docs if d.get("kind") == "kernels" and "tune" not in d):
        head = f"{d['device']}; commit {str(d['git_commit'])[:12]}; {d['config']['timing']}; microseconds per layer."
        dec = [
            [
                r["shape"],
                r["bs"],
                r["seq_len"],
                r["selected"] + r["tail"],
                fmt(r["sparse_us"], ".1f"),
                fmt(r["sparse_GBps"], ".0f"),
                fmt(_num(r.get("sglang_full_us")), ".1f"),
                fmt(_num(r.get("flashinfer_full_us")), ".1f"),
                fmt(_ratio(r.get("sglang_full_us"), r["sparse_us"]), ".1f", "x"),
                fmt(_ratio(r.get("flashinfer_full_us"), r["sparse_us"]), ".1f", "x"),
            ]
            for r in d["sparse_decode"]
        ]
        sel = [
            [
                r["shape"],
                r["bs"],
                r["seq_len"],
                r["k"],
                fmt(r["all_layers_launch_us"], ".0f"),
                fmt(r["all_layers_per_layer_fp16_bn4096_us"], ".1f"),
                fmt(r["torch_topk_sort_per_layer_us"], ".1f"),
            ]
            for r in d["selection"]
        ]
        parts.append(
            f"### Kernels ({d['_file']})\n\n{head}\n\n"
            "Sparse draft attention (5% budget + 16-token tail, per-KV-head lists) vs full-context decode:\n\n"
            + markdown_table(
                (
                    "shape",
                    "bs",
                    "L",
                    "attended",
                    "sparse us",
                    "sparse GB/s",
                    "SGLang triton full us",
                    "FlashInfer full us",
                    "vs triton",
                    "vs FlashInfer",
                ),
                dec,
            )
            + "\n\n"
            + verify_kernel_table(d)
            + "\n\nTop-K selection over all (layer, KV head) rows, fp32 scores in one launch; fp16 per layer; "
            "torch.topk + sort per layer for reference:\n\n"
            + markdown_table(
                ("shape", "bs", "L", "K", "all layers us (fp32)", "per layer us (fp16)", "torch per layer us"), sel
            )
            + "\n"
        )
        if d.get("mixed_lengths"):
            parts.append(mixed_lengths_table(d))
    for d in (d for d in docs if d.get("kind") == "kernels" and "tune" in d):
        parts.append(
            f"### Kernel launch sweep ({d['_file']})\n\n{d['device']}; commit {str(d['git_commit'])[:12]}; "
            f"microseconds per layer; the fastest launch per kernel and point:\n\n"
            + tune_table(d["tune"])
            + mixed_tune_table(d["tune"])
            + "\n"
        )
    return "\n".join(parts)


def _launch(r: dict[str, Any]) -> str:
    """A tune row's launch parameters: a work-list launch's chunk and pool, else splits and tile."""
    if "chunk" in r:
        return f"chunk {r['chunk']}, {r['programs_per_request']} programs / request"
    if "cap" in r:
        return f"splits {r['splits']}, cap {r['cap']}"
    return f"splits {r['splits']}, tile {r['block_n']}, {r['warps']} warps" + (
        f", {r['stages']} stages" if "stages" in r else ""
    )


def tune_table(rows: Sequence[dict[str, Any]]) -> str:
    """Per (kernel, shape, batch, L) of a ``kernels_bench --tune`` run: its fastest launch, next to SGLang's
    decode kernel on the same pool (one query row per request, the same prefix)."""
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    stock = {(r["shape"], r["bs"], r["seq_len"]): r["us"] for r in rows if r["kernel"] == "sglang_decode"}
    for r in rows:
        key = (r["kernel"], r["shape"], r["bs"], r["seq_len"])
        if r["kernel"] != "sglang_decode" and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    cells = [
        [*key, _launch(r), fmt(r["us"], ".1f"), fmt(_num(stock.get(key[1:])), ".1f"), fmt(r.get("GBps"), ".0f")]
        for key, r in best.items()
    ]
    return markdown_table(("kernel", "shape", "bs", "L", "fastest launch", "us", "SGLang decode us", "GB/s"), cells)


def mixed_lengths_table(d: dict[str, Any]) -> str:
    """``kernels_bench`` section (d): each kernel on mixed prefixes against a uniform batch of the same mean; empty
    for runs without it."""
    rows = d.get("mixed_lengths") or []
    if not rows:
        return ""
    kernels = ("verify", "capture", "plain_verify", "draft_static", "draft_planned", "sglang_decode")
    cells = [
        [
            r["shape"],
            r["bs"],
            r["seq_len"],
            f"{r['mixed_min']}-{r['mixed_max']}",
            *(
                f"{fmt(_num(r.get(f'{k}_uniform_us')), '.1f')} / {fmt(_num(r.get(f'{k}_mixed_us')), '.1f')}"
                for k in kernels
            ),
            *(fmt(_ratio(r.get(f"{k}_mixed_us"), r.get(f"{k}_uniform_us")), ".2f", "x") for k in kernels),
        ]
        for r in rows
    ]
    return (
        f"### Mixed prefix lengths ({d['_file']})\n\n{d['device']}; commit {str(d['git_commit'])[:12]}; us per layer, "
        "uniform / mixed (same mean), and mixed / uniform:\n\n"
        + markdown_table(
            ("shape", "bs", "L", "mixed range", *(f"{k} us" for k in kernels), *(f"{k} ratio" for k in kernels)), cells
        )
        + "\n"
    )


def mixed_tune_table(rows: Sequence[dict[str, Any]]) -> str:
    """``kernels_bench --tune mixed``: per point and (splits, cap) grid, the verify and the capture on uniform and
    on mixed prefixes of the same mean; empty for other sweeps."""
    cells: dict[tuple[Any, ...], dict[str, float]] = {}
    for r in rows:
        if "cap" in r:
            cells.setdefault((r["shape"], r["bs"], r["seq_len"], r["splits"], r["cap"]), {})[r["kernel"]] = r["us"]
    if not cells:
        return ""
    kinds = ("verify_uniform", "verify_mixed", "capture_uniform", "capture_mixed")
    table = [
        [
            *key,
            *(fmt(_num(v.get(k)), ".1f") for k in kinds),
            fmt(_ratio(v.get("verify_mixed"), v.get("verify_uniform")), ".2f", "x"),
        ]
        for key, v in sorted(cells.items())
    ]
    return (
        "\n\nSplit grids on mixed prefixes (spread over L/8 .. 2L - L/8, mean L) against uniform ones, us per layer "
        "(splits = a request at the mean's; cap = per request):\n\n"
        + markdown_table(
            (
                "shape",
                "bs",
                "L",
                "splits",
                "cap",
                "verify uniform",
                "verify mixed",
                "capture uniform",
                "capture mixed",
                "verify mixed / uniform",
            ),
            table,
        )
    )
