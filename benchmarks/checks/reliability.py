"""Reliability run against one live server: load with client aborts, every bad input, idle, probes.

    python -m benchmarks.checks.reliability --model M --data-dir D --out F.json [--config pillar] \\
        [--requests 1000] [--aborts 200] [--fuzz 300] [--concurrency 128] [--time-budget 560]

One server (radix cache on, chunked prefill on with ``--chunked-prefill-size``, metrics on), then:

1. a greedy probe (top-2 log-probabilities of every token);
2. ``--requests`` native ``/generate`` requests, prompts of 1-8 concatenated AIME/AMC prompts,
   ``max_new_tokens`` log-uniform in [8, ``--max-new-tokens``], temperature 0 / 0.6 / 1.0, top-p
   1 / 0.95 / 0.8, 40 % streamed; ``--aborts`` of them dropped by the client (streams closed after
   a few events, non-streamed ones given a timeout shorter than their generation);
3. every input of ``benchmarks/checks/bad_inputs.py``'s hand list and ``--fuzz`` bodies of
   ``benchmarks/checks/fuzz_probes.py`` over the server's ``/openapi.json``, each judged against the status
   it must get (those sent while other requests run, ``benchmarks/checks/live_probes.py``, also by how the
   running requests end);
4. idle: ``/v1/loads`` until no request runs or waits, then ``--settle`` seconds in which SGLang's own
   idle check runs (it raises in the scheduler on a KV or request-slot leak); a leak is a server that
   died, a leak message in its log, or KV tokens still in use (``num_used_tokens`` > 0: the radix
   cache's evictable tokens count as free);
5. the greedy probe again: identical, or diverging only at a near tie as ``benchmarks.checks.identity``
   judges it (the first probe's top-2 margin at the divergence <= NEAR_TIE_NATS).

Writes F.json (kind "reliability", rewritten after every phase; ``metrics``: the speculative series
of ``/metrics`` at the end) and F.log; exit code 0 = PASS.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks.checks.bad_inputs import Probe, effective_status, hand_list
from benchmarks.checks.fuzz_probes import fuzz_inputs
from benchmarks.client import parse_generate_reply
from benchmarks.configs import file_stem, parse_env, resolve_config
from benchmarks.checks.live_probes import send_live_probe
from benchmarks.checks.load_phase import latency_summary, plan_load, post_json, run_load
from benchmarks.checks.identity import compare_outputs
from benchmarks.meta import new_run_id, run_metadata
from benchmarks.runlog import Deadline, RunLog, write_json
from benchmarks.server import STOP_RESERVE_S, Server, ServerError, http_json, install_signal_handlers, log_tail
from benchmarks.workload import build_prompts, load_tokenizer

LEAK_PATTERNS = ("memory leak detected", "KV double free", "use-after-free")
PROBE_TOKENS = 256


def model_limits(model: str, server_info: dict[str, Any]) -> tuple[int, int]:
    """(vocabulary size, context length) as the server sees them: config.json's vocab_size, the
    server's --context-length (else the model's max_position_embeddings)."""
    config = json.loads((Path(model) / "config.json").read_text())
    context = server_info.get("context_length") or config["max_position_embeddings"]
    return int(config["vocab_size"]), int(context)


def send_probe(base_url: str, probe: Probe, timeout: float) -> tuple[int | None, str]:
    """The effective status (None: no answer) and the first 300 characters of the reply."""
    try:
        with post_json(base_url + probe.path, probe.body, timeout) as resp:
            data = resp.read(1 << 20)
            return effective_status(resp.status, data), data[:300].decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read(300).decode("utf-8", "replace")
    except (OSError, ValueError) as e:
        return None, f"{type(e).__name__}: {e}"[:300]


def greedy_probe(base_url: str, ids: Sequence[int], timeout: float):
    body = {
        "input_ids": list(ids),
        "sampling_params": {"max_new_tokens": PROBE_TOKENS, "temperature": 0, "ignore_eos": True},
        "return_logprob": True,
        "top_logprobs_num": 2,
    }
    return parse_generate_reply(http_json(base_url + "/generate", body, timeout=timeout))


def wait_idle(server: Server, timeout_s: float, settle_s: float) -> dict[str, Any]:
    """Poll /v1/loads until nothing runs or waits, let SGLang's idle check run, and read the pool."""
    end = time.monotonic() + timeout_s
    load: dict[str, Any] = {}
    while time.monotonic() < end:
        server.check_alive()
        load = http_json(server.base_url + "/v1/loads?include=core", timeout=10)["loads"][0]
        if load.get("num_running_reqs", 0) == 0 and load.get("num_waiting_reqs", 0) == 0:
            break
        time.sleep(1.0)
    else:
        return {"idle": False, "load": load}
    time.sleep(settle_s)
    server.check_alive()
    load = http_json(server.base_url + "/v1/loads?include=core", timeout=10)["loads"][0]
    return {"idle": True, "load": load}


