"""Pass/fail end-to-end checks on a GPU, each against real SGLang servers that the harness starts: greedy
token identity with stock (``lossless``), sampled exactness (``exactness``), the per-request sampling
parameters (``request_params``), load with aborts and bad input (``reliability``), the OpenAI endpoints
(``api_smoke``) and the offload-aware KV pool under oversubscription (``offload``).

Each is ``python -m benchmarks.checks.<name>`` from the repository root, exit code 0 on a pass; see
``benchmarks/README.md``.
"""

from __future__ import annotations
