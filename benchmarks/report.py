"""Merge result JSONs into markdown tables (and PNG plots when matplotlib is installed).

    python -m benchmarks.report [--results-dir benchmarks/results] [--out SUMMARY.md] [--readme docs/results.md]

--readme docs/results.md also writes one page of tables per result kind into docs/results/ and their
index between the page's results markers; the text around the markers is left as is.

Ratios compare a config with the ``stock`` config of the same run id (one GPU session),
the same workload and the same concurrency; across runs the hardware state differs
(clocks, neighbours), so no cross-run ratio is ever printed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import step_times
from benchmarks.lossless import NEAR_TIE_NATS
from benchmarks.schedule import full_batch_rate

DEFAULT_RESULTS = Path(__file__).resolve().parent / "results"
CONFIG_ORDER = ("stock", "stock-flashinfer", "ngram", "pillar")


REPORTED_KINDS = ("throughput", "lossless", "acceptance", "kernels", "policy_sim", "step_times", "exactness", "offload")


def result_kind(doc: Any) -> str | None:
    """The result kind of a JSON document; kernels_bench files before it wrote ``kind`` have its sections."""
    if not isinstance(doc, dict):
        return None
    if "kind" not in doc and {"sparse_decode", "score_capture", "selection"} <= doc.keys():
        return "kernels"
    return doc.get("kind")


def load_results(results_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Result documents (the ``REPORTED_KINDS``) in ``results_dir``, plus notes about skipped files."""
    docs, notes = [], []
    for path in sorted(Path(results_dir).glob("*.json")):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            notes.append(f"skipped {path.name}: {e}")
            continue
        kind = result_kind(doc)
        if kind in REPORTED_KINDS:
            doc["kind"] = kind
            doc["_file"] = path.name
            docs.append(doc)
        else:
            notes.append(f"skipped {path.name}: not a benchmark result")
    return docs, notes


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _config_rank(name: str) -> tuple[int, str]:
    base = name.split("-k")[0]
    return (CONFIG_ORDER.index(base) if base in CONFIG_ORDER else len(CONFIG_ORDER), name)


def workload_key(doc: dict[str, Any]) -> tuple[Any, ...]:
    w = doc.get("workload", {})
    return (w.get("kind"), w.get("output_len"), w.get("input_len"), w.get("temperature"), w.get("top_p"),
            w.get("request_rate", "inf"))  # fmt: skip


