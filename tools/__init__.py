"""Research probes that start no server: kernel microbenchmarks (``kernels_bench``, ``sampling_bench``,
``mixed_gemm``, ``kernels_probe`` for Nsight Compute) and CPU references of the speculation policy
(``policy_sim``, ``policy_host``).

Each is ``python -m tools.<name>`` from the repository root; see ``tools/README.md``.
"""

from __future__ import annotations
