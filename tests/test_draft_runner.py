"""The draft runner's round: k replays of one draft-step body that keeps all its state on the device.

The GPU replays one captured step k times, so the step body must not depend on anything the host
sets per step. Here the same body runs eagerly (capture needs CUDA) against a stand-in model whose
greedy next token is a known function of (input token, position, row): k calls of the body must
draft the chain a loop over explicit steps would, at the right positions and KV slots, fill each
step's proposal block, leave the columns past the round's count untouched, and start every round
afresh. On a GPU the last test captures the body as a CUDA graph and checks that the replays draft
the same chains and fill the same proposal blocks as the eager body.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import pytest
import torch
from sglang_sparsespec.patches import draft_runner as dr
from sglang_sparsespec.patches.decode_graphs import Kind
from triton_env import DEVICE

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.kernels.token_match import match_lists_ref, token_match_ref
from sglang_sparsespec.selection.match_heads import TokenIds, match_heads_of
from sglang_sparsespec.selection.state import PlanState

V, K, BS = 97, 4, 3


class FakeBackend:
    stores_in_kernel = False  # no KV pool: the draft steps keep the model's own rotary call

    def __init__(self, model_runner, state, inputs, oracle, plain=False, fused=True):
        self.inputs, self.oracle = inputs, oracle
        self.plans: list[tuple[int, bool]] = []

    def plan(self, bs: int, whole_prefix: bool) -> None:
        self.plans.append((bs, whole_prefix))


class FakeModel:
    """Greedy next token = (31 * token + 7 * position + row) % V, peaked enough that sampling at
    temperature 0.6 / top-k 4 keeps it among the candidates."""

    def __init__(self) -> None:
        self.calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def forward(self, input_ids, positions, fb):
        self.calls.append((input_ids.clone(), positions.clone(), fb.out_cache_loc.clone()))
        rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        peak = (31 * input_ids + 7 * positions + rows) % V
        v = torch.arange(V, device=input_ids.device)
        logits = -((v[None, :] - peak[:, None]).abs().float())
        return SimpleNamespace(next_token_logits=logits)


def next_token(tok: int, pos: int, row: int) -> int:
    return (31 * tok + 7 * pos + row) % V


def make_runner(
    capture_bs: list[int], plain_decode: bool = False, seeded: bool = False, **config: object
) -> dr.PillarDraftRunner:
    """A draft runner over the fake model; ``config``: PillarConfig fields beyond the runner's own."""
    req_to_token = torch.arange(8 * 64, dtype=torch.int32, device=DEVICE).view(8, 64) + 1000
    mr = SimpleNamespace(
        device=DEVICE,
        model=FakeModel(),
        model_config=SimpleNamespace(vocab_size=V),
        spec_algorithm=None,
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        server_args=SimpleNamespace(enable_cudagraph_gc=False),
    )
    state = PlanState.allocate(8, 2, 3, True, 16, torch.device(DEVICE))
    state.match = match_heads_of(str(config.get("match_heads", "")), 2, 3, torch.device(DEVICE))
    return dr.PillarDraftRunner(
        mr,
        PillarConfig(num_steps=K, draft_candidates=4, **config),
        state,
        max_bs=8,
        capture_bs=capture_bs,
        plain_decode=plain_decode,
        seeded=seeded,
    )


@pytest.fixture
def runner(monkeypatch) -> dr.PillarDraftRunner:
    monkeypatch.setattr(dr, "PillarDraftBackend", FakeBackend)
    return make_runner([])


def probe_forwards(monkeypatch, probe: Callable[[], object], **config: object) -> list[object]:
    """What ``probe()`` returns inside each forward of two draft steps and then the plain step (a runner of
    ``make_runner([], plain_decode=True, **config)`` on ``FakeBackend``), in order."""
    seen: list[object] = []
    forward = FakeModel.forward

    def recording(self, input_ids, positions, fb):
        seen.append(probe())
        return forward(self, input_ids, positions, fb)

    monkeypatch.setattr(FakeModel, "forward", recording)
    monkeypatch.setattr(dr, "PillarDraftBackend", FakeBackend)
    runner = make_runner([], plain_decode=True, **config)
    rpi, seq_lens, bonus = (torch.tensor(v, device=DEVICE) for v in ([5, 1, 6], [10, 3, 20], [7, 8, 9]))
    runner.run(rpi, seq_lens, bonus, sampling(False), 2)
    runner.decode_logits(rpi, seq_lens + 2, bonus)
    return seen


