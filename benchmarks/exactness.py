"""Sampled exactness on the GPU: a candidate's output distribution vs a reference server's, by chi-square.

    python -m benchmarks.exactness --model M --data-dir D --out F.json [--reference stock] [--candidate pillar] \\
        [--settings 0.6:0.95,1.0:1.0] [--contexts 2] [--context-tokens 1500] [--samples 100000] [--resume OLD.json]

Each context is an AIME/AMC prompt plus the first server's greedy continuation, cut in its second half
(``--context-tokens`` / 2 to ``--context-tokens``) where the greedy token led its runner-up by the least:
long enough that the draft's sparse attention reads a small part of it (so draft and target differ and
the residual path runs), and uncertain at the cut, so that the samples spread over several tokens (a
near-certain next token leaves the test nothing to compare: the first same-numerics run, at a cut where
99.5% of the samples were one token). The first server's radix cache is flushed after, so every server
prefills the contexts itself. For every (temperature:top_p setting, context) each server answers
``--samples`` copies of the context with ``--new-tokens`` sampled tokens (radix cache on: the prefill is
shared). Token 1 comes from the prefill; tokens 2.. come from PILLAR's first verify (accepted drafts, the
residual draw at a rejection, the bonus). Token 1 is tallied alone, and for each position j >= 2 the
pair (token j-1, token j); a two-sample chi-square test of homogeneity says whether the two servers
sample the same distribution (cells expected below 5 are pooled).

Two questions, two references. Against ``stock`` the test asks whether PILLAR samples what stock
samples; but the two servers' forwards round differently in bf16 (a one-step change of a logit
moves a token's probability by 6-20% at these temperatures), which this many samples resolve.
Against a PILLAR reference that differs from the candidate only in its drafts, e.g.
``pillar:adaptive_steps=off:budget_ratio=1`` (drafts that attend the whole context, accepted almost
always) vs ``pillar:adaptive_steps=off`` (sparse drafts, often rejected), both servers run the same
prefill and the same verify forwards at the same batch sizes, so only the speculation (acceptance,
residual draw, draft record) can tell them apart. Token 1 is the built-in null: no PILLAR code runs
before it, so where it differs the servers' numerics differ and the run says NUMERICS (no verdict
on the speculation) instead of FAIL.

A control compares the reference with itself at 1.3x the temperature on the first context (half
the samples): the test must reject that, or it has no power at this sample size. ``--controls``
runs more configs through the same comparison with the reference (default ``stock-flashinfer``:
stock with another attention kernel, i.e. the same distribution up to bf16 rounding), which shows
how far rounding alone moves the statistic; only the candidate decides the verdict.

The JSON keeps each cell's counts (token 1's, and each position's pairs: all the tests need), the
contexts' token ids and each cell's seconds, rewritten with the tests after every cell. Before a
server start or a cell, the time the same step took earlier is checked against ``--time-budget``, so
a 10-minute command ends with whole cells; ``--resume OLD.json`` (the same settings) keeps OLD's
contexts and cells and samples only the missing ones, so 100,000 samples per cell can span commands.
Writes F.json and F.log. Exit 0 when every comparison ran and no p-value is below --alpha / (number
of tests) (PASS), 1 otherwise (FAIL, NUMERICS, NO_POWER or INCOMPLETE).
"""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.configs import add_server_options, parse_env, resolve_config
from benchmarks.meta import new_run_id, run_metadata
from benchmarks.runlog import Deadline, RunLog, write_json
from benchmarks.server import Server, begin, http_json, start_recorded
from benchmarks.workload import DEFAULT_DATASETS, build_prompts, load_tokenizer

BATCH = 1024  # copies of a context per /generate call
# /generate calls a server holds at once. One at a time, its tokenizer, scheduler and detokenizer processes
# idled in turn: 2 ms per two-token request at eea1983 (50,000 samples in ~100 s), where the GPU work is a
# small part; with two, one call's replies are read while the next is scheduled (expected up to ~2x, the
# cells' seconds in the JSON tell). The batches stay full (256 in flight) on both servers alike.
IN_FLIGHT = 2
CONTROL_SCALE = 1.3  # the control's temperature, relative to the first setting's


