"""Step-time breakdown: stock decode step vs PILLAR phases, on Qwen3 shapes with dummy weights or a real model.

    python -m benchmarks.step_times --shape qwen3-1.7b --out F.json \\
        [--contexts 1024,4096,16384,32768] [--batches 16,64] [--configs stock,pillar,pillar-streaming] [--accept 6.0]

Random weights make any speculation look perfect, so this measures only *time per step*, which
does not depend on acceptance; a model folder with safetensors (SmolLM2) runs its real weights, so that
sampled rounds see real logit distributions. Per (context L, batch B) on one server start per config:
- stock: B requests of L random prompt ids decode M1 (unmeasured), M1 and then M2 tokens (ignore_eos);
  the decode step time is (wall(M2) - wall(M1)) / (M2 - M1), which cancels the prefill;
- PILLAR (SPARSESPEC_STEP_TIMING): mean GPU ms of the draft (k sparse steps), verify and select
  phases per round, from the server's timing lines logged during the M2 pass.
With an acceptance length measured on a real model (--accept, tokens per round), the projected
speedup is accept * stock_step / pillar_round — labelled a projection in the JSON. A PILLAR config
whose policy uses verify scores (pillar, coarse) measured next to its streaming twin (same flags and
knobs, SPARSESPEC_POLICY=streaming, which captures no scores) gives the score-capture cost: the
difference of their verify phases (``step_analysis.capture_overhead``). Writes F.json (rewritten after every point)
and F.log. Every B x (L + M2) must fit the KV pool, or the server queues requests and the times mix
batch sizes: points that do not fit the pool the server reports are skipped (recorded with the
reason); Qwen3-8B at 16 x 32K (about 75 GB of KV) needs an H200. PILLAR rows only count rounds that
ran at >= 90% of the requested batch.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.client import generate_all
from benchmarks.configs import (
    CONFIGS_HELP,
    ServerConfig,
    add_server_options,
    file_stem,
    flag_value,
    parse_env,
    resolve_config,
)
from benchmarks.meta import new_run_id, run_metadata
from benchmarks.qwen3_shapes import SHAPES
from benchmarks.runlog import Deadline, RunLog, write_json
from benchmarks.server import MIN_START_S, STOP_RESERVE_S, Server, begin, start_recorded
from benchmarks.step_analysis import capture_overhead, model_shape, projections
from benchmarks.step_point import kv_pool_tokens, measure_point, pool_skip_reason, random_prompts, sampling
from sglang_sparsespec.config import ENV_PREFIX

TIMING_EVERY = 10


def write_model_folder(shape: str, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(SHAPES[shape], indent=1))
    return folder


DEFAULT_CONTEXTS = (1024, 4096, 16384, 32768)


def context_length(length: int, m2: int) -> int:
    """Positions a point of context ``length`` needs: the prompt, the longer output and 64 of headroom
    (the servers' ``--context-length`` is this for the longest context)."""
    return length + m2 + 64


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", required=True, help=f"one of {', '.join(SHAPES)}, or a folder with a config.json")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--contexts",
        default=None,
        help=f"default: those of {DEFAULT_CONTEXTS} that fit the shape's max_position_embeddings",
    )
    p.add_argument("--batches", default="16,64")
    p.add_argument("--configs", default="stock,pillar,pillar-streaming", help=CONFIGS_HELP)
    # M2 = 288: with long prompts the chunked prefills interleave with decode steps, so the full batch decodes
    # together only after the last admission; at M2 = 160 SGLang logged no full-batch interval at 256 x 4K / 7K.
    p.add_argument("--decode-tokens", default="32,288", help="M1,M2: the two output lengths per point")
    p.add_argument(
        "--accept", type=float, default=None, help="accept length measured on a real model, for the projection"
    )
    p.add_argument("--temperature", type=float, default=0.0, help="sampling of every request (0: greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument(
        "--profile-steps",
        type=int,
        default=0,
        help="N > 0: after each point, profile N scheduler steps of a third pass (GPU kernels; row 'profile')",
    )
    p.add_argument(
        "--profile-host",
        action="store_true",
        help="profile the CPU too: GPU work submissions and host operators per step (slows the host)",
    )
    p.add_argument(
        "--profile-stack",
        action="store_true",
        help="with --profile-host: Python stacks too, naming the code that calls the host operators (slower)",
    )
    add_server_options(p)
    p.add_argument("--run-id", default=None)
    p.add_argument("--work-dir", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        args.contexts = None if args.contexts is None else [int(x) for x in args.contexts.split(",")]
        args.batches = [int(x) for x in args.batches.split(",")]
        args.m1, args.m2 = (int(x) for x in args.decode_tokens.split(","))
    except ValueError as e:
        p.error(str(e))
    if not 0 < args.m1 < args.m2:
        p.error("--decode-tokens needs 0 < M1 < M2")
    if args.profile_steps < 0:
        p.error("--profile-steps must be >= 0")
    if args.profile_host and not args.profile_steps:
        p.error("--profile-host needs --profile-steps N > 0")
    if args.profile_stack and not args.profile_host:
        p.error("--profile-stack needs --profile-host")
    # The longest pass: the profiled one decodes 10 tokens per profiled step past M2 (profile_pass).
    args.m_max = args.m2 + 10 * args.profile_steps
    if args.temperature < 0 or not 0.0 < args.top_p <= 1.0:
        p.error("--temperature must be >= 0 and --top-p in (0, 1]")
    if args.shape not in SHAPES and not (Path(args.shape) / "config.json").is_file():
        p.error(f"--shape {args.shape!r}: not a known shape or a folder with config.json")
    shape = SHAPES.get(args.shape) or json.loads((Path(args.shape) / "config.json").read_text())
    args.vocab_size = shape.get("vocab_size")
    if not isinstance(args.vocab_size, int) or args.vocab_size <= 1000:
        p.error(f"--shape {args.shape!r}: config.json needs an integer vocab_size > 1000, got {args.vocab_size!r}")
    max_pos = shape.get("max_position_embeddings")
    if not isinstance(max_pos, int):
        p.error(f"--shape {args.shape!r}: config.json needs an integer max_position_embeddings, got {max_pos!r}")
    fits = [n for n in DEFAULT_CONTEXTS if context_length(n, args.m_max) <= max_pos]
    args.contexts = fits if args.contexts is None else args.contexts
    too_long = [n for n in args.contexts if context_length(n, args.m_max) > max_pos]
    if not args.contexts or too_long or min(args.contexts) < 1:
        p.error(
            f"--contexts {args.contexts}: each must be >= 1 and leave {args.m_max} + 64 tokens inside the shape's "
            f"{max_pos} positions (contexts that fit among the defaults: {fits})"
        )
    args.extra_server_args = tuple(args.extra_server_args.split())
    names = [c for c in args.configs.split(",") if c]
    if len(set(names)) != len(names):
        p.error(f"--configs lists a config twice: {args.configs}")
    try:
        args.env = parse_env(args.env)
        args.configs = [resolve_config(c, server_flags(args)) for c in names]
        for c in args.configs:  # --env may set PILLAR knobs too: a bad value fails here, not on the GPU
            c.pillar_config(args.env)
    except ValueError as e:
        p.error(str(e))
    args.run_id = args.run_id or new_run_id()
    args.work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="sparsespec-steps-"))
    return args


