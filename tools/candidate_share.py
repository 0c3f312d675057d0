"""How often the accept phase's candidate list decides a real model's verify rows (runs on a CPU).

    python -m tools.candidate_share --data-dir ../shared/data --out benchmarks/results/acceptance/candidate_share.json

The target filter's candidate list (``kernels/top_candidates``: the level-1 bins of the tokens with p >= 1 / 2047)
decides a row in one read when it holds the row's cut; a row it cannot decide takes the bracket stage's histogram
passes too. Random weights' rows are near-uniform, never decided (their pass is skipped), so only real weights say
how often it pays. Along SmolLM2-135M-Instruct's own sampled answers, the target's logits at every position (bf16
products as the server's LM head gives them, at the served temperature): ``nucleus_within`` is the share of all
positions whose top-p nucleus (with top-k 20: its first 20 tokens, or fewer) lies among the tokens of p >= 1 / 2047,
computed with torch; ``paths`` runs both first lists of ``target_filter_fwd`` in Triton's interpreter on ``--rows``
of those positions (the share of rows each path decided) and ``same_rows`` says whether the two gave the same kept
sets and probabilities.
"""

from __future__ import annotations

import os
import time

import torch

# Triton decides interpreted or compiled when it decorates a kernel; the rows are CPU tensors: interpreted.
os.environ.setdefault("TRITON_INTERPRET", "1")

from sglang_sparsespec.kernels.logit_bins import RowPath  # noqa: E402
from sglang_sparsespec.kernels.target_filter import LIST_CAP, target_filter_fwd  # noqa: E402

from tools.fp8_head_tv import answer_parser, smollm2_answers, write_doc  # noqa: E402

TOP_K_OFF = 1 << 30  # SGLang's "no top-k"


def nucleus_within(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> float:
    """Share of rows whose kept set (flashinfer's rule, top-k then top-p) holds only tokens of p >= 1 / (cap - 1)."""
    p = torch.softmax(logits.double() / temperature, -1)
    sorted_p, _ = p.sort(-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # the mass ranked ahead of each token
    rank = torch.arange(p.shape[1])
    kept = (before < top_p) & (rank < top_k)
    small = sorted_p < 1.0 / (LIST_CAP - 1)
    return (~(kept & small).any(-1)).double().mean().item()


def kernel_paths(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> dict[str, object]:
    """Both first lists of the target filter on ``logits`` (one request a row): each one's paths, and whether
    their kept sets and probabilities agree."""
    n = logits.shape[0]
    params = (
        torch.full((n,), temperature),
        torch.full((n,), top_k, dtype=torch.int32),
        torch.full((n,), top_p),
        None,
    )
    out: dict[str, object] = {}
    dense = {}
    for name, cand in (("top_bins", False), ("candidates", True)):
        rows = target_filter_fwd(logits, *params, candidates=cand)
        out[name] = {
            p.name: round(float((rows.path == p).double().mean()), 4) for p in RowPath if (rows.path == p).any()
        }
        dense[name] = rows.dense()
    a, b = dense["candidates"], dense["top_bins"]
    out["same_rows"] = bool(torch.equal(a > 0, b > 0)) and bool(torch.allclose(a, b, atol=1e-6, rtol=1e-5))
    return out


def main() -> None:
    parser = answer_parser(__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256, help="positions the kernels run on (interpreter)")
    args = parser.parse_args()
    started = time.time()
    weight, hidden = smollm2_answers(args)
    with torch.no_grad():
        logits = (hidden @ weight.T).float()  # bf16 products, widened: what SGLang's LM head hands the sampler
    sample = logits[torch.randperm(logits.shape[0], generator=torch.Generator().manual_seed(args.seed))[: args.rows]]
    cases = {}
    for name, top_k in (("top_p", TOP_K_OFF), ("top_k20_top_p", 20)):
        cases[name] = {
            "nucleus_within": round(nucleus_within(logits, args.temperature, args.top_p, top_k), 4),
            "paths": kernel_paths(sample, args.temperature, args.top_p, top_k),
        }
        print(name, cases[name], flush=True)
    write_doc(
        args,
        "candidate_share",
        started,
        {"vocab": logits.shape[1], "positions": logits.shape[0], "list_cap": LIST_CAP, "cases": cases},
    )


if __name__ == "__main__":
    main()
