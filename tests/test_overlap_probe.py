"""The overlap probe (tools/overlap_probe.py): its two halves attend to their own requests' KV and give the whole
batch's rows, and its two-stream schedules issue each half's layers in order, whatever the turns between them.

Without a GPU the verify kernel runs in Triton's CPU interpreter (see triton_env.py) and every stream is the current
one; with CUDA it runs compiled.
"""

from __future__ import annotations

import pytest
import torch
from triton_env import DEVICE

from tools import overlap_probe

TINY = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "head_dim": 16,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def _layers(batch: int = 4, context: int = 24, num_layers: int = 2) -> overlap_probe.Layers:
    torch.manual_seed(0)
    return overlap_probe.Layers(TINY, num_layers, batch, context, device=DEVICE)


def test_the_halves_give_the_whole_batchs_rows() -> None:
    """A half whose attention index pointed at another half's requests would move its rows far off the whole
    batch's; the two differ only in the kernel's split count's rounding."""
    layers = _layers()
    whole, a, b = layers.half(0, 4), layers.half(0, 1), layers.half(1, 3)
    for half in (whole, a, b):
        overlap_probe.run_layers(half, 2)
    halves = torch.cat([a.out, b.out]).float()
    torch.testing.assert_close(halves, whole.out.float(), rtol=2e-2, atol=2e-2)
    shifted = layers.half(1, 1)
    shifted.kv_indices = a.kv_indices  # request 1's rows reading request 0's KV
    overlap_probe.run_layers(shifted, 2)
    assert not torch.allclose(shifted.out.float(), whole.out[9:18].float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("turns", [False, True])
def test_two_streams_match_the_halves_one_after_another(turns: bool) -> None:
    layers = _layers()
    a, b = layers.half(0, 2), layers.half(2, 2)
    overlap_probe.run_layers(a, 2)
    overlap_probe.run_layers(b, 2)
    expected = a.out.clone(), b.out.clone()
    a.out.zero_()
    b.out.zero_()
    overlap_probe.two_streams(a, b, 2, side=None, turns=turns)
    assert torch.equal(a.out, expected[0]) and torch.equal(b.out, expected[1])


def test_the_schedules_cover_every_named_one() -> None:
    runs = overlap_probe.schedules(_layers(), 2, side=None)
    assert set(runs) == {*overlap_probe.SCHEDULES, "_outputs"}
    runs["ping_pong"]()
    ping = runs["_outputs"]()
    runs["halves"]()
    assert all(torch.equal(x, y) for x, y in zip(ping, runs["_outputs"]()))
    runs["attention"]()  # the attention alone reads layer 0's q, k, v without a projection of its own