def throughput_rows(docs: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (config, concurrency) run, with ``ratio_vs_stock`` (out tok/s over stock's),
    ``ratio_vs_best_stock`` (over the fastest ``stock*`` config's: Triton, FlashInfer),
    ``e2e_vs_stock`` (stock's mean request latency over this config's: > 1 when requests finish sooner)
    and ``full_vs_stock`` (the full-batch rates' ratio, ``benchmarks/schedule.py``) filled where a stock
    row of the same run id, workload and concurrency matches."""
    rows = []
    for doc in docs:
        if doc.get("kind") != "throughput":
            continue
        for run in doc.get("runs", []):
            m = run.get("metrics") or {}
            made = run.get("measured") or doc["meta"]  # a run resumed from an earlier command keeps its provenance
            rows.append({
                "run_id": doc["meta"]["run_id"],
                "device": made.get("device"),
                "workload": workload_key(doc),
                "config": doc["config"]["name"],
                "concurrency": run["concurrency"],
                "num_prompts": run.get("num_prompts"),
                "status": run["status"],
                "metrics": m,
                "tok_s": m.get("output_throughput") if run["status"] == "ok" else None,
                "full_tok_s": _full_batch_rate(run, doc),
                "commit": str(made.get("git_commit"))[:12],
                "stream_interval": stream_interval(doc["config"].get("flags", [])),
            })  # fmt: skip
    base = {(r["run_id"], r["workload"], r["concurrency"]): r for r in rows if r["config"] == "stock" and r["tok_s"]}
    # The best stock backend of the same point (stock = Triton, stock-flashinfer, ...): what a user compares with.
    best: dict[tuple[Any, ...], float] = {}
    for r in rows:
        if r["config"].startswith("stock") and r["tok_s"]:
            point = (r["run_id"], r["workload"], r["concurrency"])
            best[point] = max(best.get(point, 0.0), r["tok_s"])
    for r in rows:
        b = base.get((r["run_id"], r["workload"], r["concurrency"]))
        r["ratio_vs_stock"] = _ratio(r["tok_s"], b["tok_s"]) if b else None
        r["ratio_vs_best_stock"] = _ratio(r["tok_s"], best.get((r["run_id"], r["workload"], r["concurrency"])))
        r["e2e_vs_stock"] = _ratio(b["metrics"].get("mean_e2e_latency_ms"), r["metrics"].get("mean_e2e_latency_ms")) if b else None
        r["full_vs_stock"] = _ratio(r["full_tok_s"], b["full_tok_s"]) if b else None
    rows.sort(key=lambda r: (r["run_id"], str(r["workload"]), _config_rank(r["config"]), r["concurrency"]))
    return rows


def _full_batch_rate(run: dict[str, Any], doc: dict[str, Any]) -> float | None:
    """The run's output tok/s while every slot was busy (None without per-request data or a second wave, and
    for Poisson arrivals, where requests do not start as others end)."""
    pr, m = run.get("per_request"), run.get("metrics") or {}
    if run["status"] != "ok" or not pr or not m.get("duration") or doc["workload"].get("request_rate", "inf") != "inf":
        return None
    return full_batch_rate(pr["e2e_s"], pr["ttft_s"], pr["output_len"], run["concurrency"], m["duration"])


THROUGHPUT_HEADERS = (
    "config", "conc", "reqs", "out tok/s", "vs stock", "vs best stock", "E2E vs stock", "full-batch tok/s",
    "full-batch vs stock", "TPOT med ms", "TPOT p99 ms",
    "ITL med ms", "ITL p99 ms", "TTFT med ms", "TTFT mean ms", "E2E mean s", "E2E p99 s", "busy", "accept len", "status",
)  # fmt: skip


def throughput_table(rows: Sequence[dict[str, Any]]) -> str:
    def cells(r: dict[str, Any]) -> list[str]:
        m = r["metrics"]
        return [
            r["config"], r["concurrency"], fmt(r["num_prompts"], "d"), fmt(r["tok_s"], ".0f"),
            fmt(r["ratio_vs_stock"], ".2f", "x"), fmt(r["ratio_vs_best_stock"], ".2f", "x"), fmt(r["e2e_vs_stock"], ".2f", "x"),
            fmt(r["full_tok_s"], ".0f"), fmt(r["full_vs_stock"], ".2f", "x"), fmt(m.get("median_tpot_ms")), fmt(m.get("p99_tpot_ms")),
            fmt(m.get("median_itl_ms")), fmt(m.get("p99_itl_ms")), fmt(m.get("median_ttft_ms"), ".1f"),
            fmt(m.get("mean_ttft_ms"), ".0f"),  # a mean far above the median: some requests waited (a stall)
            fmt(_seconds(m.get("mean_e2e_latency_ms")), ".1f"), fmt(_seconds(m.get("p99_e2e_latency_ms")), ".1f"),
            # Mean requests in flight over the concurrency: below 100%, slots sat idle (a drain, slow admissions).
            fmt(_pct(_ratio(m.get("concurrency"), r["concurrency"])), ".0f", "%"),
            fmt(m.get("accept_length")), r["status"],
        ]  # fmt: skip

    return markdown_table(THROUGHPUT_HEADERS, (cells(r) for r in rows))


def _seconds(ms: Any) -> float | None:
    return ms / 1000 if isinstance(ms, (int, float)) else None


def describe_workload(key: tuple[Any, ...]) -> str:
    _, out_len, _, temp, top_p, rate = key
    nucleus = "" if top_p is None else f", top-p {top_p:g}"  # runs before --top-p existed did not record it
    arrivals = "" if rate == "inf" else f", Poisson arrivals at {rate:g} requests/s"
    return f"AIME24+AMC23 chat prompts, {out_len} output tokens (ignore_eos), temperature {temp}{nucleus}{arrivals}"


STREAM_INTERVAL_1_NOTE = (
    "**Bounded by streaming, not decoding:** at stream interval 1 SGLang's per-token streaming path capped what "
    "reached the client (stock: a flat ~13-14K tok/s from 32 to 256 requests at 2K tokens while the scheduler "
    "logged 45-64K; 34K tok/s at stream interval 8 for 256 x 4K). Speculative configs send one event per round, "
    "so their ratios here are inflated. Kept for the record; compare runs at stream interval 8.\n"
)


def stream_interval(flags: Sequence[str]) -> int:
    """The server's --stream-interval (SGLang's default is 1)."""
    flags = list(flags)
    return int(flags[flags.index("--stream-interval") + 1]) if "--stream-interval" in flags else 1


def commits_text(rows: Sequence[dict[str, Any]]) -> str:
    """``commit X``, or, where the configs of one run id ran at several commits (a sweep's chunks run over
    sessions), ``commits X (config, ...), Y (...)``: each config's rows say which code produced them."""
    by_commit: dict[str, list[str]] = {}
    for r in rows:
        names = by_commit.setdefault(r["commit"], [])
        if r["config"] not in names:
            names.append(r["config"])
    if len(by_commit) == 1:
        return f"commit {next(iter(by_commit))}"
    return "commits " + ", ".join(f"{c} ({', '.join(names)})" for c, names in by_commit.items())


def throughput_markdown(docs: Sequence[dict[str, Any]]) -> str:
    rows = throughput_rows(docs)
    if not rows:
        return ""
    out = []
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["run_id"], r["workload"]), []).append(r)
    meta_by_run = {d["meta"]["run_id"]: d["meta"] for d in docs if d.get("kind") == "throughput"}
    for (run_id, wkey), group in groups.items():
        meta = meta_by_run[run_id]
        interval = "/".join(map(str, sorted({r["stream_interval"] for r in group})))
        out.append(
            f"### Throughput, run {run_id}\n\n{meta.get('device')}; sglang {meta.get('sglang_version')}; "
            f"{commits_text(group)}; {describe_workload(wkey)}; stream interval {interval}.\n"
        )
        if interval == "1":
            out.append(STREAM_INTERVAL_1_NOTE)
        out.append(throughput_table(group) + "\n")
    return "\n".join(out)


def plain_vs_stock_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """Stock's decode step (``decode_step_ms``: its server log, by cell) against PILLAR's plain round (its
    ``pillar_state`` cells: round + gap) at the same run id, workload, concurrency and cell (batch bucket
    x context). Above 1.00x, a round of plain decoding costs more than stock's step: where the adaptive
    policy chooses it, PILLAR is slower than stock by that much. Cells stock logged fewer than 3 clean
    intervals of are left out."""
    runs = [(d, r) for d in docs if d.get("kind") == "throughput" for r in d.get("runs", [])]
    stock = {(d["meta"]["run_id"], workload_key(d), r["concurrency"]): r["decode_step_ms"]
             for d, r in runs if d["config"]["name"] == "stock" and r.get("decode_step_ms")}  # fmt: skip
    rows = []
    for d, r in runs:
        steps = stock.get((d["meta"]["run_id"], workload_key(d), r["concurrency"]))
        cells = (r.get("pillar_state") or {}).get("cells") or {}
        for cell, step in (steps or {}).items():
            c = cells.get(cell) or {}
            if step["lines"] < 3 or c.get("plain") is None:
                continue
            plain = c["plain"] + (c.get("gap") or 0.0)
            rows.append([d["meta"]["run_id"], d["config"]["name"], r["concurrency"], cell, step["lines"],
                         f"{step['ms']:.2f}", f"{plain:.2f}", f"{plain / step['ms']:.2f}x"])  # fmt: skip
    if not rows:
        return ""
    head = ("### Plain rounds against stock's decode step\n\nms per step: stock from its own log lines (running "
            "requests / tok/s over 40 steps, median), PILLAR's plain round (k = 0) from its CUDA events plus the "
            "gap before it. Above 1.00x, plain decoding costs more than stock's step.\n")  # fmt: skip
    return head + "\n" + markdown_table(["run", "config", "conc", "cell", "stock intervals", "stock ms",
                                         "plain ms", "plain / stock"], rows) + "\n"  # fmt: skip


