"""The element-wise minimum of per-rank counts over a process group: how far every TP rank got.

The offload ledger advances its copies only as far as every rank's did (``OffloadLedger.poll``),
so each rank makes its scheduling decisions from the same state. The group is SGLang's CPU group of
the TP ranks in production (``patches/tp_agree.min_over_tp_group``), a gloo group in tests.
"""

from __future__ import annotations

import torch


def min_all_reduce(counts: list[int], cpu_group) -> list[int]:
    t = torch.tensor(counts, dtype=torch.int64)
    torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MIN, group=cpu_group)
    return [int(x) for x in t.tolist()]
