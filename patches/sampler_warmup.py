"""SGLang's sampler on FlashInfer builds its kernels (JIT) on first use: on a machine without
FlashInfer's cache that is the first sampled request, and the scheduler answers nobody while
ninja runs. Measured on the H100 on 2026-11-25 (reliability run of ea994c4): the first 128
requests timed out after 57 s, the scheduler's stack in ``flashinfer.sampling.get_sampling_module``.
Building them while the server starts puts that wait where a user expects it (before /health)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch
from sglang.srt.sampling.sampling_params import TOP_K_ALL  # what sampling_info.top_ks holds for "no top-k"

logger = logging.getLogger(__name__)


def warm_sampling(
    top_k_top_p: Callable[..., torch.Tensor],
    min_p: Callable[..., torch.Tensor],
    vocab_size: int,
    device: torch.device | str,
) -> None:
    """One call of each FlashInfer sampling entry SGLang's sampler uses, on a uniform [1, vocab]
    distribution, with the argument types the sampler passes (int32 top_ks, fp32 top_ps / min_ps)."""
    probs = torch.full((1, vocab_size), 1.0 / vocab_size, dtype=torch.float32, device=device)
    top_ks = torch.full((1,), TOP_K_ALL, dtype=torch.int32, device=device)
    top_ps = torch.full((1,), 0.95, dtype=torch.float32, device=device)
    min_ps = torch.full((1,), 0.05, dtype=torch.float32, device=device)
    top_k_top_p(probs, top_ks, top_ps, filter_apply_order="joint")
    min_p(probs, min_ps)


def build_sampling_kernels(sampling_backend: str, vocab_size: int, device: torch.device | str) -> None:
    """Build FlashInfer's sampling kernels now when SGLang will sample with them (CUDA only)."""
    # The device decides, not the machine: a CPU device on a GPU machine has no FlashInfer kernels to build.
    if sampling_backend != "flashinfer" or torch.device(device).type != "cuda":
        return
    from sglang.srt.layers import sampler  # imports FlashInfer's sampling functions on CUDA

    t0 = time.monotonic()
    warm_sampling(sampler.top_k_top_p_sampling_from_probs, sampler.min_p_sampling_from_probs, vocab_size, device)
    torch.cuda.synchronize()
    logger.info("PILLAR: FlashInfer sampling kernels ready in %.1f s", time.monotonic() - t0)
