"""A stand-in for an SGLang server, run as a script by the benchmark harness's tests: it parses the flags a real
launch gets, answers /generate, /server_info, /health_generate and the profiler's endpoints on loopback, and
logs the lines the harness reads off SGLang's output. FAKE_* environment variables pick its failure modes and
sampling quirks (see each use)."""

from __future__ import annotations

import gzip
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
spec = "--speculative-algorithm" in argv
mode = os.environ.get("FAKE_MODE", "ok")
print("fake server starting", argv, flush=True)
LOG_LOCK = threading.Lock()


def log_line(line):
    # Request threads log concurrently; print() writes the text and its newline separately, so two
    # threads could merge their lines into one that no parser reads. One locked write per line.
    with LOG_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


if mode == "exit_early":
    print("boom: CUDA out of memory (fake)", flush=True)
    sys.exit(3)
if os.environ.get("FAKE_GPU"):  # one card shared by the fake servers, sized as SGLang 0.5.17 sizes its memory
    # A ledger of what the servers that are up hold (fractions of the card). The server measures the free
    # memory at its start (pre), loads 1% of weights, and fails like SGLang if what is then free leaves less
    # than pre x (1 - f) (its non-static slack); else it holds pre x f. Loading takes a second, so servers
    # started together all measure the card empty.
    import fcntl

    ledger, f = os.environ["FAKE_GPU"], float(argv[len(argv) - 1 - argv[::-1].index("--mem-fraction-static") + 1])
    used = lambda: sum(float(line.split()[3]) for line in open(ledger)) if os.path.exists(ledger) else 0.0
    t_start, pre = time.time(), 1.0 - used()
    time.sleep(1.0)
    with open(ledger + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if 1.0 - used() - 0.01 <= pre * (1 - f):
            print(
                f"ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={f}",
                flush=True,
            )
            sys.exit(1)
        with open(ledger, "a") as out:
            out.write(f"{f} {t_start} {time.time()} {pre * f}\n")
if os.environ.get("FAKE_CHILD_PIDFILE"):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(os.environ["FAKE_CHILD_PIDFILE"], "w").write(str(child.pid))
diverge_at = int(os.environ.get("FAKE_DIVERGE_AT", "-1"))
served, refusals = [0], [0]
radix, seen = "--disable-radix-cache" not in argv, []  # radix on: earlier prompts' common prefix is cached


def cached(ids):
    common = lambda a: next((i for i, (x, y) in enumerate(zip(a, ids)) if x != y), min(len(a), len(ids)))
    hit = max(map(common, seen), default=0)
    seen.append(ids)
    return hit


def tokens(ids, n):
    return [(sum(ids) + 7 * i) % 5000 for i in range(n)]


# Sampled replies (benchmarks.checks.exactness sends batches of copies): each token from a softmax over 4 tokens
# whose logits follow the token before, at the request's temperature, with SGLang's output penalties on
# the tokens the request already produced; token 3 is the stop token unless ignore_eos, held back before
# min_new_tokens. Each request draws from its own generator, seeded by the server's kind, the call's body,
# how many equal bodies came before and the request's place in the call: concurrent calls are served in
# any order, and the multiset of outputs, all the statistics read, stays the same run to run.
# On a speculative server FAKE_SAMPLE_BIAS_AT=j lifts token 0's logit at output position j, by 1.0 or by the
# server's algorithm's value in FAKE_SAMPLE_LIFTS ("PILLAR=1.0,NGRAM=2.0"), and FAKE_PENALTY_BUG
# drops the penalties and min_new_tokens after token 1 (which comes from the prefill, stock's sampler).
bodies, bodies_lock = {}, threading.Lock()
bias_at = int(os.environ.get("FAKE_SAMPLE_BIAS_AT", "-1")) if spec else -1
lifts = dict(kv.split("=") for kv in os.environ.get("FAKE_SAMPLE_LIFTS", "").split(",") if kv)
lift = float(lifts.get(argv[argv.index("--speculative-algorithm") + 1].upper(), 1.0)) if spec else 0.0
penalty_bug = spec and bool(os.environ.get("FAKE_PENALTY_BUG"))


def sampled_batch(body):
    key = json.dumps([body["input_ids"][0], len(body["input_ids"]), body["sampling_params"]], sort_keys=True)
    with bodies_lock:
        nth = bodies[key] = bodies.get(key, -1) + 1
    return [
        sampled(ids, body["sampling_params"], random.Random(f"{spec}|{key}|{nth}|{i}"))
        for i, ids in enumerate(body["input_ids"])
    ]


def sampled(ids, params, rng):
    neutral = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}
    stop = not params.get("ignore_eos", False)
    prev, out = ids[-1], []
    for j in range(params["max_new_tokens"]):
        pen = neutral if penalty_bug and j > 0 else {k: params.get(k, v) for k, v in neutral.items()}
        weights = []
        for v in range(4):
            x, c = ((prev + 3 * v) % 7) / 2.0 + (lift if j == bias_at and v == 0 else 0.0), out.count(v)
            if c:  # SGLang's order: the repetition penalty scales, then frequency and presence subtract
                x = (
                    (x / pen["repetition_penalty"] if x > 0 else x * pen["repetition_penalty"])
                    - pen["frequency_penalty"] * c
                    - pen["presence_penalty"]
                )
            weights.append(
                0.0 if v == 3 and stop and j < pen["min_new_tokens"] else math.exp(x / params["temperature"])
            )
        prev = rng.choices(range(4), weights=weights)[0]
        out.append(prev)
        if prev == 3 and stop:
            break
    return {"text": "x", "output_ids": out, "meta_info": {"completion_tokens": len(out)}}


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, code, obj):
        data = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/stop_profile":
            return self.reply(400, {"error": "Profiling is not in progress."})
        if self.path == "/health_generate":
            return self.reply(503 if mode == "never_healthy" else 200, {})
        if self.path == "/server_info":
            info = {"version": "fake", "internal_states": [{"x": 1}]}
            if spec:
                info["internal_states"][0]["pillar"] = {"rounds_by_k": {"8": 3}}
            if os.environ.get("FAKE_POOL_TOKENS"):  # SGLang's KV pool size (max_total_num_tokens)
                info["max_total_num_tokens"] = int(os.environ["FAKE_POOL_TOKENS"])
            return self.reply(200, info)
        self.reply(404, {})

    def do_POST(self):
        if self.path == "/flush_cache":  # SGLang's radix-cache flush, no body (benchmarks.checks.exactness)
            refusals[0] += 1  # SGLang refuses while a finished request lingers in its batches
            return self.reply(400 if refusals[0] <= int(os.environ.get("FAKE_FLUSH_REFUSALS", "0")) else 200, {})
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/set_internal_state":
            return self.reply(200, [True])
        if self.path == "/start_profile":  # SGLang replies in plain text; the trace comes after the steps
            trace = {
                "traceEvents": [
                    {"ph": "X", "cat": "kernel", "name": "attn", "ts": 0, "dur": 300 * body["num_steps"]},
                    {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 400 * body["num_steps"], "dur": 100},
                ]
            }
            if "CPU" in body["activities"]:  # a host-profiled trace: one graph launch per step
                trace["traceEvents"] += [
                    {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 10 * i, "dur": 5}
                    for i in range(body["num_steps"])
                ]
            if body["with_stack"]:  # Python frames: a per-request loop calling .item() in each step
                host = {"ph": "X", "pid": 1, "tid": 1}
                for i in range(body["num_steps"]):
                    loop = {"cat": "python_function", "name": "worker.py(7): loop", "ts": 100 * i, "dur": 50}
                    items = [{"cat": "cpu_op", "name": "aten::item", "ts": 100 * i + j, "dur": 1} for j in range(4)]
                    trace["traceEvents"] += [host | e for e in (loop, *items)]
            with gzip.open(os.path.join(body["output_dir"], "p-TP-0.trace.json.gz"), "wt") as f:
                json.dump(trace, f)
            self.send_response(200)
            self.send_header("Content-Length", "17")
            self.end_headers()
            return self.wfile.write(b"Start profiling.\n")
        if self.path != "/generate":
            return self.reply(404, {})
        if body["input_ids"] and isinstance(body["input_ids"][0], list):  # a batch: one reply per prompt
            return self.reply(200, sampled_batch(body))
        ids, n = body["input_ids"], body["sampling_params"]["max_new_tokens"]
        out = tokens(ids, n)
        if spec and diverge_at >= 0 and sum(ids) % 2 == 0:
            out[diverge_at] += 1
        meta = {
            "completion_tokens": n,
            "finish_reason": {"type": "length", "length": n},
            "cached_tokens": cached(ids) if radix else 0,
        }
        # Stock's top-2 gap is FAKE_MARGIN where the candidate diverges.
        if body.get("return_logprob") and not os.environ.get("FAKE_NO_TOP_LOGPROBS"):
            gap = [float(os.environ.get("FAKE_MARGIN", "3")) if i == diverge_at else 3.0 for i in range(n)]
            hesitate = int(os.environ.get("FAKE_HESITATE_AT", "-1"))  # a near tie of the greedy continuation
            gap = [0.01 if i == hesitate else g for i, g in enumerate(gap)]
            meta["output_top_logprobs"] = [[[-0.1, t, None], [-0.1 - m, t + 1, None]] for t, m in zip(out, gap)]
        if spec and os.environ.get("SPARSESPEC_POLICY") == "streaming":  # accepts no draft
            meta.update(spec_verify_ct=n, spec_accept_length=1.0, spec_correct_drafts_histogram=[n])
        elif spec:  # accepts 2 drafts per verify step
            ct = (n + 2) // 3
            meta.update(spec_verify_ct=ct, spec_accept_length=n / ct, spec_correct_drafts_histogram=[0, 0, ct])
        served[0] += 1
        time.sleep(0.002 * n)  # decode time grows with the output length
        if not spec and n >= 40:  # stock's own log: 2 ms per step (the first line of a run never counts)
            b = int(os.environ.get("FAKE_BATCH", "2"))
            for _ in range(2):
                log_line(
                    f"[2026-11-26 14:00:00] Decode batch, #running-req: {b}, #token: {b * 50}, token usage: 0.01, "
                    f"cuda graph: True, gen throughput (token/s): {b / 0.002:.2f}, #queue-req: 0"
                )
        if spec and os.environ.get("SPARSESPEC_STEP_TIMING"):
            # One report per request; the batch is the whole prompt set of a step_times point.
            # The streaming policy captures no scores: its verify is 0.5 ms shorter.
            verify = 1.5 if os.environ.get("SPARSESPEC_POLICY") == "streaming" else 2.0
            log_line(
                f"INFO PILLAR step timing: rounds=10 batch={int(os.environ.get('FAKE_BATCH', '2'))}.00 "
                f"draft_ms=1.5000 verify_ms={verify:.4f} accept_ms=0.2500 select_ms=0.5000 gap_ms=0.1000"
            )
        if mode == "die_on_second_generate" and served[0] == 2:
            time.sleep(0.3)  # crash mid-request, without replying
            os._exit(9)
        self.reply(200, {"text": "x", "output_ids": out, "meta_info": meta})


ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
