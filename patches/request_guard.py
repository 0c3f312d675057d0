"""Tokenizer-manager boundary: a request the scheduler cannot serve is a 400, checked before dispatch.

SGLang 0.5.17 validates part of a request in the HTTP process (a ValueError there is a 400 and
the server keeps serving); what passes reaches the scheduler, where some fields go straight into
GPU tensors and a bad value kills the scheduler for everyone (docs/reliability.md has the table).
The checks added here, for every algorithm once the plugin is installed:

* token ids outside [0, vocab) (SGLang defines such a check but never calls it), empty prompts,
  ``input_embeds`` rows of the wrong width, image/video/audio data for a text-only model;
* every ``sampling_params`` / ``session_params`` value against the type SGLang's own message schema
  gives it (with SGLANG_USE_PICKLE_IPC=0 the scheduler decodes against it and dies on a mismatch;
  with pickle IPC the value fails later, e.g. a string ``stream_interval`` or ``logit_bias``
  value), and unknown parameter names (a TypeError, so a 500, in stock SGLang); the whole tokenized
  request is then decoded against that schema before it is dispatched;
* ranges the scheduler's tensors need: ``top_k`` fits int32, ``stop_token_ids`` in the vocabulary
  (min_new_tokens scatters them into a vocab row), ``logit_bias`` finite in fp32, ``sampling_seed``
  fits int64, ``top_logprobs_num`` in [0, vocab] (a topk over the vocabulary), ``stop_regex``
  compiles and repeats no group that can itself match in several ways (``(a+)+``: exponential
  backtracking in the scheduler, ``sglang_sparsespec/stop_regex.py``);
* the request caps of ``sglang_sparsespec/limits.py`` (``request_caps``), each a launch flag;
* the request's shape: ``n`` an int in [1, MAX_PARALLEL_SAMPLES] before SGLang expands the batch by
  it, one entry per prompt in every per-prompt list, one ``rid`` and one ``sampling_params`` object
  and an integer ``top_logprobs_num`` for a single prompt;
* a client's ``rid`` does not start with the prefix that marks PILLAR's start-up warm-up requests
  (``rounds/warmup.py``: their rounds are kept out of the cost model and the metrics, so a client
  batch under that prefix would run unmeasured warm-up rounds).

Errors of one prompt of a batch name it ("prompt 2 of 3 in the batch: ...").
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sglang_sparsespec.json_depth import text_depth
from sglang_sparsespec.limits import flag_of, request_limits
from sglang_sparsespec.stop_regex import MAX_VARIABLE_REPEATS, nested_repetition, variable_repeats

from .request_caps import bound_stop_search, check_request_caps

# OpenAI's limit for n. SGLang expands a request n times in the HTTP process before anything is
# checked, so an unbounded n (say 10**6) blocks that process for everyone.
MAX_PARALLEL_SAMPLES = 128
I32_MAX = 2**31 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
FP32_MAX = 3.4028234663852886e38
# Grammars the scheduler's grammar thread compiles; the JSON ones are checked for nesting as well.
GRAMMARS = ("json_schema", "regex", "ebnf", "structural_tag")
JSON_GRAMMARS = ("json_schema", "structural_tag")
# SamplingParams fields that SGLang fills itself (its "Internal fields" block); not request parameters.
INTERNAL_FIELDS = frozenset({"stop_strs", "stop_regex_strs", "stop_str_max_len", "stop_regex_max_len", "is_normalized"})
# GenerateReqInput attributes that __getitem__ indexes per prompt and that a client may send as lists.
PER_PROMPT_LISTS = (
    "sampling_params",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "token_ids_logprob",
    "return_sampling_mask",
    "custom_logit_processor",
    "lora_path",
    "video_data",
    "audio_data",
    # per-prompt fields SGLang indexes without counting them (its own callers fill them, a client may too)
    "modalities",
    "lora_id",
    "multi_item_delimiter_indices",
    "token_indices_to_pool",
    # PD disaggregation's per-prompt routing, which SGLang expands without counting (outside that mode too)
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "bootstrap_pair_key",
    "decode_tp_size",
)
EMPTY_READS_AS_NONE = ("modalities",)  # SGLang indexes it only when non-empty; its chat route sends []
# Fields of the tokenized message that SGLang pickles (wrap_pickle_fields) instead of typing them.
PICKLED_FIELDS = ("mm_inputs", "mm_data_mooncake", "time_stats")
_PROMPT = "_sparsespec_prompt"  # (index, batch size) stamped on a batch member by GenerateReqInput.__getitem__


def check_token_ids(input_ids: Sequence[object], vocab_size: int) -> None:
    """ValueError unless the prompt is non-empty and every id is an int in [0, vocab_size)."""
    if not input_ids:
        raise ValueError("the prompt is empty: it has no tokens")
    try:
        ok = all(type(t) is int for t in input_ids) and min(input_ids) >= 0 and max(input_ids) < vocab_size
    except TypeError:
        ok = False
    if not ok:
        bad = next(t for t in input_ids if type(t) is not int or not 0 <= t < vocab_size)
        raise ValueError(
            f"input_ids contains {bad!r} at index {list(input_ids).index(bad)}: token ids must be "
            f"integers in [0, {vocab_size}) for this model"
        )


@functools.cache
def _field_types(struct: type) -> dict[str, Any]:
    import msgspec

    return {f.name: f.type for f in msgspec.structs.fields(struct) if f.name not in INTERNAL_FIELDS}


def check_fields(values: Any, struct: type, label: str) -> None:
    """ValueError unless ``values`` is an object whose every entry has the type ``struct`` (a msgspec
    Struct of SGLang's message schema) annotates; None stands for SGLang's default."""
    import msgspec

    if not isinstance(values, Mapping):
        # A ValueError, not a TypeError: SGLang answers ValueErrors from here with a 400.
        raise ValueError(f"{label} must be a JSON object, got {type(values).__name__}")  # noqa: TRY004
    types = _field_types(struct)
    for name, value in values.items():
        if name not in types:
            raise ValueError(f"{label} has no parameter {name!r}; known: {', '.join(sorted(types))}")
        if value is not None:
            try:
                msgspec.convert(value, types[name])
            except msgspec.ValidationError as e:
                raise ValueError(f"{label}.{name}: {e}") from None


def check_sampling_params(params: Any, vocab_size: int) -> None:
    """ValueError naming the first sampling parameter the scheduler cannot take."""
    from sglang.srt.sampling.sampling_params import SamplingParams

    check_fields(params, SamplingParams, "sampling_params")
    top_k = params.get("top_k")
    if top_k is not None and top_k > I32_MAX:
        raise ValueError(f"sampling_params.top_k must be -1 (all tokens) or in [1, {I32_MAX}], got {top_k}")
    for t in params.get("stop_token_ids") or ():
        if not 0 <= t < vocab_size:
            raise ValueError(f"sampling_params.stop_token_ids contains {t}: token ids must be in [0, {vocab_size})")
    for key, bias in (params.get("logit_bias") or {}).items():
        if not abs(bias) <= FP32_MAX:
            raise ValueError(f"sampling_params.logit_bias[{key!r}] = {bias} is not a finite fp32 number")
    seed = params.get("sampling_seed")
    if seed is not None and not I64_MIN <= seed <= I64_MAX:
        raise ValueError(f"sampling_params.sampling_seed must fit in int64, got {seed}")
    temperature = params.get("temperature")
    if temperature is not None and temperature > FP32_MAX:  # inf in the fp32 batch tensor: NaN probabilities
        raise ValueError(f"sampling_params.temperature must be a finite fp32 number, got {temperature}")
    stop = params.get("stop")
    if stop == "" or (isinstance(stop, list) and "" in stop):  # it matches at once: an empty answer, no error
        raise ValueError("sampling_params.stop contains an empty string, which every output matches at once")
    limits = request_limits()
    check_grammars(params, limits)
    stop_regex = params.get("stop_regex")
    for pattern in [stop_regex] if isinstance(stop_regex, str) else stop_regex or ():
        check_stop_regex(pattern, limits)


def check_grammars(params: Mapping[str, Any], limits: Any) -> None:
    """ValueError for a grammar longer than the cap, or a JSON one nested deeper than the cap: its compile runs on
    the scheduler's grammar thread, where 100,000 levels of json_schema crashed the process."""
    for name in GRAMMARS:
        grammar = params.get(name)
        if not isinstance(grammar, str):
            continue
        if len(grammar) > limits.max_grammar_chars:
            raise ValueError(
                f"sampling_params.{name} has {len(grammar)} characters, above this server's cap of "
                f"{limits.max_grammar_chars} ({flag_of('max_grammar_chars')})"
            )
        depth = text_depth(grammar) if name in JSON_GRAMMARS else 0
        if depth > limits.max_json_depth:
            raise ValueError(
                f"sampling_params.{name} nests {depth} levels deep, above this server's cap of "
                f"{limits.max_json_depth} ({flag_of('max_json_depth')})"
            )


def check_stop_regex(pattern: str, limits: Any) -> None:
    """ValueError for a stop pattern the scheduler could not search in bounded time at every step."""
    label = f"sampling_params.stop_regex {pattern[:64]!r}{'...' if len(pattern) > 64 else ''}"
    if len(pattern) > limits.max_stop_regex_chars:  # before compiling it, in this event loop
        raise ValueError(
            f"{label} has {len(pattern)} characters, above this server's cap of {limits.max_stop_regex_chars} "
            f"({flag_of('max_stop_regex_chars')})"
        )
    try:
        re.compile(pattern)
    except re.error as e:
        raise ValueError(f"{label} is not a valid regular expression: {e}") from None
    if nested_repetition(pattern):
        raise ValueError(
            f"{label} repeats a group that can itself match in several ways "
            "(a quantifier or alternatives inside a repeated group, as in (a+)+): its matching time can grow "
            "exponentially with the text; write it without the nesting"
        )
    repeats = variable_repeats(pattern)
    if repeats > MAX_VARIABLE_REPEATS:
        raise ValueError(
            f"{label} holds {repeats} open-ended repeats (*, +, {{m,}}), at most {MAX_VARIABLE_REPEATS}: its search "
            f"time grows as the text's length to the power {repeats + 1}, at every step of the scheduler"
        )


def check_parallel_samples(sampling_params: Mapping[str, Any] | Sequence[Any] | None) -> None:
    """ValueError unless every ``n`` is an int in [1, MAX_PARALLEL_SAMPLES] (absent = 1; SGLang reads
    ``get("n", 1)``, so an explicit null would reach its comparisons as None)."""
    if isinstance(sampling_params, list) and not sampling_params:
        raise ValueError("sampling_params is an empty list")
    entries = [sampling_params] if isinstance(sampling_params, Mapping) else sampling_params or []
    for entry in entries:
        if not isinstance(entry, Mapping) or "n" not in entry:
            continue
        n = entry["n"]
        if type(n) is not int or not 1 <= n <= MAX_PARALLEL_SAMPLES:
            raise ValueError(f"sampling_params.n must be an integer in [1, {MAX_PARALLEL_SAMPLES}], got {n!r}")


def check_batch_shape(obj: Any) -> None:
    """After SGLang's normalisation: one sampling_params object and one rid for a single prompt, and every
    per-prompt list exactly one entry per prompt (SGLang indexes them per prompt and would fail
    with an IndexError, a 500, on a short list and silently ignore the rest of a long one)."""
    if obj.is_single:
        if obj.sampling_params is not None and not isinstance(obj.sampling_params, Mapping):
            raise ValueError("sampling_params must be one object for a single prompt")
        if not isinstance(obj.rid, str):
            raise ValueError(f"rid must be one string for a single prompt, got {obj.rid!r}")
        return
    n = obj.batch_size * getattr(obj, "parallel_sample_num", 1)
    for name in PER_PROMPT_LISTS:
        value = getattr(obj, name, None)
        if isinstance(value, list) and len(value) != n and (value or name not in EMPTY_READS_AS_NONE):
            have = len(value) // max(getattr(obj, "parallel_sample_num", 1), 1)
            raise ValueError(f"{name} has {have} entries for {obj.batch_size} prompts")


def check_client_rids(rid: Any) -> None:
    """ValueError if a client's rid (one string or a list of them) is empty or starts with the warm-up prefix."""
    from sglang_sparsespec.rounds.warmup import WARMUP_RID_PREFIX

    for r in rid if isinstance(rid, list) else [rid]:
        if r == "":  # SGLang's abort ignores an empty rid: a client's disconnect could not stop its request
            raise ValueError("rid must be a non-empty string (or left out)")
        if isinstance(r, str) and r.startswith(WARMUP_RID_PREFIX):
            raise ValueError(
                f"rid {r!r}: ids starting with {WARMUP_RID_PREFIX!r} are reserved for the server's warm-up"
            )


def check_top_logprobs(top_logprobs_num: Any, vocab_size: int) -> None:
    if type(top_logprobs_num) is not int:
        # A list passes SGLang's request model (one entry per prompt of a batch) and a single prompt keeps it.
        raise ValueError(f"top_logprobs_num must be one integer per prompt, got {top_logprobs_num!r}")
    if not 0 <= top_logprobs_num <= vocab_size:
        raise ValueError(f"top_logprobs_num must be in [0, {vocab_size}] (the vocabulary), got {top_logprobs_num}")


@contextmanager
def _naming_prompt(obj: Any) -> Iterator[None]:
    """Prefix a ValueError raised for one member of a batch with its position."""
    try:
        yield
    except ValueError as e:
        where = getattr(obj, "__dict__", {}).get(_PROMPT)
        if where is None or where[1] < 2:
            raise
        raise ValueError(f"prompt {where[0]} of {where[1]} in the batch: {e}") from e


# ---- hooks (registered in patches/hooks_boundary.py) ----------------------------------------------
def guard_normalize(original, obj, *args, **kwargs):
    """GenerateReqInput.normalize_batch_and_arguments: ``n``, an empty ``text`` batch (answered 200 with
    no outputs) and empty input_embeds are checked before SGLang expands the request (an IndexError, a
    500, on ``"input_embeds": []``); the batch shape after."""
    if type(obj.input_ids).__name__ == "BatchEncoding":
        # SGLang's Ollama chat handler tokenizes with transformers' apply_chat_template, which returns a
        # BatchEncoding from transformers 5 on (its OpenAI handler passes return_dict=False): the ids, not a 400.
        obj.input_ids = list(obj.input_ids["input_ids"])
    try:
        check_parallel_samples(obj.sampling_params)
        if isinstance(obj.text, list) and not obj.text:
            raise ValueError("text is an empty list: a batch needs at least one prompt")
        embeds = obj.input_embeds
        if obj.text is None and obj.input_ids is None and embeds is not None and not (embeds and embeds[0]):
            raise ValueError("input_embeds is empty")
        result = original(obj, *args, **kwargs)
    except ValueError:
        # A streamed request's disconnect-abort task (TokenizerManager.create_abort_task) reads
        # is_single, which SGLang sets only part-way through normalising: without it the task raises
        # AttributeError in the log after the client got its 400. Nothing was dispatched; the abort finds
        # no request under these rids either way.
        if "is_single" not in vars(obj):
            obj.is_single = not isinstance(obj.rid, list)
        raise
    check_batch_shape(obj)
    return result


def reserved_rid(original, manager, obj, request=None, *args, **kwargs):
    """TokenizerManager.generate_request: a request that came over HTTP (``request`` set; the warm-up
    calls it without one) may not use the warm-up prefix. Raised when the call is made, inside every
    HTTP handler's ``except ValueError`` (a 400, or the error event of a stream)."""
    if request is not None:
        check_client_rids(getattr(obj, "rid", None))
    return original(manager, obj, request, *args, **kwargs)


def stamp_prompt_index(result, obj, i, *args, **kwargs):
    """GenerateReqInput.__getitem__: remember which prompt of the batch a member is."""
    result.__dict__[_PROMPT] = (i % obj.batch_size, obj.batch_size)
    return result


def validate_request(original, manager, obj, input_ids, *args, **kwargs):
    """TokenizerManager._validate_one_request: SGLang's own checks, then ours, for one prompt."""
    from sglang.srt.managers.io_struct import GenerateReqInput, SessionParams

    vocab = manager.model_config.vocab_size
    with _naming_prompt(obj):
        if isinstance(obj, GenerateReqInput):  # types first: SGLang's own checks compare these values
            check_sampling_params(obj.sampling_params, vocab)
        original(manager, obj, input_ids, *args, **kwargs)
        # Multimodal requests carry placeholder ids (pad values) that the model replaces before lookup.
        has_mm = getattr(obj, "contains_mm_input", None)
        if input_ids is not None and not (has_mm is not None and has_mm()):
            check_token_ids(input_ids, vocab)
        width = manager.model_config.hidden_size
        if any(len(row) != width for row in getattr(obj, "input_embeds", None) or ()):
            raise ValueError(f"input_embeds rows must have the model's hidden size {width}")
        if has_mm is not None and has_mm() and manager.mm_processor is None:
            raise ValueError("this model takes no image, video or audio input")
        if isinstance(obj, GenerateReqInput):
            check_top_logprobs(obj.top_logprobs_num, vocab)
            check_request_caps(obj, request_limits())
            if obj.session_params is not None:
                check_fields(obj.session_params, SessionParams, "session_params")


def check_message_schema(tokenized: Any) -> None:
    """ValueError unless ``tokenized`` (what the tokenizer manager is about to dispatch) decodes
    against SGLang's own message schema, i.e. every field has the type the scheduler expects."""
    import msgspec
    from sglang.srt.managers.io_struct import msgpack_decode, msgpack_encode

    # The pickled fields are opaque to the schema; they are wrapped only when the message is sent.
    bare = msgspec.structs.replace(tokenized, **{f: None for f in PICKLED_FIELDS if hasattr(tokenized, f)})
    try:
        msgpack_decode(msgpack_encode(bare))
    except msgspec.ValidationError as e:
        message, _, path = str(e).partition(" - at `")
        raise ValueError(f"{_field_path(type(tokenized), path.rstrip('`'))}: {message}") from None


def _field_path(struct: type, path: str) -> str:
    """``$[8][0]`` (msgspec's position in the array-encoded message) -> ``sampling_params.max_new_tokens``."""
    import msgspec

    names: list[str] = []
    node: Any = struct
    for part in path.removeprefix("$").strip("[]").split("]["):
        if not (isinstance(node, type) and issubclass(node, msgspec.Struct) and part.isdigit()):
            break
        fields = msgspec.structs.fields(node)
        field = fields[int(part) - (1 if node.__struct_config__.tag is not None else 0)]  # a tag comes first
        names.append(field.name)
        node = field.type
    return ".".join(names) or "request"


def check_tokenized(original, manager, obj, *args, **kwargs):
    """TokenizerManager._create_tokenized_object: the built message must fit SGLang's schema; errors
    (ours and SamplingParams.verify's) name the prompt of a batch; stop strings stay within their cap, and a
    stop_regex sees the latest window."""
    with _naming_prompt(obj):
        tokenized = original(manager, obj, *args, **kwargs)
        check_message_schema(tokenized)
        if tokenized.sampling_params is not None:
            bound_stop_search(tokenized.sampling_params, request_limits())
        return tokenized


def extra_key_type_is_a_400(original, serving, request, *args, **kwargs):
    """OpenAIServingBase._compute_extra_key raises TypeError (a 500) for a non-string cache_salt/extra_key."""
    try:
        return original(serving, request, *args, **kwargs)
    except TypeError as e:
        raise ValueError(str(e)) from None