def sampling(greedy: bool, seeds: list[int] | None = None) -> SimpleNamespace:
    return SimpleNamespace(
        is_all_greedy=greedy,
        temperatures=torch.full((BS, 1), 0.6, device=DEVICE),
        top_ps=torch.full((BS,), 0.95, device=DEVICE),
        top_ks=torch.full((BS,), 4, dtype=torch.int32, device=DEVICE),
        min_ps=None,
        sampling_seed=None if seeds is None else torch.tensor(seeds, device=DEVICE),
    )


def test_steps_replay_one_body_and_each_round_starts_afresh(runner: dr.PillarDraftRunner) -> None:
    rpi = torch.tensor([5, 1, 6], device=DEVICE)
    seq_lens = torch.tensor([10, 3, 20], device=DEVICE)
    bonus = torch.tensor([7, 8, 9], device=DEVICE)
    runner.out_tokens.fill_(-1)
    for steps in (3, K, 1):  # any count up to k, one round after another
        runner.mr.model.calls.clear()
        before = runner.out_tokens.clone()
        out = runner.run(rpi, seq_lens, bonus, sampling(True), steps)
        assert out.record is None and len(runner.mr.model.calls) == steps
        assert runner.backend.plans[-steps:] == [(BS, False)] * steps  # one work list per draft step
        for b in range(BS):
            tok = int(bonus[b])
            for j in range(steps):
                ids, pos, loc = (t[b].item() for t in runner.mr.model.calls[j])
                assert (ids, pos) == (tok, int(seq_lens[b]) + j)
                assert loc == int(runner.mr.req_to_token_pool.req_to_token[rpi[b], pos])
                tok = next_token(tok, pos, b)
                assert int(out.tokens[b, j]) == tok
        assert torch.equal(out.tokens[:, steps:], before[:BS, steps:])  # stale columns: untouched
        assert torch.equal(runner.inputs.seq_lens[:BS], seq_lens + steps)  # the last step's attention length
    with pytest.raises(ValueError, match="draft count"):
        runner.run(rpi, seq_lens, bonus, sampling(True), K + 1)


def test_sampled_steps_fill_their_own_proposal_blocks(runner: dr.PillarDraftRunner) -> None:
    rpi, seq_lens = torch.tensor([0, 2, 4], device=DEVICE), torch.tensor([4, 9, 30], device=DEVICE)
    runner.cand_ids.fill_(-7)
    torch.manual_seed(0)
    out = runner.run(rpi, seq_lens, torch.tensor([1, 2, 3], device=DEVICE), sampling(False), 3)
    rec = out.record
    assert rec is not None and rec.num_drafts == 3
    for b in range(BS):
        tok = [1, 2, 3][b]
        for j in range(3):
            pos = int(seq_lens[b]) + j
            drafted = int(rec.tokens[b, j])
            ids = rec.cand_ids[b, j]
            assert drafted in ids.tolist() and next_token(tok, pos, b) in ids.tolist()  # the peak is a candidate
            # The record's probability of the drafted token is the one its own block holds.
            assert float(rec.q_tok[b, j]) == pytest.approx(float(rec.cand_q[b, j][ids == drafted].sum()))
            tok = drafted
    assert bool((runner.cand_ids[3:] == -7).all())  # the step past the round: untouched


def check_plain(runner: dr.PillarDraftRunner, rpi, seq_lens, bonus) -> None:
    """A plain-decoding step: the pending token's logits at its own position, every row over its whole
    prefix (the backend planned for it; tail starts are not read), the draft state untouched."""
    state_tail = runner.state.tail_start.clone()
    runner.out_tokens.fill_(-3)
    logits, graphed = runner.decode_logits(rpi, seq_lens, bonus)
    assert graphed == any(kind is Kind.PLAIN for _, kind in runner.graphs.graphs) and logits.shape == (rpi.shape[0], V)
    if not graphed:  # a graph replay runs no host code; its capture planned for the bucket
        assert runner.backend.plans[-1] == (rpi.shape[0], True)  # planned for whole prefixes
    peaks = [next_token(int(bonus[b]), int(seq_lens[b]), b) for b in range(rpi.shape[0])]
    assert logits.argmax(dim=-1).tolist() == peaks
    assert torch.equal(runner.inputs.seq_lens[: rpi.shape[0]], seq_lens + 1)  # the pending token attends itself
    assert bool((runner.out_tokens == -3).all()) and torch.equal(runner.state.tail_start, state_tail)


