"""patches/openai_guard.py and benchmarks/checks/schema_fuzz.py on their own (SGLang's app: test_request_guard.py)."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any, Optional

import pytest
from pydantic import BaseModel, model_validator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_sparsespec.patches.openai_guard import (
    MAX_SEARCHED_FIELDS,
    body_errors,
    continue_needs_a_message,
    guard_routes,
)
from sglang_sparsespec.patches.request_guard import check_client_rids, check_top_logprobs

from benchmarks.checks.bad_inputs import CHAT, COMPLETIONS, GENERATE
from benchmarks.checks.fuzz_probes import fuzz_inputs
from benchmarks.checks.schema_fuzz import NON_OBJECT_BODIES, SchemaFuzzer, fuzz_body


class _Req(BaseModel):
    """Reads the raw body in a before-validator, as SGLang's ChatCompletionRequest does."""

    messages: list[str]
    response_format: Optional[dict[str, Any]] = None  # noqa: UP045 (FastAPI reads it at runtime)

    @model_validator(mode="before")
    @classmethod
    def read_format(cls, values):
        fmt = values.get("response_format")
        if fmt:
            fmt.get("type")
        return values


def _app():
    from fastapi import FastAPI

    app = FastAPI()

    async def chat(req: _Req) -> dict[str, int]:
        return {"n": len(req.messages)}

    chat.__annotations__ = {"req": _Req, "return": dict}  # resolved types (this module defers annotations)
    app.post("/chat")(chat)
    return app


def _post(app, body: Any) -> tuple[int, str]:
    import httpx

    async def go():
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            r = await client.post("/chat", content=json.dumps(body), headers={"Content-Type": "application/json"})
            return r.status_code, r.text

    return asyncio.run(go())


def test_a_crashing_request_validator_becomes_a_validation_error():
    app = _app()
    assert _post(app, [1, 2])[0] == 500  # the before-validator's AttributeError
    assert _post(app, {"messages": ["a"], "response_format": "json"})[0] == 500
    assert guard_routes(app) == 1 and guard_routes(app) == 0  # idempotent
    status, text = _post(app, [1, 2])
    assert status == 422 and "the request body must be a JSON object, got array" in text
    status, text = _post(app, {"messages": ["a"], "response_format": "json"})
    assert status == 422 and "response_format" in text and "valid dictionary" in text
    assert _post(app, {"messages": ["a"], "response_format": {"type": "x"}}) == (200, '{"n":1}')
    assert _post(app, {"messages": 3})[0] == 422  # pydantic's own errors are untouched


def test_body_errors_name_the_field_that_breaks_the_model():
    from pydantic import BaseModel, model_validator

    class Req(BaseModel):
        a: int = 0
        fmt: dict[str, Any] | None = None

        @model_validator(mode="before")
        @classmethod
        def read(cls, values):
            schema = (values.get("fmt") or {}).get("schema")
            if schema:
                schema.get("title")
            return values

    body = {"a": 1, "fmt": {"schema": "x"}}
    try:
        Req.model_validate(body)
    except AttributeError as e:
        errors = body_errors(Req, body, e, ("body",))
    assert errors[0]["loc"] == ("body", "fmt") and "fmt: this object is not a valid value" in errors[0]["msg"]
    assert body == {"a": 1, "fmt": {"schema": "x"}}  # the search validates copies
    assert body_errors(Req, None, AttributeError("x"), ("body",))[0]["msg"].endswith("got null")
    padded = {**body, **{f"x{i}": i for i in range(MAX_SEARCHED_FIELDS)}}  # not searched field by field
    errors = body_errors(Req, padded, AttributeError("boom"), ("body",))
    assert errors[0]["loc"] == ("body",) and "could not be read as Req (AttributeError: boom)" in errors[0]["msg"]


def test_continue_final_message_needs_a_conversation_before_the_prefix():
    kept = ([{"role": "user", "content": "hi"}], "Sure")
    assert continue_needs_a_message(kept, None, [], None) is kept
    with pytest.raises(ValueError, match="at least one message before"):
        continue_needs_a_message(([], "Sure"), None, [], None)


def test_client_rids_and_top_logprobs_shape():
    check_client_rids("abc")
    check_client_rids(["a", None, "b"])
    check_client_rids(None)
    with pytest.raises(ValueError, match="reserved for the server's warm-up"):
        check_client_rids(["a", "__pillar_warmup__3"])
    check_top_logprobs(5, 100)
    with pytest.raises(ValueError, match="one integer per prompt"):
        check_top_logprobs([], 100)
    with pytest.raises(ValueError, match="one integer per prompt"):
        check_top_logprobs(True, 100)


@pytest.fixture(scope="module")
def chat_schema() -> dict[str, Any]:
    pytest.importorskip("sglang")
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    return ChatCompletionRequest.model_json_schema()


def test_schema_fuzzer_builds_valid_bodies_and_breaks_nested_fields(chat_schema):
    from pydantic import ValidationError
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest

    fuzzer = SchemaFuzzer(chat_schema, random.Random(3))
    valid_ok = 0
    for _ in range(40):
        body = fuzzer.valid_object(chat_schema, 1, keep=("messages",))
        try:
            ChatCompletionRequest.model_validate(body)
            valid_ok += 1
        except (ValidationError, ValueError):
            pass
    assert valid_ok >= 10  # cross-field rules are not modelled, types are

    base = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    bodies = [fuzz_body(SchemaFuzzer(chat_schema, random.Random(i)), chat_schema, base) for i in range(300)]
    again = [fuzz_body(SchemaFuzzer(chat_schema, random.Random(i)), chat_schema, base) for i in range(300)]
    assert bodies == again  # seeded
    assert any(b in NON_OBJECT_BODIES for b in bodies)
    nested = [
        b
        for b in bodies
        if isinstance(b, dict)
        and isinstance(b.get("messages"), list)
        and b["messages"]
        and isinstance(b["messages"][0], dict)
        and b["messages"][0].get("content") != "hi"
    ]
    assert len(nested) >= 10  # mutations reach inside the messages, not only top-level fields


def test_fuzz_inputs_cover_every_route_with_schema_aware_openai_bodies():
    pytest.importorskip("sglang")
    from sglang.srt.entrypoints.http_server import app

    openapi = app.openapi()
    probes = fuzz_inputs(openapi, seed=5, count=90, vocab_size=1000)
    assert probes == fuzz_inputs(openapi, seed=5, count=90, vocab_size=1000)
    assert {p.path for p in probes} == {GENERATE, COMPLETIONS, CHAT}
    chat = [p.body for p in probes if p.path == CHAT and isinstance(p.body, dict)]
    # Optional fields drawn from the schema besides the base body's.
    assert len({k for b in chat for k in b} - {"model", "messages", "max_tokens"}) >= 20
