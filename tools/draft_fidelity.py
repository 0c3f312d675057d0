"""Teacher-forced draft fidelity of the selection rules on real weights (CPU): every rule drafts along one
reference text, so rules compare position by position, free of the sampling noise and diverging texts that make
``tools.policy_sim``'s sampled accept lengths differ by ~0.1-1 between runs.

    python -m tools.draft_fidelity --model M --data-dir D --prompt-index 1 --tokens 3000 \\
        --rules pillar,pillar:group=max,streaming [--advance 6] [--reference F.json] --out F.json

The reference is the model's own sampled answer (stock's filter at --temperature / --top-p, one seed), decoded
once with full attention; or the problem's written solution from the data file (--solution-reference: long,
human-written reasoning that does not loop, where a 135M model's own sampled answers fall into repetition loops
after ~1K tokens, which a recent window follows best); or the ``reference_ids`` of an earlier output (--reference).
Each round starts at a committed length v and runs what the worker runs: k draft steps whose attention, per layer
and KV head, is the rule's plan (``tools.policy_sim``), each fed the reference's next token instead of a sampled
one; then the full verify of the k + 1 reference tokens. With the chain's tokens known, the k draft steps run as
one forward of k queries under the plan and the causal mask: each draft position's hidden states and K/V come from
sparse attention over the plan and the draft positions before it, layer by layer, as the worker's k steps compute
them. Draft j's distribution q_j is compared with the verify's row j, p_j (both under stock's filter): rejection
sampling accepts a draft from q_j with probability a_j = sum_x min(p_j(x), q_j(x)), so a round would emit
E = 1 + a_0 + a_0 a_1 + ... tokens on average. The round then commits ``--advance`` reference tokens (default 6,
about a served round's accept length, so plans age as they do in the server) and keeps their verified KV. The
verify rows that score the prefix for the next plan are the served ones: the committed tokens' rows, then rows fed
a rejected draft and the drafts after it (``served_tail``), never the reference tokens the next round's drafts will
be fed (their rows would select for those very queries).

Rules: ``pillar`` (the worker's: each head's mass over the k + 1 rows, averaged over its GQA group),
``pillar:group=max`` (the group's max instead), ``coarse`` and ``streaming``; ``:rows=last`` scores from the last
verify row only, ``:reduce=max`` by the rows' max mass; ``:value=norm`` weighs each position's mass by its value
vector's norm; ``:shift=N`` lets each position score as the best of its N predecessors (the positions after the
attended ones); ``:sinks=N`` ranks the first N positions (attention sinks) above every scored one; ``:window=N``
drafts with an N-token recent window instead of --recent-window. ``oracle`` spends the budget the plan would select
on each draft query's own top positions by its full attention, per layer and KV head (the bound on any plan);
``:refine=N`` lets each draft query pick its own top count among the plan's N x count best-scored positions;
``:alloc=layer`` / ``:alloc=all`` pools the heads' counts per layer / over the model and spends the pool on its
highest masses; ``:dense=L+L.H`` drafts those layers or KV heads over the whole prefix (the server's
--pillar-dense-heads); ``:own=L+L.H`` lets each draft query pick its own top count in those layers or layers' KV
heads (the oracle there, the plan elsewhere); ``:boost=N@L+L.H`` gives those layers or KV heads a plan of N x count
positions (the shared plan, a larger budget where it is sharp); ``:pick=first`` makes the own choice of ``oracle``,
``refine`` and ``own`` the round's first draft query's, kept for the round's later draft steps (one choice a round
instead of one a step); ``:match=N@L+L.H`` adds, in those layers or KV heads, each draft query's N latest earlier
occurrences of its input token and the positions after them (what a duplicate-token and an induction head look up,
``sglang_sparsespec.selection.head_probe``). The output holds each rule's mean a_j by draft position, mean E, and E
per round (paired across rules: the same positions and history).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.modes import PlainPath, ScoreRows, SelectionPolicy
from sglang_sparsespec.selection.policy import draft_window
from tools.policy_sim import ATTN, SIM_POLICIES, Sampling, keep_mask, next_plan, register_attention, verify_scores

FIDELITY_POLICIES = (*SIM_POLICIES, SelectionPolicy.ORACLE)


@dataclass(frozen=True)
class Rule:
    """A selection rule: the policy, which verify rows score, how a GQA group's heads combine."""

    policy: SelectionPolicy
    rows: ScoreRows = ScoreRows.ALL
    group: str = "mean"
    sinks: int = 0  # positions [0, sinks) ranked first by every top-K (kept whenever the plan selects any)
    window: int | None = None  # the plans' recent window (SPARSESPEC_RECENT_WINDOW); None: --recent-window
    shift: int = 0  # each position also scores as the best of its `shift` predecessors (see shift_scores)
    reduce: str = "mean"  # how the verify rows' masses combine per head: "mean" (the worker's) or "max"
    value: bool = False  # each position's mass weighed by its value vector's norm (what it adds to the output)
    alloc: str = "head"  # who shares a budget: each KV head its own count, or a layer's heads / all heads one pool
    refine: int = 0  # > 0: the plan holds refine x count candidates, each draft query attends its own top count
    dense: tuple[str, ...] = ()  # layers ("L") or KV heads ("L.H") whose draft attention reads the whole prefix
    # Layers ("L") or KV heads of a layer ("L.H") where each draft query attends its own top count, not the plan's.
    own: tuple[str, ...] = ()
    boost: tuple[int, tuple[str, ...]] = (1, ())  # (N, layers or "L.H" KV heads whose plan holds N x count)
    pick: str = "each"  # whose own choice a draft query attends: its own ("each") or the round's first query's
    # (N, layers or "L.H" KV heads): each draft query also attends there its input token's N latest earlier
    # occurrences and the positions after them (what duplicate-token and induction heads look up).
    match: tuple[int, tuple[str, ...]] = (0, ())

    @classmethod
    def parse(cls, text: str) -> Rule:
        """``pillar``, ``pillar:group=max``, ``pillar:rows=last:group=max``, ``pillar:window=128``, ``streaming``."""
        name, *opts = text.split(":")
        rule = cls(SelectionPolicy(name))
        if rule.policy not in FIDELITY_POLICIES:
            raise ValueError(f"rule {text!r}: the policy must be one of {[p.value for p in FIDELITY_POLICIES]}")
        for opt in opts:
            key, _, value = opt.partition("=")
            if key == "rows":
                rule = replace(rule, rows=ScoreRows(value))
            elif key == "group" and value in ("mean", "max"):
                rule = replace(rule, group=value)
            elif key == "sinks" and value.isdigit():
                rule = replace(rule, sinks=int(value))
            elif key == "window" and value.isdigit():
                rule = replace(rule, window=int(value))
            elif key == "shift" and value.isdigit():
                rule = replace(rule, shift=int(value))
            elif key == "reduce" and value in ("mean", "max"):
                rule = replace(rule, reduce=value)
            elif key == "value" and value == "norm":
                rule = replace(rule, value=True)
            elif key == "alloc" and value in ("head", "layer", "all"):
                rule = replace(rule, alloc=value)
            elif key == "refine" and value.isdigit() and int(value) > 1:
                rule = replace(rule, refine=int(value))
            elif key == "dense" and heads_arg(value) is not None:
                rule = replace(rule, dense=heads_arg(value))
            elif key == "own" and heads_arg(value) is not None:
                rule = replace(rule, own=heads_arg(value))
            elif key == "pick" and value in ("each", "first"):
                rule = replace(rule, pick=value)
            elif key == "boost" and count_at_heads(value, least=2) is not None:
                rule = replace(rule, boost=count_at_heads(value, least=2))
            elif key == "match" and count_at_heads(value, least=1) is not None:
                rule = replace(rule, match=count_at_heads(value, least=1))
            else:
                raise ValueError(
                    f"rule {text!r}: unknown option {opt!r} (rows=all|last, group=mean|max, sinks=N, window=N,"
                    " shift=N, reduce=mean|max, value=norm, alloc=head|layer|all, refine=N > 1, dense=L+L.H, own=L+L.H,"
                    " boost=N@L+L.H, pick=each|first, match=N@L+L.H)"
                )
        return rule

    @property
    def name(self) -> str:
        opts = (
            ([f"rows={self.rows.value}"] if self.rows is not ScoreRows.ALL else [])
            + ([f"group={self.group}"] if self.group != "mean" else [])
            + ([f"sinks={self.sinks}"] if self.sinks else [])
            + ([f"window={self.window}"] if self.window is not None else [])
            + ([f"shift={self.shift}"] if self.shift else [])
            + ([f"reduce={self.reduce}"] if self.reduce != "mean" else [])
            + (["value=norm"] if self.value else [])
            + ([f"alloc={self.alloc}"] if self.alloc != "head" else [])
            + ([f"refine={self.refine}"] if self.refine else [])
            + (["dense=" + "+".join(self.dense)] if self.dense else [])
            + (["own=" + "+".join(self.own)] if self.own else [])
            + ([f"boost={self.boost[0]}@" + "+".join(self.boost[1])] if self.boost[1] else [])
            + ([f"pick={self.pick}"] if self.pick != "each" else [])
            + ([f"match={self.match[0]}@" + "+".join(self.match[1])] if self.match[1] else [])
        )
        return ":".join([self.policy.value, *opts])


