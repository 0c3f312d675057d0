"""HTTP boundary of the OpenAI routes: a body SGLang's request models cannot read is a 400.

FastAPI validates a route's JSON body with SGLang's pydantic request model. Pydantic turns a
ValueError in a validator into a validation error (a 400), but SGLang's ``mode="before"`` model
validators run on the raw JSON before any type check and call ``.get`` on what they assume are
objects: ``ChatCompletionRequest.set_json_schema`` on the body and on ``response_format``
(and on ``response_format.schema``), ``set_tool_choice_default`` and ``normalize_reasoning_inputs``
on the body. A body ``[1, 2]`` or ``"response_format": "json"`` raises AttributeError there, which
FastAPI does not catch: a 500 with a traceback. ``guard_routes`` wraps the validation of every
route's body so that any exception in it is answered as the validation errors are, with a message
naming the part of the body that is wrong (found by validating the body without each field in turn). A body
nested deeper than its cap (``limits.RequestLimits.max_json_depth``) is refused before any validator walks it.

Past validation, ``OpenAIServingChat`` drops the final assistant message of a
``continue_final_message`` request; with no message left the chat template gets an empty
conversation and raises IndexError (a 500): ``continue_needs_a_message`` makes that a 400.

``chat_template_kwargs`` go to the chat template as keyword arguments beside the ones the server
passes itself: a client's ``messages``, ``tools``, ``tokenize``, ``add_generation_prompt`` or
``return_dict`` is a duplicate keyword (TypeError, then KeyError in SGLang's retry: a 500), and a
client's own ``chat_template`` renders in the HTTP process's event loop with no time limit (nested
``range`` loops never end). ``check_template_kwargs`` refuses both with a 400; a launch flag
(``limits.RequestLimits.allow_client_chat_template``) allows client templates.
"""

from __future__ import annotations

import copy
import functools
import sys
from collections.abc import Callable, Mapping
from typing import Any

from sglang_sparsespec.json_depth import value_depth
from sglang_sparsespec.limits import flag_of, request_limits

HTTP_SERVER = "sglang.srt.entrypoints.http_server"
# What SGLang passes to apply_chat_template itself (and its names for the conversation): a client's
# chat_template_kwargs entry of the same name is a duplicate keyword argument.
SERVER_TEMPLATE_ARGS = ("add_generation_prompt", "conversation", "messages", "return_dict", "tokenize", "tools")
MAX_SEARCHED_FIELDS = 128  # ChatCompletionRequest, the largest request model, has under 100
_GUARDED = "_sparsespec_guarded"  # marks a body field whose validation is wrapped


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (for messages)."""
    if value is None:
        return "null"
    names = {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}
    return names.get(type(value), type(value).__name__)


def body_errors(model: type, body: Any, exc: BaseException, loc: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Validation errors (FastAPI's form) for a body whose validation by ``model`` raised ``exc``."""
    if not isinstance(body, Mapping):
        msg = f"the request body must be a JSON object, got {json_type(body)}"
        return [{"type": "model_attributes_type", "loc": loc, "msg": msg, "input": body}]
    for name in _culprits(model, body) if _crashes(model, body) else ():
        errors = _field_errors(model, name, body[name], loc)
        if errors:
            return errors
        msg = f"{name}: this {json_type(body[name])} is not a valid value ({type(exc).__name__}: {exc})"
        return [{"type": "value_error", "loc": (*loc, name), "msg": msg, "input": body[name]}]
    msg = f"the request body could not be read as {model.__name__} ({type(exc).__name__}: {exc})"
    return [{"type": "value_error", "loc": loc, "msg": msg, "input": None}]


def _crashes(model: Any, body: Mapping[str, Any]) -> bool:
    """Whether validating (a deep copy of) ``body`` raises something other than a validation error."""
    from pydantic import ValidationError

    try:
        model.model_validate(snapshot(dict(body)))  # SGLang's validators change what they read in place
    except ValidationError:
        return False
    except Exception:  # noqa: BLE001
        return True
    return False


def _culprits(model: Any, body: Mapping[str, Any]) -> list[str]:
    """The first field without which the body validates or fails cleanly. One validation per field, on
    the error path only; a body of more fields than any request model has is not searched (a client
    could otherwise make each bad request cost fields x validations)."""
    if len(body) > MAX_SEARCHED_FIELDS:
        return []
    for name in body:
        if not _crashes(model, {k: v for k, v in body.items() if k != name}):
            return [name]
    return []


def snapshot(body: Any) -> Any:
    """The body with its top level and the objects directly under it copied: what SGLang's
    before-validators change in place (``response_format.pop("schema")``, defaults set on the body)
    before they fail, so that the failure can be reproduced on the error path. O(fields), no deep copy."""
    if not isinstance(body, dict):
        return body
    return {k: dict(v) if isinstance(v, dict) else v for k, v in body.items()}


