"""Drafted chains over several rounds under stock's production sampling rules, against the target's own law.

A toy model over V = 8 tokens whose target and draft logits (bf16, multiples of 0.5: many ties at the top-k
/ top-p cut) depend on the token before and on the output position's parity. Each chain starts from its own
context token and decodes L = 6 tokens in PILLAR rounds until every chain has them: K = 3 drafts per round
from the draft sampler (``kernels/draft_sample``'s reference; at most C = 4 candidates, so proposals wider
than that are truncated), each request drafting its own count 0..K (the columns after it stale), the verify's
target rows (``sampling/target.target_probs``) and exact rejection sampling (``sampling/rejection``), the
accepted run written after the chain's last token, cut at L (max_new_tokens). A batch mixes requests with
different parameters, a greedy one (top_k 1) among them, under each of stock's four rules: FlashInfer's joint
top-k / top-p, FlashInfer's min-p renorm chain, and the pytorch backend's rank rule with and without min-p.

The law is written independently (``test_stock_filters``: stock's samplers, literally): token t given token
t - 1 = c must follow stock's distribution of the row at (t's parity, c); a chi-square per (request
parameters, t, c), summed over the rule. Negative controls must fail it: a verify that scores draft j with
row j + 1 (off by one), a draft record shifted by one position, and a verify under the other backend's rule
(they differ only at ties and in min-p's order).

The production kernels (``target_filter_fwd``, ``rejection_fwd``; under the interpreter without a GPU) run the
same chains for a smaller batch: their rows match the reference's, and each round they emit exactly the
reference's tokens from the same drafts and coins.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
from sglang_sparsespec.kernels.draft_sample import DraftSampleInputs, draft_sample_ref
from sglang_sparsespec.kernels.logit_bins import RowPath
from sglang_sparsespec.kernels.target_filter import TargetRows, target_filter_fwd
from sglang_sparsespec.kernels.verify_accept import rejection_fwd
from test_sampling import _chi2, _p_value
from test_stock_filters import stock_flashinfer_row, stock_pytorch_rows
from triton_env import DEVICE

from sglang_sparsespec.sampling.rejection import DraftRecord, rejection_sample
from sglang_sparsespec.sampling.target import SamplingBackend, SamplingRows, target_probs

V, K, C, L = 8, 3, 4, 6
OFF = 1 << 30  # SGLang's top_k for "no limit"
# Per rule, the parameter sets of one batch: (temperature, top_p, top_k, min_p) in SGLang's encoding (greedy is
# top_k 1 at temperature 1; a min_p of 0 in a min-p batch is a request without it).
MIXED = [(0.6, 0.9, 3, 0.0), (1.0, 1.0, OFF, 0.0), (1.0, 1.0, 1, 0.0)]
MIN_P = [(0.8, 0.95, 4, 0.1), (1.2, 1.0, OFF, 0.2), (0.6, 0.8, OFF, 0.0)]
RULES = {
    "flashinfer": (SamplingBackend.FLASHINFER, False, MIXED),
    "flashinfer_min_p": (SamplingBackend.FLASHINFER, True, MIN_P),
    "pytorch": (SamplingBackend.PYTORCH, False, MIXED),
    "pytorch_min_p": (SamplingBackend.PYTORCH, True, MIN_P),
}
N_CHAINS = 30_000
N_CONTROL = 10_000
N_KERNEL = 40
# A list shorter than the vocabulary (rows decided on their top list and rows past it both occur) and a
# vocabulary tile of one warp's 32 threads, the narrowest a launch takes (the interpreter's time goes with its width).
KERNEL_LAUNCH = {"list_cap": 4, "chunk": 32, "block_v": 32, "num_warps": 1}


@dataclass
class Rule:
    """One of stock's rules with the parameter sets of its batch, and the toy model's logits.

    params [S, 4] float (temperature, top_p, top_k, min_p per parameter set); min_p: the batch uses min-p;
    target / draft [2, V, V] bf16: the logits of the row at (position parity, previous token).
    """

    backend: SamplingBackend
    min_p: bool
    params: torch.Tensor
    target: torch.Tensor
    draft: torch.Tensor

    @property
    def sets(self) -> int:
        return self.params.shape[0]

    def rows(self, s: torch.Tensor) -> SamplingRows:
        """SamplingRows for requests of parameter sets ``s`` [n]."""
        p = self.params[s]
        return SamplingRows(
            p[:, 0].float(),
            p[:, 1].float(),
            p[:, 2].to(torch.int32),
            p[:, 3].float() if self.min_p else None,
            self.backend,
        )

    def table_rows(self) -> tuple[torch.Tensor, SamplingRows]:
        """The [S * 2 * V, V] target logits of every (set, parity, previous token) and their parameters."""
        s = torch.arange(self.sets).repeat_interleave(2 * V)
        return self.target.reshape(1, 2 * V, V).expand(self.sets, -1, -1).reshape(-1, V), self.rows(s)


def _tied_bf16(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return ((torch.randn(*shape, generator=gen) * 3).round() / 2).to(torch.bfloat16)


def _rule(name: str) -> Rule:
    backend, min_p, sets = RULES[name]
    gen = torch.Generator().manual_seed(7)  # one model for every rule
    target = _tied_bf16(gen, 2, V, V)
    draft = (target.float() + _tied_bf16(gen, 2, V, V).float()).to(torch.bfloat16)
    return Rule(backend, min_p, torch.tensor(sets, dtype=torch.float64), target, draft)


def _stock_law(rule: Rule, logits: torch.Tensor) -> torch.Tensor:
    """[S, 2, V, V] float64: stock's sampling distribution of every table row, by the literal samplers."""
    out = torch.empty(rule.sets, 2 * V, V, dtype=torch.float64)
    rows = logits.float().reshape(2 * V, V)
    for s, (temp, top_p, top_k, min_p) in enumerate(rule.params.tolist()):
        probs = torch.softmax(rows / temp, dim=-1)  # greedy rows are top_k 1 at temperature 1
        mp = min_p if rule.min_p else None
        if rule.backend is SamplingBackend.FLASHINFER:
            law = torch.stack([stock_flashinfer_row(p, int(top_k), top_p, mp) for p in probs])
        else:
            n = rows.shape[0]
            law = stock_pytorch_rows(
                probs,
                torch.full((n,), int(top_k)),
                torch.full((n,), top_p),
                None if mp is None else torch.full((n,), mp),
            )
        out[s] = law.double()
    return out.view(rule.sets, 2, V, V)


