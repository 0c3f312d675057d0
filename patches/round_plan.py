"""Round planning: each decode round's shape, chosen on the host before it launches, and the one queue
that matches launched rounds with SGLang's late accept counts.

``RoundPlanner.shape`` per decode batch:

1. a start-up warm-up batch (``rounds/warmup.py``) takes the next draft count of its cycle, so every
   count's kernels build; nothing learns from it and nothing counts it;
2. otherwise, with adaptive speculation on, the policy (``adaptive/policy.py``) prices each draft count
   from the round times the clock measured and the acceptance it learned, and the dense chooser
   (``adaptive/dense.py``) says which requests draft over their whole prefix; a batch in which nobody
   may draft (``request_rounds``) runs a plain round instead; the TP ranks agree on one shape
   (``tp_agree``);
3. which requests draft fewer than the round (``request_rounds.num_drafts_for``: none in most batches);
   the round joins the launch queue (``rounds/launch.py``) with what its readers need of it.

``completed`` takes SGLang's accept counts (``on_verify_complete_cpu``, a round or two late under the
overlap scheduler), matches them once with the oldest launched round and hands the match to the
metrics, the acceptance estimate and the dense chooser. The measured costs persist in a file per
server setup (``adaptive/cost_cache.py``), written by TP rank 0 every ``PATH_LOG_EVERY`` rounds.
All host-side: sizes, sampling parameters and counts already on the host; no device work.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from sglang_sparsespec.adaptive.cost_cache import CostFile
from sglang_sparsespec.adaptive.dense import DenseChooser
from sglang_sparsespec.adaptive.policy import SpeculationPolicy
from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.modes import PlainPath
from sglang_sparsespec.metrics import PillarMetrics
from sglang_sparsespec.rounds.clock import NoClock, RoundClock
from sglang_sparsespec.rounds.launch import AdaptiveRound, LaunchedRounds, RoundShape
from sglang_sparsespec.rounds.warmup import is_warmup, warmup_steps

from .request_rounds import num_drafts_for, single_token_rows
from .tp_agree import RoundAgreement

logger = logging.getLogger(__name__)
# Rounds between the log lines that count which draft count each round ran (and the cost-file writes).
PATH_LOG_EVERY = 2000


def seeded_config(cfg: PillarConfig, server_args) -> PillarConfig:
    """Under deterministic inference every round drafts num_steps: round shapes chosen from measured
    times would make a seeded request's tokens depend on timing."""
    if not (server_args.enable_deterministic_inference and cfg.adaptive):
        return cfg
    logger.info("PILLAR: deterministic inference runs every round with %d drafts", cfg.num_steps)
    return replace(cfg, adaptive_steps="off", force_steps=-1)


def setup_identity(cfg: PillarConfig, server_args, model_runner) -> dict[str, Any]:
    """What moves this server's round costs (``adaptive/cost_cache.py``): a cost file measured under
    another identity is not reused."""
    import torch
    from importlib.metadata import PackageNotFoundError, version

    try:
        plugin = version("sglang-sparsespec")
    except PackageNotFoundError:
        plugin = "unknown"
    return {
        "gpu": torch.cuda.get_device_name(model_runner.gpu_id),
        "model": server_args.model_path,
        "tp_size": server_args.tp_size,
        "attention_backend": server_args.attention_backend,
        "kv_dtype": str(model_runner.kv_cache_dtype),
        "step_candidates": list(cfg.step_candidates),
        "plain_path": cfg.plain_path.value,
        # The selection's cadence and budget move the verify (capture passes) and draft (plan size) costs.
        "policy": cfg.policy.value,
        "select_every": cfg.select_every,
        "budget_ratio": cfg.budget_ratio,
        "min_budget": cfg.min_budget,
        "batch_phases": cfg.batch_phases.value,  # a mixed iteration prices the full-length round
        "draft_prologue": cfg.draft_prologue.value,  # three launches a layer of every draft step
        "verify_prologue": cfg.verify_prologue.value,  # up to four launches a layer of every verify
        "draft_mlp": cfg.draft_mlp.value,  # one launch a layer of every draft step
        "draft_lm_head": cfg.draft_lm_head.value,  # half the LM head's bytes in every draft step
        "draft_vocab": cfg.draft_vocab,  # the LM head's and the draft sampler's width in every draft step
        "verify_logits": cfg.verify_logits.value,  # the verify's logit copy and the acceptance's reads
        "accept_list": cfg.accept_list.value,  # the acceptance's reads of each verify row
        "dense_heads": cfg.dense_heads,  # whole prefixes the listed heads read in every draft step
        "plugin": plugin,
    }


