"""patches/client_parity.py: stream chunks, reasoning counts and per-request acceptance as plain decoding
would report them, with SGLang's output accumulator stood in for by its own decision rules."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from sglang_sparsespec.patches import client_parity
from sglang_sparsespec.patches.client_parity import (
    PROPOSED,
    accept_like_plain_decoding,
    count_proposed_drafts,
    next_stream_point,
    proposed_drafts_in_meta_info,
)

from sglang_sparsespec.metrics import PillarMetrics
from sglang_sparsespec.rounds.launch import LaunchedRounds


@dataclass
class Acc:
    """The fields of SGLang's _GenerationStreamAccumulator that the hook reads and writes."""

    default_stream_interval: int = 1
    rids: list = field(default_factory=list)
    reasoning_tokens: list = field(default_factory=list)
    completion_tokens: list = field(default_factory=list)
    spec_num_cap_tokens: list = field(default_factory=list)
    sizes: list = field(default_factory=list)


def sglang_accept(acc: Acc, *, req: Any) -> None:
    """SGLang's accept, as far as it decides and records (output_streamer.py): the release the hook takes
    the installed one for (``STOCK_STREAMS_BY_UNSENT``, which the tests set to exercise both)."""
    if req.finished():
        should = True
    else:
        si = req.sampling_params.stream_interval or acc.default_stream_interval
        if client_parity.STOCK_STREAMS_BY_UNSENT:  # 0.5.22: the first token at once, then N unsent
            unsent = len(req.output_ids) - req.send_token_offset
            should = si == 1 or unsent >= si or (req.send_token_offset == 0 and unsent > 0)
        else:  # up to 0.5.21: lengths 1 mod N
            should = len(req.output_ids) % si == 1 if si > 1 else len(req.output_ids) % si == 0
    if not should:
        return
    kept = req.output_ids[: req.finished_len] if req.finished_len is not None else req.output_ids
    acc.sizes.append(len(kept) - req.send_token_offset)
    req.send_token_offset = len(kept)
    acc.rids.append(req.rid)
    acc.reasoning_tokens.append(req.reasoning_tokens)
    acc.completion_tokens.append(len(kept))
    acc.spec_num_cap_tokens.append(req.spec_num_cap_tokens)


def make_req(interval: int | None, **kw: Any) -> SimpleNamespace:
    req = SimpleNamespace(
        rid="r",
        stream=True,
        output_ids=[],
        send_token_offset=0,
        finished_len=None,
        reasoning_tokens=0,
        spec_num_cap_tokens=0,
        sampling_params=SimpleNamespace(stream_interval=interval),
        done=False,
        **kw,
    )
    req.finished = lambda: req.done
    return req


def stream(rounds: list[int], interval: int, hooked: bool) -> list[int]:
    """Chunk sizes a streamed request gets when its output grows by ``rounds`` tokens per step."""
    acc, req = Acc(), make_req(interval)
    for n in rounds:
        req.output_ids.extend([5] * n)
        if hooked:
            accept_like_plain_decoding(sglang_accept, acc, req=req)
        else:
            sglang_accept(acc, req=req)
    return acc.sizes


def test_next_stream_point_follows_plain_decoding():
    assert [next_stream_point(s, 8) for s in (0, 1, 5, 9, 12, 17)] == [1, 9, 9, 17, 17, 25]


@pytest.fixture(params=[False, True], ids=["up-to-0.5.21", "from-0.5.22"])
def stock_by_unsent(request, monkeypatch) -> bool:
    """The hook and the model of SGLang's accept as of each end of the range (contacts.STOCK_STREAMS_BY_UNSENT)."""
    monkeypatch.setattr(client_parity, "STOCK_STREAMS_BY_UNSENT", request.param)
    return request.param


@pytest.fixture
def up_to_0_5_21(monkeypatch) -> None:
    monkeypatch.setattr(client_parity, "STOCK_STREAMS_BY_UNSENT", False)


def test_one_token_per_step_streams_exactly_as_sglang(stock_by_unsent):
    for interval in (1, 2, 8):
        assert stream([1] * 50, interval, hooked=True) == stream([1] * 50, interval, hooked=False)


def test_from_0_5_22_sglang_streams_rounds_by_unsent_count_itself(monkeypatch):
    monkeypatch.setattr(client_parity, "STOCK_STREAMS_BY_UNSENT", True)
    rng = random.Random(0)
    rounds = [rng.randint(1, 9) for _ in range(400)]
    ours = stream(rounds, 8, hooked=True)
    assert ours == stream(rounds, 8, hooked=False) and 7 < sum(ours) / len(ours) < 13


