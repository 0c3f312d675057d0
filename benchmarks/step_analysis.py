"""What a step_times run's rows say: stock's decode step per point, PILLAR's projected speedup at an
assumed acceptance, the mixed-phase round's best case, the score-capture cost against a streaming twin,
and each phase against its physical cost (bytes over peak HBM bandwidth)."""

from __future__ import annotations

from typing import Any

from benchmarks.qwen3_shapes import SHAPES
from sglang_sparsespec.config import ENV_PREFIX, PillarConfig
from sglang_sparsespec.modes import SelectionPolicy
from sglang_sparsespec.rounds.timing import GAP, PHASES


def stock_step_ms(row: dict[str, Any]) -> float | None:
    """A stock row's decode step: from SGLang's log when the run recorded it (``log_step_ms``), else the
    wall difference; None for a failed measurement (<= 0 ms: runs before the warm-up pass existed)."""
    step = row.get("log_step_ms") or row.get("step_ms")
    return step if step is not None and step > 0 else None


def is_stock(name: str) -> bool:
    """A stock SGLang config of a run (``stock`` on Triton attention, ``stock-<backend>`` on another)."""
    return name == "stock" or name.startswith("stock-")


def best_stock_steps(servers: dict[str, dict[str, Any]]) -> dict[tuple[int, int], tuple[float, str]]:
    """Per (L, B): the fastest stock backend's decode step and that config's name, over the run's stock configs."""
    best: dict[tuple[int, int], tuple[float, str]] = {}
    for name, rec in servers.items():
        for r in rec["rows"] if is_stock(name) else []:
            key, step = (r["context"], r["batch"]), stock_step_ms(r)
            if step is not None and (key not in best or step < best[key][0]):
                best[key] = (step, name)
    return best


def projections(servers: dict[str, dict[str, Any]], accept: float | None) -> list[dict[str, Any]]:
    """accept * best stock step / PILLAR round per (L, B) measured by both (the fastest stock backend of the
    run, ``best_stock_steps``), and the same with the mixed-phase round's best case (``mixed_round_bound``);
    projections, not measurements."""
    stock = best_stock_steps(servers)
    if accept is None or not stock:
        return []
    out = []
    for name, rec in servers.items():
        for r in rec["rows"] if not is_stock(name) else []:
            key = (r["context"], r["batch"])
            if "round_ms" in r and key in stock:
                step, stock_name = stock[key]
                mixed = mixed_round_bound(r, step)
                out.append(
                    {
                        "config": name,
                        "context": key[0],
                        "batch": key[1],
                        "stock_config": stock_name,
                        "accept_assumed": accept,
                        "projected_speedup": accept * step / r["round_ms"],
                        "mixed_round_ms": mixed,
                        "projected_speedup_mixed": accept * step / mixed,
                    }
                )
    return out


def mixed_round_bound(row: dict[str, Any], stock_step_ms: float) -> float:
    """The mixed-phase round's best case at a PILLAR row's (L, B) (docs/design.md, mixed-phase batching).
    Spread over the k + 1 forwards, the verify rows share the draft forwards' weight read and launches and
    keep their KV read, which a stock decode step at the same (L, B) also pays. So at most what the verify
    costs above that step (its k + 1 rows' matrix work, its own pass) goes: the round less
    max(0, verify - stock step). The accept and select phases and every draft step stay."""
    return row["round_ms"] - max(0.0, row["verify_ms"] - stock_step_ms)