class RoundPlanner:
    """The module docstring's planning, for one worker. ``policy`` None: adaptive speculation is off and
    every round drafts ``cfg.num_steps``; otherwise ``agreement`` is the TP group's and ``dense`` must be
    set (``set_dense``) before the first decode round, once the model's KV layout is known."""

    def __init__(
        self,
        cfg: PillarConfig,
        metrics: PillarMetrics,
        clock: RoundClock | NoClock,
        *,
        policy: SpeculationPolicy | None = None,
        agreement: RoundAgreement | None = None,
        cost_file: CostFile | None = None,
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.clock = clock
        self.policy = policy
        self.agreement = agreement
        self.cost_file = cost_file  # where the policy's measured costs persist (rank 0 writes); None: nowhere
        self.dense: DenseChooser | None = None
        self.rounds = LaunchedRounds()  # decode rounds awaiting their accept counts
        self.warmup_rounds = 0  # start-up warm-up rounds so far (patches/serve_warmup.py)
        self.restore_costs()

    def set_dense(self, chooser: DenseChooser) -> None:
        self.dense = chooser

    # ---- per round ---------------------------------------------------------------------
    def shape(self, batch) -> RoundShape:
        """This round's shape, counted in the metrics (steps 1-3 of the module docstring)."""
        single = single_token_rows(batch)  # who takes one token per round (request_rounds): None for most
        if is_warmup(batch.reqs):
            self.warmup_rounds += 1
            steps = warmup_steps(self.cfg.step_candidates, self.warmup_rounds - 1)
            return RoundShape(steps, num_drafts=num_drafts_for(single, steps))
        shape, launch = self._choose(batch, single)
        num_drafts = num_drafts_for(single, shape.steps)
        self.rounds.launched(shape.steps, len(batch.reqs), launch, num_drafts)
        self.metrics.launched(shape.steps, len(batch.reqs))
        return shape._replace(num_drafts=num_drafts)

    def _choose(self, batch, single: list[bool] | None) -> tuple[RoundShape, AdaptiveRound | None]:
        """The draft count and dense requests of a round that is not warm-up, and
        what the adaptive readers keep of it until its counts arrive (None: adaptive speculation off).
        ``single``: the batch's ``single_token_rows``."""
        if self.policy is None or batch.forward_mode.is_idle():
            return RoundShape(self.cfg.num_steps), None
        samples = self.clock.poll()
        self.policy.observe(samples)
        self.metrics.rounds_timed(samples)
        reqs = batch.reqs
        alpha = self.policy.acceptance.alpha
        mean_len = sum(r.seqlen for r in reqs) / max(len(reqs), 1)
        choice = self.policy.choose(len(reqs), mean_len, lambda: self.dense.view(reqs, alpha))
        steps, key, dense = choice.steps, choice.key, choice.dense
        if self.cfg.force_steps >= 0:  # analysis: the cell still measures what runs, which is forced
            steps, dense = self.cfg.force_steps, None
        elif steps and 0 in self.cfg.step_candidates and single is not None and all(single):
            steps, dense = 0, None  # nobody would draft (request_rounds): a plain round takes the same tokens
        steps, dense = self.agreement.agree(steps, dense, len(reqs))  # TP ranks must run one round shape
        # The calibration compares a round with what it was chosen for: only a round that ran as chosen.
        expected = choice.expected if (steps, dense) == (choice.steps, choice.dense) else None
        self.dense.launched(steps, dense)
        launch = AdaptiveRound(list(reqs), None if dense is None else list(dense), expected)
        self.clock.announce(key, steps)
        rounds = sum(self.metrics.rounds_by_steps.values()) + 1  # this round is counted at launch
        if rounds % PATH_LOG_EVERY == 0:
            logger.info("PILLAR adaptive: %s", self.summary())
            self.save_costs()
        return RoundShape(steps, dense if dense is not None and any(dense) else None), launch

    def completed(self, num_correct_drafts_per_req: list[int]) -> None:
        """SGLang's accept counts of the oldest launched round, now on the host."""
        matched = self.rounds.completed(num_correct_drafts_per_req)
        self.metrics.completed(matched)
        if matched is not None and matched.payload is not None:  # a round of drafts the policy chose
            self.policy.acceptance.completed(matched)
            self.dense.completed(matched)

    # ---- reporting and the cost file ---------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """PILLAR's live numbers for /server_info."""
        out: dict[str, Any] = {
            "step_candidates": list(self.cfg.step_candidates),
            "rounds_by_k": {str(k): self.metrics.rounds_by_steps[k] for k in self.cfg.step_candidates},
        }
        if self.cfg.plain_path is PlainPath.DECODE:  # which of the plain rounds the decode path served
            out["plain_decode_rounds"] = self.metrics.plain_decode_rounds
        if self.cfg.mixed:  # which of the full-length rounds ran as mixed-phase iterations
            out["mixed_rounds"] = self.metrics.mixed_rounds
        if self.policy is not None:
            out.update(self.policy.summary(), dense_request_rounds=self.dense.dense_request_rounds)
        return out

    def restore_costs(self) -> None:
        cells = self.cost_file.load() if self.cost_file is not None else None
        if not cells:
            return
        try:
            n = self.policy.table.restore(cells)
        except ValueError as e:  # a hand-edited or truncated file: measure from scratch
            logger.warning("PILLAR costs in %s not used: %s", self.cost_file.path, e)
            return
        logger.info("PILLAR costs: %d measured cells from %s", n, self.cost_file.path)

    def save_costs(self) -> None:
        # Rank 0's costs decide every rank's round (tp_agree), so only rank 0 writes.
        if self.cost_file is None or self.agreement.rank != 0:
            return
        try:
            self.cost_file.save(self.policy.table.export())
        except OSError as e:
            logger.warning("PILLAR costs not saved to %s (%s); not trying again", self.cost_file.path, e)
            self.cost_file = None
