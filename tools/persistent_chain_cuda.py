"""The draft step's four GEMMs a layer in one persistent CUDA launch, producer warps streaming the weights across
the phase boundaries (``tools/persistent_chain_cuda.cu``), timed against the cuBLAS chain (GPU only; nvcc builds
it).

    python -m tools.persistent_chain_cuda --out benchmarks/results/kernels/persistent_chain_cuda_<device>_<commit>.json

``tools.gemm_chain`` puts ~16 us of a Qwen3-1.7B draft layer's 41 us of GEMMs at the launch boundaries (every
layer's weights streamed in two GEMMs take 25.5), and ``tools.persistent_chain`` found that a Triton kernel with
grid barriers does not recover them (47-50 us): each phase restarts its loads after the barrier.

This kernel separates the roles: two warps stream the weights in 32 KB chunks (128 columns x 128 K) into a 4-deep
ring with cp.async and never wait for a phase; one warp streams the activations (fp32, 64 rows x 128 K) into their
own ring, each chunk once the tile of the previous phase it reads is complete (per-tile counters: the phases overlap
wherever their tiles allow, no grid barrier); four warps multiply (``BUILDS``: each warp's mma.sync with the weights
by ldmatrix, or one warpgroup's wgmma reading them from shared memory). K is split (``SPLITS``, per phase) so that o
and down have units for every SM, the partial sums added into fp32 outputs (a phase with K unsplit stores them);
a phase's units rotate over the CTAs from where the previous phase's ended. Diagnostics (``FLAGS``) leave parts
out: the activation copies, the waits for tiles, the products, the weight copies, the adds; their outputs mean
nothing and are not compared. ``barriers`` puts a grid barrier a phase back in place of the tiles' waits.

Written before measuring: near 28-30 us a layer (the flat stream's 25.5 plus the barriers) says a persistent draft
layer built this way recovers ~10 us a layer, ~2.5 ms a round. Every variant's final x is compared with the cuBLAS
chain's (``max_abs_diff_vs_cublas``: rounding only, fp32 accumulation in another order).

Measured on one H200 (us a layer against the cuBLAS chain's 40-41 in the same run; outputs always match it):
- first form (every thread's cp.async, 32-column tiles, x read from L2 into registers one chunk ahead): 221-310
  (``_4cdd06e``): each chunk waited for its x loads and two CTA barriers, and o and down kept half the SMs idle;
- warp roles with 1-D bulk copies a row: 198-200 whatever the activations or barriers (``_12dcec4``, ``_8e65f47``):
  128- and 256-byte bulk copies stream ~0.5 TB/s; as cp.async 134;
- cp.async for both streams, the products' weights loaded before they issue: 72.4 (``_4f16a23``); eight
  multiplying warps 72.1, four 69.3 (``_ec1b777``); 128-column chunks 68.7 (``_fa4cbe3``);
- wgmma with the weights in its core matrices, unswizzled: 83.2 against mma.sync's 68.8 in the same run
  (``_ad6ebbf``).
What each part costs (``_fa4cbe3``, ``_ad6ebbf``, the others left out): the weight stream alone 27.8 (256-byte rows;
30.3 at 128) and 35.6 with the grid barriers; the products alone 37.9 with mma.sync, 31.0 with wgmma; the adds ~11,
the activations ~10, the barriers ~19 (the phases wait for their slowest CTA). With the weights laid out in wgmma's
unswizzled core matrices (eight rows' 64-byte pieces a copy) the stream alone fell to 44.9. So the stream is near
cuBLAS's flat one; what is left is the products and what the barriers expose.

Without grid barriers (per-tile counters, as above) and with wgmma on the 128-byte swizzled weights (whole
256-byte rows a copy; each chunk's products issued before the previous chunk's are waited for; no lane-dependent
branch in any role, so ptxas serializes nothing): wgmma 65.0-65.1, mma.sync 68.0 (``_ed67a05``, ``_d2dc772``), a
grid barrier a phase 69.4 / 71.5: the barriers' share was 4 us, not the ~19 the diagnostics had put on them. Each
part left out saves 8-16 us (wgmma: activations 14, adds 14, waits 16, products 8, weights 10), the parts overlap
little, and with both the activations and the adds left out, a bound no real chain reaches, the kernel takes 38.3
against the cuBLAS chain's 41.2 (mma.sync 42.7). So a kernel of these four GEMMs alone can win ~3 us a layer at
most, ~0.7 ms of a Qwen3-1.7B round: at 64 rows each phase's split-K partial sums (adds) and x reloaded a unit
(as many bytes as the unit's weights in fp32) cost what the launch boundaries did. What such a kernel could still
win is the rest of the layer (the norms, the attention, the gaps between ~200 launches a step), which needs all of
it in one launch.
"""

