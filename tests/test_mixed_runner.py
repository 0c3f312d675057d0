"""The GPU side of mixed-phase iterations (``patches/mixed_runner.py``) on a stand-in model.

``MixedRunner.run`` is driven as the worker drives it, with SGLang's batch fields, through its own
forward plumbing (ForwardBatch rows, KV slots from ``req_to_token``, the draft rows' tail starts,
the segments' prefix slot lists built by SGLang's Triton kernel), its draft sampling and acceptance
kernels (Triton's interpreter on CPU) and its selector calls. The stand-in model keeps one token
per KV slot as tests/test_mixed.py's does; every request's output must equal greedy decoding of
its target, for all-greedy batches and for sampled batches of top-k 1 requests (the sampled path:
draft records and exact rejection sampling, which at top-k 1 decide as greedy does). Every sampled
batch replays the one sampled graph, with or without top-k; on a GPU the captured iterations must
emit exactly what the eager body emits.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang_sparsespec.patches import draft_runner as dr
from sglang_sparsespec.patches import mixed_runner as mxr
from sglang_sparsespec.patches.decode_graphs import Kind
from test_mixed import MARK, V, draft_next, reference, target_next
from triton_env import DEVICE

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.rounds.mixed import segments_per_forward
from sglang_sparsespec.selection.state import PlanState
from sglang_sparsespec.sampling.target import SamplingBackend

K, ROWS, CTX, MAX_BS = 3, 10, 128, 8
PROMPTS = [[(5 * i + j) % V for j in range(4 + 3 * i)] for i in range(5)]


class FakeBackend:
    stores_in_kernel = False  # no KV pool: the draft steps keep the model's own rotary call

    def __init__(self, model_runner, state, inputs, oracle, plain=False, fused=True):
        self.inputs = inputs
        self.segments = None

    def plan(self, bs: int, whole_prefix: bool, segments=None) -> None:
        self.segments = segments  # as PillarDraftBackend.plan: a step's segments are planned with it


class FakeModel:
    """One token per KV slot; draft rows write it marked. Logits peak at the draft's or the
    target's next token of the row's prefix (read back through req_to_token)."""

    def __init__(self, req_to_token: torch.Tensor):
        self.req_to_token = req_to_token
        self.kv = torch.full((int(req_to_token.max()) + 1,), -1, dtype=torch.int64, device=DEVICE)
        self.backend: FakeBackend | None = None
        self.tail_starts: list[torch.Tensor] = []

    def forward(self, input_ids, positions, fb):
        seg = self.backend.segments
        n, bs = input_ids.shape[0], seg.draft_rows
        assert fb.batch_size == n and torch.equal(fb.out_cache_loc, self.req_to_token[fb.req_pool_indices, positions])
        draft = torch.arange(n, device=DEVICE) < bs
        self.kv[fb.out_cache_loc] = torch.where(draft, input_ids + MARK, input_ids)
        self.tail_starts.append(self.backend.inputs.tail_start[:bs].clone())
        # The segments' prefix lists: each request's committed slots, in order.
        for s in range(seg.qo_indptr.shape[0] - 1):
            rpi = int(fb.req_pool_indices[bs + s * (K + 1)])
            lo, hi = int(seg.kv_indptr[s]), int(seg.kv_indptr[s + 1])
            assert torch.equal(seg.kv_indices[lo:hi], self.req_to_token[rpi, : hi - lo].to(torch.int64))
        peaks = torch.zeros(n, dtype=torch.int64)
        for i in range(n):
            rpi, pos = int(fb.req_pool_indices[i]), int(positions[i])
            if rpi == 0:
                continue
            prefix = [int(t) % MARK for t in self.kv[self.req_to_token[rpi, : pos + 1]]]
            peaks[i] = (draft_next if i < bs else target_next)(prefix)
        v = torch.arange(V)
        logits = -5.0 * (v[None, :] - peaks[:, None]).abs().float()
        return SimpleNamespace(next_token_logits=logits.to(DEVICE))


class FakeSelector:
    def __init__(self) -> None:
        self.calls: list[tuple[list[int], list[int], list[int]]] = []

    def after_verify(self, rows, before, after) -> None:
        self.calls.append((rows.tolist(), before.tolist(), after.tolist()))


class GraphModel:
    """A stand-in that a CUDA graph can record (device ops only): logits peak at
    (31 * token + 7 * position) % V, on draft and verify rows alike, so every draft is accepted."""

    def __init__(self, req_to_token: torch.Tensor):
        self.backend: FakeBackend | None = None

    def forward(self, input_ids, positions, fb):
        peak = (31 * input_ids + 7 * positions) % V
        v = torch.arange(V, device=input_ids.device)
        return SimpleNamespace(next_token_logits=-5.0 * (v[None, :] - peak[:, None]).abs().float())


def make_runner(monkeypatch, capture_bs: list[int], model_cls=FakeModel) -> mxr.MixedRunner:
    monkeypatch.setattr(dr, "PillarDraftBackend", FakeBackend)
    req_to_token = torch.zeros((ROWS, CTX), dtype=torch.int32, device=DEVICE)
    for r in range(1, ROWS):  # row 0 and slot 0: SGLang's padding
        req_to_token[r] = 1 + (r - 1) * CTX + torch.arange(CTX, dtype=torch.int32, device=DEVICE)
    model = model_cls(req_to_token)
    mr = SimpleNamespace(
        device=DEVICE, model=model, model_config=SimpleNamespace(vocab_size=V), spec_algorithm=None,
        req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        server_args=SimpleNamespace(enable_cudagraph_gc=False),
    )  # fmt: skip
    state = PlanState.allocate(ROWS + 1, 2, 3, True, 16, torch.device(DEVICE))
    state.tail_start[1:ROWS] = torch.arange(1, ROWS, dtype=torch.int32) * 10  # told apart per pool row
    draft = dr.PillarDraftRunner(
        mr, PillarConfig(num_steps=K, draft_candidates=4), state, max_bs=MAX_BS, capture_bs=capture_bs
    )
    model.backend = draft.backend
    return mxr.MixedRunner(draft, state, FakeSelector(), None, scratch_row=ROWS)


def batch_of(reqs: list[dict], greedy: bool, top_k: bool = True) -> SimpleNamespace:
    bs = len(reqs)
    # Sampled batches of top-k 1 requests: the sampled code path, decided as greedy decides. Without
    # top-k: SGLang's "off" value, every request sampled from its top-p set.
    top_ks = torch.full((bs,), 1 if top_k else 1 << 30, dtype=torch.int32, device=DEVICE)
    si = SimpleNamespace(
        is_all_greedy=greedy, need_top_k_sampling=top_k, temperatures=torch.full((bs, 1), 0.7, device=DEVICE),
        top_ps=torch.full((bs,), 0.9, device=DEVICE), top_ks=top_ks,
    )  # fmt: skip
    return SimpleNamespace(
        reqs=[SimpleNamespace(rid=r["rid"]) for r in reqs],
        sampling_info=si,
        req_pool_indices=torch.tensor([r["row"] for r in reqs], device=DEVICE),
        seq_lens=torch.tensor([r["length"] for r in reqs], device=DEVICE),
        spec_info=SimpleNamespace(bonus_tokens=torch.tensor([r["root"] for r in reqs], device=DEVICE)),
    )


def prefill(runner: mxr.MixedRunner, reqs: list[dict], i: int) -> None:
    """Request i joins in pool row i + 2: its prompt in the KV cache, its first token taken."""
    model, prompt, row = runner.mr.model, PROMPTS[i], i + 2
    for pos, tok in enumerate(prompt):
        model.kv[model.req_to_token[row, pos]] = tok
    first = target_next(prompt)
    reqs.append({"rid": f"r{i}", "row": row, "prompt": prompt, "out": [first], "length": len(prompt), "root": first})
    runner.tracker.forget([f"r{i}"])


@pytest.mark.parametrize("greedy", [True, False])
def test_runner_iterations_decode_exactly_as_greedy(monkeypatch, greedy):
    torch.manual_seed(0)
    runner = make_runner(monkeypatch, capture_bs=[4, 8])  # no graphs on CPU: eager bodies, padded rows
    model = runner.mr.model
    monkeypatch.setattr(mxr, "sampling_backend", lambda: SamplingBackend.FLASHINFER)
    reqs: list[dict] = []
    for i in range(3):
        prefill(runner, reqs, i)
    for it in range(8):
        if it == 3:
            prefill(runner, reqs, 3), prefill(runner, reqs, 4)
        model.tail_starts.clear()
        runner.selector.calls.clear()
        out = runner.run(batch_of(reqs, greedy))
        assert not out.graphed
        bs = len(reqs)
        for i, r in enumerate(reqs):
            n = int(out.accept_len[i])
            emitted = out.emitted[i, :n].tolist()
            r["out"].extend(emitted)
            r["root"], r["length"] = emitted[-1], int(out.length[i])
            assert int(out.root[i]) == emitted[-1]
        # One selector call per forward, each for its group's segments; padded ones go to the scratch row.
        assert len(runner.selector.calls) == K + 1
        rows_seen = sorted(row for rows, _, _ in runner.selector.calls for row in rows if row != ROWS)
        assert rows_seen == sorted(r["row"] for r in reqs)
        for rows, before, after in runner.selector.calls:
            for row, b, a in zip(rows, before, after):
                if row != ROWS:
                    r = next(r for r in reqs if r["row"] == row)
                    assert a > b and a <= r["length"]
        # Draft rows attend the plan of their own pool row (tail starts are per pool row here).
        padded = 4 if bs <= 4 else 8
        rows_t = batch_of(reqs, greedy).req_pool_indices
        for ts in model.tail_starts:
            active = ts[:bs] != 0
            assert torch.equal(ts[:bs][active], (rows_t * 10).to(torch.int32)[active])
            assert bool((ts[bs:padded] == 0).all())
    for i, r in enumerate(reqs):
        assert r["out"] == reference(r["prompt"], len(r["out"])), r["rid"]
        assert len(r["out"]) > 8


def test_every_sampled_batch_replays_the_one_sampled_graph(monkeypatch):
    """Top-p-only and top-k sampled batches replay the same graph (the acceptance reads each row's
    filters from device buffers: one kernel chain serves both); all-greedy batches replay their own."""
    runner = make_runner(monkeypatch, capture_bs=[4, 8])
    monkeypatch.setattr(mxr, "sampling_backend", lambda: SamplingBackend.FLASHINFER)
    replays: list[Kind] = []

    class Replayed:
        """Stands in for a graph captured from the bucket's body: a replay runs that body."""

        def __init__(self, kind: Kind) -> None:
            self.kind = kind

        def replay(self) -> None:
            replays.append(self.kind)
            runner._body(4, segments_per_forward(4, K), self.kind)

    for kind in (Kind.GREEDY, Kind.SAMPLED):
        runner.graphs.graphs[(4, kind)] = Replayed(kind)
    reqs: list[dict] = []
    for i in range(3):
        prefill(runner, reqs, i)
    for greedy, top_k in ((False, False), (False, True), (True, True)):
        replays.clear()
        out = runner.run(batch_of(reqs, greedy, top_k))
        assert out.graphed and replays == [Kind.GREEDY if greedy else Kind.SAMPLED] * (K + 1)
        for i, r in enumerate(reqs):
            r["root"], r["length"] = int(out.root[i]), int(out.length[i])
    prefill(runner, reqs, 3), prefill(runner, reqs, 4)  # 5 rows: the 8 bucket, which has no graph here
    replays.clear()
    assert not runner.run(batch_of(reqs, False, False)).graphed and not replays


