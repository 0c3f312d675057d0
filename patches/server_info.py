"""``Scheduler.get_internal_state``: PILLAR's live numbers in ``/server_info``.

SGLang's server info carries ``avg_spec_accept_length`` but nothing a plugin worker knows; the
adaptive policy's path counts (how many rounds ran each draft count, 0 = plain decoding) and its
acceptance estimate are added to the scheduler's internal state under the key ``pillar``.
"""

from __future__ import annotations


def add_pillar_state(result, scheduler, *args, **kwargs):
    summary = getattr(getattr(scheduler, "draft_worker", None), "summary", None)
    state = getattr(result, "internal_state", None)
    if callable(summary) and isinstance(state, dict):
        state["pillar"] = summary()
    return result