@dataclass
class Fidelity:
    """One rule's rounds: a_j per round and draft position, and the prefix positions its first draft step reads."""

    rule: str
    accept_probs: list[list[float]]  # [rounds][k]
    draft_sets: list[float]
    wall_s: float

    def expected_tokens(self) -> list[float]:
        """E per round: 1 + a_0 + a_0 a_1 + ... (the verify's own token included)."""
        out = []
        for row in self.accept_probs:
            total, run = 1.0, 1.0
            for a in row:
                run *= a
                total += run
            out.append(total)
        return out

    def summary(self) -> dict[str, Any]:
        rounds = len(self.accept_probs)
        per_round = self.expected_tokens()
        k = len(self.accept_probs[0]) if rounds else 0
        return {
            "rounds": rounds,
            "mean_expected_tokens": sum(per_round) / max(rounds, 1),
            "mean_accept_prob_by_position": [sum(r[j] for r in self.accept_probs) / rounds for j in range(k)],
            "mean_draft_set": sum(self.draft_sets) / max(len(self.draft_sets), 1),
            "wall_s": self.wall_s,
            "expected_tokens_per_round": per_round,
        }


def heads_arg(value: str) -> tuple[str, ...] | None:
    """``L+L.H`` as ("L", "L.H"), or None when any item is not a layer or a layer's KV head."""
    items = tuple(value.split("+"))
    return items if all(x.replace(".", "", 1).isdigit() for x in items) else None


