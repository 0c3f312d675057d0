"""Plain-decoding rounds on the decode path (SPARSESPEC_PLAIN_PATH=decode): which batches take it, and the
result the worker hands SGLang's scheduler (its layout must match the width-1 verify's: one token per
request, accept length 1, seq_lens + 1, the token relayed as the next round's pending token)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang_sparsespec.patches.request_rounds import decode_path_serves
from sglang_sparsespec.patches.rounds import Rounds
from sglang_sparsespec.patches.verify import Pools

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.modes import PlainPath, SelectionPolicy
from sglang_sparsespec.metrics import PillarMetrics
from sglang_sparsespec.rounds.launch import RoundShape


def sampling_info(**over) -> SimpleNamespace:
    base = dict(
        penalizer_orchestrator=SimpleNamespace(is_required=False),
        acc_additive_penalties=None,
        acc_scaling_penalties=None,
        logit_bias=None,
        has_custom_logit_processor=False,
        return_sampling_masks=None,
    )
    return SimpleNamespace(**(base | over))


def batch(si=None, **over) -> SimpleNamespace:
    base = dict(return_logprob=False, return_hidden_states=False, has_grammar=False)
    return SimpleNamespace(sampling_info=si or sampling_info(), **(base | over))


def test_decode_path_serves_only_what_the_sampler_alone_gives():
    assert decode_path_serves(batch())
    assert decode_path_serves(batch(sampling_info(penalizer_orchestrator=None, return_sampling_masks=[False])))
    for b in (
        batch(return_logprob=True),
        batch(return_hidden_states=True),
        batch(has_grammar=True),
        batch(sampling_info(penalizer_orchestrator=SimpleNamespace(is_required=True))),
        batch(sampling_info(acc_additive_penalties=torch.zeros(1))),
        batch(sampling_info(acc_scaling_penalties=torch.ones(1))),
        batch(sampling_info(logit_bias=torch.zeros(1))),
        batch(sampling_info(has_custom_logit_processor=True)),
        batch(sampling_info(return_sampling_masks=[False, True])),
    ):
        assert not decode_path_serves(b)


def test_the_decode_path_is_the_default_knob_and_refuses_the_oracle():
    assert PillarConfig().plain_path is PlainPath.DECODE
    assert PillarConfig.from_env(8, {"SPARSESPEC_POLICY": "oracle"}).plain_path is PlainPath.VERIFY
    assert PillarConfig.from_env(8, {"SPARSESPEC_PLAIN_PATH": "verify"}).plain_path is PlainPath.VERIFY
    assert PillarConfig.from_env(8, {"SPARSESPEC_PLAIN_PATH": "DECODE"}).plain_path is PlainPath.DECODE
    with pytest.raises(ValueError, match="SPARSESPEC_PLAIN_PATH='x'"):
        PillarConfig.from_env(8, {"SPARSESPEC_PLAIN_PATH": "x"})
    with pytest.raises(ValueError, match="oracle"):
        PillarConfig(plain_path=PlainPath.DECODE, policy=SelectionPolicy.ORACLE)


class Runner:
    """The draft runner's decode step: fixed logits, the call recorded."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.plain_logits, self.logits, self.calls = logits, logits, []
        self.vocab = None  # no draft vocabulary

    def decode_logits(self, rpi, seq_lens, tokens):
        self.calls.append((rpi, seq_lens, tokens))
        return self.logits, True


def test_a_plain_round_on_the_decode_path_hands_the_scheduler_one_sampled_token_per_request():
    logits = torch.tensor([[0.0, 5.0, 1.0], [9.0, 0.0, 0.0]])
    sampled = []

    def sampler(out, si, return_logprob, top_n, ids, positions):  # SGLang's Sampler.forward signature
        assert out.next_token_logits is logits and not return_logprob
        sampled.append(positions.tolist())
        return out.next_token_logits.argmax(dim=-1)  # an all-greedy batch

    clock = SimpleNamespace(calls=[])
    clock.start_plain, clock.end = lambda: clock.calls.append("start_plain"), lambda: clock.calls.append("end")
    metrics = PillarMetrics(8)
    planner = SimpleNamespace(shape=lambda b: RoundShape(0))  # this round: plain
    target = SimpleNamespace(
        model_runner=SimpleNamespace(sampler=sampler, attn_backend=None, decode_cuda_graph_runner=None)
    )
    rounds = Rounds(
        PillarConfig.from_env(8),
        Pools(target, None, None, None),
        planner,
        clock,
        metrics,
        selector=None,
        draft_runner=Runner(logits),
        mixed=None,
        plain=None,
        max_bs=4,
        device="cpu",
    )
    b = batch(
        req_pool_indices=torch.tensor([3, 4]),
        seq_lens=torch.tensor([10, 20]),
        reqs=[SimpleNamespace(rid="a")],
        spec_info=SimpleNamespace(bonus_tokens=torch.tensor([7, 8], dtype=torch.int32)),
    )
    published = []
    result = rounds.decode(b, published.append, None)
    rpi, seq_lens, tokens = rounds.draft_runner.calls[0]
    assert tokens.tolist() == [7, 8] and seq_lens.tolist() == [10, 20] and sampled == [[10, 20]]
    assert result.next_token_ids.tolist() == [1, 0] and result.next_token_ids.dtype == torch.int32
    assert result.accept_lens.tolist() == [1, 1] and result.speculative_num_draft_tokens == 1
    assert result.new_seq_lens.tolist() == [11, 21] and published[0] is result.new_seq_lens
    assert result.next_draft_input.bonus_tokens.tolist() == [1, 0] and result.can_run_cuda_graph
    assert result.next_draft_input.topk_p.shape == result.next_draft_input.topk_index.shape == (2, 1)
    with pytest.raises(RuntimeError, match="exceeds max running requests"):
        rounds._relay(torch.zeros(5, dtype=torch.int32))
    assert result.logits_output.hidden_states is None and clock.calls == ["start_plain", "end"]
    assert metrics.summary()["plain_decode_rounds"] == 1  # counted for /server_info