def chi2_sf(stat: float, df: int) -> float:
    """Survival function of the chi-square distribution (regularised upper incomplete gamma)."""
    import torch

    x = torch.tensor([df / 2, stat / 2], dtype=torch.float64)
    return float(torch.special.gammaincc(x[0], x[1]))


def homogeneity(a: Counter, b: Counter, min_expected: float = 5.0) -> dict[str, Any]:
    """Two-sample chi-square test that the category counts ``a`` and ``b`` share one distribution.

    Categories whose smaller expected count is below ``min_expected`` are pooled into one cell,
    which joins the smallest other cell if it is still too small: no count is dropped.
    Returns stat, df, p_value and the cell count.
    """
    na, nb = sum(a.values()), sum(b.values())
    if na == 0 or nb == 0:
        raise ValueError("both samples must be non-empty")
    small = min(na, nb) / (na + nb)
    cells, pool = [], [0, 0]
    for key in a.keys() | b.keys():
        ca, cb = a.get(key, 0), b.get(key, 0)
        if (ca + cb) * small >= min_expected:
            cells.append((ca, cb))
        else:
            pool[0], pool[1] = pool[0] + ca, pool[1] + cb
    if sum(pool) * small >= min_expected or not cells:
        cells.append((pool[0], pool[1]))
    elif sum(pool):
        i = min(range(len(cells)), key=lambda c: sum(cells[c]))
        cells[i] = (cells[i][0] + pool[0], cells[i][1] + pool[1])
    stat = 0.0
    for ca, cb in cells:
        tot = ca + cb
        ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
        stat += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb
    df = len(cells) - 1
    return {"stat": stat, "df": df, "p_value": chi2_sf(stat, df) if df > 0 else 1.0, "cells": len(cells)}


def pair_counts(outputs: Sequence[Sequence[int]], j: int) -> Counter:
    """Counts of (token j-1, token j) over the outputs (positions 0-based)."""
    return Counter((o[j - 1], o[j]) for o in outputs)


def verdict(judged: Sequence[dict[str, Any]], n_tests: int, control: dict[str, Any] | None, alpha: float) -> tuple[str, float | None]:
    """The run's verdict and its Bonferroni threshold (alpha / n_tests) from the candidate's tests.

    INCOMPLETE: a test or the control is missing. NO_POWER: the control (a 1.3x temperature) does not
    reject, so a pass would mean nothing. NUMERICS: token 1 rejects; it is drawn before any PILLAR code
    runs, so the two servers' forwards round differently and the later tokens cannot be pinned on the
    speculation. FAIL: token 1 passes and a later token rejects. PASS: nothing rejects.
    """
    if len(judged) != n_tests or control is None:
        return "INCOMPLETE", None
    threshold = alpha / n_tests
    rejects = {t["position"] for t in judged if t["p_value"] < threshold}
    if control["p_value"] >= threshold:
        return "NO_POWER", threshold
    if 1 in rejects:
        return "NUMERICS", threshold
    return ("FAIL" if rejects else "PASS"), threshold


