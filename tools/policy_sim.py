"""CPU reference of PILLAR's rounds in plain Hugging Face attention (no SGLang, no GPU), greedy or sampled.

    python -m tools.policy_sim --model M --data-dir D [--prompt-index 1] [--max-new-tokens 1500] \\
        [--policies pillar,coarse,streaming] [--recent-window 64] [--min-budget 128] [--out F.json] \\
        [--select-every 4] [--score-rows all|last] [--check-lossless] [--temperature 0.6 --top-p 0.95 --seed 0]

Each round is simulated as the PILLAR worker runs it: k draft steps (greedy; sampled below) whose attention, per
layer and KV head, is restricted to the policy's plan (the budget rule, windows and streaming seed
of ``sglang_sparsespec.selection``), then a full-attention verify of the k+1 tokens, its
acceptance, and the next plan from the verify rows' softmax mass over the prefix (averaged over the
GQA group and the k+1 rows, or the last row only with --score-rows last; per layer and KV head for
``pillar``, summed for ``coarse``). Draft KV
is written with sparse attention and replaced by the verify, as on the GPU. The model runs in its
own HF implementation on CPU (fp32 unless --dtype bfloat16), so policies and knobs can be compared
without device time; it matches the GPU's acceptance (AIME24 prompt 1, 1500 tokens, recent window
16: 5.34 here, 5.93 on the H100 in bf16). Greedy outputs must equal plain greedy decoding
(--check-lossless verifies it). The ORACLE policy runs here only in ``tools.draft_fidelity``; served, it is
benchmarks/acceptance.py's.

With ``--temperature`` > 0 the rounds are sampled, as served: each draft token is drawn from its draft
distribution q (stock's flashinfer rule at the request's temperature, top-p and top-k over the sparse forward's
logits, the whole filtered distribution where the worker keeps its 64 most probable tokens), and the verify
accepts it with probability min(1, p / q), p the full forward's filtered distribution, else
draws the next token from the residual max(0, p - q) and ends the round; a round that accepts every draft
draws its bonus token from p. Greedy decoding loops on this model, which flatters drafts that attend the recent
window; sampled rounds compare policies where the headline runs (T 0.6 / top-p 0.95). One seed draws every
token, so a run is reproducible; its accept length over ~600 rounds is a sample (a standard error of ~0.1 if the
rounds were independent).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.modes import ScoreRows, SelectionPolicy
from sglang_sparsespec.sampling.rejection import DraftRecord, rejection_sample
from sglang_sparsespec.sampling.target import SamplingRows, target_probs
from sglang_sparsespec.selection.policy import draft_window, streaming_plan

SIM_POLICIES = (SelectionPolicy.PILLAR, SelectionPolicy.COARSE, SelectionPolicy.STREAMING)
ATTN_NAME = "pillar_sim"
SEGMENT = 1024  # output tokens per slice of the per-segment statistics in the JSON


@dataclass
class _AttnState:
    """What the registered attention function applies or records in the current forward.

    keep: [num_layers, H_q, K] bool — keys each query head of the (single) draft query may see.
    probs: layer -> [H_q, Q, K] softmax probabilities, filled when ``record`` is set.
    oracle: (count, tail_start): every query also sees, per layer and KV head, the ``count`` positions below
        ``tail_start`` its own full attention weighs most (GQA group mean): the bound on what any plan can do.
    among: [num_layers, H_kv, tail_start] bool — where set, the oracle picks only among these candidates.
    first: the oracle's positions are the round's first draft query's, for every draft query of the round.
    extra: [num_layers, H_q, Q, K] bool — keys each query of the draft forward may see besides ``keep``.
    """

    keep: torch.Tensor | None = None
    record: bool = False
    probs: dict[int, torch.Tensor] = field(default_factory=dict)
    oracle: tuple[int, int] | None = None
    among: torch.Tensor | None = None
    first: bool = False
    extra: torch.Tensor | None = None


def oracle_keep(
    logits: torch.Tensor,
    keep: torch.Tensor,
    groups: int,
    count: int,
    tail_start: int,
    among: torch.Tensor | None = None,
    first: bool = False,
) -> torch.Tensor:
    """[1, H_q, Q, K] ``keep`` plus each query's own top-``count`` positions below ``tail_start`` per KV head (only
    among the [H_kv, tail_start] candidates ``among`` where given); with ``first``, the first query's for all."""
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)[0, :, :, :tail_start]
    h_q, q_len, _ = probs.shape
    mass = probs.view(h_q // groups, groups, q_len, tail_start).mean(1)  # [H_kv, Q, tail_start]
    if first:
        mass = mass[:, :1].expand(-1, q_len, -1)
    if among is not None:
        mass = mass.masked_fill(~among[:, None, :], -1.0)
    top = mass.topk(min(count, tail_start), dim=-1).indices.repeat_interleave(groups, dim=0)
    own = torch.zeros_like(keep[0]).expand(h_q, q_len, keep.shape[-1]).clone()
    own.scatter_(2, top, True)
    return keep | own[None]


# What the registered attention applies or records now; the round loops (here and tools.draft_fidelity) set it.
ATTN = _AttnState()


def _attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
    """Causal attention over the cache plus the optional per-layer key mask (batch 1)."""
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    logits = torch.matmul(query, key.transpose(2, 3)) * scaling
    q_len, k_len = logits.shape[-2:]
    causal = torch.arange(k_len)[None, :] <= (k_len - q_len + torch.arange(q_len))[:, None]
    logits = logits.masked_fill(~causal, float("-inf"))
    if ATTN.keep is not None:
        keep = ATTN.keep[module.layer_idx][None, :, None, :k_len]
        if ATTN.oracle is not None:
            among = ATTN.among[module.layer_idx] if ATTN.among is not None else None
            keep = oracle_keep(logits, keep, groups, *ATTN.oracle, among=among, first=ATTN.first)
        if ATTN.extra is not None:
            keep = keep | ATTN.extra[module.layer_idx][None, :, :q_len, :k_len]
        logits = logits.masked_fill(~keep, float("-inf"))
    probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
    if ATTN.record:
        ATTN.probs[module.layer_idx] = probs[0]
    return torch.matmul(probs.to(value.dtype), value).transpose(1, 2).contiguous(), probs


def register_attention() -> str:
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_NAME, _attention)
    return ATTN_NAME


