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


def test_the_cuda_chains_phase_table_follows_the_chain(monkeypatch: pytest.MonkeyPatch) -> None:
    """tools/persistent_chain_cuda.py's table, one row a GEMM: each phase reads the buffer the one before wrote
    (qkv x, o qkv's output, gate/up o's, down gate/up's and writes x again), with its leading dimensions, N and K;
    a width the kernel's tiles do not divide is refused."""
    from tools import persistent_chain_cuda as cuda_chain

    chain = object.__new__(gemm_chain.Chain)
    shapes = {"qkv": (256, 128), "o": (128, 128), "gate_up": (512, 128), "down": (128, 256)}
    chain.weights = [{name: torch.zeros(n, k, dtype=torch.bfloat16) for name, (n, k) in shapes.items()}
                     for _ in range(2)]  # fmt: skip
    x = torch.zeros(64, 128, dtype=torch.bfloat16)
    outs = [torch.zeros(64, n, dtype=torch.bfloat16) for n in (256, 128, 512)]
    table = cuda_chain.phase_table(chain, x, outs).tolist()
    reads = [x, outs[0], outs[1], outs[2]]
    writes = [outs[0], outs[1], outs[2], x]
    expected = [
        [layer[name].data_ptr(), reads[p].data_ptr(), writes[p].data_ptr(), reads[p].stride(0), writes[p].stride(0),
         *shapes[name]]
        for layer in chain.weights for p, name in enumerate(gemm_chain.CHAIN)
    ]  # fmt: skip
    assert table == expected
    chain.weights[1]["o"] = torch.zeros(128, 96, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"o \[128, 96\]"):
        cuda_chain.phase_table(chain, x, outs)
