"""The sparse decode kernel vs its reference: ragged per-head selections with tails, split counts,
dense rows (full attention) and softcap.

Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs compiled.
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.qk_prologue import rms_norm_ref, rope_neox_ref
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd
from sglang_sparsespec.kernels.sparse_decode_ref import sparse_decode_ref
from sglang_sparsespec.kernels.token_match import match_lists_fwd
from triton_env import DEVICE

from kernel_cases import D, decode_case


@pytest.mark.parametrize("num_kv_splits", [1, 3])  # 1: stage 1 writes the output, no merge launch
@pytest.mark.parametrize("group", [1, 3])
def test_sparse_decode_ragged(group, num_kv_splits):
    torch.manual_seed(40 + group)
    kmax = 48
    specs = [
        (150, 90, 40, 3),  # 100 entries over 2 splits; a few selections fall in the tail: not counted twice
        (40, 33, 0, 0),  # budget 0: tail only
        (1, 0, 0, 0),  # L = 1: only the current token
        (70, 60, 48, 0),  # full budget (cnt == Kmax)
        (25, 25, 5, 0),  # empty tail: selections only
        (30, 30, 0, 0),  # nothing to attend to: zero output
    ]
    case = decode_case(group, specs, kmax)
    o = torch.full_like(case["q"], float("nan"))
    expected = o.clone()
    sparse_decode_fwd(o=o, num_kv_splits=num_kv_splits, block_n=16, **case)
    sparse_decode_ref(o=expected, **case)
    assert not o.isnan().any()
    assert (o[5] == 0).all()
    torch.testing.assert_close(o.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_sparse_decode_dense_row_is_full_attention():
    """tail_start = 0 (a request drafting densely): its selections are ignored, whatever the count,
    and the output is plain attention over the whole prefix."""
    torch.manual_seed(45)
    group, h_kv = 3, 2
    case = decode_case(group, [(120, 0, 20, 20), (64, 40, 10, 0)], kmax=24, h_kv=h_kv)
    o = torch.full_like(case["q"], float("nan"))
    sparse_decode_fwd(o=o, num_kv_splits=2, **case)
    slots = case["req_to_token"][case["req_pool_indices"][0], :120].long()
    k, v = case["k_buffer"][slots].float(), case["v_buffer"][slots].float()  # [120, H_kv, D]
    q = case["q"][0].float().view(h_kv, group, D)
    p = torch.softmax(torch.einsum("hgd,nhd->hgn", q, k) * case["sm_scale"], dim=-1)
    full = torch.einsum("hgn,nhd->hgd", p, v).reshape(h_kv * group, D)
    torch.testing.assert_close(o[0].float(), full, rtol=2e-2, atol=2e-2)
    expected = torch.full_like(o, float("nan"))
    sparse_decode_ref(o=expected, **case)
    torch.testing.assert_close(o.float(), expected.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("num_kv_splits", [1, 2])
def test_sparse_decode_dense_heads_attend_the_whole_prefix(num_kv_splits):
    """A KV head marked dense reads every position below seq_len (its selections ignored); the others keep their
    plans, so only the marked head's output changes."""
    torch.manual_seed(47)
    group, h_kv = 2, 3
    case = decode_case(group, [(120, 90, 20, 0), (64, 40, 10, 0)], kmax=24, h_kv=h_kv)
    dense = torch.tensor([0, 1, 0], dtype=torch.int32, device=DEVICE)
    o, planned = (torch.full_like(case["q"], float("nan")) for _ in range(2))
    sparse_decode_fwd(o=o, num_kv_splits=num_kv_splits, block_n=16, dense_heads=dense, **case)
    sparse_decode_fwd(o=planned, num_kv_splits=num_kv_splits, block_n=16, **case)
    every = dict(case, tail_start=torch.zeros_like(case["tail_start"]))
    full = sparse_decode_ref(o=torch.empty_like(o), **every)
    head = slice(group, 2 * group)  # KV head 1's query heads
    torch.testing.assert_close(o[:, head].float(), full[:, head].float(), rtol=2e-2, atol=2e-2)
    others = [h for h in range(h_kv * group) if not group <= h < 2 * group]
    assert torch.equal(o[:, others], planned[:, others])
    assert not torch.allclose(o[:, head].float(), planned[:, head].float(), atol=1e-3)
    expected = sparse_decode_ref(o=torch.empty_like(o), dense_heads=dense, **case)
    torch.testing.assert_close(o.float(), expected.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("num_kv_splits", [1, 2])
def test_sparse_decode_match_heads_add_their_matches_once(num_kv_splits):
    """A KV head listed in ``match`` attends, besides its plan, the request's matches below the tail that it has not
    selected: the same output as a plan holding those positions too. A match already selected, one in the tail, a
    -1 and a position past the request's count change nothing; unlisted heads keep their plans exactly."""
    torch.manual_seed(48)
    group, h_kv = 2, 3
    case = decode_case(group, [(120, 90, 20, 0), (64, 40, 10, 0), (30, 0, 0, 0)], kmax=40, h_kv=h_kv)
    rows, sel = case["sel_rows"], case["sel_pos"]
    chosen = sel[rows[0], 1, 3].item()  # selected in head 1: listed once only
    free = sorted(set(range(90)) - set(sel[rows[0], 1, :20].tolist()))[:5]
    match_pos = torch.full((3, 12), -1, dtype=torch.int32, device=DEVICE)
    match_pos[0, :9] = torch.tensor([free[0], chosen, 95, free[1], -1, free[2], free[3], free[4], 7], device=DEVICE)
    match_pos[1, :2] = torch.tensor([2, 3], device=DEVICE)
    match_pos[2, :2] = torch.tensor([1, 2], device=DEVICE)  # a dense row (tail at 0): nothing below it
    match_cnt = torch.tensor([8, 2, 2], dtype=torch.int32, device=DEVICE)  # row 0's 7 lies past its count
    heads = torch.tensor([-1, 0, -1], dtype=torch.int32, device=DEVICE)  # head 1 reads row 0 of the lists
    lists = torch.full((1, 3, 12), -5, dtype=torch.int32, device=DEVICE)
    match_lists_fwd(match_pos, match_cnt, sel, case["sel_cnt"], rows, torch.tensor([1], device=DEVICE), lists)
    o, planned = (torch.full_like(case["q"], float("nan")) for _ in range(2))
    match = (lists, match_cnt, heads)
    sparse_decode_fwd(o=o, num_kv_splits=num_kv_splits, block_n=16, match=match, **case)
    sparse_decode_fwd(o=planned, num_kv_splits=num_kv_splits, block_n=16, **case)
    # The same positions as a plan: head 1's sets of rows 0 and 1 widened by their fresh matches.
    wide = torch.full((sel.shape[0], h_kv, 48), -1, dtype=torch.int32, device=DEVICE)
    wide[:, :, :40] = sel
    cnt = case["sel_cnt"].clone()
    for b, fresh in ((0, free), (1, [2, 3])):
        r = rows[b]
        n = int(cnt[r])
        for h in range(h_kv):
            extra = [p for p in fresh if p not in sel[r, h, :n].tolist()] if h == 1 else []
            pos = torch.tensor(sel[r, h, :n].tolist() + extra, device=DEVICE).sort().values
            wide[r, h, : pos.numel()] = pos.to(torch.int32)
            wide[r, h, pos.numel() :] = -1
        cnt[r] = n + len(fresh)
    expected = sparse_decode_ref(o=torch.empty_like(o), **dict(case, sel_pos=wide, sel_cnt=cnt))
    listed = slice(group, 2 * group)
    torch.testing.assert_close(o[:, listed].float(), expected[:, listed].float(), rtol=2e-2, atol=2e-2)
    others = [h for h in range(h_kv * group) if not group <= h < 2 * group]
    assert torch.equal(o[:, others], planned[:, others]) and torch.equal(o[2], planned[2])
    assert not torch.allclose(o[0, listed].float(), planned[0, listed].float(), atol=1e-3)
    torch.testing.assert_close(
        o.float(), sparse_decode_ref(o=torch.empty_like(o), match=match, **case).float(), rtol=2e-2, atol=2e-2
    )


def test_sparse_decode_softcap_default_rows_and_splits():
    torch.manual_seed(50)
    case = decode_case(2, [(70, 60, 16, 0), (9, 4, 4, 0)], kmax=16)
    case["sel_pos"], case["sel_cnt"] = case["sel_pos"][case["sel_rows"]], case["sel_cnt"][case["sel_rows"]]
    case["sel_rows"] = None
    case["logit_cap"] = 2.0
    o = torch.full_like(case["q"], float("nan"))
    expected = o.clone()
    sparse_decode_fwd(o=o, **case)
    sparse_decode_ref(o=expected, **case)
    torch.testing.assert_close(o.float(), expected.float(), rtol=2e-2, atol=2e-2)


def _cos_sin_cache(max_pos: int, base: float = 10000.0) -> torch.Tensor:
    """SGLang's rotary cache layout: [max_pos, D], cos of every frequency then sin."""
    inv_freq = 1.0 / base ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    angles = torch.arange(max_pos, dtype=torch.float32)[:, None] * inv_freq[None, :]
    return torch.cat([angles.cos(), angles.sin()], dim=-1).to(DEVICE)


@pytest.mark.parametrize("num_kv_splits", [1, 3])
@pytest.mark.parametrize(
    "logit_cap, rope, norm",
    [(0.0, False, False), (2.0, False, False), (0.0, True, False), (0.0, True, True), (0.0, False, True)],
)
def test_sparse_decode_writes_the_step_kv_and_attends_it_from_registers(num_kv_splits, logit_cap, rope, norm):
    """new_kv: each request's current slot starts as NaN (a read before the write would spread it), is written
    with the step's K/V, and the output is the reference's, which writes the slot first and then reads it.
    Rows: a long tail over splits, only the current token, selections only past an empty tail, a tail that
    starts after the current position (the current token is not attended, as without new_kv). With ``rope`` q
    and the new key arrive unrotated, with ``norm`` unnormalized too: the stored key and the output are those of
    normalizing, then rotating them first."""
    torch.manual_seed(60 + num_kv_splits)
    h_kv, group = 2, 2
    specs = [(150, 90, 40, 3), (1, 0, 0, 0), (70, 60, 48, 0), (25, 24, 5, 0), (30, 30, 0, 0)]
    case = decode_case(group, specs, kmax=48, h_kv=h_kv)
    case["logit_cap"] = logit_cap
    bs = len(specs)
    cur = case["req_to_token"][case["req_pool_indices"], case["seq_lens"] - 1].long()
    k_new = torch.randn(bs, h_kv, D, device=DEVICE).to(torch.bfloat16)
    v_new = torch.randn(bs, h_kv, D, device=DEVICE).to(torch.bfloat16)
    ref_case = dict(case, k_buffer=case["k_buffer"].clone(), v_buffer=case["v_buffer"].clone())
    case["k_buffer"][cur], case["v_buffer"][cur] = float("nan"), float("nan")
    untouched = torch.ones(case["k_buffer"].shape[0], dtype=torch.bool, device=DEVICE)
    untouched[cur] = False
    before_k, before_v = case["k_buffer"][untouched].clone(), case["v_buffer"][untouched].clone()

    rot = (_cos_sin_cache(200), case["seq_lens"] - 1) if rope else None
    gen = torch.Generator().manual_seed(7)
    qk_norm = (torch.rand(D, generator=gen) + 0.5, torch.rand(D, generator=gen) + 0.5, 1e-6, 1e-5) if norm else None
    if norm:
        qk_norm = (qk_norm[0].to(DEVICE).to(torch.bfloat16), qk_norm[1].to(DEVICE).to(torch.bfloat16), 1e-6, 1e-5)
        case["q"] = case["q"] * 5  # unnormalized activations
    o = torch.full_like(case["q"], float("nan"))
    expected = o.clone()
    new_kv = (k_new, v_new, cur)
    sparse_decode_fwd(o=o, num_kv_splits=num_kv_splits, block_n=16, new_kv=new_kv, rope=rot, qk_norm=qk_norm, **case)
    ref_case["q"] = case["q"]
    sparse_decode_ref(o=expected, new_kv=(k_new, v_new, cur.int()), rope=rot, qk_norm=qk_norm, **ref_case)
    assert not o.isnan().any()
    torch.testing.assert_close(o.float(), expected.float(), rtol=2e-2, atol=2e-2)
    assert (o[4] == 0).all()  # its tail starts past the current position: nothing attended
    torch.testing.assert_close(o[1].float(), v_new[1].float().repeat_interleave(group, 0))  # only itself
    stored_k = rms_norm_ref(k_new, qk_norm[1], qk_norm[3]) if norm else k_new
    stored_k = rope_neox_ref(stored_k, *rot) if rope else stored_k
    torch.testing.assert_close(case["k_buffer"][cur].float(), stored_k.float(), rtol=2e-2, atol=2e-2)
    assert torch.equal(case["v_buffer"][cur], v_new)
    assert torch.equal(case["k_buffer"][untouched], before_k) and torch.equal(case["v_buffer"][untouched], before_v)


def test_sparse_decode_refuses_new_kv_it_cannot_store():
    case = decode_case(1, [(10, 5, 0, 0)], kmax=4)
    o = torch.empty_like(case["q"])
    kv = torch.zeros(1, 2, D, device=DEVICE)  # fp32 against a bf16 cache
    with pytest.raises(ValueError, match="new_kv k must be"):
        sparse_decode_fwd(o=o, new_kv=(kv, kv, torch.zeros(1, dtype=torch.int64, device=DEVICE)), **case)
    kv = kv.to(torch.bfloat16)
    with pytest.raises(ValueError, match="out_loc"):
        sparse_decode_fwd(o=o, new_kv=(kv, kv, torch.zeros(2, dtype=torch.int64, device=DEVICE)), **case)
    pos = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="rope needs new_kv"):
        sparse_decode_fwd(o=o, rope=(_cos_sin_cache(16), pos), **case)
    with pytest.raises(ValueError, match="rope needs new_kv"):
        sparse_decode_fwd(o=o, new_kv=(kv, kv, pos), rope=(_cos_sin_cache(16)[:, : D // 2], pos), **case)
    w = torch.ones(D, device=DEVICE)
    with pytest.raises(ValueError, match="qk_norm needs new_kv"):
        sparse_decode_fwd(o=o, qk_norm=(w, w, 1e-6, 1e-6), **case)
    with pytest.raises(ValueError, match="qk_norm needs new_kv"):
        sparse_decode_fwd(o=o, new_kv=(kv, kv, pos), qk_norm=(w[:8], w, 1e-6, 1e-6), **case)
