"""One whole speculative round on the CPU: ``Rounds.decode`` of a small batch whose requests draft
different counts, through the round's own verify (``patches/verify.py``: KV slots, forward, result) and
acceptance (``PillarVerifyInput.accept``), with stand-ins for the model forwards only: the draft runner
proposes tokens from one rule, the target's verify forward scores each row by another, so acceptance
varies by request and position. Triton kernels (SGLang's slot and bonus-token kernels) run in the
interpreter on the round's CPU tensors, so a compiled (GPU) run skips this module: the served round is
checked there by the servers' own runs.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_sparsespec.patches import rounds as rounds_module
from sglang_sparsespec.patches import verify as verify_module
from sglang_sparsespec.patches import verify_input as verify_input_module
from sglang_sparsespec.patches.rounds import Rounds
from sglang_sparsespec.patches.verify import Pools
from test_request_exactness import sampling_info
from triton_env import INTERPRET
from verify_inputs import chain_input

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.draft_vocab import DraftVocab
from sglang_sparsespec.metrics import PillarMetrics
from sglang_sparsespec.rounds.launch import RoundShape
from sglang_sparsespec.selection.match_heads import TokenIds

pytestmark = pytest.mark.skipif(not INTERPRET, reason="a round of CPU tensors: SGLang's kernels in the interpreter")

K, V, POOL_LEN = 3, 50, 64
RPI = [5, 2, 7, 0]  # the requests' pool rows
SEQ = [10, 4, 20, 7]  # committed lengths (tokens with KV)
NUM_DRAFTS = [3, 0, 2, 3]  # request 1 takes one token (per-token sampling state); request 2 drafts 2 of 3
BONUS = [11, 3, 40, 8]  # each request's pending token


def target_next(token: int, pos: int) -> int:
    """The target model's greedy next token after ``token`` at ``pos``."""
    return (3 * token + pos) % V


def draft_next(token: int, pos: int) -> int:
    """The sparse draft's token: the target's, except where (token + pos) % 4 == 0."""
    t = target_next(token, pos)
    return (t + 1) % V if (token + pos) % 4 == 0 else t


class FakeForwardBatch(SimpleNamespace):
    """What the verify's ForwardBatch carries for the stand-in forward."""

    @classmethod
    def init_new(cls, batch, model_runner, capture_hidden_mode, return_hidden_states_before_norm):
        return cls(
            forward_mode=batch.forward_mode,
            input_ids=batch.input_ids,
            out_cache_loc=batch.out_cache_loc,
            positions=batch.spec_info.positions,
            ready=False,
        )

    def mark_forward_metadata_ready(self):
        self.ready = True


class Target:
    """The target worker: its verify forward gives every row one-hot logits at ``target_next``."""

    def __init__(self):
        self.model_runner = SimpleNamespace(attn_backend=None, decode_cuda_graph_runner=None)
        self.forwards: list[FakeForwardBatch] = []

    def forward_batch_generation(self, batch, forward_batch, is_verify):
        assert batch is None and is_verify and forward_batch.forward_mode is ForwardMode.TARGET_VERIFY
        self.forwards.append(forward_batch)
        nxt = [target_next(t, p) for t, p in zip(forward_batch.input_ids.tolist(), forward_batch.positions.tolist())]
        logits = torch.full((len(nxt), V), -10.0)
        logits[torch.arange(len(nxt)), torch.tensor(nxt)] = 10.0
        return SimpleNamespace(
            logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=None),
            routed_experts_output=None,
            indexer_topk_output=None,
        )


class DraftRunner:
    def __init__(self):
        self.calls = []
        self.vocab = None  # no draft vocabulary: the steps score every id

    def run(self, rpi, seq_lens, bonus, sampling_info, steps, dense):
        self.calls.append((rpi.tolist(), seq_lens.tolist(), bonus.tolist(), steps, dense))
        tokens = []
        for b, tok in enumerate(bonus.tolist()):
            row, pos = [], seq_lens[b].item()
            for _ in range(steps):
                tok, pos = draft_next(tok, pos), pos + 1
                row.append(tok)
            tokens.append(row)
        return SimpleNamespace(tokens=torch.tensor(tokens), record=None)  # greedy: no record


