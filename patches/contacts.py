"""One adapter per SGLang contact that changed between the supported releases (docs/versions.md).

The rest of the package reaches a changed SGLang symbol through here and never compares versions
itself: each adapter names the release that changed its contact and gives the callers one shape.
The hooks whose target appeared or vanished are listed with their releases instead (``Hook.versions``).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

from .versions import for_release, releases, since

# ---- create_flashinfer_kv_indices_triton: moved to kernels/ops/attention in 0.5.23 --------------------
# Its call is unchanged: ENTRY_PAGE_SIZE (0.5.19), TOKEN_BLOCK_PARALLEL (0.5.20) and token_mapping (0.5.22)
# default to the token-granular one-program-per-request kernel the draft and mixed passes launch.
KV_INDICES_MODULES = {
    "0.5.17": "sglang.kernels.ops.kvcache.kv_indices",
    "0.5.23": "sglang.kernels.ops.attention.kv_indices",
}
create_flashinfer_kv_indices_triton = importlib.import_module(
    for_release(KV_INDICES_MODULES)
).create_flashinfer_kv_indices_triton


# ---- ServerArgs: resolved apart from construction (0.5.19), read through views (0.5.19, 0.5.20) -------
# Up to 0.5.18 constructing ServerArgs ran every handler (a registered algorithm's validator among them)
# and left the resolved values in its fields. From 0.5.19 construction keeps the caller's input and
# ``resolve_once`` resolves (the launcher, and every process that publishes the record); the fields keep
# the input, what resolution decided is declared beside them, and ``resolved_view`` reads both. From
# 0.5.20 a registered validator gets a stand-in whose writes become those declarations. The validation
# hooks are listed once per entry point, with their releases (hooks_boundary.py, hooks_offload.py).


def resolve(server_args):
    """``server_args`` resolved and validated as a launch resolves them (0.5.19: ``resolve_once``)."""
    if since("0.5.19"):
        server_args.resolve_once()
    return server_args


def resolved(server_args) -> Any:
    """Read-only access to what resolution decided, field by field (0.5.19: ``resolved_view``)."""
    if not since("0.5.19"):
        return server_args
    from sglang.srt.arg_groups.model_override_base import resolved_view

    return resolved_view(server_args)


def attention_backends(server_args) -> tuple[str | None, str | None]:
    """(prefill, decode) attention backends; 0.5.19 moved ``ServerArgs.get_attention_backends`` to
    ``arg_groups.model_override_base.attention_backends_of``, which reads any config-shaped object."""
    if not since("0.5.19"):
        return server_args.get_attention_backends()
    from sglang.srt.arg_groups.model_override_base import attention_backends_of

    return attention_backends_of(server_args)


# ---- DP attention: asked for by --attn-dp-size N from 0.5.22 (--enable-dp-attention, deprecated, resolves to it)
def dp_attention(server_args) -> bool:
    if since("0.5.22") and (server_args.attn_dp_size or 1) > 1:
        return True
    return bool(server_args.enable_dp_attention)


# ---- server_args parameters dropped in 0.5.18 -------------------------------------------------------
# compute_num_reserved_tokens, get_alloc_reserve_per_decode and create_dummy_verify_input take no
# server_args from 0.5.18: they read the process's published configuration, as their hooks then do.
def call_server_args(args: tuple, kwargs: dict[str, Any]) -> Any:
    """The server args a hooked call concerns: its own argument up to 0.5.17, the runtime context's after."""
    given = kwargs.get("server_args", args[0] if args else None)
    if given is not None:
        return resolved(given)
    from sglang.srt.runtime_context import get_server_args

    return resolved(get_server_args())


def arguments(original: Callable, args: tuple, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A hooked call's arguments by name, whichever release's parameter list ``original`` has."""
    bound = inspect.signature(original).bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments


# ---- the verify's logprobs: compute_spec_v2_logprobs became compute_spec_logprobs in 0.5.18 ------------------
# The chain's width comes from accept_index [bs, k + 1] there instead of num_steps.
def compute_spec_logprobs(batch, logits_output, predict, accept_index, num_steps: int) -> None:
    from sglang.srt.layers import logprob_processor

    if not since("0.5.18"):
        logprob_processor.compute_spec_v2_logprobs(batch, logits_output, predict, accept_index, num_steps)
    else:
        logprob_processor.compute_spec_logprobs(batch, logits_output, predict, accept_index=accept_index)


# ---- retract_all: server_args dropped in 0.5.19 ---------------------------------------------------------
def retract_all(*, server_args, **kwargs) -> None:
    from sglang.srt.managers.schedule_batch import retract_all as stock

    if not since("0.5.19"):
        kwargs["server_args"] = server_args
    stock(**kwargs)


# ---- the stream interval of multi-token steps: sent by unsent count from 0.5.22 ----------------------------
# Up to 0.5.21 _GenerationStreamAccumulator.accept sends a streamed chunk when the output length is 1 mod
# the interval, which a speculative round jumps over; 0.5.22 sends once the interval's worth is unsent
# (the first token at once), as plain decoding would, so the plugin leaves the interval to it there.
STOCK_STREAMS_BY_UNSENT = since("0.5.22")


# ---- the KV offload pool's contacts: the request's KV bookkeeping, reworked in 0.5.21 and 0.5.22 -------
# 0.5.21 replaced Req.effective_kv_committed_len by owned_kv_len; 0.5.22 gave release_kv_cache a
# checkpoint mode, dropped maybe_cache_unfinished_req and (0.5.23) rebuilt the host pool classes around a
# buffer description. The offload pool parks and restores exactly that bookkeeping, so it serves the
# releases before these changes and is refused at launch on the rest.
OFFLOAD_RELEASES = releases("0.5.17", "0.5.20")
