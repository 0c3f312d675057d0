"""benchmarks/checks/reliability.py against a fake loopback server (an http.server script).

The fake answers each hand-list bad input with the status the plugin gives it (it reads the list
from benchmarks/checks/bad_inputs.py), any other malformed body with 400, and serves well-formed native
/generate requests (streamed or not) at a few ms per token, so that client timeouts and closed
streams abort real in-flight requests. FAKE_DIE_ON=<name> makes it exit on that bad input,
FAKE_LEAK=<n> reports n KV tokens still in use when idle, FAKE_PROBE_MARGIN=<nats> changes the
second greedy probe's 4th token and gives the first probe that top-2 margin there. Streamed requests
with a rid (the live requests of bad_inputs' probes) run until /abort_request names their rid, or any
prefix of it with FAKE_PREFIX_ABORT=1 (stock SGLang's rule).
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import server
from benchmarks.checks import load_phase, reliability
from benchmarks.checks.bad_inputs import hand_list

VOCAB, CONTEXT = 300, 2048
FAKE = textwrap.dedent(
    r"""
    import json, os, sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from benchmarks.checks.bad_inputs import hand_list

    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])
    print("fake server", argv, flush=True)
    HAND = {(p.path, json.dumps(p.body, sort_keys=True)): p for p in hand_list(300, 2048)}
    LOAD_KEYS = {"max_new_tokens", "temperature", "top_p", "ignore_eos"}
    lock, active, probes, live = threading.Lock(), [0], [0], {}

    def tokens(ids, n):
        return [(sum(ids) + 7 * i) % 300 for i in range(n)]

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def log_message(self, *a):
            pass

        def reply(self, code, obj):
            data = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path == "/health_generate":
                return self.reply(200, {})
            if self.path == "/server_info":
                return self.reply(200, {"context_length": 2048})
            if self.path.startswith("/v1/loads"):
                load = {"num_running_reqs": active[0], "num_waiting_reqs": 0,
                        "num_used_tokens": 0 if active[0] else int(os.environ.get("FAKE_LEAK", "0"))}
                return self.reply(200, {"loads": [load]})
            if self.path == "/metrics":
                text = (
                    'sglang:pillar_num_drafts_total{tp_rank="0"} 7.0\n'
                    'sglang:pillar_draft_seconds_bucket{le="0.1"} 1.0\n'
                )
                self.send_response(200)
                self.end_headers()
                return self.wfile.write(text.encode())
            if self.path == "/openapi.json":
                props = {"text": {"type": "string"}, "stream": {"type": "boolean"},
                         "sampling_params": {"anyOf": [{"type": "object"}, {"type": "array"}]}}
                ref = {"$ref": "#/components/schemas/Req"}
                paths = {p: {"post": {"requestBody": {"content": {"application/json": {"schema": ref}}}}}
                         for p in ("/generate", "/v1/completions", "/v1/chat/completions")}
                return self.reply(200, {"paths": paths, "components": {"schemas": {"Req": {"properties": props}}}})
            self.reply(404, {})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/abort_request":
                with lock:
                    for rid in live:
                        if rid == body["rid"] or (os.environ.get("FAKE_PREFIX_ABORT") and rid.startswith(body["rid"])):
                            live[rid] = True
                return self.reply(200, {})
            if self.path == "/generate" and isinstance(body, dict) and "rid" in body and body.get("stream"):
                return self.run_live(body["rid"], body["sampling_params"]["max_new_tokens"])
            probe = HAND.get((self.path, json.dumps(body, sort_keys=True)))
            if probe is not None:
                if probe.name == os.environ.get("FAKE_DIE_ON"):
                    os._exit(9)
                if probe.stream and probe.path == "/generate" and probe.expect == 400:
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(b'data: {"error": {"message": "bad", "code": 400}}\n\ndata: [DONE]\n\n')
                    return
                return self.reply(probe.expect, {"error": {"message": probe.name}})
            sp = body.get("sampling_params") if isinstance(body, dict) else None
            ids = body.get("input_ids") if isinstance(body, dict) else None
            if (self.path != "/generate" or not isinstance(sp, dict) or not set(sp) <= LOAD_KEYS
                    or not isinstance(ids, list) or not all(isinstance(t, int) for t in ids)):
                return self.reply(400, {"error": {"message": "malformed"}})
            with lock:
                active[0] += 1
            try:
                # Like a sampled SmolLM2 answer, a request that does not ignore EOS ends early.
                n = sp["max_new_tokens"] if sp.get("ignore_eos") else min(sp["max_new_tokens"], 16)
                self.generate(body, ids, n)
            except OSError:
                pass  # the client left: the request is aborted
            finally:
                with lock:
                    active[0] -= 1

        def run_live(self, rid, n):
            live[rid] = False
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(0, n, 8):
                time.sleep(0.005)
                if live[rid]:
                    break
                self.wfile.write(b'data: {"meta_info": {"finish_reason": null}}\n\n')
                self.wfile.flush()
            end = {"type": "abort" if live.pop(rid) else "length"}
            self.wfile.write(b"data: " + json.dumps({"meta_info": {"finish_reason": end}}).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")

        def generate(self, body, ids, n):
            out = tokens(ids, n)
            meta = {"completion_tokens": n, "finish_reason": {"type": "length", "length": n}}
            if body.get("return_logprob"):
                with lock:
                    probes[0] += 1
                    second = probes[0] == 2
                margin = os.environ.get("FAKE_PROBE_MARGIN")
                if margin and second:
                    out[3] = (out[3] + 1) % 300
                gap = [float(margin or 5.0) if i == 3 else 5.0 for i in range(n)]
                meta["output_top_logprobs"] = [[[0.0, t, None], [-g, (t + 1) % 300, None]] for t, g in zip(out, gap)]
            if not body.get("stream"):
                time.sleep(0.003 * n)
                return self.reply(200, {"text": "x", "output_ids": out, "meta_info": meta})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for i in range(0, n, 8):
                time.sleep(0.02)
                self.wfile.write(b"data: " + json.dumps({"output_ids": out[: i + 8]}).encode() + b"\n\n")
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

    ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
    """
)


@pytest.fixture()
def model_dir(tmp_path: Path) -> Path:
    """A word-level tokenizer with a chat template and a config.json, saved like a model folder."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "<|user|>", "<|assistant|>"] + [f"w{i}" for i in range(50)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    fast.chat_template = "{% for m in messages %}<|user|> {{ m['content'] }} {% endfor %}<|assistant|> "
    d = tmp_path / "model"
    fast.save_pretrained(d)
    (d / "config.json").write_text(json.dumps({"vocab_size": VOCAB, "max_position_embeddings": CONTEXT}))
    return d


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    (d / "aime24.jsonl").write_text(
        "".join(json.dumps({"problem": f"w{i} w{i + 1} w{i + 2}"}) + "\n" for i in range(9))
    )
    (d / "amc23.jsonl").write_text(json.dumps({"problem": "w9 w8 w7"}) + "\n")
    return d


@pytest.fixture()
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "fake_reliability_server.py"
    script.write_text(FAKE)
    repo = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", repo)
    monkeypatch.setattr(
        server,
        "launch_command",
        lambda model, flags, host, port: [sys.executable, str(script), "--host", host, "--port", str(port), *flags],
    )


def run(tmp_path: Path, model_dir: Path, data_dir: Path, *extra: str) -> dict:
    out = tmp_path / "reliability_test.json"
    argv = [
        "--model",
        str(model_dir),
        "--data-dir",
        str(data_dir),
        "--out",
        str(out),
        "--max-new-tokens",
        "1200",
        "--concurrency",
        "8",
        "--fuzz",
        "24",
        "--settle",
        "0.2",
        "--time-budget",
        "300",
        *extra,
    ]
    code = reliability.main(argv)
    doc = json.loads(out.read_text())
    assert (code == 0) == (doc["verdict"] == "PASS")
    return doc


def test_plan_load_mixes_lengths_settings_and_aborts():
    prompts = [[1, 2, 3], [4, 5]]
    plan = load_phase.plan_load(prompts, 400, 80, 3000, seed=1)
    assert plan == load_phase.plan_load(prompts, 400, 80, 3000, seed=1)
    dropped = [r for r in plan if r.abort_after is not None]
    assert len(dropped) == 80 and all(r.max_new_tokens >= 1000 for r in dropped)
    assert all(1 <= r.abort_after <= 4 for r in dropped if r.stream)
    assert all(0.2 <= r.abort_after <= 1.0 for r in dropped if not r.stream)
    assert all(r.max_new_tokens == 3000 and r.ignore_eos for r in dropped)
    assert not any(r.ignore_eos for r in plan if r.abort_after is None)
    kept = [r.max_new_tokens for r in plan if r.abort_after is None]
    assert min(kept) < 30 and max(kept) > 1500 and all(8 <= n <= 3000 for n in kept)
    assert 0.3 < sum(r.stream for r in plan) / len(plan) < 0.5
    assert {r.temperature for r in plan} == {0.0, 0.6, 1.0} and {r.top_p for r in plan} == {1.0, 0.95, 0.8}
    assert {len(r.input_ids) % 5 for r in plan} != {0}  # prompts of 1-8 concatenated prompts
    with pytest.raises(ValueError, match="aborts"):
        load_phase.plan_load(prompts, 4, 5, 100, seed=0)


def test_run_passes_and_records_every_field(tmp_path, model_dir, data_dir, fake):
    doc = run(tmp_path, model_dir, data_dir, "--requests", "48", "--aborts", "10")
    assert doc["kind"] == "reliability" and doc["verdict"] == "PASS", doc.get("error") or doc["bad_inputs_failed"]
    assert doc["requests"] == 48 and doc["aborted"] >= 10 and doc["load_errors"] == 0
    names = {p.name for p in hand_list(VOCAB, CONTEXT)}
    assert names <= set(doc["bad_inputs"]) and len(doc["bad_inputs"]) == len(names) + 24
    assert doc["bad_inputs"]["oov_token_id"] == 400 and doc["bad_inputs"]["stream_oov_token_id"] == 400
    assert doc["bad_inputs"]["n_two"] == 200 and doc["bad_inputs"]["chat_body_not_object"] == 400
    assert doc["server_alive_after"] is True and doc["leak_detected"] is False and doc["probe_consistent"] is True
    assert doc["idle"]["idle"] is True and doc["latencies"]["e2e_s_non_streamed"]["p50"] > 0
    assert doc["metrics"] == {'sglang:pillar_num_drafts_total{tp_rank="0"}': 7.0}
    assert "--enable-metrics" in doc["config"]["flags"] and "--disable-radix-cache" not in doc["config"]["flags"]
    assert doc["config"]["flags"][doc["config"]["flags"].index("--chunked-prefill-size") + 1] == "512"


def test_leak_and_probe_divergence_fail_the_run(tmp_path, model_dir, data_dir, fake, monkeypatch):
    monkeypatch.setenv("FAKE_LEAK", "5")
    monkeypatch.setenv("FAKE_PROBE_MARGIN", "2.0")  # not a near tie
    doc = run(tmp_path, model_dir, data_dir, "--requests", "6", "--aborts", "1")
    assert doc["leak_detected"] is True and doc["probe_consistent"] is False and doc["verdict"] == "FAIL"
    assert doc["probe"]["first_divergence"] == 3 and doc["probe"]["near_tie"] is False


def test_probe_divergence_at_a_near_tie_is_consistent(tmp_path, model_dir, data_dir, fake, monkeypatch):
    monkeypatch.setenv("FAKE_PROBE_MARGIN", "0.1")
    doc = run(tmp_path, model_dir, data_dir, "--requests", "6", "--aborts", "1")
    assert doc["probe"]["identical"] is False and doc["probe"]["near_tie"] is True
    assert doc["probe_consistent"] is True and doc["verdict"] == "PASS"


def test_a_bad_input_that_kills_the_server_is_named(tmp_path, model_dir, data_dir, fake, monkeypatch):
    monkeypatch.setenv("FAKE_DIE_ON", "top_k_int32_overflow")
    doc = run(tmp_path, model_dir, data_dir, "--requests", "6", "--aborts", "1")
    assert doc["killed_by"] == "top_k_int32_overflow" and doc["server_alive_after"] is False
    assert doc["verdict"] == "FAIL" and "server exited" in doc["error"]


def test_an_abort_that_reaches_another_clients_request_fails_the_run(tmp_path, model_dir, data_dir, fake, monkeypatch):
    """abort_prefix runs two requests, 7f3c9e... and 7f, and aborts 7f: a server that aborts by prefix
    (SGLang's scheduler) also ends the other client's request."""
    monkeypatch.setenv("FAKE_PREFIX_ABORT", "1")
    doc = run(tmp_path, model_dir, data_dir, "--requests", "8", "--aborts", "2")
    (failed,) = [f for f in doc["bad_inputs_failed"] if f["name"] == "abort_prefix"]
    assert failed["status"] == 200 and "'7f3c9e0d1a2b4c5d6e7f8091a2b3c4d5' ended with 'abort'" in failed["live"][0]
    assert doc["verdict"] == "FAIL"