@dataclass
class SimResult:
    policy: str
    output_ids: list[int]
    accepts: list[int]  # tokens per verify step, bonus included
    wall_s: float
    # Per round: prefix positions the first draft step attends, mean over (layer, KV head). What a
    # draft reads, so policies and cadences compare at their cost too (an older plan's tail is longer).
    draft_sets: list[float] = field(default_factory=list)

    @property
    def accept_length(self) -> float:
        return sum(self.accepts) / len(self.accepts)

    @property
    def mean_draft_set(self) -> float:
        return sum(self.draft_sets) / len(self.draft_sets)

    def accept_by_segment(self, segment: int) -> list[float]:
        """Accept length of the rounds that started in each ``segment``-token slice of the output (the
        last slice may be partial): does the draft get worse deeper into a long output?"""
        per: dict[int, list[int]] = {}
        done = 0
        for a in self.accepts:
            per.setdefault(done // segment, []).append(a)
            done += a
        return [sum(v) / len(v) for _, v in sorted(per.items())]

    def distinct_ngrams_by_segment(self, segment: int, n: int = 4) -> list[float]:
        """Distinct n-grams / n-grams per ``segment``-token slice of the output: low values mark the
        repetition loops of greedy decoding, which a recent-window draft predicts well."""
        out = []
        for start in range(0, len(self.output_ids), segment):
            ids = self.output_ids[start : start + segment]
            grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
            out.append(len(set(grams)) / len(grams) if grams else 1.0)
        return out


@dataclass(frozen=True)
class Sampling:
    """Sampled rounds' parameters (module docstring); one generator draws every token and coin."""

    temperature: float
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, V] logits -> [n, V] stock's filtered distribution (flashinfer's rule)."""
        n = logits.shape[0]
        rows = SamplingRows(
            torch.full((n,), self.temperature),
            torch.full((n,), self.top_p),
            torch.full((n,), self.top_k, dtype=torch.int32),
        )
        return target_probs(logits.float(), rows)


def _draw(probs: torch.Tensor, gen: torch.Generator) -> int:
    return int(torch.multinomial(probs, 1, generator=gen))


def _verify(
    drafts: list[int], logits: torch.Tensor, qs: list[torch.Tensor], sampling: Sampling | None, gen: torch.Generator
) -> tuple[int, int]:
    """(drafts accepted, the token after them) from the verify's k+1 rows of logits: greedy matches of the argmax,
    or ``rejection_sample`` against the drafts' distributions ``qs``."""
    if sampling is None:
        target = logits.argmax(-1).tolist()
        accepted = 0
        while accepted < len(drafts) and drafts[accepted] == target[accepted]:
            accepted += 1
        return accepted, target[accepted]
    # The worker's own acceptance: each q as a record over the whole vocabulary (the worker keeps 64 candidates).
    q = torch.stack(qs)[None]  # [1, k, V]
    tokens = torch.tensor([drafts])
    record = DraftRecord(tokens, torch.arange(q.shape[-1]).expand_as(q), q, q[0].gather(1, tokens.T).T)
    coins, final_coins = torch.rand(1, len(drafts), generator=gen), torch.rand(1, generator=gen)
    emitted, accepted = rejection_sample(sampling.probs(logits)[None], record, coins, final_coins)
    return int(accepted), int(emitted[0, accepted])


