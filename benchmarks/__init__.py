"""The serving benchmark harness and its report: SGLang server lifecycle, prompt workloads, throughput,
step-time and acceptance runs, and the results pages (``report``). Its pass/fail end-to-end checks are in
``benchmarks.checks``; probes that start no server are in ``tools``.

Run the entry points from the repository root (``python -m benchmarks.sweep``, ``python -m
benchmarks.throughput``, ``python -m benchmarks.report``); see ``benchmarks/README.md``.
"""

from __future__ import annotations
