"""SGLang's sampler on FlashInfer builds its kernels (JIT) on first use: on a machine without
FlashInfer's cache that is the first sampled request, and the scheduler answers nobody while
ninja runs. Measured on the H100 on 2026-11-25 (reliability run of ea994c4): the first 128
requests timed out after 57 s, the scheduler's stack in ``flashinfer.sampling.get_sampling_module``.
Building them while the server starts puts that wait where a user expects it (before /health).

The build itself is ninja running nvcc, no CUDA call of this process (the GPUs' capabilities its flags name
come from torch's cache, filled before the thread starts): ``compile_ahead`` starts it on a thread of its own
when the worker is made, so it runs beside the KV pool set-up and the graph captures
(an H200 without FlashInfer's cache spent 108 s on it before any of them, reliability_h200_8d05398), and
``build_sampling_kernels``, at the end of the worker's captures, waits for it, then loads and calls the
kernels on the worker's thread as before."""

from __future__ import annotations

import logging
import threading
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


def samples_with_flashinfer(sampling_backend: str, device: torch.device | str) -> bool:
    # The device decides, not the machine: a CPU device on a GPU machine has no FlashInfer kernels to build.
    return sampling_backend == "flashinfer" and torch.device(device).type == "cuda"


def compile_ahead(sampling_backend: str, device: torch.device | str) -> threading.Thread | None:
    """Start compiling FlashInfer's sampling module on a thread of its own; None when there is nothing to compile
    (another backend, a CPU device, a module already built or shipped ahead of time) or no build to start (a
    FlashInfer whose JIT entry points differ: the worker's thread then builds it at the end, as it always can)."""
    if not samples_with_flashinfer(sampling_backend, device):
        return None
    try:
        from flashinfer.jit.sampling import gen_sampling_module

        spec = gen_sampling_module()
        if spec.is_aot or spec.is_compiled:
            return None
        # The compile's nvcc flags read every GPU's capability (FlashInfer's CompilationContext, made again when
        # the ninja file is written): read here first, torch answers the compile thread from its cache, with no
        # CUDA call beside the graph captures.
        for index in range(torch.cuda.device_count()):
            torch.cuda.get_device_capability(index)
    except Exception as exc:  # FlashInfer's JIT internals are not SGLang's contract: fall back to the end
        logger.info("PILLAR: FlashInfer sampling kernels not compiled ahead (%r)", exc)
        return None
    thread = threading.Thread(target=_compile, args=(spec,), name="pillar-flashinfer-sampling", daemon=True)
    thread.start()
    return thread


def _compile(spec) -> None:
    """ninja under FlashInfer's file lock (other ranks wait on it, then find the module built)."""
    t0 = time.monotonic()
    try:
        spec.build(verbose=False)
    except Exception as exc:  # the load at the captures' end builds again and raises on the worker's thread
        logger.warning("PILLAR: compiling FlashInfer's sampling kernels ahead failed: %r", exc)
        return
    logger.info("PILLAR: FlashInfer sampling kernels compiled in %.1f s, beside the start-up", time.monotonic() - t0)


def build_sampling_kernels(
    sampling_backend: str, vocab_size: int, device: torch.device | str, ahead: threading.Thread | None = None
) -> None:
    """Build FlashInfer's sampling kernels now when SGLang will sample with them (CUDA only), after the compile
    ``ahead`` (``compile_ahead``'s thread) has ended."""
    if not samples_with_flashinfer(sampling_backend, device):
        return
    t0 = time.monotonic()
    if ahead is not None:
        ahead.join()
    waited = time.monotonic() - t0
    from sglang.srt.layers import sampler  # imports FlashInfer's sampling functions on CUDA

    warm_sampling(sampler.top_k_top_p_sampling_from_probs, sampler.min_p_sampling_from_probs, vocab_size, device)
    torch.cuda.synchronize()
    ready = f"PILLAR: FlashInfer sampling kernels ready in {time.monotonic() - t0:.1f} s"
    logger.info(ready + (f" ({waited:.1f} s of it waiting for the compile begun at start-up)" if ahead else ""))
