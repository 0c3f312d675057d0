"""The start-up warm-up (rounds/warmup.py, patches/serve_warmup.py): which batches it sends, that SGLang
accepts them as requests, and that the worker's warm-up rounds take every draft count and teach the
adaptive policy and the metrics nothing."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_sparsespec.adaptive.policy import batch_bucket
from sglang_sparsespec.rounds.warmup import (
    SAMPLING_SHAPES,
    WARMUP_RID_PREFIX,
    batch_sizes,
    is_warmup,
    probe_batches,
    warmup_plan,
    warmup_steps,
)
from sglang_sparsespec.selection.head_probe import PROBE_TRIALS


@pytest.mark.parametrize("cap", [1, 2, 3, 48, 256, 1000])
def test_batch_sizes_reach_every_power_of_two_bucket_up_to_the_cap(cap):
    sizes = batch_sizes(cap)
    assert sizes[-1] == cap and sizes == sorted(set(sizes))
    # SGLang's assign_req_to_token_pool compiles one variant per next_power_of_2(batch size).
    assert {batch_bucket(b) for b in range(1, cap + 1)} == {batch_bucket(s) for s in sizes}


def test_plan_allocates_kv_at_odd_and_even_slots():
    """Triton specialises SGLang's slot-list pointers on 16-byte alignment: a batch whose tokens add up
    to an odd count may shift the next allocation to an odd int64 slot (on the GPU not enough alone:
    patches/slot_warmup.py builds the unaligned variant directly)."""
    plan = warmup_plan(8, 49152)
    assert plan[0].size == 1 and len(plan[0].input_ids[0]) % 2 == 1


def test_batch_sizes_reject_a_cap_below_one():
    with pytest.raises(ValueError):
        batch_sizes(0)


def test_plan_covers_every_size_and_sampling_shape_with_distinct_in_vocab_prompts():
    vocab = 49152
    plan = warmup_plan(16, vocab)
    assert [
        (b.size, {k: v for k, v in b.sampling.items() if k not in ("max_new_tokens", "ignore_eos")}) for b in plan[:-1]
    ] == [(s, shape) for s in batch_sizes(16) for shape in SAMPLING_SHAPES]
    rids = [r for b in plan for r in b.rids]
    assert len(rids) == len(set(rids)) and all(r.startswith(WARMUP_RID_PREFIX) for r in rids)
    # The last batch replays the cap's greedy prompts: each prefill then extends a cached prefix.
    cap_greedy = plan[-1 - len(SAMPLING_SHAPES)]
    assert (cap_greedy.size, cap_greedy.sampling["temperature"]) == (16, 0.0)
    assert plan[-1].input_ids == cap_greedy.input_ids and plan[-1].sampling == cap_greedy.sampling
    plan = plan[:-1]
    prompts = [tuple(p) for b in plan for p in b.input_ids]
    assert len({p[0] for p in prompts}) == len(prompts)  # no two share a first token: no radix hit
    assert all(0 <= t < vocab for p in prompts for t in p)
    for b in plan:
        assert len(b.input_ids) == len(b.rids) == b.size
        assert b.sampling["ignore_eos"] is True and b.sampling["max_new_tokens"] >= 4 * 9


def test_sampling_shapes_are_valid_sglang_params_and_take_each_verify_path():
    """Greedy, sampled with top_k off and with a small top_k, and the filter's min-p variant."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    kinds = set()
    for shape in SAMPLING_SHAPES:
        params = SamplingParams(**shape)
        params.normalize(None)
        params.verify(49152)
        greedy = params.temperature == 0 or params.top_k == 1
        kinds.add(("greedy",) if greedy else ("sampled", params.top_k <= 64, params.min_p > 0))
    assert kinds == {("greedy",), ("sampled", False, False), ("sampled", True, False), ("sampled", True, True)}


