"""A draft step's weight GEMMs as the dependent chain they form (Qwen3-1.7B at 64 rows): cuBLAS against the Triton
skinny GEMM, plain and with programmatic dependent launch and L2 prefetch (GPU only).

    python -m tools.gemm_chain --out benchmarks/results/kernels/gemm_chain_<device>_<commit>.json
    python -m tools.gemm_chain --model smollm2-135m --bs 256 --out ...   # SmolLM2-135M's 30 layers at 256 rows

The layer probe (``layer_probe_h200_e837f22.json``) has a draft step's layer at 73.7 us, 43.0 of them its four
GEMMs, which read 100 MB a layer: 23.4 us at 4.3 TB/s. At 64 rows each GEMM is one short launch whose ramp (the
launch, the first weight bytes in flight) and tail leave HBM idle, and the next GEMM cannot start before the
previous one ends, though only its x depends on it: its weights never do. A programmatic dependent launch (sm_90)
lets each GEMM start while the previous one runs, ask L2 for its weight slice, and wait for x only before its K
loop (``tools/skinny_gemm.py``). This probe times the layers' chain, x -> qkv -> o -> gate/up -> down -> the
next layer's x, each GEMM reading the previous one's output (o reads qkv's first columns, down gate/up's first
half, standing in for the attention and the activation between them), in one CUDA graph:

- ``cublas``: ``F.linear``, what the draft steps run;
- ``triton``: the skinny GEMM at the launch ``draft_gemm`` found fastest per projection at 64 rows;
- ``triton_pdl``: the same as programmatic dependent launches;
- ``triton_pdl_prefetch``: and each program's weight slice prefetched into L2 before its wait.

Two more variants run whole draft-step layers (``layer_probe.DraftStep``: own weights and KV pools, the real sparse
attention): ``layer``, the layer probe's SGLang sequence (add-RMSNorm, qkv, attention, o, add-RMSNorm, gate/up,
SiLU-and-mul, down: cuBLAS and sgl_kernel), and ``layer_fused_pdl``, five launches a layer: qkv with the
add-RMSNorm as its prologue, the attention, o, gate/up with the second add-RMSNorm, down with SiLU-and-mul, every
launch a programmatic dependent one and every GEMM's weights prefetched (the norms' row scale is applied after the
product, so the layer's output differs from ``layer``'s by rounding: ``rel_diff_vs_layer``).

Two more run the chain's weights without its waits (``Streams``, cuBLAS): ``cublas_merged``, per layer qkv, o and
gate/up as one GEMM (they share K) and down as another, and ``cublas_flat``, every layer's in two GEMMs. Written
before measuring: the LM head's single 622 MB GEMM streams at 4.1 TB/s at 64 rows where the chain's 100 MB a layer
go at 2.5, so a merged layer near 25 us (against the chain's 40) says ~15 us a layer are launches waiting on each
other, the share a persistent layer kernel (the next GEMM's weights streamed while the previous one ends) could
recover, ~3.4 ms a round; a merged layer near the chain's says the loss is inside each GEMM at 64 rows, and such a
kernel would not pay.

Each chain variant's final x is compared with the ``triton`` chain's (``max_abs_diff``: 0 for the PDL variants, since
they run the same arithmetic; anything else means a launch read an input before it was written) and with
``cublas``'s (rounding only). Reading: a PDL variant well below ``triton`` (and ``cublas``) per layer says the
draft forward's GEMMs can close part of their 20 us a layer by overlapping launches, which the draft steps would
then need in their own GEMMs (and, for the overlap to reach across them, in the norm, attention and activation
kernels between the GEMMs). SmolLM2-135M's layers are small (3.3 MB of weights): at 256 rows its draft step of
~250 launches is bound by them (1.1 ms a step whatever the batch in throughput_h200-e837f22-7000_pillar.json), so
there the layer variants say what five overlapped launches a layer would leave of that floor.

Measured at 64d2031 on an H200 (gemm_chain_h200_64d2031.json, gemm_chain_smollm2_h200_64d2031.json, us a layer):
Qwen3-1.7B cuBLAS 40.3, Triton 42.2, PDL 38.6, PDL + prefetch 44.4, SGLang's layer 74.0, the five-launch layer not
launched (gate/up's 128 x 128 tiles with the add-norm prologue ask 263,680 B of shared memory); SmolLM2-135M cuBLAS
18.0, Triton 22.1, PDL 26.5, PDL + prefetch 28.8, layer 48.6, five launches 109.6 (every GEMM program redoes its
rows' norm or activation over the whole K). The draft GEMMs stay cuBLAS.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

from tools.kernels_setup import DEVICE, graph_ms, provenance, write_result
from tools.layer_probe import EPS, IDEAL_GBPS, DraftStep, add_step_args, model_dims, small_kernels
from tools.skinny_gemm import skinny_gemm

CHAIN = ("qkv", "o", "gate_up", "down")
# (block_n, block_k, split_k, warps, stages) per model and projection. Qwen3-1.7B: the fastest Triton launch at
# M = 64 in draft_gemm_h200_e8410c8.json. SmolLM2-135M (K = 576 = 9 x 64, untuned): 64-wide K tiles, programs
# of 32-64 channels, four 64-row blocks at 256 rows.
LAUNCHES = {
    "qwen3-1.7b": {
        "qkv": (32, 256, 1, 4, 4),
        "o": (16, 256, 1, 4, 4),
        "gate_up": (128, 128, 1, 4, 4),
        "down": (32, 256, 2, 4, 4),
    },
    "smollm2-135m": {
        "qkv": (32, 64, 1, 4, 3),
        "o": (32, 64, 1, 4, 3),
        "gate_up": (64, 64, 1, 4, 3),
        "down": (32, 128, 1, 4, 3),
    },
}
VARIANTS = ("cublas", "triton", "triton_pdl", "triton_pdl_prefetch")
# The same weights without the chain's waits (``Streams``): what a persistent layer kernel, which streams the next
# GEMM's weights while the previous one ends, could approach at these rows.
STREAM_VARIANTS = ("cublas_merged", "cublas_flat")
WIDE = ("qkv", "o", "gate_up")  # the projections that read the hidden width: one GEMM in the stream variants
LAYER_VARIANTS = ("layer", "layer_fused_pdl")


class Chain:
    """The model's layers' weights ([N, K], entries of std 1/sqrt(K), so x keeps its scale down the chain) and the
    chain's preallocated activations."""

    def __init__(self, model: str, bs: int):
        shape, dims = model_dims(model)
        self.launches = LAUNCHES[model]

        def weight(name: str) -> torch.Tensor:
            n, k = dims[name]
            return torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) / k**0.5

        self.weights = [{name: weight(name) for name in CHAIN} for _ in range(shape.num_layers)]
        self.x0 = torch.randn(bs, dims["qkv"][1], device=DEVICE, dtype=torch.bfloat16)
        self.x = torch.empty_like(self.x0)
        self.out = {name: torch.empty(bs, dims[name][0], device=DEVICE, dtype=torch.bfloat16) for name in CHAIN}
        self.part = torch.empty(self.launches["down"][2], bs, dims["down"][0], device=DEVICE)
        self.bytes_per_layer = sum(n * k * 2 for name, (n, k) in dims.items() if name in CHAIN)

    def inputs(self, name: str) -> torch.Tensor:
        """What GEMM ``name`` reads: x, or the first K columns of the previous GEMM's output."""
        if name == "qkv":
            return self.x
        previous = self.out[CHAIN[CHAIN.index(name) - 1]]
        return previous[:, : self.weights[0][name].shape[1]]

    def run(self, variant: str) -> None:
        self.x.copy_(self.x0)
        for layer in self.weights:
            for name in CHAIN:
                out = self.x if name == "down" else self.out[name]
                if variant == "cublas":
                    torch.matmul(self.inputs(name), layer[name].T, out=out)
                    continue
                block_n, block_k, split_k, warps, stages = self.launches[name]
                skinny_gemm(
                    self.inputs(name), layer[name], out, self.part if split_k > 1 else None, block_n=block_n,
                    block_k=block_k, split_k=split_k, warps=warps, stages=stages, pdl=variant != "triton",
                    prefetch=variant == "triton_pdl_prefetch",
                )  # fmt: skip

    def call(self, variant: str) -> Callable[[], None]:
        return lambda: self.run(variant)


