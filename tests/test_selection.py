"""Draft-plan logic (budget, windows, selectors, plan layout, ORACLE) vs plain Python/torch.

The selectors run the real Triton selection kernel (interpreted on CPU, see triton_env.py).
"""

from __future__ import annotations

import math

import pytest
import torch
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd
from sglang_sparsespec.kernels.sparse_decode_ref import sparse_decode_ref
from triton_env import DEVICE

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.modes import ScoreRows, SelectionPolicy
from sglang_sparsespec.selection.oracle import oracle_select
from sglang_sparsespec.selection.policy import budget, draft_window, streaming_plan
from sglang_sparsespec.selection.scores import VerifyScoreSink
from sglang_sparsespec.selection.selectors import (
    OracleSelector,
    ScoredSelector,
    StreamingSelector,
    make_selector,
)
from sglang_sparsespec.selection.state import PlanState

POISON = 777


def _budget_ref(cfg: PillarConfig, length: int) -> int:
    return min(length, max(cfg.min_budget, math.ceil(cfg.budget_ratio * length)))


def _window_ref(cfg: PillarConfig, verify: int, new: int, kmax: int) -> tuple[int, int]:
    budget_ = _budget_ref(cfg, new)
    # The window starts late enough to leave the selection sink_tokens positions, never past the verify block.
    tail = min(verify, max(0, verify - cfg.recent_window, new - (budget_ - cfg.sink_tokens)))
    return tail, max(0, min(budget_ - (new - tail), tail, kmax))


def _top_positions(scores: torch.Tensor, count: int) -> list[int]:
    """Positions of the `count` largest scores, ascending (scores are distinct)."""
    order = sorted(range(scores.numel()), key=lambda t: -float(scores[t]))
    return sorted(order[:count])


def test_budget_rule():
    cfg = PillarConfig(budget_ratio=0.05, min_budget=128)
    lens = torch.tensor([1, 100, 128, 2560, 2561, 8192])
    assert budget(cfg, lens).tolist() == [_budget_ref(cfg, n) for n in lens.tolist()] == [1, 100, 128, 128, 129, 410]
    assert cfg.budget(8192) == 410


@pytest.mark.parametrize("seed", range(3))
def test_draft_window_matches_reference(seed):
    gen = torch.Generator().manual_seed(seed)
    cfg = PillarConfig(num_steps=4, budget_ratio=0.1, min_budget=8, recent_window=3)
    verify = torch.randint(1, 90, (16,), generator=gen)
    new = verify + torch.randint(1, cfg.num_steps + 2, (16,), generator=gen)
    kmax = cfg.max_budget(96)
    tail, count = draft_window(cfg, verify, new, kmax)
    for b in range(16):
        v, n = int(verify[b]), int(new[b])
        assert (int(tail[b]), int(count[b])) == _window_ref(cfg, v, n, kmax)
        # Selected + tail never exceeds the budget unless the tail alone does.
        assert int(count[b]) + (n - int(tail[b])) <= max(_budget_ref(cfg, n), n - int(tail[b]))


def test_a_window_that_fills_the_budget_leaves_the_sinks_their_room():
    """A 128-token window at the 128-token minimum budget would select nothing (no attention sink in the plan):
    the window starts later so that sink_tokens positions stay selectable; a window the budget holds is untouched."""
    wide = PillarConfig(min_budget=128, recent_window=128, sink_tokens=4)
    tail, count = draft_window(wide, torch.tensor([1000, 100]), torch.tensor([1006, 106]), kmax=410)
    assert tail.tolist() == [882, 4] and count.tolist() == [4, 4]
    narrow = PillarConfig(recent_window=64)
    tail, count = draft_window(narrow, torch.tensor([1000, 5000]), torch.tensor([1009, 5009]), kmax=410)
    assert tail.tolist() == [1000 - 64, 5000 - 64] and count.tolist() == [128 - 73, 251 - 73]
    # The default window (128): below ~2.5K tokens the budget holds only it and the sinks' room; past it both.
    default = PillarConfig()
    tail, count = draft_window(default, torch.tensor([1000, 5000]), torch.tensor([1009, 5009]), kmax=410)
    assert tail.tolist() == [1009 - 124, 5000 - 128] and count.tolist() == [4, 251 - 137]