def test_plain_decode_step_is_one_dense_forward_of_the_pending_token(monkeypatch) -> None:
    monkeypatch.setattr(dr, "PillarDraftBackend", FakeBackend)
    runner = make_runner([], plain_decode=True)
    rpi, seq_lens, bonus = (torch.tensor(v, device=DEVICE) for v in ([5, 1, 6], [10, 3, 20], [7, 8, 9]))
    runner.state.tail_start.fill_(5)
    check_plain(runner, rpi, seq_lens, bonus)
    ((ids, pos, loc),) = runner.mr.model.calls  # one forward, writing the pending token's K/V
    assert ids.tolist() == bonus.tolist() and pos.tolist() == seq_lens.tolist()
    assert torch.equal(loc, runner.mr.req_to_token_pool.req_to_token[rpi, seq_lens].long())
    # The next draft round takes its tail starts from the plans again.
    runner.run(rpi, seq_lens + 1, bonus, sampling(True), 1)
    assert bool((runner.inputs.tail_start[:3] == 5).all())
    with pytest.raises(RuntimeError, match="PLAIN_PATH=verify"):
        make_runner([]).decode_logits(rpi, seq_lens, bonus)


def check_round(out: dr.DraftOutput, rpi, seq_lens, bonus, steps: int) -> None:
    """The drafted chain follows the stand-in model from each row's bonus token, and every step's
    record holds its own drafted token (a block written under another step's index would not)."""
    for b in range(rpi.shape[0]):
        tok = int(bonus[b])
        for j in range(steps):
            pos = int(seq_lens[b]) + j
            drafted = int(out.tokens[b, j])
            if out.record is None:
                assert drafted == next_token(tok, pos, b)
            else:
                ids, q = out.record.cand_ids[b, j], out.record.cand_q[b, j]
                assert next_token(tok, pos, b) in ids.tolist()
                assert float(out.record.q_tok[b, j]) == pytest.approx(float(q[ids == drafted].sum()))
            tok = drafted


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.usefixtures("sglang_groups")
def test_captured_step_replays_like_the_eager_body(monkeypatch) -> None:
    monkeypatch.setattr(dr, "PillarDraftBackend", FakeBackend)
    graphed, eager = make_runner([4]), make_runner([])
    graphed.capture()
    assert set(graphed.graphs.graphs) == {(4, Kind.GREEDY), (4, Kind.SAMPLED)}
    rpi = torch.tensor([5, 1, 6], device=DEVICE)
    seq_lens = torch.tensor([10, 3, 20], device=DEVICE)
    bonus = torch.tensor([7, 8, 9], device=DEVICE)
    for greedy in (True, False):
        for steps in (K, 2, 1, 3):  # graph replays of several counts, one round after another
            graphed.mr.model.calls.clear()
            out = graphed.run(rpi, seq_lens, bonus, sampling(greedy), steps)
            assert not graphed.mr.model.calls  # replays, not the eager body
            check_round(out, rpi, seq_lens, bonus, steps)
            if greedy:
                ref = eager.run(rpi, seq_lens, bonus, sampling(True), steps)
                assert torch.equal(out.tokens[:, :steps], ref.tokens[:, :steps])
            assert torch.equal(graphed.inputs.seq_lens[:3], seq_lens + steps)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.usefixtures("sglang_groups")
def test_captured_plain_step_replays_like_the_eager_body(monkeypatch) -> None:
    monkeypatch.setattr(dr, "PillarDraftBackend", FakeBackend)
    graphed = make_runner([4], plain_decode=True)
    graphed.capture()
    assert set(graphed.graphs.graphs) == {(4, Kind.GREEDY), (4, Kind.SAMPLED), (4, Kind.PLAIN)}
    rpi, seq_lens, bonus = (torch.tensor(v, device=DEVICE) for v in ([5, 1, 6], [10, 3, 20], [7, 8, 9]))
    graphed.mr.model.calls.clear()
    check_plain(graphed, rpi, seq_lens, bonus)
    assert not graphed.mr.model.calls  # a replay, not the eager body
    out = graphed.run(rpi, seq_lens + 1, bonus, sampling(True), 2)  # draft graphs still draft after it
    check_round(out, rpi, seq_lens + 1, bonus, 2)


def seeded_round(runner: dr.PillarDraftRunner, seeds: list[int], global_seed: int, seq_lens=(4, 9, 30)):
    rpi, bonus = torch.tensor([0, 2, 4], device=DEVICE), torch.tensor([1, 2, 3], device=DEVICE)
    torch.manual_seed(global_seed)  # the default generator's state must not matter to a seeded round
    out = runner.run(rpi, torch.tensor(seq_lens, device=DEVICE), bonus, sampling(False, seeds), K)
    return out.tokens.clone(), out.record.cand_q.clone()


