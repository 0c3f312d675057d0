"""How well the head probe (``sglang_sparsespec.selection.head_probe``: a random sequence shown twice) names the
heads where the plan falls furthest from each draft query's own choice (``tools.plan_coverage`` on real texts).

    python -m tools.head_probe_check --model M --coverage A.json B.json [--heads 11] --out F.json

For each coverage file: the widest-gap heads, the probe's heads among them, and each probe head's rank by gap.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from sglang_sparsespec.selection.dense_heads import parse_dense_heads
from sglang_sparsespec.selection.head_probe import load_model, pick_heads, probe_model
from tools.plan_coverage import widest_gaps


def gap_ranks(gap: torch.Tensor, heads: str) -> dict[str, int]:
    """Rank (0 = widest) of each listed head by its [layers, H_kv] own - plan gap."""
    order = gap.flatten().argsort(descending=True).tolist()
    return {f"{l}.{h}": order.index(l * gap.shape[1] + h) for l, h in parse_dense_heads(heads)}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--coverage", type=Path, nargs="+", required=True, help="tools.plan_coverage outputs")
    p.add_argument("--heads", type=int, default=11)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    from benchmarks.meta import new_run_id, run_metadata

    scores = probe_model(load_model(args.model, "cpu"), length=200, trials=4)
    heads = pick_heads(scores["score"], args.heads)
    found = set(parse_dense_heads(heads))
    texts = {}
    for path in args.coverage:
        cov = json.loads(path.read_text())
        shares = {name: torch.tensor(cov["by_layer_and_head"][name]) for name in ("own", "plan")}
        widest = widest_gaps(shares, args.heads)
        shared = found & set(parse_dense_heads(widest))
        texts[cov["source"]] = {"widest_gap_heads": widest, "probe_heads_among_them": len(shared),
                                "probe_heads_gap_rank": gap_ranks(shares["own"] - shares["plan"], heads)}  # fmt: skip
        print(f"{cov['source']}: {len(shared)} of the probe's {len(found)} heads among the {args.heads} widest gaps")
    doc = {
        "kind": "head_probe_check",
        "meta": run_metadata(new_run_id()),
        "settings": {"model": args.model, "coverage": [str(c) for c in args.coverage], "heads": args.heads},
        "probe_heads": heads,
        "probe_by_layer_and_head": {name: s.tolist() for name, s in scores.items()},
        "texts": texts,
    }
    args.out.write_text(json.dumps(doc, indent=1))
    print(f"--pillar-dense-heads {heads}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
