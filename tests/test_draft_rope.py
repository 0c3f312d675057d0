"""Draft steps' rotary embedding inside the sparse kernel (patches/draft_rope.py): the hook defers only a plain
neox rotation inside ``deferred_rope()``; the kernel's rotation is SGLang's own; a draft step's attention gives the
output and the cache of rotating first, whether it rotates in-kernel or has SGLang's kernel do it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding, apply_rotary_emb
from sglang_sparsespec.kernels.rope import rope_neox_ref
from sglang_sparsespec.patches import draft_rope as dr
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


def test_only_a_plain_neox_rotation_inside_a_draft_step_is_deferred():
    calls = []

    def original(rotary, positions, query, key, *args, **kwargs):
        calls.append((args, kwargs))
        return query + 1, key + 1

    rotary = _rotary()
    pos, q, k = (t.to(DEVICE) for t in (torch.arange(2), torch.zeros(2, HEAD), torch.zeros(2, HEAD)))
    out = dr.defer_draft_rope(original, rotary, pos, q, k)
    assert len(calls) == 1 and out[0].eq(1).all() and dr.take_deferred() is None  # outside a draft step
    with dr.deferred_rope():
        out = dr.defer_draft_rope(original, rotary, pos, q, k, None, fused_set_kv_buffer_arg=None)
        assert out[0] is q and out[1] is k and len(calls) == 1
        pending = dr.take_deferred()
        assert pending.cos_sin is rotary.cos_sin_cache and pending.positions is pos
        assert dr.take_deferred() is None  # taken once
        assert pending.apply(pos, q, k)[0].eq(1).all() and len(calls) == 2  # SGLang's own call, on demand
        for rot, args, kwargs in (
            (rotary, (torch.zeros(2, dtype=torch.int64, device=DEVICE),), {}),  # offsets
            (rotary, (), {"fused_set_kv_buffer_arg": {"value": None}}),  # SGLang stores K/V in its rope kernel
            (_rotary(neox=False), (), {}),
            (_rotary(rotary_dim=HEAD // 2), (), {}),
        ):
            dr.defer_draft_rope(original, rot, pos, q, k, *args, **kwargs)
            assert dr.take_deferred() is None
        assert len(calls) == 6
        dr.defer_draft_rope(original, rotary, pos, q, k)
    assert dr.take_deferred() is None  # a step's leftover never reaches the next forward


def test_the_loaded_plugin_defers_sglangs_rotary_call_in_draft_steps_only():
    from sglang.srt.plugins import load_plugins

    load_plugins()
    rotary = _rotary()
    gen = torch.Generator().manual_seed(2)
    pos, q, k = torch.tensor([3, 9]), torch.randn(2, 2 * HEAD, generator=gen), torch.randn(2, HEAD, generator=gen)
    pos, q, k = pos.to(DEVICE), q.to(DEVICE), k.to(DEVICE)
    with dr.deferred_rope():
        got = RotaryEmbedding.forward_cuda(rotary, pos, q.clone(), k.clone())
        pending = dr.take_deferred()
    assert torch.equal(got[0], q) and torch.equal(got[1], k) and pending is not None
    assert torch.equal(pending.positions, pos)


@pytest.mark.parametrize(
    "model_name, in_kernel", [("Qwen3ForCausalLM", True), ("FakeModel", True), ("Qwen3ForCausalLM", False)]
)
def test_the_draft_runner_defers_rotary_calls_in_draft_steps_of_listed_models_only(monkeypatch, model_name, in_kernel):
    """Draft steps defer the rotary call only for a decoder class in ROPE_IN_KERNEL whose backend stores K/V
    in-kernel; the plain step never does."""
    import test_draft_runner
    from sglang_sparsespec.patches import draft_runner
    from test_draft_runner import FakeBackend, FakeModel, make_runner, sampling

    seen: list[bool] = []
    forward = FakeModel.forward

    def recording(self, input_ids, positions, fb):
        seen.append(dr._DEFER.get())
        return forward(self, input_ids, positions, fb)

    monkeypatch.setattr(FakeModel, "forward", recording)
    monkeypatch.setattr(test_draft_runner, "FakeModel", type(model_name, (FakeModel,), {}))  # the runner's model
    monkeypatch.setattr(FakeBackend, "stores_in_kernel", in_kernel)
    monkeypatch.setattr(draft_runner, "PillarDraftBackend", FakeBackend)
    runner = make_runner([], plain_decode=True)
    rpi, seq_lens, bonus = (torch.tensor(v, device=DEVICE) for v in ([5, 1, 6], [10, 3, 20], [7, 8, 9]))
    runner.run(rpi, seq_lens, bonus, sampling(False), 2)
    runner.decode_logits(rpi, seq_lens + 2, bonus)
    deferred = model_name in dr.ROPE_IN_KERNEL and in_kernel
    assert seen == [deferred, deferred, False]
