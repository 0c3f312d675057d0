"""``managers.utils.compute_num_reserved_tokens``: room for k+1 verify slots.

Stock SGLang reserves output slots for drafts only for EAGLE; PILLAR also writes k
draft tokens and a k+1-token verify past the committed length, so a request near the
context limit must keep that headroom or its ``req_to_token`` row overflows. Mixed-phase
iterations allocate k + 1 further slots (``alloc_reserve``), so they keep 2 (k + 1).
"""

from __future__ import annotations

from .alloc_reserve import mixed_phases
from .contacts import call_server_args
from .spec_algo import serves_pillar


def reserve_verify_window(original, *args, **kwargs):
    server_args = call_server_args(args, kwargs)  # its argument up to 0.5.17, the published config after
    if serves_pillar(server_args):
        window = server_args.speculative_num_draft_tokens
        return 2 * window if mixed_phases(server_args) else window
    return original(*args, **kwargs)
