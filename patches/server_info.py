"""``Scheduler.get_internal_state``: PILLAR's live numbers in ``/server_info``.

SGLang's server info carries ``avg_spec_accept_length`` but nothing a plugin worker knows; the
adaptive policy's path counts (how many rounds ran each draft count, 0 = plain decoding) and its
acceptance estimate are added to the scheduler's internal state under the key ``pillar``, with
the round counters and timings that also go to Prometheus (``sglang_sparsespec.metrics``) under
``pillar.metrics``.
"""

from __future__ import annotations


def add_pillar_state(result, scheduler, *args, **kwargs):
    worker = getattr(scheduler, "draft_worker", None)
    summary = getattr(worker, "summary", None)
    state = getattr(result, "internal_state", None)
    if callable(summary) and isinstance(state, dict):
        state["pillar"] = summary()
        state["pillar"]["metrics"] = worker.metrics.summary()
    return result
