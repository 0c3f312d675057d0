"""FlashInfer's JIT modules built ahead of time for an offline sm_90 node, then installed and checked there.

    # CPU, with nvcc and FlashInfer's package importable (the GPU bundle's wheel, installed with --target):
    python -m tools.flashinfer_aot build --out .gpubundle/fiaot
    # the GPU node, before any server starts:
    python -m tools.flashinfer_aot install --src .gpubundle/fiaot

FlashInfer compiles a module the first time a process asks for it. On a bare GPU node that is a server start's
largest single cost: 100 s for the sampling module in PILLAR's first start and 130-280 s of attention modules in
stock FlashInfer's (the server logs of steps_qwen3-1.7b_h200_dbf05cb / steps_qwen3-8b_h200_dbf05cb), time paid
again on every fresh machine. FlashInfer first looks for a module in its package's
``data/aot/<name>/<name>.so`` and compiles only when that is missing. ``build`` compiles the modules the
benchmarks' servers ask for (sampling; batch decode, and fa2 / fa3 prefill, bf16, head dims 128 for Qwen3 and 64
for SmolLM2) with FlashInfer's own build rules for sm_90a. ``install`` copies each into FlashInfer's package and
runs it once on the GPU against torch (a decode, a causal prefill, top-1 sampling); a module that fails to load or
disagrees is removed again, so FlashInfer compiles it as before. It prints each module's seconds: a check that
took a minute compiled instead of loading.
"""

from __future__ import annotations

import argparse
import itertools
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ARCH = "9.0a"  # H100 / H200; FlashInfer's fa3 kernels need the a-suffixed target


@dataclass(frozen=True)
class Module:
    """``spec``: FlashInfer's JitSpec of the module; ``check``: raises unless the module computes as torch does."""

    key: str
    spec: Callable[[], Any]
    check: Callable[[], None]


def _decode_spec(head_dim: int) -> Any:
    import torch
    from flashinfer.jit.attention.modules import gen_batch_decode_module

    bf = torch.bfloat16
    return gen_batch_decode_module(bf, bf, bf, torch.int32, head_dim, head_dim, 0, False, False)


def _prefill_spec(backend: str, head_dim: int) -> Any:
    import torch
    from flashinfer.jit.attention.modules import gen_batch_prefill_module

    bf = torch.bfloat16
    return gen_batch_prefill_module(backend, bf, bf, bf, torch.int32, head_dim, head_dim, 0, False, False, False)


def _sampling_spec() -> Any:
    from flashinfer.jit.sampling import gen_sampling_module

    return gen_sampling_module()


def _segments(lens: list[int], dev: Any) -> tuple[Any, list[tuple[int, int]]]:
    """The indptr [len(lens) + 1] int32 of rows of these lengths laid end to end, and each row's (start, end)."""
    import torch

    bounds = [0, *torch.tensor(lens).cumsum(0).tolist()]
    return torch.tensor(bounds, dtype=torch.int32, device=dev), list(itertools.pairwise(bounds))


def _reference(q: Any, k: Any, v: Any, causal: bool) -> Any:
    """Attention of q [n, Hq, D] over k, v [L, Hkv, D] in fp32, the query rows the last n of L when causal."""
    import torch

    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    scores = torch.einsum("nhd,lhd->hnl", q.float(), k) * q.shape[-1] ** -0.5
    if causal:
        n, length = q.shape[0], k.shape[0]
        rows = torch.arange(length - n, length, device=q.device)[:, None]
        scores = scores.masked_fill(torch.arange(length, device=q.device)[None, :] > rows, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), v)


def _check_decode(head_dim: int, group: int, tensor_cores: bool) -> None:
    import flashinfer
    import torch

    lens, h_kv = [5, 17, 33, 64], 2
    dev, bf = torch.device("cuda"), torch.bfloat16
    k, v = (torch.randn(sum(lens), h_kv, head_dim, device=dev, dtype=bf) for _ in "kv")
    q = torch.randn(len(lens), h_kv * group, head_dim, device=dev, dtype=bf)
    indptr, rows = _segments(lens, dev)
    work = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(work, "NHD", use_tensor_cores=tensor_cores)
    ones = torch.ones(len(lens), dtype=torch.int32, device=dev)
    wrapper.plan(indptr, torch.arange(sum(lens), dtype=torch.int32, device=dev), ones, h_kv * group, h_kv, head_dim,
                 1, q_data_type=bf, kv_data_type=bf)  # fmt: skip
    out = wrapper.run(q, (k.unsqueeze(1), v.unsqueeze(1)))  # page size 1: [pages, 1, H_kv, D]
    for b, (lo, hi) in enumerate(rows):
        ref = _reference(q[b : b + 1], k[lo:hi], v[lo:hi], causal=False)
        torch.testing.assert_close(out[b : b + 1].float(), ref, atol=2e-2, rtol=2e-2)


