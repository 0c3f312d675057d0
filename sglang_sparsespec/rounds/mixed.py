"""Mixed-phase iterations: drafting and verifying requests in one forward (the paper's unified
batching).

A request's round is k sparse draft steps and one full-attention verify of k + 1 tokens. Run as
today (``Rounds.decode``), a batch drafts together for k forwards and then verifies
together in a forward of (k + 1) x B rows, which reads the weights once more and does the verify's
matrix work on its own. Here the B requests are spread over k + 1 phase groups, and an iteration is
k + 1 forwards F_0..F_k: at F_j group j verifies (a segment of k + 1 rows per request, full
attention) while every other request drafts one token (one row, sparse attention). Every request
still verifies exactly once per iteration, so SGLang gets one result per request as it expects.

Group g's k drafts span two iterations: k - g after its verify (F_{g+1}..F_k) and g before its next
one (F_0..F_{g-1}). So a request's chain (its pending root token, the drafts so far and their
proposal records) is carried across iterations (``ChainStore``, by pool row). A request whose chain
was not carried (new, or after a round of another shape) starts with no drafts; its first verify
checks fewer drafts (``pending``), the undrafted columns are never accepted.

Positions of request r (committed length L: tokens with KV; the root token is at L):
- a draft row with p drafts pending feeds token ``tokens[r, p]`` at position L + p and writes its KV
  there (a draft's KV, replaced by the verify's);
- its verify segment feeds ``tokens[r, 0..k]`` at positions L..L + k and attends the committed
  prefix plus its own rows causally; then L grows by the accepted drafts + 1 and the drawn token
  becomes the next root.
A chain reaches L + k within an iteration, L + 2k + 1 from the committed length the iteration started
with, which is up to k + 1 ahead of what SGLang's host knows under the overlap scheduler; the KV
reserve is raised to 3(k + 1) for it (``patches/alloc_reserve.py``).

Everything below is shape-static torch with no host synchronisation (it runs inside CUDA graphs);
the host part is only ``PhaseGroups`` (which group each request is in) and the segment table.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

# A draft step's proposal for each draft row: cand_ids [bs, C], cand_q [bs, C], q_tok [bs].
Record = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def segments_per_forward(batch: int, k: int) -> int:
    """Verify segments one forward carries for a batch of ``batch`` rows: ceil(batch / (k + 1))."""
    return max(1, math.ceil(batch / (k + 1)))


class PhaseGroups:
    """Which forward of an iteration verifies each request (host side).

    Requests keep their group from one iteration to the next (a request that changes group still
    verifies once, with fewer or more pending drafts), new requests fill the smallest groups, and a
    group above ceil(n / (k + 1)) gives its newest members to the smallest ones. The result depends
    only on the request ids in batch order and the previous assignment, so every TP rank computes
    the same groups.
    """

    def __init__(self, k: int):
        self.k1 = k + 1
        self.group_of: dict[str, int] = {}

    def assign(self, rids: Sequence[str]) -> list[int]:
        """Groups (0..k) of the batch's requests, in batch order; each group holds at most
        ``segments_per_forward(len(rids), k)`` of them."""
        cap = segments_per_forward(len(rids), self.k1 - 1)
        groups = [self.group_of.get(rid, -1) for rid in rids]
        members: list[list[int]] = [[] for _ in range(self.k1)]
        for i, g in enumerate(groups):
            if g >= 0:
                members[g].append(i)
        for g in range(self.k1):  # the latest to join an over-full group leave it first
            while len(members[g]) > cap:
                groups[members[g].pop()] = -1
        for i, g in enumerate(groups):
            if g < 0:
                g = min(range(self.k1), key=lambda c: len(members[c]))
                groups[i] = g
                members[g].append(i)
        self.group_of = dict(zip(rids, groups))
        return groups

    def forget(self, rids: Sequence[str]) -> None:
        """Requests whose chain restarts (prefilled again, e.g. after a retraction)."""
        for rid in rids:
            self.group_of.pop(rid, None)


@dataclass
class IterationPlan:
    """The host's part of one iteration: groups [bs] (0..k), table [k + 1][segments] (the batch rows
    verifying at each forward, padded with the pad row), carried [bs] (the chain goes on)."""

    groups: list[int]
    table: list[list[int]]
    carried: list[bool]
    segments: int


class ChainTracker:
    """Across iterations, on the host: each request's phase group and whether its chain is carried.

    A chain is carried only from the mixed iteration right before (a decode round of another shape
    rewrites the KV past the committed length: ``invalidate``), of the same kind (greedy chains have
    no proposal records for a sampled verify, and back), and not across a prefill of the request
    (``forget``: a retracted request is prefilled again into a new pool row).
    """

    def __init__(self, k: int):
        self.k = k
        self.groups = PhaseGroups(k)
        self.carried: set[str] = set()
        self.last_sampled = False

    def plan(self, rids: Sequence[str], sampled: bool, padded: int, pad_row: int) -> IterationPlan:
        """The plan of an iteration that is about to run over ``rids`` padded to ``padded`` rows."""
        same_kind = sampled == self.last_sampled
        carried = [same_kind and rid in self.carried for rid in rids]
        groups = self.groups.assign(rids)
        segments = segments_per_forward(padded, self.k)
        table = segment_table(groups, self.k, segments, pad_row)
        self.carried, self.last_sampled = set(rids), sampled
        return IterationPlan(groups, table, carried, segments)

    def invalidate(self) -> None:
        self.carried = set()

    def forget(self, rids: Sequence[str]) -> None:
        self.carried.difference_update(rids)
        self.groups.forget(rids)


def segment_table(groups: Sequence[int], k: int, segments: int, pad_row: int) -> list[list[int]]:
    """[k + 1][segments]: the batch rows verifying at each forward, then ``pad_row``."""
    table = [[] for _ in range(k + 1)]
    for row, g in enumerate(groups):
        table[g].append(row)
    for rows in table:
        if len(rows) > segments:
            raise ValueError(f"a phase group of {len(rows)} requests exceeds {segments} segments per forward")
        rows.extend([pad_row] * (segments - len(rows)))
    return table


@dataclass
class ChainBuffers:
    """One iteration's state in batch order: rows 0..n-2 serve batch rows (and graph padding), row
    n - 1 (``pad_row``) is what padded verify segments point at. All on one device.

    rpi [n] int64: pool row (0 = SGLang's padding row); length [n] int64: committed length L;
    pending [n] int64: drafts in the chain, 0..k; group [n] int64: the forward that verifies the row
    (-1: never, padding); tokens [n, k + 1] int64: the root token, then drafts 1..k;
    cand_ids [n, k, C] int64, cand_q [n, k, C] fp32, q_tok [n, k] fp32: each draft's proposal record
    (``DraftRecord``; unused by greedy batches); emitted [n, k + 1] int64 and accept_len [n] int64:
    what the row's verify this iteration emitted; seg [k + 1, S] int64: batch rows verifying at each
    forward (``segment_table``); step [1] int64: the index of the next forward.
    Per forward, for selection: seg_before, seg_after [k + 1, S] int64 (the prefix the verify attended,
    the committed length after it).
    """

    rpi: torch.Tensor
    length: torch.Tensor
    pending: torch.Tensor
    group: torch.Tensor
    tokens: torch.Tensor
    cand_ids: torch.Tensor
    cand_q: torch.Tensor
    q_tok: torch.Tensor
    emitted: torch.Tensor
    accept_len: torch.Tensor
    seg: torch.Tensor
    step: torch.Tensor
    seg_before: torch.Tensor
    seg_after: torch.Tensor
    cols: torch.Tensor  # arange(k + 1)
    row_ids: torch.Tensor  # arange(n)

    @classmethod
    def allocate(cls, max_bs: int, k: int, num_cand: int, device: torch.device | str) -> ChainBuffers:
        n, k1, s = max_bs + 1, k + 1, segments_per_forward(max_bs, k)
        with torch.device(device):
            return cls(
                rpi=torch.zeros(n, dtype=torch.int64),
                length=torch.ones(n, dtype=torch.int64),
                pending=torch.full((n,), k, dtype=torch.int64),
                group=torch.full((n,), -1, dtype=torch.int64),
                tokens=torch.zeros((n, k1), dtype=torch.int64),
                cand_ids=torch.zeros((n, k, num_cand), dtype=torch.int64),
                cand_q=torch.zeros((n, k, num_cand), dtype=torch.float32),
                q_tok=torch.ones((n, k), dtype=torch.float32),
                emitted=torch.zeros((n, k1), dtype=torch.int64),
                accept_len=torch.ones(n, dtype=torch.int64),
                seg=torch.full((k1, s), max_bs, dtype=torch.int64),
                step=torch.zeros(1, dtype=torch.int64),
                seg_before=torch.ones((k1, s), dtype=torch.int64),
                seg_after=torch.ones((k1, s), dtype=torch.int64),
                cols=torch.arange(k1),
                row_ids=torch.arange(n),
            )

    @property
    def k(self) -> int:
        return self.tokens.shape[1] - 1

    @property
    def pad_row(self) -> int:
        return self.rpi.shape[0] - 1

    def pad(self, start: int, end: int) -> None:
        """Rows that never draft nor verify (graph padding; the segment pad row): SGLang's padding
        request row 0 at length 1."""
        for rows in (slice(start, end), slice(self.pad_row, self.pad_row + 1)):
            self.rpi[rows] = 0
            self.length[rows] = 1
            self.pending[rows] = self.k
            self.group[rows] = -1
            self.tokens[rows] = 0


@dataclass
class RowInputs:
    """One mixed forward's rows: ``bs`` draft rows, then S segments of k + 1 verify rows.

    tokens, positions, rpi: [bs + S (k + 1)] int64; active [bs] bool: the draft rows that draft
    (the others, verifying or with k drafts pending, feed SGLang's padding row 0 at position 0);
    seg [S] int64: the batch row of each segment; seg_len [S] int64: its committed prefix length.
    """

    tokens: torch.Tensor
    positions: torch.Tensor
    rpi: torch.Tensor
    active: torch.Tensor
    seg: torch.Tensor
    seg_len: torch.Tensor


def row_inputs(buf: ChainBuffers, bs: int, segments: int) -> RowInputs:
    """The rows of forward ``buf.step`` for the first ``bs`` batch rows and ``segments`` segments."""
    k = buf.k
    seg = buf.seg[:, :segments].index_select(0, buf.step).view(-1)
    pending = buf.pending[:bs]
    active = (buf.group[:bs] != buf.step) & (pending < k)
    last = buf.tokens[:bs].gather(1, pending.clamp(max=k).view(bs, 1)).view(bs)
    zero = torch.zeros_like(pending)
    d_tokens = torch.where(active, last, zero)
    d_positions = torch.where(active, buf.length[:bs] + pending, zero)
    d_rpi = torch.where(active, buf.rpi[:bs], zero)
    seg_len = buf.length.index_select(0, seg)
    s_positions = seg_len.view(-1, 1) + buf.cols.view(1, -1)
    s_tokens = buf.tokens.index_select(0, seg)
    s_rpi = buf.rpi.index_select(0, seg).view(-1, 1).expand(-1, k + 1)
    return RowInputs(
        tokens=torch.cat([d_tokens, s_tokens.reshape(-1)]),
        positions=torch.cat([d_positions, s_positions.reshape(-1)]),
        rpi=torch.cat([d_rpi, s_rpi.reshape(-1)]),
        active=active,
        seg=seg,
        seg_len=seg_len,
    )


def commit_drafts(
    buf: ChainBuffers,
    active: torch.Tensor,
    drafted: torch.Tensor,
    record: Record | None,
) -> None:
    """Append each active row's draft (drafted [bs] int64) and, for sampled batches, its proposal
    (record = (cand_ids [bs, C], cand_q [bs, C], q_tok [bs])) to its chain."""
    bs, k = active.shape[0], buf.k
    col = buf.pending[:bs].clamp(max=k - 1)  # the draft's index; inactive rows rewrite what is there
    tokens = buf.tokens[:bs]
    keep = tokens.gather(1, (col + 1).view(bs, 1)).view(bs)
    tokens.scatter_(1, (col + 1).view(bs, 1), torch.where(active, drafted, keep).view(bs, 1))
    if record is not None:
        rows = buf.row_ids[:bs]
        ids, q, q_tok = record
        on = active.view(bs, 1)
        buf.cand_ids[rows, col] = torch.where(on, ids, buf.cand_ids[rows, col])
        buf.cand_q[rows, col] = torch.where(on, q, buf.cand_q[rows, col])
        buf.q_tok[rows, col] = torch.where(active, q_tok, buf.q_tok[rows, col])
    buf.pending[:bs] += active.to(torch.int64)


def commit_verify(buf: ChainBuffers, rows: RowInputs, emitted: torch.Tensor, num_accepted: torch.Tensor) -> None:
    """Record the verify of forward ``buf.step`` (emitted [S, k + 1] int64: accepted drafts, the
    drawn token, then -1; num_accepted [S] int64) and advance to the next forward."""
    seg = rows.seg
    after = rows.seg_len + num_accepted + 1
    buf.emitted[seg] = emitted
    buf.accept_len[seg] = num_accepted + 1
    buf.length[seg] = after
    root = emitted.gather(1, num_accepted.view(-1, 1))
    buf.tokens[seg, :1] = root
    buf.pending.index_fill_(0, seg, 0)  # a scalar put would copy a host tensor (not allowed under capture)
    j, s = buf.step, seg.shape[0]
    buf.seg_before[:, :s].index_copy_(0, j, rows.seg_len.view(1, -1))
    buf.seg_after[:, :s].index_copy_(0, j, after.view(1, -1))
    buf.step.add_(1)


def mixed_step(
    buf: ChainBuffers,
    bs: int,
    segments: int,
    forward: Callable[[RowInputs], torch.Tensor],
    draft: Callable[[torch.Tensor], tuple[torch.Tensor, Record | None]],
    accept: Callable[[torch.Tensor, RowInputs], tuple[torch.Tensor, torch.Tensor]],
) -> None:
    """Forward ``buf.step`` of an iteration: ``forward`` runs the rows and returns their next-token
    logits; ``draft`` turns the draft rows' logits into drafts (and records); ``accept`` the segment
    rows' logits into (emitted, num_accepted). Advances the step."""
    rows = row_inputs(buf, bs, segments)
    logits = forward(rows)
    drafted, record = draft(logits[:bs])
    emitted, num_accepted = accept(logits[bs:], rows)
    commit_drafts(buf, rows.active, drafted, record)
    commit_verify(buf, rows, emitted, num_accepted)


@dataclass
class ChainStore:
    """Chains carried between iterations, by pool row: pending [rows] int64, tokens [rows, k + 1]
    (column 0 unused: the root comes back from SGLang as the bonus token), the draft records
    [rows, k, C] / [rows, k]."""

    pending: torch.Tensor
    tokens: torch.Tensor
    cand_ids: torch.Tensor
    cand_q: torch.Tensor
    q_tok: torch.Tensor

    @classmethod
    def allocate(cls, rows: int, k: int, num_cand: int, device: torch.device | str) -> ChainStore:
        with torch.device(device):
            return cls(
                pending=torch.zeros(rows, dtype=torch.int64),
                tokens=torch.zeros((rows, k + 1), dtype=torch.int64),
                cand_ids=torch.zeros((rows, k, num_cand), dtype=torch.int64),
                cand_q=torch.zeros((rows, k, num_cand), dtype=torch.float32),
                q_tok=torch.ones((rows, k), dtype=torch.float32),
            )

    def load(
        self,
        buf: ChainBuffers,
        rpi: torch.Tensor,
        length: torch.Tensor,
        root: torch.Tensor,
        carried: torch.Tensor,
        sampled: bool,
    ) -> None:
        """Batch rows 0..bs-1 of ``buf`` from SGLang's batch (rpi, committed length, root token [bs])
        and the stored chains; ``carried`` [bs] bool: False restarts the row's chain (no drafts)."""
        bs = rpi.shape[0]
        rows = rpi.to(torch.int64)
        buf.rpi[:bs] = rows
        buf.length[:bs] = length
        buf.pending[:bs] = self.pending[rows] * carried.to(torch.int64)
        buf.tokens[:bs] = self.tokens[rows]
        buf.tokens[:bs, 0] = root
        if sampled:
            buf.cand_ids[:bs] = self.cand_ids[rows]
            buf.cand_q[:bs] = self.cand_q[rows]
            buf.q_tok[:bs] = self.q_tok[rows]

    def save(self, buf: ChainBuffers, rpi: torch.Tensor, sampled: bool) -> None:
        """Keep the batch's chains for the next iteration."""
        bs = rpi.shape[0]
        rows = rpi.to(torch.int64)
        self.pending[rows] = buf.pending[:bs]
        self.tokens[rows] = buf.tokens[:bs]
        if sampled:
            self.cand_ids[rows] = buf.cand_ids[:bs]
            self.cand_q[rows] = buf.cand_q[:bs]
            self.q_tok[rows] = buf.q_tok[:bs]
