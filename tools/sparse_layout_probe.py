"""The draft step's sparse attention reaching the same K/V bytes three ways (GPU only).

    python -m tools.sparse_layout_probe --out benchmarks/results/kernels/sparse_layout_<device>_<commit>.json

The draft kernel (kernels/sparse_decode.py) reaches each attended token through three dependent loads a tile: the
selected position, the position's slot in req_to_token, then the slot's K and V rows (256 bytes a KV head at
Qwen3's D = 128). In the server it runs at ~2.1 TB/s (27.3 us a call at Qwen3-1.7B 64 x 4096) against ~12 us of
bytes at 4.8 TB/s. This probe asks how much of that gap the index chain costs and how much the scatter:
``positions``  as the server runs it: per-head sorted positions -> req_to_token -> K/V, over a pool whose slots
               interleave the requests as decoding leaves them (position p of request b in slot 1 + p * bs + b);
``slots``      the same rows from per-head slot lists (what a once-a-round conversion of the selections would
               hand the draft steps): two dependent loads a tile, the rows as scattered;
``compact``    each (request, KV head)'s attended rows copied one after another (what a once-a-round gather would
               build): the rows' addresses follow from the loop index.
``slots`` and ``compact`` run the same kernel with each (request, KV head) as a request of one KV head (the pool
viewed as [slots x H_kv, 1, D]) attending a table row of its own slots, so all three do the same arithmetic,
with the draft steps' prologue (q/k norm, rotary, the step's K/V store). ``compact_copy`` times the gather that
would build the compact rows once a round (torch.index_select of K and V over the pool's KV-head rows).
Each variant is timed on --layers layers' own pools captured in one CUDA graph (mean of replays, us a layer) and
on one layer with L2 flushed (median); the outputs of the three are compared (same bytes in the same order).

Expected before measuring: positions ~27 us, slots ~22, compact ~14, compact_copy ~30 a layer: a compact round of
8 draft steps would save ~8 x 13 - 30 = ~74 us a layer, ~2 ms a round at 28 layers. Measured on an H200
(sparse_layout_h200_abd4867.json): 29.6, 26.6, 26.3 and 139.7; the sweep (sparse_layout_sweep_h200_c742f89.json):
a call ~10 us fixed plus its tokens at ~3.7 TB/s, the served launch the fastest of 27.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd

from tools.kernels_setup import (
    DEVICE,
    SHAPES,
    TAIL,
    Shape,
    bench_us,
    draft_prologue,
    draft_selection,
    graph_ms,
    provenance,
    write_result,
)

VARIANTS = ("positions", "slots", "compact")
SERVED_TILES = (32, 4, 3)  # block_n, num_warps, num_stages: sparse_decode_fwd's defaults, the draft steps' launch
IDEAL_GBPS = 4300.0  # the bandwidth the ideal time assumes (an H200's HBM: 4.8 TB/s peak)


@dataclass
class Launch:
    """One layout's launch: the arguments of ``sparse_decode_fwd`` but the layer's pool and the output."""

    q: torch.Tensor  # [rows, group * heads, D]
    table: torch.Tensor  # [rows, n] int32 req_to_token
    sel: torch.Tensor  # [rows, heads, Kmax] int32
    sel_cnt: torch.Tensor  # [rows] int32
    tail_start: torch.Tensor  # [rows] int64
    seq_lens: torch.Tensor  # [rows] int64
    prologue: dict[str, Any]
    heads: int  # KV heads a row: the shape's for positions, 1 for slots and compact
    tiles: tuple[int, int, int] = SERVED_TILES  # block_n, num_warps, num_stages
    splits: int | None = None  # num_kv_splits (None: the kernel's default, one at 64 x 8 programs)

    @classmethod
    def over_rows(cls, q: torch.Tensor, rows: torch.Tensor, prologue: dict[str, Any]) -> Launch:
        """A launch where each of the rows [R, n] is a request of one KV head attending exactly its n table entries
        (tail only: no selections, the tail from 0), its last entry the current position."""
        no_sel = torch.zeros(rows.shape[0], 1, 1, dtype=torch.int32, device=rows.device)
        n = torch.full((rows.shape[0],), rows.shape[1], dtype=torch.int64, device=rows.device)
        return cls(q, rows.to(torch.int32), no_sel, no_sel.view(-1), n * 0, n, prologue, 1)

    def run(self, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        d = k.shape[-1]
        k, v = k.view(-1, self.heads, d), v.view(-1, self.heads, d)
        rows = torch.arange(self.q.shape[0], device=self.q.device)
        return sparse_decode_fwd(
            self.q, k, v, o.view(self.q.shape), self.table, rows, self.sel, self.sel_cnt, self.tail_start,
            self.seq_lens, d**-0.5, num_kv_splits=self.splits, block_n=self.tiles[0], num_warps=self.tiles[1],
            num_stages=self.tiles[2], **self.prologue,
        )  # fmt: skip


class Layouts:
    """``layers`` KV pools of bs x seq_len interleaved tokens, one draft selection, and the three launches over
    them; ``compact`` pools are built from the pools by ``gather`` (their rows: each (request, KV head)'s attended
    tokens in the order the other two attend them)."""

    def __init__(self, shape: Shape, bs: int, seq_len: int, layers: int):
        h, d = shape.h_kv, shape.d
        self.shape, self.bs = shape, bs
        slots = bs * seq_len + 1
        self.k = [torch.randn(slots, h, d, device=DEVICE, dtype=torch.bfloat16) for _ in range(layers)]
        self.v = [torch.randn_like(k) for k in self.k]
        # decoding interleaves the requests: position p of request b was written in step p, as the b-th request
        table = 1 + torch.arange(seq_len, device=DEVICE)[None, :] * bs + torch.arange(bs, device=DEVICE)[:, None]
        table = table.to(torch.int32)
        self.sel, sel_cnt, self.selected, self.kv_bytes = draft_selection(shape, bs, seq_len, 2)
        seq_lens = torch.full((bs,), seq_len, dtype=torch.int64, device=DEVICE)
        q = torch.randn(bs, shape.h_q, d, device=DEVICE, dtype=torch.bfloat16)
        k_new, v_new = (torch.randn(bs, h, d, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
        prologue = draft_prologue(shape, k_new, v_new, table, seq_lens)
        self.launches = {
            "positions": Launch(q, table, self.sel, sel_cnt, seq_lens - TAIL, seq_lens, prologue, h),
        }
        # Each (request, KV head)'s attended positions in the kernel's order: the selections, then the tail.
        tail = (seq_len - TAIL + torch.arange(TAIL, device=DEVICE)).expand(bs, h, TAIL)
        pos = torch.cat([self.sel[:, :, : self.selected].long(), tail], dim=2)  # [bs, H, n]
        n = pos.shape[2]
        head = torch.arange(h, device=DEVICE)[None, :, None]
        # the pool viewed as [slots x H, 1, D]: row slot * H + head is that head's 256 bytes of the slot
        self.rows = (table.long().gather(1, pos.view(bs, -1)).view(bs, h, n) * h + head).view(bs * h, n)
        compact_rows = torch.arange(bs * h * n, device=DEVICE).view(bs * h, n)
        flat = {
            "new_kv": (k_new.view(bs * h, 1, d), v_new.view(bs * h, 1, d), None),
            "rope": (prologue["rope"][0], prologue["rope"][1].repeat_interleave(h)),
        }
        if "qk_norm" in prologue:
            flat["qk_norm"] = prologue["qk_norm"]
        q_rows = q.view(bs * h, shape.h_q // h, d)
        for name, rows in (("slots", self.rows), ("compact", compact_rows)):
            # the current position (each row's last) is the slot the launch stores the step's K/V into
            new_kv = (*flat["new_kv"][:2], rows[:, -1].clone())
            self.launches[name] = Launch.over_rows(q_rows, rows, {**flat, "new_kv": new_kv})

    def gather(self, layer: int, k_out: torch.Tensor, v_out: torch.Tensor) -> None:
        """Layer ``layer``'s attended K/V rows into the compact pools [bs x H x n, D], in the kernel's order."""
        d, index = self.shape.d, self.rows.flatten()
        torch.index_select(self.k[layer].view(-1, d), 0, index, out=k_out)
        torch.index_select(self.v[layer].view(-1, d), 0, index, out=v_out)

    def compact_pools(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        rows, d = self.rows.numel(), self.shape.d
        ks = [torch.empty(rows, d, device=DEVICE, dtype=torch.bfloat16) for _ in self.k]
        vs = [torch.empty_like(k) for k in ks]
        for i, (k, v) in enumerate(zip(ks, vs)):
            self.gather(i, k, v)
        return ks, vs


def outputs_agree(lay: Layouts) -> dict[str, float]:
    """Each variant's output on layer 0 against ``positions``' (max abs difference): the same bytes attended in the
    same order, so 0 up to the split of the work (none: one split each at these sizes)."""
    o = {}
    # positions first: its launch stores the step's K/V into the pool, which the compact copy then includes
    for name in ("positions", "slots"):
        launch = lay.launches[name]
        o[name] = launch.run(lay.k[0], lay.v[0], torch.empty_like(launch.q))
    d = lay.shape.d
    kc, vc = (torch.empty(lay.rows.numel(), d, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    lay.gather(0, kc, vc)
    o["compact"] = lay.launches["compact"].run(kc, vc, torch.empty_like(lay.launches["compact"].q))
    ref = o["positions"].float().view(-1)
    return {name: (out.float().view(-1) - ref).abs().max().item() for name, out in o.items() if name != "positions"}


def per_layer_us(launch: Launch, k: list[torch.Tensor], v: list[torch.Tensor], replays: int) -> float:
    """us a layer of ``launch`` over every layer's pool, the layers captured in one graph."""
    o = torch.empty_like(launch.q)
    return graph_ms(lambda: [launch.run(ki, vi, o) for ki, vi in zip(k, v)], replays) * 1e3 / len(k)


