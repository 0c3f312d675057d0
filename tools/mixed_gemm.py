"""What a mixed-phase round would save: the row-wise work of a round, timed on the GPU.

    python -m tools.mixed_gemm --out benchmarks/results/mixed_gemm/mixed_gemm_h100.json \
        --steps benchmarks/results/step_times/steps_qwen3-8b_h100.json

A split round of k drafts is k forwards of B rows (one token per request, sparse attention) and one
verify forward of B (k + 1) rows. The mixed-phase round of the design card staggers the requests over
k + 1 groups: forward g carries the B - n_g drafting requests (one row each) and group g's verify
(k + 1 rows each), B + k n_g rows. Both rounds are k + 1 forwards (same launches) and do the same
attention work (every request still reads its prefix once per verify and its plan once per draft), so
what differs is only the work that scales with rows: the weight GEMMs, norms, activation and LM head,
timed here for a forward of R rows (all layers, each its own random bf16 weights, captured in one CUDA
graph, L2 flushed, median):

    split = k G(B) + G(B (k + 1)),    mixed = sum_g G(B + k n_g),    saving = split - mixed.

(The JSON calls the split round's work ``today_ms``.)

With --steps, each measured PILLAR round of that file (a step-times JSON of the same shape) is
projected to the mixed round: round - saving at its batch. Random weights: times only.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.qwen3_shapes import SHAPES as QWEN3_SHAPES
from benchmarks.step_analysis import stock_step_ms
from tools.kernels_setup import bench_us, provenance, write_result

SMOLLM2 = {
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "vocab_size": 49152,
}
MODELS: dict[str, dict[str, Any]] = {
    "qwen3-8b": QWEN3_SHAPES["qwen3-8b"],
    "qwen3-1.7b": QWEN3_SHAPES["qwen3-1.7b"],
    "smollm2-135m": SMOLLM2,
}
DEFAULT_BATCHES = {"qwen3-8b": (16, 64), "qwen3-1.7b": (16, 64), "smollm2-135m": (64, 256)}


class RowWork:
    """The row-wise part of a forward: per layer RMSNorm, QKV, O, residual, RMSNorm, gate/up, SiLU * up,
    down; then the final norm and the LM head (every row of either phase needs its logits)."""

    def __init__(self, cfg: dict[str, Any], max_rows: int, device: str = "cuda") -> None:
        h, i, d = cfg["hidden_size"], cfg["intermediate_size"], cfg.get("head_dim", 128)
        hq, hkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        w = dict(device=device, dtype=torch.bfloat16)

        def weight(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, **w) * cols**-0.5

        self.layers = [
            (weight((hq + 2 * hkv) * d, h), weight(h, hq * d), weight(2 * i, h), weight(h, i))
            for _ in range(cfg["num_hidden_layers"])
        ]
        self.lm_head = weight(cfg["vocab_size"], h)
        self.q_cols, self.h = hq * d, h
        self.x = torch.randn(max_rows, h, **w)

    def forward(self, rows: int) -> torch.Tensor:
        x = self.x[:rows]
        for w_qkv, w_o, w_gu, w_down in self.layers:
            qkv = F.linear(F.rms_norm(x, (self.h,)), w_qkv)
            x = x + F.linear(qkv[:, : self.q_cols], w_o)  # q stands in for the attention output (same shape)
            gate, up = F.linear(F.rms_norm(x, (self.h,)), w_gu).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, w_down)
        return F.linear(F.rms_norm(x, (self.h,)), self.lm_head)


def groups(batch: int, k: int) -> list[int]:
    """The batch spread over k + 1 phase groups as evenly as whole requests allow."""
    return [batch // (k + 1) + (1 if g < batch % (k + 1) else 0) for g in range(k + 1)]


def measure(model: str, batch: int, k: int, work: RowWork, cache: dict[int, float]) -> dict[str, Any]:
    def g_ms(rows: int) -> float:
        if rows not in cache:
            cache[rows] = bench_us(lambda: work.forward(rows)) / 1000
        return cache[rows]

    draft, verify = g_ms(batch), g_ms(batch * (k + 1))
    mixed_forwards = [g_ms(batch + k * n) for n in groups(batch, k)]
    split, mixed = k * draft + verify, sum(mixed_forwards)
    return {
        "model": model,
        "batch": batch,
        "k": k,
        "draft_forward_ms": draft,
        "verify_forward_ms": verify,
        "mixed_forward_rows": [batch + k * n for n in groups(batch, k)],
        "mixed_forward_ms": mixed_forwards,
        "today_ms": split,
        "mixed_ms": mixed,
        "saving_ms": split - mixed,
    }


def project(rows: list[dict[str, Any]], steps_path: Path) -> list[dict[str, Any]]:
    """Each PILLAR round of a step-times file with its mixed-phase projection (round - saving at its batch)."""
    saving = {r["batch"]: r["saving_ms"] for r in rows}
    doc = json.loads(steps_path.read_text())
    stock = {(r["context"], r["batch"]): stock_step_ms(r) for r in doc["servers"].get("stock", {}).get("rows", [])}
    out = []
    for name, server in doc["servers"].items():
        for r in server.get("rows", []):
            if "round_ms" not in r or r["batch"] not in saving:
                continue
            mixed = r["round_ms"] - saving[r["batch"]]
            step = stock.get((r["context"], r["batch"]))
            out.append(
                {
                    "server": name,
                    "context": r["context"],
                    "batch": r["batch"],
                    "round_ms": r["round_ms"],
                    "mixed_round_ms": mixed,
                    "change": mixed / r["round_ms"] - 1,
                    "verify_minus_stock_step_ms": r["verify_ms"] - step if step else None,
                }
            )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", choices=sorted(MODELS), default="qwen3-8b")
    p.add_argument("--batches", type=int, nargs="+", default=None, help="default: the model's step-times batches")
    p.add_argument("--k", type=int, default=8, help="drafts per round (--speculative-num-steps)")
    p.add_argument("--steps", type=Path, default=None, help="step-times JSON of this model to project")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("mixed_gemm needs a CUDA GPU")
    batches = args.batches or DEFAULT_BATCHES[args.model]
    work = RowWork(MODELS[args.model], max(batches) * (args.k + 1))
    cache: dict[int, float] = {}
    rows = [measure(args.model, b, args.k, work, cache) for b in batches]
    result = {
        **provenance("mixed_gemm"),
        "model": args.model,
        "k": args.k,
        "weights": "random bf16: times only",
        "timing": "CUDA graph replay, L2 flushed, median",
        "rows": rows,
        "projection": project(rows, args.steps) if args.steps else [],
        "steps_file": args.steps.name if args.steps else None,
    }
    write_result(args.out, result)
    for r in rows:
        print(
            f"{args.model} B={r['batch']} k={r['k']}: G(B)={r['draft_forward_ms']:.2f} "
            f"G(B(k+1))={r['verify_forward_ms']:.2f} split {r['today_ms']:.1f} ms, mixed {r['mixed_ms']:.1f} ms, "
            f"saving {r['saving_ms']:.1f} ms"
        )
    for r in result["projection"]:
        print(
            f"  {r['server']} L={r['context']} B={r['batch']}: "
            f"round {r['round_ms']:.1f} -> {r['mixed_round_ms']:.1f} ms ({100 * r['change']:+.1f}%)"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
