"""``PillarVerifyInput``: EAGLE's topk=1 chain verify input, plus what PILLAR's accept step reads.

SGLang carries each speculative phase's inputs as typed objects (``eagle_info.py``); PILLAR's verify is
EAGLE's chain verify (``build_eagle_verify_input`` / ``EAGLEWorkerV2._build_trivial_verify_input`` build
it), extended here with the round's draft record, each request's own draft count and the phase clock's
verify mark. The accept hook (``verify_sample.pillar_eagle_sample``) serves exactly the inputs of this
type; every other verify input, an idle one included, runs SGLang's own code.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import torch
from sglang.srt.speculative.eagle_info import EagleVerifyInput

from sglang_sparsespec.sampling.rejection import DraftRecord


@dataclass
class PillarVerifyInput(EagleVerifyInput):
    """``EagleVerifyInput`` fields as SGLang built them, and:

    record: the round's drafts with their compact proposal rows (``DraftRecord``: tokens [bs, k],
        cand_ids / cand_q [bs, k, C], q_tok [bs, k]); a zero-width record for a sampled plain round;
        None when the batch drafted greedily (no distributions to reject against);
    num_drafts: [bs] int32 on the device, each request's own draft count where some requests draft
        fewer than the round (per-token sampling state: ``request_rounds``); None when every request
        drafted the whole round;
    on_logits: called once the verify forward's logits exist (the phase clock's verify mark).
    """

    record: DraftRecord | None = None
    num_drafts: torch.Tensor | None = None
    on_logits: Callable[[], None] | None = None

    @classmethod
    def extend(
        cls,
        chain: EagleVerifyInput,
        record: DraftRecord | None,
        num_drafts: torch.Tensor | None = None,
        on_logits: Callable[[], None] | None = None,
    ) -> PillarVerifyInput:
        """``chain``'s fields unchanged, with PILLAR's round attached."""
        base = {f.name: getattr(chain, f.name) for f in fields(EagleVerifyInput) if f.init}
        return cls(**base, record=record, num_drafts=num_drafts, on_logits=on_logits)
