"""``--pillar-match-heads N@auto`` (patches/probe_capture.py): the warm-up's probe prefills score every KV head
through the q and k the model hands attention, and the highest are listed in place; other forwards are not hooked."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.patches.probe_capture import HeadProbe
from sglang_sparsespec.patches.rounds import Rounds
from sglang_sparsespec.patches.verify import Pools
from sglang_sparsespec.rounds.warmup import PROBE_RID_MARK, WARMUP_RID_PREFIX, is_probe, probe_batches
from sglang_sparsespec.selection.head_probe import PROBE_LENGTH, PROBE_TRIALS
from sglang_sparsespec.selection.match_heads import match_heads_of

H_Q, H_KV, D, LAYERS = 4, 2, 8, 3


class RadixAttention(torch.nn.Module):
    """SGLang's attention module as the probe reads it: forward(q, k, v, forward_batch) and its head fields."""

    def __init__(self, layer_id: int) -> None:
        super().__init__()
        self.layer_id, self.tp_q_head_num, self.tp_k_head_num, self.qk_head_dim = layer_id, H_Q, H_KV, D
        self.scaling, self.logit_cap = 0.5, 0.0
        self.calls = 0

    def forward(self, q, k, v, forward_batch):
        self.calls += 1
        return q


class Model(torch.nn.Module):
    """Each layer attends the probe's q and k: layer 2's KV head 1 keys every first occurrence with its query."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(RadixAttention(i) for i in range(LAYERS))

    def forward(self, tokens: int) -> None:
        gen = torch.Generator().manual_seed(tokens)
        offset = tokens - 2 * PROBE_LENGTH
        for layer in self.layers:
            q = torch.randn(tokens, H_Q * D, generator=gen)
            k = torch.randn(tokens, H_KV, D, generator=gen)
            if layer.layer_id == 2 and offset >= 0:
                second = torch.arange(offset + PROBE_LENGTH, tokens)
                k[second - PROBE_LENGTH, 1] = 4 * q.view(tokens, H_Q, D)[second, 2]  # a duplicate-token head
            if layer.layer_id == 1:  # by keyword, as a model may call it
                layer(q=q, k=k.view(tokens, -1), v=None, forward_batch=None)
            else:
                layer(q, k.view(tokens, -1), None, None)


def test_probe_prefills_list_the_heads_that_look_their_tokens_up_and_no_other_forward_is_hooked(caplog) -> None:
    caplog.set_level(logging.INFO)
    model, heads = Model(), match_heads_of("8@auto:2", LAYERS, H_KV, torch.device("cpu"))
    probe = HeadProbe(model, heads)
    assert len(probe.modules) == LAYERS
    tokens = 1 + 2 * PROBE_LENGTH  # a BOS, then the sequence twice
    with probe.capture(tokens):
        model(tokens)
    assert probe.probes == 1 and probe.missed == 0
    assert heads.rows[2].tolist()[1] >= 0 and 5 in heads.groups.tolist()  # layer 2, head 1 = group 5
    assert "PILLAR match heads after probe 1: --pillar-match-heads " in caplog.text and "2.1" in caplog.text
    scores = probe.scores.clone()
    model(tokens)  # not a probe: nothing is scored
    assert torch.equal(probe.scores, scores)
    table = heads.table.clone()
    with probe.capture(tokens):
        model(tokens - 7)  # a call holding other tokens (a cached prefix, a split chunk) is not scored
    assert probe.missed == LAYERS and torch.equal(probe.scores, scores)
    with probe.capture(tokens):
        pass  # a prefill whose attention ran where no hook reaches: nothing scored, nothing assigned
    assert probe.probes == 1 and probe.scored == LAYERS and torch.equal(heads.table, table)
    with probe.capture(tokens + 5):
        model(tokens + 5)  # not a probe sequence shown twice: no hook is installed, so no call is even counted
    assert probe.probes == 1 and probe.scored == LAYERS and probe.missed == LAYERS and "is no probe" in caplog.text
    with pytest.raises(ValueError, match="N@auto"):
        HeadProbe(model, match_heads_of("8@1.0", LAYERS, H_KV, torch.device("cpu")))


def test_the_warmup_sends_the_probes_first_as_one_request_batches_the_rounds_recognise() -> None:
    probes = probe_batches(49152, 1, "7-", chunk_tokens=8192, context_len=8192)
    assert len(probes) == PROBE_TRIALS and all(b.size == 1 for b in probes)
    seq = probes[0].input_ids[0]
    assert len(seq) == 1 + 2 * PROBE_LENGTH and seq[0] == 1 and seq[1 : 1 + PROBE_LENGTH] == seq[1 + PROBE_LENGTH :]
    assert probes[0].sampling == {"temperature": 0.0, "max_new_tokens": 1}
    assert probes[1].input_ids != probes[0].input_ids and probe_batches(49152, 1, "8-")[0].input_ids == [seq]
    rid = probes[0].rids[0]
    assert rid.startswith(WARMUP_RID_PREFIX) and PROBE_RID_MARK in rid
    assert is_probe([SimpleNamespace(rid=rid)]) and not is_probe([SimpleNamespace(rid=rid)] * 2)
    assert not is_probe([SimpleNamespace(rid=f"{WARMUP_RID_PREFIX}7-3")])
    assert not is_probe([SimpleNamespace(rid=f"client-{PROBE_RID_MARK}1")])  # a client's rid may hold the mark
    assert probe_batches(49152, 1, chunk_tokens=256) == [] and probe_batches(49152, None, context_len=700) == []
    assert probe_batches(2100, 1) == []  # too few ids for 200 random ones


def test_a_prefill_is_hooked_only_for_a_probe_request() -> None:
    model, heads = Model(), match_heads_of("8@auto:2", LAYERS, H_KV, torch.device("cpu"))
    seen = []

    def forward_batch_generation(batch):
        model(len(batch.reqs[0].origin_input_ids))
        seen.append(heads.table.clone())
        return SimpleNamespace(next_token_ids=torch.tensor([5]))

    target = SimpleNamespace(
        forward_batch_generation=forward_batch_generation,
        model_runner=SimpleNamespace(attn_backend=None, decode_cuda_graph_runner=None),
    )
    rounds = Rounds(
        PillarConfig.from_env(8), Pools(target, None, None, None), None, SimpleNamespace(interrupt=lambda: None),
        None, SimpleNamespace(after_prefill=lambda *a: None), SimpleNamespace(vocab=None), None, None, 4, "cpu",
        probe=HeadProbe(model, heads),
    )  # fmt: skip
    ids = probe_batches(49152, 1)[0].input_ids[0]

    def prefill(rid: str) -> None:
        req = SimpleNamespace(rid=rid, origin_input_ids=ids, output_ids=[], req_pool_idx=1)
        rounds.prefill(SimpleNamespace(reqs=[req], input_ids=None, req_pool_indices=None, seq_lens=None), None)

    prefill("client")
    assert rounds.probe.probes == 0 and (seen[-1] == -1).all()
    prefill(f"{WARMUP_RID_PREFIX}{PROBE_RID_MARK}0")
    assert rounds.probe.probes == 1 and int(heads.table[2, 1]) >= 0
