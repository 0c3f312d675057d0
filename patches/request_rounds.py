"""Which decode path may serve a request, from the request's own sampling parameters.

A speculative round verifies k + 1 rows per request with one copy of the request's per-token
sampling state, built before the round: SGLang's penalizers (frequency, presence and repetition
penalties, min_new_tokens) cumulate one token per round (``ScheduleBatch.cumulate_penalty_output_tokens``
reads each request's last output token when the round is prepared) and the verify adds the same
penalty row to all k + 1 rows; a custom logit processor sees the request as it was before the round.
Row 0 of a round is the only row whose state is the one stock decoding samples that token with. So
a request with such state takes exactly one token per round, row 0's (``single_token``): it drafts
nothing (``num_drafts_for``), its penalty state then advances one token per round as in stock
decoding, and the verify applies its processor to row 0 alone (``verify_input``). The rest of its
batch keeps drafting.

min_new_tokens needs this only while the penalizer can still mask the stop tokens: its count is the
number of rounds the request has been prepared for, at least ``len(output_ids)`` (under the overlap
scheduler the last round's tokens are not in ``output_ids`` yet, so that is the lower bound); once
``len(output_ids) >= min_new_tokens`` the mask is off for good and every row sees the same (no)
penalty. A retracted request is prefilled again with a fresh penalizer whose count restarts at 0
while its output is kept, so after a retraction the request keeps single-token rounds.
"""

from __future__ import annotations


def single_token(req) -> bool:
    """Whether ``req`` (SGLang's ``Req``) must take exactly one token per decode round."""
    sp = req.sampling_params
    if sp.frequency_penalty != 0.0 or sp.presence_penalty != 0.0 or sp.repetition_penalty != 1.0:
        return True
    if sp.min_new_tokens > 0 and (req.retraction_count > 0 or len(req.output_ids) < sp.min_new_tokens):
        return True
    return req.custom_logit_processor is not None


def may_hold_token_state(sampling_info) -> bool:
    """Whether any request of the batch may hold per-token sampling state, from the batch alone: a
    penalizer that is required (some request has a penalty or min_new_tokens > 0) or a custom logit
    processor. The overlap scheduler hands the worker a copy whose orchestrator is dropped and whose
    accumulated penalty rows stand for it (set exactly when the orchestrator was required)."""
    si = sampling_info
    if si.has_custom_logit_processor or si.acc_additive_penalties is not None or si.acc_scaling_penalties is not None:
        return True
    return si.penalizer_orchestrator is not None and si.penalizer_orchestrator.is_required


def single_token_rows(batch) -> list[bool] | None:
    """Which requests of ``batch`` take one token per round (``single_token``); None when none does.
    Batches without penalties or processors are answered without visiting their requests."""
    if not may_hold_token_state(batch.sampling_info):
        return None
    rows = [single_token(r) for r in batch.reqs]
    return rows if any(rows) else None


def num_drafts_for(single: list[bool] | None, steps: int) -> list[int] | None:
    """Each request's draft count in a round of ``steps`` drafts, from ``single_token_rows``: 0 for the
    requests that take one token per round, ``steps`` for the others; None when every request drafts
    ``steps`` (a plain round takes one token from everyone anyway)."""
    if steps == 0 or single is None:
        return None
    return [0 if s else steps for s in single]


def decode_path_serves(batch) -> bool:
    """Whether a plain round of ``batch`` may take the decode path (PlainPath.DECODE): SGLang's sampler
    alone gives its tokens. Logprobs, hidden states, grammars, penalties, logit biases, custom logit
    processors and sampling masks are applied by SGLang's verify path, which such batches keep."""
    si = batch.sampling_info
    return not (
        batch.return_logprob
        or batch.return_hidden_states
        or batch.has_grammar
        or may_hold_token_state(si)
        or si.logit_bias is not None
        or any(si.return_sampling_masks or ())
    )
