"""How far an fp8 draft LM head moves the drafts' distribution, on real weights (runs on a CPU).

    python -m tools.fp8_head_tv --data-dir ../shared/data --out benchmarks/results/acceptance/fp8_head_tv_smollm2.json

``--pillar-draft-lm-head fp8`` drafts from the logits of an fp8 copy of the LM head (``sglang_sparsespec/fp8.py``:
one scale a weight row, the step's rows quantized per row) instead of the model's. Rejection sampling accepts a
draft with probability sum_x min(p(x), q(x)) = 1 - TV(p, q) for the target's p and the draft's q, so drafting from
q8 instead moves each position's acceptance by at most TV(q, q8) (triangle inequality), whatever p is. This tool
measures TV(q, q8) along SmolLM2-135M-Instruct's own sampled answers to the competition problems (the final hidden
states its LM head scores while serving them), with q as the draft sampler forms it (``kernels/draft_sample.py``:
temperature, then top-p over the C most probable tokens, renormalized; its candidate set ends at a bin edge at or
below C, a detail left out here), and how often the two heads' argmax differ (greedy drafts).
The bound on a round: k drafts at per-token acceptance a accept sum_{i<=k} a^i on average (plus the verify's own
token); a found from the measured mean accept length, the length moves by at most its derivative times the mean TV.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from benchmarks.meta import git_commit, package_version
from benchmarks.workload import build_prompts, load_tokenizer
from sglang_sparsespec.fp8 import quantize_activations, quantize_rows

CANDIDATES = 64  # the draft sampler's C


def draft_q(logits: torch.Tensor, temperature: float, top_p: float, candidates: int = CANDIDATES) -> torch.Tensor:
    """The draft distribution [rows, V] of fp32 logits: softmax at ``temperature``, kept where the rank is below
    ``candidates`` and the mass ahead of a token is <= ``top_p`` (rank 0 always), renormalized."""
    p = torch.softmax(logits.float() / temperature, dim=-1)
    top, ids = p.topk(candidates, dim=-1)
    keep = (top.cumsum(-1) - top) <= top_p
    keep[:, 0] = True
    kept = torch.where(keep, top, torch.zeros_like(top))
    return torch.zeros_like(p).scatter_(1, ids, kept / kept.sum(-1, keepdim=True))


def fp8_logits(hidden: torch.Tensor, w8: torch.Tensor, w_scale: torch.Tensor) -> torch.Tensor:
    """``fp8.scaled_logits`` emulated: both fp8 operands widened with their scales, fp32 product, in hidden's dtype."""
    x8, x_scale = quantize_activations(hidden)
    return ((x8.float() * x_scale[:, None]) @ (w8.float() * w_scale[:, None]).t()).to(hidden.dtype)


def solve_acceptance(accept_length: float, k: int) -> float:
    """The per-token acceptance a with 1 + sum_{i<=k} a^i = accept_length (bisection)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1 + sum(mid**i for i in range(1, k + 1)) < accept_length else (lo, mid)
    return (lo + hi) / 2


def answers_hidden(model, prompts, new_tokens: int, temperature: float, top_p: float, seed: int) -> torch.Tensor:
    """The final (normalized) hidden states [rows, hidden] at every generated position of each prompt's answer."""
    states = []
    for i, prompt in enumerate(prompts):
        torch.manual_seed(seed + i)
        ids = torch.tensor([prompt.input_ids])
        out = model.generate(
            ids, do_sample=True, temperature=temperature, top_p=top_p, max_new_tokens=new_tokens, pad_token_id=2
        )
        with torch.no_grad():
            hidden = model(out, output_hidden_states=True).hidden_states[-1][0]
        states.append(hidden[ids.shape[1] - 1 : -1])  # the positions whose next token is an answer token
    return torch.cat(states)


def answer_parser(description: str) -> argparse.ArgumentParser:
    """The options of a probe along SmolLM2's own answers: the prompts, the answers' length and sampling, and the
    round (drafts, measured accept length) its acceptance bound is taken at."""
    parser = argparse.ArgumentParser(description=description)
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
    return parser


def smollm2_answers(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    """(LM head weight [V, hidden], final hidden states [rows, hidden]) of SmolLM2-135M-Instruct (bf16, built from
    the GGUF package) along its own sampled answers to ``args``' prompts."""
    from transformers import AutoModelForCausalLM

    from sglang_sparsespec.models.smollm2 import build_smollm2

    folder = build_smollm2()
    model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.bfloat16).eval()
    prompts = build_prompts(load_tokenizer(str(folder)), args.data_dir, args.num_prompts)
    hidden = answers_hidden(model, prompts, args.new_tokens, args.temperature, args.top_p, args.seed)
    return model.get_output_embeddings().weight.detach(), hidden


def write_doc(args: argparse.Namespace, kind: str, started: float, fields: dict) -> None:
    """The probe's JSON (provenance, settings, ``fields``) to ``args.out``; printed without the settings."""
    doc = {
        "kind": kind,
        "device": "cpu",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "git_commit": git_commit(),
        "torch": torch.__version__,
        "transformers": package_version("transformers"),
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF, bf16)",
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        **fields,
        "seconds": round(time.time() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: v for k, v in doc.items() if k != "settings"}, indent=1))


def round_slope(args: argparse.Namespace) -> tuple[float, float]:
    """(per-token acceptance a of the measured round, d accept_length / d a): the bound's factor."""
    a = solve_acceptance(args.accept_length, args.k)
    return a, sum(i * a ** (i - 1) for i in range(1, args.k + 1))


def main() -> None:
    args = answer_parser(__doc__.splitlines()[0]).parse_args()
    started = time.time()
    weight, hidden = smollm2_answers(args)
    w8, w_scale = quantize_rows(weight)
    with torch.no_grad():
        ref = hidden @ weight.t()  # bf16, as SGLang's LM head computes it
        got = fp8_logits(hidden, w8, w_scale)
    tv = 0.5 * (draft_q(ref, args.temperature, args.top_p) - draft_q(got, args.temperature, args.top_p)).abs().sum(-1)
    a, slope = round_slope(args)
    fields = {
        "positions": int(tv.numel()),
        "tv_mean": tv.mean().item(),
        "tv_p99": tv.quantile(0.99).item(),
        "tv_max": tv.max().item(),
        "argmax_differs": (ref.argmax(-1) != got.argmax(-1)).float().mean().item(),
        "per_token_acceptance": a,
        "accept_length_bound": slope * tv.mean().item(),
        "accept_length_bound_rel": slope * tv.mean().item() / args.accept_length,
    }
    write_doc(args, "fp8_head_tv", started, fields)


if __name__ == "__main__":
    main()
