"""Offload-aware KV: park running requests' KV on pinned host memory instead of retracting them.

SGLang-free bookkeeping (``ledger``) and victim choice (``policy``); the scheduler wiring is
``sglang_sparsespec.patches.offload`` and the design is in ``docs/offload.md``.
"""

from __future__ import annotations

from .ledger import Agree, Fence, HostSlots, OffloadLedger, OffloadStats, Parked, Where
from .policy import Candidate, choose_victims

__all__ = [
    "Agree",
    "Candidate",
    "Fence",
    "HostSlots",
    "OffloadLedger",
    "OffloadStats",
    "Parked",
    "Where",
    "choose_victims",
]
