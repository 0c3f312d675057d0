"""Where a plan misses what the next draft queries attend (CPU, real weights): per layer and KV head, the share of
each query's own full-attention mass (GQA group mean) that lies in the recent tail, in the plan's selected positions
and in the query's own top positions of the same count (what ``tools.draft_fidelity``'s ``oracle`` keeps).

    python -m tools.plan_coverage --model M --data-dir D --prompt-index 12 --reference F.json \\
        --positions 2600:4200:200 [--heads 11] --out F.json

At each committed length v the plan is the worker's (``pillar``: the verify rows' mass averaged over the k + 1 rows
and the group, stored in fp16, top count below the window of ``selection.policy.draft_window``:
``tools.policy_sim.next_plan``), scored from a verify of the reference's k + 1 tokens at v; the queries are the next
round's k draft positions (``--advance`` tokens later), fed the reference with full attention. Fed the reference,
the verify rows are the next queries' own tokens, so the plan knows more than a served one: the gaps read here are
lower bounds. The ``--heads`` KV heads with the widest gap between a query's own top positions and the plan are
printed as the server's ``--pillar-dense-heads`` value (the heads that draft over their whole prefix there).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.modes import ScoreRows
from sglang_sparsespec.selection.head_probe import pick_heads
from sglang_sparsespec.selection.policy import draft_window
from tools.draft_fidelity import add_source_args, prompt_and_model
from tools.policy_sim import ATTN, next_plan, verify_scores


def coverage_at(model, seq: Sequence[int], v: int, cfg: PillarConfig, advance: int) -> dict[str, torch.Tensor]:
    """[layers, H_kv] mean mass shares of the k draft queries after committing ``advance`` tokens at length v."""
    from transformers import DynamicCache

    mc = model.config
    layers, h_q, h_kv, k = mc.num_hidden_layers, mc.num_attention_heads, mc.num_key_value_heads, cfg.num_steps
    groups = h_q // h_kv
    cache = DynamicCache()
    with torch.no_grad():
        model(torch.tensor([seq[:v]]), past_key_values=cache, use_cache=True)
        ATTN.record, ATTN.probs = True, {}
        try:
            model(torch.tensor([seq[v : v + k + 1]]), past_key_values=cache, use_cache=True)
            scores = verify_scores(ATTN.probs, ScoreRows.ALL, h_kv, v)
            cache.crop(v + advance)
            ATTN.probs = {}
            model(torch.tensor([seq[v + advance : v + advance + k]]), past_key_values=cache, use_cache=True)
            queries = ATTN.probs
        finally:
            ATTN.record, ATTN.probs = False, {}
    tail_start, count = (int(t[0]) for t in draft_window(cfg, torch.tensor([v]), torch.tensor([v + advance]), v))
    plan, _ = next_plan(cfg, scores, (tail_start, count), v, v, torch.float16)  # [layers, H_kv, count], as served
    out = {name: torch.zeros(layers, h_kv) for name in ("tail", "plan", "own")}
    for layer in range(layers):
        mass = queries[layer].view(h_kv, groups, k, -1).mean(1)  # [H_kv, k, positions]
        prefix = mass[:, :, :tail_start]
        out["tail"][layer] = mass[:, :, tail_start:].sum(-1).mean(-1)
        out["plan"][layer] = prefix.gather(2, plan[layer][:, None, :].expand(h_kv, k, count)).sum(-1).mean(-1)
        out["own"][layer] = prefix.topk(count, dim=-1).values.sum(-1).mean(-1)
    return out


def widest_gaps(shares: dict[str, torch.Tensor], heads: int) -> str:
    """The ``heads`` (layer, KV head) pairs where ``own`` exceeds ``plan`` most, as ``L.H+L.H`` in layer order."""
    return pick_heads(shares["own"] - shares["plan"], heads)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_args(p, prompt_index=12)
    p.add_argument("--reference", type=Path, required=True, help="a tools.draft_fidelity output (its reference_ids)")
    p.add_argument("--positions", default="2600:4200:200", help="start:stop:step of committed answer lengths")
    p.add_argument("--advance", type=int, default=6)
    p.add_argument("--heads", type=int, default=11, help="KV heads of the widest gaps to name (--pillar-dense-heads)")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from benchmarks.meta import new_run_id, run_metadata

    _, prompt, model = prompt_and_model(args.model, args.data_dir, args.dataset, args.prompt_index)
    seq = [*prompt.input_ids, *json.loads(args.reference.read_text())["reference_ids"]]
    cfg = PillarConfig()
    start, stop, step = (int(x) for x in args.positions.split(":"))
    points = [len(prompt.input_ids) + a for a in range(start, stop, step)]
    if points[-1] + args.advance + cfg.num_steps > len(seq):
        raise SystemExit(f"--positions reach past the reference ({len(seq) - len(prompt.input_ids)} answer tokens)")
    sums: dict[str, torch.Tensor] = {}
    for v in points:
        for name, share in coverage_at(model, seq, v, cfg, args.advance).items():
            sums[name] = sums.get(name, 0) + share / len(points)
    doc: dict[str, Any] = {
        "kind": "plan_coverage",
        "meta": run_metadata(new_run_id()),
        "settings": {**vars(args), "data_dir": str(args.data_dir), "reference": str(args.reference), "out": None},
        "source": prompt.source,
        "by_layer_and_head": {name: share.tolist() for name, share in sums.items()},
        "widest_gap_heads": widest_gaps(sums, args.heads),
    }
    args.out.write_text(json.dumps(doc, indent=1))
    print("layer: tail, plan, own top (mean over KV heads); the largest own - plan gap of a head")
    for layer in range(len(sums["tail"])):
        gap = (sums["own"][layer] - sums["plan"][layer]).max()
        print(
            f"{layer:3d}: {sums['tail'][layer].mean():.3f} {sums['plan'][layer].mean():.3f}"
            f" {sums['own'][layer].mean():.3f}  {gap:.3f}"
        )
    print(f"--pillar-dense-heads {doc['widest_gap_heads']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
