"""``TritonAttnBackend.forward_extend``: capture PillarAttn scores in the verify pass.

For a TARGET_VERIFY forward on a backend that carries a score sink, the inner
``extend_attention_fwd`` call is given an LSE output buffer, and right after it the
score-capture kernel re-reads Q and K (not V) of that layer to rebuild the attention
probabilities of the prefix. Because this runs while the target's TARGET_VERIFY graph is
being captured, the extra kernels become part of that graph; other forward modes and
other backends pass through untouched.
"""

from __future__ import annotations

from sglang_sparsespec.selection.scores import VerifyScoreSink

SINK_ATTR = "_sparsespec_score_sink"

# Positional layout of sglang.kernels.ops.attention.extend_attention.extend_attention_fwd
_Q, _K_BUFFER, _QO_INDPTR, _KV_INDPTR, _KV_INDICES = 0, 4, 6, 7, 8


def attach_score_sink(backend, sink: VerifyScoreSink) -> None:
    setattr(backend, SINK_ATTR, sink)


def capture_verify_scores(original, backend, q, k, v, layer, forward_batch, *args, **kwargs):
    sink: VerifyScoreSink | None = getattr(backend, SINK_ATTR, None)
    if sink is None or not forward_batch.forward_mode.is_target_verify():
        return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)

    inner = backend.extend_attention_fwd

    def attention_then_scores(*a, **kw):
        q_ext = a[_Q]
        lse = sink.lse_buffer(q_ext.shape[0], q_ext.shape[1])
        out = inner(*a, lse_extend=lse, **kw)
        sink.capture_layer(
            layer.layer_id,
            q_ext,
            a[_K_BUFFER],
            lse,
            a[_QO_INDPTR],
            a[_KV_INDPTR],
            a[_KV_INDICES],
            layer.scaling,
            float(kw.get("logit_cap", 0.0) or 0.0),
        )
        return out

    backend.extend_attention_fwd = attention_then_scores
    try:
        return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)
    finally:
        backend.extend_attention_fwd = inner
