"""The draft step's token matches and each listed head's copy of them (kernels/token_match.py) against their
references and hand-read cases.

Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs compiled.
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.token_match import match_lists_fwd, match_lists_ref, token_match_fwd, token_match_ref
from triton_env import DEVICE


def _run(ids, rpi, tokens, tail_start, latest, block):
    match_pos = torch.full((tokens.shape[0] + 1, 2 * latest), -7, dtype=torch.int32, device=DEVICE)
    match_cnt = torch.full((tokens.shape[0] + 1,), -7, dtype=torch.int32, device=DEVICE)
    token_match_fwd(ids, rpi, tokens, tail_start, match_pos, match_cnt, block=block)
    return match_pos, match_cnt


def test_token_match_reads_a_hand_made_row():
    """Newest first; an occurrence followed by the token itself lists no successor (the next occurrence is listed),
    nor does one just below the tail; positions at or past the tail are never read; entries past the count stay."""
    row = [5, 9, 9, 1, 9, 2, 9, 9, 3]  # the tail starts at 7: positions 7 and 8 are the tail's
    ids = torch.zeros(2, 16, dtype=torch.int32, device=DEVICE)
    ids[1, : len(row)] = torch.tensor(row, dtype=torch.int32)
    one = lambda v, dtype=torch.int64: torch.tensor([v], dtype=dtype, device=DEVICE)  # noqa: E731
    match_pos, match_cnt = _run(ids, one(1), one(9), one(7, torch.int32), latest=3, block=4)
    assert match_cnt[:2].tolist() == [6, -7]
    assert match_pos[0].tolist() == [6, -1, 4, 5, 2, 3]  # 6 + 1 is the tail's; 1 (the oldest) is past latest = 3
    assert (match_pos[1] == -7).all()
    match_pos, match_cnt = _run(ids, one(1), one(9), one(7, torch.int32), latest=8, block=4)
    assert match_cnt[0] == 8 and match_pos[0, :8].tolist() == [6, -1, 4, 5, 2, 3, 1, -1]
    assert (match_pos[0, 8:] == -7).all()


@pytest.mark.parametrize("latest, block", [(4, 16), (32, 64), (64, 1024)])
def test_token_match_equals_its_reference(latest, block):
    g = torch.Generator().manual_seed(latest)
    ids = torch.randint(0, 6, (7, 300), generator=g, dtype=torch.int32).to(DEVICE)
    rpi = torch.tensor([3, 1, 5, 0, 6], device=DEVICE)
    tokens = torch.tensor([2, 4, 1, 3, 99], device=DEVICE)  # 99: never in the row
    tail_start = torch.tensor([250, 7, 0, 300, 120], dtype=torch.int32, device=DEVICE)
    match_pos, match_cnt = _run(ids, rpi, tokens, tail_start, latest, block)
    ref = token_match_ref(ids.cpu(), rpi.cpu(), tokens.cpu(), tail_start.cpu(), latest)
    assert match_cnt[:5].tolist() == [len(r) for r in ref]
    for b, expected in enumerate(ref):
        assert match_pos[b, : len(expected)].tolist() == expected
    assert match_cnt[2] == 0 and match_cnt[4] == 0
    assert match_cnt[0] == 2 * min(latest, int((ids[3, :250] == 2).sum()))  # capped at latest where more occur


def test_token_match_refuses_buffers_it_cannot_fill():
    ids = torch.zeros(2, 8, dtype=torch.int32, device=DEVICE)
    one = torch.zeros(1, dtype=torch.int64, device=DEVICE)
    cnt = torch.zeros(1, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="2 x latest"):
        token_match_fwd(ids, one, one, one, torch.zeros(1, 3, dtype=torch.int32, device=DEVICE), cnt)
    with pytest.raises(ValueError, match="int32"):
        token_match_fwd(ids.long(), one, one, one, torch.zeros(1, 4, dtype=torch.int32, device=DEVICE), cnt)


def test_each_listed_head_gets_the_matches_its_plan_lacks():
    """Row 0 of the plans holds, in layer 1's head 0 (group 2 of 2 x 2), positions 5 and 9: that head's copy of
    request 0's list drops them, head 1's keeps them; entries past each count stay as they were."""
    sel_pos = torch.full((2, 4, 6), -1, dtype=torch.int32, device=DEVICE)
    sel_pos[0, 2, :3] = torch.tensor([5, 9, 30], dtype=torch.int32)
    sel_pos[0, 3, :2] = torch.tensor([6, 11], dtype=torch.int32)
    sel_cnt = torch.tensor([3, 0], dtype=torch.int32, device=DEVICE)
    match_pos = torch.tensor([[9, 10, 5, 6, -1, 3], [4, 5, 0, 0, 0, 0]], dtype=torch.int32, device=DEVICE)
    match_cnt = torch.tensor([5, 2], dtype=torch.int32, device=DEVICE)
    lists = torch.full((2, 3, 6), -7, dtype=torch.int32, device=DEVICE)
    rows, groups = torch.tensor([0, 1], device=DEVICE), torch.tensor([2, 3], dtype=torch.int32, device=DEVICE)
    match_lists_fwd(match_pos, match_cnt, sel_pos, sel_cnt, rows, groups, lists)
    assert lists[0, 0].tolist() == [-1, 10, -1, 6, -1, -7] and lists[1, 0].tolist() == [9, 10, 5, -1, -1, -7]
    assert lists[0, 1].tolist() == lists[1, 1].tolist() == [4, 5, -7, -7, -7, -7]  # row 1's plan is empty
    assert (lists[:, 2] == -7).all()


@pytest.mark.parametrize("shared", [False, True])
def test_match_lists_equal_their_reference(shared):
    """Lists longer than a program's block of entries, plans longer than its chunk, padded plans (-1 entries below
    the count) and counts beyond the plan's width, for per-head plans and one set shared by every head."""
    g = torch.Generator().manual_seed(7 + shared)
    rows, groups_n, kmax, width, bs = 5, 1 if shared else 6, 150, 160, 4
    sel_pos = torch.randint(-1, 200, (rows, groups_n, kmax), generator=g, dtype=torch.int32).to(DEVICE)
    sel_cnt = torch.tensor([150, 0, 70, 999, 3], dtype=torch.int32, device=DEVICE)  # 999: clamped to kmax
    match_pos = torch.randint(-1, 200, (bs + 1, width), generator=g, dtype=torch.int32).to(DEVICE)
    match_cnt = torch.tensor([160, 0, 65, 7, 3], dtype=torch.int32, device=DEVICE)
    rpi = torch.tensor([3, 0, 2, 4], device=DEVICE)
    groups = torch.tensor([5, 0, 3], dtype=torch.int32, device=DEVICE)
    lists = torch.full((3, bs + 1, width), -7, dtype=torch.int32, device=DEVICE)
    match_lists_fwd(match_pos, match_cnt, sel_pos, sel_cnt, rpi, groups, lists)
    ref = match_lists_ref(match_pos.cpu(), match_cnt.cpu(), sel_pos.cpu(), sel_cnt.cpu(), rpi.cpu(), groups.cpu())
    for i in range(3):
        for b in range(bs):
            n = int(match_cnt[b])
            assert lists[i, b, :n].tolist() == ref[i][b]
            assert (lists[i, b, n:] == -7).all()
    assert any(-1 in ref[i][0] and ref[i][0] != match_pos[0].tolist() for i in range(3))  # some were dropped
    assert (lists[:, bs] == -7).all()


def test_match_lists_refuse_buffers_that_do_not_fit():
    pos = torch.zeros(2, 8, dtype=torch.int32, device=DEVICE)
    cnt = torch.zeros(2, dtype=torch.int32, device=DEVICE)
    sel = torch.zeros(2, 3, 4, dtype=torch.int32, device=DEVICE)
    rows, groups = torch.zeros(2, dtype=torch.int64, device=DEVICE), torch.zeros(2, dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="lists must be int32"):
        match_lists_fwd(pos, cnt, sel, cnt, rows, groups, torch.zeros(1, 2, 8, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous rows"):
        match_lists_fwd(pos, cnt, sel, cnt, rows, groups, torch.zeros(2, 2, 6, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="sel_pos must be int32"):
        match_lists_fwd(pos, cnt, sel.long(), cnt, rows, groups, torch.zeros(2, 2, 8, dtype=torch.int32, device=DEVICE))
