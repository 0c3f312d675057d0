"""``Scheduler.init_metrics_reporter``: PILLAR's counters on SGLang's Prometheus endpoint.

With ``--enable-metrics`` SGLang already exports ``sglang:spec_accept_length`` (tokens per verify
round, plain rounds included) and ``sglang:spec_accept_rate`` for PILLAR: both come from the
scheduler's own result processing of every speculative round. The rate divides by
``speculative_num_draft_tokens - 1`` drafts per round, which adaptive speculation does not always
run; the series below count what each round drafted. They are created in the scheduler process
as SGLang's ``SchedulerMetricsCollector`` creates its own (prometheus_client, imported after
SGLang set PROMETHEUS_MULTIPROC_DIR, the scheduler collector's labels), so the HTTP server's
``/metrics`` aggregates them. Names follow vLLM's speculative-decoding counters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PREFIX = "sglang:pillar_"
# Round phases on SmolLM2-135M at 1-256 requests take 0.5-40 ms; Qwen3-class models up to ~0.3 s.
TIME_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5)


class PrometheusSink:
    """``sglang_sparsespec.metrics.MetricsSink`` on prometheus_client (counters, histograms)."""

    def __init__(self, labels: dict[str, Any], registry: Any = None) -> None:
        from prometheus_client import REGISTRY, Counter, Histogram

        reg = REGISTRY if registry is None else registry
        names = list(labels)
        self.labels = labels

        def counter(name: str, doc: str, extra: Sequence[str] = ()) -> Any:
            return Counter(PREFIX + name, doc, labelnames=[*names, *extra], registry=reg)

        def histogram(name: str, doc: str, extra: Sequence[str] = ()) -> Any:
            return Histogram(PREFIX + name, doc, labelnames=[*names, *extra], buckets=TIME_BUCKETS, registry=reg)

        self.rounds = counter(
            "rounds", "Decode rounds by draft count (0 = plain decoding; adaptive speculation).", ["steps"]
        )
        self.drafts = counter("num_drafts", "Requests' draft runs (one per request per round with drafts).")
        self.draft_tokens = counter("num_draft_tokens", "Drafted tokens.")
        self.accepted = counter("num_accepted_tokens", "Accepted drafted tokens (bonus tokens not included).")
        self.per_pos = counter("num_accepted_tokens_per_pos", "Drafts accepted up to this position.", ["position"])
        self.draft_time = histogram("draft_seconds", "GPU time of a round's draft steps.")
        self.verify_time = histogram("verify_seconds", "GPU time of a round's verify, acceptance and selection.")
        self.phase_time = histogram(
            "phase_seconds", "Mean GPU time per round of one phase (SPARSESPEC_STEP_TIMING reports).", ["phase"]
        )

    def round_started(self, steps: int) -> None:
        self.rounds.labels(**self.labels, steps=str(steps)).inc()

    def drafts_verified(self, drafts: int, draft_tokens: int, accepted: int, accepted_per_pos: Sequence[int]) -> None:
        self.drafts.labels(**self.labels).inc(drafts)
        self.draft_tokens.labels(**self.labels).inc(draft_tokens)
        self.accepted.labels(**self.labels).inc(accepted)
        for position, n in enumerate(accepted_per_pos):
            self.per_pos.labels(**self.labels, position=str(position)).inc(n)

    def round_timed(self, draft_s: float, verify_s: float) -> None:
        self.draft_time.labels(**self.labels).observe(draft_s)
        self.verify_time.labels(**self.labels).observe(verify_s)

    def phases_timed(self, phase_s: dict[str, float]) -> None:
        for phase, seconds in phase_s.items():
            self.phase_time.labels(**self.labels, phase=phase).observe(seconds)


def attach_prometheus(result, scheduler, *args, **kwargs):
    """After SGLang built its metrics reporter: give the PILLAR worker's metrics a Prometheus sink."""
    metrics = getattr(getattr(scheduler, "draft_worker", None), "metrics", None)
    collector = getattr(scheduler, "metrics_collector", None)
    if metrics is not None and collector is not None and metrics.sink is None:
        metrics.sink = PrometheusSink(dict(collector.labels))
    return result
