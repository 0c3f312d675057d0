"""Mixed-phase iterations (rounds/mixed.py) against sequential decoding, with a fake model on CPU.

The fake model keeps one token per KV slot. A draft row writes its token marked as draft KV, a
verify row writes it plain, and every row then reads its prefix through ``req_to_token``: the
target's next token is a hash of the whole prefix (and a verify row that finds draft KV below its
request's committed length fails the test), the draft's is the same hash with a deterministic error
on a third of the prefixes. Driving the iterations as the worker does (groups, segment tables, the
chain store, padding rows, requests joining, finishing and a split round in between), every
request's output must equal greedy decoding of the target, and no row may write past the KV the
reserve covers.
"""

from __future__ import annotations

import pytest
import torch

from sglang_sparsespec.rounds.mixed import (
    ChainBuffers,
    ChainStore,
    ChainTracker,
    PhaseGroups,
    RowInputs,
    mixed_step,
    segment_table,
    segments_per_forward,
)
from sglang_sparsespec.sampling.accept import greedy_accept
from sglang_sparsespec.sampling.rejection import DraftRecord, rejection_sample

V, MARK, CTX = 37, 1000, 160


def target_next(prefix: list[int]) -> int:
    return (sum((i + 1) * t for i, t in enumerate(prefix)) * 31 + len(prefix)) % V


def draft_next(prefix: list[int]) -> int:
    t = target_next(prefix)
    return (t + 1) % V if (sum(prefix) + len(prefix)) % 3 == 0 else t


def reference(prompt: list[int], n: int) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        out.append(target_next(seq))
        seq.append(out[-1])
    return out