def test_speculative_rounds_stream_every_interval_crossing(up_to_0_5_21):
    rng = random.Random(0)
    rounds = [rng.randint(1, 9) for _ in range(400)]
    stock = stream(rounds, 8, hooked=False)
    ours = stream(rounds, 8, hooked=True)
    assert sum(stock) / len(stock) > 25  # jumps over the 1-mod-8 points
    # A chunk goes out at the first round that reaches a point (1, 9, 17, ...): at most a round past it.
    ends = [sum(ours[: i + 1]) for i in range(len(ours))]
    lengths = [sum(rounds[: i + 1]) for i in range(len(rounds))]
    for a, b in zip(ends, ends[1:]):
        point = next_stream_point(a, 8)
        assert b == min(n for n in lengths if n >= point)
    assert 7 < sum(ours) / len(ours) < 13


def test_the_request_interval_is_restored_and_the_default_applies(up_to_0_5_21):
    acc, req = Acc(default_stream_interval=4), make_req(None)
    req.output_ids.extend([5] * 6)
    accept_like_plain_decoding(sglang_accept, acc, req=req)
    assert acc.sizes == [6] and req.sampling_params.stream_interval is None
    req.output_ids.extend([5] * 2)  # 8 < 9: not due
    accept_like_plain_decoding(sglang_accept, acc, req=req)
    assert acc.sizes == [6]


def test_reasoning_tokens_never_exceed_the_finished_output():
    acc, req = Acc(), make_req(None)
    req.output_ids.extend([5] * 12)
    req.reasoning_tokens, req.finished_len, req.done = 12, 10, True  # a round ran 2 tokens past the stop
    accept_like_plain_decoding(sglang_accept, acc, req=req)
    assert acc.completion_tokens == [10] and acc.reasoning_tokens == [10]
    acc2, req2 = Acc(), make_req(None)
    req2.output_ids.extend([5] * 12)
    req2.reasoning_tokens, req2.done = 4, True
    accept_like_plain_decoding(sglang_accept, acc2, req=req2)
    assert acc2.reasoning_tokens == [4]


def test_per_request_acceptance_counts_the_drafts_each_round_ran():
    """Rounds of 8, 0 (plain) and 2 drafts for two requests: each was proposed 10 drafts, not 3 x 8;
    the count reaches meta_info through the message and prices the accept rate there."""
    metrics, rounds = PillarMetrics(8), LaunchedRounds()
    processor = SimpleNamespace(model_worker=SimpleNamespace(metrics=metrics))
    reqs = [make_req(None, is_retracted=False) for _ in range(2)]
    batch = SimpleNamespace(reqs=reqs)
    for steps, correct in ((8, [7, 8]), (0, [0, 0]), (2, [2, 1])):
        metrics.launched(steps, 2)
        rounds.launched(steps, 2)
        metrics.completed(rounds.completed(correct))
        assert metrics.last_completed_steps == (steps or None)  # a plain round proposes nothing
        count_proposed_drafts(None, processor, None, batch)
    assert [getattr(r, PROPOSED) for r in reqs] == [10, 10]
    acc = Acc()
    reqs[0].output_ids.extend([5] * 21)
    reqs[0].done = True
    accept_like_plain_decoding(sglang_accept, acc, req=reqs[0])
    assert acc.spec_num_cap_tokens == [10]
    manager = SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm="PILLAR"))
    # What SGLang computed for 3 rounds at speculative_num_draft_tokens 9 (three times eight drafts).
    meta = {
        "spec_verify_ct": 3,
        "spec_num_correct_drafts": 9,
        "spec_num_proposed_drafts": 24,
        "spec_proposed_drafts": 24,
        "spec_accept_rate": 9 / 24,
        "spec_cap_length": 10 / 3,
    }
    proposed_drafts_in_meta_info(None, manager, meta, SimpleNamespace(spec_num_cap_tokens=acc.spec_num_cap_tokens), 0)
    assert meta["spec_accept_rate"] == pytest.approx(0.9) and meta["spec_num_proposed_drafts"] == 10
    assert meta["spec_proposed_drafts"] == 10 and "spec_cap_length" not in meta
    plain = {"spec_verify_ct": 3, "spec_num_correct_drafts": 0, "spec_accept_rate": 0.0, "spec_num_proposed_drafts": 24}
    proposed_drafts_in_meta_info(None, manager, plain, SimpleNamespace(spec_num_cap_tokens=[0]), 0)
    assert "spec_accept_rate" not in plain and "spec_num_proposed_drafts" not in plain
    uncounted = {"spec_verify_ct": 3, "spec_num_correct_drafts": 9, "spec_accept_rate": 9 / 24}
    proposed_drafts_in_meta_info(None, manager, uncounted, SimpleNamespace(spec_num_cap_tokens=[0]), 0)
    assert uncounted["spec_accept_rate"] == 9 / 24  # accepted drafts, no count carried: SGLang's figures stay
    eagle = dict(meta, spec_accept_rate=0.5)
    proposed_drafts_in_meta_info(
        None,
        SimpleNamespace(server_args=SimpleNamespace(speculative_algorithm="EAGLE")),
        eagle,
        SimpleNamespace(spec_num_cap_tokens=[10]),
        0,
    )
    assert eagle["spec_accept_rate"] == 0.5  # other algorithms: SGLang's figures


