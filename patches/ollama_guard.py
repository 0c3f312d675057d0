"""The Ollama-compatible routes (``/api/generate``, ``/api/chat``): a bad request is a 400 there too.

SGLang's Ollama handlers call the tokenizer manager without the ``except ValueError`` every other route
has, so each of its 400s (an unknown option such as ``seed``, ``top_k`` 2^40, ``temperature`` "hot")
and a chat template's own refusal (``raise_exception`` in Jinja) end in a 500. A streamed response is
built before the request is checked, so its first chunk is awaited here: a refusal is then a 400, not
a 200 whose stream breaks off.
"""

from __future__ import annotations

from collections.abc import AsyncIterator


async def _resumed(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for chunk in rest:
        yield chunk


async def _no_chunks() -> AsyncIterator[bytes]:
    return
    yield b""  # an async generator that yields nothing


# ---- hooks (registered in patches/hooks_boundary.py) -----------------------------------------------
async def client_errors_are_400(original, serving, request, raw_request, *args, **kwargs):
    """OllamaServing.handle_generate / handle_chat (AROUND): ValueError, template errors and an empty
    conversation -> 400."""
    import jinja2
    from fastapi import HTTPException
    from fastapi.responses import StreamingResponse

    if getattr(request, "messages", None) == []:  # /api/chat: chat templates index the conversation (IndexError)
        raise HTTPException(status_code=400, detail="messages is empty: a chat needs at least one message")
    try:
        response = await original(serving, request, raw_request, *args, **kwargs)
        if isinstance(response, StreamingResponse):
            chunks = response.body_iterator
            try:
                first = await chunks.__anext__()
            except StopAsyncIteration:
                response.body_iterator = _no_chunks()
            else:
                response.body_iterator = _resumed(first, chunks)
        return response
    except (ValueError, jinja2.TemplateError) as e:
        raise HTTPException(status_code=400, detail=str(e)) from None
