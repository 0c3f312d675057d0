"""Malformed and unusual requests for the reliability run: the hand list (the fuzzer is ``fuzz_probes``).

Every entry is a ``Probe``: a route, a JSON body and the HTTP status the plugin must answer with
(``expect``; None for fuzzed bodies, which may happen to be valid: any status below 500 is right).
A streamed native ``/generate`` request is answered 200 before SGLang validates it, so its error
comes as the first SSE event; ``effective_status`` reads that event's ``code``. A probe with ``live``
requests is sent while those run (``benchmarks/checks/live_probes.py``): a second request under a live rid,
an abort whose rid is a prefix of another live one; each live request must then end as its own
client expects (``aborts``: the rids the probe itself ends).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sglang_sparsespec.limits import RequestLimits


GENERATE, COMPLETIONS, CHAT = "/generate", "/v1/completions", "/v1/chat/completions"
OLLAMA_GENERATE, OLLAMA_CHAT, ABORT = "/api/generate", "/api/chat", "/abort_request"
TEXT = "Count from one to five."
HUGE_ID = 1_000_000_000


@dataclass(frozen=True)
class Probe:
    name: str
    path: str
    body: Any
    expect: int | None  # None: any status below 500
    live: tuple[Any, ...] = ()  # /generate bodies (each with a rid) running while the probe is sent
    aborts: tuple[str, ...] = ()  # rids of the live requests the probe ends; the others must end normally

    @property
    def stream(self) -> bool:
        return isinstance(self.body, dict) and bool(self.body.get("stream"))

    def judge(self, status: int | None) -> bool:
        if status is None:
            return False
        return status == self.expect if self.expect is not None else status < 500


def effective_status(http_status: int, body: bytes) -> int:
    """The HTTP status, or for an SSE stream whose first event is an error, that error's code."""
    text = body.decode("utf-8", errors="replace").lstrip()
    if http_status == 200 and text.startswith("data:"):
        try:
            first = json.loads(text.split("\n", 1)[0][len("data:") :])
        except ValueError:
            return http_status
        if isinstance(first, dict) and isinstance(first.get("error"), dict):
            return int(first["error"].get("code", 400))
    return http_status