def _draft_steps(rule: Rule, s: torch.Tensor, pos: torch.Tensor, prev: torch.Tensor, gen: torch.Generator):
    """K draft steps for requests (set s, next position pos, last token prev): the record's parts, stacked
    [n, K(, C)], and the contexts [n, K + 1] (the token before each verify row)."""
    rows = rule.rows(s)
    min_p = rows.min_p if rows.min_p is not None else torch.zeros_like(rows.top_p)
    contexts, steps = [prev], []
    for j in range(K):
        noise = torch.empty((s.shape[0], C)).exponential_(generator=gen)
        logits = rule.draft[(pos + j) % 2, contexts[-1]]
        step = draft_sample_ref(DraftSampleInputs(logits, rows.temperature, rows.top_p, rows.top_k, min_p, noise))
        steps.append(step)
        contexts.append(step[0])
    return [torch.stack(parts, dim=1) for parts in zip(*steps)], torch.stack(contexts, dim=1)


def _gather(rows: TargetRows, index: torch.Tensor) -> TargetRows:
    """The kernel's table rows of ``index`` [n, K + 1] as a batch of n requests (a request's rows share its
    parameter set, so its temperature is its first row's)."""
    flat = index.reshape(-1)
    picked = (t[flat].contiguous() for t in (rows.logits, rows.desc, rows.list_ids, rows.list_n, rows.path))
    logits, desc, list_ids, list_n, path = picked
    return TargetRows(logits, rows.temperature[index[:, 0]].contiguous(), K + 1, desc, list_ids, list_n, path)


def _chains(rule: Rule, n: int, seed: int, tamper: str | None = None, kernel: TargetRows | None = None):
    """n chains of L tokens decoded in rounds. tamper: "row" (the verify scores draft j with row j + 1) or
    "record" (the record of draft j handed to column j + 1). With ``kernel`` (the kernel's table rows) every
    round is also accepted by ``rejection_fwd`` and must emit the reference's tokens.
    Returns (tokens [n, L], parameter set [n], context token [n], accepted-run lengths seen)."""
    gen = torch.Generator().manual_seed(seed)
    law_rows = target_probs(*rule.table_rows())  # what the verify computes on CPU (stock_accept)
    sets, first = torch.randint(rule.sets, (n,), generator=gen), torch.randint(V, (n,), generator=gen)
    out, length, runs = torch.full((n, L), -1), torch.zeros(n, dtype=torch.int64), []
    while (length < L).any():
        act = (length < L).nonzero().view(-1)
        s, pos = sets[act], length[act]
        prev = torch.where(pos == 0, first[act], out[act, (pos - 1).clamp(min=0)])
        (tokens, cand_ids, cand_q, q_tok), ctx = _draft_steps(rule, s, pos, prev, gen)
        row = (s[:, None] * 2 + (pos[:, None] + torch.arange(K + 1)) % 2) * V + ctx  # [n_act, K + 1]
        if tamper == "row":
            row = torch.cat([row[:, 1:], row[:, -1:]], dim=1)
        if tamper == "record":
            cand_ids, cand_q, q_tok = (t.roll(1, dims=1) for t in (cand_ids, cand_q, q_tok))
        counts = torch.randint(K + 1, (act.shape[0],), generator=gen)
        stale = torch.arange(K)[None, :] >= counts[:, None]  # what a shorter request leaves in its columns
        tokens = torch.where(stale, torch.randint(V, tokens.shape, generator=gen), tokens)
        q_tok = torch.where(stale, torch.rand(q_tok.shape, generator=gen), q_tok)
        record = DraftRecord(tokens, cand_ids, torch.where(stale[..., None], 1.0, cand_q), q_tok, num_drafts=counts)
        coins, final = torch.rand((act.shape[0], K), generator=gen), torch.rand(act.shape[0], generator=gen)
        emitted, n_acc = rejection_sample(law_rows[row], record, coins, final)
        assert (n_acc <= counts).all()
        if kernel is not None:
            dev = kernel.logits.device
            args = (record.tokens, record.cand_ids, record.cand_q, record.q_tok, record.num_drafts, coins, final)
            got = rejection_fwd(_gather(kernel, row.to(dev)), *(t.to(dev) for t in args), chunk=V, block_v=V)
            assert torch.equal(got[0].cpu(), emitted) and torch.equal(got[1].cpu(), n_acc)
        runs.append(n_acc)
        col = torch.arange(K + 1)[None, :]
        write = (col <= n_acc[:, None]) & (pos[:, None] + col < L)
        out[act[:, None].expand_as(write)[write], (pos[:, None] + col)[write]] = emitted[write]
        length[act] = (pos + n_acc + 1).clamp(max=L)
    return out, sets, first, torch.cat(runs)


