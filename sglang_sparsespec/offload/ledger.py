"""Where each request's private KV lives while the GPU pool is oversubscribed.

A request that is *resident* is not in the ledger. Parking moves the KV of positions
``[start, end)`` of one request to host slots; ``[0, start)`` is a prefix owned by the prefix
cache (locked by the request, shared, never moved). Each copy is fenced by the event recorded
after it on the copy stream, and nothing is freed before its fence has completed:

    resident --park()--> PARKING --poll()/settle()--> PARKED --begin_restore()--> RESTORING
        ^                   (D2H in flight;            (device slots     (H2D in flight; the
        |                    device slots held)         freed by caller)  request runs again)
        +------------------------------ poll(): H2D fence done, host slots freed -----------+

``drop()`` (finish or abort in any state) waits for the pending fence and hands back what the
caller must free. The ledger is SGLang-free: requests (``key``: any hashable; in production the request
object's ``id``, never its client-chosen rid, which two live requests can share), slots and
fences are opaque objects, host slots come from a ``HostSlots`` allocator whose capacity is the host
budget.

Tensor-parallel ranks each copy their own heads, so one rank's copy can complete before another's.
Every scheduling decision that reads the ledger (park candidates, free host slots, admission slack)
must be identical on every rank, or the ranks plan different batches and their collectives no longer
pair. ``poll`` therefore advances copies only as far as every rank has: it counts the completed
copies at the head of each queue (oldest first) and lets ``agree`` (a MIN all-reduce over the
ranks' CPU group, as SGLang's HiCache does for its completion counts) cut those counts to what every
rank reached. Every other transition happens at a decision point all ranks share (a park, a restore,
a settle or a drop waits for its fence), so the ledger's state is the same on every rank.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol


class Fence(Protocol):
    """A recorded copy event (``torch.cuda.Event`` in production)."""

    def query(self) -> bool: ...

    def synchronize(self) -> None: ...


class HostSlots(Protocol):
    """Host KV slot allocator (SGLang's ``HostKVCache`` in production); its size is the budget."""

    def alloc(self, need_size: int) -> Any | None: ...

    def free(self, indices: Any) -> int: ...

    def available_size(self) -> int: ...


class Where(str, Enum):
    PARKING = "parking"  # device -> host copy in flight; device slots still owned
    PARKED = "parked"  # on host only; device slots freed
    RESTORING = "restoring"  # host -> device copy in flight; request back in the running batch


@dataclass
class Parked:
    """One request's moved KV. Invariant: ``len(host) == len(device or host) == end - start``."""

    key: Hashable  # the request
    start: int  # first private position
    end: int  # one past the last moved position (the request's allocated length)
    host: Any  # host slot indices
    device: Any | None  # device slots held until the D2H fence completed (None after)
    fence: Fence
    where: Where
    order: int  # park sequence number: restores go oldest first

    @property
    def tokens(self) -> int:
        return self.end - self.start


@dataclass
class OffloadStats:
    parks: int = 0
    restores: int = 0
    drops: int = 0
    tokens_to_host: int = 0
    tokens_to_device: int = 0


# Completed-copy counts -> the element-wise minimum over the TP ranks (identity with one rank).
Agree = Callable[[list[int]], list[int]]


class OffloadLedger:
    def __init__(self, host: HostSlots, agree: Agree | None = None) -> None:
        self.host = host
        self.agree = agree
        self.stats = OffloadStats()
        self._records: dict[Hashable, Parked] = {}
        self._seq = 0

    def where(self, key: Hashable) -> Where | None:
        """``None`` for a resident (or unknown) request."""
        rec = self._records.get(key)
        return None if rec is None else rec.where

    def record(self, key: Hashable) -> Parked:
        return self._records[key]

    def __len__(self) -> int:
        return len(self._records)

    def host_free(self) -> int:
        return self.host.available_size()

    def reserve_host(self, tokens: int) -> Any | None:
        """Host slots for a park of ``tokens`` tokens, or None when the budget cannot hold it."""
        if tokens <= 0:
            raise ValueError(f"a park moves at least one token, got {tokens}")
        if tokens > self.host.available_size():
            return None
        return self.host.alloc(tokens)

    def park(self, key: Hashable, start: int, end: int, device: Any, host: Any, fence: Fence) -> Parked:
        """Record a D2H copy of ``[start, end)`` from ``device`` to ``host`` (from ``reserve_host``)."""
        if key in self._records:
            raise ValueError(f"request {key} is already {self._records[key].where.value}")
        if not 0 <= start < end:
            raise ValueError(f"bad park range [{start}, {end}) for request {key}")
        rec = Parked(key, start, end, host, device, fence, Where.PARKING, self._seq)
        self._seq += 1
        self._records[key] = rec
        self.stats.parks += 1
        self.stats.tokens_to_host += rec.tokens
        return rec

    def settle(self, key: Hashable) -> Any | None:
        """Block until ``key``'s D2H copy completed; returns the device slots to free (once)."""
        rec = self._records[key]
        if rec.where is not Where.PARKING:
            return None
        rec.fence.synchronize()
        return self._parked(rec)

    def poll(self) -> list[tuple[Hashable, Any]]:
        """Advance every copy that completed on every rank, without blocking.

        Returns ``(key, device_slots)`` for each finished D2H copy: the caller frees those slots.
        Finished H2D copies free their host slots here and leave the ledger (resident again).
        Copies advance oldest first, each queue as far as its completed head reaches on every rank.
        """
        queues = [self._in_order(Where.PARKING), self._in_order(Where.RESTORING)]
        if not any(queues):  # the same on every rank: no collective is needed (nor entered by any)
            return []
        done = [self._done_head(q) for q in queues]
        if self.agree is not None:
            done = self.agree(done)
        parking, restoring = (q[:n] for q, n in zip(queues, done))
        for rec in restoring:
            rec.fence.synchronize()  # done here; on another rank too (the agreed count)
            self._resident(rec)
        freed = []
        for rec in parking:
            rec.fence.synchronize()
            freed.append((rec.key, self._parked(rec)))
        return freed

    def _in_order(self, where: Where) -> list[Parked]:
        return sorted((r for r in self._records.values() if r.where is where), key=lambda r: r.order)

    @staticmethod
    def _done_head(queue: list[Parked]) -> int:
        n = 0
        while n < len(queue) and queue[n].fence.query():
            n += 1
        return n

    def parked_in_order(self) -> list[Parked]:
        """PARKED requests, oldest park first (the restore order)."""
        return self._in_order(Where.PARKED)

    def begin_restore(self, key: Hashable, fence: Fence) -> bool:
        """Record the H2D copy back into fresh device slots; False (no-op) unless ``key`` is PARKED.

        Idempotent: restoring a request that is resident, restoring or still parking does nothing.
        """
        rec = self._records.get(key)
        if rec is None or rec.where is not Where.PARKED:
            return False
        rec.where, rec.fence = Where.RESTORING, fence
        self.stats.restores += 1
        self.stats.tokens_to_device += rec.tokens
        return True

    def drop(self, key: Hashable) -> Parked | None:
        """Forget ``key`` (finished or aborted) once its pending copy completed; frees its host slots.

        Returns the record (its ``device`` is the slots the caller still owns and must free, None
        if they were freed already) or None for a resident request.
        """
        rec = self._records.pop(key, None)
        if rec is None:
            return None
        rec.fence.synchronize()
        if rec.where is Where.PARKING:
            rec.where = Where.PARKED  # the copy is done; the caller frees rec.device
        self.host.free(rec.host)
        self.stats.drops += 1
        return rec

    def _parked(self, rec: Parked) -> Any:
        device, rec.device, rec.where = rec.device, None, Where.PARKED
        return device

    def _resident(self, rec: Parked) -> None:
        del self._records[rec.key]
        self.host.free(rec.host)
