"""PILLAR's start-up warm-up through SGLang's custom-warmup registry (``--warmups``): the batches of
``rounds/warmup.py`` go through the tokenizer manager, the scheduler and the worker as real requests,
so every eager kernel variant a round launches is built before the HTTP server listens (SGLang runs
custom warmups in the server's start-up, before uvicorn accepts connections). ``spec_algo`` adds the
name to ``--warmups`` unless ``--skip-server-warmup`` is given."""

from __future__ import annotations

import logging
import os
import time

from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.rounds.warmup import WARMUP_NAME, probe_batches, warmup_plan
from sglang_sparsespec.selection.match_heads import auto_heads

from .contacts import resolved

logger = logging.getLogger(__name__)


async def pillar_warmup(disaggregation_mode: str, tokenizer_manager) -> None:
    """Send the plan's batches one after another, each awaited to its end."""
    from sglang.srt.managers.io_struct import GenerateReqInput

    if disaggregation_mode != "null":
        # A prefill or decode server alone cannot run a whole request.
        logger.info("PILLAR warm-up skipped: disaggregated serving (%s)", disaggregation_mode)
        return
    t0 = time.monotonic()
    sa, mc = resolved(tokenizer_manager.server_args), tokenizer_manager.model_config
    # Each tokenizer worker (a process of its own) runs the warm-up: its rids carry the process id.
    tag = f"{os.getpid()}-"
    plan = warmup_plan(sa.max_running_requests, mc.vocab_size, sa.chunked_prefill_size, mc.context_len, tag)
    if auto_heads(PillarConfig.from_env(sa.speculative_num_steps).match_heads) is not None:
        # First, so the rest of the warm-up already drafts with the heads the probe lists.
        bos = getattr(getattr(mc, "hf_config", None), "bos_token_id", None)
        probes = probe_batches(mc.vocab_size, bos, tag, sa.chunked_prefill_size, mc.context_len)
        if not probes:
            logger.warning("PILLAR head probe skipped: a chunk, the context or the vocabulary is too small for its ids")
        plan = [*probes, *plan]
    if not plan:
        logger.info("PILLAR warm-up skipped: a %d-token context holds no warm-up request", mc.context_len)
        return
    # Under --dp-size N SGLang's DP controller spreads a batch's requests over the replicas, so each would
    # meet only part of every batch size: each replica gets the whole plan, routed to it (one replica
    # after another; the later ones load the kernels the first compiled from Triton's cache).
    replicas = [None] if (getattr(sa, "dp_size", 1) or 1) <= 1 else list(range(sa.dp_size))
    for rank in replicas:
        for batch in plan:
            req = GenerateReqInput(
                input_ids=batch.input_ids, sampling_params=[dict(batch.sampling) for _ in batch.rids], rid=batch.rids,
                routed_dp_rank=rank,
            )  # fmt: skip
            async for _ in tokenizer_manager.generate_request(req, None):
                pass
    logger.info(
        "PILLAR warm-up: %d batches of %d-%d requests per replica (%d) in %.1f s",
        len(plan), plan[0].size, max(b.size for b in plan), len(replicas), time.monotonic() - t0,
    )  # fmt: skip


def register() -> None:
    from sglang.srt.entrypoints.warmup import warmup

    warmup(WARMUP_NAME)(pillar_warmup)


def add_to_server_args(sa) -> None:
    """Name PILLAR's warm-up in ``sa.warmups`` (after the user's own), unless the user skips warm-up."""
    if sa.skip_server_warmup:
        return
    names = [n for n in (sa.warmups or "").split(",") if n]
    if WARMUP_NAME not in names:
        sa.warmups = ",".join([*names, WARMUP_NAME])