LOSSLESS_HEADERS = (
    "run", "candidate", "k", "prompts", "max new", "verdict", "identical", "early div", "near-tie div",
    "unexplained early", "max div margin", "first div min/med", "stock self-identical", "stock margin med",
)  # fmt: skip
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
    setup = [s.get("attention_backend") if s.get("attention_backend") not in (None, "triton") else "",
             "radix" if s.get("radix_cache") else "", f"chunk {s['chunked_prefill_size']}" if s.get("chunked_prefill_size") else "",
             f"prefix {s['shared_prefix_tokens']}" if s.get("shared_prefix_tokens") else "",
             f"long {s['long_prompt_tokens']}" if s.get("long_prompt_tokens") else ""]  # fmt: skip
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
        rows.append([*head, _lossless_candidate(s), s["num_steps"], s["num_prompts"], s["max_new_tokens"], d.get("verdict"),
                     *_identity_cells(ident), *stock_cells])  # fmt: skip
        for i, rep_ident in enumerate(d.get("identity_repeats", [])):
            rows.append([*head, f"pillar repeat {i + 1}", s["num_steps"], s["num_prompts"], s["max_new_tokens"], "-",
                         *_identity_cells(rep_ident), *stock_cells])  # fmt: skip
        for name, control in d.get("controls", {}).items():
            rows.append([*head, name, "-", s["num_prompts"], s["max_new_tokens"], "-",
                         *_identity_cells(control.get("identity")), *stock_cells])  # fmt: skip
        for a in d.get("acceptance", []):
            acc_rows.append([
                d["meta"]["run_id"], s["num_steps"], a["temperature"], a["max_new_tokens"], a.get("num_requests", "-"),
                fmt(a.get("accept_length_overall"), ".3f"), fmt(a.get("accept_length_mean"), ".3f"), a["status"],
            ])  # fmt: skip
    return (
        "### Losslessness (greedy token ids vs stock)\n\n"
        "A divergence is a *near tie* when stock's own top-2 log-probability gap at that token was at most "
        f"{NEAR_TIE_NATS} nats (bf16 rounding of the k+1-token verify kernel can flip it); unexplained "
        "early divergences fail the run. A `repeat` row is the same PILLAR server answering the same requests "
        "again (reused request rows and KV slots), judged like the first pass. Controls are other speculative "
        "configs through the same check.\n\n"
        + markdown_table(LOSSLESS_HEADERS, rows)
        + "\n\n### PILLAR acceptance\n\n" + markdown_table(ACCEPT_HEADERS, acc_rows) + "\n"
    )  # fmt: skip


def _server_env(doc: dict[str, Any], config: str) -> dict[str, str]:
    """The environment an acceptance run gave ``config``'s server: run-wide --env plus the config's own."""
    return {**doc["settings"].get("env", {}), **doc["servers"].get(config, {}).get("env", {})}


def _knobs_text(env: dict[str, str], skip: tuple[str, ...] = ()) -> str:
    return " ".join(f"{k.removeprefix('SPARSESPEC_')}={v}" for k, v in sorted(env.items()) if k not in skip)


ACCEPTANCE_HEADERS = ("run", "config", "server env", "tail / select every", "prompts / conc", "T", "new tokens",
                      "accept len", ">= j drafts accepted, j = 1..k")  # fmt: skip


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
                rows.append([d["meta"]["run_id"], config, env_text, resolved, load, a["temperature"], s["max_new_tokens"],
                             fmt(a.get("accept_length_overall"), ".2f"), rates])  # fmt: skip
    if not rows:
        return ""
    return (
        "### Draft policies (acceptance)\n\n"
        "Same prompts and fixed-length outputs for every policy; `oracle` selects each draft query's own "
        "exact top-K (an upper bound, analysis only). Server env lists PILLAR knobs that differ from the "
        "defaults of the commit that ran; tail / select every are the values the server resolved.\n\n"
        + markdown_table(ACCEPTANCE_HEADERS, rows) + "\n"
    )


def verify_kernel_table(d: dict[str, Any]) -> str:
    """Verify attention of a kernels_bench file: SGLang's extend kernel vs the split kernel, plus what PILLAR adds."""
    rows = [[r["shape"], r["bs"], r["seq_len"], fmt(_num(r.get("verify_attn_us")), ".1f"),
             fmt(_num(r.get("split_verify_attn_us")), ".1f"), fmt(_num(r.get("split_verify_GBps")), ".0f"),
             fmt(_ratio(r.get("verify_attn_us"), r.get("split_verify_attn_us")), ".1f", "x"), fmt(r["fp16_out_us"], ".1f"),
             fmt(_pct(r.get("capture_plus_select_frac_of_split_verify")), ".0f", "%"),
             fmt(_pct(r.get("capture_plus_select_frac_of_verify_attn")), ".0f", "%")]
            for r in d["score_capture"]]  # fmt: skip
    return (
        "Verify attention (k+1 = 9 causal rows per request over the prefix, LSE on), microseconds per layer: "
        "SGLang's Triton extend kernel vs PILLAR's split-KV kernel (GB/s = prefix K/V/index bytes / time), and "
        "what PILLAR adds per verify layer (fp16 score capture + the per-layer share of one all-layer top-K) "
        "relative to each:\n\n"
        + markdown_table(("shape", "bs", "L", "SGLang verify us", "split verify us", "split GB/s", "speedup",
                          "capture us", "capture + select / split", "capture + select / SGLang"), rows)
    )  # fmt: skip