class FakeServer:
    """SGLang's side (pool rows, slots, committed lengths, outputs) and the worker's loop."""

    def __init__(self, k: int, buckets: list[int], max_bs: int = 8, sampled: bool = False):
        self.k, self.buckets, self.sampled = k, buckets, sampled
        rows = max_bs + 2
        self.req_to_token = torch.zeros((rows, CTX), dtype=torch.int64)
        for r in range(1, rows):  # slot 0 is SGLang's padding slot
            self.req_to_token[r] = 1 + (r - 1) * CTX + torch.arange(CTX)
        self.kv = torch.full((1 + rows * CTX,), -1, dtype=torch.int64)
        self.free = list(range(1, rows))
        self.buf = ChainBuffers.allocate(max_bs, k, 2, "cpu")
        self.store = ChainStore.allocate(rows, k, 2, "cpu")
        self.tracker = ChainTracker(k)
        self.reqs: dict[str, dict] = {}
        self.max_write_past_start = 0

    # ---- SGLang ----------------------------------------------------------------------
    def prefill(self, rid: str, prompt: list[int]) -> None:
        row = self.free.pop(0)
        for pos, tok in enumerate(prompt):
            self.kv[self.req_to_token[row, pos]] = tok
        first = target_next(prompt)
        self.reqs[rid] = {"row": row, "prompt": prompt, "out": [first], "length": len(prompt), "root": first}
        self.tracker.forget([rid])

    def finish(self, rid: str) -> None:
        self.free.append(self.reqs.pop(rid)["row"])

    def plain_round(self) -> None:
        """A decode round of another shape (plain decoding): it commits the root and invalidates chains."""
        for r in self.reqs.values():
            self.kv[self.req_to_token[r["row"], r["length"]]] = r["root"]
            nxt = target_next(self._tokens(r["row"], r["length"] + 1))
            r["out"].append(nxt)
            r["length"] += 1
            r["root"] = nxt
        self.tracker.invalidate()

    # ---- the fake model --------------------------------------------------------------
    def _tokens(self, row: int, n: int) -> list[int]:
        return [int(self.kv[self.req_to_token[row, p]]) % MARK for p in range(n)]

    def forward(self, rows: RowInputs, bs: int) -> torch.Tensor:
        n = rows.tokens.shape[0]
        slots = self.req_to_token[rows.rpi, rows.positions]
        is_draft = torch.arange(n) < bs
        self.kv[slots] = torch.where(is_draft, rows.tokens + MARK, rows.tokens)  # every row's KV first
        logits = torch.zeros((n, V))
        for i in range(n):
            rpi, pos = int(rows.rpi[i]), int(rows.positions[i])
            if rpi == 0:  # padding and idle rows: SGLang's padding row
                continue
            self.max_write_past_start = max(self.max_write_past_start, pos - self.start_len[rpi])
            if i >= bs:
                committed = int(rows.seg_len[(i - bs) // (self.k + 1)])
                below = self.kv[self.req_to_token[rpi, :committed]]
                assert bool((below < MARK).all()), f"a verify row of pool row {rpi} reads draft KV below {committed}"
            prefix = self._tokens(rpi, pos + 1)
            logits[i, (draft_next if i < bs else target_next)(prefix)] = 1.0
        return logits

    def draft(self, logits: torch.Tensor, rows_holder: list) -> tuple:
        drafted = logits.argmax(dim=-1)
        if not self.sampled:
            return drafted, None
        rows = rows_holder[0]
        bs = logits.shape[0]
        # A one-hot proposal on the drafted token; slot 1 (q = 0) records the drafting row's position mod V.
        ids = torch.stack([drafted, rows.positions[:bs] % V], dim=1)
        q = torch.tensor([[1.0, 0.0]]).expand(bs, 2).contiguous()
        return drafted, (ids, q, torch.ones(bs))

    def accept(self, logits: torch.Tensor, rows: RowInputs) -> tuple:
        k1 = self.k + 1
        buf, seg = self.buf, rows.seg
        drafts = buf.tokens[seg, 1:]
        num_drafts = buf.pending[seg]
        if not self.sampled:
            return greedy_accept(logits.argmax(dim=-1).view(-1, k1), drafts, num_drafts)
        record = DraftRecord(drafts, buf.cand_ids[seg], buf.cand_q[seg], buf.q_tok[seg], num_drafts=num_drafts)
        s = seg.shape[0]
        return rejection_sample(logits.view(s, k1, V), record, torch.rand(s, self.k), torch.rand(s))

    # ---- the worker's iteration ------------------------------------------------------
    def iteration(self) -> None:
        buf, k = self.buf, self.k
        rids = list(self.reqs)
        bs = len(rids)
        padded = next((b for b in self.buckets if b >= bs), bs)
        plan = self.tracker.plan(rids, self.sampled, padded, buf.pad_row)
        buf.pad(bs, padded)
        buf.seg[:, : plan.segments] = torch.tensor(plan.table)
        buf.group[:bs] = torch.tensor(plan.groups)
        reqs = [self.reqs[r] for r in rids]
        rpi = torch.tensor([r["row"] for r in reqs])
        self.start_len = {r["row"]: r["length"] for r in reqs}
        self.store.load(
            buf, rpi, torch.tensor([r["length"] for r in reqs]), torch.tensor([r["root"] for r in reqs]),
            torch.tensor(plan.carried), sampled=self.sampled,
        )  # fmt: skip
        buf.step.zero_()
        holder: list = [None]

        def forward(rows: RowInputs) -> torch.Tensor:
            holder[0] = rows
            return self.forward(rows, padded)

        for _ in range(k + 1):
            mixed_step(buf, padded, plan.segments, forward, lambda lg: self.draft(lg, holder), self.accept)
        self.store.save(buf, rpi, sampled=self.sampled)
        for i, r in enumerate(reqs):
            n = int(buf.accept_len[i])
            emitted = buf.emitted[i, :n].tolist()
            assert emitted[-1] == int(buf.tokens[i, 0])  # the drawn token is the next root
            r["out"].extend(emitted)
            r["length"] = int(buf.length[i])
            r["root"] = emitted[-1]
            assert r["length"] == len(r["prompt"]) + len(r["out"]) - 1
            if self.sampled:  # each pending draft's record is the one its drafting row made
                p = int(buf.pending[i])
                assert buf.cand_ids[i, :p, 1].tolist() == [pos % V for pos in range(r["length"], r["length"] + p)]


@pytest.mark.parametrize("sampled", [False, True])
@pytest.mark.parametrize("k", [3, 4])
def test_mixed_iterations_decode_exactly_as_greedy(k, sampled):
    torch.manual_seed(0)
    server = FakeServer(k, buckets=[4, 8], sampled=sampled)
    prompts = {f"r{i}": [(7 * i + j) % V for j in range(3 + 2 * i)] for i in range(7)}
    for rid in ("r0", "r1", "r2"):
        server.prefill(rid, prompts[rid])
    for it in range(14):
        if it == 2:
            for rid in ("r3", "r4", "r5", "r6"):
                server.prefill(rid, prompts[rid])
        if it == 6:
            server.plain_round()
        if it == 9:
            server.finish("r1")
            server.finish("r4")
        server.iteration()
    outputs = {rid: r["out"] for rid, r in server.reqs.items()}
    for rid, out in outputs.items():
        assert out == reference(prompts[rid], len(out)), rid
    # A verify runs once per request per iteration: more tokens than iterations means drafts passed.
    assert all(len(out) > 14 for out in outputs.values())
    # Written past the length each iteration started with: at most 2k + 1 (alloc_reserve's bound).
    assert k + 1 <= server.max_write_past_start <= 2 * k + 1


def test_a_verify_row_that_reads_draft_kv_is_caught():
    """The fake model's guard works: a chain whose committed length is off by one reads its own
    draft KV and fails."""
    server = FakeServer(3, buckets=[4])
    server.prefill("a", [1, 2, 3, 4, 5])
    server.iteration()
    server.reqs["a"]["length"] += 1  # the scheduler and the chain disagree
    with pytest.raises(AssertionError, match="draft KV"):
        for _ in range(3):
            server.iteration()


def test_phase_groups_stay_balanced_and_sticky():
    groups = PhaseGroups(k=3)
    first = groups.assign([f"r{i}" for i in range(8)])
    assert sorted(first) == [0, 0, 1, 1, 2, 2, 3, 3]
    again = groups.assign([f"r{i}" for i in range(8)])
    assert again == first
    # Four leave from two groups; the rest keep their groups, newcomers fill the emptiest.
    kept = [f"r{i}" for i in range(8) if first[i] in (0, 1)]
    later = groups.assign(kept + ["n0", "n1"])
    assert later[: len(kept)] == [g for g in first if g in (0, 1)]
    assert sorted(later[len(kept) :]) == [2, 3]
    # Shrinking the batch lowers the cap: over-full groups give members away.
    small = groups.assign(kept[:1] + ["n0", "n1", "n2"])
    assert sorted(small) == [0, 1, 2, 3]


def test_segment_table_pads_and_refuses_overflow():
    assert segment_table([0, 2, 0], 2, 2, 9) == [[0, 2], [9, 9], [1, 9]]
    with pytest.raises(ValueError, match="exceeds"):
        segment_table([0, 0, 0], 2, 2, 9)
    assert segments_per_forward(256, 8) == 29 and segments_per_forward(1, 8) == 1


def test_chains_restart_after_another_round_and_across_kinds():
    tracker = ChainTracker(k=2)
    assert tracker.plan(["a", "b"], False, 2, 9).carried == [False, False]
    assert tracker.plan(["a", "b", "c"], False, 4, 9).carried == [True, True, False]
    tracker.forget(["b"])  # prefilled again
    assert tracker.plan(["a", "b"], False, 2, 9).carried == [True, False]
    assert tracker.plan(["a", "b"], True, 2, 9).carried == [False, False]  # greedy -> sampled
    tracker.invalidate()
    assert tracker.plan(["a", "b"], True, 2, 9).carried == [False, False]


def test_greedy_accept_stops_at_the_first_miss_and_at_the_pending_count():
    target = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]])
    drafts = torch.tensor([[5, 6, 7], [5, 0, 7], [5, 6, 7]])
    emitted, n = greedy_accept(target, drafts, torch.tensor([3, 3, 1]))
    assert n.tolist() == [3, 1, 1]
    assert emitted.tolist() == [[5, 6, 7, 8], [5, 6, -1, -1], [5, 6, -1, -1]]
