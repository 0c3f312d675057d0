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
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.meta import git_commit, package_version
from benchmarks.workload import build_prompts, load_tokenizer
from tools.fp8_head_tv import answers_hidden, draft_q, solve_acceptance

SIZES = (4096, 8192, 16384, 24576, 32768)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--k", type=int, default=8, help="drafts a round")
    parser.add_argument(
        "--accept-length", type=float, default=4.39, help="measured mean tokens a round (SmolLM2 256 x 7000, T 0.6)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    from sglang_sparsespec.models.smollm2 import build_smollm2

    started = time.time()
    folder = build_smollm2()
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16).eval()
    prompts = build_prompts(load_tokenizer(str(folder)), args.data_dir, args.num_prompts)
    hidden = answers_hidden(model, prompts, args.new_tokens, args.temperature, args.top_p, args.seed)
    with torch.no_grad():
        q = draft_q(hidden @ model.get_output_embeddings().weight.detach().t(), args.temperature, args.top_p)
    a = solve_acceptance(args.accept_length, args.k)
    slope = sum(i * a ** (i - 1) for i in range(1, args.k + 1))
    sizes = {
        s: {**m, "accept_length_bound_rel": slope * m["mean"] / args.accept_length}
        for s, m in mass_past(q, SIZES).items()
    }
    doc = {
        "kind": "draft_vocab_mass",
        "device": "cpu",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_commit": git_commit(),
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, bf16)",
        "vocab": q.shape[1],
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "positions": q.shape[0],
        "per_token_acceptance": a,
        "subsets": sizes,
        "seconds": round(time.time() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "settings"}, indent=1))


if __name__ == "__main__":
    main()
