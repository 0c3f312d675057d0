"""The draft step's four GEMMs a layer in one persistent CUDA launch whose weight stream runs on across the phase
boundaries (``tools/persistent_chain_cuda.cu``), timed against the cuBLAS chain (GPU only; nvcc builds it).

    python -m tools.persistent_chain_cuda --out benchmarks/results/kernels/persistent_chain_cuda_<device>_<commit>.json

``tools.gemm_chain`` puts ~16 us of a Qwen3-1.7B draft layer's 41 us of GEMMs at the launch boundaries (every
layer's weights streamed in two GEMMs take 25.5), and ``tools.persistent_chain`` found that a Triton kernel with
grid barriers does not recover them (47-50 us): each phase restarts its loads after the barrier. Here each CTA keeps
8 KB weight chunks in flight with cp.async over its whole schedule (3, 7 or 11: ``STAGES``), so when it reaches a
grid barrier the next phase's first chunks are already loading; only the activations wait for the barrier (read from
L2, one chunk ahead in registers). Written before measuring: near 30 us a layer (the flat stream plus ~1 us a
barrier) says a persistent draft layer built this way recovers ~10 us a layer, ~2.5 ms a round; near the chain's 41
or above says the activations' L2 reads (twice the weight bytes at 32-column tiles) or the barriers cap it.

The final x is compared with the cuBLAS chain's (``max_abs_diff_vs_cublas``: rounding only, fp32 accumulation
in another order).
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import torch

from tools.gemm_chain import CHAIN, Chain, cublas_baseline, probe_args, probe_settings, timed_against
from tools.kernels_setup import provenance, write_result

SOURCE = Path(__file__).with_suffix(".cu")
ROWS = 64  # the kernel's four warps take 16 rows each
BLOCK_N, BLOCK_K = 32, 128  # the kernel's tile and chunk (BN, BK in the source)
STAGES = (4, 8, 12)  # weight chunks in shared memory (one fewer in flight): the builds the source instantiates


def phase_table(chain: Chain, x: torch.Tensor, outs: list[torch.Tensor]) -> torch.Tensor:
    """[4 x layers, 7] int64 rows (weight, x, out pointers; x's and out's leading dimensions; N; K), one per GEMM
    in chain order: qkv reads x, o the first K columns of qkv's output, gate/up o's, down gate/up's first half and
    writes x, which the next layer's qkv reads (``Chain.inputs``)."""
    buffers = [x, *outs, x]  # phase p reads buffers[p] and writes buffers[p + 1]
    rows = []
    for layer in chain.weights:
        for p, name in enumerate(CHAIN):
            w = layer[name]
            n, k = w.shape
            if n % BLOCK_N or k % BLOCK_K or not w.is_contiguous():
                raise ValueError(f"{name} [{n}, {k}]: N a multiple of {BLOCK_N}, K of {BLOCK_K}, contiguous rows")
            src, dst = buffers[p], buffers[p + 1]
            rows.append([w.data_ptr(), src.data_ptr(), dst.data_ptr(), src.stride(0), dst.stride(0), n, k])
    return torch.tensor(rows, dtype=torch.int64)


class CudaChain:
    """The compiled kernel over ``Chain``'s weights, with its own activation buffers of 64 rows."""

    def __init__(self, chain: Chain):
        from torch.utils.cpp_extension import load

        if chain.x0.shape[0] != ROWS:
            raise ValueError(f"the kernel runs {ROWS} rows, the chain has {chain.x0.shape[0]}")
        self.chain = chain
        # torch picks the C++ standard and the GPU's architecture for nvcc
        self.module = load(name="sparsespec_persistent_chain", sources=[str(SOURCE)], extra_cuda_cflags=["-O3"])
        device, dtype = chain.x0.device, chain.x0.dtype
        self.x = torch.empty_like(chain.x0)
        self.outs = [torch.empty(ROWS, chain.weights[0][name].shape[0], device=device, dtype=dtype)
                     for name in CHAIN[:3]]  # fmt: skip
        self.phases = phase_table(chain, self.x, self.outs).to(device)
        self.counter = torch.zeros(1, device=device, dtype=torch.int32)
        self.grid = torch.cuda.get_device_properties(device).multi_processor_count

    def run(self, stages: int) -> torch.Tensor:
        self.x.copy_(self.chain.x0)
        self.module.chain(self.phases, self.counter, self.grid, stages)
        return self.x


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
    for stages in STAGES if probe is not None else ():
        key = f"persistent_cuda:s{stages}"
        results[key] = timed_against(key, functools.partial(probe.run, stages), reference, chain, args.replays)
    settings = probe_settings(args, chain, started, block_n=BLOCK_N, block_k=BLOCK_K, stages=STAGES)
    write_result(args.out, {**provenance("persistent_chain_cuda"), "settings": settings, "variants": results})


if __name__ == "__main__":
    main()