def test_plan_ends_with_a_batch_whose_prefill_outgrows_the_chunk():
    base = warmup_plan(64, 49152)
    plan = warmup_plan(64, 49152, chunk_tokens=8192, context_len=8192)
    assert plan[: len(base)] == base and len(plan) == len(base) + 1
    last = plan[-1]
    assert last.size == 64 and sum(len(p) for p in last.input_ids) > 8192
    assert all(2 * (len(p) + last.sampling["max_new_tokens"]) <= 8192 for p in last.input_ids)
    distinct = plan[: len(base) - 1] + plan[len(base) :]  # all but the replay of cached prompts
    assert len({p[0] for b in distinct for p in b.input_ids}) == sum(b.size for b in distinct)
    # No chunking (SGLang's -1) or prompts that cannot fit the context: no such batch.
    assert warmup_plan(64, 49152, chunk_tokens=-1, context_len=8192) == base
    assert warmup_plan(1, 49152, chunk_tokens=8192, context_len=8192) == warmup_plan(1, 49152)
    assert warmup_plan(2, 49152, chunk_tokens=4096, context_len=4096) == warmup_plan(2, 49152)


def test_a_context_too_short_for_a_warmup_request_gets_an_empty_plan():
    assert warmup_plan(8, 49152, context_len=129) == []
    assert warmup_plan(8, 49152, context_len=130) == warmup_plan(8, 49152)


def test_plan_rejects_a_vocabulary_too_small_for_its_prompts():
    with pytest.raises(ValueError):
        warmup_plan(4, 110)


class _Req:
    def __init__(self, rid):
        self.rid = rid


def test_a_batch_is_a_warmup_batch_only_when_every_request_is_one():
    """With several tokenizer workers one serves clients while another still warms up: their requests
    share batches, and a client's request must never run an unmeasured, uncounted warm-up round."""
    warm, client = _Req(WARMUP_RID_PREFIX + "3"), _Req("9f1c2ab0e4")
    assert is_warmup([warm, _Req(WARMUP_RID_PREFIX + "4")])
    assert not is_warmup([client]) and not is_warmup([])
    assert not is_warmup([warm, client]) and not is_warmup([client, warm])


def test_each_tokenizer_worker_warms_up_under_rids_of_its_own():
    """Each worker runs the plan as it starts; the same rids from two workers are live at once at the
    scheduler, which refuses a live rid (patches/live_rids.py)."""
    plans = [warmup_plan(8, 49152, tag=tag) for tag in ("101-", "102-")]
    rids = [{r for batch in plan for r in batch.rids} for plan in plans]
    assert not rids[0] & rids[1] and all(r.startswith(WARMUP_RID_PREFIX) for r in rids[0] | rids[1])
    assert [b.input_ids for b in plans[0]] == [b.input_ids for b in plans[1]]


@pytest.mark.parametrize("candidates", [(8,), (0, 2, 4, 8), (2, 8)])
def test_any_run_of_warmup_rounds_as_long_as_the_candidates_takes_every_draft_count(candidates):
    for start in range(7):
        assert {warmup_steps(candidates, start + i) for i in range(len(candidates))} == set(candidates)


