"""Run PILLAR's per-layer kernels eagerly at one shape point, a few times each, for Nsight Compute.

    ncu --clock-control none --set detailed -k regex:'_sparse_decode_stage1|_verify_stage1|_draft_sample' \\
        --launch-skip 2 --launch-count 3 -o F python -m tools.kernels_probe --shape qwen3-1.7b --bs 64 --len 4096

The draft step's sparse attention (5 % budget + tail, default launch), the verify attention (k + 1 rows over
the prefix, default launch) and draft sampling over a [bs, V] logits row; each runs ``--repeats`` times, so ncu's
--launch-skip can pass over the first (compiling) launch. Inputs as ``kernels_bench`` builds them.
"""

from __future__ import annotations

import argparse

import torch
from sglang_sparsespec.kernels.draft_sample import DraftSampleInputs, draft_sample_fwd
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd
from sglang_sparsespec.kernels.verify_attention import verify_attention_fwd

from tools.kernels_setup import DEVICE, SHAPES, TAIL, VERIFY_ROWS, draft_selection, make_pool


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", default="qwen3-1.7b", choices=[s.name for s in SHAPES])
    p.add_argument("--bs", type=int, default=64)
    p.add_argument("--len", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    shape = next(s for s in SHAPES if s.name == args.shape)
    bs, seq_len = args.bs, args.len
    k, v, req_to_token = make_pool(shape, bs, seq_len)
    seq_lens = torch.full((bs,), seq_len, dtype=torch.int64, device=DEVICE)
    rpi = torch.arange(bs, device=DEVICE)
    sel, sel_cnt, _, _ = draft_selection(shape, bs, seq_len, k.element_size())
    q = torch.randn(bs * VERIFY_ROWS, shape.h_q, shape.d, device=DEVICE, dtype=torch.bfloat16)
    o = torch.empty_like(q)
    k_ext, v_ext = (
        torch.randn(bs * VERIFY_ROWS, shape.h_kv, shape.d, device=DEVICE, dtype=torch.bfloat16) for _ in "kv"
    )
    lse = torch.empty(bs * VERIFY_ROWS, shape.h_q, device=DEVICE)
    qo_indptr = torch.arange(0, bs + 1, device=DEVICE, dtype=torch.int32) * VERIFY_ROWS
    kv_indptr = torch.arange(0, bs + 1, device=DEVICE, dtype=torch.int32) * seq_len
    kv_indices = req_to_token.flatten().to(torch.int64)
    logits = torch.randn(bs, args.vocab, device=DEVICE) * 3
    rows = torch.ones(bs, device=DEVICE)
    sample = DraftSampleInputs(
        logits,
        rows * 0.6,
        rows * 0.95,
        torch.zeros(bs, dtype=torch.int64, device=DEVICE),
        rows * 0.0,
        torch.empty(bs, 64, device=DEVICE).exponential_(),
    )
    outs = (
        torch.empty(bs, dtype=torch.int64, device=DEVICE),
        torch.empty(bs, 64, dtype=torch.int64, device=DEVICE),
        torch.empty(bs, 64, device=DEVICE),
        torch.empty(bs, device=DEVICE),
    )
    for _ in range(args.repeats):
        sparse_decode_fwd(
            q[:bs], k, v, o[:bs], req_to_token, rpi, sel, sel_cnt, seq_lens - TAIL, seq_lens, shape.d**-0.5
        )
        verify_attention_fwd(
            q, k_ext, v_ext, o, k, v, qo_indptr, kv_indptr, kv_indices, VERIFY_ROWS, shape.d**-0.5, lse=lse
        )
        draft_sample_fwd(sample, *outs)
    torch.cuda.synchronize()
    print(f"ran {args.repeats} x 3 kernels at {shape.name} bs={bs} L={seq_len}")


if __name__ == "__main__":
    main()
