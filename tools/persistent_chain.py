"""A draft step's weight GEMMs in one persistent launch with grid-wide barriers (Qwen3-1.7B at 64 rows, GPU).

``tools.gemm_chain`` times the four GEMMs of each layer (x -> qkv -> o -> gate/up -> down -> the next layer's x,
each reading the previous one's output) as launches that wait for one another, and the same weights streamed
without the waits. At 2e75a5b on an H200 (gemm_chain_h200_2e75a5b.json, us a layer): the chain 41.2 (cuBLAS),
qkv, o and gate/up as one GEMM then down 34.4, every layer's weights in two GEMMs 25.5 (3.95 TB/s). About 4 us
a layer go at each launch boundary (the next GEMM's ramp, the previous one's last partial wave), ~16 us a layer,
~3.5 ms a round of eight draft steps, against 25.5 us of bytes.

Here one program per SM stays resident for the whole chain: each phase (one GEMM) hands its tiles out over the
programs, a grid-wide barrier (one atomic counter) separates a phase from the next, so no launch ramps and the
programs that finish early wait on a counter instead of a launch. Small N (o and down: 2048 columns) would leave
most SMs idle or re-read x from L2 for every narrow tile, so a phase can split K: the units of a tile write fp32
partials and the last of them to finish (a per-tile counter) sums them in split order, so the result does not
depend on which finished last. ``prefetch``: before each barrier a program asks L2 for the first K columns of its
next tile's weights, which do not depend on the phase it waits for.

Variants: ``persistent`` (every layer in one launch), ``persistent_prefetch``, ``persistent_tma`` (the weights
loaded by TMA from tensor descriptors, one thread issuing each tile's copy, not every thread's loads),
``persistent_per_layer`` (one launch a layer, the boundary where the draft step's attention would run between two
layers' GEMMs); each with the tile configurations of ``CONFIGS``. Written before measuring: one launch near 28-30 us
a layer (the flat stream's 25.5 plus ~1 us a barrier) says a persistent draft layer kernel recovers ~11-13 us a
layer, ~2.5-3 ms a round; near the chain's 41 says the barriers and split-K fix-ups cost what the launches did, and
the draft GEMMs stay cuBLAS.

    python -m tools.persistent_chain --out benchmarks/results/kernels/persistent_chain_<device>_<commit>.json

Measured on an H200 (persistent_chain_h200_2e75a5b.json, us a layer, against the cuBLAS chain's 41.2 in the same
run): best 47.0 (narrow tiles, no split, 128 x 4 K steps, two programs a SM), 49-53 for the other narrow launches;
the split configs 72-113 (the split-K fix-up inside the units' loop keeps Triton from pipelining it). One launch
a layer costs about what one launch for all layers does (50.2 against 47.0): a barrier costs what a launch
boundary did. With the weights loaded by TMA (persistent_chain_h200_f490eb8.json, cuBLAS chain 41.0): 50.2 against
48.9 with pointer loads for the same narrow launch, so the issuing of the loads is not what holds a phase back.
What is lost is each phase's streaming at 64 rows (a program's few K steps in flight, x re-read from L2 for every
narrow tile), not the boundaries alone: a persistent layer kernel would need the weights streamed ahead across the
phases by producer warps (CUTLASS-style warp specialisation) to approach the flat 25.5. Triton's own warp
specialisation (``tl.range(..., warp_specialize=True)``) is for Blackwell only (Triton 3.6-3.8), so on Hopper that
kernel is CUDA C++ work; the draft GEMMs stay cuBLAS.

Each variant's final x is compared with the cuBLAS chain's (``max_abs_diff_vs_cublas``, rounding only: fp32
accumulation in another order). Needs every program resident at once (one a SM, at most the SM count), which a
CUDA graph of this launch alone gives.
"""

from __future__ import annotations

import argparse
import functools
import time
from typing import Any

import torch
import triton
import triton.language as tl

from tools.gemm_chain import CHAIN, Chain, cublas_baseline, probe_args, probe_settings, timed_against
from tools.kernels_setup import provenance, write_result
from tools.skinny_gemm import _prefetch_slice

# (block_n, split_k) per projection, at BLOCK_K columns a K step. Each config gives every phase a multiple of 128
# units (tiles x splits), so 128 programs get the same bytes in each phase.
CONFIGS = {
    "split": {"qkv": (64, 2), "o": (64, 4), "gate_up": (64, 2), "down": (64, 4)},
    "narrow": {"qkv": (32, 1), "o": (16, 1), "gate_up": (32, 1), "down": (16, 1)},
}
VARIANTS = ("persistent", "persistent_prefetch", "persistent_tma", "persistent_per_layer")
# (block_k, stages): the weight bytes each program keeps in flight, against the shared memory it takes.
PIPELINES = ((128, 4), (256, 3), (64, 8))


