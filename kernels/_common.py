"""Launch helpers shared by the kernels (host-side, no device syncs)."""

from __future__ import annotations

import functools

import torch


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_sms(device: torch.device) -> int:
    """Streaming multiprocessors of `device`; a small stand-in on CPU (interpreter runs)."""
    if device.type != "cuda":
        return 2
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def default_num_splits(programs_per_split: int, device: torch.device, cap: int = 32) -> int:
    """Static split count so that about two waves of programs fill the GPU.

    It depends only on static sizes (batch and head counts), never on sequence
    lengths, so a launch with it is CUDA-graph safe.
    """
    want = -(-2 * num_sms(device) // max(programs_per_split, 1))
    return max(1, min(cap, want))


def check_int_vector(name: str, t: torch.Tensor, n: int) -> None:
    """ValueError unless `t` is an integer tensor of shape [n] (metadata only, no sync)."""
    if t.dtype not in (torch.int32, torch.int64) or t.dim() != 1 or t.shape[0] != n:
        raise ValueError(f"{name} must be an int32/int64 tensor of shape [{n}], got {t.dtype} {tuple(t.shape)}")


def skinny_operands(x: torch.Tensor, w: torch.Tensor, n: int, out: torch.Tensor | None) -> torch.Tensor:
    """ValueError unless x [M, K] (contiguous rows) and w [*, K] (contiguous) share one half-precision dtype and
    ``out`` is None or [M, n] in it with contiguous rows; returns ``out``, a new tensor when None."""
    if x.dtype not in (torch.bfloat16, torch.float16) or w.dtype != x.dtype:
        raise ValueError(f"x and w in one half-precision dtype, got {x.dtype} {w.dtype}")
    if x.stride(1) != 1 or not w.is_contiguous():
        raise ValueError("x needs contiguous rows and w must be contiguous")
    m = x.shape[0]
    if out is None:
        return torch.empty(m, n, device=x.device, dtype=x.dtype)
    if out.shape != (m, n) or out.dtype != x.dtype or out.stride(1) != 1:
        raise ValueError(f"out must be [{m}, {n}] {x.dtype} with contiguous rows, got {out.dtype} {tuple(out.shape)}")
    return out


def splits_cap(uniform_splits: int, cap: int | None = None) -> int:
    """Static split grid for ``mean_prefix_chunk`` (verify, score capture): ``cap`` splits per request, by default
    twice the uniform count, room for a request at twice the batch's mean prefix (a serving batch's prefixes
    spread over about 0 .. 2 x mean). H100 sweep (kernels_tune_mixed_h100_fc3302f.json, 256 x 2K / 4K, SmolLM2):
    verify 1 split capped at 2 runs a mixed batch 5-7% faster than no balancing and a uniform one within 2%; a
    cap of 4 costs the uniform batch 4-10% (empty programs)."""
    if uniform_splits < 1:
        raise ValueError(f"the split count must be >= 1, got {uniform_splits}")
    if cap is None:
        return 2 * uniform_splits
    if cap < uniform_splits:
        raise ValueError(f"the split cap ({cap}) must be >= the split count ({uniform_splits})")
    return cap
