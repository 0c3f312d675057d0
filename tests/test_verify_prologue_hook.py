"""The verify prologue as the forward_extend hook runs it (patches/triton_verify.py): with SGLang's plain pool the
chain's K/V are stored by the prologue and forward_extend gets contiguous k and v and no store to do; inside
``verify_qk_scope`` the model's q/k norm and rotary (Qwen3's calls, deferred by patches/draft_qk.py) run in the same
launch; a pool SGLang stores otherwise keeps SGLang's calls and store; the scope opens only for TARGET_VERIFY forwards
on a backend marked for it, in eager verifies and in graph captures (patches/cuda_graph.py).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
from sglang_sparsespec.kernels.qk_prologue import rms_norm_ref, rope_neox_ref
from sglang_sparsespec.patches import draft_qk as dq
from sglang_sparsespec.patches.cuda_graph import verify_capture_scope
from sglang_sparsespec.patches.triton_verify import VerifyHooks, attach_verify, pillar_verify, verify_qk_scope
from test_draft_attention import H_KV, _Pool
from test_draft_qk import HEAD, _norm, _rotary
from triton_env import DEVICE

GROUP, T, SLOTS = 2, 6, 8


class _Backend(TritonAttnBackend):
    # A Triton backend (attach_verify accepts no other) without the model runner its __init__ reads.
    def __init__(self, hooks: VerifyHooks | None, pool):
        self.extend_attention_fwd = lambda *a, **kw: None
        self.token_to_kv_pool, self.dcp_size, self._translate_kv_loc = pool, 1, None
        if hooks is not None:
            attach_verify(self, hooks)


def _mode(verify: bool) -> SimpleNamespace:
    return SimpleNamespace(is_target_verify=lambda: verify)


def _pool(seed: int) -> _Pool:
    pool = _Pool(SLOTS, torch.Generator().manual_seed(seed))
    # the layer's head dim here is the rotary tests' HEAD
    pool.k, pool.v = (torch.randn(SLOTS, H_KV, HEAD).to(torch.bfloat16).to(DEVICE) for _ in range(2))
    return pool


@torch.no_grad()
def _verify_layer(backend, seed: int = 0, position_rows: int = T):
    """One verify layer as Qwen3's attention runs it inside ``verify_qk_scope``: qkv split, q/k norm, rotary (each
    through draft_qk's hook, SGLang's call recorded), then forward_extend through the hook. Returns (q, k and v as
    the model had them before the norm, what forward_extend received, SGLang's calls, the slots, the norms)."""
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(T, (H_KV * GROUP + 2 * H_KV) * HEAD, generator=gen).to(torch.bfloat16).to(DEVICE)
    q, k, v = qkv.split([H_KV * GROUP * HEAD, H_KV * HEAD, H_KV * HEAD], dim=-1)
    raw = (q.clone(), k.clone(), v.clone())
    positions = torch.randint(0, 256, (position_rows,), generator=gen).to(DEVICE)
    q_norm, k_norm, rotary = _norm(seed=1), _norm(eps=1e-5, seed=2), _rotary()
    for norm in (q_norm, k_norm):  # the kernel reads the weights where the activations are
        norm.weight.data = norm.weight.data.to(torch.bfloat16).to(DEVICE)
    calls: list[str] = []

    def sglang_norm(q_, k_, qn, kn, head_dim, *a, **kw):
        calls.append("norm")
        q_.copy_(rms_norm_ref(q_.view(T, -1, HEAD), qn.weight, qn.variance_epsilon).view_as(q_))
        k_.copy_(rms_norm_ref(k_.view(T, -1, HEAD), kn.weight, kn.variance_epsilon).view_as(k_))
        return q_, k_

    def sglang_rope(rot, pos, q_, k_, *a, **kw):
        calls.append("rope")
        pos = pos[:T]  # a release whose positions carry more rows than the chain rotates the chain's own
        q_.copy_(rope_neox_ref(q_.view(T, -1, HEAD), rot.cos_sin_cache, pos).view_as(q_))
        k_.copy_(rope_neox_ref(k_.view(T, -1, HEAD), rot.cos_sin_cache, pos).view_as(k_))
        return q_, k_

    received: dict = {}

    def forward_extend(be, q_, k_, v_, layer, fb, save_kv_cache=True):
        received.update(q=q_, k=k_, v=v_, save=save_kv_cache)
        if save_kv_cache:  # SGLang's store
            be.token_to_kv_pool.k[fb.out_cache_loc] = k_
            be.token_to_kv_pool.v[fb.out_cache_loc] = v_
        return None

    layer = SimpleNamespace(layer_id=0, tp_q_head_num=H_KV * GROUP, qk_head_dim=HEAD, k_scale=None, v_scale=None)
    fb = SimpleNamespace(forward_mode=_mode(True), out_cache_loc=torch.randperm(SLOTS)[:T].to(DEVICE))
    with verify_qk_scope(backend, fb.forward_mode):
        q, k = dq.defer_draft_qk_norm(sglang_norm, q, k, q_norm, k_norm, HEAD)
        q, k = dq.defer_draft_rope(sglang_rope, rotary, positions, q, k)
        pillar_verify(forward_extend, backend, q, k.view(T, H_KV, HEAD), v.view(T, H_KV, HEAD), layer, fb, True)
    return raw, received, calls, fb.out_cache_loc, (q_norm, k_norm, rotary, positions)


def _expected(raw, norms):
    q_norm, k_norm, rotary, positions = norms
    q = rms_norm_ref(raw[0].view(T, -1, HEAD), q_norm.weight, q_norm.variance_epsilon)
    k = rms_norm_ref(raw[1].view(T, -1, HEAD), k_norm.weight, k_norm.variance_epsilon)
    positions = positions[:T]
    return rope_neox_ref(q, rotary.cos_sin_cache, positions), rope_neox_ref(k, rotary.cos_sin_cache, positions)


@pytest.mark.parametrize("qk", [True, False])
def test_the_prologue_stores_the_chain_and_hands_over_contiguous_kv(qk: bool) -> None:
    pool = _pool(1)
    before_k = pool.k.clone()
    backend = _Backend(VerifyHooks(None, split_kernel=True, prologue=True, qk=qk), pool)
    raw, got, calls, loc, norms = _verify_layer(backend)
    assert calls == ([] if qk else ["norm", "rope"])  # with qk the prologue's launch does SGLang's two
    assert got["save"] is False and got["k"].is_contiguous() and got["v"].is_contiguous()
    q_want, k_want = _expected(raw, norms)
    close = {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(got["q"].view(T, -1, HEAD).float(), q_want.float(), **close)
    torch.testing.assert_close(got["k"].float(), k_want.float(), **close)
    torch.testing.assert_close(pool.k[loc].float(), k_want.float(), **close)
    assert torch.equal(pool.v[loc], raw[2].view(T, H_KV, HEAD)) and torch.equal(got["v"], pool.v[loc])
    others = torch.ones(SLOTS, dtype=torch.bool)
    others[loc.cpu()] = False
    assert torch.equal(pool.k[others.to(DEVICE)], before_k[others.to(DEVICE)])


def test_a_pool_sglang_stores_otherwise_keeps_sglangs_calls_and_store() -> None:
    pool = _pool(2)
    pool.is_quantized_kv_cache = True  # e.g. an fp8 cache: SGLang's store quantizes
    backend = _Backend(VerifyHooks(None, split_kernel=True, prologue=True, qk=True), pool)
    raw, got, calls, loc, norms = _verify_layer(backend)
    assert calls == ["norm", "rope"] and got["save"] is True  # the deferred calls ran, in the model's order
    q_want, k_want = _expected(raw, norms)
    torch.testing.assert_close(got["k"].float(), k_want.float(), rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(pool.k[loc].float(), k_want.float(), rtol=2e-2, atol=2e-2)


def test_a_rotation_without_one_position_a_row_keeps_sglangs_calls() -> None:
    """Positions that are not one a chain row (the prologue's kernel would refuse them): SGLang's calls and store."""
    pool = _pool(5)
    backend = _Backend(VerifyHooks(None, split_kernel=True, prologue=True, qk=True), pool)
    raw, got, calls, loc, norms = _verify_layer(backend, position_rows=T + 1)
    assert calls == ["norm", "rope"] and got["save"] is True
    torch.testing.assert_close(pool.k[loc].float(), _expected(raw, norms)[1].float(), rtol=2e-2, atol=2e-2)


def test_without_the_prologue_the_verify_is_sglangs() -> None:
    pool = _pool(3)
    backend = _Backend(VerifyHooks(None, split_kernel=True), pool)
    raw, got, calls, loc, _ = _verify_layer(backend)
    assert calls == ["norm", "rope"] and got["save"] is True and not got["k"].is_contiguous()


def test_the_scope_opens_for_marked_target_verify_forwards_only() -> None:
    marked = _Backend(VerifyHooks(None, split_kernel=True, prologue=True, qk=True), _pool(4))
    plain = _Backend(VerifyHooks(None, split_kernel=True, prologue=True, qk=False), _pool(4))
    unmarked = _Backend(None, _pool(4))
    seen: list[bool] = []
    for backend, verify in ((marked, True), (marked, False), (plain, True), (unmarked, True)):
        with verify_qk_scope(backend, _mode(verify)):
            seen.append(dq._DEFER.get())
        runner = SimpleNamespace(attn_backend=backend, capture_forward_mode=_mode(verify))
        verify_capture_scope(lambda r: seen.append(dq._DEFER.get()), runner)
    assert seen == [True, True, False, False, False, False, False, False]
    assert dq._DEFER.get() is False
