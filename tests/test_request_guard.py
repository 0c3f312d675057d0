"""patches/request_guard.py: out-of-vocabulary token ids become a clear ValueError (HTTP 400)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from sglang_sparsespec.patches.request_guard import check_token_ids, validate_token_ids

VOCAB = 49152


@pytest.mark.parametrize(
    "ids, index",
    [([1000000000, 5], 0), ([5, -1], 1), ([3, VOCAB], 1), ([1, 2.0], 1), ([1, "7"], 1), ([True], 0)],
)
def test_bad_ids_name_the_first_offender(ids, index):
    with pytest.raises(ValueError) as err:
        check_token_ids(ids, VOCAB)
    assert f"at index {index}" in str(err.value) and f"[0, {VOCAB})" in str(err.value)


def test_good_ids_pass():
    check_token_ids([0, 17, VOCAB - 1], VOCAB)
    check_token_ids([], VOCAB)


def test_hook_runs_sglang_checks_first_and_skips_multimodal():
    calls = []
    manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=VOCAB))

    def original(mgr, obj, input_ids):
        calls.append(input_ids)

    text = SimpleNamespace(contains_mm_input=lambda: False)
    with pytest.raises(ValueError, match="1000000000"):
        validate_token_ids(original, manager, text, [1000000000, 5])
    assert calls == [[1000000000, 5]]  # SGLang's own length checks ran before ours
    image = SimpleNamespace(contains_mm_input=lambda: True)
    validate_token_ids(original, manager, image, [1 << 40, 5])  # placeholder pad ids are not token ids
    validate_token_ids(original, manager, text, None)  # input_embeds requests carry no ids


def test_hook_reaches_the_tokenizer_manager():
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.plugins import load_plugins

    load_plugins()
    assert TokenizerManager._validate_one_request.__wrapped__ is not None
