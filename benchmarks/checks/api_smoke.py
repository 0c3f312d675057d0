"""OpenAI-compatible endpoints of a server config, streaming and not.

    python -m benchmarks.checks.api_smoke --model M --out F.json [--config pillar] [--time-budget 300]

Starts one server and, greedily on one chat prompt, checks that

* ``/v1/chat/completions`` and ``/v1/completions`` answer well-formed, non-empty replies;
* the streamed (SSE) answer of each endpoint is the same text as its non-streamed answer;
* ``/v1/completions`` on the chat-templated prompt text says what native ``/generate`` says.

Writes F.json (one record per check) and F.log; exit code 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from benchmarks.configs import add_server_options, file_stem, parse_env, resolve_config
from benchmarks.meta import new_run_id, run_metadata
from benchmarks.runlog import write_json
from benchmarks.server import Server, ServerError, begin, http_json, log_tail
from benchmarks.workload import load_tokenizer

QUESTION = "Find the sum of all positive integers n such that n^2 - 19n + 99 is a perfect square. Think step by step."
MAX_TOKENS = 96


def sse_events(url: str, body: dict[str, Any], timeout: float) -> Iterator[dict[str, Any]]:
    """POST ``body`` and yield the JSON payload of each ``data:`` line until ``[DONE]``."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            payload = line[len("data:") :].strip()
            if payload == "[DONE]":
                return
            yield json.loads(payload)
    raise ValueError("stream ended without [DONE]")


def chat_text(reply: dict[str, Any]) -> str:
    return reply["choices"][0]["message"]["content"]


def completion_text(reply: dict[str, Any]) -> str:
    return reply["choices"][0]["text"]


def streamed_text(events: Iterator[dict[str, Any]], chat: bool) -> str:
    parts = []
    for ev in events:
        for choice in ev.get("choices", []):
            piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
            parts.append(piece or "")
    return "".join(parts)


def run_checks(base_url: str, model: str, prompt_text: str, timeout: float) -> list[dict[str, Any]]:
    """Every check as {"name", "ok", "detail"}; a failing request becomes a failed check."""
    chat_body = {
        "model": model,
        "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
    }
    comp_body = {"model": model, "prompt": prompt_text, "temperature": 0, "max_tokens": MAX_TOKENS}
    answers: dict[str, str] = {}
    checks: list[dict[str, Any]] = []

    def check(name: str, fn: Callable[[], tuple[bool, str]]) -> None:
        try:
            ok, detail = fn()
        except Exception as e:  # one broken endpoint must not hide the others
            ok, detail = False, f"{type(e).__name__}: {e}"
        checks.append({"name": name, "ok": ok, "detail": detail[:500]})

    def non_stream(key: str, path: str, body: dict[str, Any], text_of: Callable[[dict[str, Any]], str]):
        def fn() -> tuple[bool, str]:
            reply = http_json(base_url + path, body, timeout=timeout)
            answers[key] = text_of(reply)
            tokens = reply["usage"]["completion_tokens"]
            return bool(answers[key]) and tokens > 0, f"{tokens} tokens: {answers[key]!r}"

        return fn

    def stream(key: str, path: str, body: dict[str, Any], chat: bool):
        def fn() -> tuple[bool, str]:
            text = streamed_text(sse_events(base_url + path, {**body, "stream": True}, timeout), chat)
            same = text == answers.get(key)
            return same, "same text as non-streamed" if same else f"streamed {text!r} vs {answers.get(key)!r}"

        return fn

    def native_matches() -> tuple[bool, str]:
        body = {"text": prompt_text, "sampling_params": {"temperature": 0, "max_new_tokens": MAX_TOKENS}}
        text = http_json(base_url + "/generate", body, timeout=timeout)["text"]
        same = text == answers.get("completions")
        return same, "same text as /v1/completions" if same else f"/generate {text!r} vs {answers.get('completions')!r}"

    check("chat non-stream", non_stream("chat", "/v1/chat/completions", chat_body, chat_text))
    check("chat stream", stream("chat", "/v1/chat/completions", chat_body, chat=True))
    check("completions non-stream", non_stream("completions", "/v1/completions", comp_body, completion_text))
    check("completions stream", stream("completions", "/v1/completions", comp_body, chat=False))
    check("native /generate agrees", native_matches)
    return checks


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="model folder (also the tokenizer)")
    p.add_argument("--out", required=True, type=Path, help="result JSON path; the log goes beside it (.log)")
    p.add_argument("--config", default="pillar", help="server config name (see benchmarks/configs.py)")
    add_server_options(p, 540.0)
    p.add_argument("--server-log-dir", type=Path, default=None, help="full server log (default: a temp dir)")
    args = p.parse_args(argv)
    try:
        args.env = parse_env(args.env)
        args.server_config = resolve_config(args.config, tuple(shlex.split(args.extra_server_args)))
    except ValueError as e:
        p.error(str(e))
    args.server_log_dir = args.server_log_dir or Path(tempfile.mkdtemp(prefix="sparsespec-api-"))
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    deadline, log = begin(args.time_budget, args.out.with_suffix(".log"))
    cfg = args.server_config
    env = cfg.environment(args.env)
    doc: dict[str, Any] = {
        "kind": "api_smoke",
        "schema": 1,
        "meta": run_metadata(new_run_id()),
        "config": {
            "name": cfg.name,
            "flags": list(cfg.flags),
            "env": env,
            "pillar_config": cfg.pillar_config(args.env),
        },
        "server": {"status": "skipped"},
        "checks": [],
        "all_ok": False,
    }
    log_path = args.server_log_dir / f"{file_stem(cfg.name)}.server.log"
    server = Server.sglang(args.model, cfg.flags, log_path=log_path, env=env)
    with server:
        log.line(f"{cfg.name}: starting server")
        try:
            startup = server.start(timeout_s=min(args.startup_timeout, deadline.remaining() - 20))
        except ServerError as e:
            doc["server"] = {"status": "failed", "error": str(e)}
            log.block("server log tail", log_tail(server.log_path, 200))
            write_json(args.out, doc)
            return 1
        doc["server"] = {"status": "ok", "startup_s": startup}
        tok = load_tokenizer(args.model)
        prompt_text = tok.apply_chat_template(
            [{"role": "user", "content": QUESTION}], tokenize=False, add_generation_prompt=True
        )
        doc["checks"] = run_checks(
            server.base_url, "default", prompt_text, timeout=max(30.0, deadline.remaining() - 20)
        )
        log.block("server log tail", log_tail(server.log_path, 30))
    for c in doc["checks"]:
        log.line(f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}")
    doc["all_ok"] = bool(doc["checks"]) and all(c["ok"] for c in doc["checks"])
    write_json(args.out, doc)
    log.line(f"API SMOKE {'PASS' if doc['all_ok'] else 'FAIL'} -> {args.out}")
    return 0 if doc["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
