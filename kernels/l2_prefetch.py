"""A kernel asking the GPU's L2 for bytes the next launch reads (``prefetch_share``), while its own loads leave HBM
bandwidth idle: sm_80+ ``prefetch.global.L2`` instructions, one 128-byte line a thread a pass, nothing read back.

A draft step's sparse attention is bound by the latency of its dependent loads, not by bandwidth (~2.2 TB/s of the
H200's 4.8 over its 27 us at Qwen3-1.7B 64 x 4096), and the o projection after it reads its 8 MB weight at ~1.4
TB/s, mostly its ramp. Asked for while the attention runs, that weight is in L2 when the GEMM starts.

Speed only: no value any kernel computes depends on it, so there is no reference to test against; the kernels that
use it are tested for equal outputs with and without it. Compiled only: Triton's interpreter runs no inline PTX,
so under it hosts launch without the prefetch (``prefetch_lines``).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

LINE_BYTES = 128
HINTS = ("evict_last", "evict_normal")  # the L2 eviction priority of the fetched lines


@triton.jit
def prefetch_share(base, n_lines, program, programs, EVICT_LAST: tl.constexpr, THREADS: tl.constexpr):
    """Program ``program`` of ``programs`` asks L2 for its share of the ``n_lines`` 128-byte lines from ``base``
    (a byte pointer), THREADS lines a pass; EVICT_LAST: the lines outlive other data in L2."""
    per = tl.cdiv(n_lines, programs)
    first = program * per
    last = tl.minimum(first + per, n_lines)
    offs = tl.arange(0, THREADS)
    for start in range(first, last, THREADS):
        line = start + offs
        ptr = tl.where(line < last, base + line.to(tl.int64) * 128, base)  # past the share: the first line again
        if EVICT_LAST:
            tl.inline_asm_elementwise(
                "prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptr], tl.int32, False, 1
            )
        else:
            tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptr], tl.int32, False, 1)


def prefetch_lines(weight: torch.Tensor | None) -> tuple[torch.Tensor, int] | None:
    """(``weight``'s bytes as a flat uint8 view, its 128-byte lines) for ``prefetch_share``; None without a weight or
    under Triton's interpreter (TRITON_INTERPRET=1, read as Triton reads it). ``weight`` must be contiguous."""
    if weight is None or os.environ.get("TRITON_INTERPRET", "0") == "1":
        return None
    if not weight.is_contiguous():
        raise ValueError(f"an L2 prefetch reads a contiguous tensor, got strides {weight.stride()}")
    flat = weight.view(-1).view(torch.uint8)
    return flat, triton.cdiv(flat.numel(), LINE_BYTES)
