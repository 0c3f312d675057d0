"""Losslessness and acceptance check: stock SGLang vs PILLAR on the same greedy requests.

    python -m benchmarks.checks.lossless --model M --data-dir D --out F.json \\
        [--num-prompts 32] [--max-new-tokens 1024] [--num-steps 8] \\
        [--accept-temps 0,0.6 --accept-max-new-tokens 2048] [--temperature T] \\
        [--attention-backend flashinfer] [--radix-cache] [--chunked-prefill-size C] \\
        [--shared-prefix-tokens N] [--long-prompt-tokens L]

With ``--temperature 0`` (default) the stock server answers the prompts greedily (twice,
to measure its own run-to-run determinism, unless --no-stock-repeat), then a PILLAR server
answers the same requests, and the token ids are compared. Greedy speculative decoding is
exact in exact arithmetic, but verification runs the target on k+1 tokens per request
where stock runs 1, so floating-point rounding differs and two near-tied logits can flip.
The reference stock pass therefore also returns every token's top-2 log-probabilities: a
divergence where stock's own top-2 gap was <= NEAR_TIE_NATS is rounding (a "near tie"); any
other divergence before ``--early-divergence`` tokens (64) fails the run as a likely bug.
``--controls ngram`` runs SGLang's own NGRAM through the same check, which shows the
share of divergences that SGLang's verify kernels cause by themselves.
``--rejudge F.json`` re-applies the classification to a stored result (no GPU).
``--temperature T > 0`` skips the stock server and only records acceptance (sampled
outputs cannot be compared token by token).
``--accept-temps`` adds acceptance-only passes against the same PILLAR server start.
``--attention-backend flashinfer`` runs both sides with FlashInfer (``stock-flashinfer`` vs
``pillar-k<k>-flashinfer``). The setup users run: ``--radix-cache`` turns the prefix cache back on
(every server), ``--chunked-prefill-size C`` sets SGLang's prefill chunk, ``--shared-prefix-tokens N``
puts the same N prompt tokens before every request and ``--long-prompt-tokens L`` adds one request of
L prompt tokens (its part after the shared prefix longer than C): PILLAR must stay lossless when its
draft selection sees cached and chunk-prefilled positions. The JSON records these settings, the
prompt lengths and each pass's ``cached_prompt_tokens``; acceptance with the cache on compares with
the same command run with the cache off.

Writes F.json (rewritten after every stage, so a killed job keeps what it had) and F.log.
Exit code 0 = PASS (or acceptance-only OK) with every pass finished, 2 when a prompt plus its new
tokens would not fit the server's context (nothing is run), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.checks.identity import NEAR_TIE_NATS, classify_divergences, compare_outputs
from benchmarks.configs import ServerConfig, add_server_options, flag_value, resolve_config, with_radix_cache
from benchmarks.meta import git_commit, run_metadata
from benchmarks.passes import PassResult, parse_pass_options, prompt_settings, run_passes
from benchmarks.runlog import write_json
from benchmarks.server import begin
from benchmarks.workload import (
    DEFAULT_DATASETS,
    build_prompts,
    load_problems,
    load_tokenizer,
    prompt_token_stats,
    with_shared_prefix,
)


def verdict(identity_mode: bool, identities: Sequence[dict[str, Any] | None], main_ok: bool) -> str:
    """PASS/FAIL judge the greedy identity checks of PILLAR's passes (the main pass first, then
    its repeats); OK is an acceptance-only run whose main pass finished; ``main_ok`` says
    whether it did."""
    if not main_ok or (identity_mode and (not identities or any(i is None for i in identities))):
        return "INCOMPLETE"
    if not identity_mode:
        return "OK"
    # Early divergences fail the run unless stock itself was at a near-tie there: greedy
    # speculation is exact up to the rounding of the k+1-token verify kernel.
    return "FAIL" if any(i["unexplained_early_divergences"] for i in identities) else "PASS"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model folder (also the tokenizer)")
    p.add_argument("--data-dir", type=Path, help="folder with aime24.jsonl / amc23.jsonl")
    p.add_argument("--out", type=Path, help="result JSON path; the log goes beside it (.log)")
    p.add_argument("--datasets", default=",".join(DEFAULT_DATASETS))
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--num-steps", type=int, default=8, help="PILLAR draft steps k")
    p.add_argument("--temperature", type=float, default=0.0, help="0: identity check; >0: acceptance only")
    p.add_argument("--accept-temps", default="", help="extra acceptance-only PILLAR passes, e.g. 0,0.6")
    p.add_argument("--accept-max-new-tokens", type=int, default=None, help="default: --max-new-tokens")
    p.add_argument("--concurrency", type=int, default=0, help="requests in flight (0 = all at once)")
    p.add_argument("--early-divergence", type=int, default=64)
    p.add_argument("--no-stock-repeat", action="store_true", help="skip the stock determinism pass")
    p.add_argument(
        "--candidate-repeats",
        type=int,
        default=0,
        metavar="N",
        help="PILLAR answers the greedy requests N more times on the same server, each judged against stock",
    )
    p.add_argument(
        "--rejudge",
        type=Path,
        default=None,
        metavar="F.json",
        help="only re-classify the divergences of a finished run with this version's rule and rewrite F.json",
    )
    p.add_argument("--controls", default="", help="more configs to check against stock, e.g. ngram,pillar-streaming")
    p.add_argument(
        "--attention-backend",
        choices=("triton", "flashinfer"),
        default="triton",
        help="stock and PILLAR both with this backend (flashinfer: stock-flashinfer vs pillar-k<k>-flashinfer)",
    )
    p.add_argument("--radix-cache", action="store_true", help="keep SGLang's radix cache on (the configs turn it off)")
    p.add_argument(
        "--chunked-prefill-size", type=int, default=None, metavar="C", help="SGLang's prefill chunk, every server"
    )
    p.add_argument(
        "--shared-prefix-tokens",
        type=int,
        default=0,
        metavar="N",
        help="the same N-token block (problem text, tokenized once) before every prompt",
    )
    p.add_argument(
        "--long-prompt-tokens",
        type=int,
        default=0,
        metavar="L",
        help="one extra request of L prompt tokens: the shared prefix, other problems' text, a question",
    )
    add_server_options(p)
    p.add_argument("--run-id", default=None)
    p.add_argument("--server-log-dir", type=Path, default=None, help="full server logs (default: a temp dir)")
    args = p.parse_args(argv)
    if args.rejudge is not None:
        return args
    if args.model is None or args.data_dir is None or args.out is None:
        p.error("--model, --data-dir and --out are required (unless --rejudge)")
    if args.num_prompts < 1 or args.max_new_tokens < 1 or args.num_steps < 1:
        p.error("--num-prompts, --max-new-tokens and --num-steps must be >= 1")
    if args.candidate_repeats < 0:
        p.error("--candidate-repeats must be >= 0")
    if args.temperature < 0:
        p.error("--temperature must be >= 0")
    if min(args.shared_prefix_tokens, args.long_prompt_tokens) < 0 or (
        args.chunked_prefill_size is not None and args.chunked_prefill_size < 1
    ):
        p.error("--shared-prefix-tokens and --long-prompt-tokens must be >= 0, --chunked-prefill-size >= 1")
    if (
        args.long_prompt_tokens
        and args.chunked_prefill_size
        and args.long_prompt_tokens - args.shared_prefix_tokens <= args.chunked_prefill_size
    ):
        # With the prefix cached only the rest is prefilled; it must still take more than one chunk.
        p.error("--long-prompt-tokens minus --shared-prefix-tokens must exceed --chunked-prefill-size")
    try:
        args.accept_temps = [float(t) for t in args.accept_temps.split(",") if t.strip()]
    except ValueError:
        p.error(f"--accept-temps must be comma-separated numbers, got {args.accept_temps!r}")
    parse_pass_options(p, args)
    args.controls = [c for c in args.controls.split(",") if c]
    for name in args.controls:
        try:
            resolve_config(name)
        except ValueError as e:
            p.error(str(e))
    return args


def server_config(name: str, args: argparse.Namespace) -> ServerConfig:
    """A named config with this run's server settings: extra flags, the prefill chunk, the radix cache."""
    chunk = ("--chunked-prefill-size", str(args.chunked_prefill_size)) if args.chunked_prefill_size else ()
    config = resolve_config(name, args.extra_server_args + chunk)
    return with_radix_cache(config) if args.radix_cache else config


