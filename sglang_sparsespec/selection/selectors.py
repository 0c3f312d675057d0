"""Selection policies: who writes each request's plan after a target forward.

Every policy seeds a request after prefill with the streaming plan (sinks + recent
window), so the first round after prefill is already sparse. After each verify pass:

- ``ScoredSelector``    PILLAR: top-K per (layer, KV head) over the verify pass's captured
                        scores; COARSE: top-K over the same scores summed over layers and heads;
- ``StreamingSelector`` the streaming plan again (sinks + recent window);
- ``OracleSelector``    only the window (tail_start, count); the draft attention picks
                        each step's exact top-K itself (see ``oracle.py``).
All methods are shape-static GPU code without host synchronisation.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.modes import SelectionPolicy
from sglang_sparsespec.kernels.topk_select import topk_select

from .policy import draft_window, streaming_plan
from .scores import VerifyScoreSink
from .state import PlanState


class Selector(ABC):
    """Writes plans into ``state`` rows given by the batch's ``req_pool_indices``."""

    def __init__(self, cfg: PillarConfig, state: PlanState):
        self.cfg = cfg
        self.state = state

    def after_prefill(self, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> None:
        plan = streaming_plan(self.cfg, seq_lens, self.state.kmax)
        self.state.store(req_pool_indices, plan.sel_pos, plan.sel_cnt, plan.tail_start)

    @abstractmethod
    def after_verify(self, req_pool_indices: torch.Tensor, verify_lens: torch.Tensor, new_lens: torch.Tensor) -> None:
        """verify_lens: prefix the verify attended to; new_lens: committed length after it."""


class StreamingSelector(Selector):
    def after_verify(self, req_pool_indices, verify_lens, new_lens) -> None:
        self.after_prefill(req_pool_indices, new_lens)


class OracleSelector(Selector):
    def after_verify(self, req_pool_indices, verify_lens, new_lens) -> None:
        tail_start, count = draft_window(self.cfg, verify_lens, new_lens, self.state.kmax)
        self.state.store_window(req_pool_indices, count, tail_start)


class ScoredSelector(Selector):
    """Top-K over the sink's candidate rows; ``state`` must hold one set per candidate row.

    With ``cfg.select_every = N > 1`` only every N-th verify pass (counted per server) selects; the
    passes in between keep each request's plan (its recent tail grows until the next selection) and
    are told to skip the score capture through the sink's device flag.
    """

    def __init__(self, cfg: PillarConfig, state: PlanState, sink: VerifyScoreSink):
        super().__init__(cfg, state)
        if sink.num_candidate_rows != state.sel_pos.shape[1]:
            raise ValueError("plan sets per request must match the sink's candidate rows")
        self.sink = sink
        self.verify_passes = 0
        sink.set_capture(True)

    def after_verify(self, req_pool_indices, verify_lens, new_lens) -> None:
        selects = self.verify_passes % self.cfg.select_every == 0
        self.verify_passes += 1
        if self.cfg.select_every > 1:
            self.sink.set_capture(self.verify_passes % self.cfg.select_every == 0)
        if not selects:
            return
        tail_start, count = draft_window(self.cfg, verify_lens, new_lens, self.state.kmax)
        # Writes sel_pos and sel_cnt of the batch's rows; positions >= tail_start are never candidates.
        topk_select(
            self.sink.candidates(),
            VerifyScoreSink.starts(verify_lens),
            tail_start,
            count,
            self.state.sel_pos,
            self.state.sel_cnt,
            out_rows=req_pool_indices,
        )
        self.state.tail_start[req_pool_indices.to(torch.int64)] = tail_start.to(torch.int32)


def make_selector(cfg: PillarConfig, state: PlanState, sink: VerifyScoreSink | None) -> Selector:
    """The selector of ``cfg.policy``; scored policies need the sink their verify pass fills."""
    if cfg.policy.uses_verify_scores:
        if sink is None:
            raise ValueError(f"policy {cfg.policy.value} needs a verify score sink")
        return ScoredSelector(cfg, state, sink)
    if cfg.policy is SelectionPolicy.STREAMING:
        return StreamingSelector(cfg, state)
    return OracleSelector(cfg, state)
