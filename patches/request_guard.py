"""``TokenizerManager._validate_one_request``: token ids outside the vocabulary are a 400.

SGLang 0.5.17 defines an in-vocabulary check for ``input_ids`` but never calls it: a request
with an id >= vocab_size (or < 0) reaches the embedding lookup on the GPU, where a device-side
assert kills the scheduler and every later request fails until a restart. Validation runs in
the HTTP process before anything is sent to the scheduler, and a ValueError raised there is
answered with HTTP 400 while the server keeps serving everyone else; this adds the range check
there, for every algorithm (stock decoding included) once the plugin is installed.
"""

from __future__ import annotations

from collections.abc import Sequence


def check_token_ids(input_ids: Sequence[object], vocab_size: int) -> None:
    """ValueError unless every id is an int in [0, vocab_size); one message names the first bad id."""
    try:
        ok = all(type(t) is int for t in input_ids) and (
            not input_ids or (min(input_ids) >= 0 and max(input_ids) < vocab_size)
        )
    except TypeError:
        ok = False
    if not ok:
        bad = next(t for t in input_ids if type(t) is not int or not 0 <= t < vocab_size)
        raise ValueError(
            f"input_ids contains {bad!r} at index {list(input_ids).index(bad)}: token ids must be "
            f"integers in [0, {vocab_size}) for this model"
        )


def validate_token_ids(original, manager, obj, input_ids, *args, **kwargs):
    original(manager, obj, input_ids, *args, **kwargs)
    # Multimodal requests carry placeholder ids (pad values) that the model replaces before lookup.
    has_mm = getattr(obj, "contains_mm_input", None)
    if input_ids is not None and not (has_mm is not None and has_mm()):
        check_token_ids(input_ids, manager.model_config.vocab_size)
