"""``--pillar-match-heads N@auto``: the match heads named by the model itself, during the server's warm-up.

The warm-up sends ``head_probe``'s random sequences shown twice (``rounds/warmup.py``'s ``probe_batches``). While
such a request is prefilled, a forward pre-hook on each of the model's ``RadixAttention`` modules reads the q and k
SGLang hands attention (normed and rotated) and adds the layer's lookup scores (``head_probe.qk_lookup_scores``:
each KV head's mass on a token's earlier occurrence and on the position after it) into one [layers, KV heads]
tensor; after each probe the match heads are the ``C`` highest so far, written into the tensors the captured draft
graphs read (``MatchHeads.assign``). Until the first probe no head is listed. The hooks exist only during a probe's
forward, so no other forward pays for them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from sglang_sparsespec.selection.head_probe import PROBE_LENGTH, pick_heads, qk_lookup_scores
from sglang_sparsespec.selection.match_heads import FLAG, MatchHeads

logger = logging.getLogger(__name__)


def attention_modules(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's attention modules (SGLang's RadixAttention: layer_id, heads, head dim and scaling on each)."""
    return [m for m in model.modules() if type(m).__name__ == "RadixAttention"]


class HeadProbe:
    """Scores every KV head over the warm-up's probe prefills and assigns ``heads`` after each."""

    def __init__(self, model: torch.nn.Module, heads: MatchHeads) -> None:
        if heads.table is None:
            raise ValueError("the head probe serves N@auto match heads only")
        self.heads = heads
        self.modules = attention_modules(model)
        self.scores = torch.zeros(heads.table.shape, dtype=torch.float32, device=heads.table.device)
        self.probes = 0  # probe prefills that scored a layer
        self.scored = 0  # layer calls scored
        self.missed = 0  # layer calls that did not hold exactly one probe sequence (logged after each probe)

    @contextmanager
    def capture(self, input_len: int) -> Iterator[None]:
        """Around the prefill forward of one probe request of ``input_len`` tokens (a BOS, then the sequence)."""
        offset = input_len - 2 * PROBE_LENGTH
        if offset not in (0, 1):  # not a probe sequence shown twice, with or without a BOS: nothing to score
            logger.warning("PILLAR head probe: a %d-token prefill is no probe; the heads stay as they are", input_len)
            yield
            return
        scored_before = self.scored
        handles = [m.register_forward_pre_hook(self._hook(offset, input_len), with_kwargs=True) for m in self.modules]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
        if self.scored == scored_before:  # e.g. attention inside a compiled prefill graph, where no hook runs
            logger.warning("PILLAR head probe: no layer was scored in this probe's prefill; the heads stay as they are")
            return
        self.probes += 1
        self.heads.assign(self.scores)
        named = pick_heads(self.scores.cpu(), self.heads.count)  # a host sync, once a probe at warm-up
        logger.info("PILLAR match heads after probe %d: %s %s", self.probes, FLAG, named)
        if self.missed:
            logger.warning("PILLAR head probe: %d layer calls held other tokens and were not scored", self.missed)

    def _hook(self, offset: int, input_len: int):
        def score(module: Any, args: tuple, kwargs: dict[str, Any]) -> None:
            # RadixAttention.forward(q, k, v, forward_batch, ...), the models' calls positional
            q = args[0] if args else kwargs.get("q")
            k = args[1] if len(args) > 1 else kwargs.get("k")
            if q is None or k is None or q.shape[0] != input_len:
                self.missed += 1
                return
            q = q.reshape(input_len, module.tp_q_head_num, module.qk_head_dim)
            k = k.reshape(input_len, module.tp_k_head_num, module.qk_head_dim)
            cap = float(getattr(module, "logit_cap", 0.0) or 0.0)
            found = qk_lookup_scores(q, k, PROBE_LENGTH, offset, module.scaling, cap)
            self.scores[module.layer_id] += found["duplicate"] + found["induction"]
            self.scored += 1

        return score