def exactness_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """Every exactness run: per setting and token position, the chi-square of PILLAR (or a control) vs the
    run's reference server (stock before schema 2)."""
    rows = []
    for d in sorted((d for d in docs if d.get("kind") == "exactness"), key=lambda d: d["meta"]["run_id"]):
        control = d.get("control") or {}
        threshold = d.get("bonferroni_threshold")
        reference = d["settings"].get("reference", "stock")
        for t in d["tests"]:
            judged = "-" if threshold is None else ("rejects" if t["p_value"] < threshold else "passes")
            rows.append([d["_file"], str(d["meta"]["git_commit"])[:12], t.get("config", d["settings"]["candidate"]),
                         reference, t["temperature"], t["top_p"], t["context"], t["position"], fmt(t["stat"], ".1f"),
                         t["df"], f"{t['p_value']:.3g}", f"{control.get('p_value', float('nan')):.3g}", judged,
                         d.get("verdict", "-")])  # fmt: skip
    if not rows:
        return ""
    return (
        "### Sampled exactness (exactness)\n\n"
        "Two-sample chi-square of the token at each position (1: the prefill's; 2 on: pairs with the token before) "
        "against the reference server's on the same context; control = the reference vs itself at a higher "
        "temperature (must reject); `at alpha / tests` judges each test at the run's Bonferroni threshold. Verdict "
        "NUMERICS: token 1, drawn before any PILLAR code runs, differs, so the servers' forwards round differently "
        "and the run says nothing about the speculation.\n\n"
        + markdown_table(("file", "commit", "config", "reference", "T", "top p", "context", "token", "chi2", "df", "p",
                          "control p", "at alpha / tests", "verdict"), rows)
        + "\n"
    )


def kernels_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """Kernel microbenchmarks: sparse draft attention vs full decode, score-capture and selection cost."""
    parts = []
    for d in (d for d in docs if d.get("kind") == "kernels" and "tune" in d):
        parts.append(f"### Kernel launch sweep ({d['_file']})\n\n{d['device']}; commit {str(d['git_commit'])[:12]}; "
                     f"microseconds per layer; the fastest launch per kernel and point:\n\n" + tune_table(d["tune"]) + "\n")
    for d in (d for d in docs if d.get("kind") == "kernels" and "tune" not in d):
        head = f"{d['device']}; commit {str(d['git_commit'])[:12]}; {d['config']['timing']}; microseconds per layer."
        dec = [[r["shape"], r["bs"], r["seq_len"], r["selected"] + r["tail"], fmt(r["sparse_us"], ".1f"),
                fmt(r["sparse_GBps"], ".0f"), fmt(_num(r.get("sglang_full_us")), ".1f"),
                fmt(_num(r.get("flashinfer_full_us")), ".1f"), fmt(_ratio(r.get("sglang_full_us"), r["sparse_us"]), ".1f", "x"),
                fmt(_ratio(r.get("flashinfer_full_us"), r["sparse_us"]), ".1f", "x")]
               for r in d["sparse_decode"]]  # fmt: skip
        sel = [[r["shape"], r["bs"], r["seq_len"], r["k"], fmt(r["all_layers_launch_us"], ".0f"),
                fmt(r["all_layers_per_layer_fp16_bn4096_us"], ".1f"), fmt(r["torch_topk_sort_per_layer_us"], ".1f")]
               for r in d["selection"]]  # fmt: skip
        parts.append(
            f"### Kernels ({d['_file']})\n\n{head}\n\n"
            "Sparse draft attention (5% budget + 16-token tail, per-KV-head lists) vs full-context decode:\n\n"
            + markdown_table(("shape", "bs", "L", "attended", "sparse us", "sparse GB/s", "SGLang triton full us",
                              "FlashInfer full us", "vs triton", "vs FlashInfer"), dec)
            + "\n\n" + verify_kernel_table(d)
            + "\n\nTop-K selection over all (layer, KV head) rows, fp32 scores in one launch; fp16 per layer; "
            "torch.topk + sort per layer for reference:\n\n"
            + markdown_table(("shape", "bs", "L", "K", "all layers us (fp32)", "per layer us (fp16)", "torch per layer us"), sel)
            + "\n"
        )
    return "\n".join(parts)


def _launch(r: dict[str, Any]) -> str:
    """A tune row's launch parameters: a work-list launch's chunk and pool, else splits and tile."""
    if "chunk" in r:
        return f"chunk {r['chunk']}, {r['programs_per_request']} programs / request"
    return f"splits {r['splits']}, tile {r['block_n']}, {r['warps']} warps" + (f", {r['stages']} stages" if "stages" in r else "")


def tune_table(rows: Sequence[dict[str, Any]]) -> str:
    """Per (kernel, shape, batch, L) of a ``kernels_bench --tune`` run: its fastest launch, next to SGLang's
    decode kernel on the same pool (one query row per request, the same prefix)."""
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    stock = {(r["shape"], r["bs"], r["seq_len"]): r["us"] for r in rows if r["kernel"] == "sglang_decode"}
    for r in rows:
        key = (r["kernel"], r["shape"], r["bs"], r["seq_len"])
        if r["kernel"] != "sglang_decode" and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    cells = [[*key, _launch(r), fmt(r["us"], ".1f"), fmt(_num(stock.get(key[1:])), ".1f"), fmt(r.get("GBps"), ".0f")]
             for key, r in best.items()]  # fmt: skip
    return markdown_table(("kernel", "shape", "bs", "L", "fastest launch", "us", "SGLang decode us", "GB/s"), cells)


STEP_HEADERS = ("config", "L", "B", "stock decode step ms", "draft ms / round", "draft ms / step", "verify ms",
                "verify / stock step", "select ms", "round ms")  # fmt: skip
CAPTURE_HEADERS = ("config", "L", "B", "capture ms", "select ms", "share of verify step")


def _num_steps(flags: Sequence[str]) -> int | None:
    """k of a recorded PILLAR server (its --speculative-num-steps flag)."""
    return int(flags[flags.index("--speculative-num-steps") + 1]) if "--speculative-num-steps" in flags else None


