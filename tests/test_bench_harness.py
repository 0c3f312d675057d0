"""CPU tests of the benchmark harness: each entry point end to end against a fake loopback "SGLang server"
(a small http.server script) and a fake bench_serving, the server lifecycle, and the report on the
checked-in results.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# benchmarks/ is a folder at the repository root, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import (
    acceptance,
    bench_driver,
    configs,
    report,
    run_clock,
    server,
    serving_run,
    step_analysis,
    step_times,
    sweep,
    throughput,
    workload,
)
from benchmarks.checks import exactness, lossless, offload
from benchmarks.checks.exactness_stats import counters
from benchmarks.client import generate_all

FAKE_SERVER = textwrap.dedent(
    r'''
    import gzip, json, math, os, random, subprocess, sys, threading, time
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
                print(f"ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={f}", flush=True)
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
        return [sampled(ids, body["sampling_params"], random.Random(f"{spec}|{key}|{nth}|{i}"))
                for i, ids in enumerate(body["input_ids"])]

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
                    x = (x / pen["repetition_penalty"] if x > 0 else x * pen["repetition_penalty"]) - pen["frequency_penalty"] * c - pen["presence_penalty"]
                weights.append(0.0 if v == 3 and stop and j < pen["min_new_tokens"] else math.exp(x / params["temperature"]))
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
                trace = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "attn", "ts": 0, "dur": 300 * body["num_steps"]},
                                         {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 400 * body["num_steps"], "dur": 100}]}
                if "CPU" in body["activities"]:  # a host-profiled trace: one graph launch per step
                    trace["traceEvents"] += [{"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 10 * i,
                                              "dur": 5} for i in range(body["num_steps"])]  # fmt: skip
                if body["with_stack"]:  # Python frames: a per-request loop calling .item() in each step
                    for i in range(body["num_steps"]):
                        trace["traceEvents"] += [{"ph": "X", "cat": "python_function", "name": "worker.py(7): loop",
                                                  "ts": 100 * i, "dur": 50, "pid": 1, "tid": 1}] + [
                            {"ph": "X", "cat": "cpu_op", "name": "aten::item", "ts": 100 * i + j, "dur": 1, "pid": 1, "tid": 1}
                            for j in range(4)]  # fmt: skip
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
            meta = {"completion_tokens": n, "finish_reason": {"type": "length", "length": n},
                    "cached_tokens": cached(ids) if radix else 0}
            if body.get("return_logprob") and not os.environ.get("FAKE_NO_TOP_LOGPROBS"):  # stock's top-2 gap is FAKE_MARGIN where the candidate diverges
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
                    log_line(f"[2026-11-26 14:00:00] Decode batch, #running-req: {b}, #token: {b * 50}, token usage: 0.01, "
                             f"cuda graph: True, gen throughput (token/s): {b / 0.002:.2f}, #queue-req: 0")
            if spec and os.environ.get("SPARSESPEC_STEP_TIMING"):
                # One report per request; the batch is the whole prompt set of a step_times point.
                # The streaming policy captures no scores: its verify is 0.5 ms shorter.
                verify = 1.5 if os.environ.get("SPARSESPEC_POLICY") == "streaming" else 2.0
                log_line(f"INFO PILLAR step timing: rounds=10 batch={int(os.environ.get('FAKE_BATCH', '2'))}.00 "
                         f"draft_ms=1.5000 verify_ms={verify:.4f} accept_ms=0.2500 select_ms=0.5000 gap_ms=0.1000")
            if mode == "die_on_second_generate" and served[0] == 2:
                time.sleep(0.3)  # crash mid-request, without replying
                os._exit(9)
            self.reply(200, {"text": "x", "output_ids": out, "meta_info": meta})

    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    '''
)

# A stand-in for sglang.benchmark.serving, imported by the bench driver (``cli_main`` reads sys.argv).
FAKE_BENCH = textwrap.dedent(
    r'''
    import json, sys, time, urllib.request
    print("fake bench module imported")  # must not reach the driver's protocol pipe

    def cli_main():
        a = sys.argv[1:]
        get = lambda k: a[a.index(k) + 1]
        print("fake bench run", sys.argv[0], len(a), "args")
        mode = get("--fake-mode") if "--fake-mode" in a else ""
        if mode == "hang":
            time.sleep(3600)
        if mode == "raise":
            raise ValueError("fake bench failure")
        if mode == "exit":
            sys.exit(3)
        if "--dataset-path" in a:
            open(get("--dataset-path")).read()  # the harness wrote the prompt file
        urllib.request.urlopen(get("--base-url") + "/health_generate", timeout=5).read()
        n, c, out_len = int(get("--num-prompts")), int(get("--max-concurrency")), int(get("--sharegpt-output-len"))
        res = {"completed": n, "duration": 2.0, "total_output_tokens": n * out_len, "output_throughput": 100.0 * c,
               "median_tpot_ms": 5.0, "p99_tpot_ms": 9.0, "median_itl_ms": 4.0, "p99_itl_ms": 8.0,
               "median_ttft_ms": 30.0, "accept_length": 2.5 if "pillar" in get("--output-file") else None,
               "server_info": {"big": "dropped"}}
        if "--output-details" in a:  # per request, as bench_serving adds them (ITLs per streamed chunk)
            res.update(ttfts=[0.25] * n, itls=[[0.5, 0.25 * i] for i in range(n)], output_lens=[out_len] * n,
                       generated_texts=["x"] * n, errors=[""] * n)
        open(get("--output-file"), "a").write(json.dumps(res) + "\n")
    '''
)




# --------------------------------------------------------------------------- fixtures


@pytest.fixture()
def fake_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point every BenchDriver at FAKE_BENCH (a module on the children's PYTHONPATH); returns its name."""
    mod_dir = tmp_path / "fake_bench_mod"
    mod_dir.mkdir()
    (mod_dir / "fake_bench.py").write_text(FAKE_BENCH)
    monkeypatch.setenv("PYTHONPATH", str(mod_dir))
    monkeypatch.setattr(bench_driver, "BENCH_MODULE", "fake_bench")
    return "fake_bench"


@pytest.fixture(scope="module")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A word-level tokenizer with a chat template, saved like a model folder's tokenizer."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "<|user|>", "<|assistant|>"] + [f"w{i}" for i in range(50)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.chat_template = (
        "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}<|assistant|> {% endif %}"
    )
    path = tmp_path_factory.mktemp("tok")
    fast.save_pretrained(path)
    return path


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    (d / "aime24.jsonl").write_text("".join(json.dumps({"problem": f"w{i} w{i + 1}"}) + "\n" for i in range(3)))
    (d / "amc23.jsonl").write_text(json.dumps({"problem": "w9 w8 w7", "answer": "1"}) + "\n\n")
    return d


@pytest.fixture()
def fake_sglang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Route Server.sglang to the fake server script (same flags, so spec vs stock still shows)."""
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    monkeypatch.setattr(
        server, "launch_command",
        lambda model, flags, host, port: [sys.executable, str(script), "--host", host, "--port", str(port), *flags],
    )  # fmt: skip
    return script


def fake_server(tmp_path: Path, **env: str) -> server.Server:
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    port = server.free_port()
    return server.Server([sys.executable, str(script), "--port", str(port)], port=port, log_path=tmp_path / "srv.log", env=env)


def wait_dead(pid: int, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True
        if stat[stat.rfind(")") + 2] == "Z":
            return True
        time.sleep(0.1)
    return False


# --------------------------------------------------------------------------- what SGLang 0.5.17 accepts


def test_config_flags_parse_with_sglang_cli_and_bad_names_fail_early() -> None:
    """Every flag we pass exists in launch_server's parser; a bad config name or knob fails at argument parsing."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    from sglang_sparsespec.patches.spec_algo import route_attention

    def parse(cfg: configs.ServerConfig) -> argparse.Namespace:
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        return parser.parse_args(["--model-path", "m", *cfg.flags])

    # Every PILLAR config has a FlashInfer twin: the same flags but the backend, which PILLAR's validator
    # routes (prefill on FlashInfer, decode and verify on Triton).
    for name in ("pillar-flashinfer", "pillar-k4-coarse-flashinfer:recent_window=16"):
        twin = configs.resolve_config(name.replace("-flashinfer", ""))
        ns = parse(cfg := configs.resolve_config(name))
        assert [f for f in cfg.flags if f != "flashinfer"] == [f for f in twin.flags if f != "triton"] and cfg.env == twin.env
        ns.get_attention_backends = lambda ns=ns: ServerArgs.get_attention_backends(ns)
        assert ns.attention_backend == "flashinfer" and route_attention(ns) is None
        assert (ns.prefill_attention_backend, ns.decode_attention_backend, ns.speculative_attention_mode) == (
            "flashinfer", "triton", "decode")  # fmt: skip
    on = configs.with_radix_cache(configs.resolve_config("stock", ("--chunked-prefill-size", "512")))
    ns = parse(on)
    assert not ns.disable_radix_cache and ns.chunked_prefill_size == 512 and configs.flag_value(on.flags, "--page-size") == "1"
    for name in ("stock", "stock-flashinfer", "ngram", "pillar-k4-streaming:recent_window=16"):
        ns = parse(cfg := configs.resolve_config(name))
        assert ns.disable_radix_cache and ns.cuda_graph_max_bs_decode == 256 and ns.page_size == 1
    assert ns.speculative_algorithm == "PILLAR" and ns.speculative_num_steps == 4
    assert dict(cfg.env) == {"SPARSESPEC_POLICY": "streaming", "SPARSESPEC_RECENT_WINDOW": "16"}
    assert cfg.pillar_config({})["recent_window"] == 16 and configs.file_stem(cfg.name) == "pillar-k4-streaming.recent_window-16"
    bad = {
        "eagle": "unknown config", "pillar-k0": "at least 1", "stock:recent_window=16": "'stock' takes none",
        "pillar:foo=1": "unknown PILLAR knob 'foo'", "pillar:budget_ratio=2": "BUDGET_RATIO must be in",
        "pillar-streaming:policy=pillar": "the -streaming suffix already sets the policy",
        "pillar:sink_tokens=1:sink_tokens=2": "sink_tokens given twice", "pillar-flashinfer-k4": "unknown config",
    }  # fmt: skip
    for name, message in bad.items():
        with pytest.raises(ValueError, match=re.escape(message)):
            configs.resolve_config(name)