def speculative_series(base_url: str) -> dict[str, float] | None:
    """PILLAR's and SGLang's speculative series from /metrics (histogram buckets left out); None
    when the server exports none."""
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=30) as r:
            text = r.read().decode()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        if line.startswith(("sglang:pillar_", "sglang:spec_accept_")) and "_bucket{" not in line:
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out or None


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model folder (also the tokenizer)")
    p.add_argument("--data-dir", required=True, type=Path, help="folder with aime24.jsonl / amc23.jsonl")
    p.add_argument("--out", required=True, type=Path, help="result JSON; the log goes beside it (.log)")
    p.add_argument("--config", default="pillar", help="server config (benchmarks/configs.py); radix cache stays on")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--aborts", type=int, default=200, help="requests the client drops (counted: actually dropped)")
    p.add_argument("--max-new-tokens", type=int, default=3000)
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--fuzz", type=int, default=300, help="fuzzed bad bodies (besides the hand list)")
    p.add_argument("--seed", type=int, default=22)
    p.add_argument("--chunked-prefill-size", type=int, default=512, help="small, so the 200-1600 token prompts chunk")
    p.add_argument("--idle-timeout", type=float, default=120.0)
    p.add_argument("--settle", type=float, default=10.0, help="idle seconds for SGLang's own leak check")
    p.add_argument("--extra-server-args", default="", help='use the = form: --extra-server-args="--x 1"')
    p.add_argument("--env", action="append", default=[], metavar="KEY=VAL", help="server environment (repeatable)")
    p.add_argument("--startup-timeout", type=float, default=400.0)
    p.add_argument("--time-budget", type=float, default=560.0, help="seconds for the whole invocation")
    p.add_argument("--server-log-dir", type=Path, default=None, help="full server log (default: a temp dir)")
    args = p.parse_args(argv)
    if args.requests < 1 or not 0 <= args.aborts <= args.requests or args.max_new_tokens < 8:
        p.error("need --requests >= 1, 0 <= --aborts <= --requests, --max-new-tokens >= 8")
    try:
        args.env = parse_env(args.env)
        cfg = resolve_config(args.config, tuple(args.extra_server_args.split()))
    except ValueError as e:
        p.error(str(e))
    # COMMON_FLAGS turn the radix cache off for the throughput comparisons; this run needs it on.
    flags = tuple(f for f in cfg.flags if f != "--disable-radix-cache")
    args.server_config = cfg
    args.flags = (*flags, "--chunked-prefill-size", str(args.chunked_prefill_size), "--enable-metrics")
    args.server_log_dir = args.server_log_dir or Path(tempfile.mkdtemp(prefix="sparsespec-reliability-"))
    return args


