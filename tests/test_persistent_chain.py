"""The persistent GEMM chain probe (tools/persistent_chain.py) computes the chain that cuBLAS computes: every
layer's four GEMMs in order, split-K tiles summed once by their last unit, the counters back at 0 after a launch.

Without a GPU it runs in Triton's CPU interpreter with one program (the interpreter runs programs one after another,
so a barrier that waits for a second program would never return), on SmolLM2-135M's layer sizes; with CUDA, compiled
with several programs.
"""

from __future__ import annotations

import pytest
import torch
from triton_env import DEVICE, INTERPRET

from tools import gemm_chain, persistent_chain

# Every phase split (and one not): SmolLM2's K of 576 and 1536 in three slices of 64-column steps.
CONFIG = {"qkv": (32, 3), "o": (32, 1), "gate_up": (64, 3), "down": (32, 3)}


@pytest.mark.parametrize(("per_layer", "tma"), [(False, False), (True, False), (False, True)])
def test_the_persistent_chain_computes_the_chain(monkeypatch: pytest.MonkeyPatch, per_layer: bool, tma: bool) -> None:
    monkeypatch.setattr(gemm_chain, "DEVICE", DEVICE)
    torch.manual_seed(0)
    chain = gemm_chain.Chain("smollm2-135m", 4)
    chain.weights = chain.weights[:2]
    chain.run("cublas")
    expected = chain.x.float().clone()
    probe = persistent_chain.PersistentChain(chain, CONFIG, block_k=64, stages=2)
    programs = 1 if INTERPRET else 8
    for _ in range(2):  # a second launch starts from the counters the first left
        got = probe.run(programs, per_layer=per_layer, tma=tma).float()
        # rounding only, the interpreter's bf16 truncation on each of the 8 GEMMs' stores included (gemm_chain's bound)
        assert ((got - expected).norm() / expected.norm()).item() < 5e-2
        assert probe.counter.item() == 0 and not probe.tiles.any()
    assert ((chain.x0.float() - expected).norm() / expected.norm()).item() > 0.5  # the bound means something


def test_a_config_that_does_not_divide_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gemm_chain, "DEVICE", "cpu")
    chain = gemm_chain.Chain("smollm2-135m", 4)
    chain.weights = chain.weights[:1]
    with pytest.raises(ValueError, match="o \\[576, 576\\]"):
        persistent_chain.PersistentChain(chain, {**CONFIG, "o": (32, 2)}, block_k=64)


def _small_chain() -> gemm_chain.Chain:
    """Three layers (the third reuses the first's output buffers) whose widths the CUDA kernel's 128-column units
    and pairs of 128-column chunks divide (hidden 512)."""
    chain = object.__new__(gemm_chain.Chain)
    shapes = {"qkv": (512, 512), "o": (256, 512), "gate_up": (1024, 256), "down": (512, 512)}
    chain.weights = [{name: torch.randn(n, k).bfloat16() / k**0.5 for name, (n, k) in shapes.items()}
                     for _ in range(3)]  # fmt: skip
    chain.x0 = torch.randn(64, 512).bfloat16()
    return chain


def test_the_cuda_chains_phase_table_follows_the_chain() -> None:
    """tools/persistent_chain_cuda.py's table, one row a GEMM: each phase reads the buffer the one before wrote (qkv
    x, then down's output), outputs alternating between two sets by layer parity, with leading dimensions, N, K, K
    slices, the rotation that starts its units where the previous phase's ended, where its tile counters start and,
    from the second layer on, the buffer the phase four on adds into (cleared at its start); a width the kernel's
    units do not divide is refused."""
    from tools import persistent_chain_cuda as cuda_chain

    torch.manual_seed(0)
    chain = _small_chain()
    buffers = cuda_chain.Buffers(chain)
    splits, grid = (2, 2, 1, 2), 5
    table = cuda_chain.phase_table(chain, buffers, splits, grid).tolist()
    assert len(table) == 12
    units = tiles = 0
    for p, row in enumerate(table):
        layer, name = divmod(p, 4)
        w = chain.weights[layer][gemm_chain.CHAIN[name]]
        n, k = w.shape
        src = buffers.x if p == 0 else buffers.outs[(p - 1) // 4 % 2][(p - 1) % 4]
        dst = buffers.outs[layer % 2][name]
        clear = buffers.outs[(layer + 1) % 2][name] if 4 <= p < 8 else None
        assert row == [w.data_ptr(), src.data_ptr(), dst.data_ptr(), src.stride(0), dst.stride(0), n, k, splits[name],
                       units % grid, tiles, clear.data_ptr() if clear is not None else 0,
                       clear.numel() if clear is not None else 0]  # fmt: skip
        units += n // 128 * splits[name]
        tiles += n // 128
    with pytest.raises(ValueError, match=r"o \[256, 512\]: N a multiple of 128, K of 4 x 256"):
        cuda_chain.phase_table(chain, buffers, (2, 4, 1, 2), grid)


@pytest.mark.parametrize(("grid", "seed"), [(1, None), (3, None), (7, None), (5, 0), (5, 1), (5, 2)])
def test_the_cuda_chains_plan_computes_the_chain(grid: int, seed: int | None) -> None:
    """The kernel's plan (its units over the CTAs, K split and added into fp32, outputs by layer parity, each
    buffer cleared before the layer after next adds into it) gives the chain's output, every unit run once: phase
    by phase, and in random orders that keep only the kernel's waits (a unit runs once the tiles it reads are done,
    not the whole previous phase)."""
    from tools import persistent_chain_cuda as cuda_chain

    torch.manual_seed(0)
    chain = _small_chain()
    x = chain.x0
    for layer in chain.weights:  # the chain as cuBLAS runs it: bf16 outputs, each GEMM reading the one before's
        qkv = (x.float() @ layer["qkv"].float().T).bfloat16()
        o = (qkv[:, :512].float() @ layer["o"].float().T).bfloat16()
        gate_up = (o.float() @ layer["gate_up"].float().T).bfloat16()
        x = (gate_up[:, :512].float() @ layer["down"].float().T).bfloat16()
    got = cuda_chain.simulate(chain, (2, 2, 1, 2), grid, seed)
    assert ((got - x.float()).norm() / x.float().norm()).item() < 1e-2
    assert ((chain.x0.float() - x.float()).norm() / x.float().norm()).item() > 0.5  # the bound means something
