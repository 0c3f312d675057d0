"""Per-request draft plans: what each request's next k draft steps attend to.

A plan is made at the end of every target forward (prefill or verify) and read by the
next draft round. Request ``b`` (pool row ``r``) attends, in layer ``l`` and KV head ``h``, to

    sel_pos[r, g, :sel_cnt[r]]  ∪  [tail_start[r], current position]

where ``g = l * H_kv + h`` when the plan holds one set per (layer, KV head), or ``g = 0``
when one set is shared by every layer and head. Positions, not KV slots, are stored, so
plans stay valid when a request's KV moves (offload/restore) and come out sorted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .match_heads import MatchHeads, TokenIds


@dataclass
class PlanState:
    """Plans of every request row, indexed by ``req_pool_idx`` (row 0 = padding row).

    sel_pos:    [rows, groups, kmax] int32 — selected positions ascending, then -1;
                groups = num_layers * num_kv_heads (per-head plans) or 1 (shared plans).
    sel_cnt:    [rows] int32 — valid entries per set (the same for every set of a row).
    tail_start: [rows] int32 — first position of the always-attended recent tail;
                every selected position is < tail_start.
    Row 0 stays empty (count 0, tail_start 0): padded graph rows attend only to themselves.
    dense:      per layer [num_kv_heads] int32 (1 where a KV head drafts over the whole prefix instead of its
                plan) or None where no head of the layer does; None when none at all (``selection/dense_heads.py``).
    match:      the KV heads that also attend each draft step's token matches, and
    token_ids:  the token ids the matches are scanned in, both None when off (``selection/match_heads.py``).
    """

    sel_pos: torch.Tensor
    sel_cnt: torch.Tensor
    tail_start: torch.Tensor
    num_layers: int
    num_kv_heads: int
    dense: tuple[torch.Tensor | None, ...] | None = None
    match: MatchHeads | None = None
    token_ids: TokenIds | None = None

    @classmethod
    def allocate(
        cls, rows: int, num_layers: int, num_kv_heads: int, per_head: bool, kmax: int, device: torch.device
    ) -> PlanState:
        groups = num_layers * num_kv_heads if per_head else 1
        return cls(
            sel_pos=torch.full((rows, groups, kmax), -1, dtype=torch.int32, device=device),
            sel_cnt=torch.zeros(rows, dtype=torch.int32, device=device),
            tail_start=torch.zeros(rows, dtype=torch.int32, device=device),
            num_layers=num_layers,
            num_kv_heads=num_kv_heads,
        )

    @property
    def kmax(self) -> int:
        return self.sel_pos.shape[2]

    def dense_heads(self, layer_id: int) -> torch.Tensor | None:
        """[num_kv_heads] int32 of one layer's dense KV heads, or None when no head is dense."""
        return None if self.dense is None else self.dense[layer_id]

    def match_heads(self, layer_id: int) -> torch.Tensor | None:
        """[num_kv_heads] int32: one layer's match heads' rows in the step's match lists (-1: not listed), or None
        when no head of it is listed."""
        return None if self.match is None else self.match.rows[layer_id]

    def layer(self, layer_id: int) -> torch.Tensor:
        """[rows, H_kv, kmax] view of one layer's sets (head stride 0 for shared plans)."""
        rows, groups, kmax = self.sel_pos.shape
        if groups == 1:
            return self.sel_pos.expand(rows, self.num_kv_heads, kmax)
        return self.sel_pos.view(rows, self.num_layers, self.num_kv_heads, kmax)[:, layer_id]

    def store(self, rows: torch.Tensor, sel_pos: torch.Tensor, sel_cnt: torch.Tensor, tail_start: torch.Tensor) -> None:
        """Write one shared set per request ([bs, kmax] positions) into every set of its row."""
        idx = rows.to(torch.int64)
        self.sel_pos[idx] = sel_pos[:, None, :].to(torch.int32)
        self.store_window(rows, sel_cnt, tail_start)

    def store_window(self, rows: torch.Tensor, sel_cnt: torch.Tensor, tail_start: torch.Tensor) -> None:
        idx = rows.to(torch.int64)
        self.sel_cnt[idx] = sel_cnt.to(torch.int32)
        self.tail_start[idx] = tail_start.to(torch.int32)