def test_seeded_requests_draft_the_same_tokens_on_every_run(monkeypatch) -> None:
    monkeypatch.setattr(dr, "PillarDraftBackend", FakeBackend)
    runner = make_runner([], seeded=True)
    tokens, q = seeded_round(runner, [11, 12, 13], global_seed=0)
    again, q_again = seeded_round(make_runner([], seeded=True), [11, 12, 13], global_seed=1)
    assert torch.equal(tokens, again) and torch.equal(q, q_again)
    # The draws are the request's own: other seeds, or another round start, draft differently.
    draws = {
        seeded_round(runner, seeds, 0, lens)[0].flatten().tolist().__repr__()
        for seeds, lens in [([11, 12, 13], (4, 9, 30)), ([21, 22, 23], (4, 9, 30)), ([11, 12, 13], (5, 10, 31))]
    }
    assert len(draws) == 3
    # Control: without seeding the same round depends on the default generator.
    unseeded = make_runner([])
    assert not torch.equal(seeded_round(unseeded, [11, 12, 13], 0)[0], seeded_round(unseeded, [11, 12, 13], 1)[0])


def test_seeded_noise_is_exponential_and_independent_across_steps() -> None:
    """U = exp(-noise) over 512 (seed, round start) rows x 8 steps x 4 slots: uniform (chi-square on 32
    bins), and a step's slot independent of the next step's (chi-square on a 4 x 4 table)."""
    from scipy.stats import chi2, chi2_contingency

    columns = dr.seeded_columns(8, 4, DEVICE)
    assert int(columns.min()) >= 1 << 31  # above every vocabulary id and every verify coin column
    assert columns.flatten().unique().numel() == 32  # every step and slot its own column
    seeds = torch.arange(512, device=DEVICE) * 7919 + 3
    starts = torch.arange(512, device=DEVICE) % 37 + 100
    noise = dr.seeded_noise(seeds, starts, columns.flatten()).cpu().double()
    assert bool(torch.isfinite(noise).all()) and bool((noise > 0).all())
    u = torch.exp(-noise)
    counts = torch.bincount((u * 32).long().clamp(max=31).flatten(), minlength=32).double()
    expected = u.numel() / 32
    assert chi2.sf(float(((counts - expected) ** 2 / expected).sum()), 31) > 1e-4
    assert abs(float(noise.mean()) - 1.0) < 0.03  # Exp(1): mean 1, sd 1 / sqrt(16384)
    step0, step1 = (u[:, :4] * 4).long().clamp(max=3), (u[:, 4:8] * 4).long().clamp(max=3)
    table = torch.zeros(4, 4)
    for a, b in zip(step0.flatten().tolist(), step1.flatten().tolist()):
        table[a, b] += 1
    assert chi2_contingency(table.numpy())[1] > 1e-4
    # Deterministic: the same inputs give the same noise.
    assert torch.equal(dr.seeded_noise(seeds, starts, columns.flatten()).cpu().double(), noise)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.usefixtures("sglang_groups")
def test_captured_seeded_step_drafts_as_the_eager_body(monkeypatch) -> None:
    """The seeded noise inside the captured step (the step's columns picked on the device): replays
    draft exactly the eager body's tokens for the same seeds."""
    monkeypatch.setattr(dr, "PillarDraftBackend", FakeBackend)
    graphed = make_runner([4], seeded=True)
    graphed.capture()
    for seeds in ([11, 12, 13], [5, 6, 7]):
        tokens, q = seeded_round(graphed, seeds, global_seed=0)
        ref_tokens, ref_q = seeded_round(make_runner([], seeded=True), seeds, global_seed=1)
        assert torch.equal(tokens, ref_tokens) and torch.allclose(q, ref_q)


