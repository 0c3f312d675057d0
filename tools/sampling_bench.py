"""The sampled round's acceptance phase vs the FlashInfer / sgl_kernel path, side by side (GPU only).

    python -m tools.sampling_bench --out benchmarks/results/kernels/kernels_accept_<device>_<commit>.json \\
        --vocab 151936 --batches 64 256

For each batch of requests x (k + 1) verify rows x vocab (fp32 logits holding bf16 values, as SGLang
hands them over: random rows with 20 tokens lifted by 12, T 0.6) and each case (greedy; top-p 0.95;
top-k 20 + top-p 0.95; min-p 0.05 + top-p 0.95; ``wide``: flatter rows whose nucleus is thousands of
tokens; ``flat``: the near-uniform rows of random weights, a nucleus of 95% of the vocabulary, as
``--load-format dummy`` servers produce) it times (ms per call, mean of 20 after a warm-up):

``accept``: what ships (``sampling/accept.stock_accept`` on the GPU): ``kernels/target_filter.py`` then
    ``kernels/verify_accept.py``, for the flashinfer rule and (``accept_pytorch_rule``) the pytorch
    backend's, launched eagerly as split rounds run it; ``accept_graph``: the same replayed from a CUDA
    graph (the mixed runner's; no launch overhead); for greedy, ``argmax`` (an all-greedy batch runs
    SGLang's argmax) and the greedy rows through the sampled path (``accept``: top_k 1 rows, as in a
    mixed batch).
``filter``: ``target_filter_fwd`` alone; ``filter_candidates`` / ``accept_graph_candidates``: the same with
    the candidate list as the first list instead of level 1's top bins (``candidates=True``).
``stock_kernels``: the FlashInfer / sgl_kernel path that is exact for our records: softmax at T,
    sgl_kernel's ``top_k_renorm_prob`` / ``top_p_renorm_prob`` (their supports intersected: the
    flashinfer joint rule) or the min-p chain, each draft record's q scattered into a dense row,
    then FlashInfer's ``chain_speculative_sampling`` (when flashinfer and sgl_kernel are installed).
``paths``: the share of rows each way of ``target_filter`` decided (``logit_bins.RowPath``).

Expected before measuring (H200, ~4 TB/s HBM): the filter reads the fp32 logits once per pass
(64 x 9 x 151,936 x 4 B = 350 MB: ~90 us) over ~12 small launches: peaked rows (every case but
``flat``) take three passes (~0.3-0.4 ms at 64 requests, ~1.2 ms at 256), near-uniform rows four
(~0.5 ms); the accept kernels read k logits per request, and draw from the row's list (peaked) or
vocabulary-parallel (two more reads of one row per request: ~0.05 ms). The stock path writes and
reads fp32 rows several times (~10 passes: 3-4 ms at 64 requests).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from sglang_sparsespec.kernels.draft_sample import DraftSampleInputs, draft_sample_fwd
from sglang_sparsespec.kernels.logit_bins import RowPath
from sglang_sparsespec.kernels.target_filter import LIST_CAP, target_filter_fwd
from sglang_sparsespec.kernels.verify_accept import rejection_fwd

from benchmarks.meta import new_run_id, run_metadata
from tools.kernels_setup import captured

# Launch parameters of the vocabulary-parallel passes: (tokens per program, tile, warps).
TUNE_GRID = [
    (chunk, block_v, warps)
    for chunk in (4096, 8192, 16384)
    for block_v in (512, 1024, 2048)
    for warps in (4, 8)
    if chunk >= block_v
]
TOP_K_OFF = 1 << 30  # what SGLang's sampling_info.top_ks holds for "no top-k" (TOP_K_ALL)
# case: (top_k, top_p, min_p or None); greedy rows are top_k 1 at temperature 1.
CASES = {
    "greedy": (1, 1.0, None),
    "top_p": (TOP_K_OFF, 0.95, None),
    "top_k_top_p": (20, 0.95, None),
    "min_p": (TOP_K_OFF, 0.95, 0.05),
    "wide": (TOP_K_OFF, 0.95, None),
    "flat": (TOP_K_OFF, 0.95, None),
}


def graph_ms(fn, reps: int = 20) -> float:
    """Mean time of ``fn`` replayed from a CUDA graph (captured after a warm-up on a side stream)."""
    return mean_ms(captured(fn).replay, reps)


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


def stock_kernels(logits, temp, top_k, top_p, min_p, k1, record):
    """The FlashInfer / sgl_kernel acceptance that is exact for our records (dense q rows)."""
    from flashinfer.sampling import chain_speculative_sampling
    from sgl_kernel import top_k_renorm_prob, top_p_renorm_prob

    tokens, ids, q, _ = record
    bs, k, _ = ids.shape
    probs = torch.softmax(logits.float() / temp.repeat_interleave(k1)[:, None], dim=-1)
    ks, ps = top_k.repeat_interleave(k1), top_p.repeat_interleave(k1)
    if min_p is None:
        keep = (top_k_renorm_prob(probs, ks) > 0) & (top_p_renorm_prob(probs, ps) > 0)
    else:
        probs = top_p_renorm_prob(top_k_renorm_prob(probs, ks), ps)
        keep = probs >= probs.amax(dim=-1, keepdim=True) * min_p.repeat_interleave(k1)[:, None]
    probs = torch.where(keep, probs, 0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    draft_p = torch.zeros((bs, k, logits.shape[-1]), device=logits.device).scatter_(2, ids, q)
    return chain_speculative_sampling(draft_p, tokens.int(), probs.view(bs, k1, -1))


def case_inputs(case: str, bs: int, k: int, vocab: int, c: int, dev: str = "cuda"):
    rows = torch.randn(bs * (k + 1), vocab, device=dev) * 3
    rows[:, :20] += 12
    if case == "wide":
        rows *= 0.2
    elif case == "flat":  # random weights: logits of ~1e-5, nearly uniform
        rows = torch.randn(bs * (k + 1), vocab, device=dev) * 2.6e-5
    logits = rows.to(torch.bfloat16).float()
    top_k, top_p, min_p = CASES[case]
    temp = torch.full((bs,), 1.0 if top_k == 1 else 0.6, device=dev)
    params = (
        temp,
        torch.full((bs,), top_k, dtype=torch.int32, device=dev),
        torch.full((bs,), top_p, device=dev),
        None if min_p is None else torch.full((bs,), min_p, device=dev),
    )
    ids = torch.stack([torch.randperm(vocab, device=dev)[:c] for _ in range(bs * k)]).view(bs, k, c)
    q = torch.softmax(torch.randn(bs, k, c, device=dev), -1)
    record = (ids[:, :, 0].contiguous(), ids, q, q[:, :, 0].contiguous())
    coins = (torch.rand(bs, k, device=dev), torch.rand(bs, device=dev))
    return logits, params, record, coins


def measure(case: str, bs: int, k: int, vocab: int, c: int, tune: bool, with_stock: bool) -> dict[str, float | str]:
    logits, (temp, top_k, top_p, min_p), record, (coins, final) = case_inputs(case, bs, k, vocab, c)

    def accept(rank_rule: bool, **launch):
        target = target_filter_fwd(logits, temp, top_k, top_p, min_p, k + 1, rank_rule, **launch)
        return rejection_fwd(target, *record, k, coins, final)

    timed = {
        "accept": lambda: accept(False),
        "accept_pytorch_rule": lambda: accept(True),
        "filter": lambda: target_filter_fwd(logits, temp, top_k, top_p, min_p, k + 1),
        "filter_candidates": lambda: target_filter_fwd(logits, temp, top_k, top_p, min_p, k + 1, candidates=True),
    }
    graphed = {"accept_graph": lambda: accept(False), "accept_graph_candidates": lambda: accept(False, candidates=True)}
    for chunk, bv, warps in TUNE_GRID if tune else ():
        kw = {"chunk": chunk, "block_v": bv, "num_warps": warps}
        graphed[f"accept_graph@{chunk}x{bv}x{warps}"] = lambda kw=kw: accept(False, **kw)
    if case == "greedy":
        timed["argmax"] = lambda: logits.argmax(dim=-1)
    try:
        import flashinfer.sampling  # noqa: F401
        import sgl_kernel  # noqa: F401
    except ImportError:
        stock = None
    if not with_stock:
        stock = None
    else:
        stock = lambda: stock_kernels(logits, temp, top_k, top_p, min_p, k + 1, record)  # noqa: E731
    out: dict[str, float | str] = {name: round(mean_ms(fn), 4) for name, fn in timed.items()}
    out |= {name: round(graph_ms(fn), 4) for name, fn in graphed.items()}
    if stock is not None:
        try:
            out["stock_kernels"] = round(mean_ms(stock), 4)
        except (RuntimeError, TypeError, ValueError) as err:  # another FlashInfer API: said in the result
            out["stock_kernels"] = f"failed: {type(err).__name__}: {err}"[:300]
    for key, cand in (("paths", False), ("paths_candidates", True)):
        paths = target_filter_fwd(logits, temp, top_k, top_p, min_p, k + 1, candidates=cand).path
        out[key] = {p.name: round(float((paths == p).float().mean()), 4) for p in RowPath if (paths == p).any()}
    return out


def draft_timed(bs: int, vocab: int, c: int, tune: bool) -> dict[str, float]:
    """The draft sampler next to torch.topk (one draft step, eager and replayed from a CUDA graph as the draft
    runner replays it); with ``tune``, also at every chunk x tile of TUNE_GRID (``draft_sample_fwd@<chunk>x<tile>``)."""
    dev = "cuda"
    logits = torch.randn(bs, vocab, device=dev) * 3
    logits[:, :20] += 12
    temp, top_p = torch.full((bs,), 0.6, device=dev), torch.full((bs,), 0.95, device=dev)
    top_k, min_p = torch.full((bs,), -1, device=dev, dtype=torch.int32), torch.zeros(bs, device=dev)
    x = DraftSampleInputs(logits, temp, top_p, top_k, min_p, torch.empty(bs, c, device=dev).exponential_())
    outs = (
        torch.empty(bs, dtype=torch.int64, device=dev),
        torch.empty(bs, c, dtype=torch.int64, device=dev),
        torch.empty(bs, c, device=dev),
        torch.empty(bs, device=dev),
    )
    timed = {
        "draft_sample_fwd": lambda: draft_sample_fwd(x, *outs),
        "torch_topk": lambda: torch.topk(logits, c, dim=-1),
    }
    out = {name: round(mean_ms(fn), 4) for name, fn in timed.items()}
    graphed = {"draft_sample_graph": lambda: draft_sample_fwd(x, *outs)}
    for chunk, bv, warps in TUNE_GRID if tune else ():
        kw = {"chunk": chunk, "block_v": bv, "num_warps": warps}
        graphed[f"draft_sample_fwd@{chunk}x{bv}x{warps}"] = lambda kw=kw: draft_sample_fwd(x, *outs, **kw)
    return out | {name: round(graph_ms(fn), 4) for name, fn in graphed.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--record-candidates", type=int, default=64, help="C of the draft records")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--no-stock", action="store_true", help="leave out stock_kernels (FlashInfer's JIT build)")
    parser.add_argument(
        "--tune",
        action="store_true",
        help="also the accept phase and the draft sampler at every chunk x tile x warps of TUNE_GRID",
    )
    a = parser.parse_args()
    ms: dict[str, dict] = {}
    for bs in a.batches:
        for case in a.cases:
            ms[f"{bs}x{a.k + 1}x{a.vocab}/{case}"] = row = measure(
                case, bs, a.k, a.vocab, a.record_candidates, a.tune, not a.no_stock
            )
            print(f"{bs}x{a.k + 1}x{a.vocab} {case}: {row}", flush=True)
        ms[f"{bs}x{a.vocab}/draft_step"] = draft_timed(bs, a.vocab, a.record_candidates, a.tune)
    settings = {
        "vocab": a.vocab,
        "batches": a.batches,
        "k": a.k,
        "record_candidates": a.record_candidates,
        "list_cap": LIST_CAP,
        "cases": {c: CASES[c] for c in a.cases},
        "unit": "ms per call, mean of 20 after one warm-up (eager; *_graph: CUDA graph replays); paths: share of rows",
    }
    out = {"kind": "accept_phase", "meta": run_metadata(new_run_id()), "settings": settings, "ms": ms}
    a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
