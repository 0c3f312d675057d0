"""Compile every Triton kernel of the package for an H100/H200 (sm_90) on a machine without a GPU.

Triton's CPU interpreter runs the kernels' arithmetic but not the compiler, which refuses what the
interpreter accepts (a module global that is not a ``tl.constexpr``, a name given two types across
``if`` branches, an unsupported op). Run as a script in a fresh process (``TRITON_INTERPRET`` must be
0 before triton decorates a kernel): it swaps in a driver that reports an sm_90 target and turns
every launch into a compile-only warm-up, then calls each kernel's host function at serving shapes
(Qwen3's 151,936-token vocabulary, batch 64, k = 8), so the constexpr variants that ship are the
ones compiled. Prints one line per kernel variant; exits non-zero on the first compile error.
Compilers differ by release: CI also runs it with the GPU nodes' Triton 3.6 ahead of the venv's on PYTHONPATH
(``.ci/run``), which refused, where 3.8 compiled it, a binary search of dependent loads at 16-wide tiles.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "0"

import torch  # noqa: E402
import triton  # noqa: E402
import triton.runtime.jit as jit  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402


class _Sm90Driver:
    """What ``JITFunction.run`` asks of the active driver, for an sm_90 target and no device."""

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return GPUTarget("cuda", 90, 32)

    def get_active_torch_device(self) -> torch.device:
        return torch.device("cpu")


# An sm_90 block's most shared memory: a build asking more compiles here and fails at launch on the GPU.
SM90_SHARED_BYTES = 232_448


def _compile_only() -> list[str]:
    compiled: list[str] = []
    launch = jit.JITFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        kernel = launch(self, *args, grid=grid, warmup=True, **kwargs)
        compiled.append(self.fn.__name__)
        shared = kernel.metadata.shared
        if self.fn.__module__.startswith("sglang_sparsespec.") and shared > SM90_SHARED_BYTES:
            raise RuntimeError(f"{self.fn.__name__} asks {shared} B of shared memory, sm_90 has {SM90_SHARED_BYTES}")
        return kernel

    jit.JITFunction.run = run
    return compiled


def main() -> None:
    driver.set_active(_Sm90Driver())
    compiled = _compile_only()
    from sglang_sparsespec.kernels.glu_gemm import glu_gemm
    from sglang_sparsespec.kernels.draft_sample import DraftSampleInputs, draft_sample_fwd
    from sglang_sparsespec.kernels.score_capture import score_capture
    from sglang_sparsespec.kernels.sparse_decode import sparse_decode_fwd
    from sglang_sparsespec.kernels.target_filter import target_filter_fwd
    from sglang_sparsespec.kernels.token_match import match_lists_fwd, token_match_fwd
    from sglang_sparsespec.kernels.topk_select import topk_select
    from sglang_sparsespec.kernels.verify_accept import rejection_fwd
    from sglang_sparsespec.kernels.verify_attention import verify_attention_fwd
    from sglang_sparsespec.kernels.verify_prologue import QKPrologue, verify_prologue

    vocab, bs, k, c = 151936, 64, 8, 64
    n = bs * (k + 1)
    logits = torch.empty(n, vocab)
    temp, top_p, min_p = torch.ones(bs), torch.ones(bs), torch.zeros(bs)
    top_k = torch.ones(bs, dtype=torch.int32)
    tokens, q_tok, coins, final = (
        torch.zeros(bs, k, dtype=torch.int64),
        torch.ones(bs, k),
        torch.ones(bs, k),
        torch.ones(bs),
    )
    ids, q = torch.zeros(bs, k, c, dtype=torch.int64), torch.ones(bs, k, c)
    for candidates in (False, True):  # both first lists; the server's default (candidates) last, its rows used below
        for rank_rule in (False, True):
            for mp in (None, min_p):
                rows = target_filter_fwd(logits, temp, top_k, top_p, mp, k + 1, rank_rule, candidates=candidates)
                print(f"target_filter_fwd candidates={candidates} rank={rank_rule} min_p={mp is not None}: ok")
    rows.dense()
    for drafts in (k, torch.full((bs,), k, dtype=torch.int64)):
        rejection_fwd(rows, tokens, ids, q, q_tok, drafts, coins, final)
    # fp32 logits, and a draft step's bf16 ones with rows strided past the vocabulary (patches/draft_logits.py)
    for draft_logits in (logits[:bs], logits[:bs].to(torch.bfloat16)[:, :-7]):
        draft_sample_fwd(
            DraftSampleInputs(draft_logits, temp, top_p, top_k, min_p, torch.ones(bs, c)),
            tokens[:, 0],
            ids[:, 0],
            q[:, 0],
            q_tok[:, 0],
        )
    print("rejection_fwd, draft_sample_fwd, dense: ok")
    for h_q, h_kv, d in ((16, 8, 128), (32, 8, 128), (9, 3, 64)):
        slots, ctx = bs * 64, 64
        kb = torch.empty(slots, h_kv, d, dtype=torch.bfloat16)
        q1 = torch.empty(bs, h_q, d, dtype=torch.bfloat16)
        req_to_token = torch.zeros(bs, ctx, dtype=torch.int32)
        lens = torch.full((bs,), ctx, dtype=torch.int64)
        rpi = torch.arange(bs)
        sel = torch.zeros(bs, h_kv, 32, dtype=torch.int32)
        cnt = torch.zeros(bs, dtype=torch.int32)
        # The shipped launch at one and two splits, storing the step's K/V (normalizing and rotating) as a draft
        # step does, then the sweep's extremes (tools/kernels_tune.py).
        new_kv = (torch.empty(bs, h_kv, d, dtype=torch.bfloat16),) * 2 + (torch.zeros(bs, dtype=torch.int64),)
        rope = (torch.empty(4096, d), torch.zeros(bs, dtype=torch.int64))  # and rotating q and the new key
        norm = (torch.empty(d, dtype=torch.bfloat16), torch.empty(d, dtype=torch.bfloat16), 1e-6, 1e-6)
        # a draft step with match heads: the scan (its while loop), each listed head's copy and the match tiles
        match_pos, lists = torch.zeros(bs, 64, dtype=torch.int32), torch.zeros(2, bs, 64, dtype=torch.int32)
        token_match_fwd(req_to_token, rpi, tokens[:, 0], cnt, match_pos, cnt)
        match_lists_fwd(match_pos, cnt, sel, cnt, rpi, torch.zeros(2, dtype=torch.int32), lists)
        match = (lists, cnt, torch.zeros(h_kv, dtype=torch.int32))
        for splits, launch in (
            (1, {}),
            (2, {}),
            (1, {"new_kv": new_kv}),
            (2, {"new_kv": new_kv}),
            (1, {"new_kv": new_kv, "rope": rope}),
            (1, {"new_kv": new_kv, "rope": rope, "qk_norm": norm}),
            (1, {"pdl": True}),  # as tools/gemm_chain.py's fused layer launches it
            (1, {"block_n": 16, "num_warps": 2}),
            (2, {"block_n": 64, "num_warps": 8}),
            (2, {"block_n": 64, "num_warps": 8, "new_kv": new_kv, "rope": rope, "qk_norm": norm}),
            (1, {"new_kv": new_kv, "rope": rope, "qk_norm": norm, "match": match}),
            (2, {"block_n": 16, "num_warps": 2, "match": match}),  # the CPU test's tiles
            (8, {"new_kv": new_kv, "dense_heads": match[2] + 1}),  # a layer with a dense head (DENSE_SPLITS)
        ):
            sparse_decode_fwd(
                q1,
                kb,
                kb,
                torch.empty_like(q1),
                req_to_token,
                rpi,
                sel,
                cnt,
                lens - 8,
                lens,
                d**-0.5,
                num_kv_splits=splits,
                **launch,
            )
        qv = torch.empty(n, h_q, d, dtype=torch.bfloat16)
        kv_ext = torch.empty(n, h_kv, d, dtype=torch.bfloat16)
        qo = torch.arange(bs + 1, dtype=torch.int32) * (k + 1)
        kv_indptr = torch.arange(bs + 1, dtype=torch.int32) * ctx
        kv_indices = torch.zeros(bs * ctx, dtype=torch.int64)
        lse = torch.empty(n, h_q)
        verify_attention_fwd(
            qv, kv_ext, kv_ext, torch.empty_like(qv), kb, kb, qo, kv_indptr, kv_indices, k + 1, d**-0.5, lse=lse
        )
        # the verify's prologue from the fused qkv projection's strided views, with and without Qwen3's q/k work
        qkv = torch.empty(n, (h_q + 2 * h_kv) * d, dtype=torch.bfloat16)
        qs, ks, vs = (x.view(n, -1, d) for x in qkv.split([h_q * d, h_kv * d, h_kv * d], dim=-1))
        cache_loc = torch.zeros(n, dtype=torch.int64)
        for qk in (None, QKPrologue(norm, (rope[0], torch.zeros(n, dtype=torch.int64)))):
            verify_prologue(qs, ks, vs, kb, kb, cache_loc, qk)
        scores = torch.empty(h_kv, bs * ctx, dtype=torch.float16)
        score_capture(qv, kb, lse, qo, kv_indptr, kv_indices, scores, d**-0.5)
        print(f"attention kernels h_q={h_q} h_kv={h_kv} d={d}: ok")
    topk_select(
        torch.empty(8, bs * 64),
        torch.arange(bs, dtype=torch.int32) * 64,
        torch.full((bs,), 64, dtype=torch.int32),
        torch.full((bs,), 16, dtype=torch.int32),
        torch.empty(bs, 8, 16, dtype=torch.int32),
        torch.empty(bs, dtype=torch.int32),
    )
    # The draft steps' gate/up with its SiLU-and-mul epilogue at the launch they use (Qwen3-1.7B, SmolLM2).
    for rows in (1, 16, 64):
        for hidden, inter in ((2048, 6144), (576, 1536)):
            glu_gemm(
                torch.empty(rows, hidden, dtype=torch.bfloat16), torch.empty(2 * inter, hidden, dtype=torch.bfloat16)
            )
    print("draft gate/up kernel: ok")
    # The probes of tools/ run on the GPU as they are: a compile error there would waste device time.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from tools.skinny_gemm import reduce_add_norm, skinny_gemm

    x, w = torch.empty(bs, 2048, dtype=torch.bfloat16), torch.empty(12288, 2048, dtype=torch.bfloat16)
    out, part = torch.empty(bs, 12288, dtype=torch.bfloat16), torch.empty(4, bs, 12288)
    w8, scale = torch.empty(12288, 2048, dtype=torch.float8_e4m3fn), torch.empty(12288)
    # (block_n, block_k, split_k, warps, stages): some of the probe's launches
    for config in ((64, 128, 1, 4, 3), (64, 128, 4, 4, 3), (32, 256, 2, 8, 4), (16, 128, 1, 4, 4)):
        skinny_gemm(x, w, out, part, *config)
        skinny_gemm(x, w8, out, part, *config, scale=scale)  # fp8 weights, bf16 activations
        if config[2] == 1:  # the draft steps' gate/up with its SiLU-and-mul epilogue, at the probe's launches
            glu_gemm(x, w, out[:, :6144], block_n=config[0], block_k=config[1], warps=config[3], stages=config[4])
    # the down projection's partials summed inside the add-RMSNorm (draft_gemm's down_add_norm)
    xd, wd = torch.empty(bs, 6144, dtype=torch.bfloat16), torch.empty(2048, 6144, dtype=torch.bfloat16)
    residual, outd = torch.empty(bs, 2048, dtype=torch.bfloat16), torch.empty(bs, 2048, dtype=torch.bfloat16)
    skinny_gemm(xd, wd, outd, part, 32, 256, 4, 4, 4, reduce=False)
    reduce_add_norm(part, 4, residual, torch.empty(2048, dtype=torch.bfloat16), 1e-6, outd, torch.empty_like(residual))
    print("draft GEMM probe: ok")
    from tools.gemm_chain import LAUNCHES
    from tools.layer_probe import model_dims

    # The chain probe's programmatic dependent launches at each model's shapes (64 and 256 rows), with and without
    # prefetch, and its fused layer's prologues: add-RMSNorm (qkv, gate/up) and SiLU-and-mul (down).
    for model, launches in LAUNCHES.items():
        _, dims = model_dims(model)
        rows = 64 if model == "qwen3-1.7b" else 256
        hidden = dims["o"][0]
        for name, config in launches.items():
            n, k = dims[name]
            xs, ws = torch.empty(rows, k, dtype=torch.bfloat16), torch.empty(n, k, dtype=torch.bfloat16)
            outs = torch.empty(rows, n, dtype=torch.bfloat16)
            scratch = torch.empty(config[2], rows, n)
            for prefetch in (False, True):
                skinny_gemm(xs, ws, outs, scratch, *config, pdl=True, prefetch=prefetch)
            if name in ("qkv", "gate_up"):
                norm = (xs, torch.empty_like(xs), torch.empty(hidden, dtype=torch.bfloat16), 1e-6)
                skinny_gemm(xs, ws, outs, scratch, *config, pdl=True, prefetch=True, add_norm=norm)
            if name == "down":
                gate_up = torch.empty(rows, 2 * k, dtype=torch.bfloat16)
                skinny_gemm(gate_up, ws, outs, scratch, *config, pdl=True, prefetch=True, silu_mul=True)
    print("GEMM chain probe: ok")
    from tools.vocab_pass_probe import pass_calls

    calls = pass_calls("top_p", 8, 1024, 4, dev="cpu")[0]
    for name in ("bins_only", "hist1", "gather1", "gather2", *(n for n in calls if n.startswith("hist1_nb"))):
        calls[name]()
    print("vocabulary pass probe: ok")
    kernels = len(set(compiled))
    print(f"compiled {len(compiled)} launches of {kernels} kernels for sm_90 with Triton {triton.__version__}")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # one line for the test's assertion, then the traceback
        print(f"COMPILE ERROR: {type(e).__name__}: {str(e)[:2000]}", flush=True)
        raise
    sys.exit(0)
