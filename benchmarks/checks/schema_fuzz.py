"""Schema-aware request bodies for the OpenAI routes, from the server's own request models.

SGLang's OpenAI routes take pydantic models (``ChatCompletionRequest``, ``CompletionRequest``); the
server's OpenAPI document (``/openapi.json``) is those models rendered as JSON Schema, nested models
included (messages and their content parts, response formats, tools, tool choices, stream options,
structural tags). ``SchemaFuzzer`` reads that document and builds, per body, a valid request with a
random set of optional fields filled from their schema, then breaks it in one to three places:

* a field anywhere in the tree (top level, a message, a content part, the response format's
  ``json_schema``, a tool's function) gets a value of another JSON type, an edge value of its own
  type, or an empty list / object;
* a required field is dropped;
* the whole body is replaced by a non-object (list, string, number, null, empty list).

Bodies are plain JSON values, the same for the same seed and schema. Only the standard library is
used, so the reliability run needs nothing beyond the benchmark's own dependencies.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from typing import Any

WRONG_TYPES: tuple[Any, ...] = (None, True, "x", [], {}, [1, "a"], {"a": {"b": 1}}, 3.5, -7, [[]], "")
NON_OBJECT_BODIES: tuple[Any, ...] = ([1, 2], [], "hello", 7, None, [{"role": "user", "content": "hi"}])
EDGE_INTS = (-1, 0, 1, 2, 2**31, 2**40, -(2**63), 2**63 - 1, 1_000_000_000)
EDGE_NUMBERS = (-1.0, 0.0, 1e-9, 0.5, 1.5, 1e300, -1e300)
EDGE_STRINGS = ("", " ", "\u0000", "\u2603" * 3, "a" * 5000, "(", "{", "null", "json", "json_schema")
MAX_DEPTH = 5  # structural-tag formats nest without end; deeper optional parts are left out


class SchemaFuzzer:
    """Valid and broken JSON values for the schemas of one OpenAPI (or ``model_json_schema``) document."""

    def __init__(self, document: dict[str, Any], rng: random.Random):
        self.doc = document
        self.rng = rng

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        while isinstance(schema, dict) and "$ref" in schema:
            node: Any = self.doc
            for part in schema["$ref"].lstrip("#/").split("/"):
                node = node[part]
            schema = node
        return schema if isinstance(schema, dict) else {}

    def options(self, schema: dict[str, Any]) -> list[dict[str, Any]]:
        """The alternatives of a union (anyOf / oneOf), else the schema itself; resolved."""
        schema = self.resolve(schema)
        alts = schema.get("anyOf") or schema.get("oneOf")
        if alts:
            return [o for alt in alts for o in self.options(alt)]
        return [schema]

    def valid(self, schema: dict[str, Any], depth: int = 0) -> Any:
        """A value the schema accepts (best effort: format and cross-field rules are not modelled)."""
        rng = self.rng
        options = [o for o in self.options(schema) if o.get("type") != "null"] or self.options(schema)
        s = rng.choice(options)
        if "const" in s:
            return s["const"]
        if "enum" in s:
            return rng.choice(s["enum"])
        if "default" in s and s["default"] is not None and rng.random() < 0.3:
            return copy.deepcopy(s["default"])
        kind = s.get("type")
        if isinstance(kind, list):
            kind = rng.choice([k for k in kind if k != "null"] or kind)
        if kind == "object" or "properties" in s:
            return self.valid_object(s, depth)
        if kind == "array":
            if depth >= MAX_DEPTH or "items" not in s:
                return []
            return [self.valid(s["items"], depth + 1) for _ in range(rng.randint(1, 2))]
        if kind == "string":
            return rng.choice(("w1 w2", "w3", "default"))
        if kind == "integer":
            return rng.choice((1, 2, 8))
        if kind == "number":
            return rng.choice((0.5, 1.0))
        if kind == "boolean":
            return rng.random() < 0.5
        if kind == "null":
            return None
        return {}  # an untyped (free-form) value

    def valid_object(self, s: dict[str, Any], depth: int, keep: tuple[str, ...] = ()) -> dict[str, Any]:
        props = s.get("properties", {})
        required = set(s.get("required", ())) | set(keep)
        out: dict[str, Any] = {}
        for name, sub in props.items():
            if name in required or (depth < MAX_DEPTH and self.rng.random() < 0.15):
                out[name] = self.valid(sub, depth + 1)
        if not props and isinstance(s.get("additionalProperties"), dict) and self.rng.random() < 0.5:
            out["5"] = self.valid(s["additionalProperties"], depth + 1)
        return out

    def mutate(self, body: Any, schema: dict[str, Any]) -> Any:
        """``body`` with one change: a node gets a wrong-typed or edge value, or loses a required field."""
        rng = self.rng
        spots = list(self._spots(body, schema, ()))
        if not spots:
            return body
        path, sub = rng.choice(spots)
        parent = body
        for part in path[:-1]:
            parent = parent[part]
        key = path[-1]
        required = set(self.resolve(sub[1]).get("required", ())) if sub[1] else set()
        if isinstance(parent, dict) and rng.random() < 0.1 and key in required:
            del parent[key]
            return body
        parent[key] = self.broken(sub[0])
        return body

    def broken(self, schema: dict[str, Any] | None) -> Any:
        """A value of another type, or an edge value of a declared type (half each)."""
        rng = self.rng
        kinds = [o.get("type") for o in self.options(schema)] if schema else []
        kinds = [k for k in kinds if isinstance(k, str) and k != "null"]
        if kinds and rng.random() < 0.5:
            kind = rng.choice(kinds)
            if kind == "integer":
                return rng.choice(EDGE_INTS)
            if kind == "number":
                return rng.choice(EDGE_NUMBERS + EDGE_INTS[:4])
            if kind == "string":
                return rng.choice(EDGE_STRINGS)
            if kind == "array":
                return rng.choice(([], [[]], [None], ["x"] * 3, [1_000_000_000]))
            if kind == "object":
                return rng.choice(({}, {"x": 1}, {"type": "x"}, {"type": "json_schema"}, {"properties": "x"}))
        return copy.deepcopy(rng.choice(WRONG_TYPES))

    def _spots(
        self, node: Any, schema: dict[str, Any] | None, path: tuple[Any, ...]
    ) -> Iterator[tuple[tuple[Any, ...], Any]]:
        """(path, (this node's schema or None, its parent's schema)) for every node below the root."""
        if isinstance(node, dict):
            objs = [o for o in self.options(schema) if "properties" in o] if schema else []
            props = objs[0]["properties"] if objs else {}
            for key, value in node.items():
                sub = props.get(key)
                yield (*path, key), (sub, objs[0] if objs else None)
                yield from self._spots(value, sub, (*path, key))
        elif isinstance(node, list):
            arrays = [o for o in self.options(schema) if o.get("type") == "array"] if schema else []
            item = arrays[0].get("items") if arrays else None
            for i, value in enumerate(node):
                yield (*path, i), (item, None)
                yield from self._spots(value, item, (*path, i))


def request_schema(openapi: dict[str, Any], path: str) -> dict[str, Any]:
    """The JSON Schema of a route's request body in an OpenAPI document."""
    return openapi["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]


def fuzz_body(fuzzer: SchemaFuzzer, schema: dict[str, Any], base: dict[str, Any]) -> Any:
    """A broken body for one route: ``base`` (a small valid request) plus optional fields drawn from
    the schema, then one to three mutations; one body in twelve is not an object at all."""
    rng = fuzzer.rng
    if rng.random() < 1 / 12:
        return copy.deepcopy(rng.choice(NON_OBJECT_BODIES))
    resolved = fuzzer.resolve(schema)
    body = {**fuzzer.valid_object(resolved, 1, keep=()), **copy.deepcopy(base)}
    body = {k: v for k, v in body.items() if k not in ("stream_options",) or body.get("stream")}
    for _ in range(rng.randint(1, 3)):
        body = fuzzer.mutate(body, resolved)
    return body
