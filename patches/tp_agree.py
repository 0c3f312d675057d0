"""One round shape for every tensor-parallel rank.

Under ``--tp-size N`` every rank runs the same PILLAR round on its own attention heads, and the
model's all-reduces pair the ranks' forwards one to one. The adaptive policy picks the round's
draft count and its dense-drafting requests from round costs each rank measures on its own GPU
(``adaptive/policy.py``), so two ranks could pick different counts: they would then run different
numbers of forwards and the next all-reduce would hang. Rank 0's choice is broadcast over SGLang's
CPU group of the TP ranks instead, once per round (not per draft step) and only with N > 1, as
SGLang's scheduler broadcasts each iteration's requests from rank 0 over the same group.
``agree`` hands every rank exactly what rank 0 chose, ``None`` or a list, so the worker can tell
a round that ran as chosen from one that did not on every rank alike.

``min_over_tp_group`` serves the offload ledger: the element-wise minimum of per-rank counts of
completed copies over the same CPU group, so every rank advances its copies equally far (SGLang's
HiCache all-reduces its completion counts with MIN for the same reason).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from sglang_sparsespec.offload.agree import min_all_reduce


def encode_round(steps: int, dense: list[bool] | None, bs: int) -> torch.Tensor:
    """[2 + bs] int32: the draft count, 1 when a dense list is given, then 1 per dense-drafting request."""
    msg = torch.zeros(2 + bs, dtype=torch.int32)
    msg[0] = steps
    if dense is not None:
        msg[1] = 1
        msg[2:] = torch.tensor(dense, dtype=torch.int32)
    return msg


def decode_round(msg: torch.Tensor) -> tuple[int, list[bool] | None]:
    """The (steps, dense) that ``encode_round`` encoded, ``None`` and all-False lists kept apart."""
    dense = [bool(x) for x in msg[2:].tolist()] if int(msg[1]) else None
    return int(msg[0]), dense


def min_over_tp_group() -> Callable[[list[int]], list[int]] | None:
    """Element-wise MIN of int lists over the TP ranks' CPU group; None with one rank."""
    from sglang.srt.distributed import get_tp_group

    group = get_tp_group()
    if group.world_size == 1:
        return None
    return lambda counts: min_all_reduce(counts, group.cpu_group)


class RoundAgreement:
    """``agree`` returns rank 0's (steps, dense) on every rank; ``broadcast(t)`` sends rank 0's ``t``
    into every rank's ``t`` in place (a CPU group's broadcast; a stand-in in tests)."""

    def __init__(self, broadcast: Callable[[torch.Tensor], None] | None, rank: int = 0):
        self.broadcast = broadcast
        self.rank = rank  # this rank's index in the TP group

    @classmethod
    def for_tp_group(cls) -> RoundAgreement:
        from sglang.srt.distributed import get_tp_group

        group = get_tp_group()
        if group.world_size == 1:
            return cls(None)
        src = group.ranks[0]  # global rank of the group's rank 0
        return cls(lambda t: torch.distributed.broadcast(t, src=src, group=group.cpu_group), group.rank_in_group)

    def agree(self, steps: int, dense: list[bool] | None, bs: int) -> tuple[int, list[bool] | None]:
        if self.broadcast is None:
            return steps, dense
        msg = encode_round(steps, dense, bs)
        self.broadcast(msg)
        return decode_round(msg)