from __future__ import annotations

import functools
import os
import random
import time
from pathlib import Path
from typing import Any

import torch

from tools.gemm_chain import CHAIN, Chain, cublas_baseline, probe_args, probe_settings, timed_against
from tools.kernels_setup import provenance, write_result

SOURCE = Path(__file__).with_suffix(".cu")
ROWS = 64  # the kernel's four multiplying warps take 16 rows each
BLOCK_N, BLOCK_K = 128, 128  # a unit's output columns and a chunk's K columns (BN, BK in the source)
# the products by each warp's mma.sync (weights by ldmatrix) or by the warpgroup's wgmma (weights read from shared
# memory by the tensor cores): the two builds, each with rings of 4 weight and 2 activation chunks, four multiplying
# and two weight-streaming warps
BUILDS = {"mma.sync": False, "wgmma": True}
# K slices per phase (qkv, o, gate/up, down): units for every SM in each phase (A); gate/up unsplit, its 96 units
# stored without adds (B); half the adds (C).
SPLITS = {"A": (4, 8, 4, 8), "B": (4, 8, 1, 8), "C": (2, 4, 1, 4)}
# diagnostics that leave a part out (NO_* in the source), and the grid barrier a phase in place of the tiles' waits
FLAGS = {"no_x": 1, "no_waits": 2, "no_products": 4, "no_weights": 8, "no_adds": 16, "barriers": 32}
DIAGNOSTICS = (
    ("no_adds",), ("no_waits",), ("no_x",), ("no_products",), ("no_weights",),
    ("no_weights", "no_x", "no_adds"),  # the products and waits alone
    ("no_x", "no_adds"),  # the weight stream, products and waits: the chain with its activations and adds free
    ("no_products", "no_x", "no_adds"),  # the weight stream and waits alone
    ("no_products", "no_x", "no_adds", "no_waits"),  # the weight stream alone
)  # fmt: skip


