"""Each vocabulary-parallel pass of the target filter alone, against one read of the logits (GPU only).

    python -m tools.vocab_pass_probe --out benchmarks/results/kernels/vocab_passes_<device>_<commit>.json

The round's profile (``trace_qwen3-1.7b_round_h200_6c8d415``, 576 verify rows x 151,936 fp32 logits, 350 MB)
has the accept phase at 1.27 ms: statistics 127 us, level-1 histogram 386 us, the bracket's passes 30 us and the
gather 446 us, where one read of the logits takes ~90 us; the draft sampler's passes at 64 rows show the same
shape (histogram 50 us, gather 27 us against a ~10 us read). This probe times, for peaked rows (``top_p``) and the
near-uniform rows of random weights (``flat``), at 576 and 64 rows and a few launches: a plain read (``amax``),
each pass replayed alone from a CUDA graph on the plan state a full filter left (``stats``, ``hist1``,
``gather1``, ``gather2``), and ``bins_only``: the level-1 histogram's loop with its ``tl.histogram`` replaced by a
sum of the bins, and with a histogram of 256 / 128 / 64 / 32 bins (``hist1_nb*``). hist1 - bins_only is what the
histogram op costs, the ``hist1_nb*`` row how that cost scales with the bins (Triton's warp-level histogram
ballots each bit of a bin index and popcounts the bins each lane owns: ~100 instructions a token at 256 bins);
gather - read, what the gather's scan costs.

Expected before measuring: stats and bins_only near a read (~1.2x); hist1 3-4x a read, i.e. the histogram op,
not bandwidth, sets the level-1 pass (hist1_nb256 = hist1, about halving at 64 bins); gather1 / gather2 near a
read on rows whose tiles take nothing, and 4-5x on rows that take a token in every tile (the scan, cumsum and
scattered stores).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from sglang_sparsespec.kernels.logit_bins import (
    CHUNK,
    DEPTH,
    GREEDY_EPS,
    NB,
    _stats_kernel,
    first_resolution,
    inv_temperature,
    level_bin,
    load_z,
    row_stats,
)
from sglang_sparsespec.kernels.target_filter import LEVELS, LIST_CAP
from sglang_sparsespec.kernels.vocab_passes import PassRows, VocabPasses

from tools.kernels_setup import provenance, write_result
from tools.sampling_bench import case_inputs, graph_ms

LAUNCHES = ((1024, 4), (2048, 4), (512, 4), (1024, 8))  # (block_v, warps) at chunk CHUNK


@triton.jit
def _bins_only_kernel(
    Logits,
    Temperature,
    Stats,
    Out,
    Hist,
    stride_h,
    vocab,
    stride_l,
    repeats,
    n_chunks,
    GREEDY_EPS_C: tl.constexpr,
    NB_C: tl.constexpr,
    DEPTH_C: tl.constexpr,
    NCH: tl.constexpr,
    CHUNK_C: tl.constexpr,
    BLOCK_V: tl.constexpr,
    HIST_BINS: tl.constexpr,
):
    """The level-1 histogram pass's loads and bin arithmetic at NB_C bins, its ``tl.histogram`` replaced by a sum
    of the bins (HIST_BINS = 0, written to Out [n, chunks]) or by a histogram of HIST_BINS bins (written to
    the first HIST_BINS of each row of Hist [n, chunks, stride_h])."""
    row, ch = tl.program_id(0).to(tl.int64), tl.program_id(1)
    inv_t = inv_temperature(Temperature, row // repeats, GREEDY_EPS_C)
    m, inv_s, fin, zmin, arg = row_stats(Stats, row, n_chunks, NCH)
    r = first_resolution(m, zmin, NB_C, DEPTH_C)
    w = NB_C - 1
    offs = tl.arange(0, BLOCK_V)
    acc = 0
    if HIST_BINS > 0:
        hist = tl.zeros([HIST_BINS], dtype=tl.int32)
    for sub in range(0, CHUNK_C, BLOCK_V):
        z = load_z(Logits + row * stride_l, ch * CHUNK_C + sub + offs, vocab, inv_t)
        j = level_bin(z, m, r, 0, w, True)
        inside = (z > -float("inf")) & (j >= 0) & (j < w)
        if HIST_BINS > 0:
            hist += tl.histogram(tl.where(inside, j, 0), HIST_BINS, mask=inside)
        else:
            acc += tl.sum(tl.where(inside, j, 0), axis=0)
    if HIST_BINS > 0:
        tl.store(Hist + (row * n_chunks + ch) * stride_h + tl.arange(0, HIST_BINS), hist)
    else:
        tl.store(Out + row * n_chunks + ch, acc)


def pass_calls(
    case: str, bs: int, block_v: int, warps: int, vocab: int = 151936, dev: str = "cuda"
) -> tuple[dict[str, Any], dict[str, float], torch.Tensor, VocabPasses, torch.Tensor]:
    """The passes of one filter as separate calls (after one full run set their plan state), the share of rows
    each way of the filter went, the ``bins_only`` output [n, chunks], the passes' state and the probe's
    histogram [n, chunks, NB] (its first ``nb`` bins written by ``hist1_nb<nb>``)."""
    k = 8
    logits, (temp, top_k, top_p, min_p), _, _ = case_inputs(case, bs, k, vocab, 64, dev)
    n, vocab = logits.shape
    rows = PassRows(logits, temp, top_k, top_p, min_p, k + 1, CHUNK, block_v, warps)
    passes = VocabPasses.allocate(n, triton.cdiv(vocab, CHUNK), LIST_CAP, logits.device)
    passes.top_list(rows, target=True)
    passes.bracket(rows, False, LEVELS)
    paths = {str(int(p)): round(float((passes.path == p).float().mean()), 3) for p in passes.path.unique()}
    grid, args = passes._grid(rows), passes._args(rows)
    out = torch.empty(grid, dtype=torch.int32, device=logits.device)
    hist = torch.empty((*grid, NB), dtype=torch.int32, device=logits.device)

    def level1(nb: int, hist_bins: int) -> None:
        consts = {"GREEDY_EPS_C": GREEDY_EPS, "NB_C": nb, "DEPTH_C": DEPTH, "NCH": passes.offsets.shape[1]}
        _bins_only_kernel[grid](
            logits, temp, passes.stats, out, hist, hist.shape[-1], *args, **consts, CHUNK_C=CHUNK, BLOCK_V=block_v,
            HIST_BINS=hist_bins, num_warps=warps,
        )  # fmt: skip

    calls = {
        "read": lambda: logits.amax(dim=1),
        "stats": lambda: _stats_kernel[grid](logits, temp, passes.stats, *args, **rows.launch),
        "bins_only": lambda: level1(NB, 0),
        # The same pass with fewer bins: what a level-1 histogram of 128 / 64 / 32 bins would cost.
        **{f"hist1_nb{nb}": lambda nb=nb: level1(nb, nb) for nb in (NB, 128, 64, 32)},
        "hist1": lambda: passes._hist(rows, first=True, skip_unfiltered=True),
        "gather1": lambda: passes._gather(rows, stage=1),
        "gather2": lambda: passes._gather(rows, stage=2),
    }
    return calls, paths, out, passes, hist


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 8], help="requests (x 9 verify rows)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("vocab_pass_probe needs a CUDA GPU")
    started = time.time()
    rows = []
    for case in ("top_p", "flat"):
        for bs in args.batches:
            for block_v, warps in LAUNCHES:
                calls, paths = pass_calls(case, bs, block_v, warps)[:2]
                us = {name: round(graph_ms(fn) * 1e3, 1) for name, fn in calls.items()}
                row = {"case": case, "rows": bs * 9, "block_v": block_v, "warps": warps, "us": us, "paths": paths}
                print(row, flush=True)
                rows.append(row)
    doc = {
        **provenance("vocab_passes"),
        "timing": "each call alone in a CUDA graph, mean of 20 replays (plan state from one full filter run)",
        "rows": rows,
        "wall_s": time.time() - started,
    }
    write_result(args.out, doc)


if __name__ == "__main__":
    main()
