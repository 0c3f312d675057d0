"""Serving results: throughput rows and tables, the plain-round table, the run-to-run spread, the offload runs,
plots."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.configs import stream_interval
from benchmarks.schedule import full_batch_rate, wave_context, wave_pace_ms
from .common import (
    _config_rank,
    _gb,
    _pct,
    _ratio,
    _seconds,
    commits_text,
    describe_workload,
    fmt,
    markdown_table,
    workload_key,
)


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
            rows.append(
                {
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
                    "wave_ms": _wave_pace(run, doc),
                    "commit": str(made.get("git_commit"))[:12],
                    "stream_interval": stream_interval(doc["config"].get("flags", [])),
                }
            )
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
        r["e2e_vs_stock"] = (
            _ratio(b["metrics"].get("mean_e2e_latency_ms"), r["metrics"].get("mean_e2e_latency_ms")) if b else None
        )
        r["full_vs_stock"] = _ratio(r["full_tok_s"], b["full_tok_s"]) if b else None
    rows.sort(key=lambda r: (r["run_id"], str(r["workload"]), _config_rank(r["config"]), r["concurrency"]))
    return rows


def _closed_loop_requests(run: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any] | None:
    """An ok run's per-request data where requests start as others end (None for Poisson arrivals or
    without the data): what the schedule readings of ``benchmarks/schedule.py`` need."""
    if run["status"] != "ok" or doc["workload"].get("request_rate", "inf") != "inf":
        return None
    return run.get("per_request") or None


def _full_batch_rate(run: dict[str, Any], doc: dict[str, Any]) -> float | None:
    """The run's output tok/s while every slot was busy (None without per-request data or a second wave, and
    for Poisson arrivals, where requests do not start as others end)."""
    pr, m = _closed_loop_requests(run, doc), run.get("metrics") or {}
    if not pr or not m.get("duration"):
        return None
    return full_batch_rate(pr["e2e_s"], pr["ttft_s"], pr["output_len"], run["concurrency"], m["duration"])


def _wave_pace(run: dict[str, Any], doc: dict[str, Any]) -> list[tuple[float, float]] | None:
    """(mean TPOT ms, mean batch context decoded beside) of each wave (``schedule.wave_pace_ms`` and
    ``wave_context``) for a closed-loop run of two waves or more."""
    pr = _closed_loop_requests(run, doc)
    if not pr:
        return None
    args = (pr["e2e_s"], pr["ttft_s"], pr["output_len"], run["concurrency"])
    paces = list(zip(wave_pace_ms(*args), wave_context(*args)))
    return paces if len(paces) >= 2 else None


def wave_pace_lines(rows: Sequence[dict[str, Any]]) -> str:
    """One line per run of two waves or more: its TPOT by wave, with the batch's mean context (output tokens)
    the wave's requests decoded beside. A round costs more as contexts grow, so a wave that saw a younger
    batch (the first, under speculation) is faster for that alone; the last wave's pace includes the drain."""
    lines = [
        f"- {r['config']} c={r['concurrency']}: " + " / ".join(f"{ms:.2f} ({ctx:,.0f})" for ms, ctx in r["wave_ms"])
        for r in rows
        if r.get("wave_ms")
    ]
    return (
        "Mean TPOT ms by wave (requests in start order; in brackets the batch's mean context in output tokens "
        "that the wave decoded beside):\n\n" + "\n".join(lines) + "\n"
        if lines
        else ""
    )


THROUGHPUT_HEADERS = (
    "config",
    "conc",
    "reqs",
    "out tok/s",
    "vs stock",
    "vs best stock",
    "E2E vs stock",
    "full-batch tok/s",
    "full-batch vs stock",
    "TPOT med ms",
    "TPOT p99 ms",
    "ITL med ms",
    "ITL p99 ms",
    "TTFT med ms",
    "TTFT mean ms",
    "E2E mean s",
    "E2E p99 s",
    "busy",
    "accept len",
    "status",
)


def throughput_table(rows: Sequence[dict[str, Any]]) -> str:
    def cells(r: dict[str, Any]) -> list[str]:
        m = r["metrics"]
        return [
            r["config"],
            r["concurrency"],
            fmt(r["num_prompts"], "d"),
            fmt(r["tok_s"], ".0f"),
            fmt(r["ratio_vs_stock"], ".2f", "x"),
            fmt(r["ratio_vs_best_stock"], ".2f", "x"),
            fmt(r["e2e_vs_stock"], ".2f", "x"),
            fmt(r["full_tok_s"], ".0f"),
            fmt(r["full_vs_stock"], ".2f", "x"),
            fmt(m.get("median_tpot_ms")),
            fmt(m.get("p99_tpot_ms")),
            fmt(m.get("median_itl_ms")),
            fmt(m.get("p99_itl_ms")),
            fmt(m.get("median_ttft_ms"), ".1f"),
            fmt(m.get("mean_ttft_ms"), ".0f"),  # a mean far above the median: some requests waited (a stall)
            fmt(_seconds(m.get("mean_e2e_latency_ms")), ".1f"),
            fmt(_seconds(m.get("p99_e2e_latency_ms")), ".1f"),
            # Mean requests in flight over the concurrency: below 100%, slots sat idle (a drain, slow admissions).
            fmt(_pct(_ratio(m.get("concurrency"), r["concurrency"])), ".0f", "%"),
            fmt(m.get("accept_length")),
            r["status"],
        ]

    return markdown_table(THROUGHPUT_HEADERS, (cells(r) for r in rows))


