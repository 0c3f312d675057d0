"""patches/finish_check.py: a round's accepted run finishes where stock decoding, one token at a time, would.

SGLang's own ``Req`` and ``SamplingParams``; the reference is the same request fed the same tokens one
``update_finish_state(1)`` call at a time (stock decoding).
"""

from __future__ import annotations

import random
from array import array

import pytest
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, FINISH_MATCHED_TOKEN, Req
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang_sparsespec.patches import finish_check

VOCAB, STOP, EOS = 50, 7, 9
ORIGINAL = Req.update_finish_state


def make_req(max_new_tokens: int, ignore_eos: bool = False) -> Req:
    sp = SamplingParams(max_new_tokens=max_new_tokens, stop_token_ids=[STOP], ignore_eos=ignore_eos)
    sp.normalize(None)
    return Req("r", "", array("i", [1, 2, 3]), sp, eos_token_ids={EOS}, vocab_size=VOCAB)


def run_rounds(req: Req, tokens: list[int], runs: list[int]) -> None:
    """Feed ``tokens`` as accepted runs of the given lengths, as the scheduler does after each round."""
    pos = 0
    for n in runs:
        if req.finished():
            return
        req.output_ids.extend(tokens[pos : pos + n])
        finish_check.stop_before_length(ORIGINAL, req, n)
        pos += n


def outcome(req: Req) -> tuple:
    r = req.finished_reason
    return (type(r).__name__ if r else None, getattr(r, "matched", None), req.finished_len)


@pytest.fixture(autouse=True)
def _pillar(monkeypatch):
    monkeypatch.setattr(finish_check, "_serves_pillar", lambda: True)


def test_stop_token_before_the_length_limit_wins():
    req = make_req(max_new_tokens=5)
    run_rounds(req, [1, 2], [2])
    run_rounds(req, [4, STOP, 5, 6], [4])  # output 1 2 4 STOP | 5 6: the run crosses 5 after the stop
    assert isinstance(req.finished_reason, FINISH_MATCHED_TOKEN) and req.finished_reason.matched == STOP
    assert req.finished_len == 4
    assert list(req.output_ids) == [1, 2, 4, STOP, 5, 6]  # the overshoot stays, cut off by finished_len
    assert list(req.output_ids[: req.finished_len]) == [1, 2, 4, STOP]


def stock_checks_length_first() -> bool:
    """SGLang up to 0.5.17 checks max_new_tokens before stop tokens; 0.5.18 checks stop tokens first. Read
    off the installed release's own check: one token that is a stop token and reaches the limit."""
    req = make_req(max_new_tokens=1)
    req.output_ids.append(STOP)
    ORIGINAL(req, 1)
    return isinstance(req.finished_reason, FINISH_LENGTH)


def test_sglang_alone_finishes_the_run_as_its_release_orders_the_checks(monkeypatch):
    monkeypatch.setattr(finish_check, "_serves_pillar", lambda: False)  # another algorithm: SGLang's check
    req = make_req(max_new_tokens=5)
    run_rounds(req, [1, 2, 4, STOP, 5, 6], [2, 4])
    if stock_checks_length_first():  # 0.5.17: "length", keeping the tokens after the stop
        assert isinstance(req.finished_reason, FINISH_LENGTH) and req.finished_len == 5
    else:
        assert outcome(req) == ("FINISH_MATCHED_TOKEN", STOP, 4)


def test_the_token_reaching_the_limit_ends_as_stock_checks_it():
    req = make_req(max_new_tokens=4)
    run_rounds(req, [1, 2, 4, STOP, 5], [5])
    stock = make_req(max_new_tokens=4)
    run_rounds(stock, [1, 2, 4, STOP, 5], [1] * 5)
    # The length first (0.5.17) or the stop token first (0.5.18 onwards), as stock decoding checks that token.
    expected = ("FINISH_LENGTH", None, 4) if stock_checks_length_first() else ("FINISH_MATCHED_TOKEN", STOP, 4)
    assert outcome(req) == outcome(stock) == expected


@pytest.mark.parametrize("ignore_eos", [False, True])
def test_every_split_into_runs_finishes_as_token_by_token_decoding(ignore_eos):
    rng = random.Random(0)
    for case in range(400):
        max_new = rng.randint(1, 12)
        # Stop tokens, EOS and out-of-vocabulary ids (SGLang's NaN guard) sprinkled in.
        tokens = [rng.choice([STOP, EOS, VOCAB + 1] + list(range(10, 20)) * 4) for _ in range(max_new + 6)]
        stock = make_req(max_new, ignore_eos)
        run_rounds(stock, tokens, [1] * len(tokens))
        runs, left = [], len(tokens)
        while left:
            runs.append(min(left, rng.randint(1, 6)))
            left -= runs[-1]
        pillar = make_req(max_new, ignore_eos)
        run_rounds(pillar, tokens, runs)
        assert outcome(pillar) == outcome(stock), (case, tokens, runs, max_new)
        n = stock.finished_len
        assert pillar.output_ids[:n] == stock.output_ids[:n]
