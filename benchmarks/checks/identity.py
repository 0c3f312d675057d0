"""Greedy token identity of a candidate's outputs against a reference's, and which divergences rounding explains.

``compare_outputs`` finds where each pair of outputs first differs and keeps a window of ids around it;
``classify_divergences`` calls a divergence a near tie when the reference's own top-2 log-probability gap
there was at most ``NEAR_TIE_NATS``. The lossless check judges PILLAR against stock with it, and the offload
and reliability runs their repeats.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from benchmarks.client import GenOutput
from benchmarks.workload import Prompt

# A divergence is explained by rounding when stock's top-2 log-probability gap at that position
# was at most this: a few bf16 ulps of a logit of 10-30 (ulp 0.0625-0.125). Whether the candidate
# took the listed runner-up is recorded but not required: bf16 logits often tie exactly (gap 0),
# and among tied tokens the top-logprob list need not be in argmax's order.
NEAR_TIE_NATS = 0.25


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index of the first differing token; the shorter length if one is a strict prefix; None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_outputs(
    reference: Sequence[GenOutput],
    candidate: Sequence[GenOutput],
    early: int,
    prompts: Sequence[Prompt] | None = None,
    decode: Any = None,
) -> dict[str, Any]:
    """Token identity of ``candidate`` against ``reference`` (same prompt order).

    Divergences before ``early`` tokens are listed in ``early_divergences``. For each
    diverged request a window of ids around the divergence is kept (and its text when
    ``decode`` is given) so the JSON shows what went wrong without carrying every token.
    """
    if len(reference) != len(candidate):
        raise ValueError(f"cannot compare {len(reference)} reference outputs with {len(candidate)} candidates")
    requests = []
    for i, (ref, cand) in enumerate(zip(reference, candidate)):
        div = first_divergence(ref.output_ids, cand.output_ids)
        rec: dict[str, Any] = {
            "index": i,
            "source": prompts[i].source if prompts else None,
            "prompt_len": len(prompts[i].input_ids) if prompts else None,
            "reference_len": len(ref.output_ids),
            "candidate_len": len(cand.output_ids),
            "identical": div is None,
            "first_divergence": div,
            "reference_finish": ref.finish_reason,
            "candidate_finish": cand.finish_reason,
            "accept_length": cand.accept_length,
        }
        if div is not None and ref.margin is not None and div < len(ref.output_ids) and div < len(cand.output_ids):
            rec["reference_margin"] = round(ref.margin[div], 5)
            rec["candidate_is_runner_up"] = cand.output_ids[div] == ref.runner_up[div]
        if div is not None:
            lo, hi = max(0, div - 4), div + 8
            rec["reference_window"] = ref.output_ids[lo:hi]
            rec["candidate_window"] = cand.output_ids[lo:hi]
            if decode is not None:
                rec["reference_text"] = decode(ref.output_ids[lo:hi])
                rec["candidate_text"] = decode(cand.output_ids[lo:hi])
        requests.append(rec)
    divs = [r["first_divergence"] for r in requests if r["first_divergence"] is not None]
    n_identical = sum(r["identical"] for r in requests)
    margins = [m for ref in reference if ref.margin for m in ref.margin]
    ident = {
        "num_requests": len(requests),
        "identical": n_identical,
        "fraction_identical": n_identical / len(requests) if requests else None,
        "early_threshold": early,
        "early_divergences": [
            r["index"] for r in requests if r["first_divergence"] is not None and r["first_divergence"] < early
        ],
        "first_divergence_min": min(divs) if divs else None,
        "first_divergence_median": statistics.median(divs) if divs else None,
        # Scale of stock's own top-2 margins, to compare the divergence margins against.
        "reference_margin_median": statistics.median(margins) if margins else None,
        "reference_margin_frac_near_tie": sum(m <= NEAR_TIE_NATS for m in margins) / len(margins) if margins else None,
        "requests": requests,
    }
    classify_divergences(ident)
    return ident


def classify_divergences(ident: dict[str, Any]) -> None:
    """(Re)classify each divergence of an identity record as a near-tie or not, in place.

    Needs ``reference_margin`` on the diverged requests (stock pass with top-2 log-probs);
    without it every early divergence counts as unexplained.
    """
    requests, early = ident["requests"], ident["early_threshold"]
    for r in requests:
        if "reference_margin" in r:
            r["near_tie"] = r["reference_margin"] <= NEAR_TIE_NATS
    has_margins = any("reference_margin" in r for r in requests)
    ident["near_tie_nats"] = NEAR_TIE_NATS
    ident["divergences_near_tie"] = sum(bool(r.get("near_tie")) for r in requests) if has_margins else None
    ident["unexplained_early_divergences"] = [
        r["index"]
        for r in requests
        if r["first_divergence"] is not None and r["first_divergence"] < early and not r.get("near_tie")
    ]
