"""What an exactness run samples and how it judges the cells sampled so far.

The setting's sampling parameters (``SAMPLING``, each with its neutral value), the power checks that
must reject (the reference at ``CONTROL_SCALE`` x the temperature; without the penalties or
min_new_tokens when the setting has them), the cells in sampling order, and ``judge``: every test whose
two cells exist, the power checks, the verdict and the parity against the controls.
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.checks.exactness_stats import counters, homogeneity, parity, total_variation, verdict

CONTROL_SCALE = 1.3  # the hot control's temperature, relative to the setting's
# The sampling parameters a run sets (SGLang's names), their type and their neutral value.
SAMPLING = {
    "temperature": (float, 1.0),
    "top_p": (float, 1.0),
    "top_k": (int, -1),
    "min_p": (float, 0.0),
    "frequency_penalty": (float, 0.0),
    "presence_penalty": (float, 0.0),
    "repetition_penalty": (float, 1.0),
    "min_new_tokens": (int, 0),
}


PENALTIES = ("frequency_penalty", "presence_penalty", "repetition_penalty")


def sampling_params(args: argparse.Namespace) -> dict[str, Any]:
    """What every sample of the setting sends (all of SAMPLING, neutral ones too, so the JSON says each)."""
    return {k: getattr(args, k) for k in SAMPLING} | {
        "max_new_tokens": args.new_tokens,
        "ignore_eos": not args.stop_at_eos,
    }


def power_checks(args: argparse.Namespace) -> list[tuple[str, str]]:
    """(control part, statistic) pairs that must reject: the hot reference on token 2; without the penalties,
    the repeat counts (penalties set) and the lengths (min_new_tokens set)."""
    checks = [("hot", "token 2")]
    if any(getattr(args, k) != SAMPLING[k][1] for k in PENALTIES):
        checks.append(("plain", "repeats"))
    if args.min_new_tokens:
        checks.append(("plain", "length"))
    return checks


def part_params(args: argparse.Namespace, part: str) -> dict[str, Any]:
    params = sampling_params(args)
    if part == "hot":
        params["temperature"] *= CONTROL_SCALE
    elif part == "plain":
        params |= {k: SAMPLING[k][1] for k in (*PENALTIES, "min_new_tokens")}
    return params


def statistics(args: argparse.Namespace) -> list[str]:
    """The tests per context. The length is tested with ignore_eos too: one length on both servers is no test
    (df 0), an output longer than max_new_tokens on one of them is a rejection."""
    return [f"token {j}" for j in range(1, args.new_tokens + 1)] + ["length", "repeats"]


def cell_key(name: str, part: str, ci: int) -> str:
    return f"{name} | {part} | context {ci}"


def cell_plan(args: argparse.Namespace) -> list[tuple[str, int, list[str]]]:
    """(part, context, configs) groups in sampling order: every context's main cells, then the controls."""
    plan = [("main", ci, [args.reference, args.candidate, *args.controls]) for ci in range(args.contexts)]
    return plan + [(part, 0, [args.reference]) for part in dict.fromkeys(part for part, _ in power_checks(args))]


def judge(doc: dict[str, Any], args: argparse.Namespace) -> None:
    """Recompute every test whose two cells exist, the power checks and the verdict (after each group)."""
    counts, ref, stats = doc["counts"], args.reference, statistics(args)
    setting = {"temperature": args.temperature, "top_p": args.top_p}  # the results report's columns
    doc["tests"] = []
    for name in (args.candidate, *args.controls):
        for ci in range(args.contexts):
            a, b = counts.get(cell_key(ref, "main", ci)), counts.get(cell_key(name, "main", ci))
            if a is None or b is None:
                continue
            ca, cb = counters(a), counters(b)
            for stat in stats:
                doc["tests"].append(
                    {
                        "config": name,
                        **setting,
                        "context": ci,
                        "statistic": stat,
                        "position": stat,
                        "total_variation": total_variation(ca[stat], cb[stat]),
                        **homogeneity(ca[stat], cb[stat]),
                    }
                )
    base = counts.get(cell_key(ref, "main", 0))
    doc["power"] = {}
    for part, stat in power_checks(args):
        other = counts.get(cell_key(ref, part, 0))
        doc["power"][f"{part}: {stat}"] = (
            None
            if base is None or other is None
            else {
                "statistic": stat,
                "params": part_params(args, part),
                **homogeneity(counters(base)[stat], counters(other)[stat]),
            }
        )
    doc["control"] = doc["power"]["hot: token 2"]  # the results report's control column
    judged = [t for t in doc["tests"] if t["config"] == args.candidate]
    doc["verdict"], doc["bonferroni_threshold"] = verdict(
        judged, args.contexts * len(stats), list(doc["power"].values()), args.alpha
    )
    doc["parity"] = parity(doc["tests"], args.candidate, args.controls, args.alpha / (args.contexts * len(stats)))
