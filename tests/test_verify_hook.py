"""patches/triton_verify.py: the forward_extend hook routes PILLAR's verify attention.

The hook is exercised the way SGLang calls it: ``original`` stands for
TritonAttnBackend.forward_extend and calls ``backend.extend_attention_fwd`` with SGLang's
positional layout; the inner kernel is SGLang's real extend kernel (Triton interpreter on CPU).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang_sparsespec.patches.triton_verify import (
    ExtendCall,
    VerifyHooks,
    attach_verify,
    pillar_verify,
    signature_gap,
    split_kernel_gap,
)
from triton_env import DEVICE

from sglang_sparsespec.selection.scores import VerifyScoreSink

D, H_KV, GROUP, N_EXT = 32, 2, 3, 4
PREFIX = [40, 7, 90]


class _Backend(TritonAttnBackend):
    # A Triton backend (attach_verify accepts no other) without the model runner its __init__ reads.
    def __init__(self, hooks: VerifyHooks | None):
        self.calls: list[dict] = []

        def sglang_kernel(*a, **kw):
            self.calls.append(kw)
            return extend_attention_fwd(*a, **kw)

        self.extend_attention_fwd = sglang_kernel
        if hooks is not None:
            attach_verify(self, hooks)


def _batch(seed: int):
    torch.manual_seed(seed)
    total, bs = sum(PREFIX), len(PREFIX)
    t = bs * N_EXT
    k_buffer, v_buffer = (torch.randn(total + 8, H_KV, D, device=DEVICE).to(torch.bfloat16) for _ in range(2))
    q = torch.randn(t, H_KV * GROUP, D, device=DEVICE).to(torch.bfloat16)
    k_ext, v_ext = (torch.randn(t, H_KV, D, device=DEVICE).to(torch.bfloat16) for _ in range(2))
    qo_indptr = torch.arange(0, t + 1, N_EXT, dtype=torch.int32, device=DEVICE)
    kv_indptr = torch.tensor([0, *torch.tensor(PREFIX).cumsum(0).tolist()], dtype=torch.int32, device=DEVICE)
    kv_indices = (torch.randperm(total + 7, device=DEVICE)[:total] + 1).to(torch.int64)
    return q, k_ext, v_ext, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices


def _forward(backend, verify: bool, sliding_window_size: int = -1, seed: int = 0) -> torch.Tensor:
    """One layer's forward_extend through the hook; returns the attention output."""
    q, k_ext, v_ext, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices = _batch(seed)
    o = torch.full_like(q, float("nan"))

    def original(be, q_, k_, v_, layer, forward_batch):
        # TritonAttnBackend.forward_extend's call (chain mask omitted: topk=1 verify is causal).
        be.extend_attention_fwd(
            q_,
            k_,
            v_,
            o,
            k_buffer,
            v_buffer,
            qo_indptr,
            kv_indptr,
            kv_indices,
            None,
            True,
            None,
            N_EXT,
            1.0,
            1.0,
            D**-0.5,
            logit_cap=0.0,
            sliding_window_size=sliding_window_size,
            sinks=None,
            window_kv_offsets=None,
            xai_temperature_len=-1,
            page_size=1,
            score_mod=None,
            aux_tensors=None,
        )
        return o

    mode = SimpleNamespace(is_target_verify=lambda: verify)
    layer = SimpleNamespace(layer_id=1, scaling=D**-0.5)
    return pillar_verify(original, backend, q, k_ext, v_ext, layer, SimpleNamespace(forward_mode=mode))


def test_split_kernel_replaces_sglang_kernel_with_the_same_output():
    reference = _forward(_Backend(None), verify=True)
    backend = _Backend(VerifyHooks(sink=None, split_kernel=True))
    router = backend.extend_attention_fwd
    out = _forward(backend, verify=True)
    assert backend.calls == [] and backend.extend_attention_fwd is router  # SGLang's kernel not called
    torch.testing.assert_close(out.float(), reference.float(), rtol=2e-2, atol=2e-2)