def keep_mask(plan: tuple[torch.Tensor, int], width: int, layers: int, h_kv: int) -> torch.Tensor:
    """[layers, H_kv, width] bool from (selected positions [layers, H_kv, n] or [n], or a bool mask
    [layers, H_kv, n] of them; tail_start)."""
    sel, tail_start = plan
    keep = torch.zeros(layers, h_kv, width, dtype=torch.bool)
    if sel.dtype == torch.bool:
        keep[..., : sel.shape[-1]] = sel
    elif sel.numel():
        if sel.dim() == 1:
            keep[:, :, sel] = True
        else:
            keep.scatter_(2, sel, True)
    keep[:, :, tail_start:] = True
    return keep


def verify_scores(
    probs: dict[int, torch.Tensor], rows: ScoreRows, h_kv: int, v: int, group: str = "mean", reduce: str = "mean"
) -> torch.Tensor:
    """[layers, H_kv, v] scores of the prefix from a verify's recorded softmax rows (layer -> [H_q, Q, K]): each
    query head's mass averaged over the k + 1 rows (or the last one; their max with ``reduce="max"``), then over the
    GQA group's heads (the worker's ``kernels/score_capture.py``), or their max with ``group="max"``."""
    picked = slice(-1, None) if rows is ScoreRows.LAST else slice(None)
    per_head = [
        probs[i][:, picked, :v].amax(1) if reduce == "max" else probs[i][:, picked, :v].mean(1)
        for i in range(len(probs))
    ]  # [H_q, v] each
    if group == "max":
        return torch.stack([h.view(h_kv, -1, v).amax(1) for h in per_head])
    return torch.stack([h.view(h_kv, -1, v).mean(1) for h in per_head])


def next_plan(
    cfg: PillarConfig,
    scores: torch.Tensor | None,
    window: tuple[int, int] | None,
    v: int,
    kmax: int,
    score_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, int]:
    """(selected positions, tail_start) for the next round: the streaming seed before the first verify
    (and for the streaming policy), else the top-K of the last verify's scores below the window.
    ``score_dtype`` rounds the per-layer scores of ``pillar`` first, as the GPU stores them; ties go to
    the lower position, as in kernels/topk_select.py."""
    if scores is None or cfg.policy is SelectionPolicy.STREAMING:
        p = streaming_plan(cfg, torch.tensor([v]), kmax)
        return p.sel_pos[0, : int(p.sel_cnt[0])].long(), int(p.tail_start[0])
    tail_start, count = window
    cand = scores[:, :, :tail_start]
    if cfg.policy is SelectionPolicy.COARSE:
        return cand.sum((0, 1)).topk(count).indices, tail_start
    cand = cand.to(score_dtype).float()
    return torch.sort(cand, dim=-1, descending=True, stable=True).indices[..., :count], tail_start