def real_weights(shape: str) -> bool:
    """A model folder with safetensors runs its real weights; a named shape or a bare config.json runs dummy ones."""
    return shape not in SHAPES and any(Path(shape).glob("*.safetensors"))


def server_flags(args: argparse.Namespace) -> tuple[str, ...]:
    """Flags of every server on top of its config's: weights, contexts and batches of this run."""
    ctx = context_length(max(args.contexts), args.m_max)
    weights = () if real_weights(args.shape) else ("--load-format", "dummy")
    return (
        *weights,
        "--skip-tokenizer-init",
        "--context-length",
        str(ctx),
        "--max-running-requests",
        str(max(args.batches)),
        "--cuda-graph-max-bs-decode",
        str(max(args.batches)),
        *args.extra_server_args,
    )


def server_kind(config: ServerConfig) -> tuple[bool, str | None]:
    """What a server's start compiles (speculative or not, its attention backend): a second start of a kind in one
    command finds the first one's JIT caches warm."""
    return config.speculative, flag_value(config.flags, "--attention-backend")


def start_bound(kind: tuple[bool, str | None], started: list[tuple[tuple[bool, str | None], float]]) -> float:
    """The least budget a server of ``kind`` is started with, from the command's earlier starts (kind, seconds).

    A start the command cannot finish wastes the machine's time (stock Triton, launched with 86 s left after 191
    and 185 s starts, did not come up). A kind started before starts warm: its fastest later start bounds it, else
    MIN_START_S (a cold 335 s PILLAR start skipped a second PILLAR config that then came up in 78 s). A new kind
    compiles its own kernels: the fastest first start of any kind bounds it."""
    same = [s for k, s in started if k == kind]
    if same:
        return max(MIN_START_S, min(same[1:], default=MIN_START_S))
    first: dict[tuple[bool, str | None], float] = {}
    for k, s in started:
        first.setdefault(k, s)
    return max(MIN_START_S, min(first.values(), default=MIN_START_S))


