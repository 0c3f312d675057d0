"""``kernels_bench --tune``: sweeps of the PillarAttn kernels' launch parameters (split count, tile, warps,
pipeline stages) at a few (batch, context) points, with SGLang's decode kernel on the same pool as the
bandwidth yardstick."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from sglang_sparsespec.kernels._common import default_num_splits
from sglang_sparsespec.kernels.score_capture import score_capture
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd
from sglang_sparsespec.kernels.verify_attention import verify_attention_fwd

from tools.kernels_baselines import sglang_decode
from tools.kernels_setup import (
    DEVICE,
    TAIL,
    VERIFY_ROWS,
    Shape,
    bench_us,
    draft_prologue,
    draft_selection,
    make_pool,
    mixed_lengths,
    prefix_index,
    timed_or_note,
)

TUNE_POINTS = {
    "smollm2-135m": ((256, 7000), (256, 2048), (64, 4096), (16, 7000), (256, 4096)),
    "qwen3-8b": ((64, 4096), (16, 16384)),
    "qwen3-1.7b": ((64, 4096),),
}


def tune(shape: Shape, bs: int, seq_len: int, kernels: list[str]) -> list[dict]:
    """``kernels`` ("verify": verify attention and score capture; "mixed": their split count on mixed prefixes;
    "sparse": the draft step's sparse attention; "sparse_fused": the same with the
    prologue the draft steps launch it with, the step's K/V store, rotary and q/k norm)
    over their launch parameters at one (bs, L), with SGLang's decode kernel on the same pool as the bandwidth
    yardstick (one row per request, same prefix bytes)."""
    k, v, req_to_token = make_pool(shape, bs, seq_len)
    tokens = bs * VERIFY_ROWS
    q = torch.randn(tokens, shape.h_q, shape.d, device=DEVICE, dtype=torch.bfloat16)
    k_ext, lse = (
        torch.randn(tokens, shape.h_kv, shape.d, device=DEVICE, dtype=torch.bfloat16),
        torch.empty(tokens, shape.h_q, device=DEVICE),
    )
    v_ext, o = torch.randn_like(k_ext), torch.empty_like(q)
    qo_indptr = torch.arange(0, bs + 1, device=DEVICE, dtype=torch.int32) * VERIFY_ROWS
    kv_indptr = torch.arange(0, bs + 1, device=DEVICE, dtype=torch.int32) * seq_len
    kv_indices = req_to_token.flatten().to(torch.int64)
    seq_lens = torch.full((bs,), seq_len, dtype=torch.int64, device=DEVICE)
    out = torch.empty(shape.h_kv, bs * seq_len, device=DEVICE, dtype=torch.float16)
    prefix_bytes = bs * shape.h_kv * seq_len * 2 * shape.d * k.element_size()
    base = dict(shape=shape.name, bs=bs, seq_len=seq_len, prefix_GB=prefix_bytes / 1e9)
    stock = timed_or_note(sglang_decode(shape, q[:bs], k, v, kv_indptr, kv_indices, seq_lens))
    # The verify and its capture on this pool and these rows; the prefix index and launch come per call.
    verify = partial(verify_attention_fwd, q, k_ext, v_ext, o, k, v, qo_indptr)
    capture = partial(score_capture, q, k, lse, qo_indptr)
    rows = [dict(base, kernel="sglang_decode", us=stock)]
    for splits in (1, 2, 4) if "verify" in kernels else ():
        for block_n in (32, 64, 128):
            for warps in (4, 8):
                for stages in (2, 3, 4):
                    us = bench_us(
                        lambda: verify(
                            kv_indptr,
                            kv_indices,
                            VERIFY_ROWS,
                            shape.d**-0.5,
                            lse=lse,
                            num_kv_splits=splits,
                            block_n=block_n,
                            num_warps=warps,
                            num_stages=stages,
                        )
                    )
                    rows.append(
                        dict(base, kernel="verify", splits=splits, block_n=block_n, warps=warps, stages=stages, us=us)
                    )
                us = bench_us(
                    lambda: capture(
                        kv_indptr, kv_indices, out, shape.d**-0.5, num_splits=splits, block_n=block_n, num_warps=warps
                    )
                )
                rows.append(dict(base, kernel="capture", splits=splits, block_n=block_n, warps=warps, us=us))
    if "mixed" in kernels:
        rows += tune_mixed(shape, bs, seq_len, verify, capture, lse, req_to_token, out)
    for kernel in ("sparse", "sparse_fused"):
        if kernel in kernels:
            rows += tune_sparse(shape, bs, seq_len, q[:bs], k, v, req_to_token, seq_lens, stock, kernel)
    if "dense" in kernels:
        rows += tune_dense(shape, bs, seq_len, q[:bs], k, v, req_to_token, seq_lens)
    for r in rows:
        if isinstance(r["us"], float) and not r["kernel"].startswith("sparse"):
            r["GBps"] = prefix_bytes / (2 if r["kernel"].startswith("capture") else 1) / r["us"] / 1e3
            r["vs_sglang_decode"] = r["us"] / stock if isinstance(stock, float) else None
    return rows


def tune_mixed(
    shape: Shape, bs: int, seq_len: int, verify: Callable, capture: Callable, lse, req_to_token, out
) -> list[dict]:
    """The verify and its score capture on mixed prefixes (``mixed_lengths``) and on the uniform batch of the same
    mean, over the split count of a request at the mean and the per-request cap (``mean_prefix_chunk``; default
    tiles; cap = splits is a grid without balancing): which grid keeps the mixed batch at the uniform one's cost."""
    rows = []
    grids = [(1, 1), (1, 2), (1, 4), (2, 2), (2, 4), (2, 8), (3, 6), (4, 4), (4, 8), (8, 8), (8, 16)]
    for kind, per_req in (("uniform", [seq_len] * bs), ("mixed", mixed_lengths(bs, seq_len))):
        kv_indptr, kv_indices = prefix_index(per_req, req_to_token)
        for splits, cap in grids:
            us = bench_us(
                lambda: verify(
                    kv_indptr, kv_indices, VERIFY_ROWS, shape.d**-0.5, lse=lse, num_kv_splits=splits, max_kv_splits=cap
                )
            )
            base = dict(shape=shape.name, bs=bs, seq_len=seq_len, splits=splits, cap=cap)
            rows.append(dict(base, kernel=f"verify_{kind}", us=us))
            us = bench_us(lambda: capture(kv_indptr, kv_indices, out, shape.d**-0.5, num_splits=splits, max_splits=cap))
            rows.append(dict(base, kernel=f"capture_{kind}", us=us))
    return rows


# (splits, block_n, warps, stages) of each sparse sweep.
SPARSE_GRIDS = {
    "sparse": [
        (s, n, w, st)
        for s in (1, 2)
        for n in (16, 32, 64)
        for w in (2, 4, 8)  # two warps: twice the resident programs of four on a 16-row GQA tile
        for st in (2, 3, 4)
    ],
    "sparse_fused": [(s, n, w, st) for s in (1, 2, 3) for n in (16, 32) for w in (4, 8) for st in (2, 3)],
}


def tune_sparse(
    shape: Shape, bs: int, seq_len: int, q, k, v, req_to_token, seq_lens, stock, kernel: str = "sparse"
) -> list[dict]:
    """The draft step's sparse attention (5 % budget + tail, random per-head selections) over its launch parameters;
    ``kernel`` "sparse_fused": with the draft steps' prologue (``draft_prologue``), whose loads lengthen every
    program of the one-split launch (27.2 against 23.4 us a call in the server's traces at Qwen3-1.7B 64 x 4096).
    The H200 sweep at that point (kernels_tune_sparse_fused_h200_886f2d3.json) keeps the default launch fastest,
    also against register caps of 72 and 64 (seven and eight programs a multiprocessor, one wave of two splits)."""
    sel, sel_cnt, cnt, gathered = draft_selection(shape, bs, seq_len, k.element_size())
    rpi, o = torch.arange(bs, device=DEVICE), torch.empty_like(q)
    prologue = {}
    if kernel == "sparse_fused":
        prologue = draft_prologue(shape, torch.randn_like(k[:bs]), torch.randn_like(k[:bs]), req_to_token, seq_lens)
    rows = []
    for splits, block_n, warps, stages in SPARSE_GRIDS[kernel]:
        us = bench_us(
            lambda: sparse_decode_fwd(
                q,
                k,
                v,
                o,
                req_to_token,
                rpi,
                sel,
                sel_cnt,
                seq_lens - TAIL,
                seq_lens,
                shape.d**-0.5,
                num_kv_splits=splits,
                block_n=block_n,
                num_warps=warps,
                num_stages=stages,
                **prologue,
            )
        )
        rows.append(
            dict(
                shape=shape.name,
                bs=bs,
                seq_len=seq_len,
                kernel=kernel,
                selected=cnt,
                splits=splits,
                block_n=block_n,
                warps=warps,
                stages=stages,
                us=us,
                GBps=gathered / us / 1e3,
                vs_sglang_decode=us / stock if isinstance(stock, float) else None,
            )
        )
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
                us = bench_us(
                    lambda: sparse_decode_fwd(
                        q,
                        k,
                        v,
                        o,
                        req_to_token,
                        rpi,
                        sel,
                        sel_cnt,
                        tail_start,
                        seq_lens,
                        shape.d**-0.5,
                        num_kv_splits=splits,
                        block_n=block_n,
                        num_stages=stages,
                    )
                )
                rows.append(
                    dict(
                        shape=shape.name,
                        bs=bs,
                        seq_len=seq_len,
                        kernel="dense",
                        splits=splits,
                        default_splits=default_num_splits(bs * shape.h_kv, q.device),
                        block_n=block_n,
                        warps=4,
                        stages=stages,
                        us=us,
                    )
                )
    return rows
