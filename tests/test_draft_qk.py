"""Draft steps' q/k norm and rotary embedding inside the sparse kernel (patches/draft_qk.py): the hooks defer only a
plain RMS norm of whole heads and a plain neox rotation, inside ``deferred_qk()``; the kernel's references are
SGLang's own math; a rotation SGLang must do runs after the norm deferred before it; the draft runner defers for the
listed decoder classes only."""

from __future__ import annotations


import pytest
import torch
from sglang.srt.layers.layernorm import RMSNorm
from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding, apply_rotary_emb
from sglang_sparsespec.kernels.qk_prologue import rms_norm_ref, rope_neox_ref
from sglang_sparsespec.patches import draft_qk as dq
from triton_env import DEVICE

HEAD = 64


def _rotary(neox: bool = True, rotary_dim: int = HEAD) -> RotaryEmbedding:
    """SGLang's RotaryEmbedding with the fields its CUDA and native paths read (its __init__ needs a published
    server configuration), and its cache as it computes it: cos | sin of position x base^(-2i / rotary dim)."""
    rotary = RotaryEmbedding.__new__(RotaryEmbedding)
    rotary.head_size, rotary.rotary_dim, rotary.max_position_embeddings = HEAD, rotary_dim, 256
    rotary.base, rotary.is_neox_style, rotary.use_fallback_kernel = 10000, neox, False
    inv_freq = 1.0 / 10000 ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32) / rotary_dim)
    angles = torch.arange(256, dtype=torch.float32)[:, None] * inv_freq[None, :]
    rotary.cos_sin_cache = torch.cat([angles.cos(), angles.sin()], dim=-1).to(DEVICE)
    return rotary


def _norm(eps: float = 1e-6, seed: int = 0, **fields) -> RMSNorm:
    """SGLang's RMSNorm over one head with the fields its native path reads (its __init__ needs a published
    server configuration)."""
    norm = RMSNorm.__new__(RMSNorm)
    torch.nn.Module.__init__(norm)
    norm.weight = torch.nn.Parameter(torch.rand(HEAD, generator=torch.Generator().manual_seed(seed)) + 0.5)
    norm.variance_epsilon, norm.hidden_size, norm.has_weight = eps, HEAD, True
    norm.cast_x_before_out_mul, norm.variance_size_override, norm.override_orig_dtype = False, None, None
    norm.fp32_residual = False
    for name, value in fields.items():
        setattr(norm, name, value)
    return norm


def test_the_kernels_norm_is_sglangs_rms_norm():
    norm = _norm(eps=1e-5)
    x = (torch.randn(7, HEAD, generator=torch.Generator().manual_seed(3)) * 4).to(torch.bfloat16)
    with torch.no_grad():
        want = RMSNorm.forward_native(norm, x)
        torch.testing.assert_close(rms_norm_ref(x, norm.weight, 1e-5), want, rtol=0, atol=0)


def test_the_kernels_rotation_is_sglangs_neox_rotation():
    rotary = _rotary()
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(5, 3 * HEAD, generator=gen)
    k = torch.randn(5, HEAD, generator=gen)
    pos = torch.tensor([0, 7, 31, 200, 255])
    rotary.cos_sin_cache = rotary.cos_sin_cache.cpu()
    rotary._apply_rotary_emb_wrapped = apply_rotary_emb
    want_q, want_k = RotaryEmbedding.forward_native(rotary, pos, q.clone(), k.clone())
    got_q = rope_neox_ref(q.view(5, 3, HEAD), rotary.cos_sin_cache, pos)
    got_k = rope_neox_ref(k.view(5, 1, HEAD), rotary.cos_sin_cache, pos)
    torch.testing.assert_close(got_q.reshape(5, -1), want_q.reshape(5, -1))
    torch.testing.assert_close(got_k.reshape(5, -1), want_k.reshape(5, -1))


