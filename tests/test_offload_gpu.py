"""GPU: the offload-aware KV pool corrupts nothing under 2x oversubscription with aborts mixed in.

Needs CUDA and the SmolLM2 folder (``SPARSESPEC_TEST_MODEL=$(python -m sglang_sparsespec.models.smollm2 | tail -1)``).
An unpressured stock server answers N greedy requests (the reference); then a server whose pool
holds half their demand, with ``SPARSESPEC_OFFLOAD_HOST_GB`` set, answers them again while a few
others are aborted mid-flight (some of them parked at the time). Every completed request must be
token-identical to the reference, no request may be retracted, some must have been parked and
restored, and the server must survive (SGLang's idle leak check kills the scheduler on a leaked slot).
Admission counts the host budget (docs/offload.md), so all requests run at once in every
parametrisation; without it SGLang queues ignore_eos requests (radix off) and nothing is parked.
The pool is half of (short demand + 36,000 aborted tokens) and the 24 short requests' demand is
above 36,000, so they alone exceed the pool: at least one of them is parked and restored whatever
the abort timing.

The radix-cache case with shared prefixes and chunked prefill: requests that share a long system
prompt (a prefix cache hit for all but the first), long prompts prefilled in 256-token chunks, sent
16 at a time so new prefills keep joining a running batch that is being parked. Judged against an
unpressured stock server with the same flags and arrival pattern.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import torch

MODEL = os.environ.get("SPARSESPEC_TEST_MODEL")
pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and MODEL), reason="needs CUDA and SPARSESPEC_TEST_MODEL"
)

N, MAX_NEW, ABORTED = 24, 1500, 6


def _serve(config, extra, radix, env, log, prompts, abort_rids=(), top2=False, concurrency=None):
    from benchmarks.client import generate_all
    from benchmarks.configs import resolve_config
    from benchmarks.server import Server, http_json, scheduler_state

    flags = list(resolve_config(config, tuple(extra)).flags)
    if radix:
        flags.remove("--disable-radix-cache")
    server = Server.sglang(MODEL, flags, log_path=log, env=env)
    with server:
        server.start(timeout_s=900)
        url = server.base_url
        stop = threading.Event()

        def abort_later():  # abort while the pool is full, i.e. while requests are parked
            time.sleep(8)
            for rid in abort_rids:
                if stop.is_set():
                    return
                http_json(url + "/abort_request", {"rid": rid}, timeout=30)
                time.sleep(0.5)

        victims = [
            {
                "input_ids": p,
                "sampling_params": {"max_new_tokens": 6000, "ignore_eos": True, "temperature": 0.0},
                "rid": rid,
            }
            for p, rid in zip(prompts, abort_rids)
        ]
        threads = [threading.Thread(target=lambda b=b: _post(url, b)) for b in victims]
        threads.append(threading.Thread(target=abort_later))
        for t in threads:
            t.start()
        sampling = {"temperature": 0.0, "max_new_tokens": MAX_NEW, "ignore_eos": True}
        outs = generate_all(
            server, prompts, sampling, concurrency=concurrency or len(prompts), timeout_s=1800, top2=top2
        )
        stop.set()
        for t in threads:
            t.join(timeout=120)
        time.sleep(5)  # the scheduler goes idle and runs its leak check
        server.check_alive()
        info = http_json(url + "/server_info", timeout=30)
    return outs, scheduler_state(info), Path(log).read_text(errors="replace")


def _post(url, body):
    from benchmarks.server import http_json

    try:
        http_json(url + "/generate", body, timeout=1800)
    except OSError:
        pass  # an aborted request's connection may close without a reply


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    from benchmarks.workload import load_tokenizer

    tok = load_tokenizer(MODEL)
    return [tok.encode(f"Problem {i}: write a long story about the number {i * 37 % 101}.") for i in range(N)]


@pytest.fixture(scope="module")
def references(prompts, tmp_path_factory):
    """The unpressured stock outputs per radix setting, served once for both configs (a server start
    is most of a case's time)."""
    refs: dict[bool, list] = {}

    def get(radix: bool) -> list:
        if radix not in refs:
            log = tmp_path_factory.mktemp("ref") / "ref.log"
            refs[radix] = _serve("stock", (), radix, {}, log, prompts, top2=True)[0]
        return refs[radix]

    return get


@pytest.mark.parametrize("config", ["stock", "pillar-k4"])
@pytest.mark.parametrize("radix", [False, True])
def test_no_corruption_under_2x_oversubscription_with_aborts(config, radix, prompts, references, tmp_path):
    from benchmarks.checks.identity import compare_outputs

    ref = references(radix)
    demand = sum(len(p) + MAX_NEW for p in prompts) + ABORTED * 6000
    extra = ("--max-total-tokens", str(demand // 2))
    env = {"SPARSESPEC_OFFLOAD_HOST_GB": "4"}
    aborted = [f"abort-{i}" for i in range(ABORTED)]
    outs, state, log = _serve(config, extra, radix, env, tmp_path / "offload.log", prompts, abort_rids=aborted)
    assert "Retract requests" not in log
    assert state["offload"]["parks"] > 0 and state["offload"]["restores"] > 0, state.get("offload")
    assert state["offload"]["parked_now"] == 0
    # Corrupted KV diverges where stock was sure; batch-shape rounding only where it was at a near tie.
    ident = compare_outputs(ref, outs, early=MAX_NEW)
    bad = [r for r in ident["requests"] if not r["identical"] and not r.get("near_tie")]
    assert not bad, _divergences(bad)


def _divergences(bad: list[dict]) -> str:
    """Where each bad request left the reference and how sure stock was there: a margin near the
    near-tie bound reads as rounding, a wide one as wrong KV."""
    keys = ("index", "first_divergence", "reference_margin", "reference_window", "candidate_window")
    return "; ".join(str({k: r.get(k) for k in keys}) for r in bad[:3])


SHARED_N, SHARED_CONCURRENCY, CHUNK = 48, 16, 256


@pytest.fixture(scope="module")
def shared_prompts() -> list[list[int]]:
    """One ~700-token system prompt shared by every request (longer than a chunk, so the first request
    is prefilled in chunks), then a private question; every fourth question is long (~400 tokens), so
    its private part is prefilled in chunks after the prefix hit."""
    from benchmarks.workload import load_tokenizer

    tok = load_tokenizer(MODEL)
    system = tok.encode(
        " ".join(f"Rule {i}: answer questions about the number {i} at length and with care." for i in range(48))
    )
    assert len(system) > CHUNK
    prompts = []
    for i in range(SHARED_N):
        question = tok.encode(f" Question {i}: tell a long story about the number {i * 37 % 101}.")
        prompts.append(system + question * (30 if i % 4 == 0 else 1))
    assert len(prompts[0]) - len(system) > CHUNK
    return prompts


CHUNKED = ("--chunked-prefill-size", str(CHUNK))


@pytest.fixture(scope="module")
def shared_reference(shared_prompts, tmp_path_factory) -> list:
    """An unpressured stock server's outputs, radix cache on, same chunking and arrivals."""
    log = tmp_path_factory.mktemp("shared_ref") / "ref.log"
    return _serve("stock", CHUNKED, True, {}, log, shared_prompts, top2=True, concurrency=SHARED_CONCURRENCY)[0]


@pytest.mark.parametrize("config", ["stock", "pillar-k4"])
def test_radix_shared_prefixes_and_chunked_prefill_under_parking(config, shared_prompts, shared_reference, tmp_path):
    from benchmarks.checks.identity import compare_outputs

    chunked, ref = CHUNKED, shared_reference
    # Half of what the requests in flight at once hold at their longest (the shared prefix counted once).
    shared = len(os.path.commonprefix(shared_prompts))
    longest = sorted((len(p) - shared for p in shared_prompts), reverse=True)[:SHARED_CONCURRENCY]
    pool = (shared + sum(longest) + SHARED_CONCURRENCY * MAX_NEW) // 2
    env = {"SPARSESPEC_OFFLOAD_HOST_GB": "4"}
    outs, state, log = _serve(
        config,
        (*chunked, "--max-total-tokens", str(pool)),
        True,
        env,
        tmp_path / "offload.log",
        shared_prompts,
        concurrency=SHARED_CONCURRENCY,
    )
    assert "Retract requests" not in log
    assert state["offload"]["parks"] > 0 and state["offload"]["restores"] > 0, state.get("offload")
    assert state["offload"]["parked_now"] == 0  # and nothing leaked on host at idle:
    assert state["offload"]["host_tokens_free"] == state["offload"]["host_tokens"]
    ident = compare_outputs(ref, outs, early=MAX_NEW)
    bad = [r for r in ident["requests"] if not r["identical"] and not r.get("near_tie")]
    assert not bad, _divergences(bad)