def test_streaming_plan_is_sinks_plus_recent():
    cfg = PillarConfig(min_budget=10, budget_ratio=0.05, sink_tokens=4)
    plan = streaming_plan(cfg, torch.tensor([3, 10, 50, 1000]), kmax=cfg.max_budget(1000))
    assert plan.sel_cnt.tolist() == [3, 4, 4, 4]
    assert plan.sel_pos[1, :5].tolist() == [0, 1, 2, 3, -1]
    # budget: 3 -> 3, 10 -> 10, 50 -> 10, 1000 -> 50; tail takes what the sinks leave.
    assert plan.tail_start.tolist() == [3, 4, 44, 954]


def _state(per_head: bool, rows=6, layers=2, h_kv=3, kmax=12) -> PlanState:
    state = PlanState.allocate(rows, layers, h_kv, per_head, kmax, torch.device(DEVICE))
    state.sel_pos.fill_(POISON)
    state.sel_cnt.fill_(POISON)
    state.tail_start.fill_(POISON)
    return state


def _verify_batch(cfg: PillarConfig, seed: int):
    gen = torch.Generator().manual_seed(seed)
    rpi = torch.tensor([4, 1, 3], device=DEVICE)
    verify = torch.tensor([40, 9, 25], device=DEVICE)
    new = verify + torch.randint(1, cfg.num_steps + 2, (3,), generator=gen).to(DEVICE)
    return gen, rpi, verify, new


@pytest.mark.parametrize("seed", range(2))
def test_pillar_selector_picks_top_k_per_layer_and_head(seed):
    cfg = PillarConfig(num_steps=4, budget_ratio=0.3, min_budget=6, recent_window=2)
    layers, h_kv, kmax = 2, 3, 12
    gen, rpi, verify, new = _verify_batch(cfg, seed)
    cap = int(verify.sum()) + 5
    sink = VerifyScoreSink(layers, h_kv, h_kv * 2, cap, max_q_rows=64, per_layer=True, device=torch.device(DEVICE))
    assert sink.mass.dtype == torch.float16
    sink.mass.copy_(torch.randperm(layers * h_kv * cap, generator=gen).view(layers, h_kv, cap).half() / 1024)
    state = _state(per_head=True, layers=layers, h_kv=h_kv, kmax=kmax)
    selector = make_selector(PillarConfig(**{**cfg.__dict__, "policy": SelectionPolicy.PILLAR}), state, sink)
    assert isinstance(selector, ScoredSelector)
    selector.after_verify(rpi, verify, new)
    starts = [0, 40, 49]
    for b, row in enumerate(rpi.tolist()):
        tail, count = _window_ref(cfg, int(verify[b]), int(new[b]), kmax)
        assert (int(state.tail_start[row]), int(state.sel_cnt[row])) == (tail, count)
        for layer in range(layers):
            view = state.layer(layer)
            for h in range(h_kv):
                scores = sink.mass[layer, h, starts[b] : starts[b] + tail].float()
                assert view[row, h, :count].tolist() == _top_positions(scores, count)
                assert (view[row, h, count:] == -1).all()
    untouched = [r for r in range(6) if r not in rpi.tolist()]
    assert (state.sel_pos[untouched] == POISON).all() and (state.sel_cnt[untouched] == POISON).all()


def test_select_every_keeps_plans_and_skips_capture_in_between():
    cfg = PillarConfig(num_steps=4, budget_ratio=0.3, min_budget=6, recent_window=2, select_every=2)
    layers, h_kv, kmax = 2, 3, 12
    gen, rpi, verify, new = _verify_batch(cfg, 3)
    sink = VerifyScoreSink(
        layers, h_kv, h_kv * 2, int(verify.sum()) + 5, max_q_rows=64, per_layer=True, device=torch.device(DEVICE)
    )
    sink.mass.copy_(torch.rand(sink.mass.shape, generator=gen).half())
    state = _state(per_head=True, layers=layers, h_kv=h_kv, kmax=kmax)
    selector = make_selector(cfg, state, sink)
    flags, plans = [], []
    for _ in range(3):
        flags.append(int(sink.capture_on))  # what the verify pass of this round saw
        selector.after_verify(rpi, verify, new)
        plans.append((state.sel_pos.clone(), state.sel_cnt.clone(), state.tail_start.clone()))
        sink.mass.copy_(torch.rand(sink.mass.shape, generator=gen).half())  # the next capture's scores
        verify, new = new, new + 2
    assert flags == [1, 0, 1]
    assert all(torch.equal(a, b) for a, b in zip(plans[0], plans[1]))  # pass 2 kept pass 1's plans
    assert not torch.equal(plans[1][2], plans[2][2])  # pass 3 selected again, with a later tail


