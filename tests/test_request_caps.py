"""The request caps (sglang_sparsespec/limits.py, patches/request_caps.py), stop-pattern nesting
(sglang_sparsespec/stop_regex.py) and chat template arguments (patches/openai_guard.py) through SGLang's
real HTTP app and tokenizer manager (tests/boundary.py); the 400s of the reliability hand list are in
tests/test_request_guard.py."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("sglang")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from boundary import make_boundary, write_model_dir  # noqa: E402
from conftest import SMOLLM2_CONFIG  # noqa: E402
from sglang_sparsespec.limits import LIMIT_KNOBS, RequestLimits, request_limits  # noqa: E402
from sglang_sparsespec.json_depth import text_depth, value_depth  # noqa: E402
from sglang_sparsespec.stop_regex import nested_repetition, variable_repeats  # noqa: E402

from benchmarks.checks.bad_inputs import CHAT, GENERATE, TEXT  # noqa: E402

MSGS = [{"role": "user", "content": "w1 w2"}]


@pytest.fixture(scope="module")
def boundary(tmp_path_factory):
    import inspect

    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    load_plugins()
    # From 0.5.21 SGLang refuses a client chat template itself unless --trust-request-chat-template; with it
    # the plugin's cap decides, as on the releases before.
    trust = {"trust_request_chat_template": True}
    extra = trust if set(trust) <= set(inspect.signature(ServerArgs).parameters) else {}
    with pytest.MonkeyPatch.context() as mp:
        for key in [k for k in os.environ if k.startswith("SPARSESPEC_")]:
            mp.delenv(key)
        return make_boundary(write_model_dir(tmp_path_factory.mktemp("caps_model"), SMOLLM2_CONFIG), **extra)


@pytest.mark.parametrize(
    "pattern",
    ["(a+)+$", "(a*)*b", "(a{1,3})+", r"(\w+\s?)+$", "(a|aa)+$", r"(?:\s*\n)+", "(a+){10}x", "(?=(a+)+)b"],
)
def test_nested_repetition_is_found(pattern):
    assert nested_repetition(pattern)


@pytest.mark.parametrize(
    "pattern",
    [
        r"\n\s*\n",
        r"Answer:\s*\d+",
        r"\d+(\.\d+)?$",
        ".*x",
        "a+b+",
        "(ab){2,5}",
        "(?:ab)+",
        "(a|b)+",
        "(a++)+",
        "(?>a+)+",
    ],
)
def test_patterns_without_nested_repetition_pass(pattern):
    assert not nested_repetition(pattern)


@pytest.mark.parametrize(
    ("pattern", "count"),
    [(".*.*.*Z", 3), (".*.*Z", 2), (r"\w+\s*\w+x", 3), (r"Answer:\s*\d+", 2), ("a{0,100}b{2,}", 2), ("(a+)+", 2),
     ("a?b{1,3}c{4}", 0), ("x*+(?>y+)", 0), ("(?:x++)*y", 1)],
)  # fmt: skip
def test_open_ended_repeats_are_counted(pattern, count):
    """Each repeat that can take a run of the text is a factor of its length in the search time; ? and narrow
    {m,n} are constants, possessive and atomic bodies never backtrack."""
    assert variable_repeats(pattern) == count


def test_json_nesting_is_counted_without_recursion():
    deep = '{"type": "array", "items": ' * 100_000 + '{"type": "string"}' + "}" * 100_000
    assert text_depth(deep) == 100_001  # a recursive walk would stop at Python's recursion limit
    assert text_depth('{"a": "[[{\\"[", "b": [1, {"c": 2}]}') == 3  # brackets inside strings do not count
    assert text_depth('"x"') == 0 and text_depth("[]") == 1
    nested: list = []
    for _ in range(5000):
        nested = [nested]
    assert value_depth({"a": nested}) == 5002 and value_depth(3) == 0 and value_depth({"a": [1, {"b": 2}]}) == 3


def test_every_cap_is_a_flag_with_its_default_and_bad_values_fail_in_one_line():
    assert request_limits({}) == RequestLimits()
    assert request_limits({"SPARSESPEC_MAX_TOP_LOGPROBS": "5"}).max_top_logprobs == 5
    assert request_limits({"SPARSESPEC_ALLOW_CLIENT_CHAT_TEMPLATE": "true"}).allow_client_chat_template
    for env, message in (
        ({"SPARSESPEC_MAX_FANOUT": "0"}, "SPARSESPEC_MAX_FANOUT must be an integer >= 1"),
        ({"SPARSESPEC_MAX_LOGIT_BIAS": "many"}, "SPARSESPEC_MAX_LOGIT_BIAS='many' is not a valid int"),
        ({"SPARSESPEC_ALLOW_CLIENT_CHAT_TEMPLATE": "maybe"}, "give true or false"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)) as err:
            request_limits(env)
        assert "\n" not in str(err.value)
    assert {k.flag for k in LIMIT_KNOBS} >= {"--pillar-max-top-logprobs", "--pillar-allow-client-chat-template"}


def test_a_bad_cap_fails_at_launch(llama_config_dir, monkeypatch):
    from sglang.srt.plugins import load_plugins
    from sglang.srt.server_args import ServerArgs

    from sglang_sparsespec.patches.contacts import resolve

    load_plugins()
    monkeypatch.setenv("SPARSESPEC_MAX_STOP_STRINGS", "-1")
    with pytest.raises(ValueError, match="SPARSESPEC_MAX_STOP_STRINGS must be an integer >= 1"):
        resolve(ServerArgs(model_path=str(llama_config_dir), attention_backend="triton", skip_tokenizer_init=True,
                           device="cpu"))  # fmt: skip


def test_a_cap_follows_its_flag(boundary, monkeypatch):
    body = {"text": TEXT, "return_logprob": True, "top_logprobs_num": 6, "sampling_params": {"max_new_tokens": 4}}
    assert boundary.post(GENERATE, body)[0] == 200
    monkeypatch.setenv("SPARSESPEC_MAX_TOP_LOGPROBS", "5")
    status, message = boundary.post(GENERATE, body)
    assert status == 400 and "above this server's cap of 5 (--pillar-max-top-logprobs)" in message


def test_prompts_times_n_is_refused_before_sglang_expands_the_batch():
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(text=[TEXT] * 9, sampling_params={"n": 128, "max_new_tokens": 4})
    with pytest.raises(ValueError, match=r"prompts x n \(9 x 128\) is 1152"):
        obj.normalize_batch_and_arguments()
    assert len(obj.text) == 9  # not expanded
    ok = GenerateReqInput(text=[TEXT] * 8, sampling_params={"n": 128, "max_new_tokens": 4})
    ok.normalize_batch_and_arguments()
    assert ok.batch_size * ok.parallel_sample_num == RequestLimits().max_fanout


@pytest.mark.parametrize(
    ("stop_regex", "window"),
    [
        (r"\n\s*\n", RequestLimits().stop_regex_window),
        (["x", ".*END"], RequestLimits().stop_regex_window),
        (r"\d{3}", 3),
    ],
)
def test_a_stop_regex_is_searched_in_the_latest_window_of_the_output(boundary, stop_regex, window):
    """SGLang sizes the text a stop_regex is searched in from the pattern's longest match: 2^30 for any
    + or *, so the whole output is decoded and searched at every step (quadratic in its length)."""
    boundary.reset()
    body = {"text": TEXT, "sampling_params": {"max_new_tokens": 4, "stop_regex": stop_regex}}
    assert boundary.post(GENERATE, body)[0] == 200
    (req,) = boundary.scheduler.received
    assert req.sampling_params.stop_regex_max_len == window


def test_a_client_chat_template_is_refused_unless_the_server_allows_it(boundary, monkeypatch):
    template = "{% for m in messages %}{{ m['content'] }} w7 {% endfor %}"
    body = {"model": "default", "messages": MSGS, "max_tokens": 4, "chat_template_kwargs": {"chat_template": template}}
    status, message = boundary.post(CHAT, body)
    assert status == 400 and "--pillar-allow-client-chat-template true accepts one" in message
    monkeypatch.setenv("SPARSESPEC_ALLOW_CLIENT_CHAT_TEMPLATE", "true")
    boundary.reset()
    assert boundary.post(CHAT, body)[0] == 200
    (req,) = boundary.scheduler.received
    assert list(req.input_ids) == [7, 8, 13]  # "w1 w2 w7": the client's template, not the server's