class Streams:
    """A chain's weights streamed without its dependencies, by cuBLAS at the chain's rows: ``cublas_merged``, per
    layer one GEMM over qkv, o and gate/up concatenated (they share K, the hidden width) and one for down;
    ``cublas_flat``, all layers' in two GEMMs. Neither computes the chain (every GEMM reads fixed inputs): their
    times are what the bytes cost when no launch waits for the one before, per layer against the chain's."""

    def __init__(self, chain: Chain):
        self.wide = [torch.cat([layer[name] for name in WIDE]) for layer in chain.weights]
        self.down = [layer["down"] for layer in chain.weights]
        self.flat_wide, self.flat_down = torch.cat(self.wide), torch.cat(self.down)
        rows = chain.x0.shape[0]
        self.x = chain.x0
        self.h = torch.randn(rows, self.down[0].shape[1], device=self.x.device, dtype=self.x.dtype)
        weights = {"wide": self.wide[0], "down": self.down[0], "flat_wide": self.flat_wide, "flat_down": self.flat_down}
        self.out = {name: self.x.new_empty(rows, w.shape[0]) for name, w in weights.items()}
        self.layers = len(chain.weights)
        self.bytes_per_layer = chain.bytes_per_layer

    def run(self, variant: str) -> None:
        if variant == "cublas_flat":
            torch.matmul(self.x, self.flat_wide.T, out=self.out["flat_wide"])
            torch.matmul(self.h, self.flat_down.T, out=self.out["flat_down"])
            return
        for wide, down in zip(self.wide, self.down):
            torch.matmul(self.x, wide.T, out=self.out["wide"])
            torch.matmul(self.h, down.T, out=self.out["down"])

    def call(self, variant: str) -> Callable[[], None]:
        return lambda: self.run(variant)