def hand_list(vocab_size: int, context_len: int) -> list[Probe]:
    """Malformed requests per route, each expecting a 400 with a message; then unusual valid ones (200)."""
    ids = [1, 2, 3]
    msgs = [{"role": "user", "content": TEXT}]

    def gen(name: str, expect: int = 400, **body: Any) -> Probe:
        return Probe(name, GENERATE, {"text": TEXT, **body}, expect)

    def sp(name: str, expect: int = 400, **params: Any) -> Probe:
        return gen(name, expect, sampling_params={"max_new_tokens": 8, **params})

    bad = [
        Probe("oov_token_id", GENERATE, {"input_ids": [HUGE_ID, 5]}, 400),
        Probe("negative_token_id", GENERATE, {"input_ids": [5, -1]}, 400),
        Probe("empty_input_ids", GENERATE, {"input_ids": []}, 400),
        gen("empty_text", text=""),
        Probe("no_input", GENERATE, {"sampling_params": {}}, 400),
        Probe("body_not_object", GENERATE, [1, 2], 400),
        Probe("empty_text_batch", GENERATE, {"text": [], "sampling_params": {"max_new_tokens": 8}}, 400),
        Probe("batch_one_empty_prompt", GENERATE, {"input_ids": [ids, []]}, 400),
        Probe("batch_one_oov_prompt", GENERATE, {"input_ids": [ids, [HUGE_ID]]}, 400),
        gen("batch_one_bad_sampling", text=[TEXT, TEXT], sampling_params=[{"max_new_tokens": 8}, {"temperature": -1}]),
        gen("batch_sampling_list_short", text=[TEXT, TEXT, TEXT], sampling_params=[{"max_new_tokens": 8}]),
        gen("batch_bootstrap_room_short", text=[TEXT, TEXT, TEXT], bootstrap_room=[2]),
        gen("batch_modalities_short", text=[TEXT, TEXT, TEXT], modalities=["image"]),
        gen("batch_lora_id_short", text=[TEXT, TEXT, TEXT], lora_id=["a"]),
        Probe("context_overflow", GENERATE, {"input_ids": [5] * (context_len + 16)}, 400),
        Probe(
            "context_plus_new_overflow",
            GENERATE,
            {"input_ids": [5] * (context_len - 64), "sampling_params": {"max_new_tokens": 1024}},
            400,
        ),
        sp("max_new_tokens_negative", max_new_tokens=-1),
        sp("max_new_tokens_huge", max_new_tokens=10**9),
        sp("max_new_tokens_float", max_new_tokens=10.5),
        sp("max_new_tokens_string", max_new_tokens="16"),
        sp("temperature_negative", temperature=-0.5),
        sp("temperature_string", temperature="hot"),
        sp("top_p_zero", top_p=0),
        sp("top_p_above_one", top_p=1.5),
        sp("top_k_zero", top_k=0),
        sp("top_k_int32_overflow", top_k=2**40),
        sp("top_k_float", top_k=2.5),
        sp("min_p_negative", min_p=-0.1),
        sp("min_p_above_one", min_p=1.5),
        sp("repetition_penalty_zero", repetition_penalty=0),
        sp("min_new_tokens_above_max", min_new_tokens=100),
        sp("stop_not_string", stop=[5]),
        sp("stop_regex_invalid", stop_regex="("),
        sp("stop_token_ids_oov", stop_token_ids=[HUGE_ID], min_new_tokens=2),
        sp("logit_bias_oov_key", logit_bias={str(HUGE_ID): 1.0}),
        sp("logit_bias_not_finite", logit_bias={"5": 1e300}),
        sp("logit_bias_string_value", logit_bias={"5": "x"}),
        sp("unknown_sampling_param", foo=1),
        sp("json_schema_not_string", json_schema={"type": "object"}),
        sp("skip_special_tokens_string", skip_special_tokens="no"),
        gen("stream_interval_string", stream=True, sampling_params={"max_new_tokens": 8, "stream_interval": "x"}),
        sp("n_zero", n=0),
        sp("n_float", n=2.5),
        sp("n_huge", n=10**6),
        sp("n_null", n=None),
        gen("top_logprobs_huge", return_logprob=True, top_logprobs_num=vocab_size + 1),
        gen("top_logprobs_negative", return_logprob=True, top_logprobs_num=-3),
        gen("token_ids_logprob_oov", return_logprob=True, token_ids_logprob=[HUGE_ID]),
        gen("return_hidden_states", return_hidden_states=True),
        gen("image_on_text_model", image_data="https://example.invalid/cat.png"),
        Probe("stream_oov_token_id", GENERATE, {"input_ids": [HUGE_ID], "stream": True}, 400),
        Probe("completions_empty_prompt", COMPLETIONS, {"model": "default", "prompt": ""}, 400),
        Probe("completions_oov_ids", COMPLETIONS, {"model": "default", "prompt": [HUGE_ID, 5]}, 400),
        Probe(
            "completions_max_tokens_negative", COMPLETIONS, {"model": "default", "prompt": TEXT, "max_tokens": -1}, 400
        ),
        Probe(
            "completions_logprobs_huge",
            COMPLETIONS,
            {"model": "default", "prompt": TEXT, "logprobs": vocab_size + 1},
            400,
        ),
        Probe("completions_top_k_overflow", COMPLETIONS, {"model": "default", "prompt": TEXT, "top_k": 2**40}, 400),
        Probe("completions_batch_one_oov", COMPLETIONS, {"model": "default", "prompt": [ids, [HUGE_ID]]}, 400),
        Probe("completions_stream_oov", COMPLETIONS, {"model": "default", "prompt": [HUGE_ID], "stream": True}, 400),
        Probe("chat_empty_messages", CHAT, {"model": "default", "messages": []}, 400),
        Probe(
            "chat_top_logprobs_huge",
            CHAT,
            {"model": "default", "messages": msgs, "logprobs": True, "top_logprobs": vocab_size + 1},
            400,
        ),
        Probe("chat_temperature_string", CHAT, {"model": "default", "messages": msgs, "temperature": "hot"}, 400),
        Probe(
            "chat_stop_token_ids_oov",
            CHAT,
            {"model": "default", "messages": msgs, "stop_token_ids": [HUGE_ID], "min_tokens": 2},
            400,
        ),
        Probe(
            "chat_stream_top_k_overflow",
            CHAT,
            {"model": "default", "messages": msgs, "top_k": 2**40, "stream": True},
            400,
        ),
        Probe("chat_body_not_object", CHAT, [1, 2], 400),
        Probe("chat_body_string", CHAT, "hello", 400),
        Probe("chat_body_null", CHAT, None, 400),
        Probe("completions_body_not_object", COMPLETIONS, [1, 2], 400),
        Probe(
            "chat_response_format_string", CHAT, {"model": "default", "messages": msgs, "response_format": "json"}, 400
        ),
        Probe(
            "chat_response_format_list", CHAT, {"model": "default", "messages": msgs, "response_format": ["json"]}, 400
        ),
        Probe(
            "chat_json_schema_not_object",
            CHAT,
            {"model": "default", "messages": msgs, "response_format": {"type": "json_schema", "schema": "x"}},
            400,
        ),
        Probe(
            "chat_json_schema_properties_string",
            CHAT,
            {
                "model": "default",
                "messages": msgs,
                "response_format": {"type": "json_schema", "schema": {"properties": "strict"}},
            },
            400,
        ),
        Probe(
            "chat_continue_lone_assistant",
            CHAT,
            {"model": "default", "messages": [{"role": "assistant", "content": TEXT}], "continue_final_message": True},
            400,
        ),
        Probe("chat_messages_not_list", CHAT, {"model": "default", "messages": TEXT}, 400),
        Probe("chat_message_not_object", CHAT, {"model": "default", "messages": [1]}, 400),
        Probe("chat_tools_string", CHAT, {"model": "default", "messages": msgs, "tools": "x"}, 400),
        Probe(
            "chat_logit_bias_string_value", CHAT, {"model": "default", "messages": msgs, "logit_bias": {"5": "x"}}, 400
        ),
        Probe("chat_stop_int", CHAT, {"model": "default", "messages": msgs, "stop": 5}, 400),
        Probe("chat_n_string", CHAT, {"model": "default", "messages": msgs, "n": "two"}, 400),
        Probe("chat_rid_warmup_prefix", CHAT, {"model": "default", "messages": msgs, "rid": "__pillar_warmup__7"}, 400),
        Probe("completions_empty_prompt_list", COMPLETIONS, {"model": "default", "prompt": []}, 400),
        Probe("batch_one_bad_completions_empty_text", COMPLETIONS, {"model": "default", "prompt": [TEXT, ""]}, 400),
        Probe(
            "completions_max_tokens_string",
            COMPLETIONS,
            {"model": "default", "prompt": TEXT, "max_tokens": "eight"},
            400,
        ),
        gen("top_logprobs_num_list", return_logprob=True, top_logprobs_num=[]),
        gen("rid_warmup_prefix", rid="__pillar_warmup__1"),
        gen("batch_rid_warmup_prefix", text=[TEXT, TEXT], rid=["a", "__pillar_warmup__2"]),
        Probe(
            "completions_cache_salt_list", COMPLETIONS, {"model": "default", "prompt": TEXT, "cache_salt": ["a"]}, 400
        ),
        Probe("extra_key_list", GENERATE, {"text": TEXT, "extra_key": ["a", "b"]}, 400),
    ]
    bad += _costs_and_templates(msgs, sp, gen) + _ollama() + _live()
    unusual_but_valid = [
        sp("stop_never_matches", 200, stop=["\u2603 never \u2603"], max_new_tokens=16),
        sp("n_two", 200, n=2),
        gen("logprobs_top5", 200, sampling_params={"max_new_tokens": 8}, return_logprob=True, top_logprobs_num=5),
        gen("batch_all_good", 200, text=[TEXT, TEXT], sampling_params={"max_new_tokens": 8}),
        Probe(
            "completions_logprobs",
            COMPLETIONS,
            {"model": "default", "prompt": TEXT, "max_tokens": 8, "logprobs": 3},
            200,
        ),
        Probe("chat_n_two", CHAT, {"model": "default", "messages": msgs, "max_tokens": 8, "n": 2}, 200),
        sp("stop_regex_unbounded", 200, stop_regex=r"\n\s*\n"),
        sp("stop_regex_two_open_repeats", 200, stop_regex=r"Answer:\s*\d+"),
        Probe(
            "ollama_chat",
            OLLAMA_CHAT,
            {"model": "default", "messages": msgs, "stream": False, "options": {"num_predict": 8}},
            200,
        ),
        gen(
            "top_logprobs_at_cap",
            200,
            sampling_params={"max_new_tokens": 8},
            return_logprob=True,
            top_logprobs_num=RequestLimits().max_top_logprobs,
        ),
    ]
    return bad + unusual_but_valid


