"""Which SGLang releases the plugin serves, and which one is installed.

Every hook (``Hook.versions``) and every signature in ``signatures.py`` was checked against the
released wheels of these versions; where SGLang changed between them, ``contacts.py`` holds the one
adapter per changed contact, so release comparisons live here and there only.
"""

from __future__ import annotations

import importlib.metadata
from typing import TypeVar

from packaging.version import Version

T = TypeVar("T")

SUPPORTED: tuple[str, ...] = ("0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
# The release the GPU measurements ran on: the GPU machines ship torch 2.11, which 0.5.17 pins; 0.5.18-0.5.21
# pin torch 2.13.0 and 0.5.22-0.5.23 torch 2.14.1.
MEASURED_ON_GPU = "0.5.17"
SUPPORTED_RANGE = f"{SUPPORTED[0]} through {SUPPORTED[-1]}"


def release(version: str) -> tuple[int, ...]:
    """``"0.5.19"`` -> ``(0, 5, 19)`` (pre-, post- and dev-release suffixes dropped)."""
    return Version(version).release


def releases(first: str = SUPPORTED[0], last: str = SUPPORTED[-1]) -> tuple[str, ...]:
    """The supported releases from ``first`` through ``last``."""
    return tuple(v for v in SUPPORTED if release(first) <= release(v) <= release(last))


def installed() -> str:
    return importlib.metadata.version("sglang")


# Read through the functions below at call time (tests set it to exercise the adapters of another release).
INSTALLED = installed()


def since(version: str, of: str | None = None) -> bool:
    """Whether SGLang ``of`` (default: the installed one) is ``version`` or newer."""
    return release(of or INSTALLED) >= release(version)


def out_of_range(version: str | None = None) -> str | None:
    """None for a supported release; else the one line that says so."""
    version = version or INSTALLED
    if version in SUPPORTED:
        return None
    return (
        f"sglang-sparsespec serves SGLang {SUPPORTED_RANGE} (its hooks were checked against those releases); "
        f"installed: sglang {version} (pip install 'sglang>={SUPPORTED[0]},<={SUPPORTED[-1]}')"
    )


def for_release(changes: dict[str, T], version: str | None = None) -> T:
    """The value in force at ``version`` (default: the installed release) of something that changed at
    the releases keyed: each key is the first release of its value (``{"0.5.17": old, "0.5.23": new}``).
    A release older than every key gets the oldest value (out of range, it is refused at launch anyway)."""
    known = [v for v in changes if release(v) <= release(version or INSTALLED)] or [min(changes, key=release)]
    return changes[max(known, key=release)]
