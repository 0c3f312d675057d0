"""SGLang's ``write_req_to_token_pool_triton`` (every prefill writes its KV slots into the request's
row with it) is built by Triton per pointer alignment, and its ``out_cache_loc`` is a slice of the
KV allocator's free list, 16-byte aligned or not depending on what was allocated before. A served
batch that met the unaligned variant first compiled it while every request waited: the warm-up
GPU test failed on exactly that kernel three times (gpu_tests_h200_warmup_*.log), and the Triton IR
of the variant it built differs from the warmed one only in ``out_cache_loc``'s divisibility
(write_req_variants_ttir_bf21a0d.txt). Prefill batches cannot be steered to an unaligned slice, so
the worker launches the kernel itself at start, once per alignment, on a scratch row."""

from __future__ import annotations

import logging

import torch
from sglang.kernels.ops.memory.common import write_req_to_token_pool_triton

logger = logging.getLogger(__name__)


def build_slot_kernels(req_to_token: torch.Tensor) -> None:
    """Both alignment variants of the kernel for a pool of ``req_to_token``'s row length (a
    compile-time constant of the kernel), with the argument dtypes SGLang's ``write_cache_indices``
    passes. Writes slots 0 and 1 into position 0 of a scratch row; the pool itself is untouched."""
    device = req_to_token.device
    scratch = torch.zeros((1, req_to_token.shape[1]), dtype=req_to_token.dtype, device=device)
    zero = torch.zeros(1, dtype=torch.int64, device=device)  # row 0, an empty prefix
    one = torch.ones(1, dtype=torch.int64, device=device)  # one token, written from out_cache_loc
    empty_prefix = torch.zeros(1, dtype=torch.int64, device=device)
    prefix_pointers = torch.tensor([empty_prefix.data_ptr()], dtype=torch.uint64, device=device)
    slots = torch.arange(2, dtype=torch.int64, device=device)
    for out_cache_loc in (slots[:1], slots[1:]):  # 16-byte aligned, then 8 bytes past it
        write_req_to_token_pool_triton[(1,)](
            scratch, zero, prefix_pointers, zero, one, one, out_cache_loc, scratch.shape[1]
        )
    if int(scratch[0, 0]) != 1:
        raise RuntimeError("SGLang's write_req_to_token_pool_triton did not write its slot: signature changed?")
    logger.info("PILLAR: KV slot kernels built for both alignments")
