"""Fuzzed requests for the reliability run, as ``bad_inputs.Probe`` entries with no expected status.

The fuzzer is seeded and uses only the standard library: it reads the request schemas from the
server's own OpenAPI document (``/openapi.json``, SGLang's pydantic request models rendered as JSON
Schema). For ``/generate`` it takes a small valid body and sets one to three properties (also
sampling parameters, a free-form object in the schema) to values of the declared type at its edges,
or of a wrong type; for the OpenAI chat and completions routes ``schema_fuzz`` builds valid bodies
with random optional fields and breaks them anywhere in the tree (messages, content parts, response
formats, tools), or sends a non-object body.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from benchmarks.checks.bad_inputs import CHAT, COMPLETIONS, GENERATE, HUGE_ID, TEXT, Probe
from benchmarks.checks.schema_fuzz import (
    EDGE_INTS,
    EDGE_NUMBERS,
    EDGE_STRINGS,
    WRONG_TYPES,
    SchemaFuzzer,
    fuzz_body,
    request_schema,
)

ROUTES = (GENERATE, COMPLETIONS, CHAT)  # the fuzzed routes
# SGLang's own sampling parameter names (SamplingParams, docs/basic_usage/sampling_params.mdx).
SAMPLING_KEYS = (
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
)


def _request_schema(openapi: dict[str, Any], path: str) -> dict[str, Any]:
    return _resolve(openapi, request_schema(openapi, path))


def _resolve(openapi: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    node: Any = openapi
    for part in ref.lstrip("#/").split("/"):
        node = node[part]
    return node


def _types(openapi: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    schema = _resolve(openapi, schema)
    if "type" in schema:
        return [schema["type"]] if isinstance(schema["type"], str) else list(schema["type"])
    return [t for option in schema.get("anyOf", []) + schema.get("oneOf", []) for t in _types(openapi, option)]


def _edge_value(rng: random.Random, kind: str, vocab_size: int) -> Any:
    # The schema fuzzer's edge values, and one token id past this model's vocabulary.
    ints, strings = [*EDGE_INTS, vocab_size + 1], EDGE_STRINGS
    if kind == "integer":
        return rng.choice(ints)
    if kind == "number":
        return rng.choice(EDGE_NUMBERS + EDGE_INTS[:4])
    if kind == "string":
        return rng.choice(strings)
    if kind == "boolean":
        return rng.choice([True, False])
    if kind == "array":
        return rng.choice([[], [rng.choice(ints)], [rng.choice(strings)] * 3, [[HUGE_ID]], [[]]])
    if kind == "object":
        return rng.choice([{}, {"x": 1}, {"n": 2**40}, {"max_new_tokens": -1}])
    return None


def _base_body(path: str) -> dict[str, Any]:
    if path == GENERATE:
        return {"text": TEXT, "sampling_params": {"max_new_tokens": 8}}
    if path == COMPLETIONS:
        return {"model": "default", "prompt": TEXT, "max_tokens": 8}
    return {"model": "default", "messages": [{"role": "user", "content": TEXT}], "max_tokens": 8}


def fuzz_inputs(
    openapi: dict[str, Any], seed: int, count: int, vocab_size: int, routes: Sequence[str] = ROUTES
) -> list[Probe]:
    """``count`` mutated bodies spread over ``routes``; the same seed and schema give the same bodies.

    ``/generate``: one to three properties (or sampling parameters, a free-form object in the schema)
    set to edge or wrong-typed values. The OpenAI routes: ``schema_fuzz.SchemaFuzzer`` over the
    routes' request models, nested fields (messages, content parts, response formats, tools) included.
    """
    rng = random.Random(seed)
    fuzzer = SchemaFuzzer(openapi, rng)
    props = {GENERATE: _request_schema(openapi, GENERATE).get("properties", {})} if GENERATE in routes else {}
    out = []
    for i in range(count):
        path = routes[i % len(routes)]
        if path != GENERATE:
            body = fuzz_body(fuzzer, request_schema(openapi, path), _base_body(path))
            out.append(Probe(f"fuzz_{i:04d}", path, body, None))
            continue
        body = _base_body(path)
        for _ in range(rng.randint(1, 3)):
            if isinstance(body.get("sampling_params"), dict) and rng.random() < 0.4:
                key = rng.choice(SAMPLING_KEYS)
                body["sampling_params"] = {
                    **body["sampling_params"],
                    key: _mutation(rng, ["number", "integer"], vocab_size),
                }
                continue
            name = rng.choice(sorted(props[path]))
            body[name] = _mutation(rng, _types(openapi, props[path][name]), vocab_size)
        out.append(Probe(f"fuzz_{i:04d}", path, body, None))
    return out


def _mutation(rng: random.Random, declared: list[str], vocab_size: int) -> Any:
    """Half the time an edge value of a declared type, else a value of any (likely wrong) type."""
    if declared and rng.random() < 0.5:
        return _edge_value(rng, rng.choice(declared), vocab_size)
    return rng.choice(WRONG_TYPES)