def _step_rows(d: dict[str, Any]) -> list[list[str]]:
    """One row per measured (config, L, B) with PILLAR phase times, stock's decode step at the same point."""
    stock = {(r["context"], r["batch"]): r.get("step_ms") for r in d["servers"].get("stock", {}).get("rows", [])}
    # Recomputed rather than read from the file, so runs recorded before a projection existed show it too.
    projected = step_times.projections(d["servers"], d["settings"].get("accept_assumed"))
    proj = {(p["config"], p["context"], p["batch"]): p for p in projected}
    with_proj = d["settings"].get("accept_assumed") is not None
    rows = []
    for name, rec in d["servers"].items():
        k = _num_steps(rec["flags"])
        for r in (r for r in rec["rows"] if "round_ms" in r):
            point = (r["context"], r["batch"])
            rows.append([name, *point, fmt(stock.get(point), ".3f"), fmt(r["draft_ms"], ".3f"),
                         fmt(r["draft_ms"] / k if k else None, ".3f"), fmt(r["verify_ms"], ".3f"),
                         # Issue 20's bar for the verify pass: <= 1.3x a decode step at the same batch and context
                         # (a step <= 0 ms is a failed measurement: no ratio).
                         fmt(_ratio(r["verify_ms"], step) if (step := stock.get(point) or 0) > 0 else None, ".2f", "x"),
                         fmt(r["select_ms"], ".3f"), fmt(r["round_ms"], ".3f")]
                        + (_projected(proj.get((name, *point))) if with_proj else []))  # fmt: skip
    return rows


def _projected(p: dict[str, Any] | None) -> list[str]:
    """The projection cells of a row: speedup, mixed-phase round's best case and its speedup."""
    p = p or {}
    return [fmt(p.get("projected_speedup"), ".2f", "x"), fmt(p.get("mixed_round_ms"), ".3f"),
            fmt(p.get("projected_speedup_mixed"), ".2f", "x")]  # fmt: skip


def _not_measured(d: dict[str, Any]) -> list[str]:
    """Servers that did not run and points skipped or failed, with the recorded reason."""
    out = [f"{name}: server {rec['status']}" for name, rec in d["servers"].items() if rec["status"] != "ok"]
    for name, rec in d["servers"].items():
        out += [f"{name} L={r['context']} B={r['batch']}: {r.get('skipped') or r.get('error')}"
                for r in rec["rows"] if "skipped" in r or "error" in r]  # fmt: skip
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
    return [c for c in step_times.capture_overhead(merged) if c["config"] in d["servers"] and c["twin"] not in d["servers"]]


def _ideal_table(d: dict[str, Any]) -> str:
    """Each phase's measured ms / its ideal ms (step_times.ideal_breakdown), flagged past 1.5x."""
    rows = step_times.ideal_breakdown(d)  # derived from the rows (a stored "ideal" in older files is ignored)
    if not rows:
        return ""
    phases = ("step", *step_times.PHASES, step_times.GAP, "round")
    cells = [[r["config"], r["context"], r["batch"], fmt(r["fixed_ms"], ".2f")]
             + [(f"{m:.2f} / {i:.2f}" + (" **!**" if i and m > 1.5 * i else "")) if (m, i) != (None, None) else "-"
                for m, i in (r["phases"].get(p, (None, None)) for p in phases)] for r in rows]  # fmt: skip
    return ("\n\nMeasured / ideal ms per round (`step_times.ideal_breakdown`: bytes / peak HBM bandwidth, plus a fixed "
            "per-forward cost for the forward phases; **!** = over 1.5x):\n\n"
            + markdown_table(("config", "L", "B", "fixed ms", *phases), cells))


def step_times_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """Per step_times run: stock decode step vs PILLAR's phases per (L, B), the projection, the capture cost."""
    parts = []
    for d in sorted((d for d in docs if d.get("kind") == "step_times"), key=lambda d: d["meta"]["run_id"]):
        meta, s = d["meta"], d["settings"]
        accept = s.get("accept_assumed")
        headers = STEP_HEADERS + ((f"projected speedup (accept {accept:g})", "mixed round ms (best case)",
                                   "projected speedup, mixed (best case)") if accept is not None else ())  # fmt: skip
        cap = [[c["config"] if c["twin"] in d["servers"] else f"{c['config']} (twin: {c['twin']})", c["context"],
                c["batch"], fmt(c["capture_ms"], ".3f"), fmt(c["select_ms"], ".3f"),
                fmt(_pct(c["capture_select_frac_of_verify"]), ".0f", "%")]
               for c in [*d.get("capture_overhead", []), *sibling_capture(d, docs)]]  # fmt: skip
        missing = "".join(f"\n- not measured: {n}" for n in _not_measured(d))
        ideal = _ideal_table(d)
        m1, m2 = s["decode_tokens"]
        parts.append(
            f"#### Step times, run {meta['run_id']} ({d['_file']})\n\n{meta.get('device')}; commit "
            f"{str(meta.get('git_commit'))[:12]}; shape {s['shape']}; M1/M2 = {m1}/{m2} output tokens; "
            f"weights {s.get('weights', 'dummy (random): times only')}; temperature {s.get('temperature', 0):g}, top-p {s.get('top_p', 1):g}.\n\n" + markdown_table(headers, _step_rows(d)) + "\n" + missing
            + ("\n\nScore capture (verify minus the streaming twin's verify) and selection, per round:\n\n"
               + markdown_table(CAPTURE_HEADERS, cap) if cap else "") + ideal + "\n"
        )  # fmt: skip
    if not parts:
        return ""
    return (
        "### Step times\n\n"
        "Per context L and batch B; with random weights (Qwen3 shapes) only times mean anything, a run's weights are "
        "named in its header. Stock decode step = wall "
        "time difference of two output lengths / their token difference (host overheads included); PILLAR phases "
        "= mean GPU ms per round from `SPARSESPEC_STEP_TIMING` (draft = k sparse steps, draft / step = draft / k). "
        "The projected speedup is a projection, not a measurement: an accept length measured on a real model x "
        "stock step / PILLAR round. Mixed round (best case) = the round less what its verify costs above stock's "
        "decode step at the same point (verify ms - stock step): the most mixed-phase batching could hide "
        "(docs/design.md). Capture = verify ms of a score-using policy minus its streaming twin's (same "
        "flags and knobs, `SPARSESPEC_POLICY=streaming`: no score capture, no LSE); share = (capture + select) / "
        "(verify + select).\n\n" + "\n".join(parts)
    )


SIM_HEADERS = ("file", "prompt", "new tokens", "recent window", "min budget", "budget ratio", "select every", "score rows",
               "model / score dtype", "policy",
               "accept len", "rounds", "lossless", "accept len per 1K output tokens")  # fmt: skip