def _costs_and_templates(msgs: list[dict[str, Any]], sp: Any, gen: Any) -> list[Probe]:
    """Requests above a cap of ``sglang_sparsespec.limits`` (its defaults), stop patterns that backtrack
    exponentially or polynomially past the cubic, grammars nested past the cap, and chat template arguments a client
    may not set: 400 each."""
    caps = RequestLimits()
    deep = caps.max_json_depth + 36
    schema = '{"type": "array", "items": ' * deep + '{"type": "string"}' + "}" * deep
    over = caps.max_top_logprobs + 1
    prompts = [TEXT] * (caps.max_fanout // 128 + 1)  # x n = 128 (OpenAI's limit): one request past the cap

    def chat(name: str, **body: Any) -> Probe:
        return Probe(name, CHAT, {"model": "default", "messages": msgs, "max_tokens": 8, **body}, 400)

    def template(name: str, key: str, value: Any) -> Probe:
        return chat(f"chat_template_{name}", chat_template_kwargs={key: value})

    return [
        template("client", "chat_template", "{{ messages[0]['content'] }}"),
        template("messages", "messages", []),
        template("tokenize", "tokenize", True),
        template("add_generation_prompt", "add_generation_prompt", False),
        template("tools", "tools", "x"),
        template("return_dict", "return_dict", True),
        sp("stop_regex_backtracking", stop_regex="(a+)+$"),
        sp("stop_regex_nested_alternatives", stop_regex=["x", "(a|aa)+$"]),
        chat("chat_stop_regex_backtracking", stop_regex=r"(\d*)*x"),
        gen("top_logprobs_over_cap", return_logprob=True, top_logprobs_num=over),
        Probe(
            "top_logprobs_completions_over_cap",
            COMPLETIONS,
            {"model": "default", "prompt": TEXT, "logprobs": over},
            400,
        ),
        chat("top_logprobs_chat_over_cap", logprobs=True, top_logprobs=over),
        gen(
            "token_ids_logprob_over_cap",
            return_logprob=True,
            token_ids_logprob=list(range(1, caps.max_token_ids_logprob + 2)),
        ),
        gen("n_times_prompts", text=prompts, sampling_params={"max_new_tokens": 8, "n": 128}),
        Probe("n_times_prompts_completions", COMPLETIONS, {"model": "default", "prompt": prompts, "n": 128}, 400),
        sp("stop_strings_over_cap", stop=[f"stop{i}" for i in range(caps.max_stop_strings + 1)]),
        sp("stop_string_too_long", stop=" ".join(["stop"] * (caps.max_stop_tokens + 1))),
        sp("stop_empty", stop=["x", ""]),
        sp("stop_regex_open_repeats", stop_regex=".*.*.*Z"),
        sp("stop_regex_too_long", stop_regex="a" * (caps.max_stop_regex_chars + 1)),
        sp("json_schema_too_deep", json_schema=schema),
        sp("regex_too_long", regex="a" * (caps.max_grammar_chars + 1)),
        chat(
            "chat_response_format_too_deep",
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": json.loads(schema)}},
        ),
        sp("temperature_past_fp32", temperature=1e39),
        gen("rid_empty", rid=""),
        sp("logit_bias_over_cap", logit_bias={str(i): 0.5 for i in range(caps.max_logit_bias + 1)}),
    ]


def _ollama() -> list[Probe]:
    """Ollama's /api/generate: SGLang's own 400s surfaced there as 500s."""

    def ollama(name: str, stream: bool = False, **options: Any) -> Probe:
        body = {"model": "default", "prompt": TEXT, "stream": stream, "options": {"num_predict": 8, **options}}
        return Probe(name, OLLAMA_GENERATE, body, 400)

    return [
        ollama("ollama_generate_seed", seed=7),
        ollama("ollama_generate_top_k_overflow", top_k=2**40),
        ollama("ollama_generate_temperature_string", temperature="hot"),
        ollama("ollama_generate_stream_temperature_string", stream=True, temperature="hot"),
        Probe("ollama_chat_no_messages", OLLAMA_CHAT, {"model": "default", "messages": [], "stream": False}, 400),
    ]


def _live() -> list[Probe]:
    """Requests that reach another client's: a second request under a live rid, and an abort of a rid
    that is a prefix of another live rid (SGLang's scheduler matches aborts by prefix)."""

    def running(rid: str) -> dict[str, Any]:
        return {
            "rid": rid,
            "text": TEXT,
            "stream": True,
            "sampling_params": {"max_new_tokens": 512, "ignore_eos": True},
        }

    victim = "7f3c9e0d1a2b4c5d6e7f8091a2b3c4d5"
    return [
        Probe(
            "duplicate_rid",
            GENERATE,
            {"rid": "dup-rid-1", "text": TEXT, "sampling_params": {"max_new_tokens": 8}},
            400,
            live=(running("dup-rid-1"),),
        ),
        Probe("abort_prefix", ABORT, {"rid": "7f"}, 200, live=(running(victim), running("7f")), aborts=("7f",)),
    ]