def count_at_heads(value: str, least: int) -> tuple[int, tuple[str, ...]] | None:
    """``N@L+L.H`` (N >= least) as (N, heads), or None."""
    factor, _, where = value.partition("@")
    heads = heads_arg(where)
    return (int(factor), heads) if factor.isdigit() and int(factor) >= least and heads else None


def match_keep(
    seq: Sequence[int], v: int, k: int, latest: int, where: Sequence[str], shape: tuple[int, int]
) -> torch.Tensor:
    """[layers, H_kv, k, v + k] bool: for draft query j (input token seq[v + j]), in the layers or KV heads
    ``where``, the ``latest`` occurrences of that token before position v + j and the position after each."""
    ids = torch.tensor(seq[: v + k])
    per_query = torch.zeros(k, v + k, dtype=torch.bool)
    for j in range(k):
        occ = (ids[: v + j] == seq[v + j]).nonzero().view(-1)[-latest:]
        per_query[j, torch.cat([occ, occ + 1])] = True
    extra = torch.zeros(*shape, k, v + k, dtype=torch.bool)
    mark_heads(extra, where, per_query.expand(*shape, k, v + k))
    return extra


def mark_heads(mask: torch.Tensor, where: Sequence[str], value: torch.Tensor | bool) -> None:
    """Set ``mask[layer]`` or ``mask[layer, head]`` for each "L" / "L.H" in ``where`` (from ``value`` alike)."""
    for item in where:
        layer, _, head = item.partition(".")
        at = (int(layer), int(head) if head else slice(None))
        mask[at] = value if isinstance(value, bool) else value[at]


def shift_scores(scores: torch.Tensor, shift: int) -> torch.Tensor:
    """[..., v] scores where position p scores max(s[p - shift], ..., s[p]): a head that copies the text after an
    earlier match attends one position further with every committed token, so a plan made from the verify's
    rows needs the positions after the ones they attended as the plan ages."""
    if shift <= 0:
        return scores
    flat = scores.reshape(-1, 1, scores.shape[-1])
    padded = torch.nn.functional.pad(flat, (shift, 0), value=float("-inf"))
    return torch.nn.functional.max_pool1d(padded, shift + 1, stride=1).reshape(scores.shape)