def test_an_unmatched_round_credits_nothing():
    metrics = PillarMetrics(8)
    metrics.completed(LaunchedRounds().completed([1, 1]))  # nothing launched (a warm-up round): no known draft count
    assert metrics.last_completed_steps is None
    req = make_req(None, is_retracted=False)
    count_proposed_drafts(
        None, SimpleNamespace(model_worker=SimpleNamespace(metrics=metrics)), None, SimpleNamespace(reqs=[req])
    )
    assert not hasattr(req, PROPOSED)


def test_sglang_own_accumulator_streams_at_the_interval_and_trims_reasoning():
    """SGLang's _GenerationStreamAccumulator and Req, with the hook as the plugin installs it."""
    pytest.importorskip("sglang")
    import array
    import dataclasses

    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
    from sglang.srt.managers.scheduler_components.output_streamer import _GenerationStreamAccumulator
    from sglang.srt.plugins import load_plugins
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    load_plugins()
    hooked = _GenerationStreamAccumulator.accept
    assert hasattr(hooked, "__wrapped__")

    def accumulator() -> _GenerationStreamAccumulator:
        # The dataclass's fields of the installed release (0.5.23 added the last two).
        given = dict(
            return_logprob=False,
            return_hidden_states=False,
            return_routed_experts=False,
            return_indexer_topk=False,
            spec_algorithm=SpeculativeAlgorithm.from_string("PILLAR"),
            disaggregation_mode=DisaggregationMode.NULL,
            default_stream_interval=1,
            default_force_stream_interval=50,
            get_cached_tokens_details=lambda r: None,
            is_request_level_customized_info_key=lambda key: False,
            current_weight_version=None,
        )
        names = {f.name for f in dataclasses.fields(_GenerationStreamAccumulator)}
        return _GenerationStreamAccumulator(**{k: v for k, v in given.items() if k in names})

    def chunks(accept) -> list[int]:
        rng = random.Random(0)
        req = Req(
            "r", "hi", array.array("q", [1, 2, 3]), SamplingParams(max_new_tokens=1000, stream_interval=8), stream=True
        )
        sizes = []
        for _ in range(60):
            req.output_ids.extend([5] * rng.randint(1, 9))
            acc = accumulator()
            accept(acc, req=req)
            sizes += [len(ids) for ids in acc.output_ids]
        return sizes

    stock, ours = chunks(hooked.__wrapped__), chunks(hooked)
    # Rounds of 1-9 tokens at interval 8: stock up to 0.5.21 jumps over its 1-mod-8 points (the hook sends at
    # them); from 0.5.22 stock sends by unsent count itself and the hook leaves it be.
    assert (sum(stock) / len(stock) > 20) is not client_parity.STOCK_STREAMS_BY_UNSENT
    assert 7 < sum(ours) / len(ours) < 11

    req = Req("f", "hi", array.array("q", [1, 2, 3]), SamplingParams(max_new_tokens=10), stream=True)
    req.output_ids.extend([5] * 12)  # the last round ran two tokens past max_new_tokens
    req.reasoning_tokens, req.finished_len, req.finished_reason = 12, 10, FINISH_LENGTH(length=10)
    setattr(req, PROPOSED, 6)
    acc = accumulator()
    hooked(acc, req=req)
    assert acc.completion_tokens == [10] and acc.reasoning_tokens == [10]
    assert acc.spec_num_cap_tokens == [6] and req.spec_num_cap_tokens == 0  # carried, the Req's own field untouched
