"""The acceptance estimate adaptive speculation prices rounds with (``adaptive/policy.py``)."""

from __future__ import annotations

from itertools import repeat

from sglang_sparsespec.rounds.launch import AdaptiveRound, Matched


class AcceptanceTracker:
    """Per-draft acceptance probability ``alpha``, an EMA over recent speculative rounds, and the
    calibration of the policy's expected tokens per draft count (``calibrated``).

    One round with k drafts and per-request accepted counts a_i contributes the truncated-geometric
    estimate sum(a_i) / (sum(a_i) + #{a_i < k}) over the requests that drafted with their sparse plan
    (dense drafts, ``adaptive/dense.py``, are accepted ~always and say nothing about the plans). The
    worker's launch queue (``rounds/launch.py``) matches each round with SGLang's host copy of its
    counts and hands it to ``completed``.
    """

    # Calibration: per draft count, an EMA of emitted / expected tokens over the rounds that ran, so
    # the policy prices with what its estimates have delivered. Slower than ``decay``: one round at a
    # small batch is noisy. Clamped so that a run of bad luck cannot switch speculation off for good
    # (the re-probes keep measuring) nor promise more than the estimates do by much.
    CAL_DECAY = 0.95
    CAL_RANGE = (0.5, 1.2)

    def __init__(self, decay: float = 0.8, prior: float = 0.7):
        if not 0.0 <= decay < 1.0 or not 0.0 < prior < 1.0:
            raise ValueError("decay must be in [0, 1) and prior in (0, 1)")
        self.decay = decay
        self.alpha = prior
        self.calibration: dict[int, float] = {}

    def calibrated(self, k: int) -> float:
        """Emitted / expected tokens of the rounds of k drafts so far (1 before the first)."""
        return self.calibration.get(k, 1.0)

    def completed(self, matched: Matched) -> None:
        """A round of k >= 1 drafts with its capped counts; its ``AdaptiveRound``'s ``expected``: the
        tokens it was chosen for (the batch's sum, bonus tokens included, uncalibrated), or None where
        it was not priced so (forced or changed counts)."""
        k, capped = matched.k, matched.accepted
        launch: AdaptiveRound = matched.payload
        dense, expected = launch.dense, launch.expected
        if expected:
            ratio = (sum(capped) + len(capped)) / expected
            cal = self.CAL_DECAY * self.calibrated(k) + (1.0 - self.CAL_DECAY) * ratio
            self.calibration[k] = min(max(cal, self.CAL_RANGE[0]), self.CAL_RANGE[1])
        if dense is not None or matched.num_drafts is not None:
            # Dense drafters teach the dense estimate (DenseChooser), and requests that drafted nothing
            # (per-token sampling state) teach nothing: the batch's estimate keeps the sparse drafters.
            flags = dense if dense is not None else repeat(False)
            num_drafts = matched.num_drafts if matched.num_drafts is not None else repeat(k)
            capped = [a for a, d, n in zip(capped, flags, num_drafts) if n and not d]
        hits = sum(capped)
        misses = sum(1 for a in capped if a < k)
        if hits + misses == 0:
            return
        self.alpha = self.decay * self.alpha + (1.0 - self.decay) * hits / (hits + misses)
        self.alpha = min(max(self.alpha, 1e-3), 0.999)