def _field_errors(model: Any, name: str, value: Any, loc: tuple[Any, ...]) -> list[dict[str, Any]]:
    """Pydantic's own errors for one field checked against its declared type alone."""
    from pydantic import ValidationError

    field = model.model_fields.get(name)
    if field is None:
        return []
    try:
        _adapter(model, name).validate_python(copy.deepcopy(value))
    except ValidationError as e:
        return [{**err, "loc": (*loc, name, *err["loc"])} for err in e.errors(include_url=False)]
    except Exception:  # noqa: BLE001 - the field's own validators fail too: described by the caller
        return []
    return []


@functools.cache
def _adapter(model: Any, name: str) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(model.model_fields[name].annotation)


def guarded_validate(validate: Callable, model: type) -> Callable:
    """FastAPI's ModelField.validate for a body of ``model``: exceptions other than pydantic's become
    validation errors (FastAPI answers them through SGLang's RequestValidationError handler: a 400)."""

    @functools.wraps(validate)
    def wrapper(value: Any, values: dict[str, Any] | None = None, *, loc: tuple[Any, ...] = ()) -> Any:
        depth, cap = value_depth(value), request_limits().max_json_depth
        if depth > cap:  # before SGLang's recursive validators and schema conversion (RecursionError: a 500)
            flag = flag_of("max_json_depth")
            msg = f"the request body nests {depth} levels deep, above this server's cap of {cap} ({flag})"
            return None, [{"type": "value_error", "loc": loc, "msg": msg, "input": None}]
        before = snapshot(value)
        try:
            return validate(value, values if values is not None else {}, loc=loc)
        except Exception as e:  # noqa: BLE001 - ValidationError never reaches here (validate returns it)
            return None, body_errors(model, before, e, loc)

    return wrapper


def guard_routes(app: Any) -> int:
    """Wrap the body validation of every route of ``app`` whose body is a pydantic model; returns how
    many were wrapped now (a route already wrapped is left alone)."""
    from pydantic import BaseModel

    done = 0
    for route in getattr(app, "routes", ()):
        dependant = getattr(route, "dependant", None)
        for field in getattr(dependant, "body_params", None) or ():
            model = field.field_info.annotation
            if vars(field).get(_GUARDED) or not (isinstance(model, type) and issubclass(model, BaseModel)):
                continue
            field.validate = guarded_validate(field.validate, model)
            setattr(field, _GUARDED, True)
            done += 1
    return done


def check_template_kwargs(kwargs: Mapping[str, Any] | None, allow_client_template: bool) -> None:
    """ValueError for chat_template_kwargs the server's template call cannot take from a client."""
    reserved = sorted(set(kwargs or ()) & set(SERVER_TEMPLATE_ARGS))
    if reserved:
        raise ValueError(
            f"chat_template_kwargs may not set {', '.join(reserved)}: the server passes "
            f"{'it' if len(reserved) == 1 else 'them'} to the chat template itself"
        )
    if "chat_template" in (kwargs or ()) and not allow_client_template:
        flag = flag_of("allow_client_chat_template")
        raise ValueError(
            "chat_template_kwargs.chat_template: this server renders only its own chat template (a client's "
            f"template would run in the HTTP process with no time limit; a server started with {flag} true "
            "accepts one)"
        )


# ---- hooks (registered in patches/hooks_boundary.py) ------------------------------------------------
def guard_http_app(result, serving, *args, **kwargs):
    """OpenAIServingBase.__init__ (AFTER): the OpenAI handlers are built in the HTTP app's lifespan,
    before it serves; its routes' body validation is guarded then (no-op outside the HTTP server)."""
    module = sys.modules.get(HTTP_SERVER)
    if module is not None:
        guard_routes(module.app)
    return result


def continue_needs_a_message(result, serving, messages, request, *args, **kwargs):
    """OpenAIServingChat._handle_last_assistant_message (AFTER): a conversation left empty is a 400."""
    remaining, prefix = result
    if not remaining:
        raise ValueError(
            "continue_final_message continues the final assistant message after the conversation before "
            "it: send at least one message before that assistant message"
        )
    return result


def template_kwargs_are_checked(original, serving, request, *args, **kwargs):
    """OpenAIServingChat._process_messages (AROUND): the client's chat_template_kwargs, before the
    server's --default-chat-template-kwargs are merged into them."""
    check_template_kwargs(request.chat_template_kwargs, request_limits().allow_client_chat_template)
    return original(serving, request, *args, **kwargs)
