"""Exactness results: greedy identity (lossless), acceptance per draft policy, sampled exactness, the CPU reference."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .common import fmt, markdown_table


LOSSLESS_HEADERS = (
    "run",
    "candidate",
    "k",
    "prompts",
    "max new",
    "verdict",
    "identical",
    "early div",
    "near-tie div",
    "unexplained early",
    "max div margin",
    "first div min/med",
    "stock self-identical",
    "stock margin med",
)


ACCEPT_HEADERS = ("run", "k", "temperature", "max new", "prompts", "accept len overall", "per-request mean", "status")


def _identity_cells(ident: dict[str, Any] | None) -> list[str]:
    if not ident:
        return ["-"] * 6
    margins = [r["reference_margin"] for r in ident["requests"] if "reference_margin" in r]
    near = ident.get("divergences_near_tie")
    n_div = ident["num_requests"] - ident["identical"]
    return [
        f"{ident['identical']}/{ident['num_requests']}",
        str(len(ident["early_divergences"])),
        f"{near}/{n_div}" if near is not None else "-",
        (",".join(map(str, ident.get("unexplained_early_divergences", ident["early_divergences"]))) or "none"),
        fmt(max(margins), ".3f") if margins else "-",
        f"{fmt(ident['first_divergence_min'], 'd')}/{fmt(ident['first_divergence_median'], '.0f')}",
    ]


def _lossless_candidate(s: dict[str, Any]) -> str:
    """``pillar``, with what the run changed in the serving setup (earlier runs recorded none of it)."""
    setup = [
        s.get("attention_backend") if s.get("attention_backend") not in (None, "triton") else "",
        "radix" if s.get("radix_cache") else "",
        f"chunk {s['chunked_prefill_size']}" if s.get("chunked_prefill_size") else "",
        f"prefix {s['shared_prefix_tokens']}" if s.get("shared_prefix_tokens") else "",
        f"long {s['long_prompt_tokens']}" if s.get("long_prompt_tokens") else "",
    ]
    return " ".join(["pillar", *filter(None, setup)])


def lossless_markdown(docs: Sequence[dict[str, Any]]) -> str:
    docs = [d for d in docs if d.get("kind") == "lossless"]
    if not docs:
        return ""
    rows, acc_rows = [], []
    for d in sorted(docs, key=lambda d: d["meta"]["run_id"]):
        s, ident, rep = d["settings"], d.get("identity"), d.get("stock_repeat")
        stock_cells = [
            f"{rep['identical']}/{rep['num_requests']}" if rep else "-",
            fmt(ident.get("reference_margin_median"), ".2f") if ident else "-",
        ]
        head = [d["meta"]["run_id"]]
        rows.append(
            [
                *head,
                _lossless_candidate(s),
                s["num_steps"],
                s["num_prompts"],
                s["max_new_tokens"],
                d.get("verdict"),
                *_identity_cells(ident),
                *stock_cells,
            ]
        )
        for i, rep_ident in enumerate(d.get("identity_repeats", [])):
            rows.append(
                [
                    *head,
                    f"pillar repeat {i + 1}",
                    s["num_steps"],
                    s["num_prompts"],
                    s["max_new_tokens"],
                    "-",
                    *_identity_cells(rep_ident),
                    *stock_cells,
                ]
            )
        for name, control in d.get("controls", {}).items():
            rows.append(
                [
                    *head,
                    name,
                    "-",
                    s["num_prompts"],
                    s["max_new_tokens"],
                    "-",
                    *_identity_cells(control.get("identity")),
                    *stock_cells,
                ]
            )
        for a in d.get("acceptance", []):
            acc_rows.append(
                [
                    d["meta"]["run_id"],
                    s["num_steps"],
                    a["temperature"],
                    a["max_new_tokens"],
                    a.get("num_requests", "-"),
                    fmt(a.get("accept_length_overall"), ".3f"),
                    fmt(a.get("accept_length_mean"), ".3f"),
                    a["status"],
                ]
            )
    # The thresholds the files were judged by, as each recorded it (the check's NEAR_TIE_NATS when it ran).
    ties = sorted({d["identity"]["near_tie_nats"] for d in docs if (d.get("identity") or {}).get("near_tie_nats")})
    return (
        "### Losslessness (greedy token ids vs stock)\n\n"
        "A divergence is a *near tie* when stock's own top-2 log-probability gap at that token was at most "
        f"{' / '.join(f'{t:g} nats' for t in ties) or 'the threshold its file records'} (bf16 rounding of the "
        "k+1-token verify kernel can flip it); unexplained "
        "early divergences fail the run. A `repeat` row is the same PILLAR server answering the same requests "
        "again (reused request rows and KV slots), judged like the first pass. Controls are other speculative "
        "configs through the same check.\n\n"
        + markdown_table(LOSSLESS_HEADERS, rows)
        + "\n\n### PILLAR acceptance\n\n"
        + markdown_table(ACCEPT_HEADERS, acc_rows)
        + "\n"
    )


def _server_env(doc: dict[str, Any], config: str) -> dict[str, str]:
    """The environment an acceptance run gave ``config``'s server: run-wide --env plus the config's own."""
    return {**doc["settings"].get("env", {}), **doc["servers"].get(config, {}).get("env", {})}


def _knobs_text(env: dict[str, str], skip: tuple[str, ...] = ()) -> str:
    return " ".join(f"{k.removeprefix('SPARSESPEC_')}={v}" for k, v in sorted(env.items()) if k not in skip)


ACCEPTANCE_HEADERS = (
    "run",
    "config",
    "server env",
    "tail / select every",
    "prompts / conc",
    "T",
    "new tokens",
    "accept len",
    ">= j drafts accepted, j = 1..k",
)


def _resolved_knobs(doc: dict[str, Any], config: str) -> str:
    """Recent window and selection cadence the server resolved (recorded since the knobs' defaults changed)."""
    pc = doc["servers"].get(config, {}).get("pillar_config")
    return f"{pc['recent_window']} / {pc['select_every']}" if pc else "not recorded"


def acceptance_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """Draft policies side by side: accept length and the share of verify steps accepting >= j drafts."""
    rows = []
    for d in sorted((d for d in docs if d.get("kind") == "acceptance"), key=lambda d: d["meta"]["run_id"]):
        s = d["settings"]
        for config, passes in d["results"].items():
            env_text = _knobs_text(_server_env(d, config)) or "-"
            resolved = _resolved_knobs(d, config)
            for a in passes:
                rates = " ".join(f"{r:.2f}" for r in a.get("accept_rate_by_position") or []) or "-"
                load = f"{s.get('num_prompts', '-')} / {s.get('concurrency') or s.get('num_prompts', '-')}"
                rows.append(
                    [
                        d["meta"]["run_id"],
                        config,
                        env_text,
                        resolved,
                        load,
                        a["temperature"],
                        s["max_new_tokens"],
                        fmt(a.get("accept_length_overall"), ".2f"),
                        rates,
                    ]
                )
    if not rows:
        return ""
    return (
        "### Draft policies (acceptance)\n\n"
        "Same prompts and fixed-length outputs for every policy; `oracle` selects each draft query's own "
        "exact top-K (an upper bound, analysis only). Server env lists PILLAR knobs that differ from the "
        "defaults of the commit that ran; tail / select every are the values the server resolved.\n\n"
        + markdown_table(ACCEPTANCE_HEADERS, rows)
        + "\n"
    )


def exactness_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """Every exactness run: per setting and token position, the chi-square of PILLAR (or a control) vs the
    run's reference server (stock before schema 2)."""
    rows = []
    for d in sorted((d for d in docs if d.get("kind") == "exactness"), key=lambda d: d["meta"]["run_id"]):
        control = d.get("control") or {}
        parity = d.get("parity") or {}
        # a run whose power check did not run has no verdict threshold; its parity comparison judged at the same one
        threshold = d.get("bonferroni_threshold") or parity.get("threshold")
        reference = d["settings"].get("reference", "stock")
        verdict = d.get("verdict", "-") + (f"; parity {parity['verdict']}" if "verdict" in parity else "")
        for t in d["tests"]:
            judged = "-" if threshold is None else ("rejects" if t["p_value"] < threshold else "passes")
            rows.append(
                [
                    d["_file"],
                    str(d["meta"]["git_commit"])[:12],
                    t.get("config", d["settings"]["candidate"]),
                    reference,
                    t["temperature"],
                    t["top_p"],
                    t["context"],
                    t["position"],
                    fmt(t["stat"], ".1f"),
                    t["df"],
                    f"{t['p_value']:.3g}",
                    f"{control['p_value']:.3g}" if "p_value" in control else "-",
                    judged,
                    verdict,
                ]
            )
    if not rows:
        return ""
    return (
        "### Sampled exactness (exactness)\n\n"
        "Two-sample chi-square of the token at each position (1: the prefill's; 2 on: pairs with the token before) "
        "against the reference server's on the same context; control = the reference vs itself at a higher "
        "temperature (must reject); `at alpha / tests` judges each test at the run's Bonferroni threshold. Verdict "
        "NUMERICS: token 1, drawn before any PILLAR code runs, differs, so the servers' forwards round differently "
        "and the run says nothing about the speculation. `parity WITHIN`: every test PILLAR rejects deviates from the "
        "reference no more than a control speculation's (SGLang's own, against the same reference) does; BEYOND: "
        "one deviates more.\n\n"
        + markdown_table(
            (
                "file",
                "commit",
                "config",
                "reference",
                "T",
                "top p",
                "context",
                "token",
                "chi2",
                "df",
                "p",
                "control p",
                "at alpha / tests",
                "verdict",
            ),
            rows,
        )
        + "\n"
    )


SIM_HEADERS = (
    "file",
    "prompt",
    "new tokens",
    "recent window",
    "min budget",
    "budget ratio",
    "select every",
    "score rows",
    "rounds by",
    "model / score dtype",
    "policy",
    "accept len",
    "draft set",
    "rounds",
    "lossless",
    "accept len per 1K output tokens",
)


def _rounds_by(settings: dict[str, Any]) -> str:
    """How a policy_sim run decoded: greedy, or sampled at its temperature / top-p (seed)."""
    t = settings.get("temperature", 0.0)
    return "greedy" if not t else f"T {t:g} / top-p {settings.get('top_p', 1.0):g} (seed {settings.get('seed', 0)})"


def policy_sim_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """CPU reference rounds (tools/policy_sim.py): accept length per policy and knobs."""
    rows = []
    for d in sorted((d for d in docs if d.get("kind") == "policy_sim"), key=lambda d: d["_file"]):
        s = d["settings"]
        for policy, r in d["results"].items():
            div = r.get("first_divergence_from_greedy", "unchecked")
            lossless = "unchecked" if div == "unchecked" else ("yes" if div is None else f"diverged at {div}")
            rows.append(
                [
                    d["_file"],
                    s["source"],
                    s["max_new_tokens"],
                    s["recent_window"],
                    s["min_budget"],
                    fmt(s.get("budget_ratio")),
                    s.get("select_every", 1),
                    s.get("score_rows", "all"),
                    _rounds_by(s),
                    f"{s.get('dtype', 'float32')} / {s.get('score_dtype', 'float32')}",
                    policy,
                    fmt(r["accept_length"], ".2f"),
                    fmt(r.get("mean_draft_set"), ".0f"),
                    r["rounds"],
                    lossless,
                    " ".join(f"{a:.1f}" for a in r.get("accept_length_by_segment", [])) or "-",
                ]
            )
    if not rows:
        return ""
    return (
        "### Draft policies in the CPU reference (policy_sim)\n\n"
        "Rounds re-run in the model's own HF attention on CPU, greedy or sampled (rejection sampling), same plans "
        "as the worker (the GPU serves "
        "bf16 and stores `pillar`'s per-layer scores in fp16); "
        "draft set = prefix positions a draft step attends per layer and KV head, mean over rounds; "
        "`lossless` = output equals plain greedy decoding; the last column splits the output into 1024-token "
        "slices (the rounds that started in each).\n\n" + markdown_table(SIM_HEADERS, rows) + "\n"
    )


FIDELITY_HEADERS = (
    "file",
    "prompt",
    "answer tokens",
    "advance",
    "budget ratio",
    "min budget",
    "recent window",
    "select every",
    "reference",
    "p and q at",
    "verify rows past the commit",
    "rule",
    "E (tokens a round)",
    "a_j by draft position",
    "draft set",
    "rounds",
)


def draft_fidelity_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """Teacher-forced draft fidelity (tools/draft_fidelity.py): each rule's acceptance along one reference text."""
    rows = []
    for d in sorted((d for d in docs if d.get("kind") == "draft_fidelity"), key=lambda d: d["_file"]):
        s = d["settings"]
        for rule, r in d["results"].items():
            rows.append(
                [
                    d["_file"],
                    s["source"],
                    len(d["reference_ids"]),
                    s["advance"],
                    fmt(s["budget_ratio"]),
                    s["min_budget"],
                    s["recent_window"],
                    s["select_every"],
                    d["reference_kind"],
                    f"T {s['temperature']:g} / top-p {s['top_p']:g}",
                    s.get("verify_tail", "reference"),
                    rule,
                    fmt(r["mean_expected_tokens"], ".3f"),
                    " ".join(f"{a:.3f}" for a in r["mean_accept_prob_by_position"]),
                    fmt(r["mean_draft_set"], ".0f"),
                    r["rounds"],
                ]
            )
    if not rows:
        return ""
    return (
        "### Draft fidelity along one text (draft_fidelity)\n\n"
        "Every rule drafts along one reference text after the problem's prompt (teacher-forced, CPU, fp32, scores "
        "stored in fp16 as on the GPU): the model's own sampled answer (which loops after ~1K tokens) or the "
        "problem's written solution. a_j = the probability that "
        "rejection sampling accepts draft j (sum of min(p, q) of its distribution and the verify's), "
        "E = 1 + a_0 + a_0 a_1 + ..., the tokens a round of k drafts emits on average; each round commits "
        "`advance` tokens. Rules of one file saw the same positions. The verify rows past the committed tokens score "
        "the prefix as a served verify's do (fed a rejected draft and the drafts after it: `served`), or, in the "
        "runs before that, were fed the reference tokens the next round drafts from (`reference`): rows that scored "
        "for the next round's own queries and overstate the scored rules (pillar, coarse; design.md, Along one "
        "text); streaming reads no scores.\n\n" + markdown_table(FIDELITY_HEADERS, rows) + "\n"
    )
