"""A closed-loop run's schedule, rebuilt from its per-request latencies, and its full-batch rate.

bench_serving (request rate inf, ``--max-concurrency C``) sends its requests in order and starts the next
one whenever one finishes, so request i >= C starts at the (i - C + 1)-th completion. From the end-to-end
latencies in request order (``per_request`` of a ``benchmarks.throughput`` run) that gives every request's
start; rebuilt that way the run's end matched the measured duration to 0.1 s on the e058028 runs.

Fixed-length requests make such a run end in a drain: once the last request has started, slots empty
one by one. Stock decodes every request at one pace, so its requests end together and the drain is
short. Speculation gives each request its own pace (its acceptance), so PILLAR's run ends with a long
drain whose length depends on how many waves the run has. The full-batch rate is the output tokens per
second from the start to the last request's start, while every slot is busy. It is what a server
under steady load sustains. Each request's tokens in that window are counted pro rata of its decode
time (TTFT to end), an estimate: a request decoding faster early in its life (short context, plain
rounds) is undercounted.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

# The rebuilt end must match the measured duration this closely, or the order assumption failed.
END_TOLERANCE = 0.02


def rebuild_starts(e2e_s: Sequence[float], concurrency: int) -> list[float]:
    """Each request's start (s from the run's start): the first ``concurrency`` at 0, then each at the
    earliest end among the requests in flight."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    ends: list[float] = []
    starts = []
    for i, e in enumerate(e2e_s):
        start = 0.0 if i < concurrency else heapq.heappop(ends)
        starts.append(start)
        heapq.heappush(ends, start + e)
    return starts


def full_batch_rate(
    e2e_s: Sequence[float], ttft_s: Sequence[float], output_len: Sequence[int], concurrency: int, duration_s: float
) -> float | None:
    """Output tokens per second until the last request starts (every slot busy), or None where the run
    has no such window (one wave) or its rebuilt end misses ``duration_s`` (the order assumption failed)."""
    if not len(e2e_s) == len(ttft_s) == len(output_len) or len(e2e_s) <= concurrency:
        return None
    starts = rebuild_starts(e2e_s, concurrency)
    end = max(s + e for s, e in zip(starts, e2e_s))
    if abs(end - duration_s) > END_TOLERANCE * duration_s:
        return None
    window = starts[-1]
    if window <= 0.0:
        return None
    tokens = 0.0
    for start, e2e, ttft, n in zip(starts, e2e_s, ttft_s, output_len):
        first, last = start + ttft, start + e2e
        if last > first:
            tokens += n * max(0.0, min(last, window) - first) / (last - first)
    return tokens / window


def wave_pace_ms(
    e2e_s: Sequence[float], ttft_s: Sequence[float], output_len: Sequence[int], concurrency: int
) -> list[float]:
    """Mean decode ms per output token (TPOT: (E2E - TTFT) / (tokens - 1)) of each wave, the requests
    i * concurrency .. (i + 1) * concurrency - 1 in start order (the last wave may be partial). The first
    wave starts together; later waves start as slots free, so their batch mixes contexts; the last wave
    also decodes through the drain, in an emptying batch. ``wave_context`` tells what context each wave's
    requests decoded beside."""
    if concurrency < 1 or not len(e2e_s) == len(ttft_s) == len(output_len):
        raise ValueError(f"per-request lists of one length and concurrency >= 1, got {concurrency}")
    paces = []
    for first in range(0, len(e2e_s), concurrency):
        wave = [
            (e2e - ttft) * 1000.0 / (n - 1)
            for e2e, ttft, n in zip(
                e2e_s[first : first + concurrency],
                ttft_s[first : first + concurrency],
                output_len[first : first + concurrency],
            )
            if n > 1
        ]
        if wave:
            paces.append(sum(wave) / len(wave))
    return paces


def wave_context(
    e2e_s: Sequence[float], ttft_s: Sequence[float], output_len: Sequence[int], concurrency: int
) -> list[float]:
    """Per wave (as ``wave_pace_ms``): the batch's mean context its requests decoded beside, averaged over
    each request's decode time, then over the wave. A request's context grows linearly from 0 at its first
    token to its length at its end (output tokens only: the prompts add a constant), starts as
    ``rebuild_starts`` gives them. Requests that decode at one pace (stock) keep every wave's batch at the
    same mean; requests at their own paces (speculation) give the first wave a younger batch: its fast
    requests end while everyone is still early in their outputs, and a round costs more as contexts grow.

    Exact, in O(R log R): between consecutive first-token and end times the batch is fixed and its summed
    context linear in t, so the batch mean integrates in closed form per segment."""
    if concurrency < 1 or not len(e2e_s) == len(ttft_s) == len(output_len):
        raise ValueError(f"per-request lists of one length and concurrency >= 1, got {concurrency}")
    starts = rebuild_starts(e2e_s, concurrency)
    spans = [(s + f, s + e, n) for s, e, f, n in zip(starts, e2e_s, ttft_s, output_len)]
    # Events: (time, +1 at a first token / -1 at an end, request), ends first at equal times.
    events = sorted((t, sign, i) for i, (a, b, _) in enumerate(spans) if b > a for t, sign in ((a, 1), (b, -1)))
    integral = []  # integral[k]: the batch mean's integral from the first event to event k
    at: dict[int, list[int]] = {}  # each request's (first token, end) event positions
    alive, offset, slope = 0, 0.0, 0.0  # the batch's summed context = offset + slope * t
    total, prev = 0.0, 0.0
    for k, (t, sign, i) in enumerate(events):
        if alive:  # nobody decodes before the first event, so prev's start value never counts
            total += (offset * (t - prev) + slope * (t * t - prev * prev) / 2) / alive
        integral.append(total)
        prev = t
        a, b, n = spans[i]
        rate = n / (b - a)
        alive += sign
        offset -= sign * rate * a
        slope += sign * rate
        at.setdefault(i, [0, 0])[0 if sign > 0 else 1] = k
    seen = {i: (integral[hi] - integral[lo]) / (spans[i][1] - spans[i][0]) for i, (lo, hi) in at.items()}
    waves = []
    for first in range(0, len(spans), concurrency):
        wave = [seen[i] for i in range(first, min(first + concurrency, len(spans))) if i in seen]
        if wave:
            waves.append(sum(wave) / len(wave))
    return waves
