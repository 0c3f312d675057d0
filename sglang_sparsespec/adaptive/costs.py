"""What a decode round costs on this server: robust per-phase estimates in cells by batch and context.

Every priced round records CUDA events; the round clock (``rounds/clock.py``) reads them once they
have completed (``query()``, never a wait) and returns ``RoundSample``s, which
``SpeculationPolicy.observe`` adds to the ``CostCell`` of the round's (batch bucket, context bucket)
in a ``CostTable``.

Warm-up and outliers. The first rounds of a shape pay for work that later rounds do not: a Triton
kernel compiled or autotuned on first use, a CUDA graph replayed cold, SGLang's own start-up request
(a batch of one at a few tokens of context, timed at 106 and 152 ms for a plain round that costs
1-2 ms). A round can also be stretched once by something outside it (a host stall, a prefill on
another stream). A cost priced from such a round keeps its batch on the wrong path until the mode is
re-probed, ``reprobe_every`` rounds later. So each phase's ``RobustCost`` drops the first ``WARMUP``
samples it is fed and prices with the lower median of the last ``WINDOW`` kept ones, once it holds
``MIN_SAMPLES`` = 3: one sample, however far off (high or low), is never the lower median of three or
more, so a single spiked round (first call or not) cannot move a price. (Of two samples the lower
median is the smaller: one low outlier would price the mode.) A real change of cost moves the median
within half a window.

Nothing here touches SGLang or the GPU.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any


class RobustCost:
    """Milliseconds of one phase of one cell (see the module docstring): None until MIN_SAMPLES
    samples past the first WARMUP; then the lower median of the last WINDOW of them."""

    WARMUP = 1
    MIN_SAMPLES = 3
    WINDOW = 8

    __slots__ = ("recent", "seen")

    def __init__(self) -> None:
        self.seen = 0
        self.recent: deque[float] = deque(maxlen=self.WINDOW)

    def add(self, ms: float) -> None:
        self.seen += 1
        if self.seen > self.WARMUP:
            self.recent.append(ms)

    def prime(self, ms: float) -> None:
        """Start from a figure measured before (the cost file): it counts as MIN_SAMPLES samples past
        the warm-up, so one new sample cannot outvote it and the window replaces it with this server's."""
        self.seen = self.WARMUP + self.MIN_SAMPLES
        self.recent.extend([ms] * self.MIN_SAMPLES)

    @property
    def value(self) -> float | None:
        if len(self.recent) < self.MIN_SAMPLES:
            return None
        return sorted(self.recent)[(len(self.recent) - 1) // 2]


# A mode's rounds in a new cell until its first priced estimate: the warm-up and the minimum sample.
PROBE_ROUNDS = RobustCost.WARMUP + RobustCost.MIN_SAMPLES


@dataclass
class CostCell:
    """Measured milliseconds of one (batch bucket, context bucket): plain = a k = 0 round;
    draft[k] = the draft phase of a round of k drafts; verify = the rest of a k >= 1 round; mixed = a
    whole mixed-phase iteration (rounds/mixed.py: drafts and verifies share its forwards, so it has no
    phases to split); gap = stream idle time before a round that followed another decode round.
    Bookkeeping: rounds chosen here, the round each mode (0, or SPECULATE for every k >= 1) last ran,
    and the last non-probe choice (for the hysteresis) and the round it was priced at. Every cost is a
    ``RobustCost``."""

    plain: RobustCost = field(default_factory=RobustCost)
    verify: RobustCost = field(default_factory=RobustCost)
    gap: RobustCost = field(default_factory=RobustCost)
    mixed: RobustCost = field(default_factory=RobustCost)
    draft: dict[int, RobustCost] = field(default_factory=dict)
    rounds: int = 0
    probes: dict[int, int] = field(default_factory=dict)  # rounds run here per mode (0 / SPECULATE)
    last_probe: dict[int, int] = field(default_factory=dict)
    last_choice: int | None = None
    last_priced: int = 0  # the round whose choice last priced every count

    def seeded(self) -> CostCell:
        """A new cell holding this one's costs and last choice, its measured modes counted as probed
        at its round 0 (so they are re-probed on the usual schedule, not at once)."""
        cell = copy.deepcopy(self)
        cell.rounds = cell.last_priced = 0
        cell.last_probe = dict.fromkeys(self.last_probe, 0)
        return cell

    def draft_ms(self, k: int) -> float | None:
        """The draft phase of k drafts: measured at k, else the nearest measured count's scaled by k."""
        measured = {j: e.value for j, e in self.draft.items() if e.value is not None}
        if k in measured:
            return measured[k]
        if not measured:
            return None
        near = min(measured, key=lambda j: (abs(j - k), -j))
        return measured[near] * k / near


CELL_COSTS = ("plain", "verify", "gap", "mixed")
SPECULATE = -1  # CostCell.last_probe's key for the speculative mode (every k >= 1)


def batch_bucket(batch_size: int) -> int:
    """Next power of two (CUDA-graph buckets are close to it)."""
    return 1 << max(0, math.ceil(math.log2(max(batch_size, 1))))


def context_bucket(mean_len: float) -> int:
    """Half-octave of the mean context length (step cost grows about linearly with it)."""
    return round(2.0 * math.log2(max(mean_len, 1.0)))


def cell_key(batch_size: int, mean_len: float) -> tuple[int, int]:
    """The cost cell of a batch: (batch bucket, context bucket)."""
    return batch_bucket(batch_size), context_bucket(mean_len)


def cell_label(key: tuple[int, int]) -> str:
    """A cell as /server_info and the reports name it: "<batch bucket>x<context ~tokens>"."""
    bs, ctx = key
    return f"{bs}x{round(2 ** (ctx / 2))}"


def _ms(value: Any) -> float:
    ms = float(value)
    if not 0.0 <= ms < 1e6:  # NaN fails both
        raise ValueError(f"{value!r} is not a round time in ms")
    return ms


SEED_SPAN = 2  # a new cell borrows costs from a cell at most this many half-octaves of context away


class CostTable:
    """CostCells by (batch bucket, context bucket); a new cell is seeded from the nearest cell of its
    batch bucket within SEED_SPAN context buckets (the shorter context on a tie), or starts empty:
    step costs grow with the context, so a far neighbour would mislead more than a probe costs.

    ``export`` / ``restore``: the measured costs as JSON-ready data, ``{"<bs bucket>,<ctx bucket>":
    {"plain": ms, "verify": ms, "gap": ms, "mixed": ms, "draft": {"<k>": ms}}}`` (each the estimate's
    current value; unpriced entries left out), so a restarted server starts from them
    (``adaptive/cost_cache.py``)."""

    def __init__(self) -> None:
        self.cells: dict[tuple[int, int], CostCell] = {}

    def export(self) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for (bs, ctx), c in sorted(self.cells.items()):
            entry: dict[str, Any] = {n: e.value for n in CELL_COSTS if (e := getattr(c, n)).value is not None}
            draft = {str(k): e.value for k, e in sorted(c.draft.items()) if e.value is not None}
            if draft:
                entry["draft"] = draft
            if "plain" in entry or "mixed" in entry or ("verify" in entry and draft):
                out[f"{bs},{ctx}"] = entry
        return out

    def restore(self, cells: dict[str, Any]) -> int:
        """Take an export's cells as starting costs; each priced mode counts as probed at round 0, so it is
        re-probed on the usual schedule (``RobustCost.prime``). Cells measured here already are kept.
        Returns the cells taken; ValueError on a malformed entry (nothing is taken then)."""
        taken: dict[tuple[int, int], CostCell] = {}
        try:
            for label, entry in cells.items():
                bs, ctx = (int(x) for x in label.split(","))
                c = CostCell()
                for name in CELL_COSTS:
                    if name in entry:
                        getattr(c, name).prime(_ms(entry[name]))
                for k, ms in entry.get("draft", {}).items():
                    c.draft.setdefault(int(k), RobustCost()).prime(_ms(ms))
                if c.plain.value is not None:
                    c.last_probe[0] = 0
                if (c.verify.value is not None and c.draft) or c.mixed.value is not None:
                    c.last_probe[SPECULATE] = 0
                if bs < 1 or not c.last_probe:
                    raise ValueError(f"cell {label!r} prices no mode")
                taken[(bs, ctx)] = c
        except (AttributeError, TypeError, ValueError) as e:
            raise ValueError(f"malformed cost cells: {e}") from None
        for key, c in taken.items():
            self.cells.setdefault(key, c)
        return len(taken)

    def cell(self, key: tuple[int, int]) -> CostCell:
        c = self.cells.get(key)
        if c is None:
            bs, ctx = key
            near = [
                k for k, cell in self.cells.items() if k[0] == bs and abs(k[1] - ctx) <= SEED_SPAN and cell.last_probe
            ]
            if near:
                c = self.cells[min(near, key=lambda k: (abs(k[1] - ctx), k[1]))].seeded()
            else:
                c = CostCell()
            self.cells[key] = c
        return c
