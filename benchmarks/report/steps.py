"""Step-time results: per-phase round times, their ideal, the capture overhead, profiled steps and projections."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks import step_analysis
from .common import _num, _pct, _ratio, fmt, markdown_table
from .steps_plot import OVER_IDEAL, PHASE_ORDER


STEP_HEADERS = (
    "config",
    "L",
    "B",
    "best stock decode step ms",
    "draft ms / round",
    "draft ms / step",
    "verify ms",
    "verify / best stock step",
    "select ms",
    "round ms",
)


STOCK_HEADERS = ("config", "L", "B", "decode step ms")

CAPTURE_HEADERS = ("config", "L", "B", "capture ms", "select ms", "share of verify step")


def _num_steps(flags: Sequence[str]) -> int | None:
    """k of a recorded PILLAR server (its --speculative-num-steps flag)."""
    return int(flags[flags.index("--speculative-num-steps") + 1]) if "--speculative-num-steps" in flags else None


def _step_rows(d: dict[str, Any]) -> list[list[str]]:
    """One row per measured (config, L, B) with PILLAR phase times, the fastest stock backend's decode step at the
    same point (its config named)."""
    best = step_analysis.best_stock_steps(d["servers"])
    stock = {point: step for point, (step, _) in best.items()}
    # Recomputed rather than read from the file, so runs recorded before a projection existed show it too.
    projected = step_analysis.projections(d["servers"], d["settings"].get("accept_assumed"))
    proj = {(p["config"], p["context"], p["batch"]): p for p in projected}
    with_proj = d["settings"].get("accept_assumed") is not None
    rows = []
    for name, rec in d["servers"].items():
        k = _num_steps(rec["flags"])
        for r in (r for r in rec["rows"] if "round_ms" in r):
            point = (r["context"], r["batch"])
            rows.append(
                [
                    name,
                    *point,
                    f"{best[point][0]:.3f} (`{best[point][1]}`)" if point in best else "-",
                    fmt(r["draft_ms"], ".3f"),
                    fmt(r["draft_ms"] / k if k else None, ".3f"),
                    fmt(r["verify_ms"], ".3f"),
                    # The bar for the verify pass: <= 1.3x the best stock decode step at the same batch and context
                    fmt(_ratio(r["verify_ms"], step) if (step := stock.get(point)) else None, ".2f", "x"),
                    fmt(r["select_ms"], ".3f"),
                    fmt(r["round_ms"], ".3f"),
                ]
                + (_projected(proj.get((name, *point))) if with_proj else [])
            )
    return rows


def _stock_rows(d: dict[str, Any]) -> list[list[Any]]:
    """One row per measured (stock config, L, B): its decode step."""
    return [
        [name, r["context"], r["batch"], fmt(step_analysis.stock_step_ms(r), ".3f")]
        for name, rec in d["servers"].items()
        if step_analysis.is_stock(name)
        for r in rec["rows"]
        if step_analysis.stock_step_ms(r) is not None
    ]


def _projected(p: dict[str, Any] | None) -> list[str]:
    """The projection cells of a row: speedup, mixed-phase round's best case and its speedup."""
    p = p or {}
    return [
        fmt(p.get("projected_speedup"), ".2f", "x"),
        fmt(p.get("mixed_round_ms"), ".3f"),
        fmt(p.get("projected_speedup_mixed"), ".2f", "x"),
    ]


def _not_measured(d: dict[str, Any]) -> list[str]:
    """Servers that did not run and points skipped or failed, with the recorded reason."""
    out = [f"{name}: server {rec['status']}" for name, rec in d["servers"].items() if rec["status"] != "ok"]
    for name, rec in d["servers"].items():
        out += [
            f"{name} L={r['context']} B={r['batch']}: {r.get('skipped') or r.get('error')}"
            for r in rec["rows"]
            if "skipped" in r or "error" in r
        ]
    return out


def _step_setup(d: dict[str, Any]) -> tuple[Any, ...]:
    s, meta = d["settings"], d["meta"]
    return s["shape"], tuple(s["decode_tokens"]), meta.get("device"), str(meta.get("git_commit"))


