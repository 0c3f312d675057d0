"""Bad inputs that need other requests running while they are sent (``bad_inputs.Probe.live``).

A second request under a live rid, or an abort whose rid is a prefix of another live rid, can only
harm a request that runs. Each live body is sent streamed and its first event read (it is then
running), the probe is sent, and every live request is read to its end: it must finish by length,
or, for the rids the probe itself ends (``Probe.aborts``), by abort.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.checks.bad_inputs import GENERATE, Probe

Send = Callable[[str, Probe, float], "tuple[int | None, str]"]


def _events(resp: Any) -> Iterator[dict[str, Any]]:
    for line in resp:
        if line.startswith(b"data:") and line.strip() != b"data: [DONE]":
            yield json.loads(line[len(b"data:") :])


def finish_type(event: dict[str, Any] | None) -> str | None:
    """The finish reason's type of a stream's last event ("length", "abort", ...); None if it has none."""
    reason = ((event or {}).get("meta_info") or {}).get("finish_reason")
    return reason.get("type") if isinstance(reason, dict) else reason


def send_live_probe(base_url: str, probe: Probe, timeout: float, send: Send) -> tuple[int | None, str, list[str]]:
    """The probe's status and reply (from ``send``), and how each live request ended against what its
    client expects (empty: as expected)."""
    streams: list[tuple[str, Any, Iterator[dict[str, Any]], dict[str, Any] | None]] = []
    failures: list[str] = []
    status, reply = None, ""
    try:
        for body in probe.live:
            data = json.dumps(body).encode()
            req = urllib.request.Request(base_url + GENERATE, data=data, headers={"Content-Type": "application/json"})
            resp = urllib.request.urlopen(req, timeout=timeout)
            events = _events(resp)
            streams.append((body["rid"], resp, events, next(events, None)))
        status, reply = send(base_url, probe, timeout)
        for rid, _, events, last in streams:
            for last in events:  # noqa: B007 - the stream's last event is the one read
                pass
            want = "abort" if rid in probe.aborts else "length"
            if finish_type(last) != want:
                failures.append(f"live request {rid!r} ended with {finish_type(last)!r}, its client expected {want!r}")
    except (OSError, ValueError) as e:  # a live request refused or cut off
        failures.append(f"{type(e).__name__}: {e}"[:300])
    finally:
        for _, resp, _, _ in streams:
            resp.close()
    return status, reply, failures