def rejudge(path: Path) -> int:
    """Re-apply :func:`classify_divergences` and :func:`verdict` to a stored result.

    Every input of the classification (per-request margins and divergence positions) is
    in the JSON, so a rule change never needs the GPU again; ``rejudged`` records which
    commit's rule produced the verdict and what it was before.
    """
    doc = json.loads(path.read_text())
    judged = [doc["identity"], *doc.get("identity_repeats", [])]
    identities = judged + [c["identity"] for c in doc.get("controls", {}).values()]
    for ident in identities:
        if ident is not None:
            classify_divergences(ident)
    main_ok = bool(doc["acceptance"]) and doc["acceptance"][0]["status"] == "ok"
    identity_mode = doc["settings"]["temperature"] == 0
    new = verdict(identity_mode, judged, main_ok)
    doc["rejudged"] = {"previous_verdict": doc["verdict"], "by_commit": git_commit(), "near_tie_nats": NEAR_TIE_NATS}
    doc["verdict"] = new
    write_json(path, doc)
    print(f"{path}: verdict {doc['rejudged']['previous_verdict']} -> {new}")
    return 0 if new in ("PASS", "OK") and doc["all_passes_ok"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rejudge is not None:
        return rejudge(args.rejudge)
    deadline, log = begin(args.time_budget, args.out.with_suffix(".log"))
    doc: dict[str, Any] = {
        "kind": "lossless",
        "schema": 1,
        "meta": run_metadata(args.run_id),
        "settings": {
            **prompt_settings(args),
            "num_steps": args.num_steps,
            "temperature": args.temperature,
            "accept_temps": args.accept_temps,
            "accept_max_new_tokens": args.accept_max_new_tokens or args.max_new_tokens,
            "candidate_repeats": args.candidate_repeats,
            "attention_backend": args.attention_backend,
            "radix_cache": args.radix_cache,
            "chunked_prefill_size": args.chunked_prefill_size,
            "shared_prefix_tokens": args.shared_prefix_tokens,
            "long_prompt_tokens": args.long_prompt_tokens,
        },
        "servers": {},
        "stock_repeat": None,
        "identity": None,
        "identity_repeats": [],
        "acceptance": [],
        "verdict": "INCOMPLETE",
        "all_passes_ok": False,
    }
    write_json(args.out, doc)
    log.line(f"lossless run {args.run_id} on {doc['meta']['device']}; server logs in {args.server_log_dir}")

    tokenizer = load_tokenizer(args.model)
    prompts = build_prompts(tokenizer, args.data_dir, args.num_prompts, args.datasets)
    if args.shared_prefix_tokens or args.long_prompt_tokens:
        problems = load_problems(args.data_dir, args.datasets)
        prompts = with_shared_prefix(tokenizer, prompts, problems, args.shared_prefix_tokens, args.long_prompt_tokens)
    doc["prompt_tokens"] = prompt_token_stats(prompts)
    log.line(f"{len(prompts)} prompts, {sum(len(p.input_ids) for p in prompts)} prompt tokens")

    suffix = "-flashinfer" if args.attention_backend == "flashinfer" else ""
    stock, pillar = server_config(f"stock{suffix}", args), server_config(f"pillar-k{args.num_steps}{suffix}", args)
    # SGLang refuses a request whose prompt plus max_new_tokens exceeds the context: fail here, not on the GPU.
    longest = max(len(p.input_ids) for p in prompts) + max(args.max_new_tokens, args.accept_max_new_tokens or 0)
    context = flag_value(pillar.flags, "--context-length")
    if context is not None and longest > int(context):
        log.line(f"a prompt plus its new tokens needs {longest} tokens > --context-length {context}: nothing run")
        return 2

    identity_mode = args.temperature == 0
    stock_passes: list[PassResult] = []
    if identity_mode:
        # The first stock pass is the reference and carries top-2 log-probabilities, so every
        # divergence can be classified; the repeat measures stock's own run-to-run noise.
        stock_passes = [
            PassResult("stock", 0.0, args.max_new_tokens, top2=i == 0) for i in range(1 if args.no_stock_repeat else 2)
        ]
        doc["servers"]["stock"] = run_passes(stock, stock_passes, prompts, args, deadline, log)
        if len(stock_passes) == 2 and all(p.status == "ok" for p in stock_passes):
            rep = compare_outputs(stock_passes[0].outputs, stock_passes[1].outputs, args.early_divergence)
            rep.pop("requests")
            doc["stock_repeat"] = rep
            log.line(f"stock vs stock: {rep['identical']}/{rep['num_requests']} identical")
        write_json(args.out, doc)

    stock_ok = bool(stock_passes) and stock_passes[0].status == "ok"

    def identity(name: str, candidate: PassResult) -> dict[str, Any] | None:
        if not (identity_mode and stock_ok and candidate.status == "ok"):
            return None
        ident = compare_outputs(
            stock_passes[0].outputs, candidate.outputs, args.early_divergence, prompts, tokenizer.decode
        )
        log.line(
            f"identity {name} vs stock: {ident['identical']}/{ident['num_requests']} token-identical; "
            f"early (<{args.early_divergence}) divergences: {ident['early_divergences'] or 'none'}; "
            f"first divergence min {ident['first_divergence_min']}, median {ident['first_divergence_median']}; "
            f"near-tie divergences {ident['divergences_near_tie']}; unexplained early: "
            f"{ident['unexplained_early_divergences'] or 'none'}"
        )
        return ident

    accept_max = args.accept_max_new_tokens or args.max_new_tokens
    # Repeats follow the main pass on the same server: the same requests then land on reused
    # request rows and KV slots, after other requests' plans and at another selection phase,
    # so stale state that leaks into the target's output shows up as an unexplained divergence.
    repeats = [PassResult("pillar", args.temperature, args.max_new_tokens) for _ in range(args.candidate_repeats)]
    main_pass = PassResult("pillar", args.temperature, args.max_new_tokens)
    pillar_passes = [main_pass, *repeats] + [PassResult("pillar", t, accept_max) for t in args.accept_temps]
    doc["servers"]["pillar"] = run_passes(pillar, pillar_passes, prompts, args, deadline, log)
    doc["acceptance"] = [p.summary() for p in pillar_passes]
    doc["identity"] = identity("pillar", main_pass)
    doc["identity_repeats"] = [identity(f"pillar repeat {i + 1}", r) for i, r in enumerate(repeats)]
    write_json(args.out, doc)

    # Controls: other speculative configs through the same greedy check, e.g. SGLang's own NGRAM,
    # which verifies with the same TARGET_VERIFY kernels and so shows the verify numerics' share.
    doc["controls"] = {}
    for name in args.controls:
        control = PassResult(name, args.temperature, args.max_new_tokens)
        record = run_passes(server_config(name, args), [control], prompts, args, deadline, log)
        doc["servers"][name] = record
        doc["controls"][name] = {"pass": control.summary(), "identity": identity(name, control)}
        write_json(args.out, doc)
    doc["verdict"] = verdict(identity_mode, [doc["identity"], *doc["identity_repeats"]], main_pass.status == "ok")
    doc["all_passes_ok"] = all(p.status == "ok" for p in stock_passes + pillar_passes)
    write_json(args.out, doc)
    for a in doc["acceptance"]:
        al = a.get("accept_length_overall")
        log.line(
            f"acceptance T={a['temperature']} max_new={a['max_new_tokens']}: {a['status']}"
            + (f", {al:.3f}" if al else "")
        )
    log.line(f"LOSSLESS VERDICT: {doc['verdict']} (all passes ok: {doc['all_passes_ok']}) -> {args.out}")
    return 0 if doc["verdict"] in ("PASS", "OK") and doc["all_passes_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