def capture_overhead(servers: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (L, B): score capture = verify of a score-using PILLAR config - verify of its streaming twin
    (which captures no scores and writes no LSE), with the config's own selection next to it."""
    out = []
    for name, rec in servers.items():
        twin = streaming_twin(rec, servers)
        if twin is None:
            continue
        theirs = {(r["context"], r["batch"]): r for r in servers[twin]["rows"] if "verify_ms" in r}
        for r in rec["rows"]:
            t = theirs.get((r["context"], r["batch"]))
            if t is None or "verify_ms" not in r:
                continue
            capture, select = r["verify_ms"] - t["verify_ms"], r["select_ms"]
            out.append(
                {
                    "config": name,
                    "twin": twin,
                    "context": r["context"],
                    "batch": r["batch"],
                    "capture_ms": capture,
                    "select_ms": select,
                    "capture_select_frac_of_verify": (capture + select) / (r["verify_ms"] + select),
                }
            )
    return out


def streaming_twin(rec: dict[str, Any], servers: dict[str, dict[str, Any]]) -> str | None:
    """The server that differs from ``rec`` only by SPARSESPEC_POLICY=streaming, if ``rec`` uses verify scores.
    SELECT_EVERY is ignored in the match: the streaming policy never selects from scores, so one streaming
    server is the twin of every selection cadence."""
    policy = recorded_policy(rec)
    if policy is None or not policy.uses_verify_scores:
        return None
    ignored = {f"{ENV_PREFIX}POLICY", f"{ENV_PREFIX}SELECT_EVERY"}
    rest = {k: v for k, v in rec["env"].items() if k not in ignored}
    for name, other in servers.items():
        if (
            other["flags"] == rec["flags"]
            and recorded_policy(other) is SelectionPolicy.STREAMING
            and {k: v for k, v in other["env"].items() if k not in ignored} == rest
        ):
            return name
    return None


def recorded_policy(rec: dict[str, Any]) -> SelectionPolicy | None:
    """The draft policy a server record resolved (its ``pillar_config``); None for other servers."""
    pc = rec.get("pillar_config")
    return None if pc is None else SelectionPolicy(pc["policy"])


# Peak HBM bandwidth by device name (TB/s, vendor figures), for the ideal phase times.
HBM_TBPS = {"H100": 3.35, "H200": 4.8}


def model_shape(config: dict[str, Any]) -> dict[str, int]:
    """What the ideal needs of a HF config.json: layers, KV heads, head dim, vocabulary, and the bf16 bytes
    of the weights one decode forward reads (``forward_weight_bytes``)."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return {
        "layers": config["num_hidden_layers"],
        "kv_heads": config.get("num_key_value_heads") or config["num_attention_heads"],
        "head_dim": head_dim,
        "vocab": config["vocab_size"],
        "weight_bytes": forward_weight_bytes(config),
    }


def forward_weight_bytes(config: dict[str, Any]) -> int:
    """bf16 bytes of the matrices a dense decoder's forward reads once: per layer q/k/v, o and the gated MLP,
    then the LM head (the embedding lookup reads B rows only; norms are negligible)."""
    hidden, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    head_dim = config.get("head_dim") or hidden // config["num_attention_heads"]
    q, kv = config["num_attention_heads"] * head_dim, (config.get("num_key_value_heads") or 0) * head_dim
    kv = kv or q
    per_layer = hidden * (q + 2 * kv) + q * hidden + 3 * hidden * inter
    return 2 * (layers * per_layer + config["vocab_size"] * hidden)


def _weight_bytes(doc: dict[str, Any]) -> int | None:
    """A run's forward weight bytes: recorded, or (runs before they were) from the named Qwen3 shape."""
    model, shape = doc["settings"].get("model") or {}, doc["settings"].get("shape")
    if "weight_bytes" in model:
        return model["weight_bytes"]
    return forward_weight_bytes(SHAPES[shape]) if shape in SHAPES else None


def ideal_breakdown(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each PILLAR phase (and stock's step) against its physical cost: the bytes it must move / peak HBM
    bandwidth, plus the fixed cost of a forward for the forward phases. Fixed = one read of the forward's
    weights (``forward_weight_bytes``); where the shape is unknown, the fastest stock backend's decode step at
    the smallest measured context of the same batch minus that step's own KV bytes. Per round at context
    c = L + M2 / 2 (the mean during the timed pass), bf16 KV: draft = k x (fixed + B x (budget(c) + k) KV
    tokens); verify = fixed + B x c KV tokens (+ the K half once per select_every rounds for
    score capture); accept = one fp32 read of the (k + 1) x B verify logit rows; select = one fp16 read of
    the scores once per select_every rounds; gap = 0. Empty without the model shape or a known device."""
    model, meta = doc["settings"].get("model"), doc["meta"]
    bw = next((tbps * 1e12 for name, tbps in HBM_TBPS.items() if name in str(meta.get("device"))), None)
    best = best_stock_steps(doc["servers"])
    stock = {point: step for point, (step, _) in best.items()}
    if model is None or bw is None or not stock:
        return []
    weights = _weight_bytes(doc)
    kv_tok = 2 * model["layers"] * model["kv_heads"] * model["head_dim"] * 2
    half = doc["settings"]["decode_tokens"][1] / 2

    def kv_ms(batch: int, tokens: float) -> float:
        return 1e3 * batch * tokens * kv_tok / bw

    out = []
    for (length, batch), step in sorted(stock.items()):
        low = min(c for c, b in stock if b == batch)
        fixed = 1e3 * weights / bw if weights else stock[(low, batch)] - kv_ms(batch, low + half)
        row = {
            "config": best[(length, batch)][1],
            "context": length,
            "batch": batch,
            "fixed_ms": fixed,
            "phases": {"step": (step, fixed + kv_ms(batch, length + half))},
        }
        out.append(row)
        for name, rec in doc["servers"].items():
            pc = rec.get("pillar_config")
            r = next(
                (r for r in rec["rows"] if (r["context"], r["batch"]) == (length, batch) and "round_ms" in r), None
            )
            if pc is None or r is None:
                continue
            k, every, c = pc["num_steps"], pc["select_every"], length + half
            # The budget's own knobs only: a record also holds the knobs of its day, retired ones included.
            budget = PillarConfig(budget_ratio=pc["budget_ratio"], min_budget=pc["min_budget"]).budget(int(c))
            # The recent window lies inside the budget; on the dummy weights these runs use, drafts are rarely
            # accepted, so the tail barely grows between selections.
            draft_tokens = budget + k
            ideal = {
                "draft": k * (fixed + kv_ms(batch, draft_tokens)),
                "verify": fixed + kv_ms(batch, c) * (1 + 0.5 / every),
                "accept": 1e3 * (k + 1) * batch * model["vocab"] * 4 / bw,
                "select": 1e3 * model["layers"] * model["kv_heads"] * batch * c * 2 / bw / every,
                "gap": 0.0,
            }
            phases = {p: (r[f"{p}_ms"], ideal[p]) for p in (*PHASES, GAP)}
            phases["round"] = (r["round_ms"] + r[f"{GAP}_ms"], sum(ideal.values()))
            out.append({"config": name, "context": length, "batch": batch, "fixed_ms": fixed, "phases": phases})
    return out
