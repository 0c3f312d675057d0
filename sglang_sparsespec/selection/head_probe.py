"""Name the KV heads a shared plan serves badly from the model alone: a random token sequence shown twice.

The heads where each draft query looks up positions of its own (``tools.plan_coverage``'s widest gaps between a
query's own top positions and the plan) are content-addressed lookups: on a random sequence repeated once, a
query at a token of the second copy finds, in an induction head, the position after that token's first
occurrence, and in a duplicate-token head the occurrence itself. A plan chosen from other queries' attention holds
neither, whatever the text. The probe scores each KV head by the mass its query heads (GQA group mean) put on those
two positions, averaged over the second copy's queries and over a few random sequences, and names the highest as
the value of ``--pillar-dense-heads`` and of ``--pillar-match-heads``. It needs real weights and no data;
``transformers`` runs the model.

    python -m sglang_sparsespec.selection.head_probe --model-path M [--heads 11] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .dense_heads import FLAG
from .match_heads import FLAG as MATCH_FLAG
from .match_heads import SUGGESTED_LATEST

if TYPE_CHECKING:
    from transformers import PreTrainedModel

# Token ids drawn for the probe start above the special tokens and stop short of a vocabulary's tail, where
# added tokens live.
FIRST_ID = 1000
# Random ids in each copy and sequences averaged over (the command's defaults and the server's ``N@auto`` probe).
PROBE_LENGTH = 200
PROBE_TRIALS = 4


def vocab_fits(length: int, vocab_size: int) -> bool:
    """Whether a vocabulary has ``length`` ids for a probe between the special tokens and its tail."""
    return vocab_size > 2 * FIRST_ID + length


def probe_sequence(length: int, vocab_size: int, bos: int | None, generator: torch.Generator) -> torch.Tensor:
    """[1 + 2 * length] (or [2 * length] without a BOS) int64: ``length`` random ids, then the same ids again."""
    if not vocab_fits(length, vocab_size):
        raise ValueError(f"a vocabulary of {vocab_size} ids is too small for a probe of {length} random ids")
    ids = torch.randint(FIRST_ID, vocab_size - FIRST_ID, (length,), generator=generator)
    head = [] if bos is None else [bos]
    return torch.tensor([*head, *ids.tolist(), *ids.tolist()], dtype=torch.int64)


def lookup_scores(attn: Sequence[torch.Tensor], length: int, num_kv_heads: int, offset: int) -> dict[str, torch.Tensor]:
    """[layers, num_kv_heads] mean attention of the second copy's queries on their token's first occurrence
    (``duplicate``) and on the position after it (``induction``), from per-layer probabilities [H_q, T, T] of a
    ``probe_sequence`` whose first copy starts at ``offset`` (1 after a BOS)."""
    queries = torch.arange(offset + length, offset + 2 * length, device=attn[0].device if attn else None)
    first = queries - length  # the same token in the first copy
    out = {"duplicate": [], "induction": []}
    for probs in attn:
        h_q = probs.shape[0]
        if h_q % num_kv_heads:
            raise ValueError(f"{h_q} query heads do not group into {num_kv_heads} KV heads")
        group = probs.float().view(num_kv_heads, h_q // num_kv_heads, *probs.shape[1:]).mean(1)
        out["duplicate"].append(group[:, queries, first].mean(-1))
        out["induction"].append(group[:, queries, first + 1].mean(-1))
    return {name: torch.stack(rows) for name, rows in out.items()}


def qk_lookup_scores(
    q: torch.Tensor, k: torch.Tensor, length: int, offset: int, scaling: float, logit_cap: float = 0.0
) -> dict[str, torch.Tensor]:
    """``lookup_scores`` of one layer ([num_kv_heads] each) from its queries q [T, H_q, D] and keys k [T, H_kv, D]
    over a ``probe_sequence`` (as a served forward hands them to attention: normed and rotated), causal softmax of
    the scaled logits (tanh soft-capped where ``logit_cap`` > 0), fp32."""
    t, h_q, _ = q.shape
    h_kv = k.shape[1]
    if h_q % h_kv:
        raise ValueError(f"{h_q} query heads do not group into {h_kv} KV heads")
    keys = k.float().repeat_interleave(h_q // h_kv, dim=1)
    logits = torch.einsum("qhd,khd->hqk", q.float(), keys) * scaling
    if logit_cap > 0:
        logits = logit_cap * torch.tanh(logits / logit_cap)
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    probs = logits.masked_fill(future, float("-inf")).softmax(-1)
    return {name: s[0] for name, s in lookup_scores([probs], length, h_kv, offset).items()}


def pick_heads(score: torch.Tensor, count: int) -> str:
    """The ``count`` highest-scoring (layer, KV head) pairs of a [layers, H_kv] score, as ``L.H+L.H`` in layer
    order (the flag's value)."""
    top = score.flatten().topk(min(count, score.numel())).indices.tolist()
    return "+".join(f"{i // score.shape[1]}.{i % score.shape[1]}" for i in sorted(top))


@torch.no_grad()
def probe_model(model: PreTrainedModel, length: int, trials: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Mean ``lookup_scores`` of a ``transformers`` causal LM (eager attention, so it returns probabilities) over
    ``trials`` random sequences, plus ``score`` = their sum."""
    cfg = model.config
    num_kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    bos = getattr(cfg, "bos_token_id", None)
    device = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    sums: dict[str, torch.Tensor] = {}
    for _ in range(trials):
        seq = probe_sequence(length, cfg.vocab_size, bos, gen)
        out = model(seq[None].to(device), output_attentions=True, use_cache=False)
        attn = [a[0] for a in out.attentions]
        for name, s in lookup_scores(attn, length, num_kv_heads, int(bos is not None)).items():
            sums[name] = sums.get(name, 0) + s.cpu() / trials
    sums["score"] = sums["duplicate"] + sums["induction"]
    return sums


def load_model(path: str, device: str) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="eager")
    return model.to(device).eval()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-path", required=True, help="a Hugging Face model folder with real weights")
    p.add_argument("--heads", type=int, default=11, help="KV heads to name (each adds its whole prefix's K and V "
                   "to every draft step's reads)")  # fmt: skip
    p.add_argument("--length", type=int, default=PROBE_LENGTH, help="random ids in each copy")
    p.add_argument("--trials", type=int, default=PROBE_TRIALS, help="random sequences to average over")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", type=Path, help="write every head's scores here (JSON)")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    scores = probe_model(load_model(args.model_path, args.device), args.length, args.trials)
    heads = pick_heads(scores["score"], args.heads)
    if args.out is not None:
        doc = {"settings": {**vars(args), "out": None}, "heads": heads}
        doc["by_layer_and_head"] = {name: s.tolist() for name, s in scores.items()}
        args.out.write_text(json.dumps(doc, indent=1))
    score = scores["score"].flatten()
    ranked = score.argsort(descending=True)[: args.heads].tolist()
    h_kv = scores["score"].shape[1]
    print("KV head: duplicate + induction mass")
    for i in ranked:
        dup, ind = scores["duplicate"].flatten()[i], scores["induction"].flatten()[i]
        print(f"  {i // h_kv}.{i % h_kv}: {dup:.3f} + {ind:.3f}")
    print(f"{FLAG} {heads}")
    print(f"{MATCH_FLAG} {SUGGESTED_LATEST}@{heads}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