def _law_p_value(rule: Rule, law: torch.Tensor, out, sets, first) -> tuple[float, int]:
    """p-value (and df) that token t given token t - 1 follows ``law`` at every t, over every parameter set;
    0 when a token outside the law's support appears."""
    prev = torch.cat([first[:, None], out[:, :-1]], dim=1)
    chi2, df = 0.0, 0
    for s in range(rule.sets):
        for t in range(L):
            for c in range(V):
                sel = (sets == s) & (prev[:, t] == c)
                observed = torch.bincount(out[sel, t], minlength=V)
                p = law[s, t % 2, c]
                if observed[p == 0].sum() > 0:
                    return 0.0, df
                stat, d = _chi2(observed, p * int(sel.sum()))
                chi2, df = chi2 + stat, df + d
    return _p_value(chi2, df), df


@pytest.mark.parametrize("name", list(RULES))
def test_drafted_chains_follow_stocks_law_over_several_rounds(name):
    rule = _rule(name)
    law = _stock_law(rule, rule.target)
    # The setting is the hard one: equal logits straddle a top-k cut in some rows (FlashInfer keeps both, the
    # rank rule the lower id), and some proposals are wider than the draft's C candidates (truncated).
    z = rule.target.float().sort(dim=-1, descending=True).values
    ks = [int(k) for k in rule.params[:, 2].tolist() if k < V]
    assert sum(int((z[..., k - 1] == z[..., k]).sum()) for k in ks) > 0
    assert ((_stock_law(rule, rule.draft) > 0).sum(-1) > C).any()
    out, sets, first, runs = _chains(rule, N_CHAINS, seed=1)
    assert (out >= 0).all()
    assert torch.bincount(runs, minlength=K + 1).min() > len(runs) // 50  # every run length, residuals and bonuses
    p_value, df = _law_p_value(rule, law, out, sets, first)
    assert df >= 100 and p_value > 1e-3, (name, p_value, df)


@pytest.mark.parametrize("tamper", ["row", "record"])
def test_the_chain_test_sees_an_off_by_one_row_and_a_shifted_record(tamper):
    rule = _rule("flashinfer")
    out, sets, first, _ = _chains(rule, N_CONTROL, seed=2, tamper=tamper)
    p_value, _ = _law_p_value(rule, _stock_law(rule, rule.target), out, sets, first)
    assert p_value < 1e-9, (tamper, p_value)


@pytest.mark.parametrize("name", ["flashinfer", "pytorch_min_p"])
def test_the_chain_test_sees_the_other_backends_rule(name):
    # The two backends differ only where equal logits straddle a cut (and in min-p's order of filters): a verify
    # of the wrong backend must fail the law of the right one, so the test resolves ties.
    rule = _rule(name)
    other = SamplingBackend.PYTORCH if rule.backend is SamplingBackend.FLASHINFER else SamplingBackend.FLASHINFER
    out, sets, first, _ = _chains(replace(rule, backend=other), N_CHAINS, seed=1)
    p_value, _ = _law_p_value(rule, _stock_law(rule, rule.target), out, sets, first)
    assert p_value < 1e-9, (name, p_value)


@pytest.mark.parametrize("name", list(RULES))
def test_the_kernels_accept_the_same_chains(name):
    rule = _rule(name)
    logits, rows = rule.table_rows()
    params = [None if t is None else t.to(DEVICE) for t in (rows.temperature, rows.top_k, rows.top_p, rows.min_p)]
    kernel = target_filter_fwd(logits.to(DEVICE), *params, 1, rule.backend is SamplingBackend.PYTORCH, **KERNEL_LAUNCH)
    reference = target_probs(logits, rows)
    dense = kernel.dense().cpu()
    assert torch.equal(dense > 0, reference > 0)
    torch.testing.assert_close(dense, reference, atol=1e-6, rtol=1e-5)
    decided_on_top_list = kernel.path == RowPath.FULL
    assert decided_on_top_list.any() and not decided_on_top_list.all()
    _chains(rule, N_KERNEL, seed=3, kernel=kernel)