def test_coarse_selector_shares_one_set_summed_over_layers_and_heads():
    cfg = PillarConfig(num_steps=4, budget_ratio=0.3, min_budget=6, recent_window=2, policy=SelectionPolicy.COARSE)
    layers, h_kv, kmax = 2, 3, 12
    gen, rpi, verify, new = _verify_batch(cfg, 7)
    cap = int(verify.sum()) + 5
    sink = VerifyScoreSink(layers, h_kv, h_kv * 2, cap, max_q_rows=64, per_layer=False, device=torch.device(DEVICE))
    sink.mass.copy_(torch.rand(1, h_kv, cap, generator=gen))
    state = _state(per_head=False, layers=layers, h_kv=h_kv, kmax=kmax)
    make_selector(cfg, state, sink).after_verify(rpi, verify, new)
    total = sink.mass[0].sum(0)
    for b, (row, start) in enumerate(zip(rpi.tolist(), [0, 40, 49])):
        tail, count = _window_ref(cfg, int(verify[b]), int(new[b]), kmax)
        expect = _top_positions(total[start : start + tail], count)
        for layer in range(layers):
            for h in range(h_kv):
                assert state.layer(layer)[row, h, :count].tolist() == expect


def test_prefill_seed_and_streaming_and_oracle_windows():
    cfg = PillarConfig(num_steps=2, budget_ratio=0.5, min_budget=4, recent_window=2, sink_tokens=2)
    rpi = torch.tensor([2, 5], device=DEVICE)
    lens = torch.tensor([30, 3], device=DEVICE)
    seed = streaming_plan(cfg, lens, kmax=10)
    for per_head, selector_cls in ((True, StreamingSelector), (False, OracleSelector)):
        state = _state(per_head=per_head, kmax=10)
        selector = selector_cls(cfg, state)
        selector.after_prefill(rpi, lens)
        # Every (layer, head) set of a row holds the seed: sinks then -1.
        for layer in range(state.num_layers):
            assert torch.equal(state.layer(layer)[rpi], seed.sel_pos[:, None, :].expand(2, 3, 10))
        assert state.sel_cnt[rpi].tolist() == seed.sel_cnt.tolist()
        assert state.tail_start[rpi].tolist() == seed.tail_start.tolist()
    new = lens + 2
    StreamingSelector(cfg, state).after_verify(rpi, lens, new)
    assert state.tail_start[rpi].tolist() == streaming_plan(cfg, new, 10).tail_start.tolist()
    OracleSelector(cfg, state).after_verify(rpi, lens, new)
    tail, count = draft_window(cfg, lens, new, 10)
    assert state.tail_start[rpi].tolist() == tail.tolist() and state.sel_cnt[rpi].tolist() == count.tolist()


def test_scored_selector_rejects_mismatched_state():
    sink = VerifyScoreSink(2, 3, 6, 16, 8, per_layer=True, device=torch.device(DEVICE))
    with pytest.raises(ValueError, match="candidate rows"):
        ScoredSelector(PillarConfig(), _state(per_head=False), sink)
    with pytest.raises(ValueError, match="needs a verify score sink"):
        make_selector(PillarConfig(), _state(per_head=True), None)


def _paged_request_kv(gen, rows, width, slots, h_kv, d):
    req_to_token = torch.randperm(slots - 1, generator=gen)[: rows * width].view(rows, width).to(torch.int32) + 1
    k_buffer = torch.randn(slots, h_kv, d, generator=gen).to(torch.bfloat16)
    v_buffer = torch.randn(slots, h_kv, d, generator=gen).to(torch.bfloat16)
    return req_to_token.to(DEVICE), k_buffer.to(DEVICE), v_buffer.to(DEVICE)


