"""One bench_serving run: its command line, its result file, and the server state recorded beside it
(PILLAR's live numbers, stock's decode step times from the server log)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.server import Server, decode_intervals, http_json, scheduler_state
from sglang_sparsespec.adaptive.policy import cell_key, cell_label

METRIC_KEYS = (
    "completed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "input_throughput",
    "output_throughput",
    "total_throughput",
    "mean_ttft_ms",
    "median_ttft_ms",
    "p99_ttft_ms",
    "mean_tpot_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "mean_itl_ms",
    "median_itl_ms",
    "p99_itl_ms",
    "mean_e2e_latency_ms",
    "median_e2e_latency_ms",
    "p99_e2e_latency_ms",
    "concurrency",
    "max_concurrent_requests",
    "max_output_tokens_per_s",
    "accept_length",
)


@dataclass(frozen=True)
class Workload:
    """What every request looks like. ``dataset_files`` maps num_prompts -> bench_serving custom-dataset JSONL."""

    output_len: int
    temperature: float
    top_p: float
    dataset_files: dict[int, Path]
    # Requests per second, Poisson arrivals (bench_serving); inf sends them all at once, so the
    # concurrency alone paces them (a closed loop: a finished request lets the next one start).
    request_rate: float = math.inf


def bench_argv(
    base_url: str, model: str, workload: Workload, concurrency: int, num_prompts: int, output_file: Path
) -> list[str]:
    """bench_serving's command-line arguments for one run (what follows ``python -m sglang.bench_serving``)."""
    return [
        "--backend",
        "sglang",
        "--base-url",
        base_url,
        "--model",
        model,
        "--tokenizer",
        model,
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(workload.dataset_files[num_prompts]),
        "--sharegpt-output-len",
        str(workload.output_len),
        "--num-prompts",
        str(num_prompts),
        "--max-concurrency",
        str(concurrency),
        "--temperature",
        str(workload.temperature),
        "--top-p",
        str(workload.top_p),
        "--seed",
        "1",
        "--request-rate",
        str(workload.request_rate),
        "--output-file",
        str(output_file),
        "--disable-tqdm",
        "--output-details",
    ]


def read_bench_result(path: Path) -> dict[str, Any]:
    """The last result line bench_serving appended to ``path``, parsed once (with ``--output-details`` it
    also carries every request's ITLs: tens of MB at 256 x 7000); ValueError if there is none."""
    try:
        lines = [l for l in path.read_text(encoding="utf-8").splitlines() if l.strip()]
    except OSError as e:
        raise ValueError(f"no bench_serving result at {path}: {e}") from None
    if not lines:
        raise ValueError(f"bench_serving result file {path} is empty")
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise ValueError(f"bench_serving result in {path} is not JSON: {e}") from None
    if not isinstance(result, dict) or result.get("output_throughput") is None:
        raise ValueError(f"bench_serving result in {path} has no output_throughput")
    return result


def per_request(result: dict[str, Any]) -> dict[str, list[float]] | None:
    """Each request's time to first token and end-to-end latency (s, ms resolution) and output length, in
    bench_serving's request order, from the details ``--output-details`` adds to its result (None
    without them). Why: a fixed-size run's throughput ends with its slowest request, so the spread of the
    latencies, not their mean, says how much a drain costs."""
    if not {"ttfts", "itls", "output_lens"} <= result.keys():
        return None
    ttft = [float(t or 0.0) for t in result["ttfts"]]
    e2e = [t + sum(itl or ()) for t, itl in zip(ttft, result["itls"])]
    return {
        "ttft_s": [round(t, 3) for t in ttft],
        "e2e_s": [round(t, 3) for t in e2e],
        "output_len": [int(n or 0) for n in result["output_lens"]],
    }


def reset_spec_counters(server: Server) -> bool:
    """Zero the server's running accept-length average so each run reports its own.

    In 0.5.17 any accepted /set_internal_state call resets the counters that /server_info's
    avg_spec_accept_length is computed from; an empty update is accepted and changes nothing else.
    """
    try:
        reply = http_json(server.base_url + "/set_internal_state", {"server_args": {}}, timeout=30)
    except (OSError, ValueError):
        return False
    return bool(reply) and all(reply)


def pillar_state(server: Server) -> dict[str, Any] | None:
    """PILLAR's live numbers from /server_info (rounds by draft count, dense request rounds, the
    policy's cost cells, the metrics summary): cumulative since the server started, so a run's record
    holds everything up to its end. None for other servers or when the request fails."""
    try:
        info = http_json(server.base_url + "/server_info", timeout=30)
    except (OSError, ValueError):
        return None
    return scheduler_state(info).get("pillar")


def decode_step_cells(log_text: str) -> dict[str, dict[str, float]]:
    """``decode_intervals`` in the cells of PILLAR's adaptive policy ("<batch bucket>x<context ~tokens>", as
    /server_info shows them), so a plain PILLAR round is read against stock's step at the same batch and
    context: the median ms per step per cell."""
    steps: dict[str, list[float]] = {}
    for running, tokens, ms in decode_intervals(log_text):
        steps.setdefault(cell_label(cell_key(running, tokens / running)), []).append(ms)
    return {cell: {"ms": round(statistics.median(v), 3), "lines": len(v)} for cell, v in sorted(steps.items())}


def server_info(server: Server) -> dict[str, Any] | None:
    try:
        info = http_json(server.base_url + "/server_info", timeout=30)
    except (OSError, ValueError):
        return None
    info.pop("internal_states", None)  # per-step state, not configuration
    return info