def simulate(
    model,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    cfg: PillarConfig,
    score_dtype: torch.dtype = torch.float32,
    sampling: Sampling | None = None,
) -> SimResult:
    """PILLAR rounds of ``cfg.policy`` until ``max_new_tokens`` are committed (batch 1): greedy, or sampled
    with ``sampling``.

    ``cfg.select_every = N > 1`` re-selects only every N-th round and keeps the plan in between (its
    recent tail grows by the tokens committed since), as the worker's ScoredSelector does.
    """
    from transformers import DynamicCache

    if cfg.policy not in SIM_POLICIES:
        raise ValueError(f"policy_sim supports {[p.value for p in SIM_POLICIES]}, not {cfg.policy.value}")
    mc = model.config
    layers, h_q, h_kv = mc.num_hidden_layers, mc.num_attention_heads, mc.num_key_value_heads
    k = cfg.num_steps
    kmax = cfg.max_budget(len(prompt_ids) + max_new_tokens + k + 1)
    seq = list(prompt_ids)
    cache = DynamicCache()
    started = time.monotonic()
    with torch.no_grad():
        model(torch.tensor([seq[:-1]]), past_key_values=cache, use_cache=True)
    accepts: list[int] = []
    draft_sets: list[float] = []
    scores: torch.Tensor | None = None  # [layers, H_kv, V] mass of the last verify's prefix
    window: tuple[int, int] | None = None  # (tail_start, count) of the last verify
    plan: tuple[torch.Tensor, int] | None = None
    gen = torch.Generator().manual_seed(sampling.seed if sampling else 0)
    while len(seq) - len(prompt_ids) < max_new_tokens:
        v = len(seq) - 1  # positions with KV; the last committed token is fed by draft step 0
        # Between selections (select_every > 1) the last plan stands; its tail grows by the tokens committed since.
        if plan is None or len(accepts) % cfg.select_every == 0:
            plan = next_plan(cfg, scores, window, v, kmax, score_dtype)
        keep = keep_mask(plan, v + k, layers, h_kv)
        draft_sets.append(float(keep[..., :v].sum(-1, dtype=torch.float64).mean()))
        keep = keep.repeat_interleave(h_q // h_kv, dim=1)
        drafts, qs, token = [], [], seq[-1]
        with torch.no_grad():
            ATTN.keep = keep
            try:
                for _ in range(k):
                    out = model(torch.tensor([[token]]), past_key_values=cache, use_cache=True)
                    if sampling is None:
                        token = int(out.logits[0, -1].argmax())
                    else:
                        qs.append(sampling.probs(out.logits[0, -1:])[0])
                        token = _draw(qs[-1], gen)
                    drafts.append(token)
            finally:
                ATTN.keep = None
            cache.crop(v)
            ATTN.record, ATTN.probs = True, {}
            try:
                out = model(torch.tensor([[seq[-1], *drafts]]), past_key_values=cache, use_cache=True)
            finally:
                ATTN.record = False
        accepted, after = _verify(drafts, out.logits[0], qs, sampling, gen)
        seq += drafts[:accepted] + [after]
        accepts.append(accepted + 1)
        cache.crop(v + accepted + 1)  # exact KV of the last committed token and the accepted drafts
        scores = verify_scores(ATTN.probs, cfg.score_rows, h_kv, v)
        tail_start, count = draft_window(cfg, torch.tensor([v]), torch.tensor([v + accepted + 1]), kmax)
        window = (int(tail_start[0]), int(count[0]))
    return SimResult(
        cfg.policy.value, seq[len(prompt_ids) :][:max_new_tokens], accepts, time.monotonic() - started, draft_sets
    )


def first_divergence_from_greedy(model, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> int | None:
    """Index where ``output_ids`` leaves plain greedy decoding of the same model (None: identical)."""
    with torch.no_grad():
        ref = model.generate(
            torch.tensor([list(prompt_ids)]),
            max_new_tokens=len(output_ids),
            do_sample=False,
            min_new_tokens=len(output_ids),
        )[0, len(prompt_ids) :].tolist()
    return next((i for i, (a, b) in enumerate(zip(ref, output_ids)) if a != b), None)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--model", required=True, help="HF model folder (e.g. from python -m sglang_sparsespec.models.smollm2)"
    )
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--dataset", default="aime24")
    p.add_argument("--prompt-index", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=1500)
    p.add_argument("--policies", default="pillar,coarse,streaming")
    p.add_argument("--num-steps", type=int, default=8)
    defaults = PillarConfig()
    p.add_argument("--budget-ratio", type=float, default=defaults.budget_ratio)
    p.add_argument("--min-budget", type=int, default=defaults.min_budget)
    p.add_argument("--recent-window", type=int, default=defaults.recent_window)
    p.add_argument("--sink-tokens", type=int, default=defaults.sink_tokens)
    p.add_argument("--select-every", type=int, default=defaults.select_every, help="re-select every N rounds")
    p.add_argument(
        "--score-rows",
        choices=[r.value for r in ScoreRows],
        default=defaults.score_rows.value,
        help="verify rows that score the prefix",
    )
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument(
        "--score-dtype",
        default="float32",
        choices=("float32", "float16"),
        help="storage of pillar's per-layer scores before top-K (the GPU worker: float16)",
    )
    p.add_argument("--check-lossless", action="store_true", help="compare every output with plain greedy decoding")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy rounds; > 0: sampled rounds")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--seed", type=int, default=0, help="sampled rounds: the generator's seed")
    p.add_argument("--out", type=Path, default=None, help="JSON result path")
    args = p.parse_args(argv)
    try:
        args.policies = [SelectionPolicy(x) for x in args.policies.split(",") if x]
    except ValueError as e:
        p.error(str(e))
    if args.check_lossless and args.temperature > 0:
        p.error("--check-lossless compares with greedy decoding: it needs --temperature 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from transformers import AutoModelForCausalLM

    from benchmarks.meta import new_run_id, run_metadata
    from benchmarks.workload import build_prompts, load_tokenizer

    tokenizer = load_tokenizer(args.model)
    prompts = build_prompts(tokenizer, args.data_dir, args.prompt_index + 1, (args.dataset,))
    prompt = prompts[args.prompt_index]
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=getattr(torch, args.dtype), attn_implementation=register_attention()
    ).eval()
    doc: dict[str, Any] = {
        "kind": "policy_sim",
        "meta": run_metadata(new_run_id()),
        "settings": {
            **vars(args),
            "data_dir": str(args.data_dir),
            "out": None,
            "policies": [p.value for p in args.policies],
            "source": prompt.source,
        },
        "results": {},
    }
    ok = True
    for policy in args.policies:
        cfg = PillarConfig(
            num_steps=args.num_steps,
            budget_ratio=args.budget_ratio,
            min_budget=args.min_budget,
            recent_window=args.recent_window,
            sink_tokens=args.sink_tokens,
            policy=policy,
            select_every=args.select_every,
            score_rows=ScoreRows(args.score_rows),
        )
        sampling = Sampling(args.temperature, args.top_p, args.top_k, args.seed) if args.temperature > 0 else None
        res = simulate(model, prompt.input_ids, args.max_new_tokens, cfg, getattr(torch, args.score_dtype), sampling)
        rec: dict[str, Any] = {
            "accept_length": res.accept_length,
            "rounds": len(res.accepts),
            "wall_s": res.wall_s,
            "mean_draft_set": res.mean_draft_set,
            "segment_tokens": SEGMENT,
            "accept_length_by_segment": res.accept_by_segment(SEGMENT),
            "distinct_4grams_by_segment": res.distinct_ngrams_by_segment(SEGMENT),
        }
        if args.check_lossless:
            rec["first_divergence_from_greedy"] = first_divergence_from_greedy(model, prompt.input_ids, res.output_ids)
            ok &= rec["first_divergence_from_greedy"] is None
        doc["results"][policy.value] = rec
        print(
            f"{prompt.source} {policy.value}: accept length {res.accept_length:.3f} over {len(res.accepts)} rounds,"
            f" draft set {res.mean_draft_set:.1f} positions"
            f" ({res.wall_s:.0f} s)"
            + (f", divergence from greedy: {rec['first_divergence_from_greedy']}" if args.check_lossless else ""),
            flush=True,
        )
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
