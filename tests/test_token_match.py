"""The draft step's token matches (kernels/token_match.py) against their reference and a hand-read case.

Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs compiled.
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.token_match import token_match_fwd, token_match_ref
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
