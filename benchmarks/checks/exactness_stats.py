"""The statistics of benchmarks.checks.exactness: what one cell of sampled outputs is reduced to, the two-sample
chi-square test of homogeneity over it, the run's verdict, and the candidate's parity with the controls.

A cell is one server's answers to many copies of one context. Outputs may end early (a stop token), so
each is read as a fixed-length row padded with END: position 1 is token 1 alone; position j >= 2 is the
pair (token j-1, token j), END standing for "already finished"; besides the positions, the output length
and the repeat count (tokens that equal an earlier token of the same output: what frequency, presence and
repetition penalties act on) are tallied. Everything a test needs is in the tally, so a stored JSON can be
re-judged without the GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

END = -1  # the padding token of an output that finished before a position


def chi2_sf(stat: float, df: int) -> float:
    """Survival function of the chi-square distribution (regularised upper incomplete gamma)."""
    import torch

    x = torch.tensor([df / 2, stat / 2], dtype=torch.float64)
    return float(torch.special.gammaincc(x[0], x[1]))


def homogeneity(a: Counter, b: Counter, min_expected: float = 5.0) -> dict[str, Any]:
    """Two-sample chi-square test that the category counts ``a`` and ``b`` share one distribution.

    Categories whose smaller expected count is below ``min_expected`` are pooled into one cell,
    which joins the smallest other cell if it is still too small: no count is dropped.
    Returns stat, df (cells - 1), p_value, the cell count, and ``largest``: the cells that add the most to
    the statistic, as [category, count in a, count in b] ("pool" for the pooled rare categories, or
    ["pool", category] where they joined that one; a count of 0 on one side where the
    other has many reads as a support difference, e.g. a tied token one filter drops; counts that differ
    by a few percent as a probability moved, e.g. by rounding).
    """
    na, nb = sum(a.values()), sum(b.values())
    if na == 0 or nb == 0:
        raise ValueError("both samples must be non-empty")
    small = min(na, nb) / (na + nb)
    cells, pool, kept = [], [0, 0], []
    for key in a.keys() | b.keys():
        ca, cb = a.get(key, 0), b.get(key, 0)
        if (ca + cb) * small >= min_expected:
            cells.append((ca, cb))
            kept.append(key)
        else:
            pool[0], pool[1] = pool[0] + ca, pool[1] + cb
    if sum(pool) * small >= min_expected or not cells:
        cells.append((pool[0], pool[1]))
        kept.append("pool")
    elif sum(pool):
        i = min(range(len(cells)), key=lambda c: sum(cells[c]))
        cells[i] = (cells[i][0] + pool[0], cells[i][1] + pool[1])
        kept[i] = ["pool", kept[i]]
    terms = []
    for ca, cb in cells:
        tot = ca + cb
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        terms.append((ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb)
    stat, df = sum(terms), len(cells) - 1
    order = sorted(range(len(kept)), key=lambda i: -terms[i])[:3]
    largest = [[list(kept[i]) if isinstance(kept[i], tuple) else kept[i], *cells[i]] for i in order]
    return {
        "stat": stat,
        "df": df,
        "p_value": chi2_sf(stat, df) if df > 0 else 1.0,
        "cells": len(cells),
        "largest": largest,
    }


def total_variation(a: Counter, b: Counter) -> float:
    """Half the L1 distance between the two samples' frequencies (unpooled): the effect's size beside its p-value."""
    na, nb = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a.get(k, 0) / na - b.get(k, 0) / nb) for k in a.keys() | b.keys())


def padded(output: Sequence[int], length: int) -> list[int]:
    return list(output[:length]) + [END] * (length - len(output))


def pair_counts(outputs: Sequence[Sequence[int]], j: int, length: int | None = None) -> Counter:
    """Counts of (token j-1, token j) over the outputs (0-based positions, END past an output's end)."""
    n = length if length is not None else max(map(len, outputs))
    rows = [padded(o, n) for o in outputs]
    return Counter((r[j - 1], r[j]) for r in rows)


def repeats(output: Sequence[int]) -> int:
    """Tokens of ``output`` that equal an earlier one of it: the count the output penalties change."""
    return len(output) - len(set(output))


def tally(outputs: Sequence[Sequence[int]], new_tokens: int) -> dict[str, Any]:
    """What the tests need of one cell's outputs, JSON-ready: token 1's counts [[token, n], ...], per position
    j >= 2 the (token j-1, token j) pair counts [[a, b, n], ...], and the length and repeat-count counts. An
    output of no tokens or more than ``new_tokens`` is a server's error, kept (not raised) so its length
    category, seen on one server only, fails the length test."""
    first = Counter(o[0] if o else END for o in outputs)
    pairs = [pair_counts(outputs, j, new_tokens) for j in range(1, new_tokens)]
    return {
        "n": len(outputs),
        "first": [[t, c] for t, c in first.items()],
        "pairs": [[[a, b, c] for (a, b), c in pc.items()] for pc in pairs],
        "lengths": [[k, c] for k, c in Counter(map(len, outputs)).items()],
        "repeats": [[k, c] for k, c in Counter(map(repeats, outputs)).items()],
    }


def counters(cell: dict[str, Any]) -> dict[str, Counter]:
    """A tally back as Counters, by statistic: "token 1", "token 2", ..., "length", "repeats"."""
    out = {"token 1": Counter({t: c for t, c in cell["first"]})}
    for j, pc in enumerate(cell["pairs"]):
        out[f"token {j + 2}"] = Counter({(a, b): c for a, b, c in pc})
    out["length"] = Counter({k: c for k, c in cell["lengths"]})
    out["repeats"] = Counter({k: c for k, c in cell["repeats"]})
    return out


def verdict(
    judged: Sequence[dict[str, Any]], n_tests: int, controls: Sequence[dict[str, Any] | None], alpha: float
) -> tuple[str, float | None]:
    """The run's verdict and its Bonferroni threshold (alpha / n_tests) from the candidate's tests.

    INCOMPLETE: a test or a power control is missing. NO_POWER: a control (the reference against itself with
    a known change: a hotter temperature, or without the setting's penalties) does not reject, so a pass
    would mean nothing. NUMERICS: token 1 rejects; both servers draw it from the prefill with stock's own
    sampler before any speculative code runs, so their forwards round differently and the later tokens
    cannot be pinned on the speculation. FAIL: token 1 passes and another statistic rejects. PASS: none does.
    """
    if len(judged) != n_tests or not controls or any(c is None for c in controls):
        return "INCOMPLETE", None
    threshold = alpha / n_tests
    if any(c["p_value"] >= threshold for c in controls if c is not None):
        return "NO_POWER", threshold
    rejects = {t["statistic"] for t in judged if t["p_value"] < threshold}
    if "token 1" in rejects:
        return "NUMERICS", threshold
    return ("FAIL" if rejects else "PASS"), threshold


def _summary(test: dict[str, Any]) -> dict[str, Any]:
    return {k: test[k] for k in ("stat", "df", "p_value", "total_variation")}


def parity(
    tests: Sequence[dict[str, Any]], candidate: str, controls: Sequence[str], threshold: float
) -> dict[str, Any]:
    """The candidate's deviation from the reference beside each control's, per (context, statistic).

    A control is another server judged against the same reference (e.g. SGLang's own speculation, or stock
    with another attention kernel): its deviation is what that kind of server shows anyway. A statistic is
    within the controls' deviation when the candidate does not reject it (p >= ``threshold``), or its total
    variation from the reference is at most the largest control's. Verdict: WITHIN (every statistic is),
    BEYOND (one is not), NO_CONTROLS, or INCOMPLETE (a cell of the candidate or a control is missing).
    """
    by_key = {(t["config"], t["context"], t["statistic"]): t for t in tests}
    rows = []
    for t in (t for t in tests if t["config"] == candidate):
        others = {c: by_key.get((c, t["context"], t["statistic"])) for c in controls}
        rejects = t["p_value"] < threshold
        missing = not controls or any(o is None for o in others.values())
        widest = max((o["total_variation"] for o in others.values() if o is not None), default=0.0)
        within = None if missing else (not rejects or t["total_variation"] <= widest)
        rows.append(
            {
                "context": t["context"],
                "statistic": t["statistic"],
                "candidate": _summary(t),
                "rejects": rejects,
                "controls": {c: None if o is None else _summary(o) for c, o in others.items()},
                "within": within,
            }
        )
    if not controls:
        result = "NO_CONTROLS"
    elif not rows or any(r["within"] is None for r in rows):
        result = "INCOMPLETE"
    else:
        result = "WITHIN" if all(r["within"] for r in rows) else "BEYOND"
    return {"candidate": candidate, "controls": list(controls), "threshold": threshold, "rows": rows, "verdict": result}


def parity_line(p: dict[str, Any]) -> str:
    """One line for the run's verdict: whether the candidate is within the controls' deviation, and where it
    rejects, its total variation beside each control's."""
    name, verdict = p["candidate"], p["verdict"]
    if verdict == "NO_CONTROLS":
        return "parity: no controls to compare with (--controls)"
    if verdict == "INCOMPLETE":
        return f"parity: incomplete (a cell of {name} or of {', '.join(p['controls'])} is missing)"
    shown = [r for r in p["rows"] if r["rejects"] and (verdict == "WITHIN" or not r["within"])]
    cells = "; ".join(
        f"ctx {r['context']} {r['statistic']}: TV {r['candidate']['total_variation']:.4f} ("
        + ", ".join(f"{c} {s['total_variation']:.4f}" for c, s in r["controls"].items())
        + ")"
        for r in shown
    )
    if verdict == "BEYOND":
        return f"parity: {name} BEYOND the controls' deviation at {cells}"
    if not shown:
        return f"parity: {name} WITHIN the controls' deviation (it rejects no statistic)"
    return f"parity: {name} WITHIN the controls' deviation at every statistic it rejects: {cells}"
