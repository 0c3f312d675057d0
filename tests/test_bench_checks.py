"""CPU tests of the correctness checks end to end against the fake SGLang server: acceptance, exactness (the
sampled distributions against stock) and losslessness (greedy token ids against stock)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

# benchmarks/ is a folder at the repository root, not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import acceptance, configs, report, workload
from benchmarks.checks import exactness, lossless
from benchmarks.checks.exactness_stats import counters
from bench_fakes import data_dir, fake_sglang, tiny_tokenizer_dir  # noqa: F401  (pytest fixtures)
from bench_fakes import cli


def test_acceptance_end_to_end(fake_sglang: Path, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "acc.json"
    argv = cli(
        model=tiny_tokenizer_dir,
        data_dir=data_dir,
        num_prompts=3,
        max_new_tokens=30,
        configs="pillar,pillar-streaming",
        temps="0,0.6",
        out=out,
        server_log_dir=tmp_path / "logs",
    )
    assert acceptance.main(argv) == 0
    doc = json.loads(out.read_text())
    pillar, streaming = doc["results"]["pillar"], doc["results"]["pillar-streaming"]
    assert [p["temperature"] for p in pillar] == [0.0, 0.6]
    # The fake accepts 2 of k drafts per verify step: accept length 3, both positions always accepted.
    assert pillar[0]["accept_length_overall"] == pytest.approx(3.0)
    assert pillar[0]["accept_rate_by_position"] == [1.0, 1.0]
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
    argv = cli(model=tiny_tokenizer_dir, data_dir=data_dir, contexts=1, context_tokens=8, samples=3000, new_tokens=3)

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
    assert doc["settings"]["sampling_params"] == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "min_p": 0.0,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "repetition_penalty": 1.0,
        "min_new_tokens": 0,
        "max_new_tokens": 3,
        "ignore_eos": True,
    }
    # One GPU: the servers start one after another, each once the one before is up, sized so that each holds its
    # share of the card (the fake GPU sizes them as SGLang does); both keep the radix cache for the shared prefill.
    for name, fraction in (("stock", "0.4"), ("pillar", "0.667")):
        flags = doc["servers"][name]["flags"]
        assert configs.flag_value(flags, "--mem-fraction-static") == fraction and "--disable-radix-cache" not in flags
        assert doc["servers"][name]["argv"][-len(flags) :] == flags and doc["servers"][name]["gpu_share"] == 0.4
    first, second = sorted([float(x) for x in line.split()] for line in (tmp_path / "gpu").read_text().splitlines())
    assert first[0] == 0.4 and second[0] == 0.667 and second[1] >= first[2]  # launched after the first was up
    assert first[3] == pytest.approx(0.4, abs=1e-3) and second[3] == pytest.approx(0.4, abs=1e-3)
    assert (
        doc["servers"]["pillar"]["pillar_config"]["num_steps"] == 8 and doc["servers"]["stock"]["pillar_config"] is None
    )
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
    assert (
        code == 1 and doc["verdict"] == "INCOMPLETE" and "stock, pillar: SKIPPED" in (tmp_path / "slow.log").read_text()
    )
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
    assert (
        "verdict FAIL; parity: pillar WITHIN the controls' deviation at every statistic it rejects: ctx 0 token 2"
        in (tmp_path / "within.log").read_text()
    )
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
    (ctx,) = doc["contexts"]
    assert ctx["greedy_lead_nats"] is None and ctx["tokens"] == len(ctx["ids"])
    assert "no top-2 logprobs in the greedy reply" in (tmp_path / "no_logprobs.log").read_text()
    monkeypatch.setenv("FAKE_MODE", "exit_early")  # the reference fails to start: the candidate is not launched
    code, doc = run("no_start")
    assert (
        code == 1
        and doc["servers"]["stock"]["status"] == "failed"
        and doc["servers"]["pillar"]["status"] == "not started"
    )


def test_exactness_sees_penalties_and_min_new_tokens(
    fake_sglang: Path, tiny_tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A penalized setting with min_new_tokens on short questions: lengths and repeat counts are tested, the
    power checks drop the penalties on the reference, and a candidate that ignores them fails."""
    argv = cli(
        model=tiny_tokenizer_dir,
        prompts="short",
        contexts=2,
        samples=3000,
        new_tokens=5,
        stop_at_eos=True,
        frequency_penalty="0.5",
        presence_penalty="0.3",
        repetition_penalty="1.1",
        min_new_tokens=2,
    )
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
    for bad in (
        ["--min-new-tokens", "2"],
        ["--reference", "pillar", "--candidate", "stock"],
        ["--top-k", "0"],
        ["--top-p", "0"],
        ["--repetition-penalty", "0"],
        ["--min-new-tokens", "9", "--stop-at-eos"],
    ):
        with pytest.raises(SystemExit):
            exactness.main(["--model", "m", "--prompts", "short", "--out", str(tmp_path / "x.json"), *bad])


def test_lossless_end_to_end(
    fake_sglang: Path, tiny_tokenizer_dir: Path, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    common = cli(
        model=tiny_tokenizer_dir, data_dir=data_dir, num_prompts=4, max_new_tokens=80, server_log_dir=tmp_path / "logs"
    )

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
    argv = cli(
        model=tiny_tokenizer_dir,
        data_dir=data_dir,
        num_prompts=4,
        max_new_tokens=30,
        server_log_dir=tmp_path / "logs",
        out=out,
        radix_cache=True,
        chunked_prefill_size=16,
        shared_prefix_tokens=24,
        long_prompt_tokens=60,
        attention_backend="flashinfer",
    )
    assert lossless.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["verdict"] == "PASS" and doc["identity"]["identical"] == 5
    s = doc["settings"]
    setup = (s["radix_cache"], s["chunked_prefill_size"], s["shared_prefix_tokens"], s["long_prompt_tokens"])
    assert setup == (True, 16, 24, 60)
    assert s["attention_backend"] == "flashinfer" and doc["prompt_tokens"]["max"] == 60
    table = report.lossless_markdown([doc])
    assert "| pillar flashinfer radix chunk 16 prefix 24 long 60 | 8 | 4 | 30 | PASS |" in table
    last = doc["identity"]["requests"][-1]
    assert last["source"] == "long:60" and last["prompt_len"] == 60
    for name, rec in doc["servers"].items():
        assert "--disable-radix-cache" not in rec["command"]
        assert configs.flag_value(rec["command"], "--chunked-prefill-size") == "16"
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
    assert prompts[-1].input_ids[-len(prompts[0].input_ids) + 24 :] == prompts[0].input_ids[24:]  # ends with a question
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
