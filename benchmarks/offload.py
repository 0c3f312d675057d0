"""Offload-aware KV pool under oversubscription (issue 24): throughput, retractions, identity.

    python -m benchmarks.offload --model M --data-dir D --out benchmarks/results/offload_<device>.json \\
        [--num-prompts 64] [--max-new-tokens 7000] [--oversubscription 1.5] [--host-gb 16] [--radix-cache]

Runs the same greedy requests (``ignore_eos``, so each asks for exactly ``--max-new-tokens``) on:
an unpressured stock server (the reference outputs), then with the GPU pool shrunk to
demand / oversubscription tokens (``--max-total-tokens``): stock (SGLang's retraction), stock with
``--enable-hierarchical-cache``, stock + offload (plain decoding) and PILLAR + offload. Each
pressured run records output tok/s, retractions (SGLang's "Retract requests" log lines), the
offload counters from /server_info (parks, restores, bytes each way), and token identity against
the reference as benchmarks.lossless judges it. ``ratio_vs_stock`` = PILLAR+offload tok/s over
stock's. Writes the JSON after every run and a .log next to it.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path
from typing import Any

from benchmarks.client import generate_all
from benchmarks.configs import resolve_config
from benchmarks.lossless import compare_outputs, verdict
from benchmarks.meta import new_run_id, run_metadata
from benchmarks.runlog import RunLog, write_json
from benchmarks.server import Server, ServerError, http_json, install_signal_handlers, start_recorded
from benchmarks.workload import build_prompts, load_tokenizer

RETRACT_LINE = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (\d+)")


def runs(args: argparse.Namespace, pool_tokens: int) -> list[tuple[str, str, tuple[str, ...], dict[str, str]]]:
    """(name, base config, extra flags, environment) of each pass; the first is the reference."""
    pressure = ("--max-total-tokens", str(pool_tokens))
    offload = {"SPARSESPEC_OFFLOAD_HOST_GB": str(args.host_gb)}
    return [
        ("reference", "stock", (), {}),
        ("stock", "stock", pressure, {}),
        ("stock_hicache", "stock", (*pressure, "--enable-hierarchical-cache"), {}),
        ("stock_offload", "stock", pressure, offload),
        ("pillar_offload", f"pillar-k{args.num_steps}", pressure, offload),
    ]


def one_run(name, config, extra, env, prompts, args, log: RunLog) -> dict[str, Any]:
    flags = list(resolve_config(config, extra).flags)
    if args.radix_cache or "--enable-hierarchical-cache" in flags:  # HiCache lives in the radix tree
        flags.remove("--disable-radix-cache")
    log_path = args.out.with_name(f"{args.out.stem}_{name}.server.log")
    server = Server.sglang(args.model, flags, log_path=log_path, env=env)
    rec: dict[str, Any] = {"flags": flags, "env": env, "status": "skipped"}
    with server:
        if not start_recorded(server, name, rec, args.startup_timeout, log):
            return rec
        sampling = {"temperature": 0.0, "max_new_tokens": args.max_new_tokens, "ignore_eos": True}
        t0 = time.monotonic()
        try:
            # The reference carries top-2 log-probabilities so divergences are judged as lossless does.
            rec["outputs"] = generate_all(server, [p.input_ids for p in prompts], sampling, concurrency=len(prompts),
                                          timeout_s=args.timeout, top2=name == "reference")  # fmt: skip
        except (ServerError, TimeoutError, OSError, ValueError) as e:  # recorded, not a crash
            rec.update(status="failed", error=f"{type(e).__name__}: {e}")
            log.line(f"{name}: failed: {rec['error']}")
            return rec
        wall = time.monotonic() - t0
        info = http_json(server.base_url + "/server_info", timeout=30)
        state = (info.get("internal_states") or [{}])[0]
        tokens = sum(len(o.output_ids) for o in rec["outputs"])
        rec.update(wall_s=round(wall, 2), output_tokens=tokens, output_tok_s=round(tokens / wall, 1),
                   completed=sum(o.finish_reason == "length" for o in rec["outputs"]),
                   offload=state.get("offload"), max_total_num_tokens=info.get("max_total_num_tokens"))  # fmt: skip
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    rec["retractions"] = sum(int(n) for n in RETRACT_LINE.findall(text))
    rec["offload_fallback_logged"] = "no request can be parked" in text
    log.line(f"{name}: {rec['output_tok_s']} tok/s, {rec['completed']}/{len(prompts)} complete, "
             f"{rec['retractions']} retracted, offload {rec['offload']}")  # fmt: skip
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--data-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=7000)
    ap.add_argument("--num-steps", type=int, default=8)
    ap.add_argument("--oversubscription", type=float, default=1.5, help="demand / GPU pool (>= 1.5 for the issue)")
    ap.add_argument("--host-gb", type=float, default=16.0)
    ap.add_argument(
        "--radix-cache", action="store_true", help="keep the radix cache on (default: off, as COMMON_FLAGS)"
    )
    ap.add_argument("--startup-timeout", type=float, default=900)
    ap.add_argument("--timeout", type=float, default=3600)
    args = ap.parse_args(argv)
    if args.oversubscription <= 1.0 or args.host_gb <= 0:
        ap.error("--oversubscription must be > 1 and --host-gb > 0")
    install_signal_handlers()
    log = RunLog(args.out.with_suffix(".log"))
    prompts = build_prompts(load_tokenizer(args.model), args.data_dir, args.num_prompts)
    demand = sum(len(p.input_ids) + args.max_new_tokens for p in prompts)
    pool = int(demand / args.oversubscription)
    doc: dict[str, Any] = {"kind": "offload", "schema": 1, "meta": run_metadata(new_run_id()),
                           "settings": {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}},
                           "requests": len(prompts), "demand_tokens": demand, "pool_tokens": pool, "runs": {}}  # fmt: skip
    log.line(f"{len(prompts)} requests, demand {demand} tokens, pool {pool} tokens")
    reference = None
    for name, config, extra, env in runs(args, pool):
        rec = one_run(name, config, extra, env, prompts, args, log)
        outputs = rec.pop("outputs", None)
        if name == "reference":
            reference = outputs
        elif outputs is not None and reference is not None:
            ident = compare_outputs(reference, outputs, early=64)
            rec["identity"] = {k: v for k, v in ident.items() if k != "requests"}
            # benchmarks.lossless's verdict: divergences only where stock itself was at a near tie.
            rec["outputs_identical"] = verdict(True, [ident], True) == "PASS"
            rec["token_identical"] = ident["identical"]
        doc["runs"][name] = rec
        write_json(args.out, doc)
    runs_ = doc["runs"]
    main_run, stock = runs_.get("pillar_offload", {}), runs_.get("stock", {})
    pool_seen = main_run.get("max_total_num_tokens") or pool
    speed = {k: r.get("output_tok_s") for k, r in runs_.items()}
    moved = main_run.get("offload") or {}
    doc.update(
        completed=main_run.get("completed"),
        oversubscription=round(demand / pool_seen, 3),
        retractions=main_run.get("retractions"),
        outputs_identical=main_run.get("outputs_identical"),
        bytes_to_host=moved.get("bytes_to_host"),
        bytes_to_device=moved.get("bytes_to_device"),
        ratio_vs_stock=round(speed["pillar_offload"] / speed["stock"], 3) if speed.get("pillar_offload") and speed.get("stock") else None,
        ratio_vs_stock_hicache=round(speed["pillar_offload"] / speed["stock_hicache"], 3)
        if speed.get("pillar_offload") and speed.get("stock_hicache") else None,
    )  # fmt: skip
    write_json(args.out, doc)
    log.line(
        f"ratio_vs_stock {doc['ratio_vs_stock']}, retractions {doc['retractions']}, identical {doc['outputs_identical']}"
    )
    ok = doc["retractions"] == 0 and doc["outputs_identical"] and doc["completed"] == len(prompts)
    return 0 if ok and stock.get("status") == "ok" else 1


if __name__ == "__main__":
    raise SystemExit(main())
