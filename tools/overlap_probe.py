"""Whether a verify forward's attention and its weight GEMMs overlap when two halves of the batch take turns.

    python -m tools.overlap_probe --out benchmarks/results/kernels/overlap_h200.json

A sampled verify of B requests x (k + 1) rows spends most of its time in two kinds of work that bound on
different units: the attention streams every request's KV (memory-bound: ~7.7 of 12.9 ms a verify at Qwen3-1.7B
64 x 4096 on an H200) and the weight GEMMs of its B (k + 1) rows run at the tensor cores' rate (~3.2 ms). Split
into two halves of the batch on two streams, one half's GEMMs could run while the other half's attention streams
KV, and the layer would cost about max(attention, GEMMs) instead of their sum. This probe times L layers of that
work (Qwen3 shapes, random bf16 weights, one KV pool all layers read; each variant one CUDA graph, replayed back
to back) in these schedules:

- ``attention``: the verify attention alone, whole batch;
- ``gemms``: the layer's row work alone: RMSNorm, qkv, o and residual, RMSNorm, gate/up, SiLU * up, down;
- ``serial``: the layer in order, whole batch, one stream (a verify forward's schedule);
- ``halves``: the two halves' layers one after another on one stream (what splitting alone costs);
- ``concurrent``: each half on its own stream, nothing ordering one against the other;
- ``ping_pong``: each half on its own stream, each half's attention waiting for the other half's last one, so
  the attentions take turns and each half's GEMMs run beside the other's attention.

The halves' outputs must equal bit for bit in every halves schedule (the same launches on the same inputs); the
JSON records it. Random weights: times only.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from sglang_sparsespec.kernels.verify_attention import verify_attention_fwd

from benchmarks.qwen3_shapes import SHAPES
from tools.kernels_setup import DEVICE, VERIFY_ROWS, graph_ms, provenance, write_result

SCHEDULES = ("attention", "gemms", "serial", "halves", "concurrent", "ping_pong")


class Layers:
    """L decoder layers of a Qwen3 shape (random weights), and the verify's KV pool every layer attends to:
    ``batch`` requests of ``context`` cached tokens each."""

    def __init__(self, cfg: dict[str, Any], layers: int, batch: int, context: int, device: str = DEVICE) -> None:
        self.h, i, self.d = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
        self.h_q, self.h_kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        kw = {"device": device, "dtype": torch.bfloat16}

        def weight(rows: int, cols: int) -> torch.Tensor:
            return torch.randn(rows, cols, **kw) * cols**-0.5

        qkv_rows = (self.h_q + 2 * self.h_kv) * self.d
        self.weights = [
            (weight(qkv_rows, self.h), weight(self.h, self.h_q * self.d), weight(2 * i, self.h), weight(self.h, i))
            for _ in range(layers)
        ]
        self.k_pool = torch.randn(batch * context + 1, self.h_kv, self.d, **kw)
        self.v_pool = torch.randn_like(self.k_pool)
        self.x0 = torch.randn(batch * VERIFY_ROWS, self.h, **kw)  # every request's rows entering the first layer
        self.batch, self.context, self.device = batch, context, device

    def half(self, first: int, count: int) -> Half:
        """Requests first .. first + count - 1 as one forward's inputs."""
        return Half(self, first, count)


class Half:
    """One forward's rows (``count`` requests x VERIFY_ROWS) through the layers: its residual stream and its own
    attention index (the requests' contiguous slot ranges in the shared pool)."""

    def __init__(self, layers: Layers, first: int, count: int) -> None:
        self.layers, self.rows = layers, count * VERIFY_ROWS
        device = layers.device
        i32 = {"device": device, "dtype": torch.int32}
        self.qo_indptr = torch.arange(count + 1, **i32) * VERIFY_ROWS
        self.kv_indptr = torch.arange(count + 1, **i32) * layers.context
        self.kv_indices = 1 + first * layers.context + torch.arange(count * layers.context, device=device)
        self.x0 = layers.x0[first * VERIFY_ROWS : first * VERIFY_ROWS + self.rows]
        self.out = torch.empty_like(self.x0)
        self.x = self.x0
        self.q_k_v: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.attn = torch.zeros(self.rows, layers.h_q, layers.d, device=device, dtype=torch.bfloat16)

    def pre(self, layer: int) -> None:
        """RMSNorm and the qkv projection of ``layer``: q, k, v as the attention reads them."""
        lay, w = self.layers, self.layers.weights[layer][0]
        qkv = F.linear(F.rms_norm(self.x, (lay.h,)), w)
        q_cols, kv_cols = lay.h_q * lay.d, lay.h_kv * lay.d
        self.q_k_v = (
            qkv[:, :q_cols].view(self.rows, lay.h_q, lay.d),
            qkv[:, q_cols : q_cols + kv_cols].view(self.rows, lay.h_kv, lay.d),
            qkv[:, q_cols + kv_cols :].view(self.rows, lay.h_kv, lay.d),
        )

    def attend(self) -> None:
        lay = self.layers
        q, k, v = self.q_k_v
        verify_attention_fwd(
            q, k, v, self.attn, lay.k_pool, lay.v_pool, self.qo_indptr, self.kv_indptr, self.kv_indices,
            VERIFY_ROWS, lay.d**-0.5,
        )  # fmt: skip

    def post(self, layer: int) -> None:
        """The o projection and residual, RMSNorm, gate/up, SiLU * up, down and residual of ``layer``."""
        lay = self.layers
        _, w_o, w_gu, w_down = lay.weights[layer]
        x = self.x + F.linear(self.attn.view(self.rows, -1), w_o)
        gate, up = F.linear(F.rms_norm(x, (lay.h,)), w_gu).chunk(2, dim=-1)
        self.x = x + F.linear(F.silu(gate) * up, w_down)

    def start(self) -> None:
        self.x = self.x0

    def finish(self) -> None:
        self.out.copy_(self.x)