def test_oracle_select_is_exact_top_k_of_the_query():
    gen = torch.Generator().manual_seed(3)
    h_kv, group, d, width, kmax = 2, 3, 32, 48, 8
    req_to_token, k_buffer, _ = _paged_request_kv(gen, 4, width, 512, h_kv, d)
    rpi = torch.tensor([3, 0, 2], device=DEVICE)
    seq_lens = torch.tensor([40, 5, 48], device=DEVICE)
    tail_start = torch.tensor([30, 4, 0], device=DEVICE, dtype=torch.int32)
    count = torch.tensor([6, 9, 3], device=DEVICE, dtype=torch.int32)
    q = torch.randn(3, h_kv * group, d, generator=gen).to(torch.bfloat16).to(DEVICE)
    out_pos = torch.full((4, h_kv, kmax), POISON, dtype=torch.int32, device=DEVICE)
    out_cnt = torch.full((4,), POISON, dtype=torch.int32, device=DEVICE)
    oracle_select(q, k_buffer, req_to_token, rpi, seq_lens, tail_start, count, d**-0.5, 0.0, out_pos, out_cnt)
    assert out_cnt[:3].tolist() == [6, 4, 0]
    for b in range(3):
        n = int(seq_lens[b])
        keys = k_buffer[req_to_token[int(rpi[b]), :n].long()].float()  # [n, H_kv, D]
        for h in range(h_kv):
            qh = q[b, h * group : (h + 1) * group].float()
            probs = torch.softmax(qh @ keys[:, h].T * d**-0.5, dim=-1).mean(0)
            cnt = int(out_cnt[b])
            assert out_pos[b, h, :cnt].tolist() == _top_positions(probs[: int(tail_start[b])], cnt)
            assert (out_pos[b, h, cnt:] == -1).all()


@pytest.mark.parametrize("per_head", [True, False])
def test_sparse_decode_reads_plan_layer_views(per_head):
    """The draft backend's call: sel_pos = state.layer(l) (head stride 0 when shared), rows = rpi."""
    gen = torch.Generator().manual_seed(11)
    h_kv, group, d, width, kmax, layers = 2, 2, 32, 40, 6, 2
    req_to_token, k_buffer, v_buffer = _paged_request_kv(gen, 5, width, 400, h_kv, d)
    state = PlanState.allocate(5, layers, h_kv, per_head, kmax, torch.device(DEVICE))
    rpi = torch.tensor([4, 2], device=DEVICE)
    groups = state.sel_pos.shape[1]
    for row in rpi.tolist():
        for g in range(groups):
            pos = torch.randperm(20, generator=gen)[:kmax].sort().values
            state.sel_pos[row, g] = pos.to(torch.int32)
    state.sel_cnt[rpi] = torch.tensor([6, 3], dtype=torch.int32, device=DEVICE)
    tail_start = torch.tensor([20, 25], dtype=torch.int32, device=DEVICE)
    seq_lens = torch.tensor([31, 27], device=DEVICE)
    q = torch.randn(2, h_kv * group, d, generator=gen).to(torch.bfloat16).to(DEVICE)
    for layer in range(layers):
        view = state.layer(layer)
        assert view.shape == (5, h_kv, kmax)
        args = (q, k_buffer, v_buffer)
        rest = (req_to_token, rpi, view, state.sel_cnt, tail_start, seq_lens, d**-0.5)
        o = torch.full_like(q, float("nan"))
        expected = o.clone()
        sparse_decode_fwd(*args, o, *rest, sel_rows=rpi)
        sparse_decode_ref(*args, expected, *rest, sel_rows=rpi)
        torch.testing.assert_close(o.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_config_from_env_rejects_bad_values():
    with pytest.raises(ValueError, match="MIN_BUDGET"):
        PillarConfig.from_env(8, {"SPARSESPEC_MIN_BUDGET": "x"})
    cfg = PillarConfig.from_env(4, {"SPARSESPEC_POLICY": "STREAMING", "SPARSESPEC_MIN_BUDGET": "64"})
    assert (cfg.num_steps, cfg.policy.value, cfg.min_budget) == (4, "streaming", 64)
    assert [p.value for p in SelectionPolicy] == ["pillar", "coarse", "streaming", "oracle"]
    assert [p.uses_verify_scores for p in SelectionPolicy] == [True, True, False, False]
    assert PillarConfig.from_env(8, {"SPARSESPEC_SELECT_EVERY": "4"}).select_every == 4
    assert PillarConfig.from_env(8, {}).score_rows is ScoreRows.ALL
    assert PillarConfig.from_env(8, {"SPARSESPEC_SCORE_ROWS": "LAST"}).score_rows is ScoreRows.LAST
    with pytest.raises(ValueError, match="SCORE_ROWS='first'; choose one of: all, last"):
        PillarConfig.from_env(8, {"SPARSESPEC_SCORE_ROWS": "first"})
    with pytest.raises(ValueError, match="SELECT_EVERY"):
        PillarConfig.from_env(8, {"SPARSESPEC_SELECT_EVERY": "0"})
