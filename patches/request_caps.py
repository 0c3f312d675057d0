"""The request caps (``sglang_sparsespec.limits``) at the tokenizer-manager boundary.

Each cap is a launch flag, checked at launch (``validate_limit_flags``: a bad value is one line), and
a request above one is a 400 naming the cap and its flag: per-token log-probabilities
(``top_logprobs_num``, OpenAI's ``logprobs`` / ``top_logprobs``; ``token_ids_logprob``), stop strings
and patterns, ``logit_bias`` entries (``check_request_caps``, per prompt), and the requests one body
fans out to, prompts x n (``bounded_fanout``, before SGLang expands the batch by n). A stop_regex is
searched in the latest ``stop_regex_window`` tokens of the output only, and a stop string is at most
``max_stop_tokens`` tokens (``bound_stop_search``): SGLang decodes and searches as many of the output's last
tokens as its longest stop string or pattern may span, at every step (the whole output for a pattern of unbounded
length). The sizes of grammars and stop patterns are checked with the other sampling parameters
(``request_guard.check_sampling_params``), before anything compiles them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sglang_sparsespec.limits import RequestLimits, over_cap, request_limits

from .server_args_flags import with_flags


def _entries(value: Any) -> int:
    """How many strings a ``stop`` / ``stop_regex`` value holds (one string, a list, or none)."""
    if value is None:
        return 0
    return 1 if isinstance(value, str) else len(value)


def check_request_caps(obj: Any, limits: RequestLimits) -> None:
    """ValueError for the first cap one prompt's request (a GenerateReqInput member) is above."""
    params = obj.sampling_params if isinstance(obj.sampling_params, Mapping) else {}
    counts = (
        ("top_logprobs_num (OpenAI: logprobs / top_logprobs)", obj.top_logprobs_num or 0, "max_top_logprobs"),
        ("the number of token_ids_logprob ids", len(obj.token_ids_logprob or ()), "max_token_ids_logprob"),
        ("the number of stop and stop_regex entries", _entries(params.get("stop")) + _entries(params.get("stop_regex")),
         "max_stop_strings"),
        ("the number of logit_bias entries", len(params.get("logit_bias") or ()), "max_logit_bias"),
    )  # fmt: skip
    for what, count, cap in counts:
        error = over_cap(what, count, getattr(limits, cap), cap)
        if error is not None:
            raise error


def bound_stop_search(sampling_params: Any, limits: RequestLimits) -> None:
    """SamplingParams after ``normalize``: ValueError for a stop string longer than its cap (SGLang's
    ``stop_str_max_len``, in tokens), and the output tail searched for a stop_regex (its ``stop_regex_max_len``, 2^30
    for any ``+`` or ``*``) at most the window."""
    error = over_cap("the longest stop string's length in tokens", sampling_params.stop_str_max_len,
                     limits.max_stop_tokens, "max_stop_tokens")  # fmt: skip
    if error is not None:
        raise error
    if sampling_params.stop_regex_max_len > limits.stop_regex_window:
        sampling_params.stop_regex_max_len = limits.stop_regex_window


# ---- hooks (registered in patches/hooks_boundary.py) -----------------------------------------------
def validate_limit_flags(result, server_args, *args, **kwargs):
    """ServerArgs' resolution (AFTER ``__post_init__``, from 0.5.19 ``resolve_once``): a bad cap fails at
    launch, in one line, naming its flag."""
    try:
        request_limits()
    except ValueError as exc:
        raise ValueError(with_flags(str(exc))) from None
    return result


def bounded_fanout(result, obj, *args, **kwargs):
    """GenerateReqInput._determine_batch_size (AFTER): prompts x n within the cap before SGLang expands
    the batch by n (the guard has checked every n is an int in [1, 128] by then)."""
    params = obj.sampling_params
    first = params if isinstance(params, Mapping) else (params or [{}])[0]
    n = first.get("n", 1) if isinstance(first, Mapping) else 1
    limits = request_limits()
    error = over_cap(f"prompts x n ({obj.batch_size} x {n})", obj.batch_size * n, limits.max_fanout, "max_fanout")
    if error is not None:
        raise error
    return result