def _check_prefill(backend: str, head_dim: int) -> None:
    import flashinfer
    import torch

    lens, h_kv, group = [3, 9, 40], 2, 4
    dev, bf = torch.device("cuda"), torch.bfloat16
    q = torch.randn(sum(lens), h_kv * group, head_dim, device=dev, dtype=bf)
    k, v = (torch.randn(sum(lens), h_kv, head_dim, device=dev, dtype=bf) for _ in "kv")
    indptr, rows = _segments(lens, dev)
    work = torch.empty(64 << 20, dtype=torch.uint8, device=dev)
    wrapper = flashinfer.BatchPrefillWithRaggedKVCacheWrapper(work, "NHD", backend=backend)
    wrapper.plan(indptr, indptr, h_kv * group, h_kv, head_dim, causal=True, q_data_type=bf, kv_data_type=bf)
    out = wrapper.run(q, k, v)
    for lo, hi in rows:
        ref = _reference(q[lo:hi], k[lo:hi], v[lo:hi], causal=True)
        torch.testing.assert_close(out[lo:hi].float(), ref, atol=2e-2, rtol=2e-2)


def _check_sampling() -> None:
    import flashinfer
    import torch

    probs = torch.randn(16, 151936, device="cuda").softmax(-1)
    picked = flashinfer.sampling.top_k_sampling_from_probs(probs, 1)
    if not torch.equal(picked.long(), probs.argmax(-1)):
        raise AssertionError("top-1 sampling is not the argmax")


MODULES: tuple[Module, ...] = (
    Module("sampling", _sampling_spec, _check_sampling),
    # Qwen3: decode without tensor cores at 2 query heads a KV head (1.7B), with them (fa2's prefill kernel) from 4
    # (8B) and in the paged prefill; the ragged prefill through fa3 on sm_90
    Module("decode128", lambda: _decode_spec(128), lambda: _check_decode(128, 2, tensor_cores=False)),
    Module("fa2_128", lambda: _prefill_spec("fa2", 128), lambda: _check_decode(128, 4, tensor_cores=True)),
    Module("fa3_128", lambda: _prefill_spec("fa3", 128), lambda: _check_prefill("fa3", 128)),
    # SmolLM2-135M: 3 query heads a KV head, head dim 64
    Module("decode64", lambda: _decode_spec(64), lambda: _check_decode(64, 3, tensor_cores=False)),
    Module("fa2_64", lambda: _prefill_spec("fa2", 64), lambda: _check_prefill("fa2", 64)),
    Module("fa3_64", lambda: _prefill_spec("fa3", 64), lambda: _check_prefill("fa3", 64)),
)


def _build_environment(stub_dir: Path) -> None:
    """FlashInfer's build settings for sm_90a on a machine without a GPU: the target, curand's headers from the
    CUDA 13 wheel beside torch when the toolkit lacks them, and an empty libcuda to link against (no module here
    calls the driver API; the node's driver provides the library at load)."""
    os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", ARCH)
    subprocess.run(["gcc", "-shared", "-fPIC", "-x", "c", "/dev/null", "-o", str(stub_dir / "libcuda.so"),
                    "-Wl,-soname,libcuda.so.1"], check=True)  # fmt: skip
    os.environ["FLASHINFER_EXTRA_LDFLAGS"] = f"{os.environ.get('FLASHINFER_EXTRA_LDFLAGS', '')} -L{stub_dir}"
    try:
        import nvidia.cu13

        include = Path(nvidia.cu13.__path__[0]) / "include"
        os.environ["FLASHINFER_EXTRA_CUDAFLAGS"] = (
            f"{os.environ.get('FLASHINFER_EXTRA_CUDAFLAGS', '')} -isystem {include}"
        )
    except ImportError:
        pass  # the toolkit's own headers then have to hold curand's


def build(out: Path, modules: tuple[Module, ...] = MODULES) -> None:
    """Compile ``modules`` and copy each library to out/<name>/<name>.so (FlashInfer's AOT layout)."""
    with tempfile.TemporaryDirectory() as stub_dir:
        _build_environment(Path(stub_dir))
        for module in modules:
            spec, start = module.spec(), time.monotonic()
            spec.build(verbose=False)
            (out / spec.name).mkdir(parents=True, exist_ok=True)
            shutil.copy2(spec.jit_library_path, out / spec.name / f"{spec.name}.so")
            print(f"{module.key}: {spec.name} built in {time.monotonic() - start:.0f} s", flush=True)


def install(src: Path, dst: Path, modules: tuple[Module, ...] = MODULES) -> dict[str, str]:
    """Copy each module found under ``src`` into ``dst`` (FlashInfer's data/aot) and run its check; a module whose
    check raises is removed from ``dst``. Returns each module's outcome by key."""
    outcome: dict[str, str] = {}
    for module in modules:
        name = module.spec().name
        if not (src / name / f"{name}.so").is_file():
            outcome[module.key] = "not built"
            continue
        shutil.copytree(src / name, dst / name, dirs_exist_ok=True)
        start = time.monotonic()
        try:
            module.check()
            outcome[module.key] = f"checked in {time.monotonic() - start:.1f} s"
        except Exception as e:  # noqa: BLE001 - any failure means FlashInfer must compile this one itself
            shutil.rmtree(dst / name)
            outcome[module.key] = f"removed ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
    return outcome


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("build").add_argument("--out", type=Path, required=True)
    sub.add_parser("install").add_argument("--src", type=Path, required=True)
    args = p.parse_args()
    if args.command == "build":
        build(args.out)
        return
    from flashinfer.jit import env

    for key, result in install(args.src, env.FLASHINFER_AOT_DIR).items():
        print(f"{key}: {result}", flush=True)


if __name__ == "__main__":
    main()
