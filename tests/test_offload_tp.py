"""patches/offload.py across TP ranks on CPU: two ranks (threads) whose restore copies complete at different
times decide from the same ledger once their counts are agreed over a MIN all-reduce (the CPU group's)."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("sglang")

from test_offload_sched import Batch, finish, full_pool, make_world, process_prefill_result  # noqa: E402
from test_offload_sched import published_server_args  # noqa: E402, F401  (autouse: Req reads the server args)

from sglang_sparsespec.offload import Where  # noqa: E402
from sglang_sparsespec.patches import offload_capacity  # noqa: E402
from test_offload_patch import SERVED  # noqa: E402

pytestmark = SERVED  # SGLang's scheduler pieces as the releases the pool serves have them


class MinGroup:
    """A MIN all-reduce between threads standing for TP ranks (the CPU group's all_reduce)."""

    def __init__(self, ranks: int):
        self.barrier, self.vals = threading.Barrier(ranks, timeout=30), {}

    def member(self, rank: int):
        def agree(counts: list[int]) -> list[int]:
            self.vals[rank] = counts
            self.barrier.wait()
            out = [min(v[i] for v in self.vals.values()) for i in range(len(counts))]
            self.barrier.wait()
            return out

        return agree


def _on_ranks(fns):
    out, errors = [None] * len(fns), []

    def run(i):
        try:
            out[i] = fns[i]()
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(fns))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return out


def _ranks_with_a_late_restore_copy(group: MinGroup | None):
    """Two ranks that parked and then restored 'old'; rank 0's copy has completed, rank 1's has not."""
    worlds = [make_world(None if group is None else group.member(r)) for r in range(2)]
    for w in worlds:
        w.old, new = full_pool(w)
        process_prefill_result(w, new)
        w.off.park_if_needed(Batch([w.old, new], w.pool, w.allocator))  # 'old' parked on both ranks
        finish(w, new)
    running = [w.off.before_schedule(Batch([], w.pool, w.allocator)) for w in worlds]  # no copy pending: no collective
    assert [[r.rid for r in b.reqs] for b in running] == [["old"], ["old"]]
    assert all(w.off.ledger.where(id(w.old)) is Where.RESTORING for w in worlds)
    worlds[0].mover.fences[-1].complete()
    return worlds, running


def _decisions(w, batch):
    w.off.before_schedule(batch)
    return w.off.ledger.where(id(w.old)), w.off.ledger.host_free(), offload_capacity.admission_slack(w.off, 3)


def test_tp_ranks_decide_from_the_same_ledger_when_one_ranks_copy_is_late():
    """The restore retires on neither rank until its copy completed on both, so park candidates, free
    host slots and admission slack agree (each rank alone would read 64 against 45 free host slots)."""
    alone = [_decisions(w, b) for w, b in zip(*_ranks_with_a_late_restore_copy(None))]
    assert alone[0] != alone[1]  # the divergence the agreement removes
    worlds, running = _ranks_with_a_late_restore_copy(MinGroup(2))
    first = _on_ranks([lambda w=w, b=b: _decisions(w, b) for w, b in zip(worlds, running)])
    assert first[0] == first[1] == (Where.RESTORING, 45, 45 - 3)
    worlds[1].mover.fences[-1].complete()
    second = _on_ranks([lambda w=w, b=b: _decisions(w, b) for w, b in zip(worlds, running)])
    assert second[0] == second[1] == (None, 64, 64 - 3)