def test_bench_driver_with_the_real_bench_serving(tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    """SGLang's bench module imports in the driver and knows every flag the harness passes; the prompt file
    loads through its own ``custom`` dataset reader."""
    from sglang.benchmark.datasets.custom import sample_custom_requests

    tok = workload.load_tokenizer(str(tiny_tokenizer_dir))
    prompts = workload.build_prompts(tok, data_dir, 6)
    assert [p.source for p in prompts] == ["aime24:0", "aime24:1", "aime24:2", "amc23:0", "aime24:0", "aime24:1"]
    assert prompts[0].text.startswith("<|user|> w0 w1\nPlease reason step by step")
    path = tmp_path / "bench.jsonl"
    workload.write_bench_serving_file(path, prompts)
    rows = sample_custom_requests(str(path), 6, tok, fixed_output_len=64)
    assert {r.output_len for r in rows} == {64} and sorted(r.prompt for r in rows) == sorted(p.text for p in prompts)

    argv = serving_run.bench_argv("http://h:1", "/m", serving_run.Workload(16, 0.6, 0.95, {1: path}), 1, 1, tmp_path / "o")
    assert argv[argv.index("--request-rate") + 1] == "inf"  # bench_serving's own default, spelled out
    with bench_driver.BenchDriver(tmp_path / "driver.log") as driver:
        assert driver.run(["--help"], tmp_path / "help.log", 300, lambda: None) == 0
    text = (tmp_path / "help.log").read_text()
    assert "Benchmark the online serving throughput" in text
    assert not [f for f in argv if f.startswith("--") and f not in text]


def test_bench_driver_reports_and_recovers(fake_bench: str, tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    with bench_driver.BenchDriver(tmp_path / "driver.log") as driver:
        assert driver.run(["--fake-mode", "exit"], log, 60, lambda: None) == 3
        pid = driver.proc.pid if driver.proc else None
        assert driver.run(["--fake-mode", "raise"], log, 60, lambda: None) == 1
        assert driver.proc is not None and driver.proc.pid == pid  # one import served both runs
        assert "ValueError: fake bench failure" in log.read_text()
        assert "fake bench module imported" in (tmp_path / "driver.log").read_text()
        with pytest.raises(TimeoutError):
            driver.run(["--fake-mode", "hang"], log, 1.5, lambda: None)
        assert driver.proc is None and wait_dead(pid)  # type: ignore[arg-type]

        def server_died() -> None:
            raise server.ServerError("server exited with code 9")

        with pytest.raises(server.ServerError):
            driver.run(["--fake-mode", "hang"], log, 60, server_died)
        assert driver.run(["--fake-mode", "exit"], log, 60, lambda: None) == 3  # a fresh driver
    broken = bench_driver.BenchDriver(tmp_path / "broken.log", module="no_such_module_here")
    with pytest.raises(bench_driver.DriverError, match="exited with code 1"):
        broken.run([], log, 60, lambda: None)


# --------------------------------------------------------------------------- server lifecycle


def test_server_early_death_and_startup_timeout(tmp_path: Path) -> None:
    srv = fake_server(tmp_path, FAKE_MODE="exit_early")
    with pytest.raises(server.ServerError, match="exited with code 3") as e, srv:
        srv.start(timeout_s=60, poll_s=0.1)
    assert "CUDA out of memory (fake)" in str(e.value) and srv.proc is None
    pidfile = tmp_path / "child.pid"
    srv = fake_server(tmp_path, FAKE_MODE="never_healthy", FAKE_CHILD_PIDFILE=str(pidfile))
    with pytest.raises(server.ServerError, match="not healthy after"):
        srv.start(timeout_s=2, poll_s=0.2)
    assert srv.proc is None and wait_dead(int(pidfile.read_text()))


def test_server_stop_kills_children_and_death_mid_run_is_detected(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    srv = fake_server(tmp_path, FAKE_CHILD_PIDFILE=str(pidfile), FAKE_MODE="die_on_second_generate")
    with srv:
        srv.start(timeout_s=30, poll_s=0.1)
        leader, child = srv.proc.pid, int(pidfile.read_text())
        out = generate_all(srv, [[2, 3]], {"max_new_tokens": 5}, concurrency=1, timeout_s=20)
        assert out[0].output_ids == [5, 12, 19, 26, 33]
        with pytest.raises(server.ServerError, match="exited with code 9"):
            generate_all(srv, [[2, 3]] * 3, {"max_new_tokens": 5}, concurrency=1, timeout_s=20)
    assert wait_dead(leader) and wait_dead(child)
    srv.stop()  # idempotent


def test_sigterm_to_harness_stops_server(tmp_path: Path) -> None:
    """A harness killed with SIGTERM (a tool's timeout) takes its server group down with it."""
    pidfile, ready = tmp_path / "child.pid", tmp_path / "ready"
    script = tmp_path / "fake_server.py"
    script.write_text(FAKE_SERVER)
    harness = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
        from pathlib import Path
        from benchmarks import server
        server.install_signal_handlers()
        port = server.free_port()
        s = server.Server([sys.executable, {str(script)!r}, "--port", str(port)], port=port,
                          log_path=Path({str(tmp_path / "h.log")!r}), env={{"FAKE_CHILD_PIDFILE": {str(pidfile)!r}}})
        with s:
            s.start(timeout_s=30, poll_s=0.1)
            Path({str(ready)!r}).write_text(str(s.proc.pid))
            time.sleep(120)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", harness])
    try:
        end = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < end:
            time.sleep(0.1)
        leader = int(ready.read_text())
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
        assert wait_dead(leader) and wait_dead(int(pidfile.read_text()))
    finally:
        if proc.poll() is None:
            proc.kill()


# --------------------------------------------------------------------------- entry points end to end


def test_acceptance_end_to_end(fake_sglang: Path, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "acc.json"
    argv = ["--model", str(tiny_tokenizer_dir), "--data-dir", str(data_dir), "--num-prompts", "3",
            "--max-new-tokens", "30", "--configs", "pillar,pillar-streaming", "--temps", "0,0.6",
            "--out", str(out), "--server-log-dir", str(tmp_path / "logs")]  # fmt: skip
    assert acceptance.main(argv) == 0
    doc = json.loads(out.read_text())
    pillar, streaming = doc["results"]["pillar"], doc["results"]["pillar-streaming"]
    assert [p["temperature"] for p in pillar] == [0.0, 0.6]
    # The fake accepts 2 of k drafts per verify step: accept length 3, both positions always accepted.
    assert pillar[0]["accept_length_overall"] == pytest.approx(3.0) and pillar[0]["accept_rate_by_position"] == [1.0, 1.0]
    # The policy reached the server through the config's environment (the fake's streaming accepts none).
    assert streaming[0]["accept_length_overall"] == 1.0 and streaming[0]["correct_drafts_histogram"] == [90]
    assert doc["servers"]["pillar-streaming"]["pillar_config"]["policy"] == "streaming"
    assert "| pillar | 0.6 | 3.00 | 1.00 1.00 | ok |" in out.with_suffix(".log").read_text()
    with pytest.raises(SystemExit):  # a non-speculative config is refused
        acceptance.main([*argv, "--configs", "stock"])


def test_exactness_end_to_end_against_stock(
    fake_sglang: Path, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PILLAR judged against stock's own sampler, both servers on one GPU: servers that sample alike pass; a
    candidate that tilts a verify token fails; one whose token 1 differs (drawn before any PILLAR code runs) is
    NUMERICS, not FAIL. The fake samples each request from its own seeded generator, so every verdict here is
    the same run to run however the concurrent calls interleave."""
    argv = ["--model", str(tiny_tokenizer_dir), "--data-dir", str(data_dir), "--contexts", "1",
            "--context-tokens", "8", "--samples", "3000", "--new-tokens", "3"]  # fmt: skip

    def run(name: str, *more: str) -> tuple[int, dict]:
        out = tmp_path / f"{name}.json"
        code = exactness.main([*argv, *more, "--out", str(out)])
        return code, json.loads(out.read_text())

    monkeypatch.setenv("FAKE_FLUSH_REFUSALS", "2")  # the radix-cache flush is retried through refusals
    monkeypatch.setenv("FAKE_HESITATE_AT", "6")  # the context is cut where the greedy continuation hesitates
    monkeypatch.setenv("FAKE_GPU", str(tmp_path / "gpu"))
    code, doc = run("same")
    monkeypatch.delenv("FAKE_GPU")
    assert code == 0 and doc["verdict"] == "PASS" and doc["settings"]["reference"] == "stock"
    assert doc["control"]["p_value"] < doc["bonferroni_threshold"] and list(doc["power"]) == ["hot: token 2"]
    assert [t["statistic"] for t in doc["tests"]] == ["token 1", "token 2", "token 3", "length", "repeats"]
    (ctx,) = doc["contexts"]
    assert ctx["greedy_lead_nats"] == pytest.approx(0.01) and len(ctx["ids"]) == ctx["tokens"]
    assert sum(n for _, n in doc["counts"]["pillar | main | context 0"]["first"]) == 3000
    assert doc["settings"]["sampling_params"] == {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "min_p": 0.0,
        "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0,
        "max_new_tokens": 3, "ignore_eos": True}  # fmt: skip
    # One GPU: the servers start one after another, each once the one before is up, sized so that each holds its
    # share of the card (the fake GPU sizes them as SGLang does); both keep the radix cache for the shared prefill.
    for name, fraction in (("stock", "0.4"), ("pillar", "0.667")):
        flags = doc["servers"][name]["flags"]
        assert configs.flag_value(flags, "--mem-fraction-static") == fraction and "--disable-radix-cache" not in flags
        assert doc["servers"][name]["argv"][-len(flags):] == flags and doc["servers"][name]["gpu_share"] == 0.4
    first, second = sorted([float(x) for x in line.split()] for line in (tmp_path / "gpu").read_text().splitlines())
    assert first[0] == 0.4 and second[0] == 0.667 and second[1] >= first[2]  # launched after the first was up
    assert first[3] == pytest.approx(0.4, abs=1e-3) and second[3] == pytest.approx(0.4, abs=1e-3)
    assert doc["servers"]["pillar"]["pillar_config"]["num_steps"] == 8 and doc["servers"]["stock"]["pillar_config"] is None
    # A resumed run keeps the cells it is given and samples only the missing ones (here: the candidate's).
    partial = json.loads((tmp_path / "same.json").read_text())
    del partial["counts"]["pillar | main | context 0"]
    (tmp_path / "partial.json").write_text(json.dumps(partial))
    resume = ["--resume", str(tmp_path / "partial.json")]
    code, doc = run("resumed", *resume)
    assert code == 0 and doc["verdict"] == "PASS" and doc["resumed_from"] == partial["meta"]["run_id"]
    assert doc["contexts"] == partial["contexts"] and doc["servers"]["pillar"].get("resumed") is None
    assert doc["servers"]["stock"]["resumed"] and doc["seconds"].keys() == partial["seconds"].keys()
    # Sampled again on a fresh server, the candidate's cell holds the same counts: the fake is deterministic.
    # (Tallies list [value, count] in the order values were first seen, per token position too, which concurrency
    # may change: they are compared as counters.)
    def tallies(counts: dict) -> dict:
        return {cell: counters(c) for cell, c in counts.items()}

    assert tallies(doc["counts"]) == tallies(json.loads((tmp_path / "same.json").read_text())["counts"])
    with pytest.raises(SystemExit, match="not the same question"):
        exactness.main([*argv, "--top-k", "2", "--out", str(tmp_path / "x.json"), *resume])
    # The servers start one after another, so a run needs their start times added up: two 300 s starts do not
    # fit 500 s, and nothing is launched.
    slow = json.loads((tmp_path / "same.json").read_text()) | {"counts": {}}
    for record in slow["servers"].values():
        record["startup_s"] = 300.0
    (tmp_path / "slow.json").write_text(json.dumps(slow))
    code, doc = run("slow", "--resume", str(tmp_path / "slow.json"), "--time-budget", "500")
    assert code == 1 and doc["verdict"] == "INCOMPLETE" and "stock, pillar: SKIPPED" in (tmp_path / "slow.log").read_text()
    # Every PILLAR server starts cold: no round costs from an earlier server of its setup.
    assert doc["servers"]["pillar"]["env"] == {"SPARSESPEC_COST_CACHE": "off"}
    monkeypatch.setenv("FAKE_SAMPLE_BIAS_AT", "1")  # the candidate's first verify token
    code, doc = run("tilted")
    assert code == 1 and doc["verdict"] == "FAIL"
    assert [t["p_value"] < doc["bonferroni_threshold"] for t in doc["tests"]] == [False, True, True, False, True]
    assert doc["parity"]["verdict"] == "NO_CONTROLS" and "parity: no controls" in (tmp_path / "tilted.log").read_text()
    # Beside SGLang's own speculation (a control judged against the same reference): a candidate that deviates
    # less than the control at the statistics it rejects is within the controls' deviation, one that deviates
    # more is beyond it; the JSON keeps both servers' statistics per context and statistic.
    monkeypatch.setenv("FAKE_SAMPLE_LIFTS", "PILLAR=1.0,NGRAM=2.0")
    code, doc = run("within", "--controls", "ngram")
    parity = doc["parity"]
    assert code == 1 and doc["verdict"] == "FAIL" and parity["verdict"] == "WITHIN" and parity["controls"] == ["ngram"]
    token2 = next(r for r in parity["rows"] if r["statistic"] == "token 2")
    assert token2["rejects"] and token2["controls"]["ngram"]["p_value"] < doc["bonferroni_threshold"]
    assert token2["candidate"]["total_variation"] < token2["controls"]["ngram"]["total_variation"]
    assert [r["statistic"] for r in parity["rows"]] == ["token 1", "token 2", "token 3", "length", "repeats"]
    assert "verdict FAIL; parity: pillar WITHIN the controls' deviation at every statistic it rejects: ctx 0 token 2" \
        in (tmp_path / "within.log").read_text()
    monkeypatch.setenv("FAKE_SAMPLE_LIFTS", "PILLAR=2.0,NGRAM=1.0")
    code, doc = run("beyond", "--controls", "ngram")
    assert code == 1 and doc["parity"]["verdict"] == "BEYOND"
    assert "parity: pillar BEYOND the controls' deviation at ctx 0 token 2" in (tmp_path / "beyond.log").read_text()
    monkeypatch.delenv("FAKE_SAMPLE_LIFTS")
    monkeypatch.setenv("FAKE_SAMPLE_BIAS_AT", "0")  # token 1: the servers' numerics differ
    code, doc = run("numerics")
    assert code == 1 and doc["verdict"] == "NUMERICS"
    monkeypatch.delenv("FAKE_SAMPLE_BIAS_AT")
    monkeypatch.setenv("FAKE_NO_TOP_LOGPROBS", "1")  # a reply without them: the whole continuation, logged
    code, doc = run("no_logprobs", "--samples", "200")
    assert doc["contexts"][0]["greedy_lead_nats"] is None and doc["contexts"][0]["tokens"] == len(doc["contexts"][0]["ids"])
    assert "no top-2 logprobs in the greedy reply" in (tmp_path / "no_logprobs.log").read_text()
    monkeypatch.setenv("FAKE_MODE", "exit_early")  # the reference fails to start: the candidate is not launched
    code, doc = run("no_start")
    assert code == 1 and doc["servers"]["stock"]["status"] == "failed" and doc["servers"]["pillar"]["status"] == "not started"


def test_exactness_sees_penalties_and_min_new_tokens(fake_sglang: Path, tiny_tokenizer_dir: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    """A penalized setting with min_new_tokens on short questions: lengths and repeat counts are tested, the
    power checks drop the penalties on the reference, and a candidate that ignores them fails."""
    argv = ["--model", str(tiny_tokenizer_dir), "--prompts", "short", "--contexts", "2", "--samples", "3000",
            "--new-tokens", "5", "--stop-at-eos", "--frequency-penalty", "0.5", "--presence-penalty", "0.3",
            "--repetition-penalty", "1.1", "--min-new-tokens", "2"]  # fmt: skip
    code = exactness.main([*argv, "--out", str(tmp_path / "pen.json")])
    doc = json.loads((tmp_path / "pen.json").read_text())
    assert code == 0 and doc["verdict"] == "PASS", doc["tests"]
    assert [c["source"] for c in doc["contexts"]] == ["short:0", "short:1"] and len(doc["tests"]) == 2 * 7
    assert list(doc["power"]) == ["hot: token 2", "plain: repeats", "plain: length"]
    assert all(c["p_value"] < doc["bonferroni_threshold"] for c in doc["power"].values())
    lengths = {k for k, _ in doc["counts"]["stock | main | context 0"]["lengths"]}
    assert min(lengths) == 3 and max(lengths) == 5  # no stop token before min_new_tokens, and some stop early
    assert doc["power"]["plain: length"]["params"]["min_new_tokens"] == 0
    monkeypatch.setenv("FAKE_PENALTY_BUG", "1")
    code = exactness.main([*argv, "--out", str(tmp_path / "bug.json")])
    doc = json.loads((tmp_path / "bug.json").read_text())
    rejects = {t["statistic"] for t in doc["tests"] if t["p_value"] < doc["bonferroni_threshold"]}
    assert code == 1 and doc["verdict"] == "FAIL" and {"length", "repeats"} <= rejects and "token 1" not in rejects
    for bad in (["--min-new-tokens", "2"], ["--reference", "pillar", "--candidate", "stock"], ["--top-k", "0"],
                ["--top-p", "0"], ["--repetition-penalty", "0"], ["--min-new-tokens", "9", "--stop-at-eos"]):  # fmt: skip
        with pytest.raises(SystemExit):
            exactness.main(["--model", "m", "--prompts", "short", "--out", str(tmp_path / "x.json"), *bad])


def test_lossless_end_to_end(
    fake_sglang: Path, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    common = ["--model", str(tiny_tokenizer_dir), "--data-dir", str(data_dir), "--num-prompts", "4",
              "--max-new-tokens", "80", "--server-log-dir", str(tmp_path / "logs")]  # fmt: skip

    def run(name: str, *extra: str) -> tuple[int, dict]:
        out = tmp_path / f"{name}.json"
        code = lossless.main([*common, "--out", str(out), *extra])
        return code, json.loads(out.read_text())

    code, doc = run("same", "--accept-temps", "0.6", "--accept-max-new-tokens", "30", "--candidate-repeats", "1")
    assert code == 0 and doc["verdict"] == "PASS" and doc["identity"]["identical"] == 4
    assert doc["stock_repeat"]["identical"] == 4 and doc["identity_repeats"][0]["identical"] == 4
    assert [(a["temperature"], a["max_new_tokens"]) for a in doc["acceptance"]] == [(0.0, 80), (0.0, 80), (0.6, 30)]
    # The candidate flips token 10 of half the requests: a pass where stock's own top-2 gap there is a
    # near tie, a failure where it is wide.
    monkeypatch.setenv("FAKE_DIVERGE_AT", "10")
    monkeypatch.setenv("FAKE_MARGIN", "0.1")
    code, doc = run("tie", "--no-stock-repeat")
    flipped = [i for i, r in enumerate(doc["identity"]["requests"]) if not r["identical"]]
    assert code == 0 and doc["verdict"] == "PASS" and flipped and doc["identity"]["early_divergences"] == flipped
    assert doc["identity"]["divergences_near_tie"] == len(flipped) and doc["stock_repeat"] is None
    monkeypatch.setenv("FAKE_MARGIN", "2.0")
    code, doc = run("wide", "--no-stock-repeat")
    assert code == 1 and doc["verdict"] == "FAIL" and doc["identity"]["unexplained_early_divergences"] == flipped
    assert "LOSSLESS VERDICT: FAIL" in (tmp_path / "wide.log").read_text()
    # --rejudge applies the current rule to stored margins: at a near tie the same file passes.
    wide = tmp_path / "wide.json"
    for r in doc["identity"]["requests"]:
        r["reference_margin"] = 0.1 if r.get("reference_margin") else r.get("reference_margin")
    wide.write_text(json.dumps(doc))
    assert lossless.main(["--rejudge", str(wide)]) == 0
    assert json.loads(wide.read_text())["rejudged"]["previous_verdict"] == "FAIL"
    monkeypatch.setenv("FAKE_MODE", "exit_early")
    code, doc = run("dead", "--temperature", "0.7")
    assert code == 1 and doc["verdict"] == "INCOMPLETE" and "CUDA out of memory" in doc["servers"]["pillar"]["error"]


def test_lossless_with_radix_cache_chunked_prefill_and_a_shared_prefix(
    fake_sglang: Path, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path
) -> None:
    """Every prompt starts with the same prefix ids, one more exceeds the chunk past it, the servers run with
    the cache on and the chunk set, and the JSON records the setup, the cache hits and PILLAR's accept length."""
    out = tmp_path / "radix.json"
    argv = ["--model", str(tiny_tokenizer_dir), "--data-dir", str(data_dir), "--num-prompts", "4", "--max-new-tokens", "30",
            "--server-log-dir", str(tmp_path / "logs"), "--out", str(out), "--radix-cache", "--chunked-prefill-size", "16",
            "--shared-prefix-tokens", "24", "--long-prompt-tokens", "60", "--attention-backend", "flashinfer"]  # fmt: skip
    assert lossless.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "PASS" and doc["identity"]["identical"] == 5
    s = doc["settings"]
    assert (s["radix_cache"], s["chunked_prefill_size"], s["shared_prefix_tokens"], s["long_prompt_tokens"]) == (True, 16, 24, 60)
    assert s["attention_backend"] == "flashinfer" and doc["prompt_tokens"]["max"] == 60
    assert "| pillar flashinfer radix chunk 16 prefix 24 long 60 | 8 | 4 | 30 | PASS |" in report.lossless_markdown([doc])
    assert doc["identity"]["requests"][-1]["source"] == "long:60" and doc["identity"]["requests"][-1]["prompt_len"] == 60
    for name, rec in doc["servers"].items():
        assert "--disable-radix-cache" not in rec["command"] and configs.flag_value(rec["command"], "--chunked-prefill-size") == "16"
        assert configs.flag_value(rec["command"], "--attention-backend") == "flashinfer"
    # The fake caches the longest prefix shared with an earlier prompt: at least the 24 ids of the prefix for
    # every request after the first, so the ids were identical.
    pillar = doc["acceptance"][0]
    assert pillar["cached_prompt_tokens"] >= 4 * 24 and pillar["accept_length_overall"] == pytest.approx(3.0)

    tok = workload.load_tokenizer(str(tiny_tokenizer_dir))
    problems = workload.load_problems(data_dir)
    prompts = workload.with_shared_prefix(tok, workload.build_prompts(tok, data_dir, 4), problems, 24, 60)
    prefix = workload.filler_ids(tok, problems, 24)
    assert len(prefix) == 24 and all(p.input_ids[:24] == prefix for p in prompts)
    assert prompts[-1].input_ids[-len(prompts[0].input_ids) + 24:] == prompts[0].input_ids[24:]  # ends with a question
    # Without the cache nothing is served from it; the same prompts and acceptance to compare with.
    off_argv = [str(tmp_path / "off.json") if a == str(out) else a for a in argv if a != "--radix-cache"]
    assert lossless.main(off_argv) == 0
    off = json.loads((tmp_path / "off.json").read_text())
    assert off["acceptance"][0]["cached_prompt_tokens"] == 0 and not off["settings"]["radix_cache"]
    assert "--disable-radix-cache" in off["servers"]["pillar"]["command"]
    # Bad sizes fail at argument parsing or before any server starts.
    for bad in (["--long-prompt-tokens", "40"], ["--shared-prefix-tokens", "-1"]):
        with pytest.raises(SystemExit):
            lossless.parse_args([*argv, *bad])
    assert lossless.main([*argv, "--max-new-tokens", "8200"]) == 2


def test_throughput_end_to_end(
    fake_sglang: Path, fake_bench: str, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / "out"
    args = ["--model", str(tiny_tokenizer_dir), "--data-dir", str(data_dir), "--out", str(out),
            "--configs", "stock,pillar", "--concurrency", "1,2", "--output-len", "16,24", "--run-id", "R-{output_len}",
            "--work-dir", str(tmp_path / "work")]  # fmt: skip
    assert throughput.main(args) == 0
    assert "| pillar | 2 | 4 | 200 | 1.00x |" in capsys.readouterr().out
    stock, pillar = (json.loads((out / f"throughput_R-16_{c}.json").read_text()) for c in ("stock", "pillar"))
    assert [r["status"] for r in stock["runs"]] == ["ok", "ok"] and stock["runs"][0]["num_prompts"] == 4
    assert pillar["runs"][1]["metrics"]["accept_length"] == 2.5 and pillar["meta"]["run_id"] == "R-16"
    # Each request's latencies (TTFT + its ITLs = end to end), the texts and ITL lists themselves not kept.
    assert stock["runs"][0]["per_request"] == {"ttft_s": [0.25] * 4, "e2e_s": [0.75, 1.0, 1.25, 1.5], "output_len": [16] * 4}
    assert stock["config"]["pillar_config"] is None and pillar["config"]["pillar_config"]["policy"] == "pillar"
    # PILLAR's /server_info numbers after each run; the server-level record keeps none of the per-step state.
    assert "pillar_state" not in stock["runs"][0] and pillar["runs"][0]["pillar_state"] == {"rounds_by_k": {"8": 3}}
    assert "internal_states" not in pillar["server"]["server_info"]
    # Every length ran on one server start per config: one JSON per length, each its own run id.
    d24 = json.loads((out / "throughput_R-24_pillar.json").read_text())
    assert d24["server"] == pillar["server"] and d24["runs"][0]["metrics"]["total_output_tokens"] == 4 * 24
    assert (tmp_path / "work" / "pillar.server.log").read_text().count("fake server starting") == 1
    for bad in (["--run-id", "R5"], ["--output-len", "16,16"], ["--run-id", "R-{x}"], ["--resume", str(tmp_path / "no")]):
        with pytest.raises(SystemExit):
            throughput.parse_args([*args, *bad])
    # The same run id again (another concurrency): refused before any server starts, the first files untouched.
    with pytest.raises(SystemExit):
        throughput.parse_args([*args, "--concurrency", "3"])
    assert "exists (an earlier command's results)" in capsys.readouterr().err

    # --resume keeps the ok runs of same-named files, with the provenance of the command that ran them.
    stock["runs"][1]["status"] = "failed"  # stock c=2 failed in the earlier command: it runs again
    (out / "throughput_R-16_stock.json").write_text(json.dumps(stock))
    out5 = tmp_path / "out5"
    args5 = [*args[:5], str(out5), *args[6:-2], "--concurrency", "1,2,3", "--resume", str(out), "--work-dir", str(tmp_path / "w5")]
    assert throughput.main(args5) == 0
    s5, p5 = (json.loads((out5 / f"throughput_R-16_{c}.json").read_text()) for c in ("stock", "pillar"))
    assert [("measured" in r) for r in s5["runs"]] == [True, False, False] and s5["runs"][1]["status"] == "ok"
    assert [("measured" in r) for r in p5["runs"]] == [True, True, False]
    assert p5["runs"][0]["measured"]["server"] == pillar["server"] and p5["runs"][0]["metrics"] == pillar["runs"][0]["metrics"]
    # Other server flags: nothing is resumed.
    assert throughput.main([*args5, "--extra-server-args=--mem-fraction-static 0.5", "--configs", "stock"]) == 0
    assert "nothing resumed (throughput_R-16_stock.json: config.flags differs)" in capsys.readouterr().out
    # Poisson arrivals are another workload: recorded, passed on, never resumed from closed-loop runs.
    assert throughput.main([*args5, "--request-rate", "2.5", "--configs", "stock"]) == 0
    assert "nothing resumed (throughput_R-16_stock.json: workload.request_rate differs)" in capsys.readouterr().out
    rated = json.loads((out5 / "throughput_R-16_stock.json").read_text())
    assert rated["workload"]["request_rate"] == 2.5 and s5["workload"]["request_rate"] == "inf"
    (row,) = [r for r in report.throughput_rows([rated]) if r["concurrency"] == 2]
    assert row["full_tok_s"] is None  # requests do not start as others end: no closed-loop schedule to rebuild
    assert report.describe_workload(row["workload"]).endswith(", Poisson arrivals at 2.5 requests/s")
    with pytest.raises(SystemExit):
        throughput.parse_args([*args, "--request-rate", "0"])

    # A server that never becomes healthy fails its runs; too little budget skips them, which is not a failure.
    monkeypatch.setenv("FAKE_MODE", "never_healthy")
    args2 = [*args[:5], str(tmp_path / "o2"), *args[6:-2], "--configs", "stock", "--startup-timeout", "2", "--work-dir", str(tmp_path / "w2")]
    assert throughput.main(args2) == 1
    assert json.loads((tmp_path / "o2" / "throughput_R-16_stock.json").read_text())["server"]["status"] == "failed"
    monkeypatch.delenv("FAKE_MODE")
    args3 = [*args[:5], str(tmp_path / "o3"), *args[6:-2], "--configs", "pillar:recent_window=16", "--time-budget", "30",
             "--work-dir", str(tmp_path / "w3")]  # fmt: skip
    assert throughput.main(args3) == 0
    assert "SKIPPED 4 runs for the time budget" in (tmp_path / "o3" / "throughput_R-16-24.log").read_text()
    assert (tmp_path / "o3" / "throughput_R-16_pillar.recent_window-16.json").is_file()  # a name that comes back


def test_offload_runs_split_over_commands_with_resume(
    fake_sglang: Path, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(offload, "IDLE_SETTLE_S", 0.0)  # the fake server has no idle check to wait for
    out = tmp_path / "res" / "offload_x.json"
    argv = ["--model", str(tiny_tokenizer_dir), "--data-dir", str(data_dir), "--out", str(out), "--num-prompts", "4",
            "--max-new-tokens", "20", "--host-gb", "1"]  # fmt: skip
    for bad in (["--runs", "stock,nope"], ["--resume", str(tmp_path / "no")]):
        with pytest.raises(SystemExit):
            offload.main([*argv, *bad])
    # First command: the reference and stock; the JSON and the reference's outputs file suffice to resume.
    assert offload.main([*argv, "--runs", "reference,stock"]) == 0
    first = json.loads(out.read_text())
    assert sorted(first["runs"]) == ["reference", "stock"] and first["runs"]["stock"]["outputs_identical"] is True
    assert offload.reference_path(out).is_file() and first["ratio_vs_stock"] is None
    # Second command, into another folder: nothing but the offload runs starts; identity against the kept reference.
    out2 = tmp_path / "res2" / out.name
    argv2 = [*argv[:5], str(out2), *argv[6:], "--runs", "stock_offload,pillar_offload,stock",
             "--resume", str(out.parent)]  # fmt: skip
    assert offload.main(argv2) == 0
    doc = json.loads(out2.read_text())
    assert sorted(doc["runs"]) == ["pillar_offload", "reference", "stock", "stock_offload"]
    assert doc["runs"]["stock"]["measured"]["run_id"] == first["meta"]["run_id"]
    pillar = doc["runs"]["pillar_offload"]
    assert "measured" not in pillar and pillar["outputs_identical"] is True
    assert pillar["leak_free_at_idle"] is True and pillar["idle"]["alive"] and doc["leak_free_at_idle"] is True
    assert doc["ratio_vs_stock"] is not None and offload.reference_path(out2).is_file()
    assert not (out2.parent / f"{out2.stem}_stock.server.log").exists()  # kept: not run again
    # Other workload settings: nothing is resumed.
    assert offload.main([*argv, "--max-new-tokens", "21", "--runs", "stock", "--resume", str(out.parent)]) == 0
    assert "nothing resumed (offload_x.json: settings.max_new_tokens differs)" in out.with_suffix(".log").read_text()


def test_sweep_runs_the_matrix_writes_the_report_and_resumes(
    fake_sglang: Path, fake_bench: str, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / "sweep"
    argv = ["--model", str(tiny_tokenizer_dir), "--data-dir", str(data_dir), "--out", str(out), "--tag", "t1",
            "--configs", "stock,pillar", "--output-len", "16,24", "--concurrency", "1,2", "--no-plots"]  # fmt: skip
    assert sweep.main(argv) == 0
    summary = (out / "SUMMARY.md").read_text()
    for n in (16, 24):
        assert f"### Throughput, run sweep-t1-{n}" in summary and f"{n} output tokens (ignore_eos), temperature 0.6" in summary
    assert "| pillar | 2 | 4 | 200 | 1.00x |" in summary
    doc = json.loads((out / "throughput_sweep-t1-24_pillar.json").read_text())
    assert doc["workload"]["top_p"] == 0.95 and doc["workload"]["num_prompts"] == {"1": 4, "2": 4}
    capsys.readouterr()
    assert sweep.main([*argv, "--resume"]) == 0  # everything measured: no server starts
    assert capsys.readouterr().out.count("every run resumed, no server start") == 2
    with pytest.raises(SystemExit):
        sweep.main([*argv, "--tag", "a/b"])


def test_sweep_on_two_gpus_runs_each_length_on_its_own_card(
    fake_sglang: Path, fake_bench: str, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path
) -> None:
    out = tmp_path / "sweep"
    argv = ["--model", str(tiny_tokenizer_dir), "--data-dir", str(data_dir), "--out", str(out), "--tag", "t2",
            "--configs", "stock,pillar", "--output-len", "16,24,32", "--concurrency", "2", "--no-plots", "--gpus", "0,1"]  # fmt: skip
    assert sweep.main(argv) == 0
    # Lengths round-robin over the GPUs: 16 and 32 on GPU 0, 24 on GPU 1; every config of a length on its GPU.
    for n, gpu in ((16, "0"), (24, "1"), (32, "0")):
        for config in ("stock", "pillar"):
            doc = json.loads((out / f"throughput_sweep-t2-{n}_{config}.json").read_text())
            assert doc["meta"]["cuda_visible_devices"] == gpu and doc["runs"][0]["status"] == "ok"
    # One throughput run (and log) per GPU, over its lengths; each child's output in its own log.
    assert (out / "throughput_sweep-t2-16-32.log").is_file() and (out / "throughput_sweep-t2-24.log").is_file()
    assert "done: 4 ok" in (out / "sweep_gpu0.log").read_text() and "done: 2 ok" in (out / "sweep_gpu1.log").read_text()
    assert "### Throughput, run sweep-t2-32" in (out / "SUMMARY.md").read_text()
    with pytest.raises(SystemExit):
        sweep.main([*argv[:-1], "0,0"])


def test_step_times_end_to_end_and_its_report(
    fake_sglang: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # B x (L + M2 + 16): 2 x (8 + 60 + 16) = 168 tokens fit a 170-token pool, 2 x (16 + 60 + 16) = 184 do not.
    monkeypatch.setenv("FAKE_POOL_TOKENS", "170")
    results = tmp_path / "results"
    out = results / "steps.json"
    names = "stock,pillar:verify_kernel=sglang,pillar-streaming:verify_kernel=sglang"
    argv = ["--shape", "qwen3-1.7b", "--out", str(out), "--contexts", "8,16", "--batches", "2", "--accept", "6.0",
            "--decode-tokens", "10,60", "--work-dir", str(tmp_path / "w"), "--env", "SPARSESPEC_MIN_BUDGET=64"]  # fmt: skip
    assert step_times.main([*argv, "--configs", names]) == 0
    doc = json.loads(out.read_text())
    servers = doc["servers"]
    stock, pillar = servers["stock"], servers["pillar:verify_kernel=sglang"]
    assert "--load-format" in stock["flags"] and json.loads((tmp_path / "w" / "qwen3-1.7b" / "config.json").read_text())
    assert pillar["pillar_config"]["min_budget"] == 64 and pillar["pillar_config"]["verify_kernel"] == "sglang"
    for rec in servers.values():
        assert [r.get("skipped") for r in rec["rows"]] == [None, "KV pool: 2 x (16 + 60 + 16) = 184 tokens > 170"]
    # The fake sleeps 2 ms per output token: the M1/M2 difference recovers a step of a few ms.
    assert 1.0 < stock["rows"][0]["step_ms"] < 10.0
    # ... and the M2 pass's log lines (two per request here, the pass's first one left out) give it exactly;
    # the ratios and projections use that one.
    assert (stock["rows"][0]["log_step_ms"], stock["rows"][0]["log_intervals"]) == (pytest.approx(2.0), 3)
    # draft 1.5 + verify 2.0 + accept 0.25 + select 0.5 per round; the streaming twin verifies 0.5 ms faster.
    assert pillar["rows"][0]["round_ms"] == pytest.approx(4.25)
    (cap,) = doc["capture_overhead"]
    assert cap["twin"] == "pillar-streaming:verify_kernel=sglang" and cap["capture_ms"] == pytest.approx(0.5)
    assert doc["projection"][0]["projected_speedup"] == pytest.approx(6.0 * 2.0 / 4.25)
    # The mixed bound hides what the fake's 2.0 ms verify costs above its stock step: nothing here.
    assert doc["projection"][0]["mixed_round_ms"] == pytest.approx(4.25)
    assert report.main(["--results-dir", str(results), "--no-plots"]) == 0
    md = (results / "SUMMARY.md").read_text()
    assert "shape qwen3-1.7b; M1/M2 = 10/60 output tokens; weights dummy (random): times only" in md
    assert "| pillar:verify_kernel=sglang | 8 | 2 | 0.500 | 0.500 | 40% |" in md  # (0.5 + 0.5) / (2.0 + 0.5)
    assert "- not measured: stock L=16 B=2: KV pool" in md
    # Too little budget for a server start: skipped and listed, never started.
    assert step_times.main([*argv[:3], str(tmp_path / "short.json"), *argv[4:], "--time-budget", "80"]) == 0
    assert {r["status"] for r in json.loads((tmp_path / "short.json").read_text())["servers"].values()} == {"skipped"}


def test_step_times_profiles_a_window_of_each_point(fake_sglang: Path, tmp_path: Path) -> None:
    """--profile-steps: a third pass per point, profiled through /start_profile (plain-text reply; a
    leftover profile is stopped first, which answers 400 when there is none); the trace's GPU time per step
    lands in the row, and the server's context covers the longer profiled pass."""
    out = tmp_path / "steps.json"
    argv = ["--shape", "qwen3-1.7b", "--out", str(out), "--contexts", "8", "--batches", "2", "--configs", "stock",
            "--decode-tokens", "10,60", "--profile-steps", "3", "--work-dir", str(tmp_path / "w")]  # fmt: skip
    assert step_times.main(argv) == 0
    (row,) = json.loads(out.read_text())["servers"]["stock"]["rows"]
    prof = row["profile"]
    assert prof["steps"] == 3 and [k["name"] for k in prof["kernels"]] == ["attn", "gemm"]
    # attn 900 us + gemm 100 us busy in a 1300 us window, over 3 steps
    assert prof["busy_ms_per_step"] == pytest.approx(1.0 / 3) and prof["idle_ms_per_step"] == pytest.approx(0.1)
    flags = json.loads(out.read_text())["servers"]["stock"]["flags"]
    assert int(flags[flags.index("--context-length") + 1]) >= 8 + 60 + 10 * 3
    assert "submits_per_step" not in prof  # the GPU alone was profiled
    # --profile-host: the CPU too; the host's submissions per step land in the row and in the report's table.
    assert step_times.main([*argv, "--profile-host"]) == 0
    doc = json.loads(out.read_text())
    prof = doc["servers"]["stock"]["rows"][0]["profile"]
    assert prof["submits_per_step"] == 1.0 and prof["graph_launches_per_step"] == 1.0 and doc["settings"]["profile_host"]
    doc["_file"] = out.name
    table = report.steps.step_times_markdown([doc]).split("Profiled steps")[1]
    assert "| stock | 8 | 2 | 0.43 | 0.33 | 0.10 | 1 | 1.0 | attn (0.30 ms) |" in table
    assert "by caller" not in table
    # --profile-stack: Python frames too; the report names the code calling the most host operators.
    assert step_times.main([*argv, "--profile-host", "--profile-stack"]) == 0
    doc = json.loads(out.read_text())
    callers = doc["servers"]["stock"]["rows"][0]["profile"]["host_callers"]
    assert callers[0]["caller"] == "worker.py(7): loop" and callers[0]["calls_per_step"] == 4.0
    doc["_file"] = out.name
    assert "- stock L=8 B=2: worker.py(7): loop -> aten::item x4" in report.steps.step_times_markdown([doc])
    with pytest.raises(SystemExit):  # stacks need the host profile
        step_times.main([*argv, "--profile-stack"])
    with pytest.raises(SystemExit):  # a host profile needs a profiled window
        step_times.main([a for a in argv if a not in ("--profile-steps", "3")] + ["--profile-host"])


# --------------------------------------------------------------------------- report


def _generated_pages(folder: Path) -> dict[str, str]:
    """The report's pages in ``folder`` (hand-written pages there, like history.md, do not start with its note)."""
    note = report.PAGE_NOTE.format(readme="results.md")
    return {f.name: f.read_text() for f in sorted(folder.glob("*.md")) if f.read_text().startswith(note)}


def test_report_regenerates_the_results_page_from_the_checked_in_results(tmp_path: Path) -> None:
    """docs/results.md's index and headline blocks, the table pages in docs/results/ and the README's headline
    block are what the report makes of benchmarks/results: no number by hand, no page left over or missing."""
    repo = Path(__file__).resolve().parents[1]
    page, front = tmp_path / "results.md", tmp_path / "README.md"
    page.write_text((repo / "docs" / "results.md").read_text())
    front.write_text((repo / "README.md").read_text())
    assert report.main(["--results-dir", str(repo / "benchmarks" / "results"), "--out", str(tmp_path / "S.md"),
                        "--no-plots", "--readme", str(page), "--front-page", str(front)]) == 0  # fmt: skip
    assert page.read_text() == (repo / "docs" / "results.md").read_text()
    assert front.read_text() == (repo / "README.md").read_text()
    # The README's one results table: the headline point, every stock backend of its run beside PILLAR.
    headline = front.read_text().split(report.HEADLINE_BEGIN)[1].split(report.HEADLINE_END)[0]
    assert "**SmolLM2-135M-Instruct on one NVIDIA H100 80GB HBM3, commit 3dc3540** (run `sampled-3dc3540-7000`" in headline
    assert "| `stock` | triton | 22,775 | 1.00x | 78.5 | 11.13 | - |" in headline
    assert "| `stock-flashinfer` | flashinfer | 21,957 | 0.96x | 81.4 | 11.58 | - |" in headline
    assert "| `pillar` | triton | 39,247 | **1.72x** | 38.0 | 5.10 | 6.11 |" in headline
    assert "`benchmarks/results/throughput/throughput_sampled-3dc3540-7000_{stock,stock-flashinfer,pillar}.json`" in headline
    assert "](docs/figures/throughput_vs_concurrency.png)" in headline and "runs `sweep-e058028-*`" in headline
    assert "](../docs/figures/throughput_vs_concurrency.png)" in page.read_text()  # the same figure from docs/
    assert headline.count("|") == 5 * 8 and len(headline) < 2_000  # one table: its head, rule and three rows
    made, checked_in = _generated_pages(tmp_path / "results"), _generated_pages(repo / "docs" / "results")
    assert set(made) == {p.file for p in report.results_pages([])} == set(checked_in)  # every kind has results
    assert made == checked_in
    index = page.read_text().split(report.README_BEGIN)[1].split(report.README_END)[0]
    assert sorted(re.findall(r"\]\(results/([\w.-]+)\)", index)) == sorted(made)
    assert len(index.strip().split("\n")) == len(made)  # one line per page
    assert "- [Throughput](results/throughput.md): single runs" in index
    step_runs = [f for f in (repo / "benchmarks" / "results" / "step_times").glob("*.json")
                 if json.loads(f.read_text()).get("kind") == "step_times"]
    assert re.search(r"\[Step times\]\(results/step-times\.md\):.*; (\d+) runs\.", index).group(1) == str(len(step_runs))
    assert "sampled-3dc3540-7000" in made["throughput.md"] and "sweep-85d9722" not in made["throughput.md"]
    assert "| pillar | 256 | 512 | 39247 | 1.72x | 1.72x | 2.06x |" in made["throughput.md"]  # the headline
    # Against the best stock backend of its point: stock FlashInfer alone in that run.
    assert "| pillar-flashinfer | 256 | 512 | 53359 | - | 1.10x |" in made["throughput.md"]
    assert "| stock-flashinfer | 256 | 512 | 21957 | 0.96x | 0.96x |" in made["throughput.md"]
    assert "temperature 0.6, top-p 0.95; stream interval 8" in made["throughput.md"]
    assert "## Run-to-run spread" in made["throughput-sweep.md"]
    # The offload table: ratios against the pressured stock of the same file, the verdict vs the reference.
    assert "| pillar_offload | ok | 18676 | 1.68x | 0 | 16 / 16 | 1.53 GB | 1.53 GB | PASS (8/64 identical) |" in made["offload.md"]
    assert "| reference | ok | 8969 | 0.81x | 0 | - | - | - | - |" in made["offload.md"]
    assert "\n## Losslessness (greedy token ids vs stock)\n" in made["acceptance-and-lossless.md"]
    for body in made.values():  # one title, then sections one level below it
        heads = [line.split(" ")[0] for line in body.split("\n") if line.startswith("#")]
        assert heads.count("#") == 1 and heads[0] == "#" and heads[1] == "##", heads[:3]
    assert len(page.read_text().encode()) < 40_000  # the reading stays short; the tables are on the pages
    summary = (tmp_path / "S.md").read_text()
    # Ratios only against the stock rows of the same run: the budget run has no stock, so no ratio.
    assert "| pillar | 256 | 512 | 37380 | 1.65x | 1.65x | 1.97x |" in summary
    assert "| pillar:budget_ratio=0.1 | 1 | 4 | 549 | - | - |" in summary
    for section in ("### Kernel launch sweep", "### Draft policies in the CPU reference", "### Run-to-run spread"):
        assert section in summary
    # The pages hold every table of the summary but the runs bounded by streaming: no SUMMARY.md is checked in.
    on_pages = {h.lstrip("#") for body in made.values() for h in re.findall(r"^#+ .*$", body, re.M)}
    in_summary = {h.lstrip("#") for h in re.findall(r"^#{3,} .*$", summary, re.M)}
    assert in_summary - on_pages == {" Throughput, run h100-e2aee79-2k"}  # stream interval 1
    page.write_text("no markers\n")
    with pytest.raises(SystemExit, match="results:begin"):
        report.main(["--results-dir", str(repo / "benchmarks" / "results"), "--out", str(tmp_path / "S.md"),
                     "--no-plots", "--readme", str(page)])  # fmt: skip
    front.write_text("no markers\n")
    with pytest.raises(SystemExit, match="headline:begin"):
        report.main(["--results-dir", str(repo / "benchmarks" / "results"), "--out", str(tmp_path / "S.md"),
                     "--no-plots", "--front-page", str(front)])  # fmt: skip


def test_report_writes_one_page_per_kind_and_keeps_the_hand_written_text(tmp_path: Path) -> None:
    """--readme writes the pages of the kinds present into <readme stem>/, the index between the markers only,
    removes a page it wrote whose kind is gone, never touches hand-written pages, and a rerun changes nothing."""
    src = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    results = tmp_path / "results_in"
    results.mkdir()
    for name in ("throughput/throughput_sampled-8f4fce1-7000_stock.json",
                 "throughput/throughput_sampled-8f4fce1-7000_pillar.json", "lossless/lossless_k8_split.json",
                 "step_times/steps_smollm2_h100_sampled_8f4fce1.json"):
        shutil.copy(src / name, results / Path(name).name)
    pages = tmp_path / "docs" / "results"
    pages.mkdir(parents=True)
    head = "# Results\n\nHand-written reading, [history](results/history.md).\n\n"
    middle = "\n\nThe tables:\n\n"
    tail = "\n\n## A reading\n\nMore hand-written text.\n"
    readme = tmp_path / "docs" / "results.md"
    readme.write_text(head + report.HEADLINE_BEGIN + "\nold headline\n" + report.HEADLINE_END + middle
                      + report.README_BEGIN + "\nold tables\n" + report.README_END + tail)  # fmt: skip
    note = report.PAGE_NOTE.format(readme="results.md")
    (pages / "history.md").write_text("# History\n\nkept as is\n")
    (pages / "kernels.md").write_text(note + "\n\nan old generated page\n")
    (pages / "throughput-sweep.md").write_text("a hand-written page of a generated name is kept\n")
    argv = ["--results-dir", str(results), "--out", str(tmp_path / "S.md"), "--no-plots", "--readme", str(readme)]
    assert report.main(argv) == 0
    text = readme.read_text()
    assert text.startswith(head + report.HEADLINE_BEGIN + "\n") and text.endswith(report.README_END + tail)
    assert report.HEADLINE_END + middle + report.README_BEGIN in text
    assert "old tables" not in text and "old headline" not in text
    # These files hold no run with every stock backend beside PILLAR: the headline says so, the figure is missing.
    assert text.split(report.HEADLINE_BEGIN)[1].split(report.HEADLINE_END)[0] == (
        "\n\nNo run holds a sampled two-wave point with `pillar` and every stock backend (stock, stock-flashinfer) "
        "yet.\n\n")  # fmt: skip
    written = {"throughput.md", "acceptance-and-lossless.md", "step-times.md"}
    assert {f.name for f in pages.iterdir()} == written | {"history.md", "throughput-sweep.md"}  # kernels.md removed
    assert (pages / "history.md").read_text() == "# History\n\nkept as is\n"
    index = text.split(report.README_BEGIN)[1].split(report.README_END)[0].strip().split("\n")
    links = [re.fullmatch(r"- \[[^]]+\]\(results/([\w.-]+)\): .+; .+\.", line) for line in index]
    assert all(links) and [m.group(1) for m in links] == ["throughput.md", "acceptance-and-lossless.md", "step-times.md"]
    assert index[0].endswith("; 1 run.") and index[1].endswith(
        "; 1 lossless run, 0 acceptance runs, 0 exactness runs, 0 policy_sim runs.")
    for name in written:
        first, rest = (pages / name).read_text().split("\n", 1)
        assert first == note and "`python -m benchmarks.report --readme docs/results.md`" in first
        assert rest.startswith("\n# ")
    assert "| pillar | 256 | 512 | 37757 | 1.66x | 1.66x | 2.10x |" in (pages / "throughput.md").read_text()
    assert "## Step times, run 20261125-072548" in (pages / "step-times.md").read_text()
    # A rerun is idempotent, and a generated page edited by hand is written over.
    before = {f.name: f.read_text() for f in [readme, *pages.iterdir()]}
    (pages / "step-times.md").write_text("edited by hand\n")
    assert report.main(argv) == 0
    assert {f.name: f.read_text() for f in [readme, *pages.iterdir()]} == before
    # Hand-written text changed outside the markers survives a rerun as is.
    readme.write_text(text.replace("More hand-written text.", "Changed by hand."))
    assert report.main(argv) == 0
    assert readme.read_text() == text.replace("More hand-written text.", "Changed by hand.")


def test_flashinfer_per_head_pages_attend_exactly_the_sparse_kernels_positions() -> None:
    """kernels_bench times FlashInfer's page-table decode on PILLAR's per-head selections by making each
    (request, KV head) a row of one-head pages; attention over those pages (plain torch, as FlashInfer
    computes it) must equal the sparse kernel's reference, or the timing compares different work."""
    import torch
    from sglang_sparsespec.kernels.sparse_decode import sparse_decode_ref

    from tools.kernels_baselines import per_head_pages
    from tools.kernels_setup import TAIL

    gen = torch.Generator().manual_seed(0)
    bs, h_kv, group, d, seq_len, cnt = 3, 3, 3, 16, 80, 7
    slots = bs * seq_len + 5
    k = torch.randn(slots, h_kv, d, generator=gen).to(torch.bfloat16)
    v = torch.randn(slots, h_kv, d, generator=gen).to(torch.bfloat16)
    req_to_token = torch.randperm(slots - 1, generator=gen)[: bs * seq_len].view(bs, seq_len).to(torch.int32) + 1
    tail_start = torch.full((bs,), seq_len - TAIL)
    sel = torch.stack([torch.randperm(seq_len - TAIL, generator=gen)[:cnt].sort().values for _ in range(bs * h_kv)])
    sel = sel.view(bs, h_kv, cnt).to(torch.int32)
    q = torch.randn(bs, h_kv * group, d, generator=gen)

    pages = per_head_pages(req_to_token, sel, cnt, tail_start).view(bs * h_kv, cnt + TAIL)
    k_pages, v_pages = k.view(-1, d).float(), v.view(-1, d).float()  # [slots x H_kv] one-head pages
    q_rows = q.to(torch.bfloat16).float().view(bs * h_kv, group, d)
    scores = torch.einsum("rgd,rnd->rgn", q_rows, k_pages[pages]) * d**-0.5
    out = torch.einsum("rgn,rnd->rgd", scores.softmax(-1), v_pages[pages]).view(bs, h_kv * group, d)

    ref = sparse_decode_ref(q, k, v, torch.zeros(bs, h_kv * group, d), req_to_token, torch.arange(bs), sel,
                            torch.full((bs,), cnt), tail_start, torch.full((bs,), seq_len), d**-0.5)  # fmt: skip
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert len(set(pages[0].tolist())) == cnt + TAIL  # distinct pages: no position read twice


def test_stock_decode_steps_from_its_log_meet_pillars_plain_rounds_in_the_report() -> None:
    """benchmarks.throughput reads stock's step time off SGLang's own "Decode batch" lines into the cells of
    PILLAR's adaptive policy; the report sets PILLAR's plain rounds against them (same run, concurrency,
    cell). Intervals after a prefill or at a run's start hold more than decode steps and are left out."""
    from benchmarks.serving_run import decode_step_cells

    def decode(running: int, tokens: int, tok_s: float) -> str:
        return (f"[2026-11-25 13:39:29] Decode batch, #running-req: {running}, #token: {tokens}, token usage: 0.03, "
                f"cuda graph: True, gen throughput (token/s): {tok_s}, #queue-req: 0")  # fmt: skip

    log = "\n".join([
        decode(64, 64 * 4000, 100.0),  # the first interval: idle time in it
        decode(64, 64 * 4000, 16000.0), decode(64, 64 * 4100, 20000.0), decode(64, 64 * 4200, 12800.0),
        "[2026-11-25 13:39:30] Prefill batch, #new-seq: 1, #new-token: 500",
        decode(64, 64 * 4000, 1000.0),  # had a prefill in it
        decode(40, 40 * 6000, 16000.0),  # another cell: batch bucket 64, context 2^12.5
    ])  # fmt: skip
    cells = decode_step_cells(log)
    assert cells == {"64x4096": {"ms": 4.0, "lines": 3}, "64x5793": {"ms": 2.5, "lines": 1}}

    def doc(config: str, run: dict) -> dict:
        return {"kind": "throughput", "meta": {"run_id": "r1"}, "config": {"name": config},
                "workload": {"output_len": 2048}, "runs": [{"concurrency": 64, **run}]}  # fmt: skip

    pillar_cells = {"64x4096": {"plain": 4.6, "gap": 0.2}, "64x5793": {"plain": 3.0}}
    docs = [doc("stock", {"decode_step_ms": cells}), doc("pillar", {"pillar_state": {"cells": pillar_cells}})]
    text = report.plain_vs_stock_markdown(docs)
    assert "| r1 | pillar | 64 | 64x4096 | 3 | 4.00 | 4.80 | 1.20x |" in text
    assert "64x5793" not in text  # one clean interval: too few to read
    assert report.plain_vs_stock_markdown([docs[1]]) == ""  # no stock in the run: nothing to compare


def test_a_server_start_guess_comes_from_the_same_config_family():
    """A slow stock start (FlashInfer's JIT on a fresh node) must not make the PILLAR start after it
    look too slow to fit the budget (flashinfer-ce113f5-2048 skipped one that took 94 s)."""
    clock = run_clock.RunClock()
    assert clock.startup_guess("pillar-flashinfer") == run_clock.START_GUESS_FLOOR_S
    clock.record_start("stock-flashinfer", 245.0)
    assert clock.startup_guess("stock") == 245.0
    assert clock.startup_guess("pillar-flashinfer") == run_clock.START_GUESS_FLOOR_S
    clock.record_start("pillar:adaptive_steps=off", 300.0)
    clock.record_start("pillar-coarse", 120.0)
    assert clock.startup_guess("pillar-flashinfer") == 300.0  # the family's slowest
    clock.record_start("stock", 30.0)
    assert clock.startup_guess("stock-flashinfer") == 245.0


def test_tune_table_keeps_each_kernels_fastest_launch_static_and_planned():
    from benchmarks.report import tune_table

    base = dict(shape="smollm2-135m", bs=32, seq_len=2048)
    rows = [
        dict(base, kernel="sglang_decode", us=20.0),
        dict(base, kernel="dense", splits=3, block_n=32, warps=4, stages=3, us=40.0, GBps=1200.0),
        dict(base, kernel="dense", splits=8, block_n=32, warps=4, stages=3, us=25.0, GBps=1900.0),
        dict(base, kernel="dense_planned", chunk=256, programs_per_request=8, us=22.0, GBps=2200.0),
        dict(base, kernel="dense_planned", chunk=512, programs_per_request=4, us=30.0, GBps=1600.0),
    ]
    table = tune_table(rows)
    assert "| dense | smollm2-135m | 32 | 2048 | splits 8, tile 32, 4 warps, 3 stages | 25.0 | 20.0 | 1900 |" in table
    assert "| dense_planned | smollm2-135m | 32 | 2048 | chunk 256, 8 programs / request | 22.0 | 20.0 | 2200 |" in table
    assert "splits 3" not in table and "chunk 512" not in table


def test_wave_pace_lines_show_each_waves_batch_context():
    from benchmarks.report.serving import wave_pace_lines

    rows = [dict(config="pillar", concurrency=2, wave_ms=[(5.25, 2911.4), (5.75, 3422.0)]), dict(config="x", wave_ms=None)]
    assert wave_pace_lines(rows).endswith("\n\n- pillar c=2: 5.25 (2,911) / 5.75 (3,422)\n")
    assert wave_pace_lines(rows[1:]) == ""


def test_mixed_prefix_tables_pair_uniform_and_mixed_runs():
    from benchmarks.report.steps import mixed_lengths_table, mixed_tune_table

    base = dict(shape="smollm2-135m", bs=256, seq_len=2048)
    rows = [dict(base, kernel="sglang_decode", us=180.0)] + [
        dict(base, kernel=f"{k}_{kind}", splits=1, cap=cap, us=us)
        for cap, k, kind, us in ((2, "verify", "uniform", 190.0), (2, "verify", "mixed", 209.0),
                                 (2, "capture", "uniform", 100.0), (2, "capture", "mixed", 110.0),
                                 (1, "verify", "uniform", 188.0))]  # fmt: skip
    table = mixed_tune_table(rows)
    assert "| smollm2-135m | 256 | 2048 | 1 | 2 | 190.0 | 209.0 | 100.0 | 110.0 | 1.10x |" in table
    assert "| smollm2-135m | 256 | 2048 | 1 | 1 | 188.0 | - | - | - | - |" in table  # a grid measured on one kind only
    assert mixed_tune_table([dict(base, kernel="verify", splits=1, block_n=128, warps=4, us=1.0)]) == ""
    doc = dict(_file="k.json", device="GPU", git_commit="abc", mixed_lengths=[dict(
        base, mixed_min=256, mixed_max=3840, verify_uniform_us=200.0, verify_mixed_us=220.0, capture_uniform_us=100.0,
        capture_mixed_us=101.0, plain_verify_uniform_us=50.0, plain_verify_mixed_us=50.0,
        draft_static_uniform_us=30.0, draft_static_mixed_us=45.0,  # a run without the planned grid's columns
        sglang_decode_uniform_us="not run", sglang_decode_mixed_us="not run")])  # fmt: skip
    line = ("| smollm2-135m | 256 | 2048 | 256-3840 | 200.0 / 220.0 | 100.0 / 101.0 | 50.0 / 50.0 | 30.0 / 45.0 | - / - | "
            "- / - | 1.10x | 1.01x | 1.00x | 1.50x | - | - |")
    assert line in mixed_lengths_table(doc)


def test_policy_host_times_the_workers_own_round_choice(tmp_path):
    """tools.policy_host drives the worker's RoundPlanner on stand-ins: it must follow the worker."""
    from tools import policy_host
    from sglang_sparsespec.patches.round_plan import PATH_LOG_EVERY

    out = tmp_path / "host.json"
    rounds = PATH_LOG_EVERY  # the last round logs the path counts and saves the costs
    assert policy_host.main(["--out", str(out), "--batches", "1", "32", "--rounds", str(rounds)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["bs"] for r in rows] == [1, 32]
    assert all(sum(r["rounds_by_k"].values()) == rounds and r["choose_us"] > 0 for r in rows)


def test_the_mixed_round_bound_hides_the_verify_pass_above_a_decode_forward() -> None:
    # Qwen3-8B at 4K x 64 (steps_qwen3-8b_h100.json): verify 31.88 ms against stock's 24.61 ms step, so at most
    # 7.27 ms of the 96.27 ms round is the verify's own pass that mixed forwards could hide.
    row = {"context": 4096, "batch": 64, "verify_ms": 31.88, "round_ms": 96.27}
    assert step_analysis.mixed_round_bound(row, 24.61) == pytest.approx(89.0)
    # A verify faster than stock's step (GPU events against wall time) hides nothing, never a negative.
    assert step_analysis.mixed_round_bound({**row, "verify_ms": 20.0}, 24.61) == 96.27
    servers = {"stock": {"rows": [{"context": 4096, "batch": 64, "step_ms": 24.61}]}, "pillar": {"rows": [row]}}
    (p,) = step_analysis.projections(servers, 6.0)
    assert p["mixed_round_ms"] == pytest.approx(89.0)
    assert p["projected_speedup_mixed"] == pytest.approx(6.0 * 24.61 / 89.0)


def test_mixed_lengths_keep_the_uniform_batch_mean_and_pool() -> None:
    """kernels_bench compares a mixed batch with a uniform one of the same mean on one KV pool of bs x L
    slots: the mixed lengths must spread widely, average L and fit that pool."""
    from tools.kernels_setup import mixed_lengths

    for bs, seq_len in ((256, 7000), (64, 4096), (1, 4096)):
        lens = mixed_lengths(bs, seq_len)
        assert len(lens) == bs and sum(lens) <= bs * seq_len
        assert abs(sum(lens) / bs - seq_len) <= seq_len / 8
        if bs > 1:
            assert min(lens) == seq_len // 8 and max(lens) == 2 * seq_len - seq_len // 8
            assert lens != sorted(lens)  # requests that started one after another, not by length


def test_mixed_gemm_groups_and_projection(tmp_path: Path) -> None:
    from tools.mixed_gemm import RowWork, groups, project

    tiny = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 4, "vocab_size": 50}  # fmt: skip
    work = RowWork(tiny, max_rows=27, device="cpu")
    assert [tuple(w.shape) for w in work.layers[0]] == [(32, 16), (16, 16), (64, 16), (16, 32)]
    assert work.forward(27).shape == (27, 50) and work.forward(3).shape == (3, 50)

    assert groups(16, 8) == [2] * 7 + [1] * 2 and groups(64, 8) == [8] * 1 + [7] * 8 and sum(groups(256, 8)) == 256
    steps = {"servers": {"stock": {"rows": [{"context": 4096, "batch": 64, "step_ms": 24.0}]},
                         "pillar": {"rows": [{"context": 4096, "batch": 64, "round_ms": 96.0, "verify_ms": 32.0},
                                             {"context": 4096, "batch": 16, "round_ms": 70.0, "verify_ms": 13.0}]}}}  # fmt: skip
    path = tmp_path / "steps.json"
    path.write_text(json.dumps(steps))
    (row,) = project([{"batch": 64, "saving_ms": 6.0}], path)  # batch 16 has no saving measured: left out
    assert (row["mixed_round_ms"], row["verify_minus_stock_step_ms"]) == (90.0, 8.0)
    assert row["change"] == pytest.approx(-1 / 16)


def test_knobs_the_caller_exported_are_recorded_with_the_server(monkeypatch) -> None:
    """A SPARSESPEC_* variable of the benchmark's own environment reaches the server (it inherits it),
    so the recorded environment and resolved knobs carry it; ``--env`` and the config still win."""
    from benchmarks.configs import resolve_config

    monkeypatch.setenv("SPARSESPEC_BATCH_PHASES", "mixed")
    monkeypatch.setenv("SPARSESPEC_COST_CACHE", "auto")
    pillar = resolve_config("pillar")
    assert pillar.pillar_config({})["batch_phases"] == "mixed"
    assert pillar.environment({})["SPARSESPEC_COST_CACHE"] == "off"  # measured from a cold start
    assert resolve_config("pillar:batch_phases=split").pillar_config({})["batch_phases"] == "split"
    assert pillar.pillar_config({"SPARSESPEC_BATCH_PHASES": "split"})["batch_phases"] == "split"