TIMING = "the chain captured in one CUDA graph after an eager call on a side stream, mean of the replays"


def probe_args(doc: str, tool: str, options: Callable[[argparse.ArgumentParser], None] | None = None) -> Any:
    """A chain probe's command line (``add_step_args`` and the probe's ``options``), on a CUDA GPU only."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    add_step_args(parser)
    if options is not None:
        options(parser)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(f"{tool} needs a CUDA GPU")
    return args


def cublas_baseline(chain: Chain, replays: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """The cuBLAS chain's final x (what a probe's output is compared with) and its time."""
    chain.run("cublas")
    reference = chain.x.clone()
    entry = timed(chain.call("cublas"), len(chain.weights), chain.bytes_per_layer, replays)
    print(f"cublas_chain: {entry.get('us_per_layer', 0):.1f} us/layer", flush=True)
    return reference, entry


def timed_against(
    key: str, call: Callable[[], torch.Tensor], reference: torch.Tensor, chain: Chain, replays: int
) -> dict[str, Any]:
    """A probe's variant timed over the chain's layers (``timed``), its output (``call()``'s return, one more eager
    run) against the cuBLAS chain's final x, and the line it printed; an error as a string."""
    entry = timed(call, len(chain.weights), chain.bytes_per_layer, replays)
    if "error" in entry:
        print(f"{key}: {entry['error']}", flush=True)
        return entry
    entry["max_abs_diff_vs_cublas"] = (call().float() - reference.float()).abs().max().item()
    print(f"{key}: {entry['us_per_layer']:.1f} us/layer, diff vs cublas {entry['max_abs_diff_vs_cublas']:.3g}",
          flush=True)  # fmt: skip
    return entry


def probe_settings(args: argparse.Namespace, chain: Chain, started: float, **extra: Any) -> dict[str, Any]:
    """A chain probe's settings: the model, rows, layers, the probe's own ``extra``, bytes, timing, wall time."""
    return {
        "model": args.model, "bs": args.bs, "layers": len(chain.weights), **extra,
        "bytes_per_layer": chain.bytes_per_layer, "replays": args.replays, "timing": TIMING,
        "wall_s": time.time() - started,
    }  # fmt: skip


def timed(call: Callable[[], None], layers: int, bytes_per_layer: int, replays: int) -> dict[str, Any]:
    """A step's graph time per layer and per step, and its weights' bandwidth against the ideal; an error as a
    string."""
    try:
        ms = graph_ms(call, replays)
    except Exception as exc:  # one variant failing (capture, launch attribute, kernel) leaves the others to run
        return {"error": repr(exc)[:400]}
    us = ms * 1e3 / layers
    return {
        "us_per_layer": us,
        "ms_per_step": ms,
        "GBps": bytes_per_layer / us / 1e3,
        "ideal_us_per_layer": bytes_per_layer / IDEAL_GBPS / 1e3,
    }


class FusedLayers:
    """The layer probe's draft step run as five launches a layer (module docstring), on its weights and pools; the
    residual stream alternates between two buffers, since a prologue's programs read one while one column of them
    writes the other."""

    def __init__(self, step: DraftStep, launches: dict[str, tuple[int, int, int, int, int]], overlap: bool = True):
        self.step, self.launches, self.overlap = step, launches, overlap  # overlap off: no PDL, no prefetch
        self.residuals = (step.residual, torch.empty_like(step.residual))
        self.hidden = torch.empty_like(step.x)
        self.o_out = torch.empty_like(step.x)
        self.part = torch.empty(launches["down"][2], *step.x.shape, device=DEVICE)

    def gemm(self, name: str, x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, **prologue: Any) -> None:
        block_n, block_k, split_k, warps, stages = self.launches[name]
        skinny_gemm(
            x, w, out, self.part if split_k > 1 else None, block_n=block_n, block_k=block_k, split_k=split_k,
            warps=warps, stages=stages, pdl=self.overlap, prefetch=self.overlap, **prologue,
        )  # fmt: skip

    def run(self) -> torch.Tensor:
        step, (res_a, res_b) = self.step, self.residuals
        hidden = step.x
        for layer in step.layers:
            self.gemm("qkv", hidden, layer.qkv, step.qkv, add_norm=(res_a, res_b, layer.norm_in, EPS))
            step.attend(layer, step.qkv[:, : step.q_cols].view(step.q_shape), pdl=self.overlap)
            self.gemm("o", step.attn, layer.o, self.o_out)
            self.gemm("gate_up", self.o_out, layer.gate_up, step.gate_up, add_norm=(res_b, res_a, layer.norm_post, EPS))
            self.gemm("down", step.gate_up, layer.down, self.hidden, silu_mul=True)
            hidden = self.hidden
        return hidden


