"""Sampled exactness on the GPU: PILLAR's output distribution vs stock SGLang's own sampler, by chi-square.

    python -m benchmarks.checks.exactness --model M --out F.json [--data-dir D | --prompts short] \\
        [--temperature 0.6 --top-p 0.95 --top-k 20 --min-p 0] [--frequency-penalty 0.5 --presence-penalty 0.3 \\
        --repetition-penalty 1.1 --min-new-tokens 4 --stop-at-eos] [--new-tokens 4] [--contexts 1] \\
        [--samples 100000] [--candidate pillar] [--reference stock] [--resume OLD.json]

The reference is a server without speculation (``stock``: SGLang's own sampler, penalizers and
min_new_tokens), never a PILLAR config: a PILLAR reference shares the candidate's target filter and
verify, so it cannot see their errors. The servers share one GPU, each holding ``--mem-fraction-static`` of
it (default 0.8 / servers). SGLang sizes a server's memory as that fraction of the memory free when it
starts, so they start one after another, each once the one before is up, and server i (from 0) is launched
with share / (1 - i x share) (``launch_fractions``; the JSON records each one's flags), then sampled together.

Contexts (``--contexts``), one fixed set per run: ``--prompts data`` (default) takes an AIME/AMC prompt plus
the reference's greedy continuation, cut in its second half (``--context-tokens`` / 2 to ``--context-tokens``)
where the greedy token led its runner-up by the least: long enough that PILLAR's sparse drafts differ from
the target (the residual path runs), uncertain at the cut so the samples spread over several tokens. The
reference's radix cache is flushed after, so both servers prefill the contexts themselves. ``--prompts
short`` takes short chat questions with one-word answers (``SHORT_QUESTIONS``): the stop token is likely
within a few tokens, so with ``--stop-at-eos`` the output lengths (min_new_tokens) and repeat counts
(penalties) spread. For each context each server answers ``--samples`` copies with at most
``--new-tokens`` tokens (radix cache on: the prefill is shared) under one sampling setting (the flags
above, SGLang's names). Token 1 comes from the prefill; tokens 2.. from PILLAR's verify rounds.

Statistics per context (``benchmarks.checks.exactness_stats``): token 1; each position j >= 2 as the pair
(token j-1, token j), an output that already stopped counting as END; the output length; the
repeat count. Each is a two-sample chi-square test of homogeneity against the
reference (cells expected below 5 pooled, df = cells - 1), judged at ``--alpha`` / (number of tests).
Token 1 is the built-in null: both servers draw it with stock's sampler from the prefill, so where it
differs their numerics differ and the run says NUMERICS (no verdict on the speculation) instead of FAIL.
PILLAR's later tokens come from verify forwards over k+1 tokens where stock decodes one, so bf16
rounding can still move them. Controls (``--controls``, not judged) are other servers tested against the
same reference: ``ngram`` (SGLang's own speculation, whose verify rows round as PILLAR's do),
``stock-flashinfer`` (stock with another attention kernel: the same sampler, other rounding). The JSON's
``parity`` sets each control's statistics beside the candidate's, per context and statistic, and the
verdict line says whether the candidate is within the controls' deviation: WITHIN when every statistic it
rejects has a total variation from the reference no larger than the largest control's, else BEYOND.

Power checks, each on the reference's first context with half the samples, must reject or the run says
NO_POWER: the reference at 1.3x the temperature (token 2) and, for a setting with penalties or
min_new_tokens, the reference without them (repeat counts for penalties, lengths for min_new_tokens:
if dropping them cannot be seen, neither can a wrong implementation of them).

The JSON keeps the device, date, commit, every server's flags, environment and launch command, the sampling
parameters sent, each cell's tallies (all the tests need), each test's total variation and the cells that add most
to its statistic, each cell group's seconds; it is rewritten after every group. A group is started only if its
earlier time fits ``--time-budget``, so a 10-minute command ends with whole cells; ``--resume OLD.json`` (the same
question) keeps OLD's contexts and cells and samples only the missing ones. Writes F.json and F.log; exit 0 on PASS,
1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import shlex
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from benchmarks.configs import add_server_options, parse_env, resolve_config
from benchmarks.checks.exactness_contexts import SHORT_QUESTIONS, data_contexts, short_contexts
from benchmarks.checks.exactness_plan import (
    PENALTIES,
    SAMPLING,
    cell_key,
    cell_plan,
    judge,
    part_params,
    sampling_params,
)
from benchmarks.checks.exactness_stats import parity_line, tally
from benchmarks.meta import new_run_id, run_metadata
from benchmarks.runlog import Deadline, RunLog, write_json
from benchmarks.server import Server, begin, http_json, start_recorded
from benchmarks.workload import DEFAULT_DATASETS

BATCH = 1024  # copies of a context per /generate call
# /generate calls each server holds at once: with two, one call's replies are read while the next is
# scheduled (one at a time left the tokenizer, scheduler and detokenizer idling in turn).
IN_FLIGHT = 2


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--prompts", choices=("data", "short"), default="data", help="contexts: AIME/AMC cut, or short questions"
    )
    p.add_argument(
        "--data-dir", type=Path, default=None, help="folder with aime24.jsonl / amc23.jsonl (--prompts data)"
    )
    p.add_argument("--datasets", default=",".join(DEFAULT_DATASETS))
    p.add_argument("--contexts", type=int, default=1)
    p.add_argument("--context-tokens", type=int, default=1500)
    p.add_argument("--samples", type=int, default=100_000, help="per server and context")
    p.add_argument("--new-tokens", type=int, default=4, help="max_new_tokens of every sample")
    p.add_argument("--stop-at-eos", action="store_true", help="outputs end at the stop token (default: ignore_eos)")
    for name, (kind, neutral) in SAMPLING.items():
        p.add_argument("--" + name.replace("_", "-"), type=kind, default=neutral)
    p.add_argument("--alpha", type=float, default=1e-3)
    p.add_argument("--reference", default="stock", help="a config without speculation: stock's own sampler")
    p.add_argument("--candidate", default="pillar", help="the config judged against the reference")
    p.add_argument(
        "--controls", default="", help="more configs compared with the reference (not judged), e.g. stock-flashinfer"
    )
    p.add_argument(
        "--mem-fraction-static", type=float, default=None, help="each server's share of the GPU (default 0.8 / servers)"
    )
    add_server_options(p)
    p.add_argument("--run-id", default=None)
    p.add_argument(
        "--resume",
        type=Path,
        default=None,
        help="an earlier run's JSON of the same question: keep its contexts and cells",
    )
    args = p.parse_args(argv)
    try:
        args.env = parse_env(args.env)
        args.controls = [c for c in args.controls.split(",") if c]
        configs = {name: resolve_config(name) for name in (args.reference, args.candidate, *args.controls)}
    except ValueError as e:
        p.error(str(e))
    if len(configs) != 2 + len(args.controls):
        p.error("--reference, --candidate and --controls must name different configs")
    if configs[args.reference].speculative:
        p.error(f"--reference {args.reference}: the reference samples without speculation (stock's own sampler)")
    s = {k: getattr(args, k) for k in SAMPLING}
    if not (
        s["temperature"] > 0 and 0 < s["top_p"] <= 1 and (s["top_k"] == -1 or s["top_k"] >= 1) and 0 <= s["min_p"] < 1
    ):
        p.error("--temperature > 0, --top-p in (0, 1], --top-k -1 or >= 1 and --min-p in [0, 1) are needed")
    if not (0 < s["repetition_penalty"] <= 2 and all(-2 <= s[k] <= 2 for k in PENALTIES[:2])):
        p.error("--frequency-penalty and --presence-penalty must be in [-2, 2], --repetition-penalty in (0, 2]")
    if min(args.contexts, args.context_tokens) < 1 or args.samples < 2 or args.new_tokens < 2:
        p.error("--contexts and --context-tokens must be >= 1, --samples and --new-tokens >= 2")
    if not 0 <= s["min_new_tokens"] < args.new_tokens or (s["min_new_tokens"] and not args.stop_at_eos):
        p.error(
            "--min-new-tokens must be below --new-tokens and needs --stop-at-eos (it only holds back the stop token)"
        )
    if args.prompts == "data" and args.data_dir is None:
        p.error("--prompts data needs --data-dir")
    if args.prompts == "short" and args.contexts > len(SHORT_QUESTIONS):
        p.error(f"--prompts short has {len(SHORT_QUESTIONS)} contexts")
    n_servers = len(configs)
    args.mem_fraction_static = args.mem_fraction_static or round(0.8 / n_servers, 3)
    if not 0 < args.mem_fraction_static * n_servers < 0.95:
        p.error(f"{n_servers} servers on one GPU need --mem-fraction-static below {0.95 / n_servers:.3f}")
    args.extra_server_args = tuple(shlex.split(args.extra_server_args))
    args.datasets = tuple(d for d in args.datasets.split(",") if d)
    args.run_id = args.run_id or new_run_id()
    return args


def launch_fractions(share: float, n: int) -> list[float]:
    """The ``--mem-fraction-static`` of each of ``n`` servers started one after another so that each holds ``share``
    of the card. SGLang 0.5.17 keeps (1 - f) x the memory free at its start for everything but weights and KV
    (``KVCacheConfigurator._profile_available_bytes``), so a server holds f x (what was free when it started):
    server i finds 1 - i x share free and needs f = share / (1 - i x share). Starting together, each would size
    itself on a card the others were still filling, and the later ones fail to start."""
    return [round(share / (1 - i * share), 3) for i in range(n)]


def sample(server: Server, context: list[int], n: int, params: dict[str, Any], deadline: Deadline) -> list[list[int]]:
    """n sampled continuations of one context, BATCH requests per call and IN_FLIGHT calls at a time."""

    def call(m: int) -> list[list[int]]:
        body = {"input_ids": [context] * m, "sampling_params": params, "stream": False}
        replies = http_json(server.base_url + "/generate", body, timeout=max(30.0, deadline.remaining()))
        return [[int(t) for t in r["output_ids"]] for r in replies]

    out: list[list[int]] = []
    with ThreadPoolExecutor(IN_FLIGHT) as pool:
        for outputs in pool.map(call, [min(BATCH, n - i) for i in range(0, n, BATCH)]):
            out.extend(outputs)
    return out


# The settings two runs must share for one to resume the other.
QUESTION = (
    "model",
    "prompts",
    "datasets",
    "contexts",
    "context_tokens",
    "new_tokens",
    "stop_at_eos",
    "reference",
    "candidate",
    *SAMPLING,
)


def resumed(path: Path | None, doc: dict[str, Any]) -> None:
    """Take the contexts, cell tallies and times of an earlier run of the same question into ``doc``."""
    if path is None:
        return
    old = json.loads(path.read_text())
    diff = [k for k in QUESTION if json.dumps(old.get("settings", {}).get(k)) != json.dumps(doc["settings"].get(k))]
    if diff or old.get("schema") != doc["schema"]:
        raise SystemExit(f"--resume {path}: not the same question ({', '.join(diff) or 'an older schema'} differ)")
    doc["contexts"], doc["counts"], doc["seconds"] = old["contexts"], old["counts"], old.get("seconds", {})
    doc["servers"] = {n: r | {"resumed": True} for n, r in old["servers"].items()}
    doc["resumed_from"] = old["meta"]["run_id"]


def server_for(name: str, args: argparse.Namespace, fraction: float, log_dir: Path) -> tuple[Server, dict[str, Any]]:
    """A config's server with the radix cache on (the copies share one prefill), launched with ``fraction``
    (``launch_fractions``: its share of the GPU given the servers started before it)."""
    config = resolve_config(name, args.extra_server_args + ("--mem-fraction-static", str(fraction)))
    flags = [f for f in config.flags if f != "--disable-radix-cache"]
    env = config.environment(args.env)
    server = Server.sglang(args.model, flags, log_path=log_dir / f"{name}.log", env=env)
    return server, {
        "flags": flags,
        "env": env,
        "argv": server.argv,
        "pillar_config": config.pillar_config(args.env),
        "gpu_share": args.mem_fraction_static,
    }


def part_samples(args: argparse.Namespace, part: str) -> int:
    """Samples a server draws in a group: a control's half the main's (it only has to show the test can reject)."""
    return args.samples if part == "main" else args.samples // 2


def group_estimate(seconds: dict[str, float], group: str, args: argparse.Namespace) -> float:
    """A group's expected seconds: its own earlier time, else the longest timed group's scaled by the samples each
    draws ("part | context i" keys); no timed group: 0."""
    if group in seconds:
        return seconds[group]
    per_sample = (s / part_samples(args, g.split(" | ")[0]) for g, s in seconds.items())
    return max(per_sample, default=0.0) * part_samples(args, group.split(" | ")[0])


def run_groups(
    servers: dict[str, Server], args: argparse.Namespace, doc: dict[str, Any], deadline: Deadline, log: RunLog
) -> None:
    """Sample every missing cell, each group's servers at once; a group starts only if its expected time fits."""
    for part, ci, names in cell_plan(args):
        names = [n for n in names if cell_key(n, part, ci) not in doc["counts"]]
        if not names:
            continue
        group = f"{part} | context {ci}"
        est = group_estimate(doc["seconds"], group, args)
        if not deadline.allows(est + 5):
            log.line(f"{group}: SKIPPED (time budget: {deadline.remaining():.0f} s left, ~{est:.0f} s needed)")
            return
        n = part_samples(args, part)
        params, t0 = part_params(args, part), time.monotonic()
        with ThreadPoolExecutor(len(names)) as pool:
            outs = list(
                pool.map(lambda name: sample(servers[name], doc["contexts"][ci]["ids"], n, params, deadline), names)
            )
        for name, outputs in zip(names, outs):
            doc["counts"][cell_key(name, part, ci)] = tally(outputs, args.new_tokens)
        doc["seconds"][group] = time.monotonic() - t0
        judge(doc, args)
        write_json(args.out, doc)  # a cut run keeps every finished cell and its tests
        log.line(f"{group}: {n} samples from {', '.join(names)} in {doc['seconds'][group]:.0f} s")


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    deadline, log = begin(args.time_budget, args.out.with_suffix(".log"))
    log_dir = Path(tempfile.mkdtemp(prefix="sparsespec-exact-"))
    settings = {k: v for k, v in vars(args).items() if k not in ("out", "data_dir", "resume")}
    doc: dict[str, Any] = {
        "kind": "exactness",
        "schema": 4,
        "meta": run_metadata(args.run_id),
        "settings": settings | {"batch": BATCH, "in_flight": IN_FLIGHT, "sampling_params": sampling_params(args)},
        "servers": {},
        "contexts": [],
        "counts": {},
        "seconds": {},
        "tests": [],
        "power": {},
        "verdict": "INCOMPLETE",
    }
    resumed(args.resume, doc)
    if not doc["contexts"] and args.prompts == "short":
        doc["contexts"] = short_contexts(args)
    todo = list(
        dict.fromkeys(
            n for part, ci, names in cell_plan(args) for n in names if cell_key(n, part, ci) not in doc["counts"]
        )
    )
    if not doc["contexts"] and args.reference not in todo:
        todo.insert(0, args.reference)
    # The servers start one after another: their startup times add up (one not yet timed counts as the slowest).
    starts = {n: r["startup_s"] for n, r in doc["servers"].items() if r.get("startup_s")}
    need = sum(starts.get(n, max(starts.values(), default=0.0)) for n in todo) + min(
        doc["seconds"].values(), default=0.0
    )
    if todo and not deadline.allows(need):
        log.line(f"{', '.join(todo)}: SKIPPED (time budget: {deadline.remaining():.0f} s left, ~{need:.0f} s needed)")
        todo = []
    with ExitStack() as stack:
        # One after another, from this thread (a server gets SIGKILL when the thread that launched it ends:
        # PR_SET_PDEATHSIG follows the thread). After a failed start the rest are not launched: their
        # fractions count on every server before them holding its share.
        servers, up = {}, bool(todo)
        for name, fraction in zip(todo, launch_fractions(args.mem_fraction_static, len(todo))):
            servers[name], doc["servers"][name] = server_for(name, args, fraction, log_dir)
            if not up:
                doc["servers"][name].update(status="not started", error="an earlier server failed to start")
                continue
            stack.enter_context(servers[name])
            up = start_recorded(servers[name], name, doc["servers"][name], args.startup_timeout, log)
        if up:
            log.line(f"{', '.join(todo)} up; {deadline.remaining():.0f} s of the budget left")
            if not doc["contexts"]:
                doc["contexts"] = data_contexts(servers[args.reference], args, deadline, log)
            run_groups(servers, args, doc, deadline, log)
    judge(doc, args)
    write_json(args.out, doc)
    for t in doc["tests"]:
        log.line(
            f"{t['config']} ctx {t['context']} {t['statistic']}: chi2 {t['stat']:.1f} df {t['df']} "
            f"p {t['p_value']:.4g} TV {t['total_variation']:.4f}"
        )
    for name, c in doc["power"].items():
        log.line(f"power check ({args.reference} vs {name}): " + ("missing" if c is None else f"p {c['p_value']:.3g}"))
    log.line(f"verdict {doc['verdict']}; {parity_line(doc['parity'])}")
    return 0 if doc["verdict"] == "PASS" else 1


if __name__ == "__main__":
    raise SystemExit(main())
