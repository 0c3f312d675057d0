"""``PillarVerifyInput.accept`` (patches/verify_input.py): a round's acceptance from its verify logits.

On the CPU the target distribution comes from the torch form of stock's filters
(``target_probs``) under the server's sampling backend; the GPU path computes the same rows
(``stock_probs``, checked here against ``target_probs``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang_sparsespec.patches import verify_input as verify_input_module
from sglang_sparsespec.patches.verify_input import PillarVerifyInput, sampling_rows
from triton_env import DEVICE
from verify_inputs import chain_input

from sglang_sparsespec.sampling import accept as accept_module
from sglang_sparsespec.sampling.accept import stock_accept, use_candidates
from sglang_sparsespec.sampling.rejection import DraftRecord, rejection_sample
from sglang_sparsespec.sampling.target import SamplingBackend, SamplingRows, target_probs

BS, K, V, C = 6, 3, 40, 5


def _sampling_info(greedy: bool, logit_bias: torch.Tensor | None = None):
    temps = torch.full((BS, 1), 0.8)
    top_ks = torch.full((BS,), 1 if greedy else -1, dtype=torch.int32)
    return SimpleNamespace(
        is_all_greedy=greedy, temperatures=temps, top_ps=torch.full((BS,), 0.9), top_ks=top_ks,
        min_ps=torch.zeros(BS), need_min_p_sampling=False, need_top_k_sampling=greedy, need_top_p_sampling=True,
        acc_additive_penalties=None, acc_scaling_penalties=None, logit_bias=logit_bias, sampling_seed=None,
        has_custom_logit_processor=False,
    )  # fmt: skip


def _inputs(seed: int, greedy: bool = False, logit_bias=None):
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.randint(0, V, (BS, K), generator=gen)
    cand_ids = torch.stack([torch.randperm(V, generator=gen)[:C] for _ in range(BS * K)]).view(BS, K, C)
    cand_ids[..., 0] = drafts  # the drafted token is in its proposal's support
    cand_q = torch.softmax(torch.randn(BS, K, C, generator=gen), dim=-1)
    record = DraftRecord(drafts, cand_ids, cand_q, cand_q[..., 0].clone())
    bonus = torch.randint(0, V, (BS, 1), generator=gen)
    verify_input = chain_input(bonus, drafts)
    batch = SimpleNamespace(
        forward_mode=SimpleNamespace(is_idle=lambda: False),
        sampling_info=_sampling_info(greedy, logit_bias),
        return_logprob=False,
        seq_lens=torch.full((BS,), 100),
        reqs=[SimpleNamespace(sampling_params=SimpleNamespace(top_k=1 << 30)) for _ in range(BS)],
    )
    logits = SimpleNamespace(next_token_logits=torch.randn(BS * (K + 1), V, generator=gen) * 3)
    return verify_input, batch, logits, record


@pytest.fixture(autouse=True)
def _single_rank(monkeypatch):
    monkeypatch.setattr(verify_input_module, "_broadcast_from_rank0", lambda *t: None)
    monkeypatch.setattr(verify_input_module, "sampling_backend", lambda: SamplingBackend.FLASHINFER)


def test_sampled_batch_uses_the_record_and_sglang_layout(monkeypatch):
    verify_input, batch, logits, record = _inputs(0)
    verify_input = PillarVerifyInput.extend(verify_input, record)
    raw = logits.next_token_logits.clone()

    def sglang_verify(*a):
        raise AssertionError("a sampled PILLAR batch must not reach SGLang's full-distribution verify")

    monkeypatch.setattr(verify_input_module, "eagle_sample", sglang_verify)
    torch.manual_seed(5)
    predict, accept_lens, accept_index = verify_input.accept(batch, logits)
    # The same coins (SGLang's _verify_coins draws torch.rand) through rejection_sample directly.
    torch.manual_seed(5)
    coins, final = torch.rand(BS, K + 1), torch.rand(BS)
    rows = SamplingRows(torch.full((BS,), 0.8), torch.full((BS,), 0.9), torch.full((BS,), -1, dtype=torch.int32))
    probs = target_probs(raw, rows, repeats=K + 1).view(BS, K + 1, V)
    emitted, n = rejection_sample(probs, record, coins[:, :K], final)
    assert torch.equal(accept_lens, (n + 1).int())
    for b in range(BS):
        slots = accept_index[b].tolist()
        assert slots == [b * (K + 1) + j for j in range(n[b] + 1)] + [-1] * (K - n[b].item())
        assert predict[slots[: n[b] + 1]].tolist() == emitted[b, : n[b] + 1].tolist()
    assert predict.dtype == accept_index.dtype == torch.int32 and predict.shape == (BS * (K + 1),)


def test_logit_bias_reaches_the_target_distribution():
    bias = torch.full((BS, V), -1e4)
    bias[:, 7] = 0.0  # every target row is one-hot at token 7
    verify_input, batch, logits, record = _inputs(1, logit_bias=bias)
    verify_input = PillarVerifyInput.extend(verify_input, record)
    predict, accept_lens, accept_index = verify_input.accept(batch, logits)
    last = accept_index.gather(1, (accept_lens - 1).long()[:, None]).long()
    assert torch.all(predict[last] == 7)


@pytest.mark.parametrize("case", ["plain", "logit_bias", "penalties", "grammar", "logprobs", "custom", "greedy"])
def test_only_a_plain_sampled_verify_reads_kept_logits(case, monkeypatch):
    """--pillar-verify-logits half: bf16 verify logits reach stock_accept as they are only where nothing else
    reads or changes them; every other batch gets SGLang's fp32 values (the exact widening) first. The plain
    batch accepts the same from the kept logits as from their fp32 copy."""
    bias = torch.zeros(BS, V) if case == "logit_bias" else None
    verify_input, batch, logits, record = _inputs(4, greedy=case == "greedy", logit_bias=bias)
    verify_input = PillarVerifyInput.extend(verify_input, None if case == "greedy" else record)
    info = batch.sampling_info
    if case == "penalties":
        info.acc_additive_penalties = torch.zeros(BS, V)
    info.has_custom_logit_processor = case == "custom"
    batch.return_logprob = case == "logprobs"
    masked = []
    grammar = SimpleNamespace(apply=lambda t: masked.append(t.dtype)) if case == "grammar" else None
    if case == "custom":
        monkeypatch.setattr("sglang.srt.layers.sampler.apply_custom_logit_processor", lambda rows, info: None)
    half = logits.next_token_logits.to(torch.bfloat16)
    seen = []

    def recording(logits_, *args):
        seen.append(logits_.dtype)
        return stock_accept(logits_, *args)

    monkeypatch.setattr(verify_input_module, "stock_accept", recording)
    monkeypatch.setattr(
        verify_input_module, "eagle_sample", lambda vi, b, out, g: seen.append(out.next_token_logits.dtype)
    )
    results = []
    for widened in (False, True):
        out = SimpleNamespace(next_token_logits=half.float() if widened else half.clone())
        torch.manual_seed(6)
        results.append(verify_input.accept(batch, out, grammar))
        if not widened:
            assert out.next_token_logits.dtype == (torch.bfloat16 if case == "plain" else torch.float32)
    assert seen == [torch.bfloat16 if case == "plain" else torch.float32, torch.float32]
    assert masked == ([torch.float32] * 2 if case == "grammar" else [])
    if case != "greedy":
        assert all(torch.equal(a, b) for a, b in zip(*results))


@pytest.mark.parametrize("case", ["greedy", "idle"])
def test_plain_greedy_and_idle_batches_run_sglang_sampling(case, monkeypatch):
    verify_input, batch, logits, record = _inputs(2, greedy=True)
    batch.forward_mode = SimpleNamespace(is_idle=lambda: case == "idle")
    verify_input = PillarVerifyInput.extend(verify_input, None)
    sentinel = object()
    monkeypatch.setattr(verify_input_module, "eagle_sample", lambda *a: sentinel)
    assert verify_input.accept(batch, logits) is sentinel


@pytest.mark.parametrize("candidates", [False, True])
def test_the_acceptance_builds_the_first_list_the_worker_chose(candidates, monkeypatch):
    """--pillar-accept-list: the PILLAR worker's choice (``use_candidates``) reaches the target filter of every
    acceptance of the process after it."""
    seen = []
    monkeypatch.setattr(accept_module, "_CANDIDATES", accept_module._CANDIDATES)  # restored after the test
    monkeypatch.setattr(accept_module, "target_filter_fwd", lambda *a, candidates: seen.append(candidates))
    monkeypatch.setattr(accept_module, "rejection_fwd", lambda *a: "accepted")
    use_candidates(candidates)
    logits = SimpleNamespace(is_cuda=True)  # the GPU path, its kernels replaced
    rows = SamplingRows(
        torch.ones(BS), torch.ones(BS), torch.zeros(BS, dtype=torch.int32), None, SamplingBackend.PYTORCH
    )
    cands = torch.zeros(BS, K, C, dtype=torch.int64)
    record = DraftRecord(cands[..., 0], cands, torch.full((BS, K, C), 1 / C), torch.full((BS, K), 1 / C))
    assert stock_accept(logits, rows, record, None, None) == "accepted"
    assert seen == [candidates]


@pytest.mark.parametrize("first_list", ["bins", "candidates"])
@pytest.mark.parametrize("backend", list(SamplingBackend))
@pytest.mark.parametrize("min_p", [False, True])
def test_stock_accept_reads_the_batch_as_sglang_lays_it_out(min_p, backend, first_list, monkeypatch):
    """sampling_rows reads sampling_info as SGLang lays it out (temperatures [bs, 1], off filters as
    TOP_K_ALL / 1.0, greedy requests as top_k 1 at temperature 1, min_ps only when needed) and the
    backend from the server args; stock_accept then gives the reference's tokens for the same coins
    (on the GPU through the kernels)."""
    from sglang.srt.sampling.sampling_params import TOP_K_ALL

    _, batch, logits, record = _inputs(3)
    info = batch.sampling_info
    info.top_ks = torch.tensor([TOP_K_ALL, 1, 4, TOP_K_ALL, 12, 1], dtype=torch.int32, device=DEVICE)
    info.top_ps = torch.tensor([0.9, 1.0, 0.95, 1.0, 0.6, 0.9], device=DEVICE)
    info.temperatures = torch.tensor([[0.6], [1.0], [1.0], [1.5], [0.8], [1.0]], device=DEVICE)
    info.min_ps = torch.tensor([0.0, 0.0, 0.1, 0.05, 0.0, 0.2], device=DEVICE)
    info.need_min_p_sampling = min_p
    monkeypatch.setattr(verify_input_module, "sampling_backend", lambda: backend)
    monkeypatch.setattr(accept_module, "_CANDIDATES", first_list == "candidates")  # either list, on the GPU
    raw = (logits.next_token_logits * 2).round().to(DEVICE)  # ties at the cut
    record = DraftRecord(*(t.to(DEVICE) for t in (record.tokens, record.cand_ids, record.cand_q, record.q_tok)))
    gen = torch.Generator().manual_seed(4)
    coins, final = torch.rand(BS, K, generator=gen).to(DEVICE), torch.rand(BS, generator=gen).to(DEVICE)
    rows = SamplingRows(info.temperatures.view(-1), info.top_ps, info.top_ks, info.min_ps if min_p else None, backend)
    want = rejection_sample(target_probs(raw, rows, K + 1).view(BS, K + 1, V), record, coins, final)
    got = stock_accept(raw, sampling_rows(info), record, coins, final)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert sampling_rows(info).backend is backend
    assert (sampling_rows(info).min_p is None) is not min_p
