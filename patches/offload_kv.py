"""SGLang's HiCache host pool and transfer kernels, used to park and restore one request's KV.

``MHATokenToKVPoolHost`` gives a pinned host buffer (sized from the host budget in GB, with its
own free list and double-free checks) and the all-layer device->host / per-layer host->device
copy kernels. Copies run on a side stream that first waits for the forward stream (whatever the
in-flight forward writes to those slots is copied, and freshly allocated slots are not
overwritten before their previous owner's last forward read them); each returns the CUDA event
recorded after it.
"""

from __future__ import annotations

import psutil
import torch
from sglang_sparsespec.config import ALGORITHM_NAME

from . import versions
from .contacts import OFFLOAD_RELEASES
from .spec_algo import HALF_KV_CACHE_DTYPES, LAYOUT_FLAGS, first_set


def offload_refusal(server_args) -> str | None:
    """Why offload cannot run with these (resolved) ServerArgs on the installed SGLang (one line), or None."""
    if versions.INSTALLED not in OFFLOAD_RELEASES:
        return (
            f"--pillar-offload-host-gb serves SGLang {OFFLOAD_RELEASES[0]} through {OFFLOAD_RELEASES[-1]}, not the "
            f"installed {versions.INSTALLED}: 0.5.21 reworked the request KV bookkeeping it parks and restores"
        )
    algo = (server_args.speculative_algorithm or "").upper()
    layout = first_set(LAYOUT_FLAGS, server_args)
    checks = (
        (
            algo not in ("", ALGORITHM_NAME),
            f"--speculative-algorithm {algo} (offload serves PILLAR and stock decoding)",
        ),
        ((server_args.page_size or 1) != 1, "--page-size other than 1"),
        (server_args.enable_hierarchical_cache, "--enable-hierarchical-cache (HiCache owns the host KV pool)"),
        (server_args.enable_dp_attention, "--enable-dp-attention"),
        (server_args.pp_size > 1, "--pp-size > 1"),
        # The ranks' ledgers agree (a MIN all-reduce of completed copies, tp_agree.min_over_tp_group),
        # but parking under tensor parallelism has not been measured on several GPUs yet.
        (server_args.tp_size > 1, "--tp-size > 1 (refused until measured on several GPUs)"),
        (server_args.disaggregation_mode != "null", "--disaggregation-mode (PD has its own KV offload)"),
        # Its event loop never asks for the next batch, where parked requests are restored: they would stay on host.
        (getattr(server_args, "enable_pdmux", False), "--enable-pdmux"),
        (layout is not None, f"{layout} (the host copies read one layer's rows a slot)"),
        (
            server_args.kv_cache_dtype not in HALF_KV_CACHE_DTYPES,
            f"--kv-cache-dtype {server_args.kv_cache_dtype} (the host copies move unscaled 16-bit rows)",
        ),
    )
    reasons = [why for bad, why in checks if bad]
    return None if not reasons else f"--pillar-offload-host-gb does not support {'; '.join(reasons)}"


def host_memory_gap(host_gb: float, server_args) -> str | None:
    """Why this host cannot pin ``host_gb`` for each of its scheduler processes (one line), or None: SGLang's host
    pool checks only once the model is loaded, and names its own hierarchical cache's flag."""
    per_node = max(1, server_args.dp_size // max(1, server_args.nnodes))  # one offload pool a replica
    free_gb = psutil.virtual_memory().available / 1e9
    if host_gb * per_node <= free_gb:
        return None
    return (
        f"--pillar-offload-host-gb {host_gb:g} x {per_node} scheduler process(es) asks for more pinned host memory "
        f"than this host has free ({free_gb:.1f} GB)"
    )


class CudaKVMover:
    """Copies token KV between the device pool and a pinned ``MHATokenToKVPoolHost``."""

    def __init__(self, device_pool, host_gb: float, forward_stream_of) -> None:
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
        from sglang.srt.mem_cache.pool_host.mha import get_mha_host_pool_cls

        # Exactly SGLang's plain pool: its subclasses lay a slot out otherwise (page-major: every layer's K and V in one
        # slot; FP4 / MXFP8: packed rows and scale buffers) than the host pool's per-layer copy kernels read it.
        if type(device_pool) is not MHATokenToKVPool:
            raise TypeError(
                f"--pillar-offload-host-gb needs SGLang's plain 16-bit MHA KV pool (got {type(device_pool).__name__}: "
                "MLA, hybrid, sliding-window models, page-major layouts and quantized KV caches are not supported)"
            )
        self.device_pool = device_pool
        try:
            self.host_pool = get_mha_host_pool_cls(device_pool)(
                device_pool, 0.0, host_gb, 1, "layer_first", pin_memory=True, device="cpu", pool_label="offload"
            )
        except ValueError as exc:  # SGLang's free-memory check, whose hint names its hierarchical cache
            raise ValueError(f"--pillar-offload-host-gb {host_gb:g}: {exc} (lower --pillar-offload-host-gb)") from None
        self.bytes_per_token = self.host_pool.size_per_token
        self.stream = torch.cuda.Stream()
        self._forward_stream_of = forward_stream_of  # () -> the stream forwards run on

    def drain(self) -> None:
        """Wait for every copy queued so far (a failed copy's slots are returned only after its queued part ran)."""
        self.stream.synchronize()

    def _begin(self) -> None:
        self.stream.wait_stream(torch.cuda.current_stream())
        forward = self._forward_stream_of()
        if forward is not None:
            self.stream.wait_stream(forward)

    def to_host(self, device_slots: torch.Tensor, host_slots: torch.Tensor) -> torch.cuda.Event:
        self._begin()
        with torch.cuda.stream(self.stream):
            host_idx = host_slots.to(self.device_pool.device, non_blocking=True)
            self.host_pool.backup_from_device_all_layer(self.device_pool, host_idx, device_slots, "kernel")
            done = torch.cuda.Event()
            done.record()
        device_slots.record_stream(self.stream)
        return done

    def to_device(self, host_slots: torch.Tensor, device_slots: torch.Tensor) -> torch.cuda.Event:
        """Copy back; the current stream (and so the next forward) waits for the returned event."""
        self._begin()
        with torch.cuda.stream(self.stream):
            host_idx = host_slots.to(self.device_pool.device, non_blocking=True)
            for layer in range(self.device_pool.layer_num):
                self.host_pool.load_to_device_per_layer(self.device_pool, host_idx, device_slots, layer, "kernel")
            done = torch.cuda.Event()
            done.record()
        device_slots.record_stream(self.stream)
        torch.cuda.current_stream().wait_event(done)
        return done
