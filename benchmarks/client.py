"""Native ``/generate`` client that returns token ids and SGLang's speculative counters.

A 0.5.17 non-streaming ``/generate`` reply is ``{"text", "output_ids", "meta_info"}``;
``meta_info`` carries ``completion_tokens``, ``finish_reason`` and, for speculative
servers once a request was verified at least once, ``spec_verify_ct`` and
``spec_accept_length`` (= completion_tokens / spec_verify_ct, bonus token included) and
``spec_correct_drafts_histogram`` (entry n = verify steps that accepted n drafts); ``cached_tokens`` counts
the prompt tokens served from the radix cache.
"""

from __future__ import annotations

import concurrent.futures as cf
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks.server import Server, http_json


@dataclass(frozen=True)
class GenOutput:
    """One finished request. ``verify_ct`` is None on a non-speculative server.

    ``accept_histogram[n]``: verify steps of this request that accepted n drafts (None if
    the server reports none). With ``top2`` requested: ``runner_up[i]`` is the second most likely token at output
    position i and ``margin[i]`` the log-probability gap (nats) between the best and it.
    """

    output_ids: list[int]
    completion_tokens: int
    verify_ct: int | None
    finish_reason: str | None
    runner_up: list[int] | None = None
    margin: list[float] | None = None
    accept_histogram: list[int] | None = None
    cached_tokens: int | None = None  # prompt tokens the radix cache served (None: not reported)

    @property
    def accept_length(self) -> float | None:
        return self.completion_tokens / self.verify_ct if self.verify_ct else None


def parse_generate_reply(reply: Any) -> GenOutput:
    """Validate one ``/generate`` reply; ValueError if it is an error object or lacks output_ids."""
    if not isinstance(reply, dict) or "output_ids" not in reply or "meta_info" not in reply:
        raise ValueError(f"unexpected /generate reply: {str(reply)[:300]}")
    meta = reply["meta_info"]
    ids = [int(t) for t in reply["output_ids"]]
    finish = meta.get("finish_reason")
    if isinstance(finish, dict):  # {"type": "length"|"stop", "matched": ...}
        finish = finish.get("type")
    verify_ct = meta.get("spec_verify_ct")
    runner_up = margin = None
    top = meta.get("output_top_logprobs")
    if top is not None:
        # One entry per output token: [[logprob, token_id, text], ...] best first.
        if len(top) != len(ids) or any(len(t) < 2 for t in top):
            raise ValueError(f"output_top_logprobs has {len(top)} entries for {len(ids)} tokens, or fewer than 2 each")
        runner_up = [int(t[1][1]) for t in top]
        margin = [float(t[0][0]) - float(t[1][0]) for t in top]
    return GenOutput(
        output_ids=ids,
        completion_tokens=int(meta.get("completion_tokens", len(ids))),
        verify_ct=int(verify_ct) if verify_ct else None,
        finish_reason=finish,
        runner_up=runner_up,
        margin=margin,
        accept_histogram=[int(n) for n in meta["spec_correct_drafts_histogram"]]
        if meta.get("spec_correct_drafts_histogram")
        else None,
        cached_tokens=int(meta["cached_tokens"]) if meta.get("cached_tokens") is not None else None,
    )


def generate_all(
    server: Server,
    prompts: Sequence[Sequence[int]],
    sampling_params: dict[str, Any],
    *,
    concurrency: int,
    timeout_s: float,
    top2: bool = False,
) -> list[GenOutput]:
    """Send every prompt (token ids) as its own request, at most ``concurrency`` in flight.

    ``top2`` also asks for the two most likely tokens at every output position
    (``GenOutput.runner_up`` / ``margin``).
    Results keep prompt order. Raises ServerError as soon as the server process dies
    (instead of waiting on sockets) and TimeoutError when ``timeout_s`` runs out.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    url = server.base_url + "/generate"
    end = time.monotonic() + timeout_s

    def one(ids: Sequence[int]) -> GenOutput:
        body: dict[str, Any] = {"input_ids": list(ids), "sampling_params": sampling_params, "stream": False}
        if top2:
            body.update(return_logprob=True, top_logprobs_num=2)
        return parse_generate_reply(http_json(url, body, timeout=timeout_s))

    pool = cf.ThreadPoolExecutor(max_workers=concurrency)
    try:
        futures = [pool.submit(one, ids) for ids in prompts]
        pending = set(futures)
        while pending:
            _, pending = cf.wait(pending, timeout=1.0, return_when=cf.FIRST_EXCEPTION)
            failed = [f for f in futures if f.done() and f.exception() is not None]
            server.check_alive(grace_s=2.0 if failed else 0.0)
            if failed:
                raise failed[0].exception()  # type: ignore[misc]
            if pending and time.monotonic() > end:
                raise TimeoutError(f"{len(pending)}/{len(futures)} requests unfinished after {timeout_s:.0f} s")
        return [f.result() for f in futures]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