def layer_variants(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """``layer`` and ``layer_fused_pdl`` on one DraftStep: their times, and the fused output against the layer's
    (both from the same x and residual); and which norm and activation kernels the layer ran."""
    norm, silu_mul, small_ops = small_kernels()
    step = DraftStep(args.model, args.bs, args.len, 1, norm, silu_mul)
    fused = FusedLayers(step, LAUNCHES[args.model])
    x0, residual0 = step.x.clone(), step.residual.clone()
    results: dict[str, Any] = {}
    outputs = {}
    for variant, call in (("layer", step.layers_output), ("layer_fused_pdl", fused.run)):
        outputs[variant] = None
        try:
            ms = graph_ms(call, args.replays)
            step.x.copy_(x0)
            step.residual.copy_(residual0)
            outputs[variant] = call()
        except Exception as exc:  # the fused variant failing leaves the layer's time standing
            results[variant] = {"error": repr(exc)[:400]}
            continue
        us = ms * 1e3 / len(step.layers)
        results[variant] = {"us_per_layer": us, "ms_per_step": ms}
    if outputs["layer"] is not None and outputs["layer_fused_pdl"] is not None:
        ref = outputs["layer"].float()
        diff = (outputs["layer_fused_pdl"].float() - ref).norm() / ref.norm().clamp_min(1e-12)
        results["layer_fused_pdl"]["rel_diff_vs_layer"] = diff.item()
    return results, small_ops


def measure(chain: Chain, variant: str, replays: int, reference: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Variant's time per layer and per step, its final x against the references; an error as a string."""
    entry = timed(chain.call(variant), len(chain.weights), chain.bytes_per_layer, replays)
    if "error" not in entry:
        for ref_name, ref in reference.items():
            entry[f"max_abs_diff_vs_{ref_name}"] = (chain.x.float() - ref.float()).abs().max().item()
    return entry


def main() -> None:
    args = probe_args(__doc__, "gemm_chain")
    started = time.time()
    chain = Chain(args.model, args.bs)
    bytes_per_layer = chain.bytes_per_layer
    reference = {}
    for name in ("triton", "cublas"):  # eager, without PDL: what the timed variants' final x is compared with
        chain.run(name)
        reference[name] = chain.x.clone()
    results = {}
    for variant in VARIANTS:
        r = results[variant] = measure(chain, variant, args.replays, reference)
        line = (
            f"{r['us_per_layer']:.1f} us/layer, {r['ms_per_step']:.3f} ms/step, "
            f"diff vs triton {r['max_abs_diff_vs_triton']:.3g}"
            if "error" not in r
            else f"error {r['error']}"
        )
        print(f"{variant}: {line}", flush=True)
    streams = Streams(chain)
    for variant in STREAM_VARIANTS:
        r = results[variant] = timed(streams.call(variant), streams.layers, streams.bytes_per_layer, args.replays)
        line = f"{r['us_per_layer']:.1f} us/layer, {r['GBps']:.0f} GB/s" if "error" not in r else r["error"]
        print(f"{variant}: {line}", flush=True)
    del chain, streams  # their weights, before the layer variants' pools (~33 GB)
    torch.cuda.empty_cache()
    layers, small_ops = layer_variants(args)
    for variant in LAYER_VARIANTS:
        r = layers[variant]
        line = f"{r['us_per_layer']:.1f} us/layer, {r['ms_per_step']:.3f} ms/step" if "error" not in r else r["error"]
        print(f"{variant}: {line}" + (f", rel diff {r['rel_diff_vs_layer']:.3g}" if "rel_diff_vs_layer" in r else ""))
    results.update(layers)
    settings = {
        "model": args.model,
        "bs": args.bs,
        "layers": model_dims(args.model)[0].num_layers,
        "len": args.len,
        "launches": LAUNCHES[args.model],
        "bytes_per_layer": bytes_per_layer,
        "small_ops": small_ops,
        "replays": args.replays,
        "timing": TIMING,
        "wall_s": time.time() - started,
    }
    write_result(args.out, {**provenance("gemm_chain"), "settings": settings, "variants": results})


if __name__ == "__main__":
    main()
