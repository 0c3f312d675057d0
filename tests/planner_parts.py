"""Stand-ins for what the round planner (``patches/round_plan.py``) reads of a GPU and a batch."""

from __future__ import annotations

from types import SimpleNamespace


class DoneEvent:
    """A CUDA event that has always completed, 1 ms after any other."""

    def record(self) -> None: ...

    def query(self) -> bool:
        return True

    def elapsed_time(self, end) -> float:
        return 1.0


def plain_sampling() -> SimpleNamespace:
    """A batch's sampling info without penalties, min_new_tokens or custom processors, as the overlap
    scheduler hands it to the worker (orchestrator dropped, no penalty rows)."""
    return SimpleNamespace(
        has_custom_logit_processor=False,
        acc_additive_penalties=None,
        acc_scaling_penalties=None,
        penalizer_orchestrator=None,
    )