@triton.jit
def _grid_sync(Counter, target):
    """Every program's stores before, every program's loads after: one arrival on the counter (release), then spin
    until ``target`` arrivals (acquire), as cooperative groups' grid sync does."""
    tl.debug_barrier()
    tl.atomic_add(Counter, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(Counter, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(Counter, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _gemm_phase(
    X, stride_x, W, row0, Out, stride_o, Part, Tiles, M, pid, nprog,
    N: tl.constexpr, K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SPLIT: tl.constexpr, STAGES: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """Out[:M] = X[:M, :K] @ W[row0 : row0 + N, :K].T over this program's units (tile, K slice), as one loop over
    the units' K steps so that the pipeline loads the next unit's first steps while this one's last run (a loop per
    unit would drain and refill it at every unit). W is the layers' stacked weights, a pointer or (TMA) a tensor
    descriptor of [BLOCK_N, BLOCK_K] boxes. x is the previous phase's output, written by other SMs: loaded from L2
    (.cg), never from this SM's L1, and never by TMA (the async proxy would need a proxy fence after the barrier)."""
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m[:, None] < M
    offs_k = tl.arange(0, BLOCK_K)
    K_LEN: tl.constexpr = K // SPLIT
    STEPS: tl.constexpr = K_LEN // BLOCK_K
    units = tl.cdiv((N // BLOCK_N) * SPLIT - pid, nprog)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for i in tl.range(0, units * STEPS, num_stages=STAGES):
        unit = pid + (i // STEPS) * nprog
        step = i % STEPS
        tile, s = unit // SPLIT, unit % SPLIT
        offs_n = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        k0 = s * K_LEN + step * BLOCK_K
        x = tl.load(X + offs_m[:, None] * stride_x + (k0 + offs_k)[None, :], mask=m_ok, other=0.0,
                    cache_modifier=".cg")  # fmt: skip
        if TMA:
            w = W.load([row0 + tile * BLOCK_N, k0])
        else:
            w = tl.load(W + (row0 + offs_n)[:, None].to(tl.int64) * K + (k0 + offs_k)[None, :])
        acc = tl.dot(x, tl.trans(w), acc)
        if step == STEPS - 1:
            out_off = offs_m[:, None] * stride_o + offs_n[None, :]
            if SPLIT == 1:
                tl.store(Out + out_off, acc.to(Out.dtype.element_ty), mask=m_ok)
            else:
                tl.store(Part + (s * BLOCK_M + offs_m[:, None]) * N + offs_n[None, :], acc, mask=m_ok)
                tl.debug_barrier()
                if tl.atomic_add(Tiles + tile, 1, sem="acq_rel", scope="gpu") == SPLIT - 1:
                    total = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                    for j in tl.static_range(SPLIT):  # split order, whichever unit came last
                        part = Part + (j * BLOCK_M + offs_m[:, None]) * N + offs_n[None, :]
                        total += tl.load(part, mask=m_ok, other=0.0, cache_modifier=".cg")
                    tl.store(Out + out_off, total.to(Out.dtype.element_ty), mask=m_ok)
                    tl.atomic_xchg(Tiles + tile, 0)  # ready for the next phase that splits
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)


@triton.jit
def _prefetch_next(W, row0, pid, N: tl.constexpr, K: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                   PREFETCH_K: tl.constexpr):  # fmt: skip
    """The first PREFETCH_K columns of this program's first unit in the next phase, asked of L2."""
    tile, s = pid // SPLIT, pid % SPLIT
    if tile < N // BLOCK_N:
        offs_n = row0 + tile * BLOCK_N + tl.arange(0, BLOCK_N)
        LINE: tl.constexpr = 64  # bf16 elements in a 128-byte line
        _prefetch_slice(W, offs_n, N, K, s * (K // SPLIT), PREFETCH_K, PREFETCH_K, LINE)


@triton.jit
def _phase_and_barrier(
    X, stride_x, W, row0, Out, stride_o, W_next, row_next, prefetch, Part, Tiles, Counter, phase, M, pid, nprog,
    N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, S: tl.constexpr, N_NEXT: tl.constexpr,
    K_NEXT: tl.constexpr, BN_NEXT: tl.constexpr, S_NEXT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr, PREFETCH_K: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """One GEMM phase, the next phase's first weights asked of L2 (where ``prefetch``), then the grid barrier that
    ends phase ``phase``."""
    _gemm_phase(X, stride_x, W, row0, Out, stride_o, Part, Tiles, M, pid, nprog, N, K, BLOCK_M, BN, BLOCK_K, S,
                STAGES, TMA)  # fmt: skip
    if PREFETCH_K > 0:  # noqa: SIM102 (Triton takes no `and` of a constexpr and a runtime value)
        if prefetch:
            _prefetch_next(W_next, row_next, pid, N_NEXT, K_NEXT, BN_NEXT, S_NEXT, PREFETCH_K)
    _grid_sync(Counter, (phase + 1) * nprog)


@triton.jit
def _chain_kernel(
    X, W0, W1, W2, W3, Out0, Out1, Out2, Part, Tiles, Counter, M, layer0, layers,
    N0: tl.constexpr, K0: tl.constexpr, BN0: tl.constexpr, S0: tl.constexpr,
    N1: tl.constexpr, K1: tl.constexpr, BN1: tl.constexpr, S1: tl.constexpr,
    N2: tl.constexpr, K2: tl.constexpr, BN2: tl.constexpr, S2: tl.constexpr,
    N3: tl.constexpr, K3: tl.constexpr, BN3: tl.constexpr, S3: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr, PREFETCH_K: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """Layers layer0 .. layer0 + layers of the chain x -> out0 -> out1 -> out2 -> x (phase p reads the first K_p
    columns of the previous output; the last writes x), phase p's weights the rows l * N_p .. (l + 1) * N_p of W_p
    for layer l."""
    pid, nprog = tl.program_id(0), tl.num_programs(0)
    for i in range(layers):
        layer, phase = layer0 + i, 4 * i
        _phase_and_barrier(X, K0, W0, layer * N0, Out0, N0, W1, layer * N1, True, Part, Tiles, Counter, phase, M,
                           pid, nprog, N0, K0, BN0, S0, N1, K1, BN1, S1, BLOCK_M, BLOCK_K, STAGES, PREFETCH_K,
                           TMA)  # fmt: skip
        _phase_and_barrier(Out0, N0, W1, layer * N1, Out1, N1, W2, layer * N2, True, Part, Tiles, Counter, phase + 1,
                           M, pid, nprog, N1, K1, BN1, S1, N2, K2, BN2, S2, BLOCK_M, BLOCK_K, STAGES, PREFETCH_K,
                           TMA)  # fmt: skip
        _phase_and_barrier(Out1, N1, W2, layer * N2, Out2, N2, W3, layer * N3, True, Part, Tiles, Counter, phase + 2,
                           M, pid, nprog, N2, K2, BN2, S2, N3, K3, BN3, S3, BLOCK_M, BLOCK_K, STAGES, PREFETCH_K,
                           TMA)  # fmt: skip
        # the last phase asks for the next layer's qkv, if there is one
        _phase_and_barrier(Out2, N2, W3, layer * N3, X, K0, W0, (layer + 1) * N0, i + 1 < layers, Part, Tiles,
                           Counter, phase + 3, M, pid, nprog, N3, K3, BN3, S3, N0, K0, BN0, S0, BLOCK_M, BLOCK_K,
                           STAGES, PREFETCH_K, TMA)  # fmt: skip
    phase = 4 * layers
    # The counter back to 0 for the next launch: every program has passed every barrier once it arrives here,
    # and the last to arrive resets it.
    if tl.atomic_add(Counter, 1, sem="acq_rel", scope="gpu") == (phase + 1) * nprog - 1:
        tl.atomic_xchg(Counter, 0)


class PersistentChain:
    """``Chain``'s weights stacked per projection (``ws[p]``: every layer's [N_p, K_p] in layer order) and the
    persistent launch's activations, partials and counters."""

    def __init__(self, chain: Chain, config: dict[str, tuple[int, int]], block_k: int = 128, stages: int = 4):
        self.chain, self.config, self.block_k, self.stages = chain, config, block_k, stages
        self.dims = [tuple(chain.weights[0][name].shape) for name in CHAIN]
        self.ws = [torch.cat([layer[name] for layer in chain.weights]) for name in CHAIN]
        self.rows = chain.x0.shape[0]
        self.block_m = max(16, triton.next_power_of_2(self.rows))
        device = chain.x0.device
        self.x = torch.zeros(self.block_m, self.dims[0][1], device=device, dtype=chain.x0.dtype)
        self.outs = [torch.zeros(self.block_m, n, device=device, dtype=chain.x0.dtype) for n, _ in self.dims[:3]]
        for (n, k), name in zip(self.dims, CHAIN):
            block_n, split = config[name]
            if n % block_n or k % (split * block_k):
                raise ValueError(f"{name} [{n}, {k}]: block_n {block_n} and split {split} x {block_k} must divide it")
        part = max(config[name][1] * n for (n, _), name in zip(self.dims, CHAIN))
        self.part = torch.empty(part * self.block_m, device=device)
        self.tiles = torch.zeros(max(n // config[name][0] for (n, _), name in zip(self.dims, CHAIN)),
                                 device=device, dtype=torch.int32)  # fmt: skip
        self.counter = torch.zeros(1, device=device, dtype=torch.int32)

    def weights(self, tma: bool) -> list[Any]:
        """The kernel's W_p: the stacked weights, or TMA descriptors of their [block_n, block_k] boxes."""
        if not tma:
            return self.ws
        from triton.tools.tensor_descriptor import TensorDescriptor

        boxes = [[self.config[name][0], self.block_k] for name in CHAIN]
        return [TensorDescriptor.from_tensor(w, box) for w, box in zip(self.ws, boxes)]

    def launch(self, layer0: int, layers: int, programs: int, prefetch_k: int, tma: bool = False) -> Any:
        """One launch over ``layers`` layers from ``layer0``; returns the compiled kernel."""
        if tma and prefetch_k:
            raise ValueError("the L2 prefetch reads the weights through pointers: not with TMA descriptors")
        phases = [v for (n, k), name in zip(self.dims, CHAIN) for v in (n, k, *self.config[name])]
        return _chain_kernel[(programs,)](
            self.x, *self.weights(tma), *self.outs, self.part, self.tiles, self.counter, self.rows, layer0, layers,
            *phases, BLOCK_M=self.block_m, BLOCK_K=self.block_k, STAGES=self.stages, PREFETCH_K=prefetch_k,
            TMA=tma, num_warps=4,
        )  # fmt: skip

    def run(self, programs: int, per_layer: bool = False, prefetch_k: int = 0, tma: bool = False) -> torch.Tensor:
        """The chain from ``chain.x0``; returns its final x [rows, hidden]."""
        self.x[: self.rows].copy_(self.chain.x0)
        n_layers = len(self.chain.weights)
        for layer0 in range(n_layers) if per_layer else (0,):
            self.launch(layer0, 1 if per_layer else n_layers, programs, prefetch_k, tma)
        return self.x[: self.rows]

    def resident(self, prefetch_k: int, tma: bool) -> int:
        """How many programs of this launch a GPU holds at once (the barriers need all of them): the SM count times
        what one SM's registers and shared memory hold, read off the kernel compiled by a launch of one a SM."""
        props = torch.cuda.get_device_properties(0)
        kernel = self.launch(0, 1, props.multi_processor_count, prefetch_k, tma)
        by_regs = getattr(props, "regs_per_multiprocessor", 65536) // max(1, kernel.n_regs * 32 * 4)
        by_smem = props.shared_memory_per_multiprocessor // max(1, kernel.metadata.shared + 1024)
        return props.multi_processor_count * min(by_regs, by_smem)


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--programs", default="128,256", help="grid sizes to try (one that a GPU cannot hold at "
                        "once is skipped: the barriers need every program resident)")  # fmt: skip
    parser.add_argument("--prefetch-k", type=int, default=256, help="columns of the next tile asked of L2")


def main() -> None:
    args = probe_args(__doc__, "persistent_chain", options)
    started = time.time()
    chain = Chain(args.model, args.bs)
    reference, baseline = cublas_baseline(chain, args.replays)
    results: dict[str, Any] = {"cublas_chain": baseline}
    for name, config in CONFIGS.items():
        for block_k, stages in PIPELINES:
            try:
                probe = PersistentChain(chain, config, block_k, stages)
            except ValueError as exc:
                results[f"{name}:k{block_k}x{stages}"] = {"error": str(exc)}
                continue
            for variant in VARIANTS:
                prefetch_k = args.prefetch_k if variant == "persistent_prefetch" else 0
                tma = variant == "persistent_tma"
                try:
                    resident = probe.resident(prefetch_k, tma)
                except Exception as exc:  # one launch failing to compile (shared memory) leaves the others
                    results[f"{variant}:{name}:k{block_k}x{stages}"] = {"error": repr(exc)[:300]}
                    continue
                for programs in (int(p) for p in args.programs.split(",")):
                    key = f"{variant}:{name}:k{block_k}x{stages}:p{programs}"
                    if programs > resident:
                        results[key] = {"error": f"{programs} programs, {resident} resident at once"}
                        continue
                    kwargs = {"per_layer": variant == "persistent_per_layer", "prefetch_k": prefetch_k, "tma": tma}
                    call = functools.partial(probe.run, programs, **kwargs)
                    results[key] = timed_against(key, call, reference, chain, args.replays)
            del probe
    settings = probe_settings(
        args, chain, started, programs=args.programs, sms=torch.cuda.get_device_properties(0).multi_processor_count,
        prefetch_k=args.prefetch_k, configs=CONFIGS, pipelines=PIPELINES,
    )  # fmt: skip
    write_result(args.out, {**provenance("persistent_chain"), "settings": settings, "variants": results})


if __name__ == "__main__":
    main()
