"""The head probe (sglang_sparsespec/selection/head_probe.py): its repeated sequence, the two lookups it scores
on planted attention, the flag value it names, and the command end to end on a small random Llama."""

from __future__ import annotations

import json

import pytest
import torch
from sglang_sparsespec.selection.dense_heads import parse_dense_heads
from sglang_sparsespec.selection.head_probe import lookup_scores, main, pick_heads, probe_sequence, qk_lookup_scores


def test_the_sequence_is_random_ids_shown_twice_after_the_bos() -> None:
    seq = probe_sequence(50, 5000, 1, torch.Generator().manual_seed(3))
    assert seq.shape == (101,) and seq[0] == 1
    assert torch.equal(seq[1:51], seq[51:]) and seq[1:].min() >= 1000 and seq[1:].max() < 4000
    assert len(set(seq[1:51].tolist())) > 40  # random, not one id repeated
    assert probe_sequence(50, 5000, None, torch.Generator()).shape == (100,)
    with pytest.raises(ValueError, match="too small"):
        probe_sequence(50, 2050, 1, torch.Generator())


def _causal_uniform(h_q: int, t: int) -> torch.Tensor:
    probs = torch.tril(torch.ones(t, t))
    return (probs / probs.sum(-1, keepdim=True)).expand(h_q, t, t).clone()


def test_planted_lookups_score_their_kv_head_and_no_other() -> None:
    """Layer 1 KV head 1 (query heads 2 and 3) looks at the position after the token's first occurrence, layer 0
    KV head 0 (query heads 0 and 1) at the occurrence itself; every other head attends uniformly."""
    length, offset = 20, 1
    t = offset + 2 * length
    layers = [_causal_uniform(4, t), _causal_uniform(4, t)]
    for q in range(offset + length, t):
        first = q - length
        layers[1][2:4, q] = 0
        layers[1][2:4, q, first + 1] = 1
        layers[0][0:2, q] = 0
        layers[0][0:2, q, first] = 1
    s = lookup_scores(layers, length, num_kv_heads=2, offset=offset)
    assert s["induction"][1, 1] == pytest.approx(1.0) and s["duplicate"][0, 0] == pytest.approx(1.0)
    uniform = (1 / torch.arange(offset + length + 1, t + 1)).mean()  # a uniform query's mass on one position
    assert s["induction"][0, 0] == 0 and s["duplicate"][1, 1] == 0  # each planted head looks at its target only
    for layer, head in ((0, 1), (1, 0)):
        assert s["induction"][layer, head] == pytest.approx(float(uniform))
        assert s["duplicate"][layer, head] == pytest.approx(float(uniform))
    with pytest.raises(ValueError, match="do not group"):
        lookup_scores([_causal_uniform(3, t)], length, num_kv_heads=2, offset=offset)


@pytest.mark.parametrize("cap", [0.0, 4.0])
def test_scores_from_q_and_k_are_those_of_their_causal_softmax(cap) -> None:
    """What the server's probe scores from the q and k a forward hands attention: the same as ``lookup_scores`` on
    the probabilities built row by row (GQA: query heads 0-1 read KV head 0), and a planted key found."""
    gen = torch.Generator().manual_seed(9)
    length, offset, h_q, h_kv, d = 12, 1, 4, 2, 8
    t = offset + 2 * length
    q, k = torch.randn(t, h_q, d, generator=gen), torch.randn(t, h_kv, d, generator=gen)
    k[offset + 3, 1] = 6 * q[offset + length + 3, 2]  # KV head 1's key at a first occurrence, aligned with its query
    probs = torch.zeros(h_q, t, t)
    for h in range(h_q):
        for i in range(t):
            logits = (k[: i + 1, h // 2] @ q[i, h]) * 0.5
            probs[h, i, : i + 1] = (cap * torch.tanh(logits / cap) if cap else logits).softmax(-1)
    expected = lookup_scores([probs], length, h_kv, offset)
    got = qk_lookup_scores(q, k, length, offset, 0.5, cap)
    for name in ("duplicate", "induction"):
        torch.testing.assert_close(got[name], expected[name][0])
    assert got["duplicate"][1] > got["duplicate"][0]
    with pytest.raises(ValueError, match="do not group"):
        qk_lookup_scores(q[:, :3], k, length, offset, 0.5)


def test_a_models_own_q_and_k_score_as_its_eager_attention_probabilities(monkeypatch) -> None:
    """On a (random) Llama, the scores from the q and k its layers hand attention (normed and rotated, as the
    server's probe reads them) equal those of the attention probabilities transformers returns."""
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.models.llama import modeling_llama

    cfg = LlamaConfig(
        vocab_size=2300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, attn_implementation="eager",
    )  # fmt: skip
    torch.manual_seed(1)
    model = LlamaForCausalLM(cfg).eval()
    seen = []
    eager = modeling_llama.eager_attention_forward

    def capture(module, query, key, value, *args, **kwargs):
        scaling = kwargs["scaling"] if "scaling" in kwargs else args[1]  # (attention_mask, scaling, ...)
        seen.append((query[0].transpose(0, 1), key[0].transpose(0, 1), scaling))
        return eager(module, query, key, value, *args, **kwargs)

    monkeypatch.setattr(modeling_llama, "eager_attention_forward", capture)
    length = 30
    seq = probe_sequence(length, cfg.vocab_size, 1, torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model(seq[None], output_attentions=True, use_cache=False)
    expected = lookup_scores([a[0] for a in out.attentions], length, num_kv_heads=2, offset=1)
    assert len(seen) == cfg.num_hidden_layers
    for layer, (q, k, scaling) in enumerate(seen):
        got = qk_lookup_scores(q, k, length, 1, scaling)
        for name in ("duplicate", "induction"):
            torch.testing.assert_close(got[name], expected[name][layer], rtol=1e-4, atol=1e-6)


def test_the_highest_scores_are_named_in_layer_order_as_the_flag_reads_them() -> None:
    score = torch.tensor([[0.1, 0.9, 0.0], [0.5, 0.2, 0.7]])
    assert pick_heads(score, 3) == "0.1+1.0+1.2"
    assert parse_dense_heads(pick_heads(score, 3)) == ((0, 1), (1, 0), (1, 2))
    assert pick_heads(score, 10).count("+") == 5


def test_the_command_probes_a_model_folder_and_writes_every_heads_scores(tmp_path, capsys) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=2300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp_path / "model")
    out = tmp_path / "probe.json"
    argv = ["--model-path", str(tmp_path / "model"), "--heads", "2", "--length", "40", "--trials", "2"]
    assert main([*argv, "--device", "cpu", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    score = torch.tensor(doc["by_layer_and_head"]["score"])
    assert score.shape == (2, 2) and (score > 0).all() and (score < 2).all()
    assert doc["heads"] == pick_heads(score, 2)
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2:] == [f"--pillar-dense-heads {doc['heads']}", f"--pillar-match-heads 64@{doc['heads']}"]
