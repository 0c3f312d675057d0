"""What a verify layer does to q, k and v before its attention, in one launch (``verify_prologue``): the chain's K/V
rows stored into the page-size-1 cache at their slots and written out contiguous for the attention kernel, and,
where the model left them to it, the per-head q/k RMS norm and the neox rotary embedding (q in place), as SGLang's
own kernels compute them (``kernels/qk_prologue.py``); plain-torch reference ``verify_prologue_ref``.

SGLang runs these as up to five launches a layer of every verify: the q/k norm, the rotary, the KV store, then the
attention call's ``.contiguous()`` copies of the strided k and v views of the fused qkv projection (15.3 us a layer
at Qwen3-1.7B's 64 x 9 rows on the H200, trace_qwen3-1.7b_round_h200_abd4867). Here program (t, h) reads token t's
KV head h and its GROUP query heads once and writes each result once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .qk_prologue import prologue_rows, rms_norm_ref, rope_neox_ref


@dataclass(frozen=True)
class QKPrologue:
    """The q/k work a verify layer's model left to its attention (either part may be None).

    norm: (q weight [D], k weight [D], q eps, k eps), per-head RMS norm; rope: (cos | sin cache [max_pos, D], the
    tokens' positions [T]), neox rotary over the whole head, after the norm.
    """

    norm: tuple[torch.Tensor, torch.Tensor, float, float] | None
    rope: tuple[torch.Tensor, torch.Tensor] | None


@triton.jit
def _verify_prologue_kernel(
    Q, K, V, K_out, V_out, K_buf, V_buf, Loc, Pos, CosSin, Wq, Wk, eps_q, eps_k,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, stride_bs, stride_bh,
    stride_cs,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_G: tl.constexpr,
    NORM: tl.constexpr, ROPE: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    offs_d = tl.arange(0, BLOCK_D)[None, :]
    d_ok = offs_d < D
    cs_row = CosSin
    if ROPE:
        cs_row = CosSin + tl.load(Pos + t).to(tl.int64) * stride_cs
    if NORM or ROPE:  # q is changed in place: every row is read (its rotation partners too) before it is written
        offs_g = tl.arange(0, BLOCK_G)[:, None]
        q_ptr = Q + t * stride_qt + (h * GROUP + offs_g) * stride_qh
        q_ok = (offs_g < GROUP) & d_ok
        q = tl.load(q_ptr + offs_d, mask=q_ok, other=0.0)
        q = prologue_rows(q, q_ptr, offs_d, q_ok, Wq, eps_q, cs_row, D, NORM, ROPE)
        tl.store(q_ptr + offs_d, q, mask=q_ok)
    one = tl.zeros([1, 1], dtype=tl.int64)
    k_ptr = K + t * stride_kt + h * stride_kh + one
    k = tl.load(k_ptr + offs_d, mask=d_ok, other=0.0)
    k = prologue_rows(k, k_ptr, offs_d, d_ok, Wk, eps_k, cs_row, D, NORM, ROPE)
    v = tl.load(V + t * stride_vt + h * stride_vh + one + offs_d, mask=d_ok, other=0.0)
    slot = tl.load(Loc + t).to(tl.int64)
    out = t * stride_ot + h * stride_oh + offs_d
    cache = slot * stride_bs + h * stride_bh + offs_d
    tl.store(K_out + out, k, mask=d_ok)
    tl.store(V_out + out, v, mask=d_ok)
    tl.store(K_buf + cache, k.to(K_buf.dtype.element_ty), mask=d_ok)
    tl.store(V_buf + cache, v.to(V_buf.dtype.element_ty), mask=d_ok)


def verify_prologue(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    qk: QKPrologue | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The chain's K/V into the cache and out contiguous; returns (k_out, v_out), each [T, H_kv, D] in k's dtype.

    q: [T, H_q, D], normalized and rotated in place when ``qk`` asks; k, v: [T, H_kv, D] (any row and head
    strides, contiguous last dim; k as it was before ``qk``); k_buffer, v_buffer: [slots, H_kv, D] in k's dtype;
    loc: [T] int slots (row t goes to slot loc[t]). ``qk``: what the model left undone (None: nothing).
    """
    t, h_q, d = q.shape
    h_kv = k.shape[1]
    if k.shape != (t, h_kv, d) or v.shape != k.shape or h_q % h_kv:
        raise ValueError(f"q [T, H_q, D], k and v [T, H_kv, D] expected, got {q.shape} {k.shape} {v.shape}")
    if k_buffer.shape[1:] != (h_kv, d) or v_buffer.shape != k_buffer.shape or k_buffer.dtype != k.dtype:
        raise ValueError(f"k/v buffers [slots, {h_kv}, {d}] in {k.dtype} expected, got {k_buffer.shape}")
    if any(x.stride(2) != 1 for x in (q, k, v, k_buffer, v_buffer)):
        raise ValueError("q, k, v and the k/v buffers need a contiguous last dim")
    if loc.shape != (t,):
        raise ValueError(f"loc must be [{t}], got {tuple(loc.shape)}")
    norm, rope = (None, None) if qk is None else (qk.norm, qk.rope)
    if rope is not None and (rope[0].shape[1] != d or rope[1].shape != (t,)):
        raise ValueError(f"rope needs a [max_pos, {d}] cos | sin cache and [{t}] positions")
    k_out = torch.empty((t, h_kv, d), dtype=k.dtype, device=k.device)
    v_out = torch.empty_like(k_out)
    if t == 0:
        return k_out, v_out
    cos_sin, pos = rope if rope is not None else (k, loc)  # unread placeholders without ROPE
    wq, wk, eps_q, eps_k = norm if norm is not None else (k, k, 0.0, 0.0)
    group = h_q // h_kv
    _verify_prologue_kernel[(t, h_kv)](
        q, k, v, k_out, v_out, k_buffer, v_buffer, loc, pos, cos_sin, wq, wk, float(eps_q), float(eps_k),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), k_out.stride(0),
        k_out.stride(1), k_buffer.stride(0), k_buffer.stride(1), cos_sin.stride(0),
        GROUP=group, D=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_G=triton.next_power_of_2(group),
        NORM=norm is not None, ROPE=rope is not None, num_warps=1 if d <= 64 else 2,
    )  # fmt: skip
    return k_out, v_out


def verify_prologue_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_buffer: torch.Tensor, v_buffer: torch.Tensor,
    loc: torch.Tensor, qk: QKPrologue | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """Plain-torch ``verify_prologue``: SGLang's order (norm, rotary, store), each rounded to the dtype."""
    norm, rope = (None, None) if qk is None else (qk.norm, qk.rope)
    qn, kn = q, k
    if norm is not None:
        qn, kn = rms_norm_ref(qn, norm[0], norm[2]), rms_norm_ref(kn, norm[1], norm[3])
    if rope is not None:
        qn, kn = rope_neox_ref(qn, rope[0], rope[1]), rope_neox_ref(kn, rope[0], rope[1])
    q.copy_(qn)
    k_buffer[loc.long()] = kn
    v_buffer[loc.long()] = v
    return kn.contiguous(), v.contiguous()