def sibling_capture(d: dict[str, Any], docs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Capture rows of ``d``'s score-using servers whose streaming twin ran in another step_times run with
    the same shape, decode lengths, device and commit (a twin that did not fit the same command); the
    twin is named ``<server> (<file>)``. Servers whose twin is in ``d`` itself are left to ``d``'s own rows."""
    merged = {name: rec for name, rec in d["servers"].items() if rec["status"] == "ok"}  # not a twin that failed here
    for o in docs:
        if o is not d and o.get("kind") == "step_times" and _step_setup(o) == _step_setup(d):
            merged.update({f"{name} ({o['_file']})": rec for name, rec in o["servers"].items()})
    return [
        c
        for c in step_analysis.capture_overhead(merged)
        if c["config"] in d["servers"] and c["twin"] not in d["servers"]
    ]


def _ideal_table(d: dict[str, Any]) -> str:
    """Each phase's measured ms / its ideal ms (step_analysis.ideal_breakdown), flagged past OVER_IDEAL."""
    rows = step_analysis.ideal_breakdown(d)  # derived from the rows (a stored "ideal" in older files is ignored)
    if not rows:
        return ""
    cells = [
        [r["config"], r["context"], r["batch"], fmt(r["fixed_ms"], ".2f")]
        + [
            (f"{m:.2f} / {i:.2f}" + (" **!**" if i and m > OVER_IDEAL * i else "")) if (m, i) != (None, None) else "-"
            for m, i in (r["phases"].get(p, (None, None)) for p in PHASE_ORDER)
        ]
        for r in rows
    ]
    return (
        "\n\nMeasured / ideal ms per round (`step_analysis.ideal_breakdown`: bytes / peak HBM bandwidth, plus a fixed "
        "per-forward cost for the forward phases, one read of the weights; the stock row is the run's fastest stock "
        f"backend; **!** = over {OVER_IDEAL:g}x):\n\n"
        + markdown_table(("config", "L", "B", "fixed ms", *PHASE_ORDER), cells)
    )


def _profile_table(d: dict[str, Any]) -> str:
    """The profiled passes of a run (``--profile-steps``): GPU window, busy and idle per step, the host's GPU
    work submissions where the CPU was profiled, and the kernel that took the most time."""
    rows = []
    for name, srv in d["servers"].items():
        for r in srv.get("rows", []):
            prof = r.get("profile")
            if not prof:
                continue
            top = prof["kernels"][0] if prof.get("kernels") else None
            rows.append(
                [
                    name,
                    r["context"],
                    r["batch"],
                    fmt(prof["window_ms_per_step"], ".2f"),
                    fmt(prof["busy_ms_per_step"], ".2f"),
                    fmt(prof["idle_ms_per_step"], ".2f"),
                    fmt(_num(prof.get("submits_per_step")), ".0f"),
                    fmt(_num(prof.get("graph_launches_per_step")), ".1f"),
                    f"{top['name'][:40]} ({top['ms_per_step']:.2f} ms)" if top else "-",
                ]
            )
    if not rows:
        return ""
    callers = [
        f"- {name} L={r['context']} B={r['batch']}: "
        + "; ".join(f"{c['caller']} -> {c['op']} x{c['calls_per_step']:.0f}" for c in r["profile"]["host_callers"][:3])
        for name, srv in d["servers"].items()
        for r in srv.get("rows", [])
        if (r.get("profile") or {}).get("host_callers")
    ]
    callers_text = (
        "\n\nMost host operator calls per step by caller (`--profile-stack`):\n\n" + "\n".join(callers)
        if callers
        else ""
    )
    return (
        "\n\nProfiled steps (scheduler steps of a third pass; idle = window - busy: time the GPU waited for the "
        "host; submissions = kernel / graph launches and async copies the host issued, with `--profile-host`):\n\n"
        + markdown_table(
            (
                "config",
                "L",
                "B",
                "window ms / step",
                "GPU busy ms",
                "GPU idle ms",
                "submissions / step",
                "graph launches / step",
                "top kernel",
            ),
            rows,
        )
        + callers_text
    )


def step_times_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """Per step_times run: stock decode step vs PILLAR's phases per (L, B), the projection, the capture cost."""
    parts = []
    for d in sorted((d for d in docs if d.get("kind") == "step_times"), key=lambda d: d["meta"]["run_id"]):
        meta, s = d["meta"], d["settings"]
        accept = s.get("accept_assumed")
        headers = STEP_HEADERS + (
            (
                f"projected speedup (accept {accept:g})",
                "mixed round ms (best case)",
                "projected speedup, mixed (best case)",
            )
            if accept is not None
            else ()
        )
        cap = [
            [
                c["config"] if c["twin"] in d["servers"] else f"{c['config']} (twin: {c['twin']})",
                c["context"],
                c["batch"],
                fmt(c["capture_ms"], ".3f"),
                fmt(c["select_ms"], ".3f"),
                fmt(_pct(c["capture_select_frac_of_verify"]), ".0f", "%"),
            ]
            for c in [*d.get("capture_overhead", []), *sibling_capture(d, docs)]
        ]
        missing = "".join(f"\n- not measured: {n}" for n in _not_measured(d))
        ideal = _ideal_table(d)
        pillar_rows = _step_rows(d)
        # A run of stock servers only has no round to show: its decode steps instead.
        table = markdown_table(headers, pillar_rows) if pillar_rows else markdown_table(STOCK_HEADERS, _stock_rows(d))
        m1, m2 = s["decode_tokens"]
        parts.append(
            f"#### Step times, run {meta['run_id']} ({d['_file']})\n\n{meta.get('device')}; commit "
            f"{str(meta.get('git_commit'))[:12]}; shape {s['shape']}; M1/M2 = {m1}/{m2} output tokens; "
            f"weights {s.get('weights', 'dummy (random): times only')}; "
            f"temperature {s.get('temperature', 0):g}, top-p {s.get('top_p', 1):g}.\n\n"
            + table
            + "\n"
            + missing
            + (
                "\n\nScore capture (verify minus the streaming twin's verify) and selection, per round:\n\n"
                + markdown_table(CAPTURE_HEADERS, cap)
                if cap
                else ""
            )
            + ideal
            + _profile_table(d)
            + "\n"
        )
    if mixed := _mixed_gemm_markdown(docs):
        parts.append(mixed)
    if not parts:
        return ""
    return (
        "### Step times\n\n"
        "Per context L and batch B; with random weights (Qwen3 shapes) only times mean anything, a run's weights are "
        "named in its header. Best stock decode step = the fastest of the run's stock backends (named), each "
        "step the median of SGLang's own logged decode intervals at the full batch (`log_step_ms`), or in runs "
        "before it was recorded the wall time difference of two output lengths / their token difference (host "
        "overheads included); PILLAR phases "
        "= mean GPU ms per round from `SPARSESPEC_STEP_TIMING` (draft = k sparse steps, draft / step = draft / k). "
        "The projected speedup is a projection, not a measurement: an accept length measured on a real model x "
        "best stock step / PILLAR round. Mixed round (best case) = the round less what its verify costs above stock's "
        "decode step at the same point (verify ms - stock step): the most mixed-phase batching could hide "
        "(docs/design.md). Capture = verify ms of a score-using policy minus its streaming twin's (same "
        "flags and knobs, `SPARSESPEC_POLICY=streaming`: no score capture, no LSE); share = (capture + select) / "
        "(verify + select).\n\n" + "\n".join(parts)
    )


MIXED_HEADERS = ("model", "B", "k", "G(B) ms", "G(B (k + 1)) ms", "split ms", "mixed ms", "saving ms")
MIXED_PROJ_HEADERS = ("steps file", "L", "B", "round ms", "mixed round ms", "change")


def _mixed_gemm_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """tools.mixed_gemm runs: the row-wise work of a split round against the mixed-phase round's, and each
    measured round of the named step-times file projected to the mixed one."""
    parts = []
    for d in sorted((d for d in docs if d.get("kind") == "mixed_gemm"), key=lambda d: (d["model"], d["date_utc"])):
        rows = [
            [
                r["model"],
                r["batch"],
                r["k"],
                *(
                    fmt(r[k], ".2f")
                    for k in ("draft_forward_ms", "verify_forward_ms", "today_ms", "mixed_ms", "saving_ms")
                ),
            ]
            for r in d["rows"]
        ]
        proj = [
            [
                d["steps_file"],
                p["context"],
                p["batch"],
                fmt(p["round_ms"], ".1f"),
                fmt(p["mixed_round_ms"], ".1f"),
                fmt(_pct(p["change"]), "+.1f", "%"),
            ]
            for p in d["projection"]
            if p["server"] == "pillar"
        ]
        parts.append(
            f"{d['device']}; commit {str(d['git_commit'])[:12]}; {d['weights']} ({d['_file']}).\n\n"
            + markdown_table(MIXED_HEADERS, rows)
            + ("\n\n" + markdown_table(MIXED_PROJ_HEADERS, proj) if proj else "")
        )
    if not parts:
        return ""
    return (
        "#### Mixed-phase round: the row-wise work it changes\n\n"
        "`tools.mixed_gemm`: G(R) = a forward's weight GEMMs, norms, activation and LM head over R rows "
        "(attention left out: both rounds do the same attention work); split = k G(B) + G(B (k + 1)), mixed = "
        "the sum over the k + 1 phase groups of G(B + k n_g); mixed round = a measured round - (split - mixed).\n\n"
        + "\n\n".join(parts)
        + "\n"
    )
