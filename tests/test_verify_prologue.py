"""A verify layer's prologue in one launch (kernels/verify_prologue.py) against its plain-torch reference: the chain's
K/V stored at its slots and handed out contiguous, q normalized and rotated in place, from strided views of one
fused qkv projection as SGLang splits it; GQA groups of 1, 2 and 3 (a padded head block); refused inputs.

Without a GPU the kernel runs in Triton's CPU interpreter (see triton_env.py); with CUDA it runs compiled.
"""

from __future__ import annotations

import pytest
import torch
from sglang_sparsespec.kernels.verify_prologue import QKPrologue, verify_prologue, verify_prologue_ref
from triton_env import DEVICE

D, SLOTS, MAX_POS = 32, 64, 128


def _case(t: int, h_q: int, h_kv: int, norm: bool, rope: bool, seed: int):
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, (h_q + 2 * h_kv) * D, generator=gen).to(torch.bfloat16).to(DEVICE)
    q, k, v = qkv.split([h_q * D, h_kv * D, h_kv * D], dim=-1)  # strided views, as SGLang's attention splits them
    q, k, v = q.view(t, h_q, D), k.view(t, h_kv, D), v.view(t, h_kv, D)
    buffers = [torch.randn(SLOTS, h_kv, D, generator=gen).to(torch.bfloat16).to(DEVICE) for _ in range(2)]
    loc = torch.randperm(SLOTS, generator=gen)[:t].to(DEVICE)
    angles = torch.rand(MAX_POS, D // 2, generator=gen) * 6.3
    qk = QKPrologue(
        norm=(
            (1 + 0.1 * torch.randn(D, generator=gen)).to(torch.bfloat16).to(DEVICE),
            (1 + 0.1 * torch.randn(D, generator=gen)).to(torch.bfloat16).to(DEVICE),
            1e-6,
            1e-5,
        )
        if norm
        else None,
        rope=(
            torch.cat([angles.cos(), angles.sin()], dim=-1).to(DEVICE),
            torch.randint(0, MAX_POS, (t,), generator=gen).to(DEVICE),
        )
        if rope
        else None,
    )
    return qkv, (q, k, v, *buffers, loc), qk


@pytest.mark.parametrize("h_q, h_kv", [(4, 4), (4, 2), (6, 2)])
@pytest.mark.parametrize("norm, rope", [(False, False), (True, False), (False, True), (True, True)])
def test_the_prologue_is_sglangs_norm_rotary_store_and_copies(h_q: int, h_kv: int, norm: bool, rope: bool) -> None:
    t = 9
    qkv, args, qk = _case(t, h_q, h_kv, norm, rope, seed=h_q + 7 * h_kv + 2 * norm + rope)
    qkv_ref, args_ref, _ = _case(t, h_q, h_kv, norm, rope, seed=h_q + 7 * h_kv + 2 * norm + rope)
    k_before, v_before = args[1].clone(), args[2].clone()
    k_out, v_out = verify_prologue(*args, qk=qk if (norm or rope) else None)
    k_ref, v_ref = verify_prologue_ref(*args_ref, qk=qk)
    assert k_out.is_contiguous() and v_out.is_contiguous()
    # the norm's sum runs in another order than torch's: an element one bf16 rounding apart, then rotated
    close = {"rtol": 2e-2, "atol": 2e-2}
    torch.testing.assert_close(qkv.float(), qkv_ref.float(), **close)  # q in place; k and v views untouched
    assert torch.equal(args[1], k_before) and torch.equal(args[2], v_before)
    torch.testing.assert_close(k_out.float(), k_ref.float(), **close)
    assert torch.equal(v_out, v_ref)
    loc, others = args[5], torch.ones(SLOTS, dtype=torch.bool, device=DEVICE)
    others[loc] = False
    for buf, ref in zip(args[3:5], args_ref[3:5]):
        torch.testing.assert_close(buf[loc].float(), ref[loc].float(), **close)
        assert torch.equal(buf[others], ref[others])  # no other slot written
    assert torch.equal(args[4][loc], v_before)
    if norm or rope:  # the reference's change is real: an identity kernel would fail above
        assert not torch.allclose(k_ref.float(), k_before.float(), rtol=1e-2, atol=1e-2)


def test_an_empty_chain_writes_nothing() -> None:
    _, args, _ = _case(0, 4, 2, False, False, seed=1)
    k_out, v_out = verify_prologue(*args)
    assert k_out.shape == (0, 2, D) and v_out.shape == (0, 2, D)


def test_the_prologue_refuses_mismatched_inputs() -> None:
    _, (q, k, v, kb, vb, loc), qk = _case(4, 4, 2, True, True, seed=2)
    with pytest.raises(ValueError, match="H_kv"):
        verify_prologue(q, k[:, :1], v, kb, vb, loc)
    with pytest.raises(ValueError, match="buffers"):
        verify_prologue(q, k, v, kb.float(), vb.float(), loc)
    with pytest.raises(ValueError, match="loc"):
        verify_prologue(q, k, v, kb, vb, loc[:2])
    with pytest.raises(ValueError, match="positions"):
        verify_prologue(q, k, v, kb, vb, loc, QKPrologue(None, (qk.rope[0], qk.rope[1][:2])))
