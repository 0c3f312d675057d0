"""PILLAR's round counters (sglang_sparsespec/metrics.py) and their Prometheus series (patches/metrics.py).

The last test runs on a GPU only (CUDA and SPARSESPEC_TEST_MODEL, a model folder such as the one
``python -m sglang_sparsespec.models.smollm2`` prints): it starts a PILLAR server with
``--enable-metrics``, sends a few requests and scrapes ``/metrics`` and ``/server_info``.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_sparsespec.metrics import PillarMetrics
from sglang_sparsespec.rounds.clock import RoundSample
from sglang_sparsespec.rounds.launch import LaunchedRounds
from sglang_sparsespec.rounds.timing import PhaseReport

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
LABELS = {"model_name": "m", "engine_type": "unified", "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}


class RecordingSink:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def round_started(self, steps):
        self.calls.append(("round", steps))

    def drafts_verified(self, drafts, draft_tokens, accepted, accepted_per_pos):
        self.calls.append(("drafts", drafts, draft_tokens, accepted, list(accepted_per_pos)))

    def round_timed(self, draft_s, verify_s):
        self.calls.append(("time", draft_s, verify_s))

    def phases_timed(self, phase_s):
        self.calls.append(("phases", phase_s))


class Fed:
    """PillarMetrics fed as the worker feeds it: each launched round joins the launch queue, and the
    queue's match for each accept-count report goes to ``completed``."""

    def __init__(self, metrics: PillarMetrics) -> None:
        self.metrics, self.rounds = metrics, LaunchedRounds()

    def launched(self, steps: int, batch_size: int) -> None:
        self.metrics.launched(steps, batch_size)
        self.rounds.launched(steps, batch_size)

    def completed(self, correct: list[int]) -> None:
        self.metrics.completed(self.rounds.completed(correct))


def test_rounds_are_matched_with_their_accept_counts_in_launch_order():
    sink = RecordingSink()
    m = PillarMetrics(4, sink=sink)
    fed = Fed(m)
    fed.launched(4, 3)
    fed.launched(0, 2)  # plain round: no drafts
    fed.launched(2, 2)
    fed.completed([4, 0, 2])
    fed.completed([0, 0])
    fed.completed([2, 5])  # a 2-draft round whose greedy verify matched past its drafts: capped at 2
    assert m.rounds_by_steps == {4: 1, 0: 1, 2: 1}
    assert (m.drafts, m.draft_tokens, m.accepted_tokens) == (5, 16, 10)
    assert m.accepted_per_pos == [4, 4, 1, 1] and sum(m.accepted_per_pos) == m.accepted_tokens
    assert sink.calls == [
        ("round", 4),
        ("round", 0),
        ("round", 2),
        ("drafts", 3, 12, 6, [2, 2, 1, 1]),
        ("drafts", 2, 4, 4, [2, 2]),
    ]
    s = m.summary()
    assert s["rounds_by_steps"] == {"0": 1, "2": 1, "4": 1} and s["acceptance_rate"] == 10 / 16


def test_a_round_out_of_step_resynchronises_and_idle_batches_count_nothing():
    m = PillarMetrics(4)
    fed = Fed(m)
    fed.launched(4, 0)  # idle batch
    fed.launched(4, 2)
    fed.launched(4, 3)
    fed.completed([1, 1, 1])  # does not match the oldest round (2 requests): both pending rounds dropped
    fed.completed([1, 1])  # nothing pending
    fed.launched(4, 1)
    fed.completed([3])
    assert (m.drafts, m.accepted_tokens, m.accepted_per_pos) == (1, 3, [1, 1, 1, 0])
    with pytest.raises(ValueError, match="0..4"):
        fed.launched(5, 1)


def test_times_from_the_round_clock_and_the_step_timer():
    sink = RecordingSink()
    m = PillarMetrics(8, sink=sink)
    m.rounds_timed([RoundSample((8, 20), 8, 20.0, 22.0, 0.5), RoundSample((8, 20), 0, 0.0, 6.0, None)])
    m.phases_timed(PhaseReport(rounds=10, batch=8.0, ms={"draft": 20.0, "verify": 18.0, "accept": 3.0, "select": 1.0}))
    s = m.summary()
    assert s["mean_draft_ms"] == 10.0 and s["mean_verify_ms"] == 14.0 and s["last_phase_ms"]["select"] == 1.0
    assert sink.calls[:2] == [("time", 0.02, 0.022), ("time", 0.0, 0.006)]
    assert sink.calls[2] == ("phases", {"draft": 0.02, "verify": 0.018, "accept": 0.003, "select": 0.001})


def _samples(text: str) -> dict[tuple[str, frozenset], float]:
    """Prometheus text -> {(name, labels): value} for PILLAR's and SGLang's speculative series."""
    out = {}
    for m in re.finditer(r"^(sglang:(?:pillar_|spec_accept_)\w+)\{(.*)\} (\S+)$", text, re.MULTILINE):
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        out[(m.group(1), labels)] = float(m.group(3))
    return out


def _value(samples, name: str, **labels: str) -> float:
    """The sum over the series of ``name`` whose labels include ``labels``."""
    want = set(labels.items())
    hits = [v for (n, lab), v in samples.items() if n == name and want <= lab]
    assert hits, (name, labels)
    return sum(hits)


