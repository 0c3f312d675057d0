"""The start-up warm-up plan: batches that make a new PILLAR server build, before it serves anyone,
every kernel variant its rounds launch outside CUDA graphs.

Why: Triton compiles a kernel for each new set of compile-time arguments on first use, and several
arguments of a round's eager kernels follow the batch: SGLang's ``assign_req_to_token_pool`` takes
``next_power_of_2(batch size)``, our rejection kernel the round's draft count, the target filter a
min-p switch. On a machine whose Triton cache lacks them, the first batches of each size compile
while the scheduler waits: on the H100 at ce113f5 (the Triton cache's file times,
``jitcache_times_h100_ce113f5.txt``) 13 variants of ``assign_req_to_token_pool`` compiled during a
3 s greedy pass of a server that was up, and in the first sampled PILLAR run
on that machine (256 x 2048 tokens, two waves) about half the requests waited ~8 s for their first
token (mean TTFT 4.1 s against stock FlashInfer's 0.46 s). With this warm-up (eea1983, same point)
the mean TTFT was 264 ms against stock's 398 and PILLAR 1.10x stock FlashInfer; the warm-up took 25 s on
the machine's first start, 6 s on the next.

The plan: for each batch size (powers of two up to the running-request cap, and the cap) and each
sampling shape (greedy; top-p only; top-k + top-p; min-p, the target filter's other variant), one
batch of that many requests with short distinct prompts; the cap's greedy prompts once more (prefills
past a cached prefix); then one batch of the cap whose prompts together outgrow the prefill chunk, so
that a request is prefilled in two chunks (attention over a cached prefix) as a first wave of long
prompts is.
Warm-up rounds cycle through the draft counts (``warmup_steps``) so every count's kernels build, and
teach nothing: the adaptive policy, its clock and the metrics never see them (``is_warmup``).

With several tokenizer workers (``--tokenizer-worker-num``) each runs the warm-up as it starts, under
rids of its own (``tag``), and a worker that is up serves clients while another still warms up: a
round is a warm-up round only if every request in it is a warm-up request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..selection.head_probe import PROBE_LENGTH, PROBE_TRIALS, probe_sequence, vocab_fits

# SGLang's custom-warmup name (``--warmups``) and the request-id prefix that marks warm-up requests
# (ids are otherwise random hex; a client's rid with this prefix is a 400, patches/request_guard.py).
WARMUP_NAME = "pillar"
WARMUP_RID_PREFIX = "__pillar_warmup__"
# Odd, meant to start the batches' KV allocations (slices of SGLang's free list) at odd slots too:
# Triton specialises a pointer argument on 16-byte alignment, and an int64 slot list that starts at an
# odd slot is a second variant of every kernel that takes it. Measured not enough: with 17 tokens the
# warm-up still never met an unaligned slice and SGLang's write_req_to_token_pool_triton compiled
# while serving (gpu_tests_h200_warmup_e691ef2.log); patches/slot_warmup.py builds that variant directly.
PROMPT_TOKENS = 17
# Enough for len(step candidates) rounds even when every round emits k_max + 1 = 9 tokens.
NEW_TOKENS = 48
# Prompt ids start above the special tokens of common vocabularies.
FIRST_TOKEN_ID = 100
# In the rids of the match-head probe's requests, after the prefix and the tag.
PROBE_RID_MARK = "probe-"

SAMPLING_SHAPES: tuple[dict[str, Any], ...] = (
    {"temperature": 0.0},
    {"temperature": 0.6, "top_p": 0.95},
    {"temperature": 0.6, "top_p": 0.95, "top_k": 20},
    {"temperature": 1.0, "top_k": 20, "min_p": 0.05},
)


@dataclass(frozen=True)
class WarmupBatch:
    """One batch sent as a single request of ``size`` prompts: ``input_ids`` [size][prompt tokens]
    (PROMPT_TOKENS, more in the chunked batch), ``rids`` [size] (each starts with WARMUP_RID_PREFIX),
    ``sampling`` SGLang sampling params shared by every prompt (ignore_eos, so each request runs
    NEW_TOKENS tokens)."""

    size: int
    sampling: dict[str, Any]
    rids: list[str]
    input_ids: list[list[int]]


def batch_sizes(max_running_requests: int) -> list[int]:
    """1, 2, 4, ... below the cap, then the cap: one size per ``next_power_of_2`` bucket up to it."""
    if max_running_requests < 1:
        raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
    sizes, n = [], 1
    while n < max_running_requests:
        sizes.append(n)
        n *= 2
    return [*sizes, max_running_requests]


def warmup_plan(
    max_running_requests: int,
    vocab_size: int,
    chunk_tokens: int | None = None,
    context_len: int | None = None,
    tag: str = "",
) -> list[WarmupBatch]:
    """Every (batch size, sampling shape) pair, smallest batches first, then the chunked batch when
    ``chunk_tokens`` (SGLang's --chunked-prefill-size; None or <= 0: no chunking) is set. A request
    runs only where prompt + new tokens fill at most half of ``context_len`` (far from the verify
    window SGLang reserves at the limit); with a context too short for any, the plan is empty.
    Prompts differ from each other (a radix cache cannot merge them) and stay inside the vocabulary.
    Rids are ``WARMUP_RID_PREFIX + tag + serial``: plans of different tags share none."""
    span = vocab_size - FIRST_TOKEN_ID
    if span < PROMPT_TOKENS:
        raise ValueError(f"vocabulary of {vocab_size} tokens is too small for the warm-up prompts")

    def fits(prompt_tokens: int) -> bool:
        return context_len is None or 2 * (prompt_tokens + NEW_TOKENS) <= context_len

    plan: list[WarmupBatch] = []
    if not fits(PROMPT_TOKENS):
        return plan
    serial = 0

    def batch(size: int, shape: dict[str, Any], prompt_tokens: int) -> WarmupBatch:
        nonlocal serial
        ids, rids = [], []
        for _ in range(size):
            ids.append([FIRST_TOKEN_ID + (serial * 7919 + j * 31) % span for j in range(prompt_tokens)])
            rids.append(f"{WARMUP_RID_PREFIX}{tag}{serial}")
            serial += 1
        return WarmupBatch(size, {**shape, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}, rids, ids)

    for size in batch_sizes(max_running_requests):
        plan.extend(batch(size, shape, PROMPT_TOKENS) for shape in SAMPLING_SHAPES)
    # The cap's greedy batch again under new ids: every prompt is then in the radix cache and its
    # prefill extends one token past a cached prefix, as retried requests and shared prompts are
    # served. Added for the write_req_to_token_pool_triton variant, which it did not build either
    # (gpu_tests_h200_warmup_bf21a0d.log: an alignment, now built by patches/slot_warmup.py).
    cached = plan[-len(SAMPLING_SHAPES)]
    rids = [f"{WARMUP_RID_PREFIX}{tag}{serial + i}" for i in range(cached.size)]
    serial += cached.size
    plan.append(WarmupBatch(cached.size, cached.sampling, rids, cached.input_ids))
    if chunk_tokens is not None and chunk_tokens > 0:
        # size x prompt_tokens > chunk_tokens: the batch's prefill needs a second chunk.
        prompt_tokens = chunk_tokens // max_running_requests + PROMPT_TOKENS
        if fits(prompt_tokens):
            plan.append(batch(max_running_requests, SAMPLING_SHAPES[0], prompt_tokens))
    return plan


def probe_batches(
    vocab_size: int, bos: int | None, tag: str = "", chunk_tokens: int | None = None, context_len: int | None = None
) -> list[WarmupBatch]:
    """``--pillar-match-heads N@auto``'s probe: PROBE_TRIALS one-request batches, each ``head_probe``'s random
    sequence shown twice (seeded, so every start probes the same ids), prefilled and then one greedy token; the
    worker scores the heads during those prefills (``PROBE_RID_MARK`` in the rid). None where one chunk or half the
    context cannot hold a sequence (the prefill must see it whole), or the vocabulary is too small for one."""
    tokens = 2 * PROBE_LENGTH + (bos is not None)
    too_long = (chunk_tokens is not None and 0 < chunk_tokens < tokens) or (
        context_len is not None and 2 * tokens > context_len
    )
    if too_long or not vocab_fits(PROBE_LENGTH, vocab_size):
        return []
    gen = torch.Generator().manual_seed(0)
    return [
        WarmupBatch(
            1,
            {"temperature": 0.0, "max_new_tokens": 1},
            [f"{WARMUP_RID_PREFIX}{tag}{PROBE_RID_MARK}{i}"],
            [probe_sequence(PROBE_LENGTH, vocab_size, bos, gen).tolist()],
        )
        for i in range(PROBE_TRIALS)
    ]


def is_probe(reqs: Sequence[Any]) -> bool:
    """Whether a prefill batch is one probe request (``probe_batches``)."""
    return len(reqs) == 1 and PROBE_RID_MARK in str(reqs[0].rid) and str(reqs[0].rid).startswith(WARMUP_RID_PREFIX)


def is_warmup(reqs: Sequence[Any]) -> bool:
    """Whether a batch holds warm-up requests only. A client's request in it makes the round a served
    one: chosen by the policy and measured (a warm-up request only adds to its batch). A batch whose
    first request is a client's is decided at once, so serving pays O(1) per round."""
    return bool(reqs) and all(str(r.rid).startswith(WARMUP_RID_PREFIX) for r in reqs)


def warmup_steps(candidates: Sequence[int], round_index: int) -> int:
    """The draft count of the ``round_index``-th warm-up round: the candidates in turn."""
    return candidates[round_index % len(candidates)]
