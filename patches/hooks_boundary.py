"""The HTTP boundary's hooks: what one client sends is checked before it can cost anyone else, and
no client can take or end another's request (``request_guard``, ``request_caps``, ``openai_guard``,
``ollama_guard``, ``live_rids``; docs/reliability.md).
"""

from __future__ import annotations

from . import live_rids, ollama_guard, openai_guard, request_caps, request_guard
from .hook import Hook
from .versions import releases

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
        "a non-string cache_salt / extra_key in an OpenAI request raises TypeError there, a 500 (0.5.18 "
        "removed the method: the request types cache_salt, a non-string one is FastAPI's 422)",
        versions=("0.5.17",),
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
    Hook(
        "sglang.srt.server_args.ServerArgs.__post_init__",
        "AFTER",
        request_caps.validate_limit_flags,
        "a request cap given a bad value (--pillar-max-top-logprobs abc) fails at launch, in one line",
        versions=releases(last="0.5.18"),
    ),
    Hook(
        "sglang.srt.server_args.ServerArgs.resolve_once",
        "AFTER",
        request_caps.validate_limit_flags,
        "the same, where 0.5.19 resolves ServerArgs (apart from construction)",
        versions=releases("0.5.19"),
    ),
    Hook(
        "sglang.srt.managers.io_struct.GenerateReqInput._determine_batch_size",
        "AFTER",
        request_caps.bounded_fanout,
        "the first count of a request's prompts, before SGLang expands them n times: 128 prompts x n = 128 "
        "made 16,384 requests of an 830-byte body",
    ),
    Hook(
        "sglang.srt.entrypoints.openai.serving_chat.OpenAIServingChat._process_messages",
        "AROUND",
        openai_guard.template_kwargs_are_checked,
        "chat_template_kwargs reach apply_chat_template as keywords: a client's copy of one the server "
        "passes is a 500, a client's own chat_template renders in the event loop with no time limit "
        "(every chat route, /v1/tokenize and /v1/messages included, goes through here)",
    ),
    Hook(
        "sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_generate",
        "AROUND",
        ollama_guard.client_errors_are_400,
        "/api/generate calls the tokenizer manager without catching its ValueErrors: every 400 is a 500",
    ),
    Hook(
        "sglang.srt.entrypoints.ollama.serving.OllamaServing.handle_chat",
        "AROUND",
        ollama_guard.client_errors_are_400,
        "/api/chat, the same, and a chat template's own refusal (a jinja2 TemplateError) too",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.handle_generate_request",
        "AROUND",
        live_rids.refuse_live_duplicate,
        "with --tokenizer-worker-num > 1 two live requests can share a rid at the scheduler (each worker "
        "checks its own); the detokenizer and everything else keyed by rid mixed them up",
    ),
    Hook(
        "sglang.srt.managers.scheduler.Scheduler.abort_request",
        "AROUND",
        live_rids.exact_abort,
        "SGLang aborts every request whose rid starts with the aborted one (an abort of '7f' reached a "
        "sixteenth of the uuid-hex rids); a request is aborted by its own rid or its parent's",
    ),
)
