"""Requests whose sampling state is per token: penalties, min_new_tokens, custom logit processors.

SGLang's penalizers (``penaltylib``) keep one state row per request, cumulated with one token per
round, and the verify adds that row to every one of the request's k + 1 rows; a processor sees the
request as it was before the round. ``patches/request_rounds.py`` gives such requests no drafts, so
they take row 0's token each round while the rest of the batch drafts; ``patches/verify_input.py``
applies processors to row 0 and honours per-request draft counts in greedy batches too.

The end-to-end tests run SGLang's own penalizer orchestrator over a deterministic stand-in model,
once as stock decoding (one token per step) and once as PILLAR rounds through ``PillarVerifyInput.accept``
with drafts from the unpenalized model, greedily, and compare the outputs token by token; the same
rounds with every request drafting (what SGLang's verify would do) must differ, or the test proves
nothing.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.sampling import penaltylib
from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
from sglang.srt.sampling.penaltylib import repetition_penalty
from sglang_sparsespec.patches import verify_input as verify_input_module
from sglang_sparsespec.patches.request_rounds import num_drafts_for, single_token, single_token_rows
from sglang_sparsespec.patches.verify_input import PillarVerifyInput
from verify_inputs import chain_input

from sglang_sparsespec.sampling.rejection import DraftRecord
from sglang_sparsespec.sampling.target import SamplingBackend
from planner_parts import DoneEvent


def draft_counts(batch, steps: int) -> list[int] | None:
    """A round's per-request draft counts as the planner derives them from the batch."""
    return num_drafts_for(single_token_rows(batch), steps)


V, K, EOS = 32, 3, 2
PROMPT = [5, 6, 7]


def make_req(freq=0.0, pres=0.0, rep=1.0, min_new=0, processor=None, out=(), retractions=0):
    sp = SimpleNamespace(
        frequency_penalty=freq,
        presence_penalty=pres,
        repetition_penalty=rep,
        min_new_tokens=min_new,
        stop_token_ids={EOS},
    )
    return SimpleNamespace(
        sampling_params=sp,
        output_ids=list(out),
        retraction_count=retractions,
        custom_logit_processor=processor,
        tokenizer=SimpleNamespace(eos_token_id=EOS, additional_stop_token_ids=None),
        eos_token_ids=None,  # the model's own EOS ids, which min_new_tokens suppresses too from 0.5.23
    )


def processors(processor, mask: torch.Tensor) -> dict:
    """SamplingBatchInfo.custom_logit_processor for one processor over the rows of ``mask``, as the installed
    release builds it: (processor, mask) up to 0.5.20, a ProcessorEntry of rows and indices from 0.5.21."""
    from sglang.srt.sampling import sampling_batch_info

    if not hasattr(sampling_batch_info, "ProcessorEntry"):
        return {0: (processor, mask)}
    rows = mask.nonzero().flatten().tolist()
    return {0: sampling_batch_info.ProcessorEntry(processor=processor, rows=rows, indices=torch.tensor(rows))}


class SamplingInfo(SimpleNamespace):
    def __len__(self) -> int:  # SamplingBatchInfo's length (apply_custom_logit_processor checks it)
        return self.temperatures.shape[0]


def sampling_info(bs: int, greedy: bool, **kw) -> SamplingInfo:
    fields = dict(
        is_all_greedy=greedy,
        temperatures=torch.full((bs, 1), 0.7),
        top_ps=torch.ones(bs),
        top_ks=torch.full((bs,), 1 if greedy else -1, dtype=torch.int32),
        min_ps=torch.zeros(bs),
        need_min_p_sampling=False,
        need_top_k_sampling=greedy,
        need_top_p_sampling=False,
        acc_additive_penalties=None,
        acc_scaling_penalties=None,
        logit_bias=None,
        sampling_seed=None,
        has_custom_logit_processor=False,
        custom_logit_processor=None,
        custom_params=None,
        penalizer_orchestrator=None,
    )
    fields.update(kw)
    return SamplingInfo(**fields)


def batch_of(reqs: list, penalized: bool) -> SimpleNamespace:
    """A scheduler batch of ``reqs`` whose penalizer orchestrator is (or is not) required."""
    si = sampling_info(len(reqs), True, penalizer_orchestrator=SimpleNamespace(is_required=penalized))
    return SimpleNamespace(reqs=reqs, sampling_info=si)


