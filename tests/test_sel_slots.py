"""A round's selections as slots (kernels/sel_slots.py) against its reference, and the draft kernel reading them:
the same output as through the positions.

Without a GPU the kernels run in Triton's CPU interpreter (see triton_env.py); with CUDA they run compiled.
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.sel_slots import sel_slots_fwd, sel_slots_ref
from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd
from triton_env import DEVICE

from kernel_cases import decode_case


def _by_request_row(case: dict) -> dict:
    """The case with its plans moved to each request's req_to_token row, as the server keeps them (PlanState rows
    are req_pool_indices)."""
    rows, rpi = case["sel_rows"], case["req_pool_indices"]
    n = case["req_to_token"].shape[0]
    sel_pos = torch.full((n, *case["sel_pos"].shape[1:]), -1, dtype=torch.int32, device=DEVICE)
    sel_cnt = torch.zeros(n, dtype=torch.int32, device=DEVICE)
    sel_pos[rpi], sel_cnt[rpi] = case["sel_pos"][rows], case["sel_cnt"][rows]
    return {**case, "sel_pos": sel_pos, "sel_cnt": sel_cnt, "sel_rows": rpi}


SPECS = [
    (150, 90, 40, 3),  # a few selections at or past the tail start: dropped
    (40, 33, 0, 0),  # no selections
    (70, 60, 48, 0),  # the full budget
    (25, 25, 5, 0),  # no tail
    (30, 0, 6, 0),  # a dense row (tail from 0): every selection dropped
]


@pytest.mark.parametrize("kmax, h_kv", [(48, 2), (1100, 1)])  # 1100: two tiles of 1024 a program
def test_slots_match_the_reference(kmax: int, h_kv: int) -> None:
    torch.manual_seed(kmax)
    case = _by_request_row(decode_case(2, SPECS, kmax, h_kv=h_kv))
    rows, tail = case["req_pool_indices"], case["tail_start"]
    case["sel_cnt"][rows[1]] = kmax + 7  # a count past Kmax is clamped
    out = torch.full((len(SPECS) + 2, h_kv, kmax), 12345, dtype=torch.int32, device=DEVICE)
    want = out.clone()
    args = (case["sel_pos"], case["sel_cnt"], tail, case["req_to_token"], rows)
    sel_slots_fwd(*args, out)
    sel_slots_ref(*args, want)
    assert torch.equal(out, want)
    assert (out[len(SPECS) :] == 12345).all()  # rows past the batch untouched
    assert (out[4] == -1).all() and (out[0] >= 0).sum() == h_kv * 37  # dense row; 40 - 3 past the tail
    slot_of = case["req_to_token"][rows[0]].long()
    got = out[0, 0][out[0, 0] >= 0].long()
    kept = case["sel_pos"][rows[0], 0, :40].long()
    assert torch.equal(got, slot_of[kept[kept < 90]])


@pytest.mark.parametrize("num_kv_splits", [1, 3])
def test_the_draft_kernel_reads_slots_as_it_reads_positions(num_kv_splits: int) -> None:
    torch.manual_seed(7 + num_kv_splits)
    case = _by_request_row(decode_case(3, SPECS, 48))
    slots = torch.empty((len(SPECS), *case["sel_pos"].shape[1:]), dtype=torch.int32, device=DEVICE)
    rows = case["req_pool_indices"]
    sel_slots_fwd(case["sel_pos"], case["sel_cnt"], case["tail_start"], case["req_to_token"], rows, slots)
    by_positions = sparse_decode_fwd(o=torch.empty_like(case["q"]), num_kv_splits=num_kv_splits, block_n=16, **case)
    on_slots = {**case, "sel_pos": slots, "sel_cnt": case["sel_cnt"][rows], "sel_rows": None}
    by_slots = sparse_decode_fwd(
        o=torch.empty_like(case["q"]), num_kv_splits=num_kv_splits, block_n=16, sel_slots=True, **on_slots
    )
    assert torch.equal(by_slots, by_positions)
    # read as positions, the same lists attend other tokens: the flag is what makes them slots
    wrong = sparse_decode_fwd(o=torch.empty_like(case["q"]), num_kv_splits=num_kv_splits, block_n=16, **on_slots)
    assert not torch.equal(wrong, by_positions)