def test_the_router_is_installed_once_and_passes_other_calls_through():
    hooks = VerifyHooks(sink=None, split_kernel=True)
    backend = _Backend(hooks)
    router = backend.extend_attention_fwd
    attach_verify(backend, hooks)
    assert backend.extend_attention_fwd is router
    # Called outside a TARGET_VERIFY forward_extend (a prefill on the same backend): SGLang's kernel.
    q, k_ext, v_ext, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices = _batch(0)
    o = torch.empty_like(q)
    router(q, k_ext, v_ext, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, None, True, None, N_EXT,
           1.0, 1.0, D**-0.5)  # fmt: skip
    assert len(backend.calls) == 1


def test_sglang_kernel_for_cases_the_split_kernel_does_not_serve():
    # A sliding window and other forward modes go to SGLang's kernel; so does VERIFY_KERNEL=sglang.
    for hooks, kwargs in (
        (VerifyHooks(None, split_kernel=True), {"verify": True, "sliding_window_size": 16}),
        (VerifyHooks(None, split_kernel=True), {"verify": False}),
        (VerifyHooks(None, split_kernel=False), {"verify": True}),
    ):
        backend = _Backend(hooks)
        _forward(backend, **kwargs)
        assert len(backend.calls) == 1, kwargs
    layout = (None,) * 10 + (True, None, 4, 1.0, 1.0, 0.125)
    q, v = torch.empty(1, 1, 64), torch.empty(1, 1, 64)
    args = (q, None, v, *layout[3:])
    assert split_kernel_gap(ExtendCall(args, {})) is None
    assert split_kernel_gap(ExtendCall(args, {"sliding_window_size": 16})) == "a sliding window"
    assert split_kernel_gap(ExtendCall((*args[:13], 0.5, *args[14:]), {})) == "scaled (quantized) KV"
    # The same call with its scales by keyword: arguments are read by name, not by position.
    by_name = ExtendCall(args[:13], {"k_scale": 1.0, "v_scale": 1.0, "sm_scale": 0.125})
    assert split_kernel_gap(by_name) is None and by_name["sm_scale"] == 0.125
    with pytest.raises(TypeError, match="without kv_indices"):
        ExtendCall(args[:8], {})["kv_indices"]


def test_sglang_signature_is_checked():
    # The installed SGLang passes; a kernel whose parameters were renamed is caught at launch.
    assert signature_gap() is None

    def moved(q, k, v, o, k_buffer, v_buffer, qo_indptr, kv_indptr, kv_indices, custom_mask, causal):
        pass

    gap = signature_gap(moved)
    assert gap is not None and "q_extend" in gap and "sm_scale" in gap


def test_scores_captured_with_either_kernel_and_agree():
    masses = {}
    for split in (True, False):
        for last_row_only in (False, True):
            sink = VerifyScoreSink(
                num_layers=2,
                num_kv_heads=H_KV,
                num_q_heads=H_KV * GROUP,
                cap=sum(PREFIX) + 4,
                max_q_rows=len(PREFIX) * N_EXT,
                per_layer=True,
                device=torch.device(DEVICE),
                last_row_only=last_row_only,
            )
            backend = _Backend(VerifyHooks(sink, split_kernel=split))
            _forward(backend, verify=True, seed=3)
            # The split kernel writes the LSE itself; SGLang's kernel is asked for it.
            assert [("lse_extend" in kw) for kw in backend.calls] == ([] if split else [True])
            masses[split, last_row_only] = sink.mass[1, :, : sum(PREFIX)].float().clone()
    assert masses[True, False].sum() > 0
    # Same probabilities up to the two kernels' rounding of the LSE, for either choice of rows.
    for last_row_only in (False, True):
        torch.testing.assert_close(masses[True, last_row_only], masses[False, last_row_only], rtol=1e-2, atol=1e-4)
    assert not torch.allclose(masses[True, True], masses[True, False], rtol=1e-2, atol=1e-4)
