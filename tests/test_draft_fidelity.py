"""tools.draft_fidelity on a tiny random Llama: exact drafts at a full budget, not at a small one; the rules."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import tiny_llama

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.modes import ScoreRows, SelectionPolicy
from tools.draft_fidelity import (
    Fidelity,
    Rule,
    fidelity,
    match_keep,
    overlap,
    pooled_plan,
    reference,
    served_tail,
    shift_scores,
)
from tools.policy_sim import Sampling, oracle_keep

PROMPT = list(range(3, 43))
SAMPLING = Sampling(temperature=1.0, top_p=1.0, seed=0)


@pytest.fixture(scope="module")
def tiny_model():
    return tiny_llama()


@pytest.fixture(scope="module")
def ref_ids(tiny_model):
    return reference(tiny_model, PROMPT, 120, SAMPLING)


def _run(model, ref_ids, budget_ratio: float, rule: str = "pillar", advance: int = 3) -> Fidelity:
    cfg = PillarConfig(
        num_steps=4, budget_ratio=budget_ratio, min_budget=8, recent_window=2, sink_tokens=2, select_every=1
    )
    return fidelity(model, PROMPT, ref_ids, cfg, Rule.parse(rule), SAMPLING, advance)


def test_reference_is_the_seeded_models_own_answer(tiny_model, ref_ids):
    assert len(ref_ids) == 120 and all(0 <= t < 96 for t in ref_ids)
    assert reference(tiny_model, PROMPT, 120, SAMPLING) == ref_ids


def test_a_full_budget_drafts_the_verify_distribution(tiny_model, ref_ids):
    res = _run(tiny_model, ref_ids, budget_ratio=1.0)
    # Every round from the first plan on that holds the whole prefix: a draft from the verify's own distribution.
    assert len(res.accept_probs) == (len(ref_ids) - 4 - 1) // 3 + 1
    assert all(abs(a - 1) < 1e-4 for row in res.accept_probs[1:] for a in row)
    assert res.summary()["mean_expected_tokens"] == pytest.approx(5.0, abs=0.05)


@pytest.mark.parametrize("rule", ["pillar", "pillar:group=max", "pillar:rows=last", "streaming", "coarse"])
def test_a_small_budget_drafts_worse_and_rules_read_the_same_positions(tiny_model, ref_ids, rule):
    res = _run(tiny_model, ref_ids, budget_ratio=0.05, rule=rule)
    full = _run(tiny_model, ref_ids, budget_ratio=1.0)
    assert len(res.accept_probs) == len(full.accept_probs)  # the same rounds along the same text
    assert res.summary()["mean_expected_tokens"] < full.summary()["mean_expected_tokens"] - 0.01
    assert res.summary()["mean_draft_set"] < full.summary()["mean_draft_set"]


def test_sinks_are_in_every_selection(tiny_model, ref_ids, monkeypatch):
    import tools.draft_fidelity as tool

    plans = []
    real = tool.next_plan
    monkeypatch.setattr(tool, "next_plan", lambda *a, **kw: plans.append(real(*a, **kw)) or plans[-1])
    _run(tiny_model, ref_ids, 0.05, "pillar:sinks=2")
    scored = [sel for sel, _ in plans[1:]]  # the first plan is the streaming seed
    assert scored and all(set(sel[..., :2].flatten().tolist()) == {0, 1} for sel in scored)


def test_the_groups_max_selects_other_positions_than_its_mean(tiny_model, ref_ids):
    mean, most = (_run(tiny_model, ref_ids, 0.05, rule) for rule in ("pillar", "pillar:group=max"))
    assert mean.accept_probs[0] == most.accept_probs[0]  # the streaming seed: no scores yet
    assert mean.accept_probs != most.accept_probs


def test_the_oracle_keeps_each_querys_own_top_positions():
    logits = torch.full((1, 4, 2, 6), -5.0)  # [1, H_q, Q, K], GQA groups of two heads
    logits[0, 0, 0, 1] = logits[0, 1, 0, 1] = 3.0  # KV head 0, query 0: position 1 by both heads
    logits[0, 0, 1, 2] = 4.0  # KV head 0, query 1: position 2 by one head (the group's mean)
    logits[0, 2:, :, 0] = 2.0  # KV head 1, both queries: position 0
    tail = torch.zeros(1, 4, 1, 6, dtype=torch.bool)
    tail[..., 4:] = True
    keep = oracle_keep(logits, tail, groups=2, count=1, tail_start=4)
    assert keep[0, :, :, 4:].all()  # the tail stays
    picked = [[keep[0, h, q, :4].nonzero().flatten().tolist() for q in range(2)] for h in range(4)]
    assert picked == [[[1], [2]], [[1], [2]], [[0], [0]], [[0], [0]]]


def test_the_oracle_drafts_exactly_at_a_full_budget_and_reads_a_plans_draft_set(tiny_model, ref_ids):
    oracle, pillar = (_run(tiny_model, ref_ids, 0.05, rule) for rule in ("oracle", "pillar"))
    assert oracle.summary()["mean_draft_set"] == pytest.approx(pillar.summary()["mean_draft_set"])
    assert oracle.accept_probs[0] == pillar.accept_probs[0]  # the streaming seed before any verify
    assert oracle.accept_probs != pillar.accept_probs
    full = _run(tiny_model, ref_ids, 1.0, "oracle")
    assert all(abs(a - 1) < 1e-4 for row in full.accept_probs[1:] for a in row)


def test_refined_plans_pick_each_querys_own_top_among_the_candidates(tiny_model, ref_ids):
    oracle, every, two = (_run(tiny_model, ref_ids, 0.05, r) for r in ("oracle", "pillar:refine=99", "pillar:refine=2"))
    assert every.accept_probs == oracle.accept_probs  # candidates that hold the whole prefix: the oracle itself
    assert two.accept_probs != oracle.accept_probs
    assert two.summary()["mean_draft_set"] == pytest.approx(oracle.summary()["mean_draft_set"])


def test_own_layers_are_the_oracle_there_and_the_plan_elsewhere(tiny_model, ref_ids):
    oracle, plan = (_run(tiny_model, ref_ids, 0.05, r) for r in ("oracle", "pillar"))
    every = _run(tiny_model, ref_ids, 0.05, "pillar:own=0+1")  # the tiny model's two layers
    one = _run(tiny_model, ref_ids, 0.05, "pillar:own=1")
    heads = _run(tiny_model, ref_ids, 0.05, "pillar:own=0.0+0.1+1")  # both KV heads of layer 0, and layer 1
    assert every.accept_probs == oracle.accept_probs == heads.accept_probs
    assert one.accept_probs not in (oracle.accept_probs, plan.accept_probs)


def test_the_first_querys_choice_serves_the_rounds_later_drafts(tiny_model, ref_ids):
    each, first = (_run(tiny_model, ref_ids, 0.05, r) for r in ("oracle", "oracle:pick=first"))
    # Draft step 0 is the first query itself: its accept probabilities match; later steps attend another choice.
    assert [row[0] for row in first.accept_probs] == pytest.approx([row[0] for row in each.accept_probs], abs=1e-6)
    assert [row[1:] for row in first.accept_probs] != [row[1:] for row in each.accept_probs]
    assert first.summary()["mean_draft_set"] == pytest.approx(each.summary()["mean_draft_set"])


def test_a_boosted_head_widens_the_plan_there_only(tiny_model, ref_ids):
    plan, every = (_run(tiny_model, ref_ids, 0.05, r) for r in ("pillar", "pillar:boost=99@0+1"))
    # A plan of 99 x count positions holds the whole prefix below the window from the first scored plan on.
    assert all(abs(a - 1) < 1e-4 for row in every.accept_probs[1:] for a in row)
    one = _run(tiny_model, ref_ids, 0.05, "pillar:boost=3@1.0")
    sets = [r.summary()["mean_draft_set"] for r in (plan, one, every)]
    assert sets[0] < sets[1] < sets[2]
    assert one.accept_probs not in (plan.accept_probs, every.accept_probs)


def test_matched_positions_are_each_querys_earlier_occurrences_and_their_successors():
    seq = [5, 6, 7, 5, 6, 9, 5, 6]  # draft queries at positions 5, 6, 7 feed tokens 9, 5 and 6
    extra = match_keep(seq, v=5, k=3, latest=1, where=("1.0",), shape=(2, 2))
    assert not extra[0].any() and not extra[1, 1].any()
    assert extra[1, 0, 0].nonzero().view(-1).tolist() == []  # token 9 occurs nowhere before
    assert extra[1, 0, 1].nonzero().view(-1).tolist() == [3, 4]  # token 5: its latest occurrence 3, then 4
    assert extra[1, 0, 2].nonzero().view(-1).tolist() == [4, 5]
    both = match_keep(seq, v=5, k=3, latest=2, where=("0",), shape=(2, 2))
    assert both[0, 1, 1].nonzero().view(-1).tolist() == [0, 1, 3, 4] and not both[1].any()


def test_matched_heads_widen_the_draft_set_where_tokens_repeat(tiny_model, ref_ids):
    plan, match = (_run(tiny_model, ref_ids, 0.05, r) for r in ("pillar", "pillar:match=99@0+1"))
    assert match.summary()["mean_draft_set"] > plan.summary()["mean_draft_set"]
    assert match.accept_probs != plan.accept_probs


def test_a_dense_layer_reads_the_whole_prefix(tiny_model, ref_ids):
    sparse, dense = (_run(tiny_model, ref_ids, 0.05, r) for r in ("pillar", "pillar:dense=0"))
    assert dense.summary()["mean_draft_set"] > sparse.summary()["mean_draft_set"]
    assert dense.accept_probs != sparse.accept_probs
    layers = "+".join(map(str, range(tiny_model.config.num_hidden_layers)))
    every = _run(tiny_model, ref_ids, 0.05, f"pillar:dense={layers}")
    assert all(abs(a - 1) < 1e-4 for row in every.accept_probs for a in row)
    heads = _run(tiny_model, ref_ids, 0.05, "pillar:dense=0.0+0.1+1")  # both KV heads of layer 0, and layer 1
    assert heads.accept_probs == every.accept_probs
    one = _run(tiny_model, ref_ids, 0.05, "pillar:dense=1.0")
    assert sparse.summary()["mean_draft_set"] < one.summary()["mean_draft_set"] < dense.summary()["mean_draft_set"]


def test_shifted_scores_reach_the_positions_after_the_attended_ones(tiny_model, ref_ids):
    s = torch.tensor([[0.0, 5.0, 1.0, 0.0, 0.0, 2.0, 0.0]])
    assert shift_scores(s, 2).tolist() == [[0.0, 5.0, 5.0, 5.0, 1.0, 2.0, 2.0]]
    assert shift_scores(s, 0) is s
    plain, shifted = (_run(tiny_model, ref_ids, 0.05, rule) for rule in ("pillar", "pillar:shift=2"))
    assert plain.accept_probs[0] == shifted.accept_probs[0]  # the streaming seed: no scores yet
    assert plain.accept_probs != shifted.accept_probs
    assert plain.summary()["mean_draft_set"] == pytest.approx(shifted.summary()["mean_draft_set"])


@pytest.mark.parametrize("rule", ["pillar:reduce=max", "pillar:value=norm", "pillar:alloc=layer", "pillar:alloc=all"])
def test_other_scores_select_other_positions_at_the_same_draft_set(tiny_model, ref_ids, rule):
    plain, other = (_run(tiny_model, ref_ids, 0.05, r) for r in ("pillar", rule))
    assert plain.accept_probs[0] == other.accept_probs[0]  # the streaming seed: no scores yet
    assert plain.accept_probs != other.accept_probs
    assert plain.summary()["mean_draft_set"] == pytest.approx(other.summary()["mean_draft_set"])


def test_a_pooled_budget_goes_to_the_highest_masses_of_the_pool():
    scores = torch.tensor([[[0.9, 0.8, 0.7, 0.0], [0.1, 0.2, 0.3, 0.0]], [[0.5, 0.0, 0.0, 0.0], [0.4, 0.6, 0.0, 0.0]]])
    layer, tail_start = pooled_plan(scores, (3, 2), "layer")  # 2 positions a head, 4 a layer, below position 3
    assert tail_start == 3 and layer.shape == (2, 2, 3)
    assert layer.sum((1, 2)).tolist() == [4, 4]
    assert layer[0].tolist() == [[True, True, True], [False, False, True]]
    every, _ = pooled_plan(scores, (3, 2), "all")  # 8 positions over all four heads
    assert every.sum() == 8 and every[0, 0].all() and not every[1, 0, 1:].any()


def test_expected_tokens_and_overlap():
    res = Fidelity("x", [[0.5, 0.5], [1.0, 0.0]], [1.0, 1.0], 0.0)
    assert res.expected_tokens() == [1.75, 2.0]
    p = torch.tensor([[0.5, 0.5, 0.0]])
    assert overlap(p, torch.tensor([[0.25, 0.25, 0.5]])).tolist() == [0.5]


def test_the_served_tail_never_feeds_the_next_rounds_tokens():
    chain = [5, 1, 2, 3, 4]  # k = 4: the reference at positions v .. v + 4
    q = torch.zeros(4, 8)
    q[:, 2] = 0.5  # every draft's likeliest token is 2, the reference's own at position v + 2
    q[:, 6] = 0.3
    assert served_tail(chain, q, advance=2) == [6, 2, 2]  # positions v + 2 .. v + 4: the rejected draft is not 2
    assert served_tail(chain, q, advance=4) == [2]  # the reference has 4 at v + 4


def test_the_next_plan_scores_rows_fed_the_served_tail(tiny_model, ref_ids, monkeypatch):
    import tools.draft_fidelity as tool

    fed = []
    real = tool.served_tail
    monkeypatch.setattr(tool, "served_tail", lambda *a: fed.append(real(*a)) or fed[-1])
    res = _run(tiny_model, ref_ids, 0.05)
    assert len(fed) == len(res.accept_probs) and all(len(t) == 2 for t in fed)  # k + 1 - advance rows each
    # Each round's tail starts with a token other than the reference's at that position.
    starts = [len(PROMPT) + 3 * r + 3 for r in range(len(fed))]
    assert all(t[0] != ([*PROMPT, *ref_ids])[s] for t, s in zip(fed, starts))
    # Fed the reference instead, the same rows would score the next round's own queries: other plans, other drafts.
    monkeypatch.setattr(tool, "served_tail", lambda chain, q, advance: list(chain[advance:]))
    leaky = _run(tiny_model, ref_ids, 0.05)
    assert leaky.accept_probs[0] == res.accept_probs[0]  # the streaming seed: no scores yet
    assert leaky.accept_probs != res.accept_probs


def test_rules_parse_and_refuse():
    assert Rule.parse("pillar:rows=last:group=max") == Rule(SelectionPolicy.PILLAR, ScoreRows.LAST, "max")
    assert Rule.parse("pillar:group=max").name == "pillar:group=max"
    assert Rule.parse("pillar:sinks=4") == Rule(SelectionPolicy.PILLAR, sinks=4)
    assert Rule.parse("pillar:window=128").name == "pillar:window=128"
    assert Rule.parse("pillar:shift=4").name == "pillar:shift=4" and Rule.parse("oracle").name == "oracle"
    assert Rule.parse("pillar:reduce=max:value=norm").name == "pillar:reduce=max:value=norm"
    assert Rule.parse("pillar:alloc=layer").alloc == "layer" and Rule.parse("pillar:refine=2").refine == 2
    assert Rule.parse("pillar:own=7+20.1").own == ("7", "20.1")
    assert Rule.parse("pillar:boost=3@7+20.1").boost == (3, ("7", "20.1"))
    assert Rule.parse("pillar:boost=3@7+20.1").name == "pillar:boost=3@7+20.1"
    assert Rule.parse("pillar:own=7:pick=first").name == "pillar:own=7:pick=first"
    assert Rule.parse("pillar:match=1@7.2+20").match == (1, ("7.2", "20"))
    assert Rule.parse("pillar:match=8@7.2").name == "pillar:match=8@7.2"
    assert Rule.parse("pillar:dense=0+11.2").dense == ("0", "11.2") and Rule.parse("pillar:dense=0+11").name.endswith(
        "0+11"
    )
    for bad in (
        "pillar:alloc=row",
        "pillar:refine=1",
        "pillar:boost=1@7",
        "pillar:match=0@7",
        "pillar:boost=3",
        "pillar:boost=3@x",
        "oracle:pick=last",
        "pillar:dense=a",
        "pillar:shift=-1",
        "pillar:reduce=sum",
        "pillar:value=1",
        "pillar:group=sum",
        "pillar:depth=2",
        "pillar:sinks=-1",
        "pillar:window=wide",
    ):
        with pytest.raises(ValueError):
            Rule.parse(bad)


def test_a_wider_window_keeps_more_recent_positions(tiny_model, ref_ids, monkeypatch):
    import tools.draft_fidelity as tool

    plans = []
    real = tool.next_plan
    monkeypatch.setattr(tool, "next_plan", lambda *a, **kw: plans.append(real(*a, **kw)) or plans[-1])
    narrow = _run(tiny_model, ref_ids, 0.3)  # recent_window=2
    narrow_tails = [tail for _, tail in plans[1:]]  # the first plan is the streaming seed
    plans.clear()
    wide = _run(tiny_model, ref_ids, 0.3, "pillar:window=6")
    wide_tails = [tail for _, tail in plans[1:]]
    assert all(w <= n for w, n in zip(wide_tails, narrow_tails)) and wide_tails != narrow_tails
    assert wide.summary()["mean_draft_set"] == pytest.approx(narrow.summary()["mean_draft_set"], rel=0.05)


def test_advance_past_the_chain_is_refused(tiny_model, ref_ids):
    with pytest.raises(ValueError, match="advance"):
        _run(tiny_model, ref_ids, 0.05, advance=6)


def test_one_forward_of_the_chain_drafts_as_k_single_steps(tiny_model):
    """The tool's batched draft: k queries under the plan and the causal mask give each step's logits."""
    from transformers import DynamicCache

    from tools.policy_sim import ATTN, keep_mask

    v, k, seq = len(PROMPT), 4, PROMPT + [7, 9, 11, 13]
    plan = (torch.tensor([0, 1, 5, 17]), v - 3)
    keep = keep_mask(plan, v + k, 2, 2).repeat_interleave(2, dim=1)
    logits = []
    for batched in (False, True):
        cache = DynamicCache()
        with torch.no_grad():
            tiny_model(torch.tensor([seq[:v]]), past_key_values=cache, use_cache=True)
            ATTN.keep = keep
            try:
                if batched:
                    logits.append(tiny_model(torch.tensor([seq[v:]]), past_key_values=cache).logits[0])
                else:
                    steps = [tiny_model(torch.tensor([[t]]), past_key_values=cache).logits[0, -1] for t in seq[v:]]
                    logits.append(torch.stack(steps))
            finally:
                ATTN.keep = None
    torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=1e-5)


def test_solution_reference_reads_the_problems_written_solution(tmp_path):
    from tools.draft_fidelity import solution_ids

    class Chars:  # one id per character
        def encode(self, text, add_special_tokens=False):
            return [ord(c) for c in text]

    rows = ['{"problem": "p0", "solution": "ab"}', "", '{"problem": "p1", "solution": "xyz"}', '{"problem": "p2"}']
    (tmp_path / "set.jsonl").write_text("\n".join(rows) + "\n")
    assert solution_ids(Chars(), tmp_path, "set", 1) == [ord("x"), ord("y"), ord("z")]
    with pytest.raises(ValueError, match="no written solution"):
        solution_ids(Chars(), tmp_path, "set", 2)
