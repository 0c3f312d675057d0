"""Where Triton kernels run in the tests: compiled on a GPU, else Triton's CPU interpreter.

Imported by conftest.py before any test module, so TRITON_INTERPRET is set before triton
decorates a kernel (it decides interpreted vs compiled at decoration time). With CUDA
available and TRITON_INTERPRET unset the same tests check the compiled kernels.
"""

from __future__ import annotations

import os

import torch

if "TRITON_INTERPRET" not in os.environ:
    os.environ["TRITON_INTERPRET"] = "0" if torch.cuda.is_available() else "1"
INTERPRET = os.environ["TRITON_INTERPRET"] == "1"
DEVICE = "cpu" if INTERPRET else "cuda"

if INTERPRET:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as _interp

    # The interpreter (triton 3.8) multiplies the raw uint16 bit patterns in tl.dot on bf16
    # operands; widen them to fp32 first, which is what the GPU's bf16 MMA computes exactly.
    _orig_create_dot = _interp.InterpreterBuilder.create_dot

    def _bf16_safe_dot(self, a, b, d, *args):
        def widen(h):
            if h.dtype != tl.bfloat16:
                return h
            return _interp.TensorHandle((h.data.astype(np.uint32) << 16).view(np.float32), tl.float32)

        return _orig_create_dot(self, widen(a), widen(b), d, *args)

    _interp.InterpreterBuilder.create_dot = _bf16_safe_dot

    try:
        from sglang.kernels.ops.sampling import murmur_hash as _murmur
    except ImportError:  # the kernel tests run without SGLang too
        _murmur = None
    if _murmur is not None:
        import triton

        # SGLang's seeded-sampling hash (the verify coins, PILLAR's draft noise) sends CPU tensors to
        # sgl_kernel's CPU build from 0.5.20, which PyPI does not ship; on the interpreter every release
        # runs the Triton kernel it launches for CUDA tensors (and ran for CPU ones up to 0.5.19).
        def _murmur_hash32_on_triton(seed, positions, col_indices):
            n, m = seed.shape[0], col_indices.shape[0]
            hashed = torch.empty((n, m), dtype=torch.uint32, device=seed.device)
            grid = (n, triton.cdiv(m, 1024))
            _murmur.murmur_hash32_kernel[grid](seed, positions, col_indices, hashed, n, m, BLOCK_SIZE=1024)
            return hashed

        _murmur.murmur_hash32 = _murmur_hash32_on_triton