def flush_radix_cache(server: Server, timeout: float, tries: int = 20) -> None:
    """Empty the server's radix cache (SGLang's /flush_cache). The contexts' KV came from this server's
    greedy decode (decode or verify forwards), while every other server prefills them: token 1 must
    come from a prefill on every server. SGLang answers 400 while a request is still in its batches
    (a finished one can linger there for a scheduler iteration), so a refusal is retried for a few
    seconds before it is raised."""
    for attempt in range(tries):
        req = urllib.request.Request(server.base_url + "/flush_cache", data=b"", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                resp.read()
                return
        except urllib.error.HTTPError as e:
            if e.code != 400 or attempt == tries - 1:
                raise
        time.sleep(0.25)


def sample(server: Server, context: list[int], n: int, params: dict[str, Any], deadline: Deadline) -> list[list[int]]:
    """n sampled continuations of one context, BATCH requests per call and IN_FLIGHT calls at a time (each
    call may use the rest of the budget)."""

    def call(m: int) -> list[list[int]]:
        body = {"input_ids": [context] * m, "sampling_params": params, "stream": False}
        replies = http_json(server.base_url + "/generate", body, timeout=max(30.0, deadline.remaining()))
        return [[int(t) for t in r["output_ids"]] for r in replies]

    out: list[list[int]] = []
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        for outputs in pool.map(call, [min(BATCH, n - i) for i in range(0, n, BATCH)]):
            out.extend(outputs)
    return out


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--datasets", default=",".join(DEFAULT_DATASETS))
    p.add_argument("--settings", default="0.6:0.95,1.0:1.0", help="temperature:top_p pairs")
    p.add_argument("--contexts", type=int, default=2)
    p.add_argument("--context-tokens", type=int, default=1500)
    p.add_argument("--samples", type=int, default=100_000, help="per server, setting and context")
    p.add_argument("--new-tokens", type=int, default=4)
    p.add_argument("--alpha", type=float, default=1e-3)
    p.add_argument("--reference", default="stock", help="the config every other is compared with")
    p.add_argument("--candidate", default="pillar", help="the config judged against the reference")
    p.add_argument("--controls", default="stock-flashinfer", help="more configs compared with the reference (not judged)")
    add_server_options(p)
    p.add_argument("--run-id", default=None)
    p.add_argument("--resume", type=Path, default=None, help="an earlier run's JSON of the same question: keep its contexts and cells")
    args = p.parse_args(argv)
    try:
        args.settings = [tuple(float(x) for x in s.split(":")) for s in args.settings.split(",")]
        args.env = parse_env(args.env)
        args.controls = [c for c in args.controls.split(",") if c]
        for name in (args.reference, args.candidate, *args.controls):
            resolve_config(name)
    except ValueError as e:
        p.error(str(e))
    if len({args.reference, args.candidate, *args.controls}) != 2 + len(args.controls):
        p.error("--reference, --candidate and --controls must name different configs")
    if any(len(s) != 2 or s[0] <= 0 or not 0 < s[1] <= 1 for s in args.settings):
        p.error("--settings takes temperature:top_p pairs with temperature > 0 and top_p in (0, 1]")
    if min(args.contexts, args.samples, args.context_tokens) < 1 or args.new_tokens < 2:
        p.error("--contexts, --samples, --context-tokens must be >= 1 and --new-tokens >= 2")
    args.extra_server_args = tuple(shlex.split(args.extra_server_args))
    args.datasets = tuple(d for d in args.datasets.split(",") if d)
    args.run_id = args.run_id or new_run_id()
    return args


def _server(name: str, args: argparse.Namespace, log_dir: Path) -> tuple[Server, dict[str, Any]]:
    config = resolve_config(name, args.extra_server_args)
    # The radix cache shares each context's prefill across its copies (the other benchmarks turn it off).
    flags = [f for f in config.flags if f != "--disable-radix-cache"]
    env = config.environment(args.env)
    server = Server.sglang(args.model, flags, log_path=log_dir / f"{name}.log", env=env)
    return server, {"flags": flags, "env": env}


def tally(outputs: Sequence[Sequence[int]], new_tokens: int) -> dict[str, Any]:
    """What the tests need of one cell's outputs, JSON-ready: token 1's counts [[token, n], ...] and, per
    position j >= 2, the (token j-1, token j) pair counts [[a, b, n], ...]."""
    first = Counter(o[0] for o in outputs)
    pairs = [pair_counts(outputs, j) for j in range(1, new_tokens)]
    return {"n": len(outputs), "first": [[t, c] for t, c in first.items()],
            "pairs": [[[a, b, c] for (a, b), c in pc.items()] for pc in pairs]}  # fmt: skip


def counters(cell: dict[str, Any]) -> list[Counter]:
    """A tally back as Counters: [token 1's, then the pairs of positions 2..]."""
    return [Counter({t: c for t, c in cell["first"]})] + [Counter({(a, b): c for a, b, c in pc}) for pc in cell["pairs"]]


def most_uncertain_cut(top_logprobs: Sequence[Sequence[Sequence[Any]]], lo: int) -> tuple[int, float]:
    """The output index p >= lo whose greedy token had the smallest lead over the runner-up (natural log), and
    that lead. The context is cut before it, so token 1 is drawn where the model hesitates most and the test
    has samples off the mode to compare (a context whose next tokens are near-certain says nothing)."""
    gaps = [(float(t[0][0]) - float(t[1][0]) if t and len(t) > 1 else float("inf"), i) for i, t in enumerate(top_logprobs) if i >= lo]
    if not gaps:
        raise ValueError(f"no output position at or after {lo} to cut at")
    gap, p = min(gaps)
    return p, gap


def cell_key(name: str, si: int, ci: int) -> str:
    return f"{name} | setting {si} | context {ci}"


def judge(doc: dict[str, Any], args: argparse.Namespace) -> None:
    """Recompute every test whose two cells exist, the control and the verdict (after each new cell, so a cut run keeps them)."""
    counts, ref = doc["counts"], args.reference
    doc["tests"] = []
    for name in (args.candidate, *args.controls):
        for si, (temp, top_p) in enumerate(args.settings):
            for ci in range(len(doc["contexts"])):
                a, b = counts.get(cell_key(ref, si, ci)), counts.get(cell_key(name, si, ci))
                if a is None or b is None:
                    continue
                # Token 1 alone (both servers sample it in the prefill), then (token j-1, token j) pairs.
                for j, (ca, cb) in enumerate(zip(counters(a), counters(b))):
                    doc["tests"].append({"config": name, "temperature": temp, "top_p": top_p, "context": ci, "position": j + 1,
                                         **homogeneity(ca, cb)})  # fmt: skip
    ref_cell, control = counts.get(cell_key(ref, 0, 0)), counts.get(cell_key("control", 0, 0))
    doc["control"] = None
    if ref_cell is not None and control is not None:
        doc["control"] = {"temperature_scale": CONTROL_SCALE, **homogeneity(counters(ref_cell)[1], counters(control)[1])}
    n_tests = len(args.settings) * args.contexts * args.new_tokens
    judged = [t for t in doc["tests"] if t["config"] == args.candidate]
    doc["verdict"], doc["bonferroni_threshold"] = verdict(judged, n_tests, doc["control"], args.alpha)


def resumed(path: Path | None, doc: dict[str, Any]) -> None:
    """Take the contexts and cell counts of an earlier run of the same question (same settings) into ``doc``."""
    if path is None:
        return
    old = json.loads(path.read_text())
    same = ("reference", "candidate", "settings", "contexts", "context_tokens", "new_tokens", "datasets", "model")
    diff = [k for k in same if json.dumps(old["settings"].get(k)) != json.dumps(doc["settings"].get(k))]
    if diff or "counts" not in old:
        raise SystemExit(f"--resume {path}: not the same question ({', '.join(diff) or 'no counts: an older schema'} differ)")
    doc["contexts"], doc["counts"], doc["seconds"] = old["contexts"], old["counts"], old.get("seconds", {})
    doc["servers"] = {n: r | {"resumed": True} for n, r in old["servers"].items()}
    doc["resumed_from"] = old["meta"]["run_id"]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    deadline, log = begin(args.time_budget, args.out.with_suffix(".log"))
    log_dir = Path(tempfile.mkdtemp(prefix="sparsespec-exact-"))
    doc: dict[str, Any] = {
        "kind": "exactness", "schema": 3, "meta": run_metadata(args.run_id),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "data_dir", "resume")} | {"batch": BATCH, "in_flight": IN_FLIGHT},
        "servers": {}, "contexts": [], "counts": {}, "seconds": {}, "tests": [], "control": None, "verdict": "INCOMPLETE",
    }  # fmt: skip
    resumed(args.resume, doc)
    ref = args.reference
    for name in (ref, args.candidate, *args.controls):
        cells = [(cell_key(name, si, ci), si, ci) for si in range(len(args.settings)) for ci in range(args.contexts)]
        if name == ref:
            cells.append((cell_key("control", 0, 0), -1, 0))
        todo = [c for c in cells if c[0] not in doc["counts"]]
        if not todo:
            log.line(f"{name}: every cell resumed, no server start")
            continue
        # A server is started only if its start and one cell fit what is left of the budget.
        starts = [r["startup_s"] for r in doc["servers"].values() if r.get("startup_s")]
        need = max(starts, default=0.0) + min(doc["seconds"].values(), default=0.0)
        if not deadline.allows(need):
            log.line(f"{name}: SKIPPED (time budget: {deadline.remaining():.0f} s left, ~{need:.0f} s needed)")
            break
        server, record = _server(name, args, log_dir)
        doc["servers"][name] = record
        with server:
            if not start_recorded(server, name, record, args.startup_timeout, log):
                break
            if not doc["contexts"]:
                build_contexts(server, args, doc, deadline, log)
            for key, si, ci in todo:
                # The same cell on an earlier server says how long it takes (the control: half a setting-0 cell).
                est = doc["seconds"].get(f"setting {max(si, 0)} | context {ci}", 0.0) * (0.5 if si < 0 else 1.0)
                if not deadline.allows(est + 5):
                    log.line(f"{key}: SKIPPED (time budget: {deadline.remaining():.0f} s left, ~{est:.0f} s needed)")
                    break
                temp, top_p = args.settings[max(si, 0)]
                n = args.samples
                if si < 0:  # the control: the reference at a higher temperature; half the samples only show the test can reject
                    temp, n = CONTROL_SCALE * temp, args.samples // 2
                params = {"temperature": temp, "top_p": top_p, "max_new_tokens": args.new_tokens, "ignore_eos": True}
                t0 = time.monotonic()
                doc["counts"][key] = tally(sample(server, doc["contexts"][ci]["ids"], n, params, deadline), args.new_tokens)
                if si >= 0:
                    doc["seconds"][f"setting {si} | context {ci}"] = time.monotonic() - t0
                judge(doc, args)
                write_json(args.out, doc)  # a cut run keeps every finished cell and its tests
                log.line(f"{key}: {n} samples in {time.monotonic() - t0:.0f} s")
        log.line(f"{name}: done, {deadline.remaining():.0f} s of the budget left")
    judge(doc, args)
    write_json(args.out, doc)
    for t in doc["tests"]:
        log.line(f"{t['config']} T={t['temperature']} top_p={t['top_p']} ctx {t['context']} token {t['position']}: "
                 f"chi2 {t['stat']:.1f} df {t['df']} p {t['p_value']:.4g}")  # fmt: skip
    if doc["control"] is not None:
        log.line(f"control ({ref} vs {ref} at {CONTROL_SCALE}x T, token 2): p {doc['control']['p_value']:.3g}")
    log.line(f"verdict {doc['verdict']}")
    return 0 if doc["verdict"] == "PASS" else 1


