"""The FlashInfer sampling-kernel build at start-up (patches/sampler_warmup.py): each entry SGLang's sampler
uses is called once, as the sampler calls it; the compile runs on a thread of its own from the worker's start
and the load waits for it; whatever FlashInfer's JIT entry points do, the start-up falls back to building at the
end, never fails because of the thread."""

from __future__ import annotations

import logging
import sys
import threading
import types

import pytest
import torch
from sglang_sparsespec.patches import sampler_warmup
from sglang_sparsespec.patches.sampler_warmup import TOP_K_ALL, build_sampling_kernels, compile_ahead, warm_sampling


def test_sampler_warmup_calls_each_flashinfer_entry_as_sglang_does() -> None:
    calls = []
    warm_sampling(
        lambda *a, **kw: calls.append(("top_k_top_p", a, kw)), lambda *a: calls.append(("min_p", a, {})), 7, "cpu"
    )
    (name1, (probs, top_ks, top_ps), kw), (name2, (_, min_ps), _) = calls
    assert (name1, name2, kw) == ("top_k_top_p", "min_p", {"filter_apply_order": "joint"})
    assert probs.shape == (1, 7) and probs.dtype == torch.float32 and float(probs.sum()) == pytest.approx(1.0)
    assert top_ks.dtype == torch.int32 and int(top_ks) == TOP_K_ALL and top_ps.dtype == min_ps.dtype == torch.float32
    # Another backend (or no GPU) builds nothing and imports nothing of SGLang's sampler.
    build_sampling_kernels("pytorch", 7, "cpu")
    build_sampling_kernels("flashinfer", 7, "cpu")


class Spec:
    """FlashInfer's JitSpec as the compile uses it: is_aot, is_compiled, build(verbose)."""

    def __init__(self, compiled: bool = False, fails: bool = False) -> None:
        self.is_aot, self.is_compiled, self.fails = False, compiled, fails
        self.builds: list[tuple[str, bool]] = []
        self.release = threading.Event()  # the build ends when the test says so

    def build(self, verbose: bool) -> None:
        self.builds.append((threading.current_thread().name, verbose))
        assert self.release.wait(10)
        if self.fails:
            raise RuntimeError("Ninja build failed.")


@pytest.fixture
def flashinfer_jit(monkeypatch: pytest.MonkeyPatch):
    """A stand-in ``flashinfer.jit.sampling`` whose gen_sampling_module returns what the test sets."""
    module = types.ModuleType("flashinfer.jit.sampling")
    for name in ("flashinfer", "flashinfer.jit"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "flashinfer.jit.sampling", module)
    return module


def test_the_compile_runs_on_its_own_thread_and_the_load_waits_for_it(
    flashinfer_jit: types.ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = Spec()
    flashinfer_jit.gen_sampling_module = lambda: spec
    thread = compile_ahead("flashinfer", "cuda")
    assert thread is not None and thread.daemon
    loads = []
    monkeypatch.setattr(sampler_warmup, "warm_sampling", lambda *a: loads.append(thread.is_alive()))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    from sglang.srt.layers import sampler  # on CPU it imports no FlashInfer function: stand-ins for both

    for name in ("top_k_top_p_sampling_from_probs", "min_p_sampling_from_probs"):
        monkeypatch.setattr(sampler, name, None, raising=False)
    loader = threading.Thread(target=build_sampling_kernels, args=("flashinfer", 7, "cuda", thread))
    loader.start()
    loader.join(0.2)
    assert loader.is_alive() and not loads  # the load waits while ninja runs
    spec.release.set()
    loader.join(10)
    assert loads == [False] and spec.builds == [("pillar-flashinfer-sampling", False)]


def test_nothing_is_compiled_ahead_where_nothing_needs_it(flashinfer_jit: types.ModuleType) -> None:
    flashinfer_jit.gen_sampling_module = lambda: Spec(compiled=True)
    assert compile_ahead("flashinfer", "cuda") is None  # built before (FlashInfer's cache) or shipped ahead of time
    assert compile_ahead("pytorch", "cuda") is None
    assert compile_ahead("flashinfer", "cpu") is None


def test_a_flashinfer_without_those_entry_points_or_a_failed_compile_leaves_the_build_to_the_end(
    flashinfer_jit: types.ModuleType, caplog: pytest.LogCaptureFixture
) -> None:
    assert compile_ahead("flashinfer", "cuda") is None  # no gen_sampling_module in this FlashInfer
    spec = Spec(fails=True)
    spec.release.set()
    flashinfer_jit.gen_sampling_module = lambda: spec
    with caplog.at_level(logging.WARNING, logger=sampler_warmup.__name__):
        thread = compile_ahead("flashinfer", "cuda")
        thread.join(10)
    assert not thread.is_alive() and "compiling FlashInfer's sampling kernels ahead failed" in caplog.text
