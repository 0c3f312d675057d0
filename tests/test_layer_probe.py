"""The layer probe's L2 prefetch kernel (tools/layer_probe.py) against its reference: shares that end in a partial
tile, and programs left with no share at all.

Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs compiled.
"""

from __future__ import annotations

import pytest
import torch
from tools.layer_probe import prefetch_l2, prefetch_ref
from triton_env import DEVICE


@pytest.mark.parametrize("programs, block", [(4, 64), (8, 512)])  # (8, 512): programs 5-7 have nothing to read
def test_prefetch_sums_each_programs_share(programs: int, block: int) -> None:
    w = torch.randn(70, 33, generator=torch.Generator().manual_seed(programs)).to(torch.bfloat16).to(DEVICE)
    sums = torch.full((programs,), float("nan"), device=DEVICE)
    prefetch_l2(w, sums, block=block)
    torch.testing.assert_close(sums, prefetch_ref(w, programs, block=block), rtol=1e-4, atol=1e-3)
    assert prefetch_ref(w, programs, block=block).sum().item() == pytest.approx(w.float().sum().item(), abs=1e-2)


def test_prefetch_refuses_a_strided_weight() -> None:
    w = torch.randn(8, 64, device=DEVICE).to(torch.bfloat16)
    with pytest.raises(ValueError, match="contiguous"):
        prefetch_l2(w[:, :32], torch.zeros(2, device=DEVICE))