class Clock:
    def __init__(self):
        self.marks = []

    def __getattr__(self, name):
        if name in ("start", "drafted", "verified", "accepted", "end", "interrupt"):
            return lambda *a: self.marks.append(name)
        raise AttributeError(name)


def expected_run(b: int) -> list[int]:
    """Request b's accepted drafts and the target's token after them (greedy chain rule)."""
    tok, pos, out = BONUS[b], SEQ[b], []
    for _ in range(NUM_DRAFTS[b]):
        d = draft_next(tok, pos)
        if d != target_next(tok, pos):
            break
        out.append(d)
        tok, pos = d, pos + 1
    return out + [target_next(tok, pos)]


@pytest.fixture
def round_parts(monkeypatch):
    monkeypatch.setattr(verify_module, "ForwardBatch", FakeForwardBatch)
    monkeypatch.setattr(verify_input_module, "_broadcast_from_rank0", lambda *t: None)

    def build_chain(batch, draft_input, parents, scores_index, drafts, probs, **kw):
        # SGLang's topk=1 chain layout (its tree builder is a CUDA kernel): the bonus, then the drafts.
        chain = chain_input(draft_input.bonus_tokens.to(torch.int64), drafts)
        chain.positions = (batch.seq_lens[:, None] + torch.arange(K + 1)).reshape(-1)
        return chain

    monkeypatch.setattr(rounds_module, "build_eagle_verify_input", build_chain)
    req_to_token = torch.arange(8 * POOL_LEN, dtype=torch.int32).view(8, POOL_LEN) * 7 + 1000  # distinct slots
    target, selector = Target(), SimpleNamespace(calls=[])
    selector.after_verify = lambda *a: selector.calls.append(a)
    pools = Pools(target, SimpleNamespace(req_to_token=req_to_token), None, contextlib.nullcontext())
    planner = SimpleNamespace(shape=lambda batch: RoundShape(K, num_drafts=NUM_DRAFTS))
    clock = Clock()
    rounds = Rounds(PillarConfig.from_env(K), pools, planner, clock, PillarMetrics(K), selector, DraftRunner(),
                    mixed=None, plain=None, max_bs=8, device="cpu")  # fmt: skip
    batch = SimpleNamespace(
        forward_mode=ForwardMode.DECODE, reqs=[SimpleNamespace(rid=str(b)) for b in range(4)],
        req_pool_indices=torch.tensor(RPI), seq_lens=torch.tensor(SEQ), seq_lens_sum=None, seq_lens_cpu=None,
        spec_info=SimpleNamespace(bonus_tokens=torch.tensor(BONUS, dtype=torch.int32)),
        sampling_info=sampling_info(4, True), model_config=SimpleNamespace(vocab_size=V),
        has_grammar=False, return_logprob=False, input_ids=None, out_cache_loc=None,
    )  # fmt: skip
    return rounds, batch, req_to_token, target, selector, clock


def test_a_speculative_round_accepts_each_request_within_its_own_draft_count(round_parts):
    rounds, batch, req_to_token, target, selector, clock = round_parts
    published = []
    result = rounds.decode(batch, published.append, None)
    runs = [expected_run(b) for b in range(4)]
    assert [len(r) for r in runs] != [NUM_DRAFTS[b] + 1 for b in range(4)]  # some drafts are rejected
    assert len(runs[1]) == 1  # no drafts: the target's own token

    # Accepted tokens and lengths in SGLang's layout: run j of request b in slot b * (K + 1) + j.
    assert result.accept_lens.tolist() == [len(r) for r in runs] and result.accept_lens.dtype == torch.int32
    predict = result.next_token_ids.view(4, K + 1)
    for b, run in enumerate(runs):
        assert predict[b, : len(run)].tolist() == run
        assert predict[b, len(run) :].tolist() == [0] * (K + 1 - len(run))
    assert result.speculative_num_draft_tokens == K + 1
    # The next round starts from each request's last emitted token; its lengths count the accepted run.
    assert result.next_draft_input.bonus_tokens.tolist() == [r[-1] for r in runs]
    assert result.new_seq_lens.tolist() == [s + len(r) for s, r in zip(SEQ, runs)]
    assert published == [result.new_seq_lens]

    # KV slots: the verify wrote request b's K + 1 rows at its pool row's slots seq_len .. seq_len + K.
    (fb,) = target.forwards
    want_slots = torch.cat([req_to_token[r, s : s + K + 1] for r, s in zip(RPI, SEQ)]).to(torch.int64)
    assert torch.equal(fb.out_cache_loc, want_slots) and torch.equal(batch.out_cache_loc, want_slots)
    assert batch.forward_mode is ForwardMode.TARGET_VERIFY and not fb.ready  # eager: planned in the forward
    drafts = rounds.draft_runner.calls[0]
    assert drafts[:4] == (RPI, SEQ, BONUS, K)
    assert fb.input_ids.view(4, K + 1)[:, 0].tolist() == BONUS
    assert fb.positions.view(4, K + 1).tolist() == [list(range(s, s + K + 1)) for s in SEQ]
    assert result.extra_keep_alive_refs == [fb] and not result.can_run_cuda_graph

    # The selection read the round's lengths before and after; the clock marked every phase in order.
    ((rpi, before, after),) = selector.calls
    assert rpi.tolist() == RPI and before.tolist() == SEQ and after is result.new_seq_lens
    assert clock.marks == ["start", "drafted", "verified", "accepted", "end"]


