"""Sampled exactness on the GPU: a candidate's output distribution vs a reference server's, by chi-square.

    python -m benchmarks.exactness --model M --data-dir D --out F.json [--reference stock] [--candidate pillar] \\
        [--settings 0.6:0.95,1.0:1.0] [--contexts 2] [--context-tokens 1500] [--samples 100000]

Each context is an AIME/AMC prompt plus ``--context-tokens`` of the reference's greedy continuation
(long enough that the draft's sparse attention reads a small part of it, so draft and target differ
and the residual path runs); the reference's radix cache is flushed after it, so every server
prefills the contexts itself. For every (temperature:top_p setting, context) each server answers
``--samples`` copies of the context with ``--new-tokens`` sampled tokens (radix cache on: the
prefill is shared). Token 1 comes from the prefill; tokens 2.. come from PILLAR's first verify
(accepted drafts, the residual draw at a rejection, the bonus). Token 1 is tallied alone, and for
each position j >= 2 the pair (token j-1, token j); a two-sample chi-square test of homogeneity says
whether the two servers sample the same distribution (cells expected below 5 are pooled).

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
how far rounding alone moves the statistic; only the candidate decides the verdict. Each server's
per-position token marginals (top 20) are kept for diagnosis.

Writes F.json (rewritten after every stage) and F.log. Exit 0 when every comparison ran and no
p-value is below --alpha / (number of tests) (PASS), 1 otherwise (FAIL, NUMERICS or INCOMPLETE).
"""

from __future__ import annotations

import argparse
import shlex
import tempfile
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.configs import add_server_options, parse_env, resolve_config
from benchmarks.meta import new_run_id, run_metadata
from benchmarks.runlog import write_json
from benchmarks.server import Server, begin, http_json, start_recorded
from benchmarks.workload import DEFAULT_DATASETS, build_prompts, load_tokenizer

BATCH = 1024  # copies of a context per /generate call
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


def sample(server: Server, context: list[int], n: int, params: dict[str, Any], timeout: float) -> list[list[int]]:
    """n sampled continuations of one context, BATCH requests per call."""
    out: list[list[int]] = []
    while len(out) < n:
        m = min(BATCH, n - len(out))
        body = {"input_ids": [context] * m, "sampling_params": params, "stream": False}
        replies = http_json(server.base_url + "/generate", body, timeout=timeout)
        out.extend([int(t) for t in r["output_ids"]] for r in replies)
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    deadline, log = begin(args.time_budget, args.out.with_suffix(".log"))
    log_dir = Path(tempfile.mkdtemp(prefix="sparsespec-exact-"))
    doc: dict[str, Any] = {
        "kind": "exactness", "schema": 2, "meta": run_metadata(args.run_id),
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "data_dir")} | {"batch": BATCH},
        "servers": {}, "contexts": [], "tests": [], "control": None, "marginals": {}, "verdict": "INCOMPLETE",
    }  # fmt: skip
    tokenizer = load_tokenizer(args.model)
    prompts = build_prompts(tokenizer, args.data_dir, args.contexts, args.datasets)
    samples: dict[tuple[str, int, int], list[list[int]]] = {}  # (config, setting, context) -> outputs
    contexts: list[list[int]] = []
    timeout = max(60.0, deadline.remaining())
    ref = args.reference
    for name in (ref, args.candidate, *args.controls):
        server, record = _server(name, args, log_dir)
        doc["servers"][name] = record
        with server:
            if not start_recorded(server, name, record, args.startup_timeout, log):
                break
            if not contexts:
                greedy = {"temperature": 0.0, "max_new_tokens": args.context_tokens, "ignore_eos": True}
                for prompt in prompts:
                    reply = http_json(server.base_url + "/generate", {"input_ids": prompt.input_ids, "sampling_params": greedy}, timeout)
                    contexts.append(prompt.input_ids + [int(t) for t in reply["output_ids"]])
                    doc["contexts"].append({"source": prompt.source, "tokens": len(contexts[-1])})
                flush_radix_cache(server, timeout)
            for si, (temp, top_p) in enumerate(args.settings):
                params = {"temperature": temp, "top_p": top_p, "max_new_tokens": args.new_tokens, "ignore_eos": True}
                for ci, context in enumerate(contexts):
                    outs = samples[(name, si, ci)] = sample(server, context, args.samples, params, timeout)
                    doc["marginals"][f"{name} T={temp} top_p={top_p} ctx {ci}"] = [
                        Counter(o[j] for o in outs).most_common(20) for j in range(args.new_tokens)
                    ]
                    log.line(f"{name} T={temp} top_p={top_p} context {ci}: {args.samples} samples")
                    write_json(args.out, doc)  # a cut run keeps the marginals it has
            if name == ref:
                temp, top_p = args.settings[0]
                params = {"temperature": CONTROL_SCALE * temp, "top_p": top_p, "max_new_tokens": args.new_tokens, "ignore_eos": True}
                # Half the samples: the control only has to show the test can reject.
                samples[("control", 0, 0)] = sample(server, contexts[0], args.samples // 2, params, timeout)
        log.line(f"{name}: done, {deadline.remaining():.0f} s of the budget left")
        write_json(args.out, doc)
    n_tests = len(args.settings) * len(contexts) * args.new_tokens
    for name in (args.candidate, *args.controls):
        for si, (temp, top_p) in enumerate(args.settings):
            for ci in range(len(contexts)):
                key_s, key_c = (ref, si, ci), (name, si, ci)
                if key_s not in samples or key_c not in samples:
                    continue
                # Token 1 alone (both servers sample it in the prefill), then (token j-1, token j) pairs.
                tests = [homogeneity(Counter(o[0] for o in samples[key_s]), Counter(o[0] for o in samples[key_c]))]
                tests += [homogeneity(pair_counts(samples[key_s], j), pair_counts(samples[key_c], j)) for j in range(1, args.new_tokens)]
                for j, test in enumerate(tests):
                    doc["tests"].append({"config": name, "temperature": temp, "top_p": top_p, "context": ci, "position": j + 1, **test})
                    log.line(f"{name} T={temp} top_p={top_p} ctx {ci} token {j + 1}: chi2 {test['stat']:.1f} df {test['df']} p {test['p_value']:.4f}")
    if ("control", 0, 0) in samples:
        doc["control"] = {"temperature_scale": CONTROL_SCALE, **homogeneity(pair_counts(samples[(ref, 0, 0)], 1), pair_counts(samples[("control", 0, 0)], 1))}
        log.line(f"control ({ref} vs {ref} at {CONTROL_SCALE}x T, token 2): p {doc['control']['p_value']:.3g}")
    judged = [t for t in doc["tests"] if t["config"] == args.candidate]
    doc["verdict"], doc["bonferroni_threshold"] = verdict(judged, n_tests, doc["control"], args.alpha)
    write_json(args.out, doc)
    log.line(f"verdict {doc['verdict']}")
    return 0 if doc["verdict"] == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