def verify(si, reqs, bonus, drafts, logits, counts, record=None):
    """One PILLAR verify's acceptance; returns each request's accepted run (a list of ids)."""
    bs = len(reqs)
    vi = PillarVerifyInput.extend(chain_input(bonus, drafts), record, counts)
    batch = SimpleNamespace(
        forward_mode=SimpleNamespace(is_idle=lambda: False),
        sampling_info=si,
        return_logprob=False,
        seq_lens=torch.full((bs,), 50),
        reqs=[SimpleNamespace(sampling_params=SimpleNamespace(top_k=1 << 30)) for _ in reqs],
    )

    predict, accept_lens, accept_index = vi.accept(batch, SimpleNamespace(next_token_logits=logits))
    return [predict[accept_index[b, : accept_lens[b]].long()].tolist() for b in range(bs)]


@pytest.fixture(autouse=True)
def _cpu(monkeypatch):
    monkeypatch.setattr(verify_input_module, "_broadcast_from_rank0", lambda *t: None)
    monkeypatch.setattr(verify_input_module, "sampling_backend", lambda: SamplingBackend.FLASHINFER)  # no server args

    def sglang_verify(*a):
        raise AssertionError("these rounds are accepted by PILLAR's verify")

    monkeypatch.setattr(verify_input_module, "eagle_sample", sglang_verify)

    def eager_scaling(logits, scaling):  # SGLang's rule, without its torch.compile wrapper (CPU test)
        logits[:] = torch.where(logits < 0, logits * scaling, logits / scaling)

    monkeypatch.setattr(repetition_penalty, "apply_scaling_penalties", eager_scaling)


# ---- which requests take one token per round ------------------------------------------------
def test_requests_with_per_token_state_draft_nothing():
    assert not single_token(make_req())
    assert single_token(make_req(freq=0.5)) and single_token(make_req(pres=-0.3)) and single_token(make_req(rep=1.2))
    assert single_token(make_req(processor="{}"))
    # min_new_tokens: only while the output is below it (the penalizer's count is at least that long)...
    assert single_token(make_req(min_new=4, out=[1, 1, 1]))
    assert not single_token(make_req(min_new=4, out=[1, 1, 1, 1]))
    # ...unless a retraction restarted the penalizer's count under a kept output.
    assert single_token(make_req(min_new=4, out=[1] * 9, retractions=1))
    reqs = [make_req(), make_req(freq=1.0), make_req()]
    assert draft_counts(batch_of(reqs, penalized=True), 3) == [3, 0, 3]
    assert draft_counts(batch_of([make_req(), make_req()], penalized=True), 3) is None  # the batch's own count serves
    assert draft_counts(batch_of(reqs, penalized=True), 0) is None  # a plain round takes one token from everyone


class _Untouchable:
    def __getattr__(self, name):
        raise AssertionError(f"a batch without per-token state had a request read ({name})")


def test_draft_counts_reads_requests_only_where_the_batch_holds_per_token_state():
    """The per-round walk over the requests runs only when the batch's sampling info says some request
    may need it; the overlap scheduler's forward copy (orchestrator dropped) says so by its penalty rows."""
    plain = [_Untouchable()] * 4
    assert draft_counts(batch_of(plain, penalized=False), 3) is None
    reqs = [make_req(min_new=4), make_req()]
    si = sampling_info(2, True, acc_additive_penalties=torch.zeros(2, V))  # the forward copy's view
    assert si.penalizer_orchestrator is None
    assert draft_counts(SimpleNamespace(reqs=reqs, sampling_info=si), 3) == [0, 3]
    si = sampling_info(2, True, has_custom_logit_processor=True)
    assert draft_counts(SimpleNamespace(reqs=[make_req(processor="{}"), make_req()], sampling_info=si), 3) == [0, 3]
    orch = SimpleNamespace(is_required=True)  # the scheduler's own batch: the orchestrator answers
    si = sampling_info(2, True, penalizer_orchestrator=orch)
    assert draft_counts(SimpleNamespace(reqs=[make_req(rep=1.1), make_req()], sampling_info=si), 3) == [0, 3]


# ---- penalties and min_new_tokens against stock decoding --------------------------------------
def looping_model(ctx: list[int]) -> torch.Tensor:
    """Logits after ``ctx``: a fixed random part plus a strong pull back to the token two steps back
    (greedy decoding loops with period 2 unless a penalty breaks the loop)."""
    g = torch.Generator().manual_seed((ctx[-1] * 131 + ctx[-2] * 7 + len(ctx) * 1009) % (1 << 31))
    logits = torch.randn(V, generator=g)
    logits[ctx[-2]] += 3.0
    logits[EOS] = -1e4  # never ends
    return logits