def timed(lay: Layouts, launch: Launch, k: list[torch.Tensor], v: list[torch.Tensor], replays: int) -> dict[str, float]:
    """One variant: ``per_layer_us``, its bandwidth, and one layer L2-flushed."""
    per_layer, o = per_layer_us(launch, k, v, replays), torch.empty_like(launch.q)
    flushed = bench_us(lambda: launch.run(k[0], v[0], o))
    return {"us_per_layer": per_layer, "GBps": lay.kv_bytes / per_layer / 1e3, "l2_flushed_us": flushed}


def measure(lay: Layouts, replays: int) -> dict[str, dict[str, float]]:
    """Each variant's ``timed`` and the compact copy's us a layer (every layer in one graph)."""
    ks, vs = lay.compact_pools()
    pools = {"positions": (lay.k, lay.v), "slots": (lay.k, lay.v), "compact": (ks, vs)}
    out = {name: timed(lay, lay.launches[name], *pools[name], replays) for name in VARIANTS}
    copy = graph_ms(lambda: [lay.gather(i, ks[i], vs[i]) for i in range(len(ks))], replays) * 1e3 / len(ks)
    out["compact_copy"] = {"us_per_layer": copy, "GBps": 2 * 2 * lay.rows.numel() * lay.shape.d * 2 / copy / 1e3}
    return out


