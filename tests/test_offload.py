"""Offload-aware KV pool: the ledger, the victim policy, the flag, and the scheduler logic on CPU.

The scheduler logic runs against small pools of real torch tensors; copies are deferred until
their fence completes, as on a side stream, so freeing a slot before its copy finished shows up
as corrupted KV.
"""

from __future__ import annotations

import pytest
import torch

from sglang_sparsespec.config import offload_host_gb
from sglang_sparsespec.offload import Candidate, OffloadLedger, Where, choose_victims


class Fence:
    def __init__(self, work=None):
        self.work, self.done = work, False

    def query(self):
        return self.done

    def synchronize(self):
        if not self.done:
            if self.work is not None:
                self.work()
            self.done = True

    complete = synchronize


class HostSlots:
    def __init__(self, size):
        self.size, self.free_slots = size, list(range(size))

    def alloc(self, n):
        if n > len(self.free_slots):
            return None
        out, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return torch.tensor(out)

    def free(self, idx):
        idx = idx.tolist()
        assert not set(idx) & set(self.free_slots), "host double free"
        self.free_slots += idx
        return len(idx)

    def available_size(self):
        return len(self.free_slots)


# -- ledger ---------------------------------------------------------------------------------------
def test_park_poll_restore_cycle_and_idempotent_restore():
    ledger = OffloadLedger(HostSlots(100))
    host = ledger.reserve_host(30)
    d2h = Fence()
    ledger.park("a", 10, 40, "dev-a", host, d2h)
    assert ledger.where("a") is Where.PARKING and ledger.host_free() == 70
    assert ledger.poll() == [] and ledger.begin_restore("a", Fence()) is False  # copy still in flight
    d2h.complete()
    assert ledger.poll() == [("a", "dev-a")] and ledger.where("a") is Where.PARKED
    assert ledger.poll() == []  # the device slots are handed back once
    h2d = Fence()
    assert ledger.begin_restore("a", h2d) is True and ledger.where("a") is Where.RESTORING
    assert ledger.begin_restore("a", Fence()) is False  # idempotent
    assert ledger.poll() == [] and ledger.host_free() == 70  # host slots held until H2D completed
    h2d.complete()
    ledger.poll()
    assert ledger.where("a") is None and ledger.host_free() == 100 and len(ledger) == 0
    assert ledger.begin_restore("a", Fence()) is False  # resident: nothing to do
    st = ledger.stats
    assert (st.parks, st.restores, st.tokens_to_host, st.tokens_to_device) == (1, 1, 30, 30)


def test_settle_blocks_and_returns_device_slots_once():
    ledger = OffloadLedger(HostSlots(10))
    ledger.park("a", 0, 4, "dev", ledger.reserve_host(4), Fence())
    assert ledger.settle("a") == "dev" and ledger.where("a") is Where.PARKED
    assert ledger.settle("a") is None


@pytest.mark.parametrize("state", ["parking", "parked", "restoring"])
def test_drop_in_every_state_waits_for_the_copy_and_frees_host(state):
    ledger = OffloadLedger(HostSlots(10))
    d2h = Fence()
    ledger.park("a", 2, 8, "dev", ledger.reserve_host(6), d2h)
    if state != "parking":
        ledger.settle("a")
    h2d = Fence()
    if state == "restoring":
        ledger.begin_restore("a", h2d)
    rec = ledger.drop("a")
    assert d2h.done and (state != "restoring" or h2d.done)
    assert rec.device == ("dev" if state == "parking" else None)  # the caller frees what is still held
    assert rec.where is (Where.RESTORING if state == "restoring" else Where.PARKED)
    assert ledger.where("a") is None and ledger.host_free() == 10 and ledger.drop("a") is None


