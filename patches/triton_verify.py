"""``TritonAttnBackend.forward_extend``: PILLAR's verify attention and score capture.

For a TARGET_VERIFY forward on a backend that PILLAR marked (``attach_verify``), the inner
``extend_attention_fwd`` call (routed by ``_VerifyRouter``, installed once at start-up) runs

1. attention: ``kernels/verify_attention.py`` (split-KV over the prefix, the whole GQA group and
   all k + 1 rows in one tile) when the call is a case it serves exactly, else SGLang's own
   kernel. SGLang's extend kernel walks the prefix once per query head and 64-row block, which
   leaves long-context verify steps far below memory bandwidth (benchmarks/results/kernels/kernels_*.json).
   PILLAR's verify is always a topk=1 chain, whose tree mask is the causal mask the split kernel
   applies, so the custom mask SGLang passes can be ignored;
2. score capture (policies that select from verify scores): the attention writes each row's LSE
   into the sink's buffer and the capture kernel re-reads Q and K (not V) of the layer to rebuild
   the attention probabilities of the prefix.

Before SGLang's forward_extend runs, a marked backend's ``prologue`` stores the chain's K/V and hands k and v
over contiguous in one launch (``kernels/verify_prologue.py``), so forward_extend neither stores nor copies them;
inside ``verify_qk_scope`` (TARGET_VERIFY captures and eager verifies, for the models of ``QK_IN_KERNEL``) the
model's q/k norm and rotary calls are left to that launch too (``patches/draft_qk.py``). Where it cannot store as
SGLang's pool would, the left calls run as SGLang's, in the model's order, and forward_extend stores.

Because this runs while the target's TARGET_VERIFY graph is being captured, these kernels become
part of that graph; other forward modes, other backends and unmarked backends pass through.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any
from weakref import WeakKeyDictionary

import torch
from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
from sglang_sparsespec.kernels.verify_attention import verify_attention_fwd
from sglang_sparsespec.kernels.verify_prologue import QKPrologue, verify_prologue

from sglang_sparsespec.selection.scores import VerifyScoreSink

from .contacts import attention_backends, resolved
from .draft_attention import plain_mha_pool
from .draft_qk import DeferredQK, deferred_qk, take_deferred

logger = logging.getLogger(__name__)

# The arguments of SGLang's extend_attention_fwd this hook reads, by name. SGLang passes the first
# sixteen by position; their positions come from the signature, not from a copy of its layout.
# The split kernel's positional inputs, in its order, then the rest of what the hook reads.
_KERNEL_INPUTS = ("q_extend", "k_extend", "v_extend", "o_extend", "k_buffer", "v_buffer", "qo_indptr",
                  "kv_indptr", "kv_indices")  # fmt: skip
_READ = (*_KERNEL_INPUTS, "is_causal", "max_len_extend", "k_scale", "v_scale", "sm_scale", "logit_cap",
         "sliding_window_size", "sinks", "window_kv_offsets", "xai_temperature_len", "skip_prefix", "skip_extend",
         "page_size", "score_mod")  # fmt: skip


def signature_gap(fn: Callable[..., Any] = extend_attention_fwd) -> str | None:
    """None when ``fn`` takes every argument the hook reads by name; else what is missing."""
    params = inspect.signature(fn).parameters
    missing = [name for name in _READ if name not in params]
    return f"extend_attention_fwd lacks {', '.join(missing)}" if missing else None


_POSITION = {name: i for i, name in enumerate(inspect.signature(extend_attention_fwd).parameters)}
_DEFAULT = {name: p.default for name, p in inspect.signature(extend_attention_fwd).parameters.items()}


class ExtendCall:
    """One call's arguments by name, however SGLang split them between position and keyword."""

    def __init__(self, args: tuple, kwargs: dict[str, Any]):
        self.args, self.kwargs = args, kwargs

    def __getitem__(self, name: str) -> Any:
        i = _POSITION[name]
        if i < len(self.args):
            return self.args[i]
        value = self.kwargs.get(name, _DEFAULT[name])
        if value is inspect.Parameter.empty:
            raise TypeError(f"extend_attention_fwd call without {name}")
        return value


@dataclass(frozen=True)
class VerifyHooks:
    """What PILLAR adds to a backend's verify pass: ``sink`` receives the scores (None: the policy
    does not select from verify scores); ``split_kernel`` enables the split-KV attention; ``prologue``: the K/V
    store and copies in one launch; ``qk``: the model's q/k norm and rotary in that launch too."""

    sink: VerifyScoreSink | None
    split_kernel: bool
    prologue: bool = False
    qk: bool = False


