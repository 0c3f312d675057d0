"""``TritonAttnBackend.forward_extend``: PILLAR's verify attention and score capture.

For a TARGET_VERIFY forward on a backend that PILLAR marked (``attach_verify``), the inner
``extend_attention_fwd`` call is replaced by

1. attention: ``kernels/verify_attention.py`` (split-KV over the prefix, the whole GQA group and
   all k + 1 rows in one tile) when the call is a case it serves exactly, else SGLang's own
   kernel. SGLang's extend kernel walks the prefix once per query head and 64-row block, which
   leaves long-context verify steps far below memory bandwidth (benchmarks/results/kernels_*.json).
   PILLAR's verify is always a topk=1 chain, whose tree mask is the causal mask the split kernel
   applies, so the custom mask SGLang passes can be ignored;
2. score capture (policies that select from verify scores): the attention writes each row's LSE
   into the sink's buffer and the capture kernel re-reads Q and K (not V) of the layer to rebuild
   the attention probabilities of the prefix.

Because this runs while the target's TARGET_VERIFY graph is being captured, these kernels become
part of that graph; other forward modes, other backends and unmarked backends pass through.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sglang_sparsespec.kernels.verify_attention import verify_attention_fwd

from sglang_sparsespec.selection.scores import VerifyScoreSink

ATTR = "_sparsespec_verify"
logger = logging.getLogger(__name__)

# Positional layout of sglang.kernels.ops.attention.extend_attention.extend_attention_fwd
(_Q, _K_EXT, _V_EXT, _O, _K_BUFFER, _V_BUFFER, _QO_INDPTR, _KV_INDPTR, _KV_INDICES, _CUSTOM_MASK, _CAUSAL,
 _MASK_INDPTR, _MAX_EXTEND, _K_SCALE, _V_SCALE, _SM_SCALE) = range(16)  # fmt: skip


@dataclass(frozen=True)
class VerifyHooks:
    """What PILLAR adds to a backend's verify pass: ``sink`` receives the scores (None: the policy
    does not select from verify scores); ``split_kernel`` enables the split-KV attention."""

    sink: VerifyScoreSink | None
    split_kernel: bool


def attach_verify(backend, hooks: VerifyHooks) -> None:
    setattr(backend, ATTR, hooks)


def split_kernel_gap(a: tuple, kw: dict) -> str | None:
    """None when the split kernel computes exactly what SGLang's extend kernel would for this call
    (causal, unscaled 16-bit KV, page size 1, equal K/V head dims, no extras); else what it lacks."""
    if len(a) <= _SM_SCALE:
        return "an unexpected extend_attention_fwd call layout"
    checks = (
        (a[_CAUSAL] is True, "non-causal attention"),
        (a[_K_SCALE] == 1.0 and a[_V_SCALE] == 1.0, "scaled (quantized) KV"),
        (a[_Q].shape[-1] == a[_V_EXT].shape[-1], "different K and V head dims"),
        (kw.get("sliding_window_size", -1) in (None, -1), "a sliding window"),
        (kw.get("sinks") is None and kw.get("window_kv_offsets") is None, "attention sinks"),
        (kw.get("xai_temperature_len", -1) in (None, -1), "xai temperature"),
        (kw.get("page_size", 1) == 1, "page size > 1"),
        (kw.get("score_mod") is None, "score_mod"),
        (not kw.get("skip_prefix", False) and not kw.get("skip_extend", False), "split prefix/extend passes"),
    )
    return next((why for ok, why in checks if not ok), None)


_logged_fallbacks: set[str] = set()


def _log_fallback_once(layer_id: int, why: str) -> None:
    # Once per reason: it happens during graph capture and would otherwise repeat for every layer.
    if why not in _logged_fallbacks:
        _logged_fallbacks.add(why)
        logger.info("PILLAR verify from layer %d on: SGLang's extend kernel (split kernel: %s)", layer_id, why)


def pillar_verify(original, backend, q, k, v, layer, forward_batch, *args, **kwargs):
    hooks: VerifyHooks | None = getattr(backend, ATTR, None)
    if hooks is None or not forward_batch.forward_mode.is_target_verify():
        return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)

    inner = backend.extend_attention_fwd
    sink = hooks.sink

    def verify_attention(*a, **kw):
        q_ext = a[_Q]
        lse = sink.lse_buffer(q_ext.shape[0], q_ext.shape[1]) if sink is not None else None
        logit_cap = float(kw.get("logit_cap", 0.0) or 0.0)
        gap = split_kernel_gap(a, kw) if hooks.split_kernel else "SPARSESPEC_VERIFY_KERNEL=sglang"
        if gap is None:
            verify_attention_fwd(
                *a[_Q:_CUSTOM_MASK], a[_MAX_EXTEND], a[_SM_SCALE], logit_cap=logit_cap, lse=lse
            )
        else:
            _log_fallback_once(layer.layer_id, gap)
            if lse is not None:
                kw = {**kw, "lse_extend": lse}
            inner(*a, **kw)
        if sink is not None:
            sink.capture_layer(
                layer.layer_id,
                q_ext,
                a[_K_BUFFER],
                lse,
                a[_QO_INDPTR],
                a[_KV_INDPTR],
                a[_KV_INDICES],
                layer.scaling,
                logit_cap,
            )

    backend.extend_attention_fwd = verify_attention
    try:
        return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)
    finally:
        backend.extend_attention_fwd = inner