def build_contexts(server: Server, args: argparse.Namespace, doc: dict[str, Any], deadline: Deadline, log: RunLog) -> None:
    """Each context: a prompt plus the first server's greedy continuation, cut where the model hesitates most in
    its second half (``most_uncertain_cut``); the radix cache is flushed after, so every server prefills them.
    A reply without top-2 logprobs for every token keeps the whole continuation (logged)."""
    tokenizer = load_tokenizer(args.model)
    greedy = {"temperature": 0.0, "max_new_tokens": args.context_tokens, "ignore_eos": True}
    for prompt in build_prompts(tokenizer, args.data_dir, args.contexts, args.datasets):
        body = {"input_ids": prompt.input_ids, "sampling_params": greedy, "return_logprob": True, "top_logprobs_num": 2}
        reply = http_json(server.base_url + "/generate", body, max(60.0, deadline.remaining()))
        out = [int(t) for t in reply["output_ids"]]
        tops = reply.get("meta_info", {}).get("output_top_logprobs")
        if isinstance(tops, list) and len(tops) == len(out):
            cut, lead = most_uncertain_cut(tops, args.context_tokens // 2)
        else:
            cut, lead = len(out), None
            log.line(f"{prompt.source}: no top-2 logprobs in the greedy reply, the context keeps all {len(out)} tokens")
        ids = prompt.input_ids + out[:cut]
        doc["contexts"].append({"source": prompt.source, "tokens": len(ids), "greedy_lead_nats": lead, "ids": ids})
    flush_radix_cache(server, max(60.0, deadline.remaining()))


if __name__ == "__main__":
    raise SystemExit(main())
