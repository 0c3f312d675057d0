"""GPU benchmark harness: SGLang server lifecycle, prompt workloads, losslessness and throughput runs.

Run the entry points from the repository root (``python -m benchmarks.lossless``, ``python -m
benchmarks.throughput``, ``python -m benchmarks.report``); see ``benchmarks/README.md``.
"""

from __future__ import annotations
