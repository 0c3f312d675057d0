"""The closed-loop schedule rebuilt from per-request latencies, and the full-batch rate read off it."""

from __future__ import annotations

import pytest

from benchmarks.schedule import full_batch_rate, rebuild_starts, wave_context, wave_pace_ms


def test_requests_start_in_order_as_slots_free() -> None:
    # Two slots: requests 0 and 1 start at once; request 2 takes the slot that frees first (request 1
    # ends at 3 s), request 3 the next end (request 2 at 3 + 1 = 4 s), request 4 the next (request 0 at 5 s).
    assert rebuild_starts([5.0, 3.0, 1.0, 2.0, 4.0], 2) == [0.0, 0.0, 3.0, 4.0, 5.0]
    with pytest.raises(ValueError, match="concurrency"):
        rebuild_starts([1.0], 0)


def test_lockstep_requests_sustain_the_whole_first_wave() -> None:
    # Stock's shape: every request 10 s (1 s prefill), 90 tokens; two waves of two. The second wave starts
    # at 10 s; until then both slots decode 90 tokens each over 9 s.
    e2e, ttft, n = [10.0] * 4, [1.0] * 4, [90] * 4
    assert full_batch_rate(e2e, ttft, n, 2, duration_s=20.0) == pytest.approx(180 / 10)


def test_uneven_requests_count_the_tokens_before_the_last_start() -> None:
    # Request 2 starts when request 0 ends (4 s), request 3 when request 1 ends (8 s): the window is 8 s.
    # Tokens by then: request 0 all 40, request 1 all 80, request 2 (4-10 s) 4/6 of 60 = 40, request 3 none.
    e2e, ttft, n = [4.0, 8.0, 6.0, 2.0], [0.0] * 4, [40, 80, 60, 20]
    assert rebuild_starts(e2e, 2) == [0.0, 0.0, 4.0, 8.0]
    assert full_batch_rate(e2e, ttft, n, 2, duration_s=10.0) == pytest.approx((40 + 80 + 40) / 8)


def test_no_rate_without_a_second_wave_or_when_the_order_does_not_hold() -> None:
    assert full_batch_rate([3.0, 4.0], [0.1, 0.1], [10, 10], 2, duration_s=4.0) is None  # one wave
    # The rebuilt run ends at 10 s; a measured duration of 14 s means the requests did not start in order.
    assert full_batch_rate([4.0, 8.0, 6.0, 2.0], [0.0] * 4, [1] * 4, 2, duration_s=14.0) is None
    assert full_batch_rate([4.0, 8.0], [0.0], [1, 1], 1, duration_s=12.0) is None  # lengths differ


def test_wave_pace_is_the_mean_tpot_of_each_start_order_group() -> None:
    # Two slots, three requests: wave 0 = requests 0 and 1 ((3 - 1) / 4 s and (5 - 1) / 4 s per token after
    # the first), wave 1 = request 2 alone; a one-token request has no decode time and is left out.
    e2e, ttft, n = [3.0, 5.0, 2.0, 9.0], [1.0, 1.0, 0.5, 1.0], [5, 5, 4, 1]
    assert wave_pace_ms(e2e, ttft, n, 2) == pytest.approx([750.0, 500.0])
    with pytest.raises(ValueError, match="concurrency"):
        wave_pace_ms(e2e, ttft, n[:3], 2)


def test_wave_context_is_the_batch_mean_each_wave_decoded_beside() -> None:
    # Two slots. r0 decodes 40 tokens over 0-4 s, r1 80 over 0-8 s (both 10 tokens/s); r2 starts at r0's end
    # and decodes 40 over 4-8 s. Batch mean: 10t on [0, 4), (10t + 10(t - 4)) / 2 = 10t - 20 on [4, 8).
    # r0 sees 20 on average, r1 (80 + 160) / 8 = 30, r2 160 / 4 = 40: waves (20 + 30) / 2 and 40.
    e2e, ttft, n = [4.0, 8.0, 4.0], [0.0, 0.0, 0.0], [40, 80, 40]
    assert wave_context(e2e, ttft, n, 2) == pytest.approx([25.0, 40.0])
    # One pace for everyone (stock): every wave starts together and sees the same batch.
    assert wave_context([4.0] * 6, [0.5] * 6, [36] * 6, 2) == pytest.approx([18.0, 18.0, 18.0])
    # A one-token request (no decode time) counts in no wave.
    assert wave_context([4.0, 8.0, 4.0, 0.2], [0.0, 0.0, 0.0, 0.2], [40, 80, 40, 1], 2) == pytest.approx([25.0, 40.0])
    with pytest.raises(ValueError, match="concurrency"):
        wave_context(e2e, ttft, n, 0)