def run_config(
    config: ServerConfig, model: Path, args: argparse.Namespace, deadline: Deadline, log: RunLog, min_start_s: float
) -> dict[str, Any]:
    name = config.name
    # A fixed draft count: the breakdown is of a k-step round (adaptive rounds would mix in plain ones).
    timing = (
        {f"{ENV_PREFIX}STEP_TIMING": str(TIMING_EVERY), f"{ENV_PREFIX}ADAPTIVE_STEPS": "off"}
        if config.speculative
        else {}
    )
    env = config.environment({**timing, **args.env})
    record: dict[str, Any] = {
        "flags": list(config.flags),
        "env": env,
        "status": "skipped",
        "rows": [],
        "pillar_config": config.pillar_config({**timing, **args.env}),
    }
    if not deadline.allows(min_start_s + STOP_RESERVE_S):
        record["error"] = f"time budget ({deadline.remaining():.0f} s left)"
        log.line(f"{name}: SKIPPED ({record['error']})")
        return record
    server = Server.sglang(str(model), config.flags, log_path=args.work_dir / f"{file_stem(name)}.server.log", env=env)
    with server:
        if not start_recorded(
            server, name, record, min(args.startup_timeout, deadline.remaining() - STOP_RESERVE_S), log
        ):
            return record
        # One short batch first: the first requests a fresh server serves pay one-time costs (lazy
        # initialisation, first graph replays) that would otherwise land in the first point's M1 pass.
        warm = random_prompts(max(args.batches), 64, seed=0, vocab_size=args.vocab_size)
        generate_all(server, warm, sampling(args, args.m1), concurrency=len(warm), timeout_s=240)
        pool = record["kv_pool_tokens"] = kv_pool_tokens(server)
        log.line(f"{name}: KV pool " + ("size unknown, no point skipped for it" if pool is None else f"{pool} tokens"))
        for length in args.contexts:
            for batch in args.batches:
                if not deadline.allows(STOP_RESERVE_S + 30):
                    log.line(f"{name} L={length} B={batch}: SKIPPED (time budget)")
                    continue
                if reason := pool_skip_reason(length, batch, pool, args):
                    record["rows"].append({"context": length, "batch": batch, "skipped": reason})
                    log.line(f"{name} L={length} B={batch}: SKIPPED ({reason})")
                    continue
                try:
                    row = measure_point(server, length, batch, args)
                except Exception as e:  # one point failing must not lose the others
                    row = {"context": length, "batch": batch, "error": f"{type(e).__name__}: {e}"}
                    if server.proc is None or server.proc.poll() is not None:
                        record.update(status="died", error=row["error"])
                        record["rows"].append(row)
                        break
                record["rows"].append(row)
                log.line(
                    f"{name} L={length} B={batch}: "
                    + ", ".join(f"{k}={v:.3f}" for k, v in row.items() if k.endswith("_ms"))
                    + (f" ERROR {row['error']}" if "error" in row else "")
                )
    return record


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    deadline, log = begin(args.time_budget, args.out.with_suffix(".log"))
    model = Path(args.shape) if args.shape not in SHAPES else write_model_folder(args.shape, args.work_dir / args.shape)
    doc: dict[str, Any] = {
        "kind": "step_times",
        "schema": 1,
        "meta": run_metadata(args.run_id),
        "settings": {
            "shape": args.shape,
            "contexts": args.contexts,
            "batches": args.batches,
            "decode_tokens": [args.m1, args.m2],
            "accept_assumed": args.accept,
            "temperature": args.temperature,
            "top_p": args.top_p,
            "profile_host": args.profile_host,
            "profile_stack": args.profile_stack,
            "env": args.env,
            "model": model_shape(json.loads((model / "config.json").read_text())),
            "weights": "real" if real_weights(args.shape) else "dummy (random): times only",
        },
        "servers": {},
        "projection": [],
        "capture_overhead": [],
    }
    write_json(args.out, doc)
    started: list[tuple[tuple[bool, str | None], float]] = []
    for config in args.configs:
        kind = server_kind(config)
        min_start_s = start_bound(kind, started)
        record = doc["servers"][config.name] = run_config(config, model, args, deadline, log, min_start_s)
        if record.get("startup_s"):
            started.append((kind, record["startup_s"]))
        doc["projection"] = projections(doc["servers"], args.accept)
        doc["capture_overhead"] = capture_overhead(doc["servers"])
        write_json(args.out, doc)
    # A server skipped for the time budget is listed, not a failure (as in throughput).
    ok = all(
        r["status"] in ("ok", "skipped") and not any("error" in x for x in r["rows"]) for r in doc["servers"].values()
    )
    log.line(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