def policy_sim_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """CPU reference rounds (benchmarks/policy_sim.py): accept length per policy and knobs."""
    rows = []
    for d in sorted((d for d in docs if d.get("kind") == "policy_sim"), key=lambda d: d["_file"]):
        s = d["settings"]
        for policy, r in d["results"].items():
            div = r.get("first_divergence_from_greedy", "unchecked")
            lossless = "unchecked" if div == "unchecked" else ("yes" if div is None else f"diverged at {div}")
            rows.append([d["_file"], s["source"], s["max_new_tokens"], s["recent_window"], s["min_budget"],
                         fmt(s.get("budget_ratio")), s.get("select_every", 1), s.get("score_rows", "all"),
                         f"{s.get('dtype', 'float32')} / {s.get('score_dtype', 'float32')}", policy, fmt(r["accept_length"], ".2f"),
                         r["rounds"], lossless,
                         " ".join(f"{a:.1f}" for a in r.get("accept_length_by_segment", [])) or "-"])  # fmt: skip
    if not rows:
        return ""
    return (
        "### Draft policies in the CPU reference (policy_sim)\n\n"
        "Greedy rounds re-run in the model's own HF attention on CPU, same plans as the worker (the GPU serves "
        "bf16 and stores `pillar`'s per-layer scores in fp16); "
        "`lossless` = output equals plain greedy decoding; the last column splits the output into 1024-token "
        "slices (the rounds that started in each).\n\n" + markdown_table(SIM_HEADERS, rows) + "\n"
    )


def _gb(n: Any) -> str:
    return f"{n / 1e9:.2f} GB" if isinstance(n, (int, float)) else "-"


def offload_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """One table per ``benchmarks.offload`` file: each run's out tok/s against the pressured stock run of the
    same file, retractions, parks and bytes moved, and its outputs' verdict against the unpressured reference."""
    parts = []
    for d in sorted((d for d in docs if d.get("kind") == "offload"), key=lambda d: d["meta"]["run_id"]):
        runs = d.get("runs", {})
        stock = (runs.get("stock") or {}).get("output_tok_s")
        rows = []
        for name, r in runs.items():
            moved = r.get("offload") or {}
            verdict = {True: "PASS", False: "FAIL"}.get(r.get("outputs_identical"), "-")
            if r.get("token_identical") is not None:
                verdict += f" ({r['token_identical']}/{d['requests']} identical)"
            rows.append([name, r.get("status"), fmt(r.get("output_tok_s"), ".0f"), fmt(_ratio(r.get("output_tok_s"), stock), ".2f", "x"),
                         r.get("retractions", "-"), f"{moved['parks']} / {moved['restores']}" if moved else "-",
                         _gb(moved.get("bytes_to_host")), _gb(moved.get("bytes_to_device")), verdict])  # fmt: skip
        m = d["meta"]
        parts.append(
            f"### Offload {d['_file']}\n\n{m['device']}; commit {m['git_commit']}; run {m['run_id']}. {d['requests']} "
            f"requests x {d['settings']['max_new_tokens']} tokens, demand {d['demand_tokens']} tokens over a GPU pool of "
            f"{d['pool_tokens']} (oversubscription {d['settings']['oversubscription']}), {d['settings']['host_gb']} GB "
            f"host, radix cache {'on' if d['settings'].get('radix_cache') else 'off'}. `ratio_vs_stock` "
            f"{fmt(d.get('ratio_vs_stock'), '.3f')}, `ratio_vs_stock_hicache` {fmt(d.get('ratio_vs_stock_hicache'), '.3f')}."
            "\n\n" + markdown_table(["run", "status", "out tok/s", "vs stock", "retractions", "parks / restores",
                                      "to host", "to device", "outputs vs reference"], rows) + "\n")  # fmt: skip
    return ("## Offload\n\n" + "\n".join(parts)) if parts else ""


def _num(v: Any) -> float | None:
    return v if isinstance(v, (int, float)) else None


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def _pct(v: Any) -> float | None:
    return 100 * v if isinstance(v, (int, float)) else None


