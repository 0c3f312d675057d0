"""A draft step's decoder layers (Qwen3-1.7B at 64 rows): whole, in parts, with L2 prefetch, with cuBLASLt (GPU only).

    python -m tools.layer_probe --out benchmarks/results/kernels/layer_probe_<device>_<commit>.json
    python -m tools.layer_probe --model smollm2-135m --bs 256 --out ...   # SmolLM2-135M's 30 layers at 256 rows

A draft step's weight GEMMs at M = 64 read each weight once: cuBLAS runs a layer's four of them at ~2.5 TB/s
(``draft_gemm``: 40 us a layer against ~23 us of bytes at 4.3 TB/s), while the sparse attention between the qkv
and the o GEMM is latency-bound at ~2.9 TB/s, so HBM bandwidth is spare while it runs. This probe asks whether
that spare bandwidth can pull the o GEMM's weights (and the next layer's qkv weights) into the 50 MB L2 on a side
stream, so those GEMMs read L2 instead of HBM, and whether cuBLASLt's kernels for these shapes beat cuBLAS's.

Each layer has its own weights and KV pool (64 x 4096 tokens, ~1 GB), so nothing but a prefetch leaves a layer's
bytes in L2 for the next one. The attention runs as the draft steps launch it, with q/k norm (Qwen3), rotary and
the step's K/V store in its prologue, so a layer is: fused add-RMSNorm, qkv GEMM, sparse attention, o GEMM, fused
add-RMSNorm, gate/up GEMM, SiLU-and-mul, down GEMM (sgl_kernel's norm and activation, as SGLang runs them; torch
versions where it does not import). Variants, each the 28 layers captured in one CUDA graph and timed as the
mean of ``--replays`` replays:
``layer`` that sequence; ``gemms``, ``attention`` and ``small`` its four GEMMs, its attention, its norms and
activation alone; ``prefetch`` the prefetch kernel alone over each layer's w_o and the next layer's w_qkv;
``layer_prefetch_o`` the layer with a side stream forked after the qkv GEMM that reads w_o (8 MB) with evict_last
loads while the attention runs, joined before the o GEMM; ``layer_prefetch_o_qkv`` the same reading the next
layer's w_qkv (16 MB) too, which must then outlive the o, gate/up and down GEMMs' 46 MB in L2;
``layer_cublaslt`` the layer captured with ``torch.backends.cuda.preferred_blas_library("cublaslt")``;
``layer_glu`` the layer as the draft steps serve it (gate/up and SiLU-and-mul in one launch, ``glu_gemm``);
``part_<name>`` one of those layers' GEMMs alone, every layer's (``PARTS``; ``o_addmm`` / ``down_addmm``: the
residual added in the GEMM, cuBLAS with beta 1 in place).

Reading the result: a prefetch helps if ``layer_prefetch_o`` (or ``_o_qkv``) is below ``layer`` by more than the
run-to-run noise (run the probe twice to see it); a ``prefetch`` longer than ``attention`` (per layer) means the
side stream still reads when the o GEMM starts; ``layer`` near ``gemms + attention + small`` says the parts run
back to back. cuBLASLt helps if ``layer_cublaslt`` is below ``layer`` by more than the noise.

Measured at e837f22 on an H200 (layer_probe_h200_e837f22.json, us a layer): layer 73.7 = gemms 43.0 + attention
23.7 + small 5.8, back to back; prefetch 46.7 at 32 programs (0.5 TB/s, longer than the attention), so
layer_prefetch_o 86.4 and layer_prefetch_o_qkv 104.0; layer_cublaslt 73.8. Neither route shortens the layer.
That probe (and layer_probe_h200_64d2031.json: attention 24.9) ran the attention without its prologue, which the
server's trace times at 27.2 us a call (trace_qwen3-1.7b_round_h200_e837f22).

Measured at 0ab19df and c71b4a4 on an H200 (layer_probe_h200_0ab19df.json, _repeat, layer_probe_parts_h200_c71b4a4.json,
us a layer): layer_glu 76.3-76.4 (layer 78.9); its GEMMs qkv 7.2, o 6.3, gate/up 16.0, down 12.0, and o_addmm 6.2,
down_addmm 12.1: a residual added inside cuBLAS's GEMM costs nothing. A layer with both add-RMSNorms folded into
its GEMMs (the residual adds as addmm_, the norms read inside Triton GEMMs' K loops: each program summing x's
squares and scaling its tile by the norm weight before the product; since removed) took 114.2-114.3 against 76.4:
the norm in the loop took qkv to 25.8 us and gate/up to 39.3, far more than the 5.8 us of norm launches it saved.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from sglang_sparsespec.kernels.glu_gemm import glu_gemm
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd

from tools.kernels_setup import (
    DEVICE,
    SHAPES,
    TAIL,
    Shape,
    draft_prologue,
    draft_selection,
    graph_ms,
    make_pool,
    provenance,
    write_result,
)
from tools.skinny_gemm import add_norm_scale

GEMMS = ("qkv", "o", "gate_up", "down")


@dataclass(frozen=True)
class Dims:
    """A decoder layer's sizes (the attention's head counts and layer count come from kernels_setup.SHAPES)."""

    hidden: int
    intermediate: int

    def projections(self, h_q: int, h_kv: int, d: int) -> dict[str, tuple[int, int]]:
        """(N, K) of each weight GEMM of the layer (SGLang's fused qkv and gate/up)."""
        return {
            "qkv": ((h_q + 2 * h_kv) * d, self.hidden),
            "o": (self.hidden, h_q * d),
            "gate_up": (2 * self.intermediate, self.hidden),
            "down": (self.hidden, self.intermediate),
        }


# The draft steps measured end to end: Qwen3-1.7B (the shape people serve) and SmolLM2-135M (the real-weights
# headline model, whose draft step is bound by its launches).
MODELS = {"qwen3-1.7b": Dims(2048, 6144), "smollm2-135m": Dims(576, 1536)}


def model_dims(model: str) -> tuple[Shape, dict[str, tuple[int, int]]]:
    """The model's attention shape (heads, head dim, layers) and the (N, K) of each of its layer GEMMs."""
    shape = next(s for s in SHAPES if s.name == model)
    return shape, MODELS[model].projections(shape.h_q, shape.h_kv, shape.d)


EPS = 1e-6
IDEAL_GBPS = 4300.0  # the bandwidth the ideal times assume (an H200's HBM: 4.8 TB/s peak)
PREFETCH_BLOCK = 16384  # elements a tile: at 8 warps, eight 16-byte loads in flight a thread before the sum
PREFETCH_WARPS = 8
# One GEMM of every layer (the ``part_<name>`` variants): as the served layer runs it, and o / down with the residual
# added in the GEMM (cuBLAS with beta 1, in place).
PARTS = ("qkv", "o", "o_addmm", "gate_up_glu", "down", "down_addmm")
# The bytes each variant reads from HBM at the ideal: the layers' GEMM weights, the attention's KV gathers, the
# prefetched weights (the prefetched variants still read them from HBM once, only earlier).
VARIANTS = {
    "layer": ("weights", "kv"),
    "gemms": ("weights",),
    "attention": ("kv",),
    "small": (),
    "prefetch": ("prefetched",),
    "layer_prefetch_o": ("weights", "kv"),
    "layer_prefetch_o_qkv": ("weights", "kv"),
    "layer_cublaslt": ("weights", "kv"),
    "layer_glu": ("weights", "kv"),
    **{f"part_{name}": () for name in PARTS},
}
PREFETCHES = {"layer_prefetch_o": "o", "layer_prefetch_o_qkv": "o_qkv"}


@triton.jit
def _prefetch_kernel(W, Sums, n, per_program, BLOCK: tl.constexpr):
    """Program p reads W[p * per_program : (p + 1) * per_program] (clipped to n) in BLOCK tiles and stores their
    fp32 sum to Sums[p], which keeps the loads from being eliminated."""
    pid = tl.program_id(0)
    lo = pid.to(tl.int64) * per_program
    hi = tl.minimum(lo + per_program, n)
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(lo, hi, BLOCK):
        idx = start + offs
        # evict_last: Triton attaches an L2 evict_last cache policy to the load (createpolicy.fractional on sm_90),
        # so the lines outlast the attention's gathers (normal priority) until the GEMM reads them
        acc += tl.load(W + idx, mask=idx < hi, other=0.0, eviction_policy="evict_last").to(tl.float32)
    tl.store(Sums + pid, tl.sum(acc, axis=0))


def prefetch_l2(w: torch.Tensor, sums: torch.Tensor, block: int = PREFETCH_BLOCK) -> torch.Tensor:
    """Read the contiguous ``w`` once with evict_last loads, pulling it into L2 ahead of the GEMM that reads it:
    ``sums.numel()`` programs each take a contiguous share (whole tiles of ``block``) and write its fp32 sum to
    ``sums``, which is returned."""
    if not w.is_contiguous() or not sums.is_contiguous() or sums.dtype != torch.float32:
        raise ValueError("w must be contiguous, sums a contiguous fp32 tensor")
    per = triton.cdiv(triton.cdiv(w.numel(), sums.numel()), block) * block
    _prefetch_kernel[(sums.numel(),)](w, sums, w.numel(), per, BLOCK=block, num_warps=PREFETCH_WARPS)
    return sums


def prefetch_ref(w: torch.Tensor, programs: int, block: int = PREFETCH_BLOCK) -> torch.Tensor:
    """Plain-torch ``prefetch_l2``'s sums: each program's share of ``w`` summed in fp32."""
    per = triton.cdiv(triton.cdiv(w.numel(), programs), block) * block
    flat = w.flatten().float()
    return torch.stack([flat[p * per : (p + 1) * per].sum() for p in range(programs)])


def add_rmsnorm_torch(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """``sgl_kernel.fused_add_rmsnorm`` in torch: residual += x, then x = RMSNorm(residual) * weight, in place."""
    residual.add_(x)
    x.copy_((residual.float() * add_norm_scale(residual, eps)).to(x.dtype) * weight)


def silu_and_mul_torch(gate_up: torch.Tensor, out: torch.Tensor) -> None:
    """``sgl_kernel.silu_and_mul`` in torch: out = silu(gate) * up of the [gate | up] halves."""
    half = gate_up.shape[-1] // 2
    torch.mul(F.silu(gate_up[:, :half]), gate_up[:, half:], out=out)


def small_kernels() -> tuple[Callable[..., Any], Callable[..., Any], str]:
    """(fused add-RMSNorm, SiLU-and-mul, which ran): sgl_kernel's, what SGLang runs, else the torch versions."""
    try:
        from sgl_kernel import fused_add_rmsnorm, silu_and_mul
    except Exception as exc:  # not installed, or built for another torch / GPU: the layer still runs
        return add_rmsnorm_torch, silu_and_mul_torch, f"torch ({exc!r:.200})"
    return fused_add_rmsnorm, silu_and_mul, "sgl_kernel"


@dataclass(frozen=True)
class Layer:
    """One decoder layer's own weights ([N, K], as nn.Linear holds them) and KV pool."""

    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    norm_in: torch.Tensor
    norm_post: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor


class DraftStep:
    """The draft step's decoder layers on random weights, KV pools and one draft selection, with preallocated
    activations: each variant's call runs its work over every layer and can be captured in one CUDA graph."""

    def __init__(
        self, model: str, bs: int, seq_len: int, programs: int, norm: Callable[..., Any], silu_mul: Callable[..., Any]
    ):
        self.shape, dims = model_dims(model)
        hidden, inter, h_q, d = MODELS[model].hidden, MODELS[model].intermediate, self.shape.h_q, self.shape.d
        self.layers: list[Layer] = []
        for _ in range(self.shape.num_layers):
            k, v, self.req_to_token = make_pool(self.shape, bs, seq_len)  # the same slot table every layer
            weights = {name: torch.randn(*dims[name], device=DEVICE, dtype=torch.bfloat16) * 0.02 for name in GEMMS}
            norm_in, norm_post = (torch.ones(hidden, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
            self.layers.append(Layer(**weights, norm_in=norm_in, norm_post=norm_post, k=k, v=v))
        selection = draft_selection(self.shape, bs, seq_len, self.layers[0].k.element_size())
        self.sel, self.sel_cnt, self.positions, kv_bytes = selection
        self.seq_lens = torch.full((bs,), seq_len, dtype=torch.int64, device=DEVICE)
        self.tail_start = self.seq_lens - TAIL  # once, outside the graphs: the round computes it once a step
        self.rpi = torch.arange(bs, device=DEVICE)

        def act(n: int) -> torch.Tensor:
            return torch.randn(bs, n, device=DEVICE, dtype=torch.bfloat16)

        self.x, self.residual, self.attn = act(hidden), act(hidden), act(h_q * d)
        self.qkv, self.gate_up, self.act = act(dims["qkv"][0]), act(2 * inter), act(inter)
        self.q_cols, self.q_shape = h_q * d, (bs, h_q, d)
        # The attention stores the step's key and value (the qkv GEMM's other columns) and normalizes and rotates
        # q and the key as the draft steps launch it.
        kv_cols = self.shape.h_kv * d
        k_new, v_new = (self.qkv[:, c : c + kv_cols].view(bs, self.shape.h_kv, d) for c in (h_q * d, h_q * d + kv_cols))
        self.prologue = draft_prologue(self.shape, k_new, v_new, self.req_to_token, self.seq_lens)
        self.o = self.attn.view(self.q_shape)
        self.sums = torch.zeros(2, programs, device=DEVICE)  # a row for each weight a layer prefetches
        self.side: torch.cuda.Stream | None = None  # the prefetch variants' side stream, made on first use
        self.norm, self.silu_mul = norm, silu_mul
        n_layers = len(self.layers)
        prefetched = sum(w.numel() * w.element_size() for i in range(n_layers) for w in self.prefetched(i, "o_qkv"))
        self.bytes = {
            "weights": sum(n * k * 2 for name, (n, k) in dims.items() if name in GEMMS),
            "kv": kv_bytes,
            "prefetched": prefetched / n_layers,
        }

    def prefetched(self, i: int, prefetch: str) -> list[torch.Tensor]:
        """The weights layer i's side stream reads during its attention: its w_o, and with "o_qkv" the next
        layer's w_qkv (the last layer has none)."""
        weights = [self.layers[i].o]
        if prefetch == "o_qkv" and i + 1 < len(self.layers):
            weights.append(self.layers[i + 1].qkv)
        return weights

    def attend(self, layer: Layer, q: torch.Tensor, pdl: bool = False) -> None:
        sparse_decode_fwd(
            q, layer.k, layer.v, self.o, self.req_to_token, self.rpi, self.sel, self.sel_cnt, self.tail_start,
            self.seq_lens, self.shape.d**-0.5, pdl=pdl, **self.prologue,
        )  # fmt: skip

    def layer(self, i: int, hidden: torch.Tensor, prefetch: str = "", glu: bool = False) -> torch.Tensor:
        """Layer i on ``hidden`` (normalized in place, as SGLang's layer does), its output returned; with
        ``prefetch`` a side stream reads ``prefetched(i, prefetch)`` while the attention runs; ``glu``: gate/up
        and the activation in one launch."""
        layer = self.layers[i]
        self.norm(hidden, self.residual, layer.norm_in, EPS)
        qkv = F.linear(hidden, layer.qkv)
        if prefetch:
            # forked after the qkv GEMM, so the reads compete with the latency-bound attention only
            main, self.side = torch.cuda.current_stream(), self.side or torch.cuda.Stream()
            self.side.wait_stream(main)
            with torch.cuda.stream(self.side):
                for row, w in enumerate(self.prefetched(i, prefetch)):
                    prefetch_l2(w, self.sums[row])
        # q as a strided view of qkv's first columns: the kernel takes q's row and head strides (only its last
        # dim must be contiguous), as SGLang hands it the split of the fused projection
        self.attend(layer, qkv[:, : self.q_cols].view(self.q_shape))
        if prefetch:
            main.wait_stream(self.side)
        hidden = F.linear(self.attn, layer.o)
        self.norm(hidden, self.residual, layer.norm_post, EPS)
        if glu:
            glu_gemm(hidden, layer.gate_up, out=self.act)
        else:
            self.silu_mul(F.linear(hidden, layer.gate_up), self.act)
        return F.linear(self.act, layer.down)

    def layers_output(self, prefetch: str = "", glu: bool = False) -> torch.Tensor:
        """Every layer on ``x`` (and the residual stream), the last layer's output returned."""
        hidden = self.x
        for i in range(len(self.layers)):
            hidden = self.layer(i, hidden, prefetch, glu)
        return hidden

    def gemms(self) -> None:
        for layer in self.layers:
            F.linear(self.x, layer.qkv)
            F.linear(self.attn, layer.o)
            F.linear(self.x, layer.gate_up)
            F.linear(self.act, layer.down)

    def part(self, name: str) -> None:
        """One GEMM of every layer (``PARTS``), on the step's activations."""
        gemm: Callable[[Layer], Any] = {
            "qkv": lambda w: F.linear(self.x, w.qkv),
            "o": lambda w: F.linear(self.attn, w.o),
            "o_addmm": lambda w: self.residual.addmm_(self.attn, w.o.t()),
            "gate_up_glu": lambda w: glu_gemm(self.x, w.gate_up, out=self.act),
            "down": lambda w: F.linear(self.act, w.down),
            "down_addmm": lambda w: self.residual.addmm_(self.act, w.down.t()),
        }[name]
        for layer in self.layers:
            gemm(layer)

    def attention(self) -> None:
        q = self.qkv[:, : self.q_cols].view(self.q_shape)
        for layer in self.layers:
            self.attend(layer, q)

    def small(self) -> None:
        for layer in self.layers:
            self.norm(self.x, self.residual, layer.norm_in, EPS)
            self.norm(self.x, self.residual, layer.norm_post, EPS)
            self.silu_mul(self.gate_up, self.act)

    def prefetch_only(self) -> None:
        for i in range(len(self.layers)):
            for row, w in enumerate(self.prefetched(i, "o_qkv")):
                prefetch_l2(w, self.sums[row])

    def call(self, name: str) -> Callable[[], None]:
        """The work of variant ``name`` over all layers."""
        parts = {"gemms": self.gemms, "attention": self.attention, "small": self.small, "prefetch": self.prefetch_only}
        parts |= {"layer_glu": lambda: self.layers_output(glu=True)}
        parts |= {f"part_{p}": lambda p=p: self.part(p) for p in PARTS}
        return parts.get(name, lambda: self.layers_output(PREFETCHES.get(name, "")))


def measure(step: DraftStep, name: str, replays: int) -> dict[str, Any]:
    """Variant ``name``'s time per layer and per step, and the bytes it reads at the ideal; an error as a string."""
    entry: dict[str, Any] = {}
    try:
        if name == "layer_cublaslt":
            before = torch.backends.cuda.preferred_blas_library()
            entry["blas"] = {"before": str(before)}
            try:
                entry["blas"]["set"] = str(torch.backends.cuda.preferred_blas_library("cublaslt"))
                ms = graph_ms(step.call(name), replays)  # the library is chosen as the GEMMs are captured
            finally:
                entry["blas"]["restored"] = str(torch.backends.cuda.preferred_blas_library(before))
        else:
            ms = graph_ms(step.call(name), replays)
    except Exception as exc:  # one variant failing (capture, library, kernel) leaves the others to run
        return {**entry, "error": repr(exc)[:400]}
    us = ms * 1e3 / len(step.layers)
    entry.update(us_per_layer=us, ms_per_step=ms)
    per_layer = sum(step.bytes[kind] for kind in VARIANTS[name])
    if per_layer:  # "small" reads only activations: latency-bound, no meaningful bandwidth
        entry.update(
            bytes_per_step=per_layer * len(step.layers),
            bytes_per_layer={kind: step.bytes[kind] for kind in VARIANTS[name]},
            GBps=per_layer / us / 1e3,
            ideal_us_per_layer=per_layer / IDEAL_GBPS / 1e3,
        )
    return entry


def prefetch_check(step: DraftStep, programs: int) -> float | str:
    """The prefetch kernel's sums over layer 0's w_o against ``prefetch_ref`` (largest error relative to the
    largest sum): it must read what it is meant to read. An error as a string, the variants still run."""
    try:
        got = prefetch_l2(step.layers[0].o, torch.zeros(programs, device=DEVICE))
    except Exception as exc:  # a kernel that does not compile fails the prefetch variants, not the probe
        return repr(exc)[:400]
    ref = prefetch_ref(step.layers[0].o, programs)
    return ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-6)).item()


def add_step_args(parser: argparse.ArgumentParser) -> None:
    """The options of a probe that builds draft-step layers: output file, model, rows, context, replays."""
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="qwen3-1.7b", choices=list(MODELS))
    parser.add_argument("--bs", type=int, default=64)
    parser.add_argument("--len", type=int, default=4096, help="context of the draft step's attention")
    parser.add_argument("--replays", type=int, default=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_step_args(parser)
    parser.add_argument("--prefetch-programs", type=int, default=32)
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated, of: " + ", ".join(VARIANTS))
    args = parser.parse_args()
    names = [n for n in args.variants.split(",") if n]
    if unknown := [n for n in names if n not in VARIANTS]:
        parser.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    if not torch.cuda.is_available():
        raise SystemExit("layer_probe needs a CUDA GPU")
    started = time.time()
    norm, silu_mul, small_ops = small_kernels()
    step = DraftStep(args.model, args.bs, args.len, args.prefetch_programs, norm, silu_mul)
    settings = {
        "model": args.model,
        "bs": args.bs,
        "len": args.len,
        "layers": len(step.layers),
        "hidden": MODELS[args.model].hidden,
        "q_heads": step.shape.h_q,
        "kv_heads": step.shape.h_kv,
        "head_dim": step.shape.d,
        "intermediate": MODELS[args.model].intermediate,
        "selected_positions": step.positions,
        "tail": TAIL,
        "replays": args.replays,
        "prefetch_programs": args.prefetch_programs,
        "prefetch_block": PREFETCH_BLOCK,
        "prefetch_warps": PREFETCH_WARPS,
        "prefetch_rel_err": prefetch_check(step, args.prefetch_programs),
        "small_ops": small_ops,
        "bytes_per_layer": step.bytes,
        "ideal_GBps": IDEAL_GBPS,
        "gemm_ideal_us_per_layer": step.bytes["weights"] / IDEAL_GBPS / 1e3,
        "timing": "the layers captured in one CUDA graph after an eager call on a side stream, mean of the replays",
    }
    results = {}
    for name in names:
        r = results[name] = measure(step, name, args.replays)
        timed = "error" not in r
        line = f"{r['us_per_layer']:.1f} us/layer, {r['ms_per_step']:.3f} ms/step" if timed else f"error {r['error']}"
        print(f"{name}: {line}", flush=True)
    settings["wall_s"] = time.time() - started
    write_result(args.out, {**provenance("layer_probe"), "settings": settings, "variants": results})


if __name__ == "__main__":
    main()
