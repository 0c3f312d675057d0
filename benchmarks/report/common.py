"""What every report section shares: loading result files, table cells, ratios, workload keys."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


REPO_ROOT = Path(__file__).resolve().parents[2]


DEFAULT_RESULTS = REPO_ROOT / "benchmarks" / "results"


CONFIG_ORDER = ("stock", "stock-flashinfer", "ngram", "pillar")


REPORTED_KINDS = (
    "throughput",
    "lossless",
    "acceptance",
    "kernels",
    "policy_sim",
    "draft_fidelity",
    "step_times",
    "exactness",
    "offload",
    "mixed_gemm",
)


def result_kind(doc: Any) -> str | None:
    """The result kind of a JSON document; kernels_bench files before it wrote ``kind`` have its sections."""
    if not isinstance(doc, dict):
        return None
    if "kind" not in doc and {"sparse_decode", "score_capture", "selection"} <= doc.keys():
        return "kernels"
    return doc.get("kind")


# Second runs of commands whose first run is among the results, read apart for the run-to-run spread.
REPEATS_DIR = "repeats"


def result_files(results_dir: Path) -> list[Path]:
    """The JSON files of ``results_dir`` and of its folders one level down (the checked-in results keep one
    folder per kind), by file name; ``REPEATS_DIR`` apart, and nothing deeper (kept probes)."""
    root = Path(results_dir)
    found = [*root.glob("*.json"), *(p for p in root.glob("*/*.json") if p.parent.name != REPEATS_DIR)]
    return sorted(found, key=lambda p: (p.name, str(p)))


def load_results(results_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Result documents (the ``REPORTED_KINDS``) among ``result_files(results_dir)``, plus notes about skipped
    files."""
    docs, notes = [], []
    for path in result_files(results_dir):
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            notes.append(f"skipped {path.name}: {e}")
            continue
        kind = result_kind(doc)
        if kind in REPORTED_KINDS:
            doc["kind"] = kind
            doc["_file"], doc["_path"] = path.name, str(path)
            docs.append(doc)
        else:
            notes.append(f"skipped {path.name}: not a benchmark result")
    return docs, notes


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _config_rank(name: str) -> tuple[int, str]:
    base = name.split("-k")[0]
    return (CONFIG_ORDER.index(base) if base in CONFIG_ORDER else len(CONFIG_ORDER), name)


def workload_key(doc: dict[str, Any]) -> tuple[Any, ...]:
    w = doc.get("workload", {})
    return (
        w.get("kind"),
        w.get("output_len"),
        w.get("input_len"),
        w.get("temperature"),
        w.get("top_p"),
        w.get("request_rate", "inf"),
    )


def model_name(doc: dict[str, Any]) -> str | None:
    """The served model's folder name, from the launch command a run recorded (a resumed run keeps the
    command of the run that measured it)."""
    servers = [doc.get("server") or {}] + [(r.get("measured") or {}).get("server") or {} for r in doc.get("runs", [])]
    for server in servers:
        command = server.get("command") or []
        if "--model-path" in command:
            return Path(command[command.index("--model-path") + 1]).name
    return None


def sampled(workload: tuple[Any, ...]) -> bool:
    """A ``workload_key`` of sampled requests (temperature and top-p recorded) that all arrive at once."""
    _, _, _, temperature, top_p, rate = workload
    return bool(temperature) and top_p is not None and rate == "inf"


def _seconds(ms: Any) -> float | None:
    return ms / 1000 if isinstance(ms, (int, float)) else None


def describe_workload(key: tuple[Any, ...]) -> str:
    _, out_len, _, temp, top_p, rate = key
    nucleus = "" if top_p is None else f", top-p {top_p:g}"  # runs before --top-p existed did not record it
    arrivals = "" if rate == "inf" else f", Poisson arrivals at {rate:g} requests/s"
    return f"AIME24+AMC23 chat prompts, {out_len} output tokens (ignore_eos), temperature {temp}{nucleus}{arrivals}"


def commits_text(rows: Sequence[dict[str, Any]]) -> str:
    """``commit X``, or, where the configs of one run id ran at several commits (a sweep's chunks run over
    several commands), ``commits X (config, ...), Y (...)``: each config's rows say which code produced them."""
    by_commit: dict[str, list[str]] = {}
    for r in rows:
        names = by_commit.setdefault(r["commit"], [])
        if r["config"] not in names:
            names.append(r["config"])
    if len(by_commit) == 1:
        return f"commit {next(iter(by_commit))}"
    return "commits " + ", ".join(f"{c} ({', '.join(names)})" for c, names in by_commit.items())


def _gb(n: Any) -> str:
    return f"{n / 1e9:.2f} GB" if isinstance(n, (int, float)) else "-"


def _num(v: Any) -> float | None:
    return v if isinstance(v, (int, float)) else None


def _ratio(a: Any, b: Any) -> float | None:
    return a / b if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b else None


def _pct(v: Any) -> float | None:
    return 100 * v if isinstance(v, (int, float)) else None