def plot_throughput(docs: Sequence[dict[str, Any]], out_dir: Path) -> list[Path] | str:
    """One PNG per (run, workload): output tok/s and accept length vs concurrency. A note if no matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed; plots skipped (pip install matplotlib)."
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in throughput_rows(docs):
        if r["tok_s"] is not None:
            groups.setdefault((r["run_id"], r["workload"]), []).append(r)
    paths = []
    for (run_id, wkey), rows in groups.items():
        fig, (ax_t, ax_a) = plt.subplots(1, 2, figsize=(11, 4))
        for config in sorted({r["config"] for r in rows}, key=_config_rank):
            pts = sorted((r["concurrency"], r["tok_s"], r["metrics"].get("accept_length")) for r in rows if r["config"] == config)
            (line,) = ax_t.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=config)
            acc = [(c, a) for c, _, a in pts if a]
            if acc:
                ax_a.plot([c for c, _ in acc], [a for _, a in acc], marker="o", label=config, color=line.get_color())
        ax_a.set_ylim(bottom=1.0)  # 1 token per step = no speculation
        concs = sorted({r["concurrency"] for r in rows})
        for ax, ylabel in ((ax_t, "output tokens/s"), (ax_a, "accept length (tokens/verify)")):
            ax.set_xscale("log", base=2)
            ax.set_xticks(concs, [str(c) for c in concs])
            ax.set(xlabel="concurrency", ylabel=ylabel)
            ax.grid(True, alpha=0.3)
            if ax.lines:
                ax.legend()
        fig.suptitle(f"run {run_id}: {describe_workload(wkey)}", fontsize=9)
        fig.tight_layout()
        paths.append(out_dir / f"throughput_{run_id}_{wkey[0]}_{wkey[1]}.png")
        fig.savefig(paths[-1], dpi=120)
        plt.close(fig)
    return paths


REPEATS_DIR = "repeats"


def repeats_markdown(docs: Sequence[dict[str, Any]], repeats: Sequence[dict[str, Any]]) -> str:
    """Run-to-run spread: each throughput file in ``<results>/repeats/`` is another run of the command (same
    machine kind and run id) that wrote the file of that name in ``<results>``, earlier or later; one row per
    concurrency. A ratio between configs that differs from 1 by less than this spread is not a measured
    difference."""
    kept = {d.get("_file"): d for d in docs if d.get("kind") == "throughput"}
    rows, spread = [], []
    for rep in sorted((d for d in repeats if d.get("kind") == "throughput"), key=lambda d: d["_file"]):
        main = kept.get(rep["_file"])
        if main is None:
            continue
        ok = {r["concurrency"]: r for r in main["runs"] if r["status"] == "ok"}
        for r in rep["runs"]:
            other = ok.get(r["concurrency"])
            if r["status"] != "ok" or other is None:
                continue
            a, b = r["metrics"]["output_throughput"], other["metrics"]["output_throughput"]
            spread.append(abs(b / a - 1))
            rows.append([main["config"]["name"], main["workload"]["output_len"], r["concurrency"], f"{a:.0f}",
                         f"{b:.0f}", f"{(b / a - 1) * 100:+.1f}%", f"{r['wall_s']:.0f}"])  # fmt: skip
    if not rows:
        return ""
    head = (f"### Run-to-run spread\n\nThe same command run twice on one machine ({len(rows)} pairs): the output "
            f"tok/s moved by {min(spread) * 100:.1f}-{max(spread) * 100:.1f}% (median "
            f"{sorted(spread)[len(spread) // 2] * 100:.1f}%). Ratios closer to 1 than that are not differences.\n")
    return head + "\n" + markdown_table(["config", "output len", "conc", "repeats/ tok/s", "results/ tok/s",
                                         "change", "repeats/ wall s"], rows) + "\n"  # fmt: skip


def summary_markdown(docs: Sequence[dict[str, Any]], notes: Sequence[str] = (),
                     repeats: Sequence[dict[str, Any]] = ()) -> str:
    parts = [
        "# Benchmark summary\n",
        (f"Generated by `python -m benchmarks.report` from {len(docs)} result files. "
         "`vs stock` = output tok/s divided by the stock config's in the same run and concurrency; "
         "`vs best stock` = divided by the fastest stock backend's there (Triton or FlashInfer); "
         "busy = mean requests in flight over the concurrency; "
         "full-batch tok/s = output tok/s until the last request started, while every slot was busy (the schedule "
         "rebuilt from the per-request latencies, `benchmarks/schedule.py`; a steady load's rate, without the run's "
         "final drain; `-` for one wave or runs without per-request data); "
         "`E2E vs stock` = the stock config's mean request latency divided by this config's (how much sooner "
         "the average request finishes; one-wave out tok/s ends with the slowest request instead); "
         "accept len = output tokens per verify step (bonus token included), 1.0 for no speculation.\n"),
    ]
    for section in (throughput_markdown(docs), plain_vs_stock_markdown(docs), repeats_markdown(docs, repeats), lossless_markdown(docs), acceptance_markdown(docs), exactness_markdown(docs),
                    policy_sim_markdown(docs), kernels_markdown(docs), step_times_markdown(docs), offload_markdown(docs)):
        if section:
            parts.append(section)
    parts += [f"- {n}" for n in notes]
    return "\n".join(parts).rstrip() + "\n"


README_BEGIN = "<!-- results:begin: generated by `python -m benchmarks.report --readme docs/results.md` -->"
README_END = "<!-- results:end -->"


PAGE_NOTE = (
    "*Generated by `python -m benchmarks.report --readme docs/results.md` from `benchmarks/results/`: edit the report, "
    "not this page. The readings: [{readme}](../{readme}); the columns: [benchmarks/README.md](../../benchmarks/README.md).*"
)


@dataclass(frozen=True)
class ResultsPage:
    """One generated page of tables under ``<readme folder>/<readme stem>/``; ``body`` is empty when no result of
    its kind exists (the page is then neither written nor listed)."""

    file: str
    title: str
    holds: str  # what the page holds, for its index line
    count: str  # how many runs, for its index line
    body: str

    def text(self, readme_name: str) -> str:
        return f"{PAGE_NOTE.format(readme=readme_name)}\n\n# {self.title}\n\n{self.body}"


def _promote_headings(text: str, title: str) -> str:
    """The report's sections one heading level up (``###`` -> ``##``) under a page's ``#`` title; a first
    section named like the page itself is dropped (its text stays) and its subsections take its level."""

    def up(lines: list[str], deeper_than: int) -> list[str]:
        return [line[1:] if line.startswith("#" * (deeper_than + 1)) else line for line in lines]

    lines = up(text.strip("\n").split("\n"), 2)
    if lines and lines[0] == f"## {title}":
        lines = up(lines[1:], 2)
    return "\n".join(lines).strip("\n") + "\n"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


SWEEP_RUN_PREFIX = "sweep-"  # benchmarks.sweep names its runs sweep-<tag>-<output len>


def results_pages(docs: Sequence[dict[str, Any]], repeats: Sequence[dict[str, Any]] = ()) -> list[ResultsPage]:
    """The results pages' tables, one page per kind: throughput runs not bounded by streaming (stream interval
    1: SUMMARY.md only), single runs and the sweep's matrices apart, each with the run-to-run spread of its
    files; every lossless, acceptance and exactness run; the step-time breakdowns; and the verify-kernel table
    of the widest kernels sweep with one."""
    tput = [d for d in docs if d.get("kind") == "throughput" and stream_interval(d["config"].get("flags", [])) > 1]
    swept = [d for d in tput if str(d["meta"]["run_id"]).startswith(SWEEP_RUN_PREFIX)]
    single = [d for d in tput if d not in swept]
    by_kind = {k: [d for d in docs if d.get("kind") == k] for k in ("lossless", "acceptance", "exactness", "step_times")}
    kernels = [d for d in docs if d.get("kind") == "kernels" and "split_verify_attn_us" in d.get("score_capture", [{}])[0]]
    kernel_body, kernel_count = "", ""
    if kernels:
        d = max(kernels, key=lambda d: (len(d["score_capture"]), d.get("date_utc", "")))  # the widest sweep
        kernel_body = (f"### Verify kernel ({d['_file']})\n\n{d['device']}; commit {str(d['git_commit'])[:12]}.\n\n"
                       + verify_kernel_table(d) + "\n")  # fmt: skip
        kernel_count = f"the widest of {_plural(len(kernels), 'kernels sweep')} with the split kernel ({d['_file']})"
    accept_parts = [lossless_markdown(by_kind["lossless"]), acceptance_markdown(docs), exactness_markdown(docs)]
    def throughput_page(file: str, title: str, holds: str, group: list[dict[str, Any]]) -> ResultsPage:
        spread = repeats_markdown(group, repeats)
        return ResultsPage(file, title, holds + ("; the run-to-run spread" if spread else ""),
                           _plural(len({r["run_id"] for r in throughput_rows(group)}), "run"),
                           "\n".join(p for p in (throughput_markdown(group), plain_vs_stock_markdown(group), spread)
                                     if p))  # fmt: skip

    pages = [
        throughput_page("throughput.md", "Throughput", "single runs, the headline among them: out tok/s, latency and "
                        "accept length per config and concurrency against the stock of the same run", single),
        throughput_page("throughput-sweep.md", "Throughput sweep", f"the matrices of `benchmarks.sweep` (run ids "
                        f"`{SWEEP_RUN_PREFIX}*`: every config x output length x concurrency), the same columns", swept),
        ResultsPage(
            "acceptance-and-lossless.md", "Acceptance and losslessness",
            "greedy token identity with stock, accept lengths per draft policy, the sampled exactness tests",
            ", ".join(_plural(len(by_kind[k]), f"{k} run") for k in ("lossless", "acceptance", "exactness")),
            "\n".join(p for p in accept_parts if p),
        ),
        ResultsPage(
            "step-times.md", "Step times",
            "stock's decode step against PILLAR's draft / verify / accept / select per round by context and batch, "
            "projected speedups, the score-capture cost, measured / ideal",
            _plural(len(by_kind["step_times"]), "run"), step_times_markdown(docs),
        ),
        ResultsPage(
            "offload.md", "Offload", "the offload-aware KV pool under oversubscription: out tok/s against pressured "
            "stock, retractions, parks and bytes moved, outputs against an unpressured run",
            _plural(len([d for d in docs if d.get("kind") == "offload"]), "run"), offload_markdown(docs),
        ),
        ResultsPage(
            "kernels.md", "Kernels",
            "verify attention per layer, SGLang's extend kernel against PILLAR's split-KV kernel, plus score capture "
            "and selection", kernel_count, kernel_body,
        ),
    ]  # fmt: skip
    return [ResultsPage(p.file, p.title, p.holds, p.count, _promote_headings(p.body, p.title) if p.body else "")
            for p in pages]  # fmt: skip


def index_markdown(pages: Sequence[ResultsPage], folder: str) -> str:
    """The results page's generated block: one line per written page, linked relative to the page itself."""
    return "\n".join(f"- [{p.title}]({folder}/{p.file}): {p.holds}; {p.count}." for p in pages if p.body) + "\n"


