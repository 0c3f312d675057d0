"""Same prompts through each request path of one server: does the path change the output?

    python -m benchmarks.request_paths --model M --data-dir D --out F.json \
        [--config pillar] [--num-prompts 2] [--max-new-tokens 4096]

The acceptance harness sends token ids without streaming; bench_serving (the throughput
harness) sends chat-templated text with streaming. Greedy decoding must give the same
tokens, and so the same verify rounds, on every path. Each prompt goes, one request at a
time, through: ids (token ids, no stream), text (no stream), text-stream (SSE, as
bench_serving does), then ids again (determinism). Per request: completion tokens, verify
rounds, accept length and a digest of the output text, so a mismatch names its path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shlex
import time
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.configs import resolve_config
from benchmarks.meta import new_run_id, run_metadata
from benchmarks.runlog import write_json
from benchmarks.server import Server, install_signal_handlers
from benchmarks.workload import DEFAULT_DATASETS, build_prompts, load_tokenizer

PATHS = ("ids", "text", "text-stream", "ids-again")


def _post(url: str, body: dict[str, Any], timeout: float) -> Any:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout)


def request(base_url: str, path: str, ids: list[int], text: str, max_new: int, timeout: float) -> dict[str, Any]:
    """One greedy request on ``path``; returns its final text and speculative counters."""
    body: dict[str, Any] = {
        "sampling_params": {"temperature": 0.0, "max_new_tokens": max_new, "ignore_eos": True},
        "stream": path == "text-stream",
    }
    body.update({"text": text} if path.startswith("text") else {"input_ids": ids})
    t0 = time.monotonic()
    with _post(base_url + "/generate", body, timeout) as resp:
        if body["stream"]:
            last: dict[str, Any] = {}
            for raw in resp:
                line = raw.strip()
                if line.startswith(b"data: ") and line != b"data: [DONE]":
                    last = json.loads(line[6:])
            reply = last
        else:
            reply = json.loads(resp.read())
    meta = reply.get("meta_info", {})
    out = reply.get("text", "")
    return {
        "path": path,
        "wall_s": time.monotonic() - t0,
        "completion_tokens": meta.get("completion_tokens"),
        "spec_verify_ct": meta.get("spec_verify_ct"),
        "spec_accept_length": meta.get("spec_accept_length"),
        "text_sha1": hashlib.sha1(out.encode()).hexdigest()[:12],
        "text_head": out[:80],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--config", default="pillar")
    p.add_argument("--num-prompts", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=4096)
    p.add_argument("--extra-server-args", default="")
    p.add_argument("--startup-timeout", type=float, default=400.0)
    args = p.parse_args(argv)
    install_signal_handlers()
    config = resolve_config(args.config, tuple(shlex.split(args.extra_server_args)))
    tok = load_tokenizer(args.model)
    prompts = build_prompts(tok, args.data_dir, args.num_prompts, DEFAULT_DATASETS)
    doc: dict[str, Any] = {"kind": "request_paths", "meta": run_metadata(new_run_id()), "config": args.config,
                           "flags": list(config.flags), "env": dict(config.env), "pillar_config": config.pillar_config({}), "rows": []}  # fmt: skip
    log_path = args.out.with_suffix(".server.log")
    with Server.sglang(args.model, config.flags, log_path=log_path, env=config.environment({})) as server:
        doc["startup_s"] = server.start(args.startup_timeout)
        for i, pr in enumerate(prompts):
            for path in PATHS:
                row = {"prompt": i, **request(server.base_url, path, pr.input_ids, pr.text, args.max_new_tokens, 600)}
                doc["rows"].append(row)
                print(json.dumps(row), flush=True)
                write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
