"""The contexts of benchmarks.checks.exactness: the fixed set of token sequences every server continues.

``--prompts data``: an AIME/AMC prompt plus the reference server's greedy continuation, cut in its second half
where the greedy token led its runner-up by the least (``most_uncertain_cut``); the reference's radix cache is
flushed after, so every server prefills the contexts itself. ``--prompts short``: short chat questions with
one-word answers (``SHORT_QUESTIONS``), whose stop token comes within a few tokens.
"""

from __future__ import annotations

import argparse
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from typing import Any

from benchmarks.runlog import Deadline, RunLog
from benchmarks.server import Server, http_json
from benchmarks.workload import build_prompts, load_tokenizer

SHORT_QUESTIONS = (
    "What is the capital of France? Answer with one word.",
    "Is the sky blue on a clear day? Answer yes or no.",
    "Name one primary color. One word only.",
    "What is 2 + 3? Reply with the number only.",
    "Which planet is closest to the Sun? One word.",
    "What color is fresh grass? One word.",
    "Name a day of the week. One word.",
    "What animal says meow? One word.",
)


def flush_radix_cache(server: Server, timeout: float, tries: int = 20) -> None:
    """Empty the server's radix cache (SGLang's /flush_cache): the contexts' KV came from the reference's greedy
    decode, and token 1 must come from a prefill on every server. SGLang answers 400 while a request is still
    in its batches (a finished one can linger for a scheduler iteration), so a refusal is retried."""
    for attempt in range(tries):
        req = urllib.request.Request(server.base_url + "/flush_cache", data=b"", method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                resp.read()
                return
        except urllib.error.HTTPError as e:
            if e.code != 400 or attempt == tries - 1:
                raise
        time.sleep(0.25)


def most_uncertain_cut(top_logprobs: Sequence[Sequence[Sequence[Any]]], lo: int) -> tuple[int, float]:
    """The output index p >= lo whose greedy token had the smallest lead over the runner-up (natural log), and
    that lead. The context is cut before it, so token 1 is drawn where the model hesitates most."""
    gaps = [
        (float(t[0][0]) - float(t[1][0]) if t and len(t) > 1 else float("inf"), i)
        for i, t in enumerate(top_logprobs)
        if i >= lo
    ]
    if not gaps:
        raise ValueError(f"no output position at or after {lo} to cut at")
    gap, p = min(gaps)
    return p, gap


def short_contexts(args: argparse.Namespace) -> list[dict[str, Any]]:
    tokenizer = load_tokenizer(args.model)
    out = []
    for i, question in enumerate(SHORT_QUESTIONS[: args.contexts]):
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
        )
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        out.append({"source": f"short:{i}", "question": question, "tokens": len(ids), "ids": ids})
    return out


def data_contexts(server: Server, args: argparse.Namespace, deadline: Deadline, log: RunLog) -> list[dict[str, Any]]:
    """Each context: a prompt plus the reference's greedy continuation, cut where it hesitates most in its second
    half; the radix cache is flushed after. A reply without top-2 logprobs keeps the whole continuation (logged)."""
    tokenizer = load_tokenizer(args.model)
    greedy = {"temperature": 0.0, "max_new_tokens": args.context_tokens, "ignore_eos": True}
    out = []
    for prompt in build_prompts(tokenizer, args.data_dir, args.contexts, args.datasets):
        body = {"input_ids": prompt.input_ids, "sampling_params": greedy, "return_logprob": True, "top_logprobs_num": 2}
        reply = http_json(server.base_url + "/generate", body, max(60.0, deadline.remaining()))
        gen = [int(t) for t in reply["output_ids"]]
        tops = reply.get("meta_info", {}).get("output_top_logprobs")
        if isinstance(tops, list) and len(tops) == len(gen):
            cut, lead = most_uncertain_cut(tops, args.context_tokens // 2)
        else:
            cut, lead = len(gen), None
            log.line(f"{prompt.source}: no top-2 logprobs in the greedy reply, the context keeps all {len(gen)} tokens")
        ids = prompt.input_ids + gen[:cut]
        out.append({"source": prompt.source, "tokens": len(ids), "greedy_lead_nats": lead, "ids": ids})
    flush_radix_cache(server, max(60.0, deadline.remaining()))
    return out
