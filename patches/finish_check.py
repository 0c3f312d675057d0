"""``Req.update_finish_state`` for a round's accepted run: stop where stock decoding stops.

SGLang checks a speculative round's whole accepted run at once, in the order stock decoding checks one
token: length first (over the whole output), then out-of-vocabulary ids, stop strings, stop tokens.
For a run of several tokens that order is wrong twice: a run that crosses max_new_tokens after a stop
token finishes with "length" and keeps the tokens after the stop, and a stop string completed later in
the run wins over an earlier stop token (or an earlier out-of-vocabulary id) and keeps the tokens
between them. Stock decoding appends one token at a time and stops at the first token that finishes.

Here the run is cut into pieces that each end at the first token that finishes by itself (a stop token,
an out-of-vocabulary id, or the token that reaches max_new_tokens), and SGLang's own check runs on each
piece with ``output_ids`` ending at the piece, until one finishes: within a piece only its last token
can end the request by token or length, and SGLang finds the earliest stop string itself. The tokens
after the finishing one stay in ``output_ids`` (restored), cut off by ``finished_len`` as SGLang's
output path does for every speculative overshoot. A run with no such token before its end is checked
whole, as before; a single token (stock decoding, the plain rounds) always is.
"""

from __future__ import annotations

from .spec_algo import serves_pillar


def _serves_pillar() -> bool:
    from sglang.srt.runtime_context import get_server_args

    return serves_pillar(get_server_args())


def _ends_by_itself(req, token: int) -> bool:
    """Whether appending ``token`` alone ends ``req`` by its id: out of the vocabulary, or a stop token
    (``Req._check_token_based_finish``'s sets; none under ignore_eos)."""
    if token >= req.vocab_size or token < 0:
        return True
    if req.sampling_params.ignore_eos:
        return False
    sp, tok = req.sampling_params, req.tokenizer
    return bool(
        (sp.stop_token_ids and token in sp.stop_token_ids)
        or (req.eos_token_ids and token in req.eos_token_ids)
        or (tok is not None and (token == tok.eos_token_id or token in (tok.additional_stop_token_ids or ())))
    )


def _piece_end(req, start: int, end: int) -> int:
    """The end (exclusive, an ``output_ids`` length) of the piece of the run ``[start, end)``
    that begins at ``start``: just past its first token that finishes by itself, or ``end``."""
    limit = req.sampling_params.max_new_tokens
    for i in range(start, end):
        if i + 1 >= limit or _ends_by_itself(req, req.output_ids[i]):
            return i + 1
    return end


def stop_before_length(original, req, new_accepted_len: int = 1):
    if new_accepted_len <= 1 or req.finished() or req.to_finish or not _serves_pillar():
        return original(req, new_accepted_len)
    out = req.output_ids
    end = len(out)
    start = end - new_accepted_len
    while start < end and not req.finished():
        cut = _piece_end(req, start, end)
        tail = out[cut:]
        del out[cut:]
        try:
            original(req, cut - start)
        finally:
            out.extend(tail)
        start = cut