class Buffers:
    """The kernel's fp32 activations: the chain's input x, and each GEMM's output twice over, by layer parity, so
    that a layer's outputs are cleared while the next layer's are being written."""

    def __init__(self, chain: Chain):
        widths = [chain.weights[0][name].shape[0] for name in CHAIN]  # down's is x's
        self.x = chain.x0.new_empty(ROWS, chain.x0.shape[1], dtype=torch.float32)
        self.outs = [[chain.x0.new_zeros(ROWS, n, dtype=torch.float32) for n in widths] for _ in range(2)]

    def out(self, p: int) -> torch.Tensor:
        """What phase p (layer p // 4, GEMM p % 4) writes."""
        return self.outs[p // 4 % 2][p % 4]

    def source(self, p: int) -> torch.Tensor:
        """What phase p reads: x, or the previous phase's output."""
        return self.x if p == 0 else self.out(p - 1)

    def reset(self, x0: torch.Tensor) -> None:
        """A launch's start: x from the chain's, every output zero (the kernel clears them for their reuse)."""
        self.x.copy_(x0)
        for outs in self.outs:
            for out in outs:
                out.zero_()


def phase_table(chain: Chain, buffers: Buffers, splits: tuple[int, ...], grid: int) -> torch.Tensor:
    """[4 x layers, 12] int64 rows, one per GEMM in chain order: weight, x and out pointers; x's and out's leading
    dimensions (their full widths: a GEMM reads its first K columns as ``Chain.inputs`` does); N; K; K slices; the
    rotation (unit u runs on CTA (u + rotation) % grid, counting every earlier phase's units); where its tiles'
    counters start; the buffer its start clears and its floats: from layer 1 on, the one the phase four on adds into
    (phase p - 4 wrote it, phase p - 3 read it), or none."""
    rows, units, tiles = [], 0, 0
    count = len(chain.weights) * len(CHAIN)
    for p in range(count):
        name, split = CHAIN[p % 4], splits[p % 4]
        w = chain.weights[p // 4][name]
        n, k = w.shape
        # the wgmma build takes a unit's chunks in pairs: a K slice of an even number of chunks
        if n % BLOCK_N or k % (split * 2 * BLOCK_K) or not w.is_contiguous():
            raise ValueError(f"{name} [{n}, {k}]: N a multiple of {BLOCK_N}, K of {split} x {2 * BLOCK_K}, "
                             "contiguous")  # fmt: skip
        src, dst = buffers.source(p), buffers.out(p)
        clear = buffers.out(p + 4) if 4 <= p < count - 4 else None
        rows.append([w.data_ptr(), src.data_ptr(), dst.data_ptr(), src.stride(0), dst.stride(0), n, k, split,
                     units % grid, tiles, 0 if clear is None else clear.data_ptr(),
                     0 if clear is None else clear.numel()])  # fmt: skip
        units += n // BLOCK_N * split
        tiles += n // BLOCK_N
    return torch.tensor(rows, dtype=torch.int64)


def simulate(chain: Chain, splits: tuple[int, ...], grid: int, seed: int | None = None) -> torch.Tensor:
    """The kernel's plan in torch, on the chain's device: each phase's clearing and units (checked to run on exactly
    one CTA each), a unit's product of bf16-rounded x with its weights added into the fp32 output. Phase by phase,
    or with ``seed`` in a random order that keeps only what the kernel's waits keep: a phase's clearing once the
    phases four and three back (the buffer's writer and reader) are done; a unit once every tile of the previous
    phase that its chunks read is, and, from the third layer on, once its own output was cleared. Returns the final
    x (fp32); a plan whose waits could never all pass raises."""
    buffers = Buffers(chain)
    buffers.reset(chain.x0)
    table = phase_table(chain, buffers, splits, grid).tolist()
    by_ptr = {b.data_ptr(): b for b in [buffers.x, *buffers.outs[0], *buffers.outs[1]]}
    units = [n // BLOCK_N * split for _, _, _, _, _, n, _, split, *_ in table]
    pending: list[tuple[int, int]] = []  # (phase, unit), unit -1 for the phase's clearing
    for p, (*_, rotation, _, clear, _) in enumerate(table):
        ran = [u for cta in range(grid) for u in range((cta - rotation) % grid, units[p], grid)]
        assert sorted(ran) == list(range(units[p])), f"phase {p}: units {sorted(ran)}"
        pending += [(p, -1)] * bool(clear) + [(p, u) for u in ran]
    done: set[tuple[int, int]] = set()

    def tile_done(p: int, tile: int) -> bool:
        return all((p, tile * table[p][7] + part) in done for part in range(table[p][7]))

    def phase_done(p: int) -> bool:
        return all((p, u) in done for u in range(units[p]))

    def ready(p: int, u: int) -> bool:
        if u < 0:
            return phase_done(p - 4) and phase_done(p - 3)
        if p >= 8 and (p - 4, -1) not in done:
            return False
        slice_k = table[p][6] // table[p][7]
        k0 = u % table[p][7] * slice_k
        return p == 0 or all(tile_done(p - 1, k // BLOCK_N) for k in range(k0, k0 + slice_k, BLOCK_K))

    order = random.Random(seed)
    while pending:
        candidates = [event for event in pending if ready(*event)] if seed is not None else pending[:1]
        if not candidates:
            raise RuntimeError(f"the plan's waits never pass for {pending[:4]}")
        p, u = candidates[order.randrange(len(candidates))]
        pending.remove((p, u))
        done.add((p, u))
        _, x_ptr, out_ptr, _, _, n, k, split, _, _, clear, _ = table[p]
        if u < 0:
            by_ptr[clear].zero_()
            continue
        x, out, w = by_ptr[x_ptr], by_ptr[out_ptr], chain.weights[p // 4][CHAIN[p % 4]]
        tile, part = divmod(u, split)
        cols = slice(tile * BLOCK_N, (tile + 1) * BLOCK_N)
        ks = slice(part * (k // split), (part + 1) * (k // split))
        out[:, cols] += x[:, ks].bfloat16().float() @ w[cols, ks].float().T
    return buffers.out(len(table) - 1)


class CudaChain:
    """The compiled kernel over ``Chain``'s weights, with its own fp32 activation buffers of 64 rows."""

    def __init__(self, chain: Chain):
        from torch.utils.cpp_extension import load

        if chain.x0.shape[0] != ROWS:
            raise ValueError(f"the kernel runs {ROWS} rows, the chain has {chain.x0.shape[0]}")
        self.chain = chain
        # torch picks the C++ standard; wgmma needs the sm_90a target
        os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
        self.module = load(name="sparsespec_persistent_chain3", sources=[str(SOURCE)], extra_cuda_cflags=["-O3"])
        self.grid = torch.cuda.get_device_properties(chain.x0.device).multi_processor_count
        self.buffers = Buffers(chain)
        self.tables = {key: phase_table(chain, self.buffers, s, self.grid).to(chain.x0.device)
                       for key, s in SPLITS.items()}  # fmt: skip
        table = self.tables["A"]
        # a counter a tile, then two a phase (``Counters`` in the source)
        tiles = int((table[:, 5] // BLOCK_N).sum())
        self.counters = torch.zeros(tiles + 2 * len(table), device=chain.x0.device, dtype=torch.int32)

    def run(self, build: str, splits: str, flags: int = 0) -> torch.Tensor:
        self.buffers.reset(self.chain.x0)
        table = self.tables[splits]
        self.module.chain(table, self.counters, self.grid, BUILDS[build], flags)
        return self.buffers.out(len(table) - 1)


def main() -> None:
    args = probe_args(__doc__, "persistent_chain_cuda")
    started = time.time()
    chain = Chain(args.model, args.bs)
    reference, baseline = cublas_baseline(chain, args.replays)
    results: dict[str, Any] = {"cublas_chain": baseline}
    try:
        probe = CudaChain(chain)
    except Exception as exc:  # the build failing still leaves the baseline's row
        probe, results["build"] = None, {"error": repr(exc)[:4000]}
        print(f"build: {results['build']['error']}", flush=True)
    runs = [(build, splits, ()) for build in BUILDS for splits in SPLITS]
    runs += [(build, "A", names) for build in BUILDS for names in (("barriers",), *DIAGNOSTICS)]
    for build, splits, names in runs if probe is not None else ():
        flags = sum(FLAGS[name] for name in names)
        key = f"persistent_cuda:{build}:{splits}" + "".join(f":{name}" for name in names)
        call = functools.partial(probe.run, build, splits, flags)
        results[key] = timed_against(key, call, reference, chain, args.replays)
        if flags & ~FLAGS["barriers"]:  # a diagnostic's output means nothing; the barriers' computes the chain
            results[key].pop("max_abs_diff_vs_cublas", None)
    settings = probe_settings(args, chain, started, block_n=BLOCK_N, block_k=BLOCK_K, builds=list(BUILDS),
                              splits=SPLITS)  # fmt: skip
    write_result(args.out, {**provenance("persistent_chain_cuda"), "settings": settings, "variants": results})


if __name__ == "__main__":
    main()
