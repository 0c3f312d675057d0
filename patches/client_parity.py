"""What a client sees of a request equals plain decoding's where plain decoding defines it.

A speculative round appends 1 to k + 1 tokens at once; SGLang's output path was written for one
token per step. Three places assume it:

* ``--stream-interval N`` (or ``sampling_params.stream_interval``): SGLang up to 0.5.21 sends a chunk
  when the output length is 1 mod N, which plain decoding meets every N tokens and a round that jumps
  over it does not (rounds of 1-9 tokens at N = 8 gave ~39-token chunks). ``accept_like_plain_decoding``
  sends whenever the output has reached the next point plain decoding sends at (1, N + 1, 2N + 1,
  ...) since the last chunk, so chunks are N tokens or a round's length more; at one token per step
  the points are the same as SGLang's. From 0.5.22 SGLang sends once N tokens are unsent itself
  (``contacts.STOCK_STREAMS_BY_UNSENT``), and its own check stands.
* ``reasoning_tokens`` counts every token a round appended, also those past the finish point
  (a stop string or max_new_tokens in the middle of a round) that ``completion_tokens`` trims. The
  reasoning tokens are a prefix of the output, so the ones inside the trimmed output are the smaller
  of the two counts.
* the per-request ``spec_accept_rate`` / ``spec_num_proposed_drafts`` in ``meta_info``: SGLang's
  tokenizer manager takes every round as ``speculative_num_draft_tokens - 1`` drafts, which adaptive
  speculation (rounds of 0, 2, 4 or 8 drafts) does not run. ``count_proposed_drafts`` adds each
  round's draft count (``PillarMetrics.last_completed_steps``, or each request's own where some drafted
  fewer: ``last_completed_num_drafts``) to every request it served; the
  count travels to the tokenizer manager in the output message's ``spec_num_cap_tokens`` entry (the
  ragged-verify cap length of EAGLE, which PILLAR rounds never set), and
  ``proposed_drafts_in_meta_info`` prices the rate with it.
"""

from __future__ import annotations

from typing import Any

from .contacts import STOCK_STREAMS_BY_UNSENT
from .spec_algo import serves_pillar

PROPOSED = "_sparsespec_proposed_drafts"  # drafts proposed to a Req over its PILLAR rounds


def next_stream_point(sent: int, interval: int) -> int:
    """The output length at which plain decoding sends its next chunk after one at ``sent`` tokens
    (SGLang sends at lengths 1 mod ``interval``: 1, interval + 1, ...)."""
    if sent < 1:
        return 1
    return sent + interval - (sent - 1) % interval


def stream_due(sent: int, length: int, interval: int) -> bool:
    """Whether an unfinished streamed request of ``length`` output tokens, last sent at ``sent``, is due."""
    return length >= next_stream_point(sent, interval)


def _req_of(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return kwargs["req"] if "req" in kwargs else args[0]


# ---- hooks (registered in patches/__init__.py) ---------------------------------------------------
def accept_like_plain_decoding(original, acc, *args, **kwargs):
    """_GenerationStreamAccumulator.accept (AROUND): the stream interval by crossing, the reasoning
    count inside the finished output, and PILLAR's proposed drafts in the message."""
    req = _req_of(args, kwargs)
    params = req.sampling_params
    interval = params.stream_interval or acc.default_stream_interval
    sent_before = len(acc.rids)
    if not STOCK_STREAMS_BY_UNSENT and not req.finished() and req.stream and interval > 1:
        if not stream_due(req.send_token_offset, len(req.output_ids), interval):
            return None  # SGLang's own "not due" path: nothing recorded for this request
        # Due: let SGLang's check pass (length % 1 == 0) and keep the rest of its logic (the stop-string
        # prefix hold-back, the chunk itself).
        saved, params.stream_interval = params.stream_interval, 1
        try:
            result = original(acc, *args, **kwargs)
        finally:
            params.stream_interval = saved
    else:
        result = original(acc, *args, **kwargs)
    if len(acc.rids) > sent_before:
        row = len(acc.rids) - 1
        if len(acc.reasoning_tokens) == len(acc.rids) and len(acc.completion_tokens) == len(acc.rids):
            acc.reasoning_tokens[row] = min(acc.reasoning_tokens[row], acc.completion_tokens[row])
        proposed = getattr(req, PROPOSED, None)
        if proposed is not None and len(acc.spec_num_cap_tokens) == len(acc.rids):
            acc.spec_num_cap_tokens[row] = proposed
    return result


def count_proposed_drafts(result, processor, spec_result, batch, *args, **kwargs):
    """SchedulerBatchResultProcessor._resolve_spec_v2_tokens (AFTER): the round's draft count, as the
    PILLAR worker matched it with these accept counts, to every request SGLang credited the round to
    (its own loop skips retracted and finished ones)."""
    metrics = getattr(getattr(processor, "model_worker", None), "metrics", None)
    steps = getattr(metrics, "last_completed_steps", None)
    if steps is None:
        return result
    num_drafts = metrics.last_completed_num_drafts  # per request where some drafted fewer (per-token sampling state)
    if num_drafts is None or len(num_drafts) != len(batch.reqs):
        num_drafts = [steps] * len(batch.reqs)
    for req, n in zip(batch.reqs, num_drafts):
        if not (req.is_retracted or req.finished()):
            setattr(req, PROPOSED, getattr(req, PROPOSED, 0) + n)
    return result


def proposed_drafts_in_meta_info(result, manager, meta_info, recv_obj, i, *args, **kwargs):
    """TokenizerManager._calculate_spec_decoding_metrics (AFTER): under PILLAR, the proposed drafts
    and the accept rate from the drafts the rounds ran (no rate when every round was plain)."""
    if not serves_pillar(manager.server_args) or "spec_verify_ct" not in meta_info:
        return result
    caps = getattr(recv_obj, "spec_num_cap_tokens", None)
    proposed = caps[i] if caps is not None and len(caps) > i else 0
    meta_info.pop("spec_cap_length", None)  # the field carried the proposed drafts, not a cap length
    correct = meta_info.get("spec_num_correct_drafts", 0)
    if proposed == 0 and correct > 0:
        return result  # accepted drafts but no count carried (rounds this worker did not match): SGLang's figures
    if proposed > 0:
        meta_info["spec_accept_rate"] = correct / proposed
        meta_info["spec_num_proposed_drafts"] = meta_info["spec_proposed_drafts"] = proposed
    else:
        for key in ("spec_accept_rate", "spec_num_proposed_drafts", "spec_proposed_drafts"):
            meta_info.pop(key, None)
    return result
