"""Provenance recorded with every result file: device, date, code versions."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMIT_ENV = "SPARSESPEC_GIT_COMMIT"


def new_run_id() -> str:
    """UTC timestamp; pass the same ``--run-id`` to several invocations that belong to one comparison."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime())


def device_name() -> str:
    """GPU model as nvidia-smi reports it (the first GPU CUDA_VISIBLE_DEVICES names, else the first GPU),
    else torch's name, else 'cpu'."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    try:
        out = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=name,memory.total,driver_version",
                "--format=csv,noheader",
                *(["-i", visible] if visible else []),
            ],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout.strip()
        if out:
            return out.splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        import torch  # slow import, only when nvidia-smi is missing

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return "cpu"


def git_commit(repo: Path = REPO_ROOT) -> str:
    """$SPARSESPEC_GIT_COMMIT if set, else HEAD of ``repo``.

    The variable wins: the GPU node's copy of the tree may carry a stale .git whose HEAD is
    not the commit being measured, and whoever launches the job knows which one it is.
    """
    if os.environ.get(COMMIT_ENV):
        return os.environ[COMMIT_ENV]
    try:
        out = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return "unknown"


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


# Who ran a run, where and when: what a run kept from an earlier command's result file (``--resume``) carries.
PROVENANCE_KEYS = ("run_id", "date_utc", "device", "hostname", "git_commit", "sglang_version")


def provenance(meta: dict[str, Any]) -> dict[str, Any]:
    """The ``measured`` record of a run kept from an earlier result file whose ``meta`` is ``meta``."""
    return {k: meta.get(k) for k in PROVENANCE_KEYS}


def run_metadata(run_id: str) -> dict[str, str | None]:
    return {
        "run_id": run_id,
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": device_name(),
        # Which of the host's GPUs ran it (None: all visible), where several runs share a host at once.
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "hostname": platform.node(),
        "git_commit": git_commit(),
        "sglang_version": package_version("sglang"),
        "sglang_sparsespec_version": package_version("sglang-sparsespec"),
        "torch_version": package_version("torch"),
        "python": platform.python_version(),
    }