def test_only_plain_norms_and_neox_rotations_inside_a_draft_step_are_deferred():
    calls = []

    def rope(rotary, positions, query, key, *args, **kwargs):
        calls.append("rope")
        return query + 1, key + 1

    def norm(q, k, q_norm, k_norm, head_dim, *args, **kwargs):
        calls.append("norm")
        return q * 2, k * 2

    rotary = _rotary()
    pos, q, k = (t.to(DEVICE) for t in (torch.arange(2), torch.zeros(2, HEAD), torch.zeros(2, HEAD)))
    assert dq.defer_draft_rope(rope, rotary, pos, q, k)[0].eq(1).all()  # outside a draft step
    assert dq.defer_draft_qk_norm(norm, q + 1, k, _norm(), _norm(), HEAD)[0].eq(2).all()
    assert calls == ["rope", "norm"] and dq.take_deferred() is None
    calls.clear()
    with dq.deferred_qk():
        out = dq.defer_draft_qk_norm(norm, q, k, q_norm=_norm(), k_norm=_norm(eps=1e-5), head_dim=HEAD, alt_stream=None)
        assert out[0] is q and out[1] is k
        out = dq.defer_draft_rope(rope, rotary, pos, q, k, None, fused_set_kv_buffer_arg=None)
        assert out[0] is q and out[1] is k and calls == []
        pending = dq.take_deferred()
        assert pending.rope.cos_sin is rotary.cos_sin_cache and pending.rope.positions is pos
        assert (pending.norm.q_eps, pending.norm.k_eps) == (1e-6, 1e-5)
        assert dq.take_deferred() is None  # taken once
        done = pending.apply(q + 1, k + 1)  # SGLang's own calls, in the model's order: norm, then rotation
        assert calls == ["norm", "rope"] and done[0].eq(3).all()
        calls.clear()
        for rot, args, kwargs in (
            (rotary, (torch.zeros(2, dtype=torch.int64, device=DEVICE),), {}),  # offsets
            (rotary, (), {"fused_set_kv_buffer_arg": {"value": None}}),  # SGLang stores K/V in its rope kernel
            (_rotary(neox=False), (), {}),
            (_rotary(rotary_dim=HEAD // 2), (), {}),
        ):
            dq.defer_draft_rope(rope, rot, pos, q, k, *args, **kwargs)
            assert dq.take_deferred() is None
        assert calls == ["rope"] * 4
        calls.clear()
        # A rotation SGLang does itself follows the norm the model deferred before it.
        dq.defer_draft_qk_norm(norm, q, k, _norm(), _norm(), HEAD)
        assert dq.defer_draft_rope(rope, _rotary(neox=False), pos, q, k)[0].eq(1).all()
        assert calls == ["norm", "rope"] and dq.take_deferred() is None
        calls.clear()
        for odd in ({"cast_x_before_out_mul": True}, {"variance_size_override": 32}, {"has_weight": False}):
            dq.defer_draft_qk_norm(norm, q, k, _norm(), _norm(**odd), HEAD)
        dq.defer_draft_qk_norm(norm, q, k, _norm(), _norm(), HEAD // 2)  # a norm over part of a head
        assert calls == ["norm"] * 4 and dq.take_deferred() is None
        dq.defer_draft_qk_norm(norm, q, k, _norm(), _norm(), HEAD)
        dq.defer_draft_rope(rope, rotary, pos, q, k)
    assert dq.take_deferred() is None  # a step's leftover never reaches the next forward


def test_the_loaded_plugin_defers_sglangs_calls_in_draft_steps_only():
    from sglang.srt.models import qwen3
    from sglang.srt.plugins import load_plugins

    load_plugins()
    rotary = _rotary()
    gen = torch.Generator().manual_seed(2)
    pos, q, k = torch.tensor([3, 9]), torch.randn(2, 2 * HEAD, generator=gen), torch.randn(2, HEAD, generator=gen)
    pos, q, k = pos.to(DEVICE), q.to(DEVICE), k.to(DEVICE)
    with dq.deferred_qk():
        normed = qwen3.apply_qk_norm(q=q, k=k, q_norm=_norm(), k_norm=_norm(), head_dim=HEAD, alt_stream=None)
        got = RotaryEmbedding.forward_cuda(rotary, pos, q, k)
        pending = dq.take_deferred()
    assert normed[0] is q and got[0] is q and got[1] is k
    assert torch.equal(pending.rope.positions, pos) and pending.norm is not None


@pytest.mark.parametrize(
    "model_name, in_kernel", [("Qwen3ForCausalLM", True), ("FakeModel", True), ("Qwen3ForCausalLM", False)]
)
def test_the_draft_runner_defers_qk_calls_in_draft_steps_of_listed_models_only(monkeypatch, model_name, in_kernel):
    """Draft steps defer the q/k calls only for a decoder class in QK_IN_KERNEL whose backend stores K/V
    in-kernel; the plain step never does."""
    import test_draft_runner
    from test_draft_runner import FakeBackend, FakeModel, probe_forwards

    monkeypatch.setattr(test_draft_runner, "FakeModel", type(model_name, (FakeModel,), {}))  # the runner's model
    monkeypatch.setattr(FakeBackend, "stores_in_kernel", in_kernel)
    deferred = model_name in dq.QK_IN_KERNEL and in_kernel
    assert probe_forwards(monkeypatch, dq._DEFER.get) == [deferred, deferred, False]


@pytest.mark.parametrize("prologue, fused", [("fused", True), ("sglang", False)])
def test_the_draft_prologue_knob_reaches_the_draft_backend(monkeypatch, prologue, fused):
    """--pillar-draft-prologue sglang keeps SGLang's own store, q/k norm and rotary kernels in draft steps."""
    from sglang_sparsespec.modes import Prologue
    from sglang_sparsespec.patches import draft_runner
    from test_draft_runner import FakeBackend, make_runner

    given: list[bool] = []

    class Recording(FakeBackend):
        def __init__(self, *args, fused: bool = True, **kwargs):
            super().__init__(*args, **kwargs)
            given.append(fused)

    monkeypatch.setattr(draft_runner, "PillarDraftBackend", Recording)
    make_runner([], draft_prologue=Prologue(prologue))
    assert given == [fused]
