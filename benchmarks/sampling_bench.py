"""Sampled-round kernels vs the torch they replace, at SmolLM2's vocabulary and batch 256 (GPU only).

    python3 -m benchmarks.sampling_bench --out benchmarks/results/kernels_accept_<device>_<commit>.json

Times (ms per call, eager, mean of 20) the draft sampler (``kernels/draft_sample.py``) next to the ``torch.topk`` it
replaced, the verify's temperature softmax and fused rejection sampling (``kernels/verify_accept.py``)
next to their torch references, on peaked random logits (20 tokens lifted by 12, as a reasoning
model at T 0.6). The verify's target rows (k + 1 per request, T 0.6, top-p 0.95; also with top-k 50)
come from ``kernels/target_filter.py`` (``target_filter_*``) and, before it, from ``softmax_t_fwd``
followed by SGLang's renorm kernels (``old_target_*``, when sgl_kernel is installed);
``target_filter_flat`` prices the exact vocabulary-wide path on flat rows (every nucleus > C).
``--tune`` adds both kernels at every vocabulary tile x warp count of ``TUNE_GRID`` (``<name>@<tile>x<warps>``):
one program per row walks its row several times, so its speed is set by how much of the row is in flight.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from sglang_sparsespec.kernels.draft_sample import DraftSampleInputs, draft_sample_fwd
from sglang_sparsespec.kernels.target_filter import target_filter_fwd
from sglang_sparsespec.kernels.verify_accept import rejection_fwd, softmax_t_fwd

from benchmarks.meta import new_run_id, run_metadata
from sglang_sparsespec.spec.rejection import DraftRecord, rejection_sample

TOP_K_OFF = 1 << 30  # what SGLang's sampling_info.top_ks holds for "no top-k" (TOP_K_ALL)
TUNE_GRID = [(block_v, warps) for block_v in (1024, 2048, 4096, 8192) for warps in (4, 8, 16)]


def mean_ms(fn, reps: int = 20) -> float:
    """Mean eager time over ``reps`` calls after one warm-up (compile) call."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / reps


def old_target(rows: torch.Tensor, temp: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor, repeats: int):
    """The verify's target before target_filter_fwd: softmax_t_fwd, then SGLang's renorm kernels
    (top-p alone, or joint top-k / top-p as the intersection of both renorms' supports)."""
    from sgl_kernel import top_k_renorm_prob, top_p_renorm_prob

    probs = softmax_t_fwd(rows, temp, repeats)
    top_p = top_p.repeat_interleave(repeats)
    if top_k is None:
        return top_p_renorm_prob(probs, top_p)
    keep = (top_k_renorm_prob(probs, top_k.repeat_interleave(repeats)) > 0) & (top_p_renorm_prob(probs, top_p) > 0)
    probs = torch.where(keep, probs, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def filter_timed(rows, temp, top_p, repeats: int, suffix: str = "", **launch) -> dict:
    """target_filter_fwd on ``rows`` with top-p alone and with top-k 50, under ``launch`` parameters."""
    top_ks = {"top_p": TOP_K_OFF, "top_k_top_p": 50}
    return {
        f"target_filter_{case}{suffix}": lambda k=torch.full_like(temp, v, dtype=torch.int32): target_filter_fwd(
            rows, temp, k, top_p, None, repeats, **launch)
        for case, v in top_ks.items()
    }  # fmt: skip


def target_rows_timed(rows: torch.Tensor, temp: torch.Tensor, top_p: torch.Tensor, repeats: int) -> dict:
    """The verify's target rows, new kernel vs the old path, top-p alone and with top-k 50."""
    top_k_off = torch.full_like(temp, TOP_K_OFF, dtype=torch.int32)
    top_k50 = torch.full_like(temp, 50, dtype=torch.int32)
    flat = rows * 0.05
    timed = {
        **filter_timed(rows, temp, top_p, repeats),
        "target_filter_flat": lambda: target_filter_fwd(flat, temp, top_k_off, top_p, None, repeats),
    }
    try:
        import sgl_kernel  # noqa: F401
    except ImportError:
        return timed
    timed["old_target_top_p"] = lambda: old_target(rows, temp, None, top_p, repeats)
    timed["old_target_top_k_top_p"] = lambda: old_target(rows, temp, top_k50, top_p, repeats)
    return timed


def measure(vocab: int, bs: int, k: int, c: int, tune: bool) -> dict[str, float]:
    dev = "cuda"
    logits = torch.randn(bs, vocab, device=dev) * 3
    logits[:, :20] += 12
    temp, top_p = torch.full((bs,), 0.6, device=dev), torch.full((bs,), 0.95, device=dev)
    top_k, min_p = torch.full((bs,), -1, device=dev, dtype=torch.int32), torch.zeros(bs, device=dev)
    x = DraftSampleInputs(logits, temp, top_p, top_k, min_p, torch.empty(bs, c, device=dev).exponential_())
    outs = (torch.empty(bs, dtype=torch.int64, device=dev), torch.empty(bs, c, dtype=torch.int64, device=dev),
            torch.empty(bs, c, device=dev), torch.empty(bs, device=dev))  # fmt: skip
    rows = torch.randn(bs * (k + 1), vocab, device=dev) * 3
    rows[:, :20] += 12
    p = torch.softmax(rows, -1).view(bs, k + 1, vocab)
    ids = torch.randint(0, vocab, (bs, k, c), device=dev)
    q = torch.softmax(torch.randn(bs, k, c, device=dev), -1)
    tokens, q_tok = ids[:, :, 0].contiguous(), q[:, :, 0].contiguous()
    coins, final = torch.rand(bs, k, device=dev), torch.rand(bs, device=dev)
    timed = {
        "draft_sample_fwd": lambda: draft_sample_fwd(x, *outs),
        "torch_topk64": lambda: torch.topk(logits, c, dim=-1),
        "argmax": lambda: logits.argmax(-1),
        "softmax_t_fwd": lambda: softmax_t_fwd(rows, temp, k + 1),
        "torch_softmax_div": lambda: torch.softmax(rows / temp.repeat_interleave(k + 1)[:, None], -1),
        # The kernel rewrites each request's final row; repeating it on the same rows does the same work.
        "rejection_fwd": lambda: rejection_fwd(p, tokens, ids, q, q_tok, k, coins, final),
        "rejection_sample_torch": lambda: rejection_sample(p, DraftRecord(tokens, ids, q, q_tok), coins, final),
        **target_rows_timed(rows, temp, top_p, k + 1),
    }
    for bv, nw in TUNE_GRID if tune else ():
        launch = {"block_v": bv, "num_warps": nw}
        timed[f"draft_sample_fwd@{bv}x{nw}"] = lambda kw=launch: draft_sample_fwd(x, *outs, **kw)
        timed |= filter_timed(rows, temp, top_p, k + 1, f"@{bv}x{nw}", **launch)
    return {name: round(mean_ms(fn), 4) for name, fn in timed.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--candidates", type=int, default=64)
    parser.add_argument("--tune", action="store_true", help="also every tile x warp count of TUNE_GRID")
    a = parser.parse_args()
    ms = measure(a.vocab, a.batch, a.k, a.candidates, a.tune)
    settings = {"vocab": a.vocab, "batch": a.batch, "k": a.k, "candidates": a.candidates, "tune_grid": TUNE_GRID,
                "unit": "ms per call, mean of 20 after one warm-up"}  # fmt: skip
    out = {"kind": "sampling_kernels", "meta": run_metadata(new_run_id()), "settings": settings, "ms": ms}
    a.out.write_text(json.dumps(out, indent=1))
    print(ms)


if __name__ == "__main__":
    main()
