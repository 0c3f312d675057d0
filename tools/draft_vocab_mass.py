"""How much of the draft distribution lies past the first S token ids, on real weights (runs on a CPU).

    python -m tools.draft_vocab_mass --data-dir ../shared/data --out benchmarks/results/acceptance/draft_vocab_mass.json

A draft step spends its LM head and its sampler's vocabulary passes on every token id: on Qwen3-1.7B at 64 rows
~0.16 ms of LM head and ~0.1 ms of sampling a step, 2 ms of a 33.7 ms round. Drafting over the first S ids only
(a byte-level BPE numbers its tokens in merge order, so low ids are the frequent merges) would cut both by about
V / S and stays lossless: the verify's rejection sampling gives tokens the draft cannot propose their share through
the residual. What it can cost is acceptance: the draft q restricted to the subset and renormalized, q_S, differs
from q by TV(q, q_S) = q(ids >= S), and a draft's acceptance moves by at most that. This tool measures q(ids >= S)
along SmolLM2-135M-Instruct's own sampled answers to the competition problems (the final hidden states its LM head
scores while serving them; q as ``tools.fp8_head_tv.draft_q`` forms it), how often q's argmax is past S (a greedy
draft the subset cannot make), and the bound that puts on a round's accept length.

Id order is a poor frequency order for this text (``subsets``). A server can rank the vocabulary by what it has
drafted: ``subsets_seen`` ranks ids by their summed q over the first half of the positions (the first prompts'
answers; ids q never touched after them, in id order) and measures q's mass past the first S of that ranking over
the second half, beside ``subsets_held_out``, the id-order numbers of the same second half.
"""

from __future__ import annotations

import time

import torch
from sglang_sparsespec.draft_vocab import ranked_ids

from tools.fp8_head_tv import answer_parser, draft_q, round_slope, smollm2_answers, write_doc

SIZES = (1024, 2048, 4096, 8192, 16384, 24576, 32768)


def mass_past(q: torch.Tensor, sizes: tuple[int, ...]) -> dict[int, dict[str, float]]:
    """Per subset size S: the mean, 99th percentile and max over rows of q's mass on ids >= S, and the share of
    rows whose most probable id is >= S. q: [rows, V] distributions."""
    tail = q.flip(-1).cumsum(-1).flip(-1)  # tail[:, s] = q[:, s:].sum(-1)
    top = q.argmax(-1)
    out = {}
    for s in sizes:
        past = tail[:, s] if s < q.shape[1] else torch.zeros(q.shape[0])
        out[s] = {
            "mean": past.mean().item(),
            "p99": past.quantile(0.99).item(),
            "max": past.max().item(),
            "argmax_past": (top >= s).float().mean().item(),
        }
    return out


def seen_ranking(q: torch.Tensor) -> torch.Tensor:
    """Token ids by their summed q over the rows of ``q`` (most first), ids of equal sum (none seen) in id order:
    the server's own ranking (``DraftVocab``), with q's sums as the counts."""
    return ranked_ids(q.sum(0))


def main() -> None:
    args = answer_parser(__doc__.splitlines()[0]).parse_args()
    started = time.time()
    weight, hidden = smollm2_answers(args)
    with torch.no_grad():
        q = draft_q(hidden @ weight.t(), args.temperature, args.top_p)
    a, slope = round_slope(args)
    half = q.shape[0] // 2
    held_out = q[half:]
    ranked = held_out[:, seen_ranking(q[:half])]  # columns in the first half's order: "ids >= S" = past the top S

    def bounded(m: dict[int, dict[str, float]]) -> dict[int, dict[str, float]]:
        return {s: {**v, "accept_length_bound_rel": slope * v["mean"] / args.accept_length} for s, v in m.items()}

    fields = {
        "vocab": q.shape[1],
        "positions": q.shape[0],
        "per_token_acceptance": a,
        "subsets": bounded(mass_past(q, SIZES)),
        "ranking_positions": half,
        "subsets_held_out": bounded(mass_past(held_out, SIZES)),
        "subsets_seen": bounded(mass_past(ranked, SIZES)),
    }
    write_doc(args, "draft_vocab_mass", started, fields)


if __name__ == "__main__":
    main()