def _verify_child(backend: Any) -> Any:
    """The backend ``backend`` routes its TARGET_VERIFY forwards to: itself, or under --attention-backend
    flashinfer (SGLang's HybridAttnBackend, spec_algo.route_attention) the child it picks for them."""
    from sglang.srt.layers.attention.hybrid_attn_backend import HybridAttnBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    if isinstance(backend, HybridAttnBackend):
        return backend._select_backend(ForwardMode.TARGET_VERIFY)
    return backend


def verify_backend(backend: Any) -> Any:
    """The TritonAttnBackend that runs ``backend``'s TARGET_VERIFY forwards (``_verify_child``)."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    backend = _verify_child(backend)
    if not isinstance(backend, TritonAttnBackend):
        raise TypeError(f"PILLAR verifies through the Triton attention backend, got {type(backend).__name__}")
    return backend


def new_verify_backend(model_runner: Any) -> Any:
    """A second backend for the width-1 (plain-decoding) verify graphs, on its own workspace."""
    if attention_backends(resolved(model_runner.server_args))[0] != "triton":
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        # Only verify forwards run on it: a hybrid would also build an unused FlashInfer
        # backend with a fresh workspace buffer.
        return TritonAttnBackend(model_runner)
    keep = model_runner.init_new_workspace
    try:
        return model_runner._get_attention_backend(init_new_workspace=True)
    finally:
        model_runner.init_new_workspace = keep


# The verify hooks of each Triton backend PILLAR verifies on, kept here rather than on SGLang's object.
# Keyed by backend, not by forward: the hooks are recorded into that backend's TARGET_VERIFY graphs,
# whose captures run on SGLang's own placeholder verify inputs.
_HOOKS: WeakKeyDictionary[Any, VerifyHooks] = WeakKeyDictionary()


def attach_verify(backend, hooks: VerifyHooks) -> None:
    """Mark ``backend``'s Triton child for PILLAR's verify; its ``extend_attention_fwd`` becomes a router
    once, here at start-up (forward_extend reaches the kernel only through that attribute)."""
    triton = verify_backend(backend)
    _HOOKS[triton] = hooks
    if not isinstance(triton.extend_attention_fwd, _VerifyRouter):
        triton.extend_attention_fwd = _VerifyRouter(triton.extend_attention_fwd)


def attached_hooks(backend) -> VerifyHooks | None:
    """The hooks ``attach_verify`` gave exactly this backend (None: SGLang's verify runs unchanged)."""
    return _HOOKS.get(backend)


def split_kernel_gap(call: ExtendCall) -> str | None:
    """None when the split kernel computes exactly what SGLang's extend kernel would for this call
    (causal, unscaled 16-bit KV, page size 1, equal K/V head dims, no extras); else what it lacks."""
    checks = (
        (call["is_causal"] is True, "non-causal attention"),
        (call["k_scale"] == 1.0 and call["v_scale"] == 1.0, "scaled (quantized) KV"),
        (call["q_extend"].shape[-1] == call["v_extend"].shape[-1], "different K and V head dims"),
        (call["sliding_window_size"] in (None, -1), "a sliding window"),
        (call["sinks"] is None and call["window_kv_offsets"] is None, "attention sinks"),
        (call["xai_temperature_len"] in (None, -1), "xai temperature"),
        (call["page_size"] == 1, "page size > 1"),
        (call["score_mod"] is None, "score_mod"),
        (not call["skip_prefix"] and not call["skip_extend"], "split prefix/extend passes"),
    )
    return next((why for ok, why in checks if not ok), None)


_logged_fallbacks: set[str] = set()


def _log_fallback_once(layer_id: int, why: str) -> None:
    # Once per reason: it happens during graph capture and would otherwise repeat for every layer.
    if why not in _logged_fallbacks:
        _logged_fallbacks.add(why)
        logger.info("PILLAR verify from layer %d on: SGLang's extend kernel (split kernel: %s)", layer_id, why)


class _VerifyRouter:
    """What a marked backend calls as ``extend_attention_fwd``: SGLang's kernel, except inside a
    TARGET_VERIFY ``forward_extend`` (``pillar_verify`` names the layer and hooks for that one call
    through a context variable, so no attribute of SGLang's objects changes per call)."""

    def __init__(self, inner: Callable[..., Any]):
        self.inner = inner

    def __call__(self, *a, **kw) -> Any:
        current = _VERIFY_CALL.get()
        if current is None:
            return self.inner(*a, **kw)
        hooks, layer = current
        call = ExtendCall(a, kw)
        q_ext = call["q_extend"]
        sink = hooks.sink
        lse = sink.lse_buffer(q_ext.shape[0], q_ext.shape[1]) if sink is not None else None
        logit_cap = float(call["logit_cap"] or 0.0)
        gap = split_kernel_gap(call) if hooks.split_kernel else "SPARSESPEC_VERIFY_KERNEL=sglang"
        if gap is None:
            verify_attention_fwd(
                *(call[name] for name in _KERNEL_INPUTS), call["max_len_extend"], call["sm_scale"],
                logit_cap=logit_cap, lse=lse,
            )  # fmt: skip
        else:
            _log_fallback_once(layer.layer_id, gap)
            self.inner(*a, **({**kw, "lse_extend": lse} if lse is not None else kw))
        if sink is not None:
            sink.capture_layer(
                layer.layer_id,
                q_ext,
                call["k_buffer"],
                lse,
                call["qo_indptr"],
                call["kv_indptr"],
                call["kv_indices"],
                layer.scaling,
                logit_cap,
            )


# The (hooks, layer) of the TARGET_VERIFY forward_extend now running, None outside one.
_VERIFY_CALL: ContextVar[tuple[VerifyHooks, Any] | None] = ContextVar("pillar_verify_call", default=None)


def verify_qk_scope(backend: Any, mode: Any) -> AbstractContextManager[None]:
    """Where a ``mode`` forward on ``backend`` leaves the model's q/k norm and rotary to the verify prologue: a
    TARGET_VERIFY forward on a backend marked with ``qk``; else nothing changes."""
    if not _HOOKS or backend is None or not mode.is_target_verify():
        return nullcontext()
    hooks = _HOOKS.get(_verify_child(backend))
    return deferred_qk() if hooks is not None and hooks.qk else nullcontext()


def _stores_as_sglang(backend, layer, k: torch.Tensor, forward_batch) -> bool:
    """Whether SGLang's store of this call is a row write of k and v at out_cache_loc into the layer's buffers."""
    pool, loc = backend.token_to_kv_pool, forward_batch.out_cache_loc
    return (
        plain_mha_pool(pool, getattr(backend, "dcp_size", 1))
        and getattr(backend, "_translate_kv_loc", None) is None  # a unified pool's virtual slots
        and layer.k_scale is None
        and layer.v_scale is None
        and k.dtype == pool.dtype
        and isinstance(loc, torch.Tensor)
        and loc.shape == k.shape[:1]
    )


def _prologue_serves(backend, layer, k: torch.Tensor | None, forward_batch, deferred: DeferredQK | None) -> bool:
    """Whether the prologue does this call's store as SGLang would, and the rotation left to it (if any) has one
    position a row."""
    return (
        k is not None
        and _stores_as_sglang(backend, layer, k, forward_batch)
        and (deferred is None or deferred.rope is None or deferred.rope.positions.shape == k.shape[:1])
    )


def _qk_prologue(deferred: DeferredQK | None) -> QKPrologue | None:
    if deferred is None:
        return None
    norm, rope = deferred.norm, deferred.rope
    return QKPrologue(
        norm=None if norm is None else (norm.q_weight, norm.k_weight, norm.q_eps, norm.k_eps),
        rope=None if rope is None else (rope.cos_sin, rope.positions),
    )


def pillar_verify(original, backend, q, k, v, layer, forward_batch, *args, **kwargs):
    hooks = attached_hooks(backend)
    if hooks is None or not forward_batch.forward_mode.is_target_verify():
        return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)
    deferred = take_deferred()  # the model's q/k norm and rotary, left to this call inside verify_qk_scope
    # forward_extend(q, k, v, layer, forward_batch, save_kv_cache=True, ...)
    save = args[0] if args else kwargs.get("save_kv_cache", True)
    if hooks.prologue and save and _prologue_serves(backend, layer, k, forward_batch, deferred):
        pool = backend.token_to_kv_pool
        k, v = verify_prologue(
            q.view(-1, layer.tp_q_head_num, layer.qk_head_dim), k, v, pool.get_key_buffer(layer.layer_id),
            pool.get_value_buffer(layer.layer_id), forward_batch.out_cache_loc, _qk_prologue(deferred),
        )  # fmt: skip
        args, kwargs = ((False, *args[1:]), kwargs) if args else (args, {**kwargs, "save_kv_cache": False})
    elif deferred is not None:
        q, k = deferred.apply(q, k)
    token = _VERIFY_CALL.set((hooks, layer))
    try:
        return original(backend, q, k, v, layer, forward_batch, *args, **kwargs)
    finally:
        _VERIFY_CALL.reset(token)