def test_a_round_counts_each_requests_committed_token_for_the_draft_vocabulary(round_parts):
    """With a draft vocabulary the round's end counts every request's next pending token (from the target)."""
    rounds, batch, *_ = round_parts
    vocab = rounds.draft_runner.vocab = DraftVocab(torch.zeros(V, 8), 16)
    result = rounds.decode(batch, None, None)
    counted = torch.zeros(V)
    counted.index_add_(0, result.next_draft_input.bonus_tokens.cpu(), torch.ones(4))
    assert torch.equal(vocab.counts.cpu(), counted) and counted.sum() == 4


def test_a_prefill_counts_its_prompt_tokens_for_the_draft_vocabulary(round_parts):
    rounds, _, _, target, selector, _ = round_parts
    vocab = rounds.draft_runner.vocab = DraftVocab(torch.zeros(V, 8), 16)
    prompt = torch.tensor([4, 9, 9, 30, 4, 4])
    target.forward_batch_generation = lambda batch: SimpleNamespace(next_token_ids=torch.tensor([5, 6]))
    selector.after_prefill = lambda *a: None
    batch = SimpleNamespace(input_ids=prompt, req_pool_indices=torch.tensor([0, 1]), seq_lens=torch.tensor([2, 4]))
    rounds.prefill(batch, None)
    assert {i: int(c) for i, c in enumerate(vocab.counts.tolist()) if c} == {4: 3, 9: 2, 30: 1}


def test_match_heads_token_ids_hold_every_committed_token_at_its_position(round_parts):
    """With match heads, a prefill writes each request's whole known sequence (prompt and, after retraction, its
    outputs) at positions 0.., a round its pending token at seq_len and its drafts after it; after the round, the
    positions below each new length hold exactly the tokens committed there, the ones a scan may read."""
    rounds, batch, _, target, selector, _ = round_parts
    rounds.token_ids = TokenIds(8, POOL_LEN + K + 1, "cpu")
    verify_forward = target.forward_batch_generation
    target.forward_batch_generation = lambda b: SimpleNamespace(next_token_ids=torch.tensor([5, 6]))
    selector.after_prefill = lambda *a: None
    reqs = [SimpleNamespace(rid="a", req_pool_idx=5, origin_input_ids=[7] * 10, output_ids=[]),
            SimpleNamespace(rid="b", req_pool_idx=2, origin_input_ids=[1, 2], output_ids=[3, 4])]  # fmt: skip
    rounds.prefill(SimpleNamespace(reqs=reqs, input_ids=None, req_pool_indices=None, seq_lens=None), None)
    ids = rounds.token_ids.ids
    assert ids[5, :11].tolist() == [7] * 10 + [0] and ids[2, :5].tolist() == [1, 2, 3, 4, 0]
    target.forward_batch_generation = verify_forward
    result = rounds.decode(batch, None, None)
    for b, (row, seq) in enumerate(zip(RPI, SEQ)):
        committed = [BONUS[b], *expected_run(b)[:-1]]  # the pending token, then the accepted drafts
        assert int(result.new_seq_lens[b]) == seq + len(committed)
        assert ids[row, seq : seq + len(committed)].tolist() == committed
