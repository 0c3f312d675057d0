"""Host time of PILLAR's per-round speculation policy, on the CPU (no GPU, no server).

    python3 -m tools.policy_host --out benchmarks/results/policy/policy_host_<machine>_<commit>.json

Under SGLang's overlap scheduler the scheduler thread prepares round i+1 while the GPU runs round i;
whatever the policy costs on that thread is GPU idle time once the host is the slower side. This
drives the worker's own per-round planner (``RoundPlanner.shape`` before each launch, ``completed``
with each round's accept counts) on a stand-in server whose cost cells are
priced, at each batch size, with a quarter of the requests drafting poorly (so the dense-drafting
plans run too), and reports the mean microseconds per round of each call. The host CPU of a GPU
node differs from this one: compare numbers of one machine only.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from types import SimpleNamespace

from benchmarks.meta import new_run_id, run_metadata
from sglang_sparsespec.config import PillarConfig
from sglang_sparsespec.metrics import PillarMetrics
from sglang_sparsespec.patches.round_plan import RoundPlanner
from sglang_sparsespec.patches.tp_agree import RoundAgreement
from sglang_sparsespec.adaptive.policy import RoundSample, SpeculationPolicy
from sglang_sparsespec.adaptive.dense import DenseChooser
from sglang_sparsespec.rounds.clock import RoundClock

KV_BYTES = 30 * 3 * 64 * 2 * 2  # SmolLM2-135M: layers x KV heads x head dim x (K, V) x bf16
LAYERS, SPLIT_PROGRAMS = 30, 528  # the draft kernel's splits fill ~528 programs (132 SMs x 4)


class _Req:
    """SGLang's Req as the planner reads it: a context length (weakly referenced by DenseChooser), a rid."""

    def __init__(self, seqlen: int) -> None:
        self.seqlen, self.rid = seqlen, "9f1c2ab0e4"


class _Event:
    """A CUDA event stand-in that is always complete."""

    def record(self) -> None: ...

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: _Event) -> float:
        return 1.0


def stand_in_planner(bs: int, context: int, rng: random.Random) -> tuple[RoundPlanner, object]:
    """A planner with PILLAR's default policy state and a decode batch of ``bs`` requests (no penalties
    or processors: the batch-level check answers for its requests)."""
    cfg = PillarConfig()
    policy = SpeculationPolicy(cfg.step_candidates, floor_quantile=cfg.floor_quantile, premium=cfg.spec_premium)
    planner = RoundPlanner(
        cfg, PillarMetrics(cfg.num_steps), RoundClock(_Event), policy=policy, agreement=RoundAgreement(None)
    )
    planner.set_dense(DenseChooser(cfg.budget, KV_BYTES, LAYERS, lambda b: max(1, SPLIT_PROGRAMS // (3 * b))))
    reqs = [_Req(context + rng.randrange(512)) for _ in range(bs)]
    sampling = SimpleNamespace(
        has_custom_logit_processor=False,
        acc_additive_penalties=None,
        acc_scaling_penalties=None,
        penalizer_orchestrator=None,
    )
    batch = SimpleNamespace(reqs=reqs, forward_mode=SimpleNamespace(is_idle=lambda: False), sampling_info=sampling)
    key = policy.choose(bs, context)[1]
    for k, draft_ms, rest_ms in ((0, 0.0, 3.0), (2, 2.0, 10.0), (4, 4.0, 10.0), (8, 8.0, 10.0)):
        policy.observe([RoundSample(key, k, draft_ms, rest_ms, 0.2)])
    return planner, batch


def time_rounds(bs: int, context: int, rounds: int, seed: int = 0) -> dict[str, float]:
    """Mean microseconds per round of the launch-side and the completion-side policy calls."""
    rng = random.Random(seed)
    planner, batch = stand_in_planner(bs, context, rng)
    poor = set(rng.sample(range(bs), bs // 4))
    choose_s = complete_s = 0.0
    for _ in range(rounds):
        t0 = time.perf_counter()
        steps = planner.shape(batch).steps
        # The rest of a round's host-side clock work (Rounds.decode).
        planner.clock.start(bs)
        planner.clock.drafted()
        planner.clock.end()
        t1 = time.perf_counter()
        counts = [rng.randint(0, 1) if i in poor else rng.randint(steps // 2, steps) for i in range(bs)]
        t2 = time.perf_counter()
        planner.completed(counts)
        complete_s += time.perf_counter() - t2
        choose_s += t1 - t0
    return {
        "bs": bs,
        "context": context,
        "choose_us": 1e6 * choose_s / rounds,
        "complete_us": 1e6 * complete_s / rounds,
        "rounds_by_k": {str(k): n for k, n in sorted(planner.metrics.rounds_by_steps.items())},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    p.add_argument("--context", type=int, default=4000)
    p.add_argument("--rounds", type=int, default=2000)
    args = p.parse_args(argv)
    rows = []
    for bs in args.batches:
        rows.append(time_rounds(bs, args.context, args.rounds))
        print(
            f"bs {bs:4d}: choose {rows[-1]['choose_us']:7.1f} us, complete {rows[-1]['complete_us']:7.1f} us per round"
        )
    doc = {
        "kind": "policy_host",
        "schema": 1,
        "meta": run_metadata(new_run_id()),
        "settings": vars(args) | {"out": str(args.out)},
        "rows": rows,
    }
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