def pooled_plan(scores: torch.Tensor, window: tuple[int, int], alloc: str) -> tuple[torch.Tensor, int]:
    """(bool mask [layers, H_kv, tail_start], tail_start): the budget of ``count`` positions per KV head pooled over
    each layer's heads (``alloc="layer"``) or over every head (``"all"``) and spent on the pool's highest masses, so
    a head whose mass spreads takes positions from one whose top few carry it."""
    tail_start, count = window
    cand = scores[:, :, :tail_start]
    layers, h_kv, _ = cand.shape
    pooled = h_kv if alloc == "layer" else layers * h_kv  # heads per pool
    flat = cand.reshape(-1, pooled * tail_start)
    top = flat.topk(min(count, tail_start) * pooled, dim=-1).indices
    mask = torch.zeros_like(flat, dtype=torch.bool).scatter_(1, top, True)
    return mask.view(layers, h_kv, tail_start), tail_start


def overlap(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """[n] sum_x min(p, q) of [n, V] rows: the probability that rejection sampling accepts a draft from q."""
    return torch.minimum(p, q).sum(-1)


def served_tail(chain: Sequence[int], q: torch.Tensor, advance: int) -> list[int]:
    """The tokens a served verify feeds after the ``advance`` committed ones, at positions v + advance .. v + k:
    the rejected draft (never the token committed there: the draft's likeliest other one), then the draft's likeliest
    tokens. Feeding the reference there instead would score the prefix with the next round's own first queries.

    chain: the k + 1 reference tokens at positions v .. v + k; q: [k, V] the drafts' distributions (row j drafts
    position v + j + 1); 1 <= advance <= k.
    """
    rejected = q[advance - 1].clone()
    rejected[chain[advance]] = -1.0
    return [int(rejected.argmax()), *q[advance:].argmax(-1).tolist()]


def reference(model, prompt_ids: Sequence[int], tokens: int, sampling: Sampling) -> list[int]:
    """The model's own answer of ``tokens`` tokens, each drawn from stock's filtered distribution (full attention)."""
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(sampling.seed)
    cache = DynamicCache()
    out, ids = [], torch.tensor([list(prompt_ids)])
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(ids, past_key_values=cache, use_cache=True).logits[0, -1:]
            token = int(torch.multinomial(sampling.probs(logits)[0], 1, generator=gen))
            out.append(token)
            ids = torch.tensor([[token]])
    return out


def solution_ids(tokenizer, data_dir: Path, dataset: str, index: int) -> list[int]:
    """Token ids of problem ``index``'s written solution in ``data_dir/dataset.jsonl`` (the rows the prompts come
    from, ``benchmarks.workload.load_rows``)."""
    from benchmarks.workload import load_rows

    solution = load_rows(data_dir, dataset)[index].get("solution")
    if not solution:
        raise ValueError(f"{dataset} problem {index} has no written solution")
    return tokenizer.encode(solution, add_special_tokens=False)


def fidelity(
    model,
    prompt_ids: Sequence[int],
    ref_ids: Sequence[int],
    cfg: PillarConfig,
    rule: Rule,
    sampling: Sampling,
    advance: int,
    score_dtype: torch.dtype = torch.float16,
) -> Fidelity:
    """The module docstring's rounds of ``rule`` along ``ref_ids`` (committed after ``prompt_ids``)."""
    from transformers import DynamicCache

    if not 1 <= advance <= cfg.num_steps + 1:
        raise ValueError(f"advance must be in [1, k + 1 = {cfg.num_steps + 1}], got {advance}")
    # No plain rounds here; AUTO lets the config resolve the plain path the rule's policy allows.
    cfg = replace(cfg, policy=rule.policy, score_rows=rule.rows, plain_path=PlainPath.AUTO)
    if rule.window is not None:
        cfg = replace(cfg, recent_window=rule.window)
    mc = model.config
    layers, h_q, h_kv, k = mc.num_hidden_layers, mc.num_attention_heads, mc.num_key_value_heads, cfg.num_steps
    seq = [*prompt_ids, *ref_ids]
    end = len(seq) - k - 1  # the last round's verify must find k + 1 reference tokens
    kmax = cfg.max_budget(len(seq))
    started = time.monotonic()
    cache = DynamicCache()
    v = len(prompt_ids)  # the first answer token is committed; it is fed by draft step 0
    with torch.no_grad():
        model(torch.tensor([seq[:v]]), past_key_values=cache, use_cache=True)
    scores, window, plan = None, None, None
    oracle: tuple[int, int] | None = None  # (count, tail_start) each draft query picks for itself
    among: torch.Tensor | None = None  # [layers, H_kv, tail_start] the candidates it picks from (refine)
    result = Fidelity(rule.name, [], [], 0.0)
    while v <= end:
        if plan is None or len(result.accept_probs) % cfg.select_every == 0:
            if window is not None and (rule.policy is SelectionPolicy.ORACLE or rule.refine or rule.own):
                # Each draft query picks its own count below the window: among every position (oracle) or the plan's
                # refine x count best ones, every position in the ``own`` layers and heads.
                if rule.policy is not SelectionPolicy.ORACLE:
                    wide, _ = next_plan(cfg, scores, (window[0], window[1] * max(rule.refine, 1)), v, kmax, score_dtype)
                    among = keep_mask((wide, window[0]), window[0], layers, h_kv)
                    mark_heads(among, rule.own, True)
                plan, oracle = (torch.empty(0, dtype=torch.int64), window[0]), (window[1], window[0])
            elif rule.alloc != "head" and scores is not None:
                plan = pooled_plan(scores, window, rule.alloc)
            elif rule.boost[1] and scores is not None:
                factor, where = rule.boost
                wide, tail_start = next_plan(cfg, scores, (window[0], window[1] * factor), v, kmax, score_dtype)
                base = keep_mask((wide[..., : window[1]], tail_start), tail_start, layers, h_kv)
                mark_heads(base, where, keep_mask((wide, tail_start), tail_start, layers, h_kv))
                plan = (base[..., :tail_start], tail_start)
            else:
                plan = next_plan(cfg, scores, window, v, kmax, score_dtype)
        keep = keep_mask(plan, v + k, layers, h_kv)
        mark_heads(keep, rule.dense, True)
        own = oracle[0] if oracle is not None else 0
        extra = match_keep(seq, v, k, rule.match[0], rule.match[1], (layers, h_kv)) if rule.match[1] else None
        seen = keep[..., None, :v] if extra is None else keep[..., None, :v] | extra[..., :v]
        result.draft_sets.append(float(seen.sum(-1, dtype=torch.float64).mean()) + own)
        chain = seq[v : v + k + 1]  # the tokens at positions v .. v + k
        with torch.no_grad():
            ATTN.keep, ATTN.oracle, ATTN.among = keep.repeat_interleave(h_q // h_kv, dim=1), oracle, among
            ATTN.first = rule.pick == "first"
            ATTN.extra = None if extra is None else extra.repeat_interleave(h_q // h_kv, dim=1)
            try:  # draft step j feeds the token at position v + j and drafts position v + j + 1
                q = sampling.probs(model(torch.tensor([chain[:k]]), past_key_values=cache, use_cache=True).logits[0])
            finally:
                ATTN.keep, ATTN.oracle, ATTN.among, ATTN.first, ATTN.extra = None, None, None, False, None
            cache.crop(v)
            ATTN.record, ATTN.probs = True, {}
            try:
                p = sampling.probs(model(torch.tensor([chain]), past_key_values=cache, use_cache=True).logits[0, :k])
                rows = ATTN.probs
                if advance <= k:  # the rows past the committed ones score as the served verify's do
                    cache.crop(v + advance)
                    ATTN.probs = {}
                    model(torch.tensor([served_tail(chain, q, advance)]), past_key_values=cache, use_cache=True)
                    rows = {i: torch.cat([rows[i][:, :advance], ATTN.probs[i]], 1) for i in rows}
            finally:
                ATTN.record = False
        result.accept_probs.append(overlap(p, q).tolist())
        cache.crop(v + advance)  # the verified KV of the committed tokens
        scores = verify_scores(rows, rule.rows, h_kv, v, rule.group, rule.reduce)
        if rule.value:
            scores = scores * torch.stack([cache.layers[i].values[0, :, :v].norm(dim=-1) for i in range(layers)])
        scores = shift_scores(scores, rule.shift)
        scores[..., : rule.sinks] = float("inf")
        tail_start, count = draft_window(cfg, torch.tensor([v]), torch.tensor([v + advance]), kmax)
        window = (int(tail_start[0]), int(count[0]))
        v += advance
    result.wall_s = time.monotonic() - started
    return result


def add_source_args(p: argparse.ArgumentParser, prompt_index: int) -> None:
    """The model and the problem whose prompt the text follows (``prompt_and_model``'s arguments)."""
    p.add_argument("--model", required=True, help="HF model folder (python -m sglang_sparsespec.models.smollm2)")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--dataset", default="aime24")
    p.add_argument("--prompt-index", type=int, default=prompt_index)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_source_args(p, prompt_index=1)
    p.add_argument("--tokens", type=int, default=3000, help="reference answer length (generated ones)")
    p.add_argument("--reference", type=Path, default=None, help="an earlier output whose reference_ids to reuse")
    p.add_argument(
        "--solution-reference", action="store_true", help="the problem's written solution (its first --tokens)"
    )
    p.add_argument("--rules", default="pillar,pillar:group=max,streaming")
    p.add_argument("--advance", type=int, default=6, help="reference tokens each round commits")
    defaults = PillarConfig()
    p.add_argument("--num-steps", type=int, default=defaults.num_steps)
    p.add_argument("--budget-ratio", type=float, default=defaults.budget_ratio)
    p.add_argument("--min-budget", type=int, default=defaults.min_budget)
    p.add_argument("--recent-window", type=int, default=defaults.recent_window)
    p.add_argument("--select-every", type=int, default=defaults.select_every)
    p.add_argument("--temperature", type=float, default=0.6)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0, help="the reference's sampling seed")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    try:
        args.rules = [Rule.parse(r) for r in args.rules.split(",") if r]
    except ValueError as e:
        p.error(str(e))
    if args.reference is not None and args.solution_reference:
        p.error("--reference and --solution-reference name two references: pick one")
    if args.temperature <= 0:
        p.error("--temperature must be > 0: the fidelity is a distance between sampled distributions")
    return args


def prompt_and_model(model_path: str, data_dir: Path, dataset: str, index: int) -> tuple[Any, Any, Any]:
    """(tokenizer, the problem's chat prompt, the model in fp32 on the recording attention of ``tools.policy_sim``)."""
    from transformers import AutoModelForCausalLM

    from benchmarks.workload import build_prompts, load_tokenizer

    tokenizer = load_tokenizer(model_path)
    prompt = build_prompts(tokenizer, data_dir, index + 1, (dataset,))[index]
    model = AutoModelForCausalLM.from_pretrained(
        model_path, dtype=torch.float32, attn_implementation=register_attention()
    ).eval()
    return tokenizer, prompt, model


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from benchmarks.meta import new_run_id, run_metadata

    tokenizer, prompt, model = prompt_and_model(args.model, args.data_dir, args.dataset, args.prompt_index)
    sampling = Sampling(args.temperature, args.top_p, -1, args.seed)
    if args.reference is not None:
        earlier = json.loads(args.reference.read_text())
        ref_ids, ref_kind = earlier["reference_ids"], earlier["reference_kind"]
    elif args.solution_reference:
        ref_ids = solution_ids(tokenizer, args.data_dir, args.dataset, args.prompt_index)[: args.tokens]
        ref_kind = "written solution"
    else:
        ref_ids = reference(model, prompt.input_ids, args.tokens, sampling)
        ref_kind = f"own answer, T {args.temperature:g} / top-p {args.top_p:g} (seed {args.seed})"
    cfg = PillarConfig(
        num_steps=args.num_steps,
        budget_ratio=args.budget_ratio,
        min_budget=args.min_budget,
        recent_window=args.recent_window,
        select_every=args.select_every,
    )
    settings = {**vars(args), "data_dir": str(args.data_dir), "out": None, "source": prompt.source}
    settings.update(reference=str(args.reference) if args.reference else None, rules=[r.name for r in args.rules])
    settings["verify_tail"] = "served"  # the verify rows past the committed tokens: see served_tail
    doc: dict[str, Any] = {
        "kind": "draft_fidelity",
        "meta": run_metadata(new_run_id()),
        "settings": settings,
        "reference_kind": ref_kind,
        "reference_ids": list(ref_ids),
        "results": {},
    }
    for rule in args.rules:
        res = fidelity(model, prompt.input_ids, ref_ids, cfg, rule, sampling, args.advance)
        doc["results"][rule.name] = summary = res.summary()
        by_pos = " ".join(f"{a:.3f}" for a in summary["mean_accept_prob_by_position"])
        print(
            f"{prompt.source} {rule.name}: E {summary['mean_expected_tokens']:.3f} over {summary['rounds']} rounds,"
            f" a_j {by_pos}, draft set {summary['mean_draft_set']:.1f} ({res.wall_s:.0f} s)",
            flush=True,
        )
        args.out.write_text(json.dumps(doc, indent=1))  # after each rule: a long run keeps what it has
    return 0


if __name__ == "__main__":
    sys.exit(main())