def test_budget_and_bad_parks():
    ledger = OffloadLedger(HostSlots(10))
    assert ledger.reserve_host(11) is None
    host = ledger.reserve_host(10)
    ledger.park("a", 0, 10, "d", host, Fence())
    assert ledger.reserve_host(1) is None
    with pytest.raises(ValueError, match="already parking"):
        ledger.park("a", 0, 1, "d", host, Fence())
    with pytest.raises(ValueError, match="bad park range"):
        ledger.park("b", 5, 5, "d", host, Fence())
    with pytest.raises(ValueError, match="at least one token"):
        ledger.reserve_host(0)


def test_restore_order_is_oldest_park_first():
    ledger = OffloadLedger(HostSlots(10))
    for rid in "cab":
        ledger.park(rid, 0, 1, rid, ledger.reserve_host(1), Fence())
        ledger.settle(rid)
    assert [r.key for r in ledger.parked_in_order()] == ["c", "a", "b"]


# -- policy ---------------------------------------------------------------------------------------
def test_victims_furthest_from_finishing_then_latest_admitted():
    cands = [Candidate("near", 100, 10, 0), Candidate("far", 100, 900, 1), Candidate("far2", 100, 900, 2)]
    assert [v.key for v in choose_victims(cands, 150, 1000, 2)] == ["far2", "far"]
    assert [v.key for v in choose_victims(cands, 50, 1000, 2)] == ["far2"]
    assert choose_victims(cands, 0, 1000, 2) == []


def test_victims_respect_host_budget_and_keep_one_resident():
    cands = [Candidate("big", 500, 900, 0), Candidate("small", 50, 800, 1), Candidate("empty", 0, 999, 2)]
    assert [v.key for v in choose_victims(cands, 1000, 100, 3)] == ["small"]  # big does not fit the host
    assert [v.key for v in choose_victims(cands, 1000, 10_000, 1)] == ["big"]  # max_victims
    assert choose_victims(cands[:1], 1000, 10_000, 0) == []


# -- the flag -------------------------------------------------------------------------------------
def test_offload_flag_parsing():
    assert offload_host_gb({}) == 0.0 and offload_host_gb({"SPARSESPEC_OFFLOAD_HOST_GB": "2.5"}) == 2.5
    for bad in ("-1", "nan", "inf", "lots"):
        with pytest.raises(ValueError, match="OFFLOAD_HOST_GB") as err:
            offload_host_gb({"SPARSESPEC_OFFLOAD_HOST_GB": bad})
        assert "\n" not in str(err.value)


# -- tensor parallelism: the ledgers of two ranks over a real gloo group ---------------------------
def _rank_polls(rank: int, port: int, out) -> None:
    import torch.distributed as dist

    from sglang_sparsespec.offload.agree import min_all_reduce

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        ledger = OffloadLedger(HostSlots(10), agree=lambda counts: min_all_reduce(counts, dist.group.WORLD))
        for rid in "ab":
            ledger.park(rid, 0, 2, rid, ledger.reserve_host(2), Fence())
            ledger.settle(rid)
            ledger.begin_restore(rid, Fence())
        # Rank 0's copies of both restores completed; rank 1's only of the first.
        ledger.record("a").fence.done = True
        ledger.record("b").fence.done = rank == 0
        ledger.poll()
        out.put((rank, ledger.where("a"), ledger.where("b"), ledger.host_free()))
    finally:
        dist.destroy_process_group()


def test_ranks_retire_restores_only_when_every_ranks_copy_completed():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_polls, args=(r, port, out)) for r in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    got = sorted(out.get(timeout=5) for _ in procs)
    assert [g[1:] for g in got] == [(None, Where.RESTORING, 8)] * 2


def test_benchmark_judges_the_pool_at_idle():
    from benchmarks.checks.offload import leak_free

    clean = {"alive": True, "leak_logged": False, "parked_now": 0, "host_tokens_free": 64, "host_tokens": 64}
    assert leak_free(clean) and leak_free({"alive": True, "leak_logged": False})  # no offloader: SGLang's check only
    for bad in ({"alive": False}, {"leak_logged": True}, {"parked_now": 1}, {"host_tokens_free": 60}):
        assert not leak_free({**clean, **bad}), bad
