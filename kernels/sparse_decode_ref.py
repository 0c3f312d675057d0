"""Plain-torch references of ``sparse_decode.py``: the positions a request and KV head attend, and the attention
over them (fp32 math, loops over requests and KV heads; for tests)."""

from __future__ import annotations

import torch

from .qk_prologue import rms_norm_ref, rope_neox_ref


def sparse_attend_positions(
    sel_pos: torch.Tensor,
    sel_cnt: torch.Tensor,
    tail_start: torch.Tensor,
    seq_lens: torch.Tensor,
    b: int,
    row: int,
    h: int,
    matches: torch.Tensor | None = None,
) -> torch.Tensor:
    """Positions request b / KV head h attends to (the union defined in the module docstring): the selection and
    the tail in order, then ``matches`` (the head's list of request b, for a listed head) below the tail."""
    cnt = min(max(int(sel_cnt[row]), 0), sel_pos.shape[2])
    ts, sl = int(tail_start[b]), int(seq_lens[b])
    sel = sel_pos[row, h, :cnt].long()
    sel = sel[(sel >= 0) & (sel < ts)]
    tail = torch.arange(ts, max(sl, ts), device=sel.device)
    if matches is None:
        return torch.cat([sel, tail])
    m = matches.long()
    m = m[(m >= 0) & (m < ts)]
    return torch.cat([sel, tail, m])


def sparse_decode_ref(
    q: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    o: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    sel_pos: torch.Tensor,
    sel_cnt: torch.Tensor,
    tail_start: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    sel_rows: torch.Tensor | None = None,
    new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    qk_norm: tuple[torch.Tensor, torch.Tensor, float, float] | None = None,
    dense_heads: torch.Tensor | None = None,
    match: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Plain-torch `sparse_decode_fwd` (fp32 math, loops over requests and KV heads; for tests): ``qk_norm`` then
    ``rope`` are applied to q and the new key, ``new_kv`` is written into the cache, then every position is read
    from it."""
    if new_kv is not None:
        k_new, v_new, out_loc = new_kv
        if qk_norm is not None:
            q, k_new = rms_norm_ref(q, qk_norm[0], qk_norm[2]), rms_norm_ref(k_new, qk_norm[1], qk_norm[3])
        if rope is not None:
            q, k_new = rope_neox_ref(q, *rope), rope_neox_ref(k_new, *rope)
        k_buffer[out_loc.long()], v_buffer[out_loc.long()] = k_new, v_new
    bs, h_q, _ = q.shape
    h_kv = k_buffer.shape[1]
    group = h_q // h_kv
    for b in range(bs):
        row = int(sel_rows[b]) if sel_rows is not None else b
        for h in range(h_kv):
            dense = dense_heads is not None and bool(dense_heads[h])  # its tail starts at 0, as in the kernel
            starts = torch.zeros_like(tail_start) if dense else tail_start
            listed = match is not None and int(match[2][h]) >= 0
            found = match[0][int(match[2][h]), b, : int(match[1][b])] if listed else None
            pos = sparse_attend_positions(sel_pos, sel_cnt, starts, seq_lens, b, row, h, found)
            heads = slice(h * group, (h + 1) * group)
            if pos.numel() == 0:
                o[b, heads] = 0
                continue
            slots = req_to_token[int(req_pool_indices[b]), pos].long()
            k, v = k_buffer[slots, h].float(), v_buffer[slots, h].float()  # [n, D]
            s = (q[b, heads].to(k_buffer.dtype).float() @ k.T) * sm_scale  # [G, n]
            if logit_cap > 0:
                s = logit_cap * torch.tanh(s / logit_cap)
            o[b, heads] = (torch.softmax(s, dim=-1) @ v).to(o.dtype)
    return o