def test_planner_warmup_rounds_cycle_the_draft_counts_and_teach_nothing():
    from sglang_sparsespec.config import PillarConfig
    from sglang_sparsespec.metrics import PillarMetrics
    from sglang_sparsespec.adaptive.policy import SpeculationPolicy
    from sglang_sparsespec.adaptive.dense import DenseChooser
    from sglang_sparsespec.patches.round_plan import RoundPlanner
    from sglang_sparsespec.rounds.clock import NoClock
    from sglang_sparsespec.rounds.launch import RoundShape
    from planner_parts import plain_sampling

    cfg = PillarConfig.from_env(8)
    planner = RoundPlanner(cfg, PillarMetrics(8), NoClock(), policy=SpeculationPolicy(cfg.step_candidates))
    planner.set_dense(DenseChooser(lambda n: min(n, 128), 23040, 30, lambda bs: 22))
    planner._choose = lambda batch, single: (
        RoundShape(4),
        None,
    )  # the adaptive path, stubbed: only warm-up is under test
    plain = plain_sampling()
    warm = SimpleNamespace(reqs=[_Req(WARMUP_RID_PREFIX + str(i)) for i in range(3)], sampling_info=plain)
    shapes = [planner.shape(warm) for _ in range(8)]
    assert [s for s, _, _ in shapes] == [*cfg.step_candidates] * (8 // len(cfg.step_candidates))
    assert all(d is None and n is None for _, d, n in shapes)
    assert sum(planner.metrics.rounds_by_steps.values()) == 0 and not planner.policy.table.cells
    # Their accept counts arrive after warm-up and match no launched round.
    planner.completed([8, 8, 8])
    assert planner.policy.acceptance.alpha == pytest.approx(0.7) and planner.metrics.accepted_per_pos == [0] * 8
    real = SimpleNamespace(reqs=[_Req("9f1c2ab0e4")], sampling_info=plain)
    assert planner.shape(real) == RoundShape(4)
    assert planner.metrics.rounds_by_steps[4] == 1


class _FakeTokenizerManager:
    """What pillar_warmup uses of SGLang's TokenizerManager; each request is normalized by SGLang's own
    GenerateReqInput code, as generate_request does first."""

    def __init__(self, max_running_requests: int, vocab_size: int):
        self.server_args = type(
            "SA",
            (),
            {"max_running_requests": max_running_requests, "chunked_prefill_size": 64, "speculative_num_steps": 8},
        )()
        self.model_config = type("MC", (), {"vocab_size": vocab_size, "context_len": 8192})()
        self.requests = []

    async def generate_request(self, obj, request=None):
        obj.normalize_batch_and_arguments()
        self.requests.append(obj)
        yield [{"text": ""}] * obj.batch_size


def test_pillar_warmup_sends_the_plan_as_sglang_batch_requests():
    from sglang_sparsespec.patches.serve_warmup import pillar_warmup

    tm = _FakeTokenizerManager(4, 49152)
    asyncio.run(pillar_warmup("null", tm))
    plan = warmup_plan(4, 49152, chunk_tokens=64, context_len=8192, tag=f"{os.getpid()}-")
    assert sum(len(p) for p in plan[-1].input_ids) > 64  # the chunked batch went too
    assert len(tm.requests) == len(plan)
    for obj, batch in zip(tm.requests, plan):
        assert obj.is_single is False and obj.batch_size == batch.size
        assert obj.rid == batch.rids and obj.input_ids == batch.input_ids
        assert obj.sampling_params == [batch.sampling] * batch.size


def test_with_auto_match_heads_the_warmup_probes_first_where_a_chunk_holds_the_probe(monkeypatch):
    from sglang_sparsespec.patches.serve_warmup import pillar_warmup

    monkeypatch.setenv("SPARSESPEC_MATCH_HEADS", "64@auto")
    tm = _FakeTokenizerManager(4, 49152)
    tm.server_args.chunked_prefill_size = 2048
    asyncio.run(pillar_warmup("null", tm))
    tag = f"{os.getpid()}-"
    probes, plan = probe_batches(49152, None, tag), warmup_plan(4, 49152, 2048, 8192, tag)
    assert len(probes) == PROBE_TRIALS and [r.rid for r in tm.requests] == [b.rids for b in probes + plan]
    assert tm.requests[0].input_ids == probes[0].input_ids
    tm = _FakeTokenizerManager(4, 49152)  # 64-token chunks: no probe fits, the plan goes alone
    asyncio.run(pillar_warmup("null", tm))
    assert len(tm.requests) == len(warmup_plan(4, 49152, 64, 8192, tag))


def test_pillar_warmup_sends_the_whole_plan_to_each_data_parallel_replica():
    from sglang_sparsespec.patches.serve_warmup import pillar_warmup

    tm = _FakeTokenizerManager(4, 49152)
    tm.server_args.dp_size = 2
    asyncio.run(pillar_warmup("null", tm))
    plan = warmup_plan(4, 49152, chunk_tokens=64, context_len=8192, tag=f"{os.getpid()}-")
    assert len(tm.requests) == 2 * len(plan)
    for rank in (0, 1):
        sent = tm.requests[rank * len(plan) : (rank + 1) * len(plan)]
        assert [r.routed_dp_rank for r in sent] == [rank] * len(plan)
        assert [(r.batch_size, r.rid) for r in sent] == [(b.size, b.rids) for b in plan]
    # One replica: SGLang routes as usual (no rank named).
    tm = _FakeTokenizerManager(4, 49152)
    asyncio.run(pillar_warmup("null", tm))
    assert {r.routed_dp_rank for r in tm.requests} == {None}


def test_pillar_warmup_skips_disaggregated_servers_and_tiny_contexts():
    from sglang_sparsespec.patches.serve_warmup import pillar_warmup

    tm = _FakeTokenizerManager(4, 49152)
    asyncio.run(pillar_warmup("prefill", tm))
    tm.model_config.context_len = 100
    asyncio.run(pillar_warmup("null", tm))
    assert tm.requests == []


def _compiled_kernels() -> set[str]:
    """The compiled kernels in Triton's on-disk cache (one folder per kernel variant)."""
    root = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    return {str(p.relative_to(root)) for p in root.glob("*/*.cubin")}


def _specialisation(variant: str) -> str:
    """A compiled variant's signature line from its Triton IR (``<kernel>.ttir`` beside the cubin):
    which pointer arguments were specialised as 16-byte aligned (``tt.divisibility = 16``), the
    difference that made the warm-up miss SGLang's write_req_to_token_pool_triton variant
    (write_req_variants_ttir_bf21a0d.txt). Triton's metadata JSON does not carry it."""
    root = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    ttir = root / variant.replace(".cubin", ".ttir")
    lines = ttir.read_text().splitlines() if ttir.exists() else []
    head = next((line for line in lines if "tt.func public" in line), "no Triton IR")
    return variant + ": " + re.sub(r" loc\([^)]*\)", "", head).strip()


@pytest.mark.skipif(
    not torch.cuda.is_available() or not os.environ.get("SPARSESPEC_TEST_MODEL"),
    reason="needs CUDA and SPARSESPEC_TEST_MODEL (a model folder)",
)
def test_no_kernel_compiles_while_serving_after_the_warmup(tmp_path):
    """What the warm-up is for: once the server listens, batches of sizes and sampling settings the
    warm-up never ran exactly (odd sizes, longer prompts, both verify filter paths) build nothing."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.server import Server, http_json

    flags = [
        "--attention-backend",
        "triton",
        "--page-size",
        "1",
        "--speculative-algorithm",
        "PILLAR",
        "--speculative-num-steps",
        "8",
        "--context-length",
        "4096",
        "--max-running-requests",
        "128",
        "--mem-fraction-static",
        "0.6",
    ]
    with Server.sglang(os.environ["SPARSESPEC_TEST_MODEL"], flags, log_path=tmp_path / "server.log") as srv:
        srv.start(timeout_s=600)
        before = _compiled_kernels()
        params = (
            {"temperature": 0.0},
            {"temperature": 0.6, "top_p": 0.95},
            {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
        )
        for size in (3, 24, 100):
            for sp in params:
                body = lambda i: {  # noqa: E731
                    "input_ids": [200 + (i * 13 + j) % 40000 for j in range(300)],
                    "sampling_params": {**sp, "max_new_tokens": 96, "ignore_eos": True},
                }
                with ThreadPoolExecutor(size) as pool:
                    list(pool.map(lambda i: http_json(srv.base_url + "/generate", body(i), timeout=300), range(size)))
        new = _compiled_kernels() - before
    assert "PILLAR warm-up:" in (tmp_path / "server.log").read_text()
    assert not new, "compiled while serving: " + " | ".join(_specialisation(v) for v in sorted(new))


def test_slot_kernels_build_on_a_scratch_row_with_sglangs_signature():
    """The start-up launch of SGLang's write_req_to_token_pool_triton (both out_cache_loc
    alignments) runs with the arguments SGLang's write_cache_indices passes and leaves the pool alone."""
    from sglang_sparsespec.patches.slot_warmup import build_slot_kernels

    device = "cuda" if torch.cuda.is_available() else "cpu"
    pool = torch.full((4, 96), 7, dtype=torch.int32, device=device)
    build_slot_kernels(pool)  # raises if the kernel wrote nothing
    assert (pool == 7).all()