STREAM_INTERVAL_1_NOTE = (
    "**Bounded by streaming, not decoding:** at stream interval 1 SGLang's per-token streaming path capped what "
    "reached the client (stock: a flat ~13-14K tok/s from 32 to 256 requests at 2K tokens while the scheduler "
    "logged 45-64K; 34K tok/s at stream interval 8 for 256 x 4K). Speculative configs send one event per round, "
    "so their ratios here are inflated. Kept for the record; compare runs at stream interval 8.\n"
)


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
        if waves := wave_pace_lines(group):
            out.append(waves)
    return "\n".join(out)


def plain_vs_stock_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """Stock's decode step (``decode_step_ms``: its server log, by cell) against PILLAR's plain round (its
    ``pillar_state`` cells: round + gap) at the same run id, workload, concurrency and cell (batch bucket
    x context). Above 1.00x, a round of plain decoding costs more than stock's step: where the adaptive
    policy chooses it, PILLAR is slower than stock by that much. Cells stock logged fewer than 3 clean
    intervals of are left out."""
    runs = [(d, r) for d in docs if d.get("kind") == "throughput" for r in d.get("runs", [])]
    stock = {
        (d["meta"]["run_id"], workload_key(d), r["concurrency"]): r["decode_step_ms"]
        for d, r in runs
        if d["config"]["name"] == "stock" and r.get("decode_step_ms")
    }
    rows = []
    for d, r in runs:
        steps = stock.get((d["meta"]["run_id"], workload_key(d), r["concurrency"]))
        cells = (r.get("pillar_state") or {}).get("cells") or {}
        for cell, step in (steps or {}).items():
            c = cells.get(cell) or {}
            if step["lines"] < 3 or c.get("plain") is None:
                continue
            plain = c["plain"] + (c.get("gap") or 0.0)
            rows.append(
                [
                    d["meta"]["run_id"],
                    d["config"]["name"],
                    r["concurrency"],
                    cell,
                    step["lines"],
                    f"{step['ms']:.2f}",
                    f"{plain:.2f}",
                    f"{plain / step['ms']:.2f}x",
                ]
            )
    if not rows:
        return ""
    head = (
        "### Plain rounds against stock's decode step\n\nms per step: stock from its own log lines (running "
        "requests / tok/s over 40 steps, median), PILLAR's plain round (k = 0) from its CUDA events plus the "
        "gap before it. Above 1.00x, plain decoding costs more than stock's step.\n"
    )
    return (
        head
        + "\n"
        + markdown_table(
            ["run", "config", "conc", "cell", "stock intervals", "stock ms", "plain ms", "plain / stock"], rows
        )
        + "\n"
    )


def offload_markdown(docs: Sequence[dict[str, Any]]) -> str:
    """One table per ``benchmarks.checks.offload`` file: each run's out tok/s against the pressured stock run of the
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
            rows.append(
                [
                    name,
                    r.get("status"),
                    fmt(r.get("output_tok_s"), ".0f"),
                    fmt(_ratio(r.get("output_tok_s"), stock), ".2f", "x"),
                    r.get("retractions", "-"),
                    f"{moved['parks']} / {moved['restores']}" if moved else "-",
                    _gb(moved.get("bytes_to_host")),
                    _gb(moved.get("bytes_to_device")),
                    verdict,
                ]
            )
        m = d["meta"]
        parts.append(
            f"### Offload {d['_file']}\n\n{m['device']}; commit {m['git_commit']}; run {m['run_id']}. {d['requests']} "
            f"requests x {d['settings']['max_new_tokens']} tokens, demand {d['demand_tokens']} tokens "
            "over a GPU pool of "
            f"{d['pool_tokens']} (oversubscription {d['settings']['oversubscription']}), {d['settings']['host_gb']} GB "
            f"host, radix cache {'on' if d['settings'].get('radix_cache') else 'off'}. `ratio_vs_stock` "
            f"{fmt(d.get('ratio_vs_stock'), '.3f')}, "
            f"`ratio_vs_stock_hicache` {fmt(d.get('ratio_vs_stock_hicache'), '.3f')}."
            "\n\n"
            + markdown_table(
                [
                    "run",
                    "status",
                    "out tok/s",
                    "vs stock",
                    "retractions",
                    "parks / restores",
                    "to host",
                    "to device",
                    "outputs vs reference",
                ],
                rows,
            )
            + "\n"
        )
    return ("## Offload\n\n" + "\n".join(parts)) if parts else ""


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
            pts = sorted(
                (r["concurrency"], r["tok_s"], r["metrics"].get("accept_length")) for r in rows if r["config"] == config
            )
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
            rows.append(
                [
                    main["config"]["name"],
                    main["workload"]["output_len"],
                    r["concurrency"],
                    f"{a:.0f}",
                    f"{b:.0f}",
                    f"{(b / a - 1) * 100:+.1f}%",
                    f"{r['wall_s']:.0f}",
                ]
            )
    if not rows:
        return ""
    head = (
        f"### Run-to-run spread\n\nThe same command run twice on one machine ({len(rows)} pairs): the output "
        f"tok/s moved by {min(spread) * 100:.1f}-{max(spread) * 100:.1f}% (median "
        f"{sorted(spread)[len(spread) // 2] * 100:.1f}%). Ratios closer to 1 than that are not differences.\n"
    )
    return (
        head
        + "\n"
        + markdown_table(
            ["config", "output len", "conc", "repeats/ tok/s", "results/ tok/s", "change", "repeats/ wall s"], rows
        )
        + "\n"
    )
