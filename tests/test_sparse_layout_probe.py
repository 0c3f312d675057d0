"""The sparse layout probe (tools/sparse_layout_probe.py): its three launches attend the same K/V bytes in the same
order, so their outputs agree; a table that misses the KV head's row offset does not.

Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs compiled.
"""

from __future__ import annotations

import pytest
import torch
from triton_env import DEVICE

from tools import kernels_setup, sparse_layout_probe
from tools.kernels_setup import Shape

SHAPE = Shape("tiny-qwen3", 4, 2, 32, 2, qk_norm=True)


@pytest.fixture()
def layouts(monkeypatch: pytest.MonkeyPatch) -> sparse_layout_probe.Layouts:
    for module in (kernels_setup, sparse_layout_probe):  # the probe allocates on its modules' DEVICE
        monkeypatch.setattr(module, "DEVICE", DEVICE)
    torch.manual_seed(0)
    return sparse_layout_probe.Layouts(SHAPE, bs=3, seq_len=80, layers=1)


def test_the_three_layouts_attend_the_same_rows(layouts: sparse_layout_probe.Layouts) -> None:
    assert layouts.selected == 4 and layouts.rows.shape == (3 * 2, 4 + kernels_setup.TAIL)
    diffs = sparse_layout_probe.outputs_agree(layouts)
    assert set(diffs) == {"slots", "compact"}
    assert max(diffs.values()) < 1e-3, diffs


def test_rows_without_the_heads_offset_attend_other_bytes(layouts: sparse_layout_probe.Layouts) -> None:
    """The check above can fail: every KV head reading head 0's part of its slots changes head 1's rows' output."""
    layouts.rows = (layouts.rows // SHAPE.h_kv) * SHAPE.h_kv
    launch = layouts.launches["slots"]
    launch.table = layouts.rows.to(torch.int32)
    diffs = sparse_layout_probe.outputs_agree(layouts)
    assert diffs["slots"] > 1e-2 and diffs["compact"] > 1e-2, diffs


def test_the_sweeps_compact_launch_attends_each_rows_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the prologue, row r of the compact launch attends exactly its n consecutive pool rows."""
    for module in (kernels_setup, sparse_layout_probe):
        monkeypatch.setattr(module, "DEVICE", DEVICE)
    torch.manual_seed(1)
    bs, n, d = 2, 40, SHAPE.d
    launch = sparse_layout_probe.compact_launch(SHAPE, bs, n, prologue=False)
    launch.tiles = (16, 2, 2)
    k, v = (torch.randn(bs * SHAPE.h_kv * n, d, device=DEVICE, dtype=torch.bfloat16) for _ in range(2))
    got = launch.run(k, v, torch.empty_like(launch.q)).float()
    q = launch.q.float()  # [rows, group, D]
    kr, vr = k.float().view(-1, n, d), v.float().view(-1, n, d)
    want = torch.softmax(q @ kr.transpose(1, 2) * d**-0.5, dim=-1) @ vr
    torch.testing.assert_close(got, want, atol=2e-2, rtol=2e-2)
