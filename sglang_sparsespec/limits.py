"""What one request may cost the server: the caps the HTTP boundary enforces, each a launch flag.

A request's per-token memory and per-step CPU grow with some of its parameters, and a body of a few
hundred bytes can set them to the vocabulary or to thousands of entries: ``top_logprobs`` near the
vocabulary holds megabytes per output token to the end of the request, ``prompts x n`` requests fan
out of one body, every stop string and logit-bias entry is matched or applied at every step. Each cap
below is a launch flag ``--pillar-<name>`` (fallback: the ``SPARSESPEC_<NAME>`` variable) and a request
above it is a 400 that names the cap and its flag (``patches/request_guard.py``), for stock decoding
and PILLAR alike. docs/reliability.md lists them.

Nothing here touches SGLang.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from sglang_sparsespec.config import ENV_PREFIX, Knob

_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


@dataclass(frozen=True)
class RequestLimits:
    """The boundary's caps. Invariant: every count >= 1."""

    # OpenAI's limit for top_logprobs; also the native top_logprobs_num and the completions logprobs.
    max_top_logprobs: int = 20
    # Each id is one more log-probability kept per output token, as each top_logprobs entry is.
    max_token_ids_logprob: int = 20
    # Requests one body fans out to: prompts x n (8 prompts at OpenAI's n limit of 128).
    max_fanout: int = 1024
    # stop strings and stop_regex patterns together, each checked at every step.
    max_stop_strings: int = 32
    max_logit_bias: int = 300
    # The tail of the output, in tokens, a stop_regex is searched in at each step (SGLang decodes the
    # whole output for a pattern of unbounded length: quadratic in the output).
    stop_regex_window: int = 32
    # A stop string's tokens: SGLang decodes that many of the output's last tokens at every step (a stop_regex
    # searches them too) and matches each string's prefixes against them while streaming (quadratic in it).
    max_stop_tokens: int = 64
    # A stop_regex pattern's characters: each is compiled in the HTTP process and again, once Python's cache of 512
    # patterns is exceeded, at every step in the scheduler.
    max_stop_regex_chars: int = 512
    # A grammar's characters (json_schema, regex, ebnf, structural_tag), compiled on the scheduler's grammar thread.
    max_grammar_chars: int = 65536
    # Nesting of an OpenAI request body and of a JSON schema in any request: 3,000 levels of schema took the
    # grammar compiler past 2.9 GB in 30 s, 100,000 crashed it; ~500 raise RecursionError in SGLang's conversion.
    max_json_depth: int = 64
    # A client's own Jinja chat template renders in the HTTP process with no time limit.
    allow_client_chat_template: bool = False

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type != "bool" and (type(value) is not int or value < 1):
                raise ValueError(f"{ENV_PREFIX}{f.name.upper()} must be an integer >= 1, got {value!r}")


class LimitKnob(Knob):
    """A cap as a launch flag: the ``RequestLimits`` field it sets (Knob's are PillarConfig's)."""

    @property
    def kind(self) -> type:
        return type(getattr(RequestLimits, self.field))

    @property
    def default(self) -> Any:
        return getattr(RequestLimits, self.field)

    def parse(self, raw: str) -> Any:
        if self.kind is bool:
            text = raw.strip().lower()
            if text not in _TRUE + _FALSE:
                raise ValueError(f"{self.env}={raw!r}: give true or false")
            return text in _TRUE
        return super().parse(raw)


LIMIT_KNOBS: tuple[LimitKnob, ...] = (
    LimitKnob("MAX_TOP_LOGPROBS", "max_top_logprobs", "most log-probabilities a request may ask for per output "
              "token (top_logprobs_num, OpenAI's logprobs / top_logprobs), in tokens"),
    LimitKnob("MAX_TOKEN_IDS_LOGPROB", "max_token_ids_logprob", "most token ids a request may ask the "
              "log-probability of (token_ids_logprob), in tokens"),
    LimitKnob("MAX_FANOUT", "max_fanout", "most requests one body may expand to, prompts x n, in requests"),
    LimitKnob("MAX_STOP_STRINGS", "max_stop_strings", "most stop strings and stop_regex patterns of a "
              "request, together, in strings"),
    LimitKnob("MAX_LOGIT_BIAS", "max_logit_bias", "most logit_bias entries of a request, in tokens"),
    LimitKnob("STOP_REGEX_WINDOW", "stop_regex_window", "the latest output a stop_regex is searched in at "
              "each step, in tokens"),
    LimitKnob("MAX_STOP_TOKENS", "max_stop_tokens", "the longest stop string of a request, in tokens"),
    LimitKnob("MAX_STOP_REGEX_CHARS", "max_stop_regex_chars", "the longest stop_regex pattern of a request, in "
              "characters"),
    LimitKnob("MAX_GRAMMAR_CHARS", "max_grammar_chars", "the longest grammar of a request (json_schema, regex, "
              "ebnf, structural_tag), in characters"),
    LimitKnob("MAX_JSON_DEPTH", "max_json_depth", "the deepest nesting of an OpenAI request body and of a JSON "
              "schema in any request, in levels"),
    LimitKnob("ALLOW_CLIENT_CHAT_TEMPLATE", "allow_client_chat_template", "let a request bring its own "
              "Jinja chat template (chat_template_kwargs.chat_template); it renders in the HTTP process"),
)  # fmt: skip


def request_limits(env: Mapping[str, str] | None = None) -> RequestLimits:
    """The caps from the ``SPARSESPEC_<NAME>`` variables (the launcher exports the flags into them,
    patches/server_args_flags.py), defaults for the unset or empty ones. Read per request, parsed once
    per set of values."""
    env = os.environ if env is None else env
    return _parsed(tuple(env.get(knob.env) or "" for knob in LIMIT_KNOBS))


@functools.lru_cache(maxsize=16)
def _parsed(raw: tuple[str, ...]) -> RequestLimits:
    return RequestLimits(**{knob.field: knob.parse(text) for knob, text in zip(LIMIT_KNOBS, raw) if text})


def flag_of(name: str) -> str:
    """The launch flag of the ``RequestLimits`` field ``name``."""
    return next(k.flag for k in LIMIT_KNOBS if k.field == name)


def over_cap(what: str, count: int, cap: int, name: str) -> ValueError | None:
    """The 400 for ``count`` entries of ``what`` above the cap ``name`` (a LIMIT_KNOBS field), or None."""
    if count <= cap:
        return None
    return ValueError(f"{what} is {count}, above this server's cap of {cap} ({flag_of(name)})")