@pytest.mark.parametrize("greedy", [True, False])
def test_steps_over_a_draft_vocabulary_draft_and_record_its_token_ids(runner, monkeypatch, greedy: bool) -> None:
    """Logits over the draft vocabulary's ids (as the LM head hook scores a draft step): each greedy draft is the
    best of those ids, each sampled one and its record's candidates are among them."""
    from sglang_sparsespec.draft_vocab import DraftVocab

    runner.vocab = vocab = DraftVocab(torch.zeros(V, 4, device=DEVICE), 48)
    vocab.observe(torch.arange(1, V, 2, device=DEVICE))  # the odd ids
    vocab.refresh()
    full = FakeModel.forward

    def over_vocab(self, input_ids, positions, fb):
        out = full(self, input_ids, positions, fb)
        out.next_token_logits = out.next_token_logits[:, vocab.ids]
        return out

    monkeypatch.setattr(FakeModel, "forward", over_vocab)
    rpi, seq_lens, bonus = (torch.tensor(v, device=DEVICE) for v in ([5, 1, 6], [10, 3, 20], [7, 8, 9]))
    torch.manual_seed(1)
    out = runner.run(rpi, seq_lens, bonus, sampling(greedy), 3)
    odd = set(vocab.ids.tolist())
    assert odd == set(range(1, V, 2))
    for b in range(BS):
        tok = int(bonus[b])
        for j in range(3):
            drafted, pos = int(out.tokens[b, j]), int(seq_lens[b]) + j
            peak = next_token(tok, pos, b)
            assert drafted in odd
            if greedy:  # the odd id nearest the peak, the lower on a tie
                assert drafted == min(odd, key=lambda t: (abs(t - peak), t))
            else:
                q = out.record.cand_q[b, j]
                assert set(out.record.cand_ids[b, j][q > 0].tolist()) <= odd and drafted in out.record.cand_ids[b, j]
            tok = drafted


def test_each_draft_step_scans_its_own_input_token_below_the_tail(monkeypatch) -> None:
    """With match heads, every draft step's forward sees the matches of the token it drafts from (the bonus, then
    each draft) in the request's token ids below its plan's tail, as the reference scan finds them, and the listed
    head's copy of them without its plan's positions."""
    seen: list[tuple[torch.Tensor, ...]] = []
    forward = FakeModel.forward
    monkeypatch.setattr(dr, "PillarDraftBackend", FakeBackend)
    runner = make_runner([], match_heads="4@1.2")

    def recording(self, input_ids, positions, fb):
        inputs = runner.inputs
        seen.append((input_ids.clone(), inputs.match_pos.clone(), inputs.match_cnt.clone(), inputs.match_lists.clone()))
        return forward(self, input_ids, positions, fb)

    monkeypatch.setattr(FakeModel, "forward", recording)
    runner.state.token_ids = TokenIds(8, 64 + K + 1, DEVICE)  # as the worker makes them with match heads
    rpi, seq_lens, bonus = (torch.tensor(v, device=DEVICE) for v in ([5, 1, 6], [30, 12, 40], [7, 8, 9]))
    first = runner.run(rpi, seq_lens, bonus, sampling(True), 3).tokens[:BS, :3].clone()
    # Each row's ids drawn from its own chain's tokens, so every step finds some; tails at 20, 0 (drafting densely:
    # nothing scanned) and 33.
    gen = torch.Generator().manual_seed(3)
    for b, row in enumerate(rpi.tolist()):
        chain = torch.cat([bonus[b : b + 1].cpu(), first[b].cpu()])
        runner.state.token_ids.ids[row, :60] = chain[torch.randint(0, 4, (60,), generator=gen)].to(torch.int32)
    runner.state.tail_start[rpi] = torch.tensor([20, 0, 33], dtype=torch.int32, device=DEVICE)
    # Layer 1's head 2 (group 5) of the first row plans positions 0-9: its list drops those.
    runner.state.sel_pos[5, 5, :10] = torch.arange(10, dtype=torch.int32)
    runner.state.sel_cnt[5] = 10
    seen.clear()
    assert torch.equal(runner.run(rpi, seq_lens, bonus, sampling(True), 3).tokens[:BS, :3], first)
    tails = torch.tensor([20, 0, 33], dtype=torch.int32)
    inputs = [bonus.cpu(), *first.cpu().T[:2]]  # step j drafts from the (j - 1)-th draft
    assert [s[0].cpu().tolist() for s in seen] == [t.tolist() for t in inputs]
    state, dropped = runner.state, 0
    for (_, match_pos, match_cnt, lists), tokens in zip(seen, inputs):
        ref = token_match_ref(state.token_ids.ids.cpu(), rpi.cpu(), tokens, tails, 4)
        assert [match_pos[b, : match_cnt[b]].tolist() for b in range(BS)] == ref
        assert ref[1] == [] and ref[0] and ref[2]  # the dense row scans nothing, the others find matches
        plan = (state.sel_pos.cpu(), state.sel_cnt.cpu(), rpi.cpu(), state.match.groups.cpu())
        own = match_lists_ref(match_pos.cpu(), match_cnt.cpu(), *plan)[0]
        assert [lists[0, b, : match_cnt[b]].tolist() for b in range(BS)] == own
        assert own[0] == [-1 if 0 <= p < 10 else p for p in ref[0]] and own[2] == ref[2]
        dropped += own[0].count(-1) - ref[0].count(-1)
    assert dropped > 0