def verdict(doc: dict[str, Any], args: argparse.Namespace) -> str:
    ok = (
        doc["server_alive_after"] is True
        and doc["leak_detected"] is False
        and doc["probe_consistent"] is True
        and doc["requests"] >= args.requests
        and doc["aborted"] >= args.aborts
        and doc["load_errors"] == 0
        and not doc["bad_inputs_failed"]
    )
    return "PASS" if ok else "FAIL"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    install_signal_handlers()
    deadline = Deadline(args.time_budget)
    log = RunLog(args.out.with_suffix(".log"))
    cfg = args.server_config
    doc: dict[str, Any] = {
        "kind": "reliability",
        "schema": 1,
        "meta": run_metadata(new_run_id()),
        "config": {"name": cfg.name, "flags": list(args.flags), "env": cfg.environment(args.env)},
        "settings": {
            k: getattr(args, k) for k in ("requests", "aborts", "max_new_tokens", "concurrency", "fuzz", "seed")
        },
        "requests": 0,
        "aborted": 0,
        "load_errors": 0,
        "load_error_samples": [],
        "latencies": {},
        "bad_inputs": {},
        "bad_inputs_failed": [],
        "killed_by": None,
        "idle": None,
        "server_alive_after": None,
        "leak_detected": None,
        "probe_consistent": None,
        "verdict": "INCOMPLETE",
    }
    write_json(args.out, doc)
    tok = load_tokenizer(args.model)
    prompts = [p.input_ids for p in build_prompts(tok, args.data_dir, 16)]
    plan = plan_load(prompts, args.requests, args.aborts, args.max_new_tokens, args.seed)
    server = Server.sglang(
        args.model,
        args.flags,
        log_path=args.server_log_dir / f"{file_stem(cfg.name)}.server.log",
        env=doc["config"]["env"],
    )
    with server:
        try:
            doc["startup_s"] = server.start(timeout_s=min(args.startup_timeout, deadline.remaining() - STOP_RESERVE_S))
            timeout = max(30.0, deadline.remaining() - STOP_RESERVE_S)
            before = greedy_probe(server.base_url, prompts[0], timeout)
            log.line(f"{cfg.name}: up in {doc['startup_s']:.0f} s; load of {len(plan)} requests")
            outcomes = run_load(server, plan, args.concurrency, deadline)
            kinds = [o.kind for o in outcomes]
            doc.update(requests=len(outcomes), aborted=kinds.count("aborted"), load_errors=kinds.count("error"))
            doc["load_error_samples"] = [asdict(o) for o in outcomes if o.kind == "error"][:10]
            doc["latencies"] = latency_summary(outcomes)
            write_json(args.out, doc)
            log.line(f"load: {doc['requests']} done, {doc['aborted']} aborted, {doc['load_errors']} errors")
            vocab, context = model_limits(args.model, http_json(server.base_url + "/server_info", timeout=30))
            openapi = http_json(server.base_url + "/openapi.json", timeout=30)
            probes = hand_list(vocab, context) + fuzz_inputs(openapi, args.seed, args.fuzz, vocab)
            for probe in probes:
                if probe.live:
                    status, reply, live = send_live_probe(server.base_url, probe, 120, send_probe)
                else:
                    (status, reply), live = send_probe(server.base_url, probe, timeout=120), []
                doc["bad_inputs"][probe.name] = status
                if not probe.judge(status) or live:
                    doc["bad_inputs_failed"].append(
                        {
                            "name": probe.name,
                            "path": probe.path,
                            "status": status,
                            "body": json.dumps(probe.body)[:300],
                            "reply": reply,
                            "live": live,
                        }
                    )
                try:
                    server.check_alive(grace_s=0.5 if status is None else 0.0)
                except ServerError:
                    doc["killed_by"] = probe.name
                    raise
            write_json(args.out, doc)
            log.line(f"bad inputs: {len(probes)} sent, {len(doc['bad_inputs_failed'])} answered wrongly")
            doc["idle"] = wait_idle(server, args.idle_timeout, args.settle)
            after = greedy_probe(server.base_url, prompts[0], timeout)
            ident = compare_outputs([before], [after], early=PROBE_TOKENS)["requests"][0]
            doc["probe"] = {k: ident.get(k) for k in ("identical", "first_divergence", "reference_margin", "near_tie")}
            doc["probe_consistent"] = bool(ident["identical"] or ident.get("near_tie"))
            server.check_alive()
            with urllib.request.urlopen(server.base_url + "/health_generate", timeout=60) as r:
                doc["server_alive_after"] = r.status == 200
            doc["metrics"] = speculative_series(server.base_url)
        except (ServerError, OSError, ValueError) as e:
            doc["error"] = f"{type(e).__name__}: {e}"[:2000]
            log.line(f"stopped: {str(e).splitlines()[0]}")
            doc["server_alive_after"] = False
        tail = log_tail(server.log_path, 400)
        leak_lines = [line for line in tail.splitlines() if any(p in line for p in LEAK_PATTERNS)]
        idle = doc["idle"] or {}
        used = idle.get("load", {}).get("num_used_tokens") if idle.get("idle") else None
        doc["leak_log_lines"] = leak_lines[:10]
        # None: the run never reached an idle server, so it could not tell.
        doc["leak_detected"] = True if leak_lines or (used or 0) > 0 else (False if used is not None else None)
        log.block("server log tail", tail)
    doc["verdict"] = verdict(doc, args)
    write_json(args.out, doc)
    log.line(
        f"RELIABILITY {doc['verdict']}: alive {doc['server_alive_after']}, leak {doc['leak_detected']}, "
        f"probe consistent {doc['probe_consistent']} -> {args.out}"
    )
    return 0 if doc["verdict"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