# The compact layout's sweep: what a call costs against the tokens it attends, the batch, the launch.
SWEEP_LENGTHS = (16, 48, 112, 221, 445)  # tokens a (request, KV head): the tail alone .. a 10 % budget at 4K
SWEEP_BATCHES = (32, 64, 128)
SWEEP_TILES = [(bn, w, st) for bn in (16, 32, 64) for w in (2, 4, 8) for st in (2, 3, 4)]


def compact_launch(shape: Shape, bs: int, n: int, prologue: bool) -> Launch:
    """A launch over compact rows of ``n`` tokens for each of bs x H_kv (request, KV head) rows; with ``prologue``
    the draft steps' q/k norm, rotary and K/V store of the last one."""
    h, d = shape.h_kv, shape.d
    rows = torch.arange(bs * h * n, device=DEVICE).view(bs * h, n).to(torch.int32)
    pro: dict[str, Any] = {}
    if prologue:
        k_new, v_new = (torch.randn(bs * h, 1, d, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
        pro = draft_prologue(shape, k_new, v_new, rows, torch.full((bs * h,), n, dtype=torch.int64, device=DEVICE))
    q = torch.randn(bs * h, shape.h_q // h, d, device=DEVICE, dtype=torch.bfloat16)
    return Launch.over_rows(q, rows, pro)


def sweep(shape: Shape, layers: int, replays: int) -> list[dict[str, Any]]:
    """The compact layout over SWEEP_BATCHES x SWEEP_LENGTHS at the server's launch; at 64 x 221 also without the
    prologue, at two splits and over SWEEP_TILES (us a layer, every layer's own rows in one graph)."""
    points = [(bs, n, True, SERVED_TILES, None) for bs in SWEEP_BATCHES for n in SWEEP_LENGTHS]
    points += [(64, 221, False, SERVED_TILES, None), (64, 221, True, SERVED_TILES, 2)]
    points += [(64, 221, True, tiles, None) for tiles in SWEEP_TILES if tiles != SERVED_TILES]
    out = []
    for bs, n, prologue, tiles, splits in points:
        launch = compact_launch(shape, bs, n, prologue)
        launch.tiles, launch.splits = tiles, splits
        k = [torch.randn(bs * shape.h_kv * n, shape.d, device=DEVICE, dtype=torch.bfloat16) for _ in range(layers)]
        v = [torch.randn_like(t) for t in k]
        us = per_layer_us(launch, k, v, replays)
        kv_bytes = 2 * bs * shape.h_kv * n * shape.d * 2
        row = dict(bs=bs, n=n, prologue=prologue, tiles=tiles, splits=splits, us=us, GBps=kv_bytes / us / 1e3)
        print(row, flush=True)
        out.append(row)
        del k, v
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen3-1.7b", choices=[s.name for s in SHAPES])
    parser.add_argument("--bs", type=int, default=64)
    parser.add_argument("--len", type=int, default=4096)
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--replays", type=int, default=50)
    parser.add_argument("--sweep", action="store_true", help="also the compact layout's length/batch/launch sweep")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sparse_layout_probe needs a CUDA GPU")
    started = time.time()
    shape = next(s for s in SHAPES if s.name == args.shape)
    lay = Layouts(shape, args.bs, args.len, args.layers)
    doc = provenance("sparse_layout")
    doc["settings"] = {
        "shape": shape.name,
        "bs": args.bs,
        "len": args.len,
        "layers": args.layers,
        "replays": args.replays,
        "selected_positions": lay.selected,
        "tail": TAIL,
        "kv_bytes_per_layer": lay.kv_bytes,
        "ideal_us_per_layer": lay.kv_bytes / IDEAL_GBPS / 1e3,
    }
    doc["max_abs_diff_vs_positions"] = outputs_agree(lay)
    doc["results"] = measure(lay, args.replays)
    write_result(args.out, doc)
    if args.sweep:
        del lay
        torch.cuda.empty_cache()
        doc["sweep"] = sweep(shape, args.layers, args.replays)
    doc["seconds"] = round(time.time() - started, 1)
    write_result(args.out, doc)
    for name, r in doc["results"].items():
        print(f"{name}: " + ", ".join(f"{key} {value:.1f}" for key, value in r.items()), flush=True)
    print(f"max |diff| vs positions: {doc['max_abs_diff_vs_positions']}", flush=True)


if __name__ == "__main__":
    main()