def peak_chain(root: int, position: int, n: int) -> list[int]:
    """GraphModel's tokens after ``root`` at ``position``."""
    out = []
    for j in range(n):
        root = (31 * root + 7 * (position + j)) % V
        out.append(root)
    return out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.usefixtures("sglang_groups")
@pytest.mark.parametrize("greedy", [True, False])
def test_captured_iterations_replay_like_the_eager_body(monkeypatch, greedy):
    monkeypatch.setattr(mxr, "sampling_backend", lambda: SamplingBackend.FLASHINFER)
    graphed = make_runner(monkeypatch, [4, 8], GraphModel)
    eager = make_runner(monkeypatch, [4, 8], GraphModel)
    graphed.capture()
    assert set(graphed.graphs.graphs) == {(b, kind) for b in (4, 8) for kind in (Kind.GREEDY, Kind.SAMPLED)}
    reqs = [{"rid": f"r{i}", "row": i + 2, "length": 5 + 3 * i, "root": i + 1} for i in range(3)]
    for _ in range(4):
        batch = batch_of(reqs, greedy)
        out, ref = graphed.run(batch), eager.run(batch)
        assert out.graphed and not ref.graphed
        for name in ("emitted", "accept_len", "length", "root"):
            assert torch.equal(getattr(out, name), getattr(ref, name)), name
        for i, r in enumerate(reqs):
            n = int(out.accept_len[i])
            assert out.emitted[i, :n].tolist() == peak_chain(r["root"], r["length"], n)
            r["root"], r["length"] = int(out.root[i]), int(out.length[i])
    assert graphed.selector.calls == eager.selector.calls
