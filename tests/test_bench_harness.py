"""CPU tests of the benchmark harness: pure logic, plus the server lifecycle and both entry points
driven against a fake loopback "SGLang server" (a small http.server script) and a fake bench_serving.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

# benchmarks/ is a folder at the repository root, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import (  # noqa: E402
    acceptance,
    bench_driver,
    configs,
    lossless,
    passes,
    report,
    server,
    step_times,
    throughput,
    workload,
)
from benchmarks.client import GenOutput, generate_all, parse_generate_reply  # noqa: E402

FAKE_SERVER = textwrap.dedent(
    r'''
    import json, os, subprocess, sys, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    argv = sys.argv[1:]
    port = int(argv[argv.index("--port") + 1])
    spec = "--speculative-algorithm" in argv
    mode = os.environ.get("FAKE_MODE", "ok")
    print("fake server starting", argv, flush=True)
    if mode == "exit_early":
        print("boom: CUDA out of memory (fake)", flush=True)
        sys.exit(3)
    if os.environ.get("FAKE_CHILD_PIDFILE"):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        open(os.environ["FAKE_CHILD_PIDFILE"], "w").write(str(child.pid))
    diverge_at = int(os.environ.get("FAKE_DIVERGE_AT", "-1"))
    served = [0]

    def tokens(ids, n):
        return [(sum(ids) + 7 * i) % 5000 for i in range(n)]

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
            if self.path == "/health_generate":
                return self.reply(503 if mode == "never_healthy" else 200, {})
            if self.path == "/server_info":
                info = {"version": "fake", "internal_states": [{"x": 1}]}
                if os.environ.get("FAKE_POOL_TOKENS"):  # SGLang's KV pool size (max_total_num_tokens)
                    info["max_total_num_tokens"] = int(os.environ["FAKE_POOL_TOKENS"])
                return self.reply(200, info)
            self.reply(404, {})

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/set_internal_state":
                return self.reply(200, [True])
            if self.path != "/generate":
                return self.reply(404, {})
            ids, n = body["input_ids"], body["sampling_params"]["max_new_tokens"]
            out = tokens(ids, n)
            if spec and diverge_at >= 0 and sum(ids) % 2 == 0:
                out[diverge_at] += 1
            meta = {"completion_tokens": n, "finish_reason": {"type": "length", "length": n}}
            if spec and os.environ.get("SPARSESPEC_POLICY") == "streaming":  # accepts no draft
                meta.update(spec_verify_ct=n, spec_accept_length=1.0, spec_correct_drafts_histogram=[n])
            elif spec:  # accepts 2 drafts per verify step
                ct = (n + 2) // 3
                meta.update(spec_verify_ct=ct, spec_accept_length=n / ct, spec_correct_drafts_histogram=[0, 0, ct])
            served[0] += 1
            time.sleep(0.002 * n)  # decode time grows with the output length
            if spec and os.environ.get("SPARSESPEC_STEP_TIMING"):
                # One report per request; the batch is the whole prompt set of a step_times point.
                # The streaming policy captures no scores: its verify is 0.5 ms shorter.
                verify = 1.5 if os.environ.get("SPARSESPEC_POLICY") == "streaming" else 2.0
                print(f"INFO PILLAR step timing: rounds=10 batch={int(os.environ.get('FAKE_BATCH', '2'))}.00 "
                      f"draft_ms=1.5000 verify_ms={verify:.4f} accept_ms=0.2500 select_ms=0.5000 gap_ms=0.1000", flush=True)
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
        open(get("--output-file"), "a").write(json.dumps(res) + "\n")
    '''
)


@pytest.fixture()
def fake_bench(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point every BenchDriver at FAKE_BENCH (a module on the children's PYTHONPATH); returns its name."""
    mod_dir = tmp_path / "fake_bench_mod"
    mod_dir.mkdir()
    (mod_dir / "fake_bench.py").write_text(FAKE_BENCH)
    monkeypatch.setenv("PYTHONPATH", str(mod_dir))
    monkeypatch.setattr(bench_driver, "BENCH_MODULE", "fake_bench")
    return "fake_bench"


# --------------------------------------------------------------------------- fixtures


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
    argv = [sys.executable, str(script), "--port", str(port)]
    return server.Server(argv, port=port, log_path=tmp_path / "srv.log", env=env)


