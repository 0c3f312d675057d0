"""End-to-end checks of the sampling parameters PILLAR serves with one token per round, against
two running servers (a stock one and a PILLAR one, same model and flags otherwise):

    python -m benchmarks.checks.request_params --stock http://127.0.0.1:30001 --pillar http://127.0.0.1:30000 \\
        --out F.json [--seeded]

Both servers need ``--enable-custom-logit-processor``; with ``--seeded`` both run with
``--enable-deterministic-inference`` and only the seed check runs on PILLAR. Checks:

- ``processor``: a custom logit processor that forces one token, sampled at T 0.8: every output token
  is that token (stock too, as the control of the check itself).
- ``penalties``: greedy requests with frequency / presence / repetition penalty and min_new_tokens:
  PILLAR's output ids equal stock's, or first differ where stock's own top-2 log-probability gap was a
  near tie (<= 0.25 nats, the rounding of a (k+1)-row verify against a one-row decode; as
  ``benchmarks.checks.lossless``). min_new_tokens outputs must be at least that long on both.
- ``stop_then_length``: a stop token that stock's greedy answer reaches at position 4, with
  max_new_tokens 3 further: both servers stop at it with finish reason "stop".
- ``seed`` (``--seeded``): the same seeded request twice on PILLAR, one at a time: identical outputs.

Writes F.json; exit code 0 when every check passes, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.checks.identity import NEAR_TIE_NATS, first_divergence
from benchmarks.client import parse_generate_reply
from benchmarks.server import http_json

PROMPTS = [
    "The history of the printing press begins",
    "List the prime numbers below fifty and explain",
    "def fibonacci(n):",
    "Once upon a time in a small village by the sea,",
]
PENALTIES = {
    "frequency_penalty": {"frequency_penalty": 0.6},
    "presence_penalty": {"presence_penalty": 1.0},
    "repetition_penalty": {"repetition_penalty": 1.3},
    "min_new_tokens": {"min_new_tokens": 48},
}
FORCED = 42
TIMEOUT_S = 300.0


def generate(url: str, text: str, sampling: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return http_json(url + "/generate", {"text": text, "sampling_params": sampling, **extra}, timeout=TIMEOUT_S)


def forcing_processor() -> str:
    from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

    class ForceToken(CustomLogitProcessor):
        def __call__(self, logits, custom_param_list=None):
            for i, param in enumerate(custom_param_list):
                logits[i, :] = float("-inf")
                logits[i, param["token"]] = 0.0
            return logits

    return ForceToken.to_str()


def check_processor(url: str) -> dict[str, Any]:
    sampling = {"temperature": 0.8, "max_new_tokens": 48, "ignore_eos": True, "custom_params": {"token": FORCED}}
    ids = generate(url, PROMPTS[0], sampling, custom_logit_processor=forcing_processor())["output_ids"]
    return {"pass": ids == [FORCED] * 48, "output_ids": ids}


def check_penalties(stock: str, pillar: str) -> dict[str, Any]:
    out: dict[str, Any] = {"pass": True, "settings": {}}
    for name, params in PENALTIES.items():
        sampling = {"temperature": 0.0, "max_new_tokens": 96, **params}
        cases = []
        for text in PROMPTS:
            ref = parse_generate_reply(generate(stock, text, sampling, return_logprob=True, top_logprobs_num=2))
            got = parse_generate_reply(generate(pillar, text, sampling))
            at = first_divergence(ref.output_ids, got.output_ids)
            margin = ref.margin[at] if at is not None and ref.margin and at < len(ref.margin) else None
            ok = at is None or (margin is not None and margin <= NEAR_TIE_NATS)
            if name == "min_new_tokens":
                ok = ok and min(len(ref.output_ids), len(got.output_ids)) >= params["min_new_tokens"]
            cases.append(
                {
                    "first_divergence": at,
                    "stock_top2_gap": margin,
                    "pass": ok,
                    "stock_len": len(ref.output_ids),
                    "pillar_len": len(got.output_ids),
                }
            )
            out["pass"] &= ok
        out["settings"][name] = cases
    return out


def check_stop_then_length(stock: str, pillar: str) -> dict[str, Any]:
    out: dict[str, Any] = {"pass": True, "cases": []}
    for text in PROMPTS:
        ref = generate(stock, text, {"temperature": 0.0, "max_new_tokens": 32, "ignore_eos": True})["output_ids"]
        j = next((i for i in range(4, len(ref)) if ref[i] not in ref[:i]), None)
        if j is None:
            continue
        sampling = {"temperature": 0.0, "max_new_tokens": j + 4, "stop_token_ids": [ref[j]]}
        for name, url in (("stock", stock), ("pillar", pillar)):
            reply = generate(url, text, sampling)
            ids, finish = reply["output_ids"], reply["meta_info"]["finish_reason"] or {}
            # Ends at the stop token (with or without it in output_ids), finished by it.
            ok = ids[:j] == ref[:j] and len(ids) <= j + 1 and finish.get("type") == "stop"
            ok = ok and finish.get("matched") == ref[j]
            out["cases"].append({"server": name, "stop_at": j, "finish": finish, "output_len": len(ids), "pass": ok})
            out["pass"] &= ok
    return out


def check_seed(pillar: str) -> dict[str, Any]:
    runs = []
    for seed in (7, 7, 8):
        sampling = {"temperature": 1.0, "max_new_tokens": 64, "ignore_eos": True, "sampling_seed": seed}
        runs.append(generate(pillar, PROMPTS[3], sampling)["output_ids"])
    return {"pass": runs[0] == runs[1], "other_seed_differs": runs[0] != runs[2], "runs": runs}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--stock", required=True, help="base URL of the stock server")
    p.add_argument("--pillar", required=True, help="base URL of the PILLAR server")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seeded", action="store_true", help="servers run --enable-deterministic-inference")
    args = p.parse_args(argv)
    if args.seeded:
        doc = {"seed": check_seed(args.pillar)}
    else:
        doc = {
            "processor": {"stock": check_processor(args.stock), "pillar": check_processor(args.pillar)},
            "penalties": check_penalties(args.stock, args.pillar),
            "stop_then_length": check_stop_then_length(args.stock, args.pillar),
        }
        doc["processor"]["pass"] = doc["processor"]["stock"]["pass"] and doc["processor"]["pillar"]["pass"]
    verdict = all(v["pass"] for v in doc.values())
    doc["pass"] = verdict
    args.out.write_text(json.dumps(doc, indent=1))
    print(json.dumps({k: v["pass"] if isinstance(v, dict) else v for k, v in doc.items()}))
    return 0 if verdict else 1


if __name__ == "__main__":
    sys.exit(main())