def counting_model(ctx: list[int]) -> torch.Tensor:
    """Counts up through ids 10..29 for 6 output tokens, then prefers EOS (counting second)."""
    logits = torch.zeros(V)
    up = 10 + (ctx[-1] + 1) % 20
    early = len(ctx) < len(PROMPT) + 6
    logits[up], logits[EOS] = (5.0, 4.0) if early else (4.0, 5.0)
    return logits


class Holder:  # what the orchestrator reads of a ScheduleBatch
    def __init__(self, reqs):
        self.reqs, self.device = reqs, "cpu"


def orchestrator(holder: Holder) -> penaltylib.BatchedPenalizerOrchestrator:
    return penaltylib.BatchedPenalizerOrchestrator(
        V,
        holder,
        {
            penaltylib.BatchedFrequencyPenalizer,
            penaltylib.BatchedMinNewTokensPenalizer,
            penaltylib.BatchedPresencePenalizer,
            penaltylib.BatchedRepetitionPenalizer,
        },
    )


def penalized(orch, logits: torch.Tensor, repeat: int = 1) -> SimpleNamespace:
    """SamplingBatchInfo.update_penalties: the accumulated rows the forward copy carries."""
    add = torch.zeros((logits.shape[0] // repeat, V))
    orch.accumulate_additive_penalties(add)
    return SimpleNamespace(acc_additive_penalties=add, acc_scaling_penalties=orch.accumulate_scaling_penalties())


def stock_decode(model, req, n: int) -> list[int]:
    """Stock greedy decoding: the prefill's token, then per step cumulate the last token
    (ScheduleBatch.cumulate_penalty_output_tokens), apply the penalties, take the argmax."""
    orch = orchestrator(Holder([req]))
    out: list[int] = []
    while len(out) < n and EOS not in out:
        if out:
            orch.cumulate_output_tokens(torch.tensor([out[-1]]))
        logits = model(PROMPT + out)[None].clone()
        pen = penalized(orch, logits)
        logits += pen.acc_additive_penalties
        if pen.acc_scaling_penalties is not None:
            repetition_penalty.apply_scaling_penalties(logits, pen.acc_scaling_penalties)
        out.append(int(logits.argmax()))
    return out


def pillar_decode(model, reqs, n: int, per_request: bool) -> list[list[int]]:
    """PILLAR rounds: each request drafts K tokens greedily from the unpenalized model; the verify
    scores K + 1 rows with one penalty row per request. ``per_request``: draft counts from
    request_rounds (else every request drafts, as SGLang's verify would accept)."""
    orch = orchestrator(Holder(reqs))
    outs = [[] for _ in reqs]
    # The prefill's token, as stock (no PILLAR code runs there).
    first = torch.stack([model(PROMPT) for _ in reqs])
    pen = penalized(orch, first)
    first += pen.acc_additive_penalties
    if pen.acc_scaling_penalties is not None:
        repetition_penalty.apply_scaling_penalties(first, pen.acc_scaling_penalties)
    for b, r in enumerate(reqs):
        outs[b].append(int(first[b].argmax()))
        r.output_ids = outs[b]
    while any(len(o) < n and EOS not in o for o in outs):
        orch.cumulate_output_tokens(torch.tensor([o[-1] for o in outs]))  # eagle_prepare_for_decode
        drafts, rows = [], []
        for o in outs:
            ctx, chain = PROMPT + o, []
            for _ in range(K):
                rows.append(model(ctx + chain))
                chain.append(int(rows[-1].argmax()))
            rows.append(model(ctx + chain))
            drafts.append(chain)
        logits = torch.stack(rows)
        si = sampling_info(len(reqs), True, **vars(penalized(orch, logits, K + 1)))
        counts = draft_counts(SimpleNamespace(reqs=reqs, sampling_info=si), K) if per_request else None
        counts = torch.tensor(counts if counts is not None else [K] * len(reqs), dtype=torch.int32)
        bonus = torch.tensor([o[-1] for o in outs])
        for b, run in enumerate(verify(si, reqs, bonus, torch.tensor(drafts), logits, counts)):
            outs[b].extend(run)
    return outs


def test_penalized_requests_decode_as_stock_token_by_token():
    n = 40
    plain = make_req()
    cases = [make_req(freq=0.8), make_req(pres=1.5), make_req(rep=1.8), make_req(freq=0.4, rep=1.3)]
    reqs = [plain, *cases]
    new = pillar_decode(looping_model, reqs, n, per_request=True)
    old = pillar_decode(looping_model, [make_req(), *[make_req(**_params(r)) for r in cases]], n, per_request=False)
    for b, r in enumerate(cases, start=1):
        stock = stock_decode(looping_model, make_req(**_params(r)), n)
        assert new[b][:n] == stock, b
    assert any(old[b][:n] != stock_decode(looping_model, make_req(**_params(r)), n) for b, r in enumerate(cases, 1))
    assert new[0][:n] == stock_decode(looping_model, make_req(), n)  # the drafting request: unpenalized, exact


def _params(r) -> dict:
    sp = r.sampling_params
    return dict(
        freq=sp.frequency_penalty, pres=sp.presence_penalty, rep=sp.repetition_penalty, min_new=sp.min_new_tokens
    )


@pytest.mark.parametrize("min_new", [3, 10, 14])
def test_min_new_tokens_ends_where_stock_ends(min_new):
    stock = stock_decode(counting_model, make_req(min_new=min_new), 40)
    assert stock[-1] == EOS and len(stock) == max(min_new, 6) + 1
    new = pillar_decode(counting_model, [make_req(), make_req(min_new=min_new)], 40, per_request=True)
    assert new[1][: len(stock)] == stock
    if min_new > 6:  # counting rounds, SGLang's verify masks EOS for longer than min_new_tokens tokens
        old = pillar_decode(counting_model, [make_req(), make_req(min_new=min_new)], 40, per_request=False)
        assert old[1][: len(stock)] != stock


# ---- custom logit processors ------------------------------------------------------------------
class ForceToken(CustomLogitProcessor):
    calls: list[int] = []

    def __call__(self, logits, custom_param_list=None):
        ForceToken.calls.append(logits.shape[0])
        for i, param in enumerate(custom_param_list):
            logits[i] = torch.where(torch.arange(logits.shape[1]) == param["token"], 0.0, float("-inf"))
        return logits


@pytest.mark.parametrize("greedy", [True, False])
def test_a_processor_that_forces_a_token_is_applied_to_row_zero(greedy):
    bs, forced = 3, 11
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(bs * (K + 1), V, generator=gen)
    drafts = logits.view(bs, K + 1, V)[:, :K].argmax(-1)  # greedy drafts the verify accepts in full
    mask = torch.tensor([False, True, False])
    reqs = [make_req(), make_req(processor="force"), make_req()]
    si = sampling_info(
        bs,
        greedy,
        has_custom_logit_processor=True,
        custom_logit_processor=processors(ForceToken(), mask),
        custom_params=[None, {"token": forced}, None],
    )
    record = None
    if not greedy:  # proposals one-hot on the drafts (q = 1 where drawn)
        ids = drafts[..., None].expand(bs, K, 4).contiguous()
        q = torch.tensor([1.0, 0.0, 0.0, 0.0]).expand(bs, K, 4).contiguous()
        record = DraftRecord(drafts, ids, q, torch.ones(bs, K), num_drafts=K)
    counts = torch.tensor(draft_counts(SimpleNamespace(reqs=reqs, sampling_info=si), K), dtype=torch.int32)
    ForceToken.calls.clear()
    torch.manual_seed(0)
    runs = verify(si, reqs, torch.tensor([1, 2, 3]), drafts, logits.clone(), counts, record)
    assert runs[1] == [forced]  # one token, the forced one
    assert ForceToken.calls == [1]  # once, on the one request's row 0
    if greedy:  # the others accept every draft and the token after them
        assert runs[0] == drafts[0].tolist() + [int(logits[K].argmax())]
        assert len(runs[2]) == K + 1


def test_a_processor_reaches_plain_greedy_rounds():
    """A zero-draft round (width 1) of an all-greedy batch: SGLang's verify would skip the processor."""
    global K
    saved, K = K, 0
    try:
        reqs = [make_req(processor="force"), make_req()]
        si = sampling_info(
            2,
            True,
            has_custom_logit_processor=True,
            custom_logit_processor=processors(ForceToken(), torch.tensor([True, False])),
            custom_params=[{"token": 4}, None],
        )
        logits = torch.randn(2, V, generator=torch.Generator().manual_seed(1))
        runs = verify(si, reqs, torch.tensor([1, 2]), torch.zeros((2, 0), dtype=torch.int64), logits.clone(), None)
        assert runs == [[4], [int(logits[1].argmax())]]
    finally:
        K = saved


def test_a_sampled_request_without_drafts_draws_from_row_zero():
    """Its token is the final coin's inverse-CDF draw from row 0's distribution (penalty included)."""
    bs = 2
    gen = torch.Generator().manual_seed(4)
    logits = torch.randn(bs * (K + 1), V, generator=gen)
    drafts = torch.randint(0, V, (bs, K), generator=gen)
    ids = drafts[..., None].expand(bs, K, 4).contiguous()
    q = torch.tensor([1.0, 0.0, 0.0, 0.0]).expand(bs, K, 4).contiguous()
    record = DraftRecord(drafts, ids, q, torch.ones(bs, K), num_drafts=K)
    additive = torch.zeros(bs, V)
    additive[1, :5] = -3.0  # a penalty row on the zero-draft request
    si = sampling_info(bs, False, acc_additive_penalties=additive)
    counts = torch.tensor([K, 0], dtype=torch.int32)
    for seed in range(20):
        torch.manual_seed(seed)
        runs = verify(
            si, [make_req(), make_req(freq=1.0)], torch.tensor([1, 2]), drafts, logits.clone(), counts, record
        )
        torch.manual_seed(seed)  # the verify's coins (SGLang's _verify_coins: torch.rand)
        torch.rand(bs, K + 1)
        final = torch.rand(bs)
        p = torch.softmax((logits[K + 1] + additive[1]) / 0.7, dim=-1)
        cdf = p.cumsum(0)
        assert runs[1] == [int(torch.searchsorted(cdf, final[1] * cdf[-1], right=True))]


# ---- seeds: fixed round shapes under deterministic inference ----------------------------------
def test_deterministic_inference_fixes_the_round_shape():
    from sglang_sparsespec.patches.round_plan import seeded_config

    from sglang_sparsespec.config import PillarConfig

    cfg = PillarConfig(num_steps=4, adaptive_steps="0,2", force_steps=2)
    assert seeded_config(cfg, SimpleNamespace(enable_deterministic_inference=False)) is cfg
    fixed = seeded_config(cfg, SimpleNamespace(enable_deterministic_inference=True))
    assert not fixed.adaptive and fixed.step_candidates == (4,) and fixed.force_steps == -1


# ---- a batch where nobody would draft runs a plain round ----------------------------------------
class _PolicyReq:  # what the policy and DenseChooser read of a Req (weakly referenced), plus its sampling
    def __init__(self, **params) -> None:
        self.__dict__.update(vars(make_req(**params)))
        self.seqlen, self.rid = 2000, "9f1c2ab0e4"


@pytest.mark.parametrize("penalized", [[True, True, True], [True, False, True]])
def test_a_batch_where_nobody_drafts_runs_a_plain_round(penalized):
    from sglang_sparsespec.adaptive.dense import DenseChooser
    from sglang_sparsespec.adaptive.policy import RoundSample, SpeculationPolicy
    from sglang_sparsespec.metrics import PillarMetrics
    from sglang_sparsespec.patches.round_plan import RoundPlanner
    from sglang_sparsespec.patches.tp_agree import RoundAgreement
    from sglang_sparsespec.rounds.clock import RoundClock

    policy = SpeculationPolicy((0, 2, 4, 8))
    cfg = SimpleNamespace(num_steps=8, force_steps=-1, step_candidates=(0, 2, 4, 8))
    planner = RoundPlanner(cfg, PillarMetrics(8), RoundClock(DoneEvent), policy=policy, agreement=RoundAgreement(None))
    planner.set_dense(DenseChooser(lambda n: min(n, 128), 23040, 30, lambda bs: 22))
    reqs = [_PolicyReq(rep=1.2) if p else _PolicyReq() for p in penalized]
    batch = SimpleNamespace(**vars(batch_of(reqs, penalized=True)), forward_mode=SimpleNamespace(is_idle=lambda: False))
    key = policy.choose(3, 2000)[1]
    # Drafting pays; enough rounds of each mode that the costs are priced past their warm-up samples.
    policy.observe([RoundSample(key, 0, 0.0, 3.0, 0.2), RoundSample(key, 8, 1.0, 3.0, 0.2)] * 4)
    steps = planner.shape(batch).steps
    if not all(penalized):
        assert steps == 8  # one request drafts: the policy's round
        return
    assert steps == 0
    planner.completed([0, 0, 0])  # a plain round teaches the acceptance nothing
    assert policy.acceptance.alpha == pytest.approx(0.7)