def write_results_pages(readme: Path, docs: Sequence[dict[str, Any]], repeats: Sequence[dict[str, Any]] = ()) -> list[Path]:
    """Write the pages next to ``readme`` (``docs/results.md`` -> ``docs/results/<page>``) and the index block
    between ``readme``'s markers. A page whose kind has no result any more is removed if the report wrote it
    (hand-written pages in that folder are never touched)."""
    text = readme.read_text(encoding="utf-8")
    if text.find(README_BEGIN) < 0 or text.find(README_END) < text.find(README_BEGIN):
        raise SystemExit(f"{readme}: needs the lines {README_BEGIN!r} and {README_END!r} around the generated results")
    folder = readme.with_suffix("")
    folder.mkdir(exist_ok=True)
    pages, written = results_pages(docs, repeats), []
    note = PAGE_NOTE.format(readme=readme.name)
    for page in pages:
        path = folder / page.file
        if page.body:
            path.write_text(page.text(readme.name), encoding="utf-8")
            written.append(path)
        elif path.is_file() and path.read_text(encoding="utf-8").startswith(note):
            path.unlink()
    replace_readme_results(readme, index_markdown(pages, folder.name))
    return written


def replace_readme_results(path: Path, generated: str) -> None:
    """Rewrite the text between README_BEGIN and README_END in `path`; the rest of the file is left as is."""
    text = path.read_text(encoding="utf-8")
    start, end = text.find(README_BEGIN), text.find(README_END)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: needs the lines {README_BEGIN!r} and {README_END!r} around the generated results")
    path.write_text(text[: start + len(README_BEGIN)] + "\n\n" + generated + "\n" + text[end:], encoding="utf-8")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results-dir", type=Path, default=DEFAULT_RESULTS)
    p.add_argument("--out", type=Path, default=None, help="default: <results-dir>/SUMMARY.md")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--readme", type=Path, default=None,
                   help="also write the table pages into this file's folder of its name (docs/results.md -> "
                        "docs/results/) and their index into its generated block")
    args = p.parse_args(argv)
    if not args.results_dir.is_dir():
        p.error(f"results dir not found: {args.results_dir}")
    docs, notes = load_results(args.results_dir)
    notes = list(notes)
    repeats_dir = args.results_dir / REPEATS_DIR
    repeats = load_results(repeats_dir)[0] if repeats_dir.is_dir() else []
    if not args.no_plots:
        plots = plot_throughput(docs, args.results_dir)
        if isinstance(plots, str):
            notes.append(plots)
        else:
            notes += [f"plot: ![{q.stem}]({q.name})" for q in plots]
    out = args.out or args.results_dir / "SUMMARY.md"
    out.write_text(summary_markdown(docs, notes, repeats), encoding="utf-8")
    print(f"wrote {out} ({len(docs)} result files)")
    if args.readme is not None:
        pages = write_results_pages(args.readme, docs, repeats)
        print(f"rewrote the results index of {args.readme} and {len(pages)} pages in {args.readme.with_suffix('')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
