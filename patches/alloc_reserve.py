"""``mem_cache.allocation_sizing.get_alloc_reserve_per_decode``: room for mixed-phase chains.

Spec v2 keeps every decoding request allocated to ``kv_committed_len + 2 (k + 1)``: the host's
committed length lags the GPU's by one round under the overlap scheduler, and a round writes up to
k + 1 slots past the GPU's. A mixed-phase chain (rounds/mixed.py) reaches further: after its verify a
request drafts on in the same iteration, up to 2k + 1 slots past the length the iteration started
with, so with the lag 3k + 2 past the host's: ``--pillar-batch-phases mixed`` reserves 3 (k + 1).
"""

from __future__ import annotations

from sglang_sparsespec.config import batch_phases
from sglang_sparsespec.modes import BatchPhases

from .contacts import call_server_args
from .spec_algo import serves_pillar


def mixed_phases(server_args) -> bool:
    """Whether ``server_args`` serve PILLAR with mixed-phase iterations (the knob from the environment
    the launcher exported, the same in every process)."""
    if not serves_pillar(server_args):
        return False
    return batch_phases() is BatchPhases.MIXED


def reserve_for_chains(original, *args, **kwargs):
    reserve = original(*args, **kwargs)
    if mixed_phases(call_server_args(args, kwargs)):
        return reserve * 3 // 2  # 2 (k + 1) -> 3 (k + 1)
    return reserve
