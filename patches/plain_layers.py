"""Whether an SGLang layer is the plain one a fused draft kernel computes in its place (read by the draft hooks).

A fused kernel replaces a layer's call only where it is the same computation: an RMSNorm that applies its weight in
fp32 over the whole row, a linear layer with unquantized weights and no bias. An attribute a release lacks makes the
layer not plain, and SGLang's call runs.
"""

from __future__ import annotations

import torch


def plain_rms_norm(norm, size: int) -> bool:
    """SGLang's RMSNorm over ``size`` values (a whole head), weight applied in fp32."""
    from sglang.srt.layers.layernorm import RMSNorm

    weight = getattr(norm, "weight", None)
    return (
        type(norm) is RMSNorm
        and getattr(norm, "has_weight", False) is True
        and getattr(norm, "cast_x_before_out_mul", True) is False
        and getattr(norm, "variance_size_override", 0) is None
        and getattr(norm, "override_orig_dtype", 0) is None
        and isinstance(weight, torch.Tensor)
        and weight.shape == (size,)
    )


def plain_linear(linear) -> bool:
    """SGLang's linear layer with unquantized weights and no bias."""
    method = getattr(linear, "quant_method", None)
    return type(method).__name__ == "UnquantizedLinearMethod" and getattr(linear, "bias", None) is None
