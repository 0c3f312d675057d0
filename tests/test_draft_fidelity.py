"""tools.draft_fidelity on a tiny random Llama: exact drafts at a full budget, not at a small one; the rules."""

from __future__ import annotations

import pytest
import torch
from tiny_llama import tiny_llama

from sglang_sparsespec.config import PillarConfig, ScoreRows, SelectionPolicy
from tools.draft_fidelity import Fidelity, Rule, fidelity, overlap, reference, served_tail
from tools.policy_sim import Sampling

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
    for bad in ("oracle", "pillar:group=sum", "pillar:depth=2", "pillar:sinks=-1", "pillar:window=wide"):
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
