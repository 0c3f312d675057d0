"""The HTTP boundary's hooks: what one client sends is checked before it can cost anyone else
(``request_guard``, ``openai_guard``; docs/reliability.md).
"""

from __future__ import annotations

from . import openai_guard, request_guard
from .hook import Hook

BOUNDARY_HOOKS: tuple[Hook, ...] = (
    Hook(
        "sglang.srt.managers.io_struct.GenerateReqInput.normalize_batch_and_arguments",
        "AROUND",
        request_guard.guard_normalize,
        "SGLang expands a request n times before checking anything: n must be an int in [1, 128] "
        "first (a string or float n is a 500, a huge one blocks the HTTP process)",
    ),
    Hook(
        "sglang.srt.managers.io_struct.GenerateReqInput.__getitem__",
        "AFTER",
        request_guard.stamp_prompt_index,
        "a batch member remembers its position, so that a 400 names the bad prompt of a batch",
    ),
    Hook(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request",
        "AROUND",
        request_guard.validate_request,
        "what reaches the scheduler must be servable: out-of-vocabulary ids (SGLang never calls its own "
        "check), empty prompts, sampling values of the wrong type or outside what the scheduler's "
        "tensors hold would kill the scheduler; checked here they are a 400",
    ),
    Hook(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager._create_tokenized_object",
        "AROUND",
        request_guard.check_tokenized,
        "the message the scheduler will decode must fit SGLang's own schema (a list extra_key or "
        "custom_logit_processor passes every earlier check); SamplingParams.verify's 400s for one "
        "prompt of a batch name that prompt",
    ),
    Hook(
        "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase._compute_extra_key",
        "AROUND",
        request_guard.extra_key_type_is_a_400,
        "a non-string cache_salt / extra_key in an OpenAI request raises TypeError there, a 500",
    ),
    Hook(
        "sglang.srt.managers.tokenizer_manager.TokenizerManager.generate_request",
        "AROUND",
        request_guard.reserved_rid,
        "a client rid with the warm-up prefix would turn its batch into warm-up rounds (unmeasured, "
        "uncounted); requests over HTTP carry the Request, the start-up warm-up calls it without",
    ),
    Hook(
        "sglang.srt.entrypoints.openai.serving_base.OpenAIServingBase.__init__",
        "AFTER",
        openai_guard.guard_http_app,
        "ChatCompletionRequest's mode='before' validators call .get on the raw body and response_format "
        "(AttributeError, a 500, for [1, 2] or a string); the HTTP app's lifespan builds the OpenAI "
        "handlers before it serves, the moment to wrap its routes' body validation",
    ),
    Hook(
        "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._handle_last_assistant_message",
        "AFTER",
        openai_guard.continue_needs_a_message,
        "continue_final_message on a lone assistant message leaves the chat template no conversation "
        "(IndexError in transformers, a 500)",
    ),
)