Stream = torch.cuda.Stream | None
Event = torch.cuda.Event | None


@contextmanager
def on(stream: Stream) -> Iterator[None]:
    """Work issued inside runs on ``stream`` (None: the current stream, e.g. on a CPU)."""
    with torch.cuda.stream(stream) if stream is not None else nullcontext():
        yield


def run_layers(half: Half, num_layers: int, attention: bool = True, gemms: bool = True) -> None:
    half.start()
    for layer in range(num_layers):
        if gemms:  # without them the attention reads the q, k, v the half holds (``schedules``: layer 0's)
            half.pre(layer)
        if attention:
            half.attend()
        if gemms:
            half.post(layer)
    half.finish()


def _up_to_attention(half: Half, layer: int, stream: Stream, after: Event, event: Callable[[], Event]) -> Event:
    """``half``'s layer through its attention on ``stream``, the attention queued behind ``after`` (None: no wait);
    returns an event recorded as the attention ends (None on a CPU)."""
    with on(stream):
        half.pre(layer)
        if after is not None:
            stream.wait_event(after)
        half.attend()
        done = event()
        if done is not None:
            done.record(stream)
    return done


def two_streams(
    a: Half, b: Half, num_layers: int, side: Stream, turns: bool, event: Callable[[], Event] = lambda: None
) -> None:
    """Half a on the current stream and half b on ``side``, each layer's parts in order. With ``turns``, half b's
    attention of a layer waits for half a's and half a's for half b's of the layer before (events; on a CPU, where
    every stream is the current one, program order already puts them so)."""
    main = torch.cuda.current_stream() if side is not None else None
    if side is not None:
        side.wait_stream(main)
    a.start()
    b.start()
    b_done: Event = None
    for layer in range(num_layers):
        a_done = _up_to_attention(a, layer, main, b_done if turns else None, event)
        b_done = _up_to_attention(b, layer, side, a_done if turns else None, event)
        with on(main):
            a.post(layer)
        with on(side):
            b.post(layer)
    with on(main):
        a.finish()
    with on(side):  # b's last layer is the side stream's work: its copy must queue behind it there
        b.finish()
    if side is not None:
        main.wait_stream(side)


def schedules(layers: Layers, num_layers: int, side: Stream) -> dict[str, Callable[[], None]]:
    """Each schedule as a call that issues its work (the whole batch, and its two halves)."""
    whole = layers.half(0, layers.batch)
    n = layers.batch // 2
    a, b = layers.half(0, n), layers.half(n, layers.batch - n)
    whole.pre(0)  # the attention-only schedule reads layer 0's q, k, v throughout
    event = (lambda: torch.cuda.Event()) if side is not None else (lambda: None)
    return {
        "attention": lambda: run_layers(whole, num_layers, gemms=False),
        "gemms": lambda: run_layers(whole, num_layers, attention=False),
        "serial": lambda: run_layers(whole, num_layers),
        "halves": lambda: (run_layers(a, num_layers), run_layers(b, num_layers)),
        "concurrent": lambda: two_streams(a, b, num_layers, side, turns=False, event=event),
        "ping_pong": lambda: two_streams(a, b, num_layers, side, turns=True, event=event),
        "_outputs": lambda: (a.out.clone(), b.out.clone()),
    }


def measure(shape: str, batch: int, context: int, num_layers: int, replays: int) -> dict[str, Any]:
    layers = Layers(SHAPES[shape], num_layers, batch, context)
    side = torch.cuda.Stream()
    runs = schedules(layers, num_layers, side)
    outputs = runs.pop("_outputs")
    row: dict[str, Any] = {"shape": shape, "batch": batch, "context": context, "layers": num_layers}
    for name in SCHEDULES:
        row[f"{name}_ms"] = graph_ms(runs[name], replays) / num_layers
        if name == "halves":
            reference = outputs()
        elif name in ("concurrent", "ping_pong"):  # the halves' outputs, whatever the streams
            row[f"{name}_equal"] = all(torch.equal(x, y) for x, y in zip(reference, outputs()))
    row["bound_ms"] = max(row["attention_ms"], row["gemms_ms"])
    row["ping_pong_saving_ms"] = row["serial_ms"] - row["ping_pong_ms"]
    print({k: round(v, 4) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", default="qwen3-1.7b,qwen3-8b")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--context", type=int, default=4096)
    p.add_argument("--layers", type=int, default=8, help="distinct layers' weights in one graph (ms are per layer)")
    p.add_argument("--replays", type=int, default=20)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    rows = [measure(s, args.batch, args.context, args.layers, args.replays) for s in args.shapes.split(",")]
    doc = {**provenance("overlap_probe"), "timing": "CUDA graph replays back to back, ms a layer", "rows": rows}
    write_result(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