def pid_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def wait_dead(pid: int, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not pid_alive(pid):
            return True
        time.sleep(0.1)
    return False


# --------------------------------------------------------------------------- configs


def test_configs_flags_and_names() -> None:
    stock = configs.resolve_config("stock")
    assert stock.flags[:2] == ("--attention-backend", "triton") and not stock.speculative
    assert "--disable-radix-cache" in stock.flags
    k4 = configs.resolve_config("pillar-k4", ("--foo", "1"))
    i = k4.flags.index("--speculative-num-steps")
    assert k4.speculative and k4.flags[i + 1] == "4" and k4.flags[-2:] == ("--foo", "1")
    assert configs.resolve_config("pillar").flags[i + 1] == "8"
    streaming = configs.resolve_config("pillar-k4-streaming")
    assert streaming.flags == k4.flags[:-2] and dict(streaming.env) == {"SPARSESPEC_POLICY": "streaming"}
    assert streaming.environment({"A": "1"}) == {"A": "1", "SPARSESPEC_POLICY": "streaming"} and k4.env == ()
    for policy in ("coarse", "oracle"):
        assert dict(configs.resolve_config(f"pillar-{policy}").env) == {"SPARSESPEC_POLICY": policy}
    assert "flashinfer" in configs.resolve_config("stock-flashinfer").flags
    with pytest.raises(ValueError, match="unknown config"):
        configs.resolve_config("eagle")
    with pytest.raises(ValueError, match="unknown config"):
        configs.resolve_config("pillar-magic")
    with pytest.raises(ValueError, match="at least 1"):
        configs.resolve_config("pillar-k0")
    assert configs.parse_env(["A=1", "B=x=y"]) == {"A": "1", "B": "x=y"}
    with pytest.raises(ValueError, match="KEY=VAL"):
        configs.parse_env(["A"])


def test_config_knob_suffixes() -> None:
    # The knob list is the one PillarConfig.from_env reads (config.KNOBS), not a copy of it.
    knobs = ("BUDGET_RATIO", "MIN_BUDGET", "RECENT_WINDOW", "SINK_TOKENS", "POLICY", "STEP_TIMING", "VERIFY_KERNEL",
             "SELECT_EVERY", "SCORE_ROWS", "DRAFT_CANDIDATES", "ADAPTIVE_STEPS", "OFFLOAD_HOST_GB")
    assert configs.PILLAR_KNOBS == knobs
    name = "pillar-streaming:verify_kernel=sglang:recent_window=16"
    cfg = configs.resolve_config(name, ("--foo", "1"))
    assert cfg.name == name and cfg.flags == configs.resolve_config("pillar-streaming", ("--foo", "1")).flags
    assert dict(cfg.env) == {"SPARSESPEC_POLICY": "streaming", "SPARSESPEC_VERIFY_KERNEL": "sglang",
                             "SPARSESPEC_RECENT_WINDOW": "16"}  # fmt: skip
    assert dict(configs.resolve_config("pillar-k4:policy=coarse").env) == {"SPARSESPEC_POLICY": "coarse"}
    bad = {
        "stock:recent_window=16": "PILLAR knobs; 'stock' takes none",
        "pillar:foo=1": "unknown PILLAR knob 'foo'",
        "pillar:recent_window": "not <knob>=<value>",
        "pillar:recent_window=x": "RECENT_WINDOW='x' is not a valid int",
        "pillar:budget_ratio=2": "BUDGET_RATIO must be in",
        "pillar:verify_kernel=fast": "VERIFY_KERNEL='fast'; choose one of: split, sglang",
        "pillar-streaming:policy=pillar": "the -streaming suffix already sets the policy",
        "pillar:sink_tokens=1:sink_tokens=2": "sink_tokens given twice",
    }
    for name, message in bad.items():
        with pytest.raises(ValueError, match=re.escape(message)) as e:
            configs.resolve_config(name)
        assert str(e.value).startswith(f"config {name!r}") and "\n" not in str(e.value)
    assert configs.file_stem("pillar:verify_kernel=sglang") == "pillar.verify_kernel-sglang"


def test_config_flags_parse_with_sglang_cli() -> None:
    """Every flag we pass exists in SGLang 0.5.17's launch_server parser (catches renamed flags before GPU time)."""
    import argparse

    from sglang.srt.server_args import ServerArgs

    for name in ("stock", "stock-flashinfer", "ngram", "pillar-k4"):
        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        ns = parser.parse_args(["--model-path", "m", *configs.resolve_config(name).flags])
        assert ns.disable_radix_cache and ns.cuda_graph_max_bs_decode == 256 and ns.page_size == 1
    assert ns.speculative_algorithm == "PILLAR" and ns.speculative_num_steps == 4


# --------------------------------------------------------------------------- pure logic


def test_first_divergence() -> None:
    fd = lossless.first_divergence
    assert fd([1, 2, 3], [1, 2, 3]) is None
    assert fd([1, 2, 3], [1, 9, 3]) == 1
    assert fd([1, 2, 3], [1, 2]) == 2
    assert fd([], [5]) == 0
    assert fd([], []) is None


def g(ids: list[int], verify: int | None = None) -> GenOutput:
    return GenOutput(output_ids=ids, completion_tokens=len(ids), verify_ct=verify, finish_reason="length")


def test_compare_outputs_and_acceptance() -> None:
    ref = [g(list(range(100))), g(list(range(100))), g(list(range(100)))]
    late = list(range(100))
    late[80] = -1
    early = list(range(100))
    early[10] = -1
    cand = [g(list(range(100)), 25), g(late, 50), g(early, 40)]
    rep = lossless.compare_outputs(ref, cand, early=64, decode=lambda ids: " ".join(map(str, ids)))
    assert rep["identical"] == 1 and rep["fraction_identical"] == pytest.approx(1 / 3)
    assert rep["early_divergences"] == [2]
    assert rep["first_divergence_min"] == 10 and rep["first_divergence_median"] == 45
    r2 = rep["requests"][2]
    assert r2["reference_window"] == list(range(6, 18)) and r2["candidate_window"][4] == -1
    assert r2["candidate_text"].startswith("6 7 8 9 -1")
    assert rep["requests"][0]["accept_length"] == 4.0
    assert rep["unexplained_early_divergences"] == [2] and rep["divergences_near_tie"] is None
    with pytest.raises(ValueError):
        lossless.compare_outputs(ref, cand[:2], early=64)

    # With stock's top-2 margins: an early flip to stock's runner-up at a tiny margin is
    # rounding; the same flip at a wide margin, or to another token, is not.
    def with_top2(ids: list[int], margin_at: dict[int, float]) -> GenOutput:
        return GenOutput(ids, len(ids), None, "length", runner_up=[-1] * len(ids),
                         margin=[margin_at.get(i, 3.0) for i in range(len(ids))])  # fmt: skip

    ref2 = [with_top2(list(range(20)), {5: 0.1}), with_top2(list(range(20)), {5: 2.0}), with_top2(list(range(20)), {5: 0.1})]
    flip = list(range(20))
    flip[5] = -1
    other = list(range(20))
    other[5] = -7
    rep2 = lossless.compare_outputs(ref2, [g(flip), g(flip), g(other)], early=64)
    # Near-tie by stock's margin alone: exact bf16 ties list tied tokens in no particular order.
    assert [r.get("near_tie") for r in rep2["requests"]] == [True, False, True]
    assert rep2["requests"][1]["reference_margin"] == 2.0 and rep2["requests"][2]["candidate_is_runner_up"] is False
    assert rep2["divergences_near_tie"] == 2 and rep2["unexplained_early_divergences"] == [1]
    assert rep2["reference_margin_frac_near_tie"] == pytest.approx(2 / 60)

    acc = passes.acceptance_summary(cand, wall_s=2.0)
    assert acc["accept_length_overall"] == pytest.approx(300 / 115)
    assert acc["accept_length_mean"] == pytest.approx((4 + 2 + 2.5) / 3)
    assert acc["output_tok_per_s"] == 150.0 and acc["requests_with_spec_counters"] == 3
    none = passes.acceptance_summary([g([1, 2])])
    assert none["accept_length_overall"] is None and none["accept_length_per_request"] == [None]
    assert "accept_rate_by_position" not in none


def test_acceptance_by_draft_position() -> None:
    # k = 3: request A's 4 verify steps accepted 0, 3, 3, 1 drafts; B's 2 steps 2, 3.
    a = GenOutput([0] * 11, 11, 4, "length", accept_histogram=[1, 1, 0, 2])
    b = GenOutput([0] * 7, 7, 2, "length", accept_histogram=[0, 0, 1, 1])
    acc = passes.acceptance_summary([a, b])
    assert acc["correct_drafts_histogram"] == [1, 1, 1, 3]
    # >= 1 draft accepted in 5 of 6 steps, >= 2 in 4, all 3 in 3.
    assert acc["accept_rate_by_position"] == pytest.approx([5 / 6, 4 / 6, 3 / 6], abs=1e-4)
    assert acc["conditional_accept_by_position"] == pytest.approx([5 / 6, 4 / 5, 3 / 4], abs=1e-4)
    # Consistency with the accept length: 1 + mean drafts accepted per step.
    assert 1 + sum(acc["accept_rate_by_position"]) == pytest.approx(acc["accept_length_overall"], abs=1e-3)


def test_verdict() -> None:
    clean = {"early_divergences": [], "unexplained_early_divergences": []}
    tie = {"early_divergences": [3], "unexplained_early_divergences": []}
    bug = {"early_divergences": [3], "unexplained_early_divergences": [3]}
    assert lossless.verdict(True, [clean], True) == "PASS"
    assert lossless.verdict(True, [tie], True) == "PASS"
    assert lossless.verdict(True, [bug], True) == "FAIL"
    # A repeat pass is judged like the main one: one bad repeat fails, one missing leaves it incomplete.
    assert lossless.verdict(True, [clean, tie, bug], True) == "FAIL"
    assert lossless.verdict(True, [clean, None], True) == "INCOMPLETE"
    assert lossless.verdict(True, [None], True) == "INCOMPLETE"
    assert lossless.verdict(False, [None], True) == "OK"
    assert lossless.verdict(False, [None], False) == "INCOMPLETE"


def test_rejudge_rewrites_verdict_from_stored_margins(tmp_path: Path) -> None:
    ident = {
        "early_threshold": 64,
        "requests": [
            {"index": 0, "first_divergence": 3, "reference_margin": 0.0, "near_tie": False},
            {"index": 1, "first_divergence": None},
        ],
    }
    doc = {
        "settings": {"temperature": 0.0},
        "identity": ident,
        "controls": {"ngram": {"identity": json.loads(json.dumps(ident))}},
        "acceptance": [{"status": "ok"}],
        "verdict": "FAIL",
        "all_passes_ok": True,
    }
    path = tmp_path / "l.json"
    path.write_text(json.dumps(doc))
    assert lossless.main(["--rejudge", str(path)]) == 0
    out = json.loads(path.read_text())
    assert out["verdict"] == "PASS" and out["rejudged"]["previous_verdict"] == "FAIL"
    assert out["identity"]["unexplained_early_divergences"] == [] and out["identity"]["divergences_near_tie"] == 1
    assert out["controls"]["ngram"]["identity"]["requests"][0]["near_tie"] is True
    out["identity"]["requests"][0]["reference_margin"] = 1.5
    path.write_text(json.dumps(out))
    assert lossless.main(["--rejudge", str(path)]) == 1
    assert json.loads(path.read_text())["verdict"] == "FAIL"
    # A repeat pass of the candidate is rejudged and counts like the main pass.
    out = json.loads(path.read_text())
    out["identity"]["requests"][0]["reference_margin"] = 0.0
    bad = json.loads(json.dumps(out["identity"]))
    bad["requests"][0]["reference_margin"] = 1.5
    out["identity_repeats"] = [out["identity"], bad]
    path.write_text(json.dumps(out))
    assert lossless.main(["--rejudge", str(path)]) == 1
    assert json.loads(path.read_text())["identity_repeats"][1]["unexplained_early_divergences"] == [0]


def test_parse_generate_reply() -> None:
    reply = {
        "text": "hi",
        "output_ids": [5, 6, 7, 8],
        "meta_info": {
            "completion_tokens": 4, "finish_reason": {"type": "stop", "matched": 2}, "spec_verify_ct": 2,
            "spec_correct_drafts_histogram": [1, 0, 1],
        },
    }  # fmt: skip
    out = parse_generate_reply(reply)
    assert out.output_ids == [5, 6, 7, 8] and out.finish_reason == "stop" and out.accept_length == 2.0
    assert out.accept_histogram == [1, 0, 1]
    stock = parse_generate_reply({"output_ids": [1], "meta_info": {"completion_tokens": 1, "finish_reason": None}})
    assert stock.verify_ct is None and stock.accept_length is None
    with pytest.raises(ValueError, match="unexpected"):
        parse_generate_reply({"error": {"message": "bad"}})
    top = parse_generate_reply({
        "output_ids": [5, 6],
        "meta_info": {"completion_tokens": 2, "output_top_logprobs": [[[-0.1, 5, None], [-0.3, 9, None]], [[-1.0, 6, None], [-1.0, 4, None]]]},
    })  # fmt: skip
    assert top.runner_up == [9, 4] and top.margin == pytest.approx([0.2, 0.0])
    with pytest.raises(ValueError, match="output_top_logprobs"):
        parse_generate_reply({"output_ids": [5, 6], "meta_info": {"output_top_logprobs": [[[-0.1, 5, None], [-0.3, 9, None]]]}})


def test_parse_bench_result(tmp_path: Path) -> None:
    f = tmp_path / "r.jsonl"
    with pytest.raises(ValueError, match="no bench_serving result"):
        throughput.parse_bench_result(f)
    f.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        throughput.parse_bench_result(f)
    f.write_text(json.dumps({"completed": 3}) + "\n")
    with pytest.raises(ValueError, match="output_throughput"):
        throughput.parse_bench_result(f)
    first = {"output_throughput": 1.0, "completed": 1}
    last = {"output_throughput": 812.5, "completed": 8, "median_tpot_ms": 3.2, "accept_length": 3.1, "server_info": {}}
    f.write_text(json.dumps(first) + "\n" + json.dumps(last) + "\n")
    m = throughput.parse_bench_result(f)
    assert m["output_throughput"] == 812.5 and m["accept_length"] == 3.1 and m["p99_itl_ms"] is None
    assert "server_info" not in m
    assert throughput.default_num_prompts(1) == 4 and throughput.default_num_prompts(64) == 128


def test_run_clock_guesses_from_the_slowest_run_of_the_same_shape() -> None:
    clock = throughput.RunClock()
    assert clock.run_s("stock", 256, 4096, 256) is None and clock.guess_s("stock", 256, 4096, 256) == throughput.MIN_RUN_S
    clock.record_run("stock", 256, 4096, 1_048_576, 30.0)  # 34953 tok/s
    clock.record_run("stock", 256, 4096, 1_048_576, 50.0)  # a slower run of the same config: 20972 tok/s wins
    clock.record_run("stock", 64, 4096, 262_144, 10.0)
    clock.record_run("stock", 256, 2048, 524_288, 10.0)  # another output length is another shape
    over = throughput.RUN_OVERHEAD_S
    assert clock.run_s("stock", 256, 4096, 256) == pytest.approx(throughput.RUN_MARGIN * 50.0 + over)
    assert clock.run_s("stock", 256, 4096, 512) == pytest.approx(throughput.RUN_MARGIN * 100.0 + over)
    assert clock.run_s("stock", 64, 4096, 1) == pytest.approx(throughput.RUN_MARGIN * 10.0 / 64 + over)
    assert clock.run_s("stock", 1, 4096, 4) is None
    # Unmeasured concurrencies: at most twice the rate of the nearest measured lower one (errs long).
    assert clock.rate("stock", 128, 4096) == pytest.approx(2 * 262_144 / 10.0)
    assert clock.rate("stock", 96, 4096) == pytest.approx(1.5 * 262_144 / 10.0)
    assert clock.rate("stock", 1024, 4096) == pytest.approx(2 * 1_048_576 / 50.0)
    assert clock.rate("stock", 32, 4096) is None and clock.rate("stock", 512, 7000) is None
    assert clock.run_s("stock", 256, 2048, 1024) == pytest.approx(throughput.RUN_MARGIN * 40.0 + over)
    # Pools: the config's own runs, then its family's, then every config's.
    clock.record_run("ngram", 256, 4096, 1_048_576, 100.0)  # 10486 tok/s: slower than every other config
    clock.record_run("pillar", 256, 4096, 1_048_576, 25.0)  # 41943 tok/s
    assert clock.rate("pillar", 256, 4096) == pytest.approx(1_048_576 / 25.0)
    assert clock.rate("pillar-coarse:budget_ratio=0.1", 256, 4096) == pytest.approx(1_048_576 / 25.0)
    assert clock.rate("stock-flashinfer", 256, 4096) == pytest.approx(1_048_576 / 50.0)
    assert clock.rate("eagle", 256, 4096) == pytest.approx(1_048_576 / 100.0)  # no family: the slowest of all
    assert clock.rate("pillar-streaming", 64, 4096) == pytest.approx(262_144 / 10.0)  # pillar has no 64: all configs
    # The pool measured nearest below wins: a variant's own c=1 run does not outrank its family's c=256 run
    # (doubled eight times it would guess 256 x 4096 at 1024 tok/s); at c=1 its own run is nearest.
    clock.record_run("pillar-coarse", 1, 4096, 16_384, 32.0)  # 512 tok/s
    assert clock.rate("pillar-coarse", 256, 4096) == pytest.approx(1_048_576 / 25.0)
    assert clock.rate("pillar-coarse", 1, 4096) == pytest.approx(512.0)
    assert clock.rate("pillar-coarse", 8, 4096) == pytest.approx(1024.0)
    assert throughput.config_family("pillar-k4-coarse:budget_ratio=0.1") == "pillar"
    clock.record_start(60.0)
    assert clock.startup_s == throughput.START_GUESS_FLOOR_S
    clock.record_start(141.0)
    clock.record_start(98.0)
    assert clock.startup_s == 141.0


def test_bench_argv_workloads(tmp_path: Path) -> None:
    aime = throughput.Workload("aime", 2048, None, 0.0, 1.0, {8: tmp_path / "p8.jsonl"})
    argv = throughput.bench_argv("http://h:1", "/m", aime, 4, 8, tmp_path / "o.jsonl")
    assert argv[:2] == ["--backend", "sglang"]
    assert argv[argv.index("--dataset-name") + 1] == "custom" and argv[argv.index("--sharegpt-output-len") + 1] == "2048"
    assert argv[argv.index("--max-concurrency") + 1] == "4" and "--apply-chat-template" not in argv
    rnd = throughput.Workload("random-ids", 512, 200, 0.0, 1.0, {})
    argv = throughput.bench_argv("http://h:1", "/m", rnd, 1, 4, tmp_path / "o.jsonl")
    assert "--tokenize-prompt" in argv and argv[argv.index("--random-range-ratio") + 1] == "1.0"


def test_bench_driver_with_the_real_bench_serving(tmp_path: Path) -> None:
    """SGLang 0.5.17's bench module imports in the driver and knows every flag the harness passes."""
    flags = {a for a in throughput.bench_argv("http://h:1", "/m", throughput.Workload("aime", 16, None, 0.6, 0.95, {1: tmp_path}),
                                             1, 1, tmp_path / "o") if a.startswith("--")}  # fmt: skip
    flags |= {a for a in throughput.Workload("random-ids", 16, 8, 0.0, 1.0, {}).bench_args(1) if a.startswith("--")}
    with bench_driver.BenchDriver(tmp_path / "driver.log") as driver:
        assert driver.module == "sglang.benchmark.serving"
        assert driver.run(["--help"], tmp_path / "help.log", 300, lambda: None) == 0
    text = (tmp_path / "help.log").read_text()
    assert "Benchmark the online serving throughput" in text
    assert not [f for f in flags if f not in text]


def test_bench_driver_runs_reports_and_recovers(fake_bench: str, tmp_path: Path) -> None:
    out, log = tmp_path / "o.jsonl", tmp_path / "run.log"
    url = f"http://127.0.0.1:{server.free_port()}"  # nothing listens: the fake's request fails -> exit code 1
    with bench_driver.BenchDriver(tmp_path / "driver.log") as driver:
        assert driver.run(["--fake-mode", "exit"], log, 60, lambda: None) == 3
        pid = driver.proc.pid if driver.proc else None
        assert driver.import_s is not None and driver.import_s >= 0
        assert driver.run(["--fake-mode", "raise"], log, 60, lambda: None) == 1
        assert driver.run(["--base-url", url, "--output-file", str(out)], log, 60, lambda: None) == 1
        assert driver.proc is not None and driver.proc.pid == pid  # one import served every run
        text = log.read_text()
        assert text.count("fake bench run fake_bench") == 3 and "ValueError: fake bench failure" in text
        assert "ConnectionRefusedError" in text or "URLError" in text
        assert "fake bench module imported" in (tmp_path / "driver.log").read_text()

        with pytest.raises(TimeoutError):
            driver.run(["--fake-mode", "hang"], log, 1.5, lambda: None)
        assert driver.proc is None and wait_dead(pid)  # type: ignore[arg-type]

        def server_died() -> None:
            raise server.ServerError("server exited with code 9")

        with pytest.raises(server.ServerError):
            driver.run(["--fake-mode", "hang"], log, 60, server_died)
        assert driver.proc is None
        assert driver.run(["--fake-mode", "exit"], log, 60, lambda: None) == 3  # a fresh driver
        assert driver.proc is not None and driver.proc.pid != pid

    broken = bench_driver.BenchDriver(tmp_path / "broken.log", module="no_such_module_here")
    with pytest.raises(bench_driver.DriverError, match="exited with code 1"):
        broken.run([], log, 60, lambda: None)
    assert "ModuleNotFoundError" in (tmp_path / "broken.log").read_text() and broken.proc is None


# --------------------------------------------------------------------------- workload


def test_workload_prompts_and_bench_file(tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    tok = workload.load_tokenizer(str(tiny_tokenizer_dir))
    prompts = workload.build_prompts(tok, data_dir, 6)
    assert [p.source for p in prompts] == ["aime24:0", "aime24:1", "aime24:2", "amc23:0", "aime24:0", "aime24:1"]
    assert prompts[0].text.startswith("<|user|> w0 w1\nPlease reason step by step")
    assert prompts[0].text.rstrip().endswith("<|assistant|>")
    assert prompts[0].input_ids[:3] == [1, 3, 4] and prompts[0].input_ids == prompts[4].input_ids
    stats = workload.prompt_token_stats(prompts)
    assert stats["unique"] == 4 and stats["min"] <= stats["mean"] <= stats["max"]
    with pytest.raises(ValueError, match="not found"):
        workload.build_prompts(tok, data_dir, 2, datasets=("nope",))
    with pytest.raises(ValueError, match=">= 1"):
        workload.build_prompts(tok, data_dir, 0)
    (data_dir / "bad.jsonl").write_text(json.dumps({"question": "x"}) + "\n")
    with pytest.raises(ValueError, match="no 'problem'"):
        workload.load_problems(data_dir, ("bad",))

    # The file must load through bench_serving's own 'custom' dataset reader, fixed output length.
    from sglang.benchmark.datasets.custom import sample_custom_requests

    path = tmp_path / "bench.jsonl"
    workload.write_bench_serving_file(path, prompts)
    rows = sample_custom_requests(str(path), 6, tok, fixed_output_len=64)
    assert len(rows) == 6 and {r.output_len for r in rows} == {64}
    assert sorted(r.prompt for r in rows) == sorted(p.text for p in prompts)


# --------------------------------------------------------------------------- server lifecycle


def test_server_early_death_reports_log_tail(tmp_path: Path) -> None:
    srv = fake_server(tmp_path, FAKE_MODE="exit_early")
    t0 = time.monotonic()
    with pytest.raises(server.ServerError, match="exited with code 3") as e:
        with srv:
            srv.start(timeout_s=60, poll_s=0.1)
    assert "CUDA out of memory (fake)" in str(e.value) and time.monotonic() - t0 < 20
    assert srv.proc is None


def test_server_startup_timeout_kills_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    srv = fake_server(tmp_path, FAKE_MODE="never_healthy", FAKE_CHILD_PIDFILE=str(pidfile))
    with pytest.raises(server.ServerError, match="not healthy after"):
        srv.start(timeout_s=2, poll_s=0.2)
    assert srv.proc is None and wait_dead(int(pidfile.read_text()))


def test_server_healthy_then_stop_kills_children(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    srv = fake_server(tmp_path, FAKE_CHILD_PIDFILE=str(pidfile))
    with srv:
        assert srv.start(timeout_s=30, poll_s=0.1) < 30
        leader = srv.proc.pid
        srv.check_alive()
        assert server.http_json(srv.base_url + "/server_info")["version"] == "fake"
        child = int(pidfile.read_text())
        assert pid_alive(child)
    assert wait_dead(leader) and wait_dead(child)
    srv.stop()  # idempotent


def test_server_death_mid_run_detected(tmp_path: Path) -> None:
    srv = fake_server(tmp_path, FAKE_MODE="die_on_second_generate")
    with srv:
        srv.start(timeout_s=30, poll_s=0.1)
        out = generate_all(srv, [[2, 3]], {"max_new_tokens": 5}, concurrency=1, timeout_s=20)
        assert out[0].output_ids == [5, 12, 19, 26, 33]
        with pytest.raises(server.ServerError, match="exited with code 9"):
            generate_all(srv, [[2, 3]] * 3, {"max_new_tokens": 5}, concurrency=1, timeout_s=20)


def test_sigterm_to_harness_stops_server(tmp_path: Path) -> None:
    """A harness killed with SIGTERM (the tool's timeout) must take its server group down with it."""
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
    assert doc["all_passes_ok"] and doc["settings"]["ignore_eos"] is True
    pillar, streaming = doc["results"]["pillar"], doc["results"]["pillar-streaming"]
    assert [p["temperature"] for p in pillar] == [0.0, 0.6]
    assert pillar[0]["accept_length_overall"] == pytest.approx(3.0)
    assert pillar[0]["accept_rate_by_position"] == [1.0, 1.0]
    # The policy reached the server through the config's environment.
    assert streaming[0]["accept_length_overall"] == 1.0 and streaming[0]["correct_drafts_histogram"] == [90]
    assert doc["servers"]["pillar-streaming"]["env"] == {"SPARSESPEC_POLICY": "streaming"}
    knobs = doc["servers"]["pillar-streaming"]["pillar_config"]
    assert knobs["policy"] == "streaming" and knobs["num_steps"] == 8 and knobs["recent_window"] == 64
    assert "| pillar | 0.6 | 3.00 | 1.00 1.00 | ok |" in out.with_suffix(".log").read_text()
    with pytest.raises(SystemExit):  # the last --configs wins: a non-speculative config is refused
        acceptance.main([*argv, "--configs", "stock"])


def test_lossless_end_to_end_pass_and_fail(
    fake_sglang: Path, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    common = ["--model", str(tiny_tokenizer_dir), "--data-dir", str(data_dir), "--num-prompts", "4",
              "--max-new-tokens", "80", "--server-log-dir", str(tmp_path / "logs")]  # fmt: skip
    out = tmp_path / "pass.json"
    assert lossless.main([*common, "--out", str(out), "--accept-temps", "0.6", "--accept-max-new-tokens", "30"]) == 0
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "PASS" and doc["all_passes_ok"]
    assert doc["identity"]["identical"] == 4 and doc["stock_repeat"]["identical"] == 4
    assert [a["temperature"] for a in doc["acceptance"]] == [0.0, 0.6]
    assert doc["acceptance"][0]["accept_length_overall"] == pytest.approx(80 / 27)
    assert doc["acceptance"][1]["max_new_tokens"] == 30
    assert "--speculative-num-steps" in doc["servers"]["pillar"]["flags"]
    assert "LOSSLESS VERDICT: PASS" in out.with_suffix(".log").read_text()

    monkeypatch.setenv("FAKE_DIVERGE_AT", "10")
    bad = tmp_path / "fail.json"
    assert lossless.main([*common, "--out", str(bad), "--no-stock-repeat"]) == 1
    doc = json.loads(bad.read_text())
    assert doc["verdict"] == "FAIL" and doc["stock_repeat"] is None
    even = [i for i, r in enumerate(doc["identity"]["requests"]) if not r["identical"]]
    assert even and doc["identity"]["early_divergences"] == even
    assert all(doc["identity"]["requests"][i]["first_divergence"] == 10 for i in even)

    monkeypatch.setenv("FAKE_MODE", "exit_early")
    dead = tmp_path / "dead.json"
    assert lossless.main([*common, "--out", str(dead), "--temperature", "0.7"]) == 1
    doc = json.loads(dead.read_text())
    assert doc["verdict"] == "INCOMPLETE" and doc["servers"]["pillar"]["status"] == "failed"
    assert "stock" not in doc["servers"] and "CUDA out of memory" in doc["servers"]["pillar"]["error"]


def test_throughput_end_to_end(
    fake_sglang: Path, fake_bench: str, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    out = tmp_path / "out"
    args = ["--model", str(tiny_tokenizer_dir), "--data-dir", str(data_dir), "--out", str(out),
            "--configs", "stock,pillar", "--concurrency", "1,2", "--output-len", "16", "--run-id", "R1",
            "--work-dir", str(tmp_path / "work")]  # fmt: skip
    assert throughput.main(args) == 0
    printed = capsys.readouterr().out
    assert "| pillar | 2 | 4 | 200 | 1.00x |" in printed
    stock = json.loads((out / "throughput_R1_stock.json").read_text())
    pillar = json.loads((out / "throughput_R1_pillar.json").read_text())
    assert stock["server"]["status"] == "ok" and stock["server"]["server_info"] == {"version": "fake"}
    assert [r["status"] for r in stock["runs"]] == ["ok", "ok"] and stock["runs"][0]["num_prompts"] == 4
    assert pillar["runs"][1]["metrics"]["accept_length"] == 2.5 and pillar["meta"]["run_id"] == "R1"
    assert stock["config"]["pillar_config"] is None and pillar["config"]["pillar_config"]["policy"] == "pillar"
    assert stock["workload"]["prompt_tokens"]["unique"] == 4
    assert sorted(p.name for p in out.iterdir()) == ["throughput_R1.log", "throughput_R1_pillar.json", "throughput_R1_stock.json"]

    # Several output lengths on one server start: one JSON per length, each its own run id.
    out4 = tmp_path / "out4"
    args4 = [*args[:5], str(out4), "--configs", "pillar", "--concurrency", "2", "--output-len", "16,24",
             "--run-id", "R4-{output_len}", "--log-name", "t4.log", "--work-dir", str(tmp_path / "work4")]  # fmt: skip
    assert throughput.main(args4) == 0
    d16, d24 = (json.loads((out4 / f"throughput_R4-{n}_pillar.json").read_text()) for n in (16, 24))
    assert d16["meta"]["run_id"] == "R4-16" and d24["workload"]["output_len"] == 24
    assert d16["server"] == d24["server"] and d16["server"]["output_lens"] == [16, 24]
    assert d24["runs"][0]["metrics"]["total_output_tokens"] == 4 * 24
    assert (tmp_path / "work4" / "pillar.server.log").read_text().count("fake server starting") == 1
    assert "pillar len=24 c=2 n=4: 200 out tok/s" in (out4 / "t4.log").read_text()
    for bad in (["--output-len", "16,24", "--run-id", "R5"], ["--output-len", "16,16", "--run-id", "R-{output_len}"],
                ["--run-id", "R-{x}"], ["--log-name", "a/b.log"]):  # fmt: skip
        with pytest.raises(SystemExit):
            throughput.parse_args([*args, *bad])

    # --resume: the ok runs of same-named files are kept with their provenance; only the rest runs.
    out5 = tmp_path / "out5"
    args5 = [*args[:5], str(out5), "--configs", "stock,pillar", "--concurrency", "1,2,3", "--output-len", "16",
             "--run-id", "R1", "--resume", str(out), "--work-dir", str(tmp_path / "work5")]  # fmt: skip
    stock["runs"][1]["status"] = "failed"  # stock c=2 failed in the earlier command: it runs again
    (out / "throughput_R1_stock.json").write_text(json.dumps(stock))
    assert throughput.main(args5) == 0
    s5, p5 = (json.loads((out5 / f"throughput_R1_{c}.json").read_text()) for c in ("stock", "pillar"))
    assert [r["concurrency"] for r in s5["runs"]] == [1, 2, 3] and [r["status"] for r in s5["runs"]] == ["ok"] * 3
    assert [("measured" in r) for r in s5["runs"]] == [True, False, False]
    assert [("measured" in r) for r in p5["runs"]] == [True, True, False]
    assert p5["runs"][0]["measured"]["run_id"] == "R1" and p5["runs"][0]["metrics"] == pillar["runs"][0]["metrics"]
    # A kept run keeps the server record (full command line) of the command that measured it.
    assert p5["runs"][0]["measured"]["server"] == pillar["server"] and "--speculative-algorithm" in pillar["server"]["command"]
    log5 = (out5 / "throughput_R1.log").read_text()
    assert "stock len=16: resumed c=1 from" in log5 and "done: 6 ok (3 resumed), 0 failed" in log5
    # Everything there already: no server starts. Other flags: nothing is resumed.
    args6 = [*args5[:5], str(tmp_path / "out6"), *args5[6:-2], "--work-dir", str(tmp_path / "work6")]
    args6[args6.index("--resume") + 1] = str(out5)
    assert throughput.main(args6) == 0
    assert not (tmp_path / "work6" / "stock.server.log").exists() and "every run resumed, no server start" in capsys.readouterr().out
    assert throughput.main([*args6[:-2], "--work-dir", str(tmp_path / "work7"), "--extra-server-args=--mem-fraction-static 0.5",
                            "--configs", "stock", "--concurrency", "1"]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "nothing resumed (throughput_R1_stock.json: config.flags differs)" in printed, printed
    with pytest.raises(SystemExit):
        throughput.parse_args([*args, "--resume", str(tmp_path / "nowhere")])

    # A server that never becomes healthy: its config is recorded as failed.
    monkeypatch.setenv("FAKE_MODE", "never_healthy")
    out2 = tmp_path / "out2"
    args2 = [*args[:5], str(out2), "--configs", "stock", "--concurrency", "1", "--startup-timeout", "2", "--run-id", "R2",
             "--work-dir", str(tmp_path / "work2")]  # fmt: skip
    assert throughput.main(args2) == 1
    doc = json.loads((out2 / "throughput_R2_stock.json").read_text())
    assert doc["server"]["status"] == "failed" and doc["runs"][0]["status"] == "failed"

    # Not enough budget to start a server: everything is skipped, which is not a failure.
    monkeypatch.delenv("FAKE_MODE")
    out3 = tmp_path / "out3"
    args3 = [*args[:5], str(out3), "--configs", "stock,pillar:recent_window=16", "--time-budget", "30",
             "--run-id", "R3", "--work-dir", str(tmp_path / "work3")]  # fmt: skip
    assert throughput.main(args3) == 0
    assert "SKIPPED 6 runs for the time budget" in (out3 / "throughput_R3.log").read_text()
    # A knob suffix keeps its name in the JSON; the file name uses only characters that come back from the node.
    knob = json.loads((out3 / "throughput_R3_pillar.recent_window-16.json").read_text())
    assert knob["config"]["name"] == "pillar:recent_window=16"
    assert knob["config"]["env"] == {"SPARSESPEC_RECENT_WINDOW": "16"}


# --------------------------------------------------------------------------- report


def tp_doc(run_id: str, config: str, tok_s: dict[int, float | None], accept: float | None = None,
           out_len: int = 2048, flags: tuple[str, ...] = ()) -> dict:
    runs = [
        {"concurrency": c, "num_prompts": 2 * c, "status": "ok" if v else "failed", "error": None, "wall_s": 1.0,
         "metrics": {"output_throughput": v, "median_tpot_ms": 2.0, "p99_tpot_ms": 3.0, "accept_length": accept,
                     "mean_e2e_latency_ms": 1500.0, "p99_e2e_latency_ms": 2500.0} if v else None}
        for c, v in tok_s.items()
    ]  # fmt: skip
    return {
        "kind": "throughput",
        "meta": {"run_id": run_id, "device": "H100", "sglang_version": "0.5.17", "git_commit": "abc"},
        "config": {"name": config, "flags": list(flags)},
        "workload": {"kind": "aime", "output_len": out_len, "input_len": None, "temperature": 0.0},
        "runs": runs,
    }


def test_report_ratios_within_run_only() -> None:
    docs = [
        tp_doc("A", "pillar", {1: 300.0, 16: 1000.0}, accept=3.2),
        tp_doc("A", "stock", {1: 100.0, 16: 2000.0}),
        tp_doc("B", "pillar", {1: 500.0}),  # no stock in run B: no ratio
        tp_doc("A", "ngram", {1: None}),
    ]
    docs[1]["runs"][1]["metrics"]["mean_e2e_latency_ms"] = 3000.0  # stock's requests at 16 take twice as long
    rows = report.throughput_rows(docs)
    by = {(r["run_id"], r["config"], r["concurrency"]): r for r in rows}
    assert by[("A", "pillar", 1)]["ratio_vs_stock"] == 3.0 and by[("A", "pillar", 16)]["ratio_vs_stock"] == 0.5
    assert by[("B", "pillar", 1)]["ratio_vs_stock"] is None and by[("A", "ngram", 1)]["ratio_vs_stock"] is None
    assert by[("A", "pillar", 1)]["e2e_vs_stock"] == 1.0 and by[("A", "pillar", 16)]["e2e_vs_stock"] == 2.0
    assert by[("B", "pillar", 1)]["e2e_vs_stock"] is None and by[("A", "ngram", 1)]["e2e_vs_stock"] is None
    assert [r["config"] for r in rows if r["run_id"] == "A"] == ["stock", "stock", "ngram", "pillar", "pillar"]
    md = report.throughput_markdown(docs)
    assert "| pillar | 1 | 2 | 300 | 3.00x | 1.00x | 2.00 | 3.00 | - | - | - | 1.5 | 2.5 | 3.20 | ok |" in md
    assert "| ngram | 1 | 2 | - | - |" in md and "### Throughput, run B" in md
    assert "; commit abc;" in md
    docs[3]["meta"]["git_commit"] = "def"  # a config of run A measured at another commit
    assert "; commits abc (stock, pillar), def (ngram);" in report.throughput_markdown(docs)


def test_report_stream_interval_runs_and_length_plot(tmp_path: Path) -> None:
    si8 = ("--stream-interval", "8")
    docs = [tp_doc("S", "stock", {256: 100.0}, flags=si8), tp_doc("S", "pillar", {256: 110.0}, 6.0, flags=si8),
            tp_doc("L", "stock", {256: 50.0}, out_len=4096, flags=si8),
            tp_doc("L", "pillar", {256: 60.0}, 6.0, out_len=4096, flags=si8),
            tp_doc("OLD", "stock", {256: 10.0}), tp_doc("OLD", "pillar", {256: 30.0}, 6.0)]  # fmt: skip
    md = report.throughput_markdown(docs)
    assert md.count("Bounded by streaming") == 1 and "stream interval 1." in md and "stream interval 8." in md
    readme = report.readme_markdown(docs)
    assert "run S" in readme and "run L" in readme and "run OLD" not in readme
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return
    (tmp_path / "throughput_vs_length_stale_aime_c8.png").write_bytes(b"old name")
    paths = report.plot_throughput_vs_length(docs, tmp_path)
    assert [p.name for p in paths] == ["throughput_vs_length_commit_abc_aime.png"] and paths[0].stat().st_size > 0
    assert not (tmp_path / "throughput_vs_length_stale_aime_c8.png").exists()
    # Sweep run ids (one per length, `<series>-<len>`) form one series whatever commit each length ran at.
    sweep_docs = [tp_doc("sweep-t-2048", "stock", {1: 10.0, 8: 80.0}, flags=si8),
                  tp_doc("sweep-t-4096", "stock", {1: 9.0}, out_len=4096, flags=si8)]  # fmt: skip
    sweep_docs[1]["meta"]["git_commit"] = "def"
    assert report.length_series("sweep-t-4096", 4096, "def") == "sweep-t" and report.length_series("L", 4096, "x") == "commit x"
    paths = report.plot_throughput_vs_length(sweep_docs, tmp_path)
    assert [p.name for p in paths] == ["throughput_vs_length_sweep-t_aime.png"]  # concurrency 8 has one length only


def lossless_doc() -> dict:
    return {
        "kind": "lossless",
        "meta": {"run_id": "L1", "device": "H100"},
        "settings": {"num_steps": 8, "num_prompts": 32, "max_new_tokens": 1024},
        "verdict": "FAIL",
        "identity": {"identical": 30, "num_requests": 32, "early_divergences": [4], "first_divergence_min": 12,
                     "first_divergence_median": 400.5, "divergences_near_tie": 1, "unexplained_early_divergences": [4],
                     "reference_margin_median": 5.25,
                     "requests": [{"index": 4, "reference_margin": 1.5}, {"index": 9, "reference_margin": 0.125}]},
        "controls": {"ngram": {"identity": {"identical": 32, "num_requests": 32, "early_divergences": [],
                                            "first_divergence_min": None, "first_divergence_median": None,
                                            "requests": []}}},
        "stock_repeat": {"identical": 32, "num_requests": 32},
        "acceptance": [
            {"temperature": 0.0, "max_new_tokens": 1024, "num_requests": 32, "accept_length_overall": 3.456,
             "accept_length_mean": 3.4, "status": "ok"},
            {"temperature": 0.6, "max_new_tokens": 2048, "status": "failed"},
        ],
    }  # fmt: skip


def test_report_main_writes_summary(tmp_path: Path) -> None:
    (tmp_path / "t.json").write_text(json.dumps(tp_doc("A", "stock", {1: 100.0})))
    (tmp_path / "l.json").write_text(json.dumps(lossless_doc()))
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "other.json").write_text("[1, 2]")
    assert report.main(["--results-dir", str(tmp_path)]) == 0
    md = (tmp_path / "SUMMARY.md").read_text()
    assert "from 2 result files" in md and "skipped junk.json" in md and "skipped other.json" in md
    assert "| L1 | pillar | 8 | 32 | 1024 | FAIL | 30/32 | 1 | 1/2 | 4 | 1.500 | 12/400 | 32/32 | 5.25 |" in md
    assert "| L1 | ngram | - | 32 | 1024 | - | 32/32 | 0 | - | none | - | -/- | 32/32 | 5.25 |" in md
    assert "| L1 | 8 | 0.6 | 2048 | - | - | - | failed |" in md
    try:
        import matplotlib  # noqa: F401

        assert (tmp_path / "throughput_A_aime_2048.png").stat().st_size > 0
    except ImportError:
        assert "plots skipped" in md
    with pytest.raises(SystemExit):
        report.main(["--results-dir", str(tmp_path / "missing")])


def test_report_repeat_spread(tmp_path: Path) -> None:
    # results/repeats/<name> is a second run of results/<name>: one row per concurrency both ran ok.
    (tmp_path / "repeats").mkdir()
    (tmp_path / "throughput_A_stock.json").write_text(json.dumps(tp_doc("A", "stock", {1: 100.0, 8: 800.0, 64: None})))
    (tmp_path / "repeats" / "throughput_A_stock.json").write_text(
        json.dumps(tp_doc("A", "stock", {1: 110.0, 8: 720.0, 64: 900.0})))
    (tmp_path / "repeats" / "throughput_B_stock.json").write_text(json.dumps(tp_doc("B", "stock", {1: 1.0})))  # no twin
    assert report.main(["--results-dir", str(tmp_path), "--no-plots"]) == 0
    md = (tmp_path / "SUMMARY.md").read_text()
    assert "from 1 result files" in md  # repeats are not results of their own
    assert "(2 pairs): the output tok/s moved by 9.1-11.1% (median 11.1%)" in md
    assert "| stock | 2048 | 1 | 110 | 100 | -9.1% | 1 |" in md and "| stock | 2048 | 8 | 720 | 800 | +11.1% | 1 |" in md
    assert "| 64 |" not in md.split("### Run-to-run spread")[1]


def test_report_acceptance_and_kernel_sections(tmp_path: Path) -> None:
    acc = {
        "kind": "acceptance", "meta": {"run_id": "A1"}, "settings": {"max_new_tokens": 4096, "env": {"SPARSESPEC_RECENT_WINDOW": "64"}},
        "servers": {"pillar-streaming": {"env": {"SPARSESPEC_POLICY": "streaming"}},
                    "pillar": {"env": {}, "pillar_config": {"recent_window": 64, "select_every": 4}}},
        "results": {"pillar-streaming": [{"temperature": 0.6, "status": "ok", "accept_length_overall": 6.25,
                                          "accept_rate_by_position": [0.9, 0.8]}],
                    "pillar": [{"temperature": 0.0, "status": "ok", "accept_length_overall": 6.0,
                                "accept_rate_by_position": [0.9, 0.7]}]},
    }  # fmt: skip
    dec = {"shape": "s", "bs": 4, "seq_len": 1024, "selected": 52, "tail": 16, "sparse_us": 10.0, "sparse_GBps": 100.0,
           "sglang_full_us": 40.0, "flashinfer_full_us": "unavailable: ImportError()"}  # fmt: skip
    cap = {"shape": "s", "bs": 4, "seq_len": 1024, "fp16_out_us": 5.0, "verify_attn_us": 50.0, "split_verify_attn_us": 20.0,
           "split_verify_GBps": 900.0, "capture_plus_select_frac_of_split_verify": 0.3,
           "fp16_capture_frac_of_verify_attn": 0.1, "capture_plus_select_frac_of_verify_attn": 0.12}  # fmt: skip
    sel = {"shape": "s", "bs": 4, "seq_len": 1024, "k": 52, "all_layers_launch_us": 30.0,
           "all_layers_per_layer_fp16_bn4096_us": 0.5, "torch_topk_sort_per_layer_us": 60.0}  # fmt: skip
    # A kernels_bench file written before it recorded its kind is recognised by its sections.
    kern = {"device": "GPU", "git_commit": "abc", "config": {"timing": "graphs"},
            "sparse_decode": [dec], "score_capture": [cap], "selection": [sel]}  # fmt: skip
    sim = {"kind": "policy_sim", "settings": {"source": "aime24:1", "max_new_tokens": 1500, "recent_window": 16, "min_budget": 128},
           "results": {"pillar": {"accept_length": 5.976, "rounds": 251, "first_divergence_from_greedy": None},
                       "streaming": {"accept_length": 5.0, "rounds": 300, "accept_length_by_segment": [6.25, 4.0]}}}  # fmt: skip
    (tmp_path / "sim.json").write_text(json.dumps(sim))
    (tmp_path / "acc.json").write_text(json.dumps(acc))
    (tmp_path / "kernels.json").write_text(json.dumps(kern))
    exact = {"kind": "exactness", "meta": {"run_id": "E1", "git_commit": "abc1234"}, "settings": {"candidate": "pillar"},
             "tests": [{"config": "pillar", "temperature": 1.0, "top_p": 1.0, "context": 0, "position": 2,
                        "stat": 498.8, "df": 462, "p_value": 0.1147}],
             "control": {"p_value": 0.0}, "verdict": "PASS", "bonferroni_threshold": 1e-4}  # fmt: skip
    (tmp_path / "exact.json").write_text(json.dumps(exact))
    assert report.main(["--results-dir", str(tmp_path), "--no-plots"]) == 0
    md = (tmp_path / "SUMMARY.md").read_text()
    assert "| A1 | pillar-streaming | POLICY=streaming RECENT_WINDOW=64 | not recorded | - / - | 0.6 | 4096 | 6.25 | 0.90 0.80 |" in md
    assert "| A1 | pillar | RECENT_WINDOW=64 | 64 / 4 | - / - | 0.0 | 4096 | 6.00 | 0.90 0.70 |" in md
    assert "| s | 4 | 1024 | 68 | 10.0 | 100 | 40.0 | - | 4.0x | - |" in md
    assert "| exact.json | abc1234 | pillar | 1.0 | 1.0 | 0 | 2 | 498.8 | 462 | 0.115 | 0 | passes |" in md
    assert "| s | 4 | 1024 | 50.0 | 20.0 | 900 | 2.5x | 5.0 | 30% | 12% |" in md
    assert "| s | 4 | 1024 | 52 | 30 | 0.5 | 60.0 |" in md
    assert "| sim.json | aime24:1 | 1500 | 16 | 128 | - | 1 | all | float32 / float32 | pillar | 5.98 | 251 | yes | - |" in md
    assert ("| sim.json | aime24:1 | 1500 | 16 | 128 | - | 1 | all | float32 / float32 | streaming | 5.00 | 300 | unchecked "
            "| 6.2 4.0 |") in md


def test_report_step_times_section(tmp_path: Path) -> None:
    def rec(name: str, rows: list[dict], status: str = "ok") -> dict:
        cfg = configs.resolve_config(name)
        return {"flags": list(cfg.flags), "env": dict(cfg.env), "status": status, "rows": rows,
                "pillar_config": cfg.pillar_config({})}  # fmt: skip

    def pillar_row(verify: float, select: float) -> dict:
        return {"context": 1024, "batch": 16, "step_ms": 4.0, "draft_ms": 16.0, "verify_ms": verify,
                "select_ms": select, "round_ms": 16.0 + verify + select}  # fmt: skip

    pool_skip = "KV pool: 16 x (4096 + 160 + 16) = 68352 tokens > 60000"
    servers = {
        "stock": rec("stock", [{"context": 1024, "batch": 16, "step_ms": 10.0},
                               {"context": 4096, "batch": 16, "skipped": pool_skip}]),
        "pillar": rec("pillar", [pillar_row(12.0, 2.0)]),
        "pillar-streaming": rec("pillar-streaming", [pillar_row(10.0, 0.5)]),
        "pillar:select_every=8": rec("pillar:select_every=8", [pillar_row(11.0, 1.0)]),
        "pillar-k4": rec("pillar-k4", [], status="failed"),
    }  # fmt: skip
    doc = {"kind": "step_times", "meta": {"run_id": "S1", "device": "H100", "git_commit": "0123456789abcdef"},
           "settings": {"shape": "qwen3-1.7b", "decode_tokens": [32, 160], "accept_assumed": 6.0}, "servers": servers,
           "projection": step_times.projections(servers, 6.0),
           "capture_overhead": step_times.capture_overhead(servers)}  # fmt: skip
    (tmp_path / "steps.json").write_text(json.dumps(doc))
    assert report.main(["--results-dir", str(tmp_path)]) == 0
    md = (tmp_path / "SUMMARY.md").read_text()
    assert "H100; commit 0123456789ab; shape qwen3-1.7b; M1/M2 = 32/160 output tokens; weights dummy (random): times only; temperature 0, top-p 1." in md
    assert "| stock decode step ms | draft ms / round | draft ms / step | verify ms | select ms | round ms " \
           "| projected speedup (accept 6) |" in md and "is a projection, not a measurement" in md
    # draft per step = 16 ms / k = 8; projection = 6 x 10 ms / 30 ms.
    assert "| pillar | 1024 | 16 | 10.000 | 16.000 | 2.000 | 12.000 | 2.000 | 30.000 | 2.00x |" in md
    assert "| pillar-streaming | 1024 | 16 | 10.000 | 16.000 | 2.000 | 10.000 | 0.500 | 26.500 | 2.26x |" in md
    # capture = 12 - 10 ms; share = (2 + 2) / (12 + 2).
    assert "| pillar | 1024 | 16 | 2.000 | 2.000 | 29% |" in md
    # The streaming server is the twin of every selection cadence (it never selects): (1 + 1) / (11 + 1).
    assert "| pillar:select_every=8 | 1024 | 16 | 1.000 | 1.000 | 17% |" in md
    assert "- not measured: pillar-k4: server failed" in md and "- not measured: stock L=4096 B=16: KV pool: 16 x" in md
    # A twin that ran in another command (same shape, decode lengths, device, commit) is paired across files;
    # a failed twin in the doc itself does not hide it.
    alone = {"stock": servers["stock"], "pillar": servers["pillar"], "pillar-streaming": rec("pillar-streaming", [], "failed")}
    twin_doc = {**doc, "meta": {**doc["meta"], "run_id": "S3"}, "servers": {"pillar-streaming": servers["pillar-streaming"]},
                "projection": [], "capture_overhead": [], "_file": "twin.json"}  # fmt: skip
    doc2 = {**doc, "meta": {**doc["meta"], "run_id": "S2"}, "servers": alone, "capture_overhead": [], "_file": "s2.json"}
    other_commit = {**twin_doc, "meta": {**twin_doc["meta"], "git_commit": "fff"}}
    found = report.sibling_capture(doc2, [doc2, twin_doc])
    assert [(c["config"], c["twin"], c["capture_ms"]) for c in found] == [("pillar", "pillar-streaming (twin.json)", 2.0)]
    assert report.sibling_capture(doc2, [doc2, other_commit]) == []
    assert report.sibling_capture(doc, [doc, twin_doc]) == []  # its own twin already counts
    assert "| pillar (twin: pillar-streaming (twin.json)) | 1024 | 16 | 2.000 | 2.000 | 29% |" in report.step_times_markdown(
        [doc2, twin_doc])
    try:
        import matplotlib  # noqa: F401

        assert (tmp_path / "step_times_S1_qwen3-1.7b.png").stat().st_size > 0
        assert "plot: ![step_times_S1_qwen3-1.7b](step_times_S1_qwen3-1.7b.png)" in md
    except ImportError:
        assert "plots skipped" in md


def test_report_rewrites_only_the_readme_results_block(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    kern = {"kind": "kernels", "device": "GPU", "git_commit": "abc", "date_utc": "2026", "config": {"timing": "graphs"},
            "sparse_decode": [], "selection": [],
            "score_capture": [{"shape": "s", "bs": 4, "seq_len": 1024, "fp16_out_us": 5.0, "verify_attn_us": 50.0,
                               "split_verify_attn_us": 20.0, "split_verify_GBps": 900.0}]}  # fmt: skip
    (results / "kernels.json").write_text(json.dumps(kern))
    readme = tmp_path / "README.md"
    readme.write_text(f"intro\n{report.README_BEGIN}\nstale table\n{report.README_END}\noutro\n")
    assert report.main(["--results-dir", str(results), "--no-plots", "--readme", str(readme)]) == 0
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith(f"{report.README_END}\noutro\n") and "stale" not in text
    assert "| s | 4 | 1024 | 50.0 | 20.0 | 900 | 2.5x | 5.0 | - | - |" in text
    readme.write_text("no markers\n")
    with pytest.raises(SystemExit, match="results:begin"):
        report.main(["--results-dir", str(results), "--no-plots", "--readme", str(readme)])


def test_step_times_end_to_end(fake_sglang: Path, tmp_path: Path) -> None:
    out = tmp_path / "steps.json"
    argv = ["--shape", "qwen3-1.7b", "--out", str(out), "--contexts", "8,16", "--batches", "2", "--configs",
            "stock,pillar", "--decode-tokens", "10,60", "--accept", "6.0", "--work-dir", str(tmp_path / "w")]  # fmt: skip
    assert step_times.main(argv) == 0
    doc = json.loads(out.read_text())
    assert json.loads((tmp_path / "w" / "qwen3-1.7b" / "config.json").read_text())["num_hidden_layers"] == 28
    stock, pillar = doc["servers"]["stock"], doc["servers"]["pillar"]
    assert "--load-format" in stock["flags"] and "--skip-tokenizer-init" in stock["flags"]
    assert pillar["env"] == {"SPARSESPEC_STEP_TIMING": "10", "SPARSESPEC_ADAPTIVE_STEPS": "off"} and stock["env"] == {}
    assert [(r["context"], r["batch"]) for r in stock["rows"]] == [(8, 2), (16, 2)]
    # The fake sleeps 2 ms per output token per request: the M1/M2 difference recovers it.
    assert all(1.0 < r["step_ms"] < 10.0 for r in stock["rows"])
    # draft 1.5 + verify 2.0 + accept 0.25 + select 0.5; the gap between rounds is reported beside it.
    assert all(r["round_ms"] == pytest.approx(4.25) and r["gap_ms"] == pytest.approx(0.1) and r["timed_rounds"] >= 10
               for r in pillar["rows"])  # fmt: skip
    proj = doc["projection"]
    assert len(proj) == 2 and all(p["projected_speedup"] == pytest.approx(6.0 * s["step_ms"] / 4.25)
                                  for p, s in zip(proj, stock["rows"]))  # fmt: skip
    assert doc["settings"]["weights"].startswith("dummy")
    assert doc["capture_overhead"] == [] and stock["kv_pool_tokens"] is None
    with pytest.raises(SystemExit):
        step_times.main(["--shape", "nope", "--out", str(out)])
    # A model folder (e.g. SmolLM2's): prompt ids stay inside its vocabulary.
    folder = tmp_path / "smol"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 49152, "max_position_embeddings": 8192}))
    small = step_times.parse_args(["--shape", str(folder), "--out", str(out)])
    assert small.vocab_size == 49152 and step_times.parse_args(argv).vocab_size == 151936
    # Default contexts: 1K-32K, cut to the shape's positions (8192: 1K and 4K; Qwen3's 40960: all four).
    assert small.contexts == [1024, 4096]
    assert step_times.parse_args(["--shape", "qwen3-8b", "--out", str(out)]).contexts == [1024, 4096, 16384, 32768]
    for bad in ("8100", "0"):  # 8100 + 160 + 64 > 8192
        with pytest.raises(SystemExit):
            step_times.parse_args(["--shape", str(folder), "--out", str(out), "--contexts", bad])
    ids = [t for p in step_times.random_prompts(4, 2000, 1, small.vocab_size) for t in p]
    assert 1000 <= min(ids) and max(ids) < 49152
    for config in ({"architectures": ["X"]}, {"vocab_size": 49152}):  # no vocab size / no position count
        (folder / "config.json").write_text(json.dumps(config))
        with pytest.raises(SystemExit):
            step_times.parse_args(["--shape", str(folder), "--out", str(out)])
    # Too little budget for a server start (60 s + the stop reserve): skipped and listed, never started.
    short = tmp_path / "short.json"
    assert step_times.main([*argv[:3], str(short), *argv[4:], "--time-budget", "80"]) == 0
    doc = json.loads(short.read_text())
    assert {r["status"] for r in doc["servers"].values()} == {"skipped"}
    assert "stock: SKIPPED (time budget (" in short.with_suffix(".log").read_text()
    assert not any("startup_s" in r or "kv_pool_tokens" in r for r in doc["servers"].values())  # never started


def test_step_times_pool_skips_and_capture_overhead(
    fake_sglang: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # B x (L + M2 + 16): 2 x (8 + 60 + 16) = 168 tokens fit a 170-token pool, 2 x (16 + 60 + 16) = 184 do not.
    monkeypatch.setenv("FAKE_POOL_TOKENS", "170")
    out = tmp_path / "steps.json"
    names = "stock,pillar:verify_kernel=sglang,pillar-streaming,pillar-streaming:verify_kernel=sglang"
    argv = ["--shape", "qwen3-1.7b", "--out", str(out), "--contexts", "8,16", "--batches", "2",
            "--decode-tokens", "10,60", "--work-dir", str(tmp_path / "w"),
            "--env", "SPARSESPEC_MIN_BUDGET=64"]  # fmt: skip
    assert step_times.main([*argv, "--configs", names]) == 0
    doc = json.loads(out.read_text())
    servers = doc["servers"]
    assert list(servers) == names.split(",") and doc["settings"]["env"] == {"SPARSESPEC_MIN_BUDGET": "64"}
    for rec in servers.values():
        assert rec["kv_pool_tokens"] == 170
        assert [r.get("skipped") for r in rec["rows"]] == [None, "KV pool: 2 x (16 + 60 + 16) = 184 tokens > 170"]
    assert servers["stock"]["env"] == {"SPARSESPEC_MIN_BUDGET": "64"} and servers["stock"]["pillar_config"] is None
    resolved = servers["pillar:verify_kernel=sglang"]["pillar_config"]
    assert resolved["min_budget"] == 64 and resolved["verify_kernel"] == "sglang" and resolved["select_every"] == 4
    assert servers["pillar:verify_kernel=sglang"]["env"] == {
        "SPARSESPEC_STEP_TIMING": "10", "SPARSESPEC_ADAPTIVE_STEPS": "off", "SPARSESPEC_MIN_BUDGET": "64", "SPARSESPEC_VERIFY_KERNEL": "sglang"
    }
    assert servers["pillar-streaming"]["rows"][0]["verify_ms"] == pytest.approx(1.5)  # the policy reached the server
    assert "stock L=16 B=2: SKIPPED (KV pool" in out.with_suffix(".log").read_text()
    assert (tmp_path / "w" / "pillar.verify_kernel-sglang.server.log").is_file()
    # The twin has the same knobs (verify kernel included); streaming servers capture nothing and have none.
    (cap,) = doc["capture_overhead"]
    assert cap["config"] == "pillar:verify_kernel=sglang" and cap["twin"] == "pillar-streaming:verify_kernel=sglang"
    assert (cap["context"], cap["batch"]) == (8, 2) and cap["capture_ms"] == pytest.approx(0.5)
    assert cap["select_ms"] == pytest.approx(0.5) and cap["capture_select_frac_of_verify"] == pytest.approx(1.0 / 2.5)
    for bad in (["--configs", "pillar:verify_kernel=fast"], ["--configs", "pillar", "--env", "SPARSESPEC_POLICY=x"],
                ["--configs", "stock,stock"]):  # fmt: skip
        with pytest.raises(SystemExit):
            step_times.main([*argv, *bad])


def test_lossless_candidate_repeats_flag(tmp_path: Path) -> None:
    base = ["--model", "m", "--data-dir", str(tmp_path), "--out", str(tmp_path / "l.json")]
    assert lossless.parse_args(base + ["--candidate-repeats", "2"]).candidate_repeats == 2
    with pytest.raises(SystemExit):
        lossless.parse_args(base + ["--candidate-repeats", "-1"])




def test_step_times_ideal_breakdown() -> None:
    # SmolLM2-like shape: 30 layers x 3 KV heads x 64 dims, bf16 -> 23,040 KV bytes per token.
    model = step_times.model_shape({"num_hidden_layers": 30, "num_key_value_heads": 3, "hidden_size": 576,
                                    "num_attention_heads": 9, "vocab_size": 1000})  # fmt: skip
    assert model == {"layers": 30, "kv_heads": 3, "head_dim": 64, "vocab": 1000}
    pillar = configs.resolve_config("pillar")
    pc = pillar.pillar_config({})
    times = {"draft_ms": 20.0, "verify_ms": 10.0, "accept_ms": 1.0, "select_ms": 0.5, "gap_ms": 0.2}
    doc = {"meta": {"device": "NVIDIA H100 80GB HBM3"},
           "settings": {"model": model, "decode_tokens": [32, 160]},
           "servers": {"stock": {"rows": [{"context": 96, "batch": 4, "step_ms": 2.0},
                                          {"context": 4000, "batch": 4, "step_ms": 3.0}]},
                       "pillar": {"pillar_config": pc, "rows": [{"context": 4000, "batch": 4, "round_ms": 31.5, **times}]}}}  # fmt: skip
    rows = step_times.ideal_breakdown(doc)
    kv_ms = lambda tokens: 1e3 * 4 * tokens * 23040 / 3.35e12  # noqa: E731
    fixed = 2.0 - kv_ms(96 + 80)
    assert [r["config"] for r in rows] == ["stock", "stock", "pillar"] and rows[2]["fixed_ms"] == pytest.approx(fixed)
    ph = rows[2]["phases"]
    c, k = 4080, pc["num_steps"]
    assert ph["draft"] == (20.0, pytest.approx(k * (fixed + kv_ms(max(128, 0.05 * c) + 64 + k))))
    assert ph["verify"] == (10.0, pytest.approx(fixed + kv_ms(c) * (1 + 0.5 / pc["select_every"])))
    assert ph["accept"][1] == pytest.approx(1e3 * (k + 1) * 4 * 1000 * 4 / 3.35e12)
    assert ph["round"][0] == pytest.approx(31.7) and ph["gap"] == (0.2, 0.0)
    assert rows[1]["phases"]["step"] == (3.0, pytest.approx(fixed + kv_ms(4080)))
    # No model shape recorded (older runs) or an unknown device: no ideal.
    assert step_times.ideal_breakdown({**doc, "settings": {"decode_tokens": [32, 160]}}) == []
    assert step_times.ideal_breakdown({**doc, "meta": {"device": "cpu"}}) == []


def test_report_kernel_tune_table() -> None:
    base = {"shape": "smollm2-135m", "bs": 256, "seq_len": 7000}
    rows = [{**base, "kernel": "sglang_decode", "us": 596.0},
            {**base, "kernel": "verify", "splits": 1, "block_n": 32, "warps": 4, "stages": 2, "us": 936.0, "GBps": 1470.0},
            {**base, "kernel": "verify", "splits": 1, "block_n": 128, "warps": 4, "stages": 3, "us": 542.0, "GBps": 2539.0},
            {**base, "kernel": "capture", "splits": 2, "block_n": 128, "warps": 4, "us": 299.0, "GBps": 2302.0}]  # fmt: skip
    table = report.tune_table(rows)
    assert "| verify | smollm2-135m | 256 | 7000 | splits 1, tile 128, 4 warps, 3 stages | 542.0 | 596.0 | 2539 |" in table
    assert "| capture | smollm2-135m | 256 | 7000 | splits 2, tile 128, 4 warps | 299.0 | 596.0 | 2302 |" in table
    assert "936.0" not in table and table.count("\n") == 3