def test_prometheus_series_names_labels_and_values():
    from prometheus_client import CollectorRegistry, generate_latest
    from sglang_sparsespec.patches.metrics import PrometheusSink

    reg = CollectorRegistry()
    m = PillarMetrics(4, sink=PrometheusSink(LABELS, registry=reg))
    fed = Fed(m)
    fed.launched(4, 2)
    fed.launched(0, 2)
    fed.completed([3, 1])
    fed.completed([0, 0])
    m.rounds_timed([RoundSample((2, 10), 4, 3.0, 4.0, None)])
    m.phases_timed(PhaseReport(rounds=4, batch=2.0, ms={"select": 0.7}))
    got = _samples(generate_latest(reg).decode())
    assert all(dict(lab)["model_name"] == "m" and dict(lab)["tp_rank"] == "0" for _, lab in got)
    assert _value(got, "sglang:pillar_num_drafts_total") == 2
    assert _value(got, "sglang:pillar_num_draft_tokens_total") == 8
    assert _value(got, "sglang:pillar_num_accepted_tokens_total") == 4
    per_pos = [_value(got, "sglang:pillar_num_accepted_tokens_per_pos_total", position=str(j)) for j in range(4)]
    assert per_pos == [2, 1, 1, 0]
    assert (
        _value(got, "sglang:pillar_rounds_total", steps="4")
        == _value(got, "sglang:pillar_rounds_total", steps="0")
        == 1
    )
    assert _value(got, "sglang:pillar_draft_seconds_count") == 1
    assert _value(got, "sglang:pillar_verify_seconds_sum") == pytest.approx(0.004)
    assert _value(got, "sglang:pillar_phase_seconds_sum", phase="select") == pytest.approx(0.0007)


def test_hook_attaches_a_sink_only_with_metrics_on(monkeypatch):
    import prometheus_client
    from sglang_sparsespec.patches.metrics import PrometheusSink, attach_prometheus

    monkeypatch.setattr(prometheus_client, "REGISTRY", prometheus_client.CollectorRegistry())
    off = SimpleNamespace(draft_worker=SimpleNamespace(metrics=PillarMetrics(2)), metrics_collector=None)
    attach_prometheus(None, off)
    assert off.draft_worker.metrics.sink is None
    on = SimpleNamespace(
        draft_worker=SimpleNamespace(metrics=PillarMetrics(2)), metrics_collector=SimpleNamespace(labels=LABELS)
    )
    attach_prometheus(None, on)
    assert isinstance(on.draft_worker.metrics.sink, PrometheusSink) and on.draft_worker.metrics.sink.labels == LABELS
    stock = SimpleNamespace(draft_worker=None, metrics_collector=SimpleNamespace(labels=LABELS))
    assert attach_prometheus("r", stock) == "r"


def test_the_scheduler_builds_its_metrics_reporter_after_the_worker():
    """The hook relies on this order in Scheduler.__init__ (SGLang 0.5.17)."""
    import inspect

    from sglang.srt.managers.scheduler import Scheduler

    src = inspect.getsource(Scheduler.__init__)
    assert src.index("self.init_model_worker()") < src.index("self.init_metrics_reporter(")


@pytest.mark.skipif(
    not torch.cuda.is_available() or not os.environ.get("SPARSESPEC_TEST_MODEL"),
    reason="needs CUDA and SPARSESPEC_TEST_MODEL (a model folder)",
)
def test_metrics_reach_prometheus_on_gpu(tmp_path):
    from benchmarks.server import Server, http_json, scheduler_state

    flags = [
        "--attention-backend",
        "triton",
        "--page-size",
        "1",
        "--speculative-algorithm",
        "PILLAR",
        "--speculative-num-steps",
        "8",
        "--enable-metrics",
        "--decode-log-interval",
        "1",
        "--context-length",
        "4096",
        "--mem-fraction-static",
        "0.6",
    ]
    model = os.environ["SPARSESPEC_TEST_MODEL"]
    with Server.sglang(model, flags, log_path=tmp_path / "server.log") as srv:
        srv.start(timeout_s=400)
        for temperature in (0.0, 0.6, 1.0, 0.0):
            body = {
                "text": "Count from one to twenty:",
                "sampling_params": {"max_new_tokens": 256, "temperature": temperature},
            }
            http_json(srv.base_url + "/generate", body, timeout=120)
        import time
        import urllib.request

        # The last round's accept counts reach the worker after its request has answered (the overlap
        # scheduler processes a round's result one step later): read both ends until they settle.
        for _ in range(20):
            with urllib.request.urlopen(srv.base_url + "/metrics", timeout=30) as r:
                text = r.read().decode()
            info = http_json(srv.base_url + "/server_info", timeout=30)
            got = _samples(text)
            pillar = scheduler_state(info)["pillar"]["metrics"]
            if pillar["drafts"] == _value(got, "sglang:pillar_num_drafts_total"):
                break
            time.sleep(0.5)
    drafts = _value(got, "sglang:pillar_num_drafts_total")
    tokens = _value(got, "sglang:pillar_num_draft_tokens_total")
    accepted = _value(got, "sglang:pillar_num_accepted_tokens_total")
    assert drafts > 0 and 0 < accepted <= tokens and _value(got, "sglang:pillar_draft_seconds_count") > 0
    per_pos = [_value(got, "sglang:pillar_num_accepted_tokens_per_pos_total", position=str(j)) for j in range(8)]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)
    assert _value(got, "sglang:pillar_rounds_total") > 0
    assert _value(got, "sglang:spec_accept_length") > 1.0 and 0.0 < _value(got, "sglang:spec_accept_rate") <= 1.0
    assert (pillar["drafts"], pillar["accepted_tokens"]) == (drafts, accepted)
