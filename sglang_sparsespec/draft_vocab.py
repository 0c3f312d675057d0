"""The draft vocabulary: the S token ids a draft step scores, ranked by what the server has committed.

A draft token may come from any proposal q the verify knows exactly (rejection sampling returns the target's
distribution whatever q is), so draft steps may score only S of the V token ids: q is the draft sampler's filtered
distribution over those S, zero elsewhere, and every id it records is a real token id. What that costs is
acceptance, by at most q's mass outside the S ids. Id order is a poor frequency order (a byte-level BPE numbers
merges, not frequencies); the server's own traffic is a good one: on SmolLM2's sampled answers, ids ranked by
earlier answers' drafts leave 0.43 % of q past the top 24K and 0.18 % past 32K, where id order leaves 2.7 % and
1.0 % (``draft_vocab_mass_seen_smollm2_cpu_2e966fc.json``). On Qwen3's 151,936 ids a 24K subset cuts a draft step's
LM head and sampling about six-fold.

``DraftVocab`` counts each committed token (every round's bonus token and every prompt token, on the device, no
host sync) and, every ``refresh_every`` observations, re-ranks: the S most counted ids (ties and the never seen in
id order), kept ascending in ``ids`` with their LM-head rows gathered into ``rows``. Both are static buffers, so
the draft steps' CUDA graphs read whatever the last refresh wrote; a refresh runs on the forward stream between
rounds, after the replays that read the old set and before those that read the new one. Before any traffic the
set is the first S ids.
"""

from __future__ import annotations

import torch

# Observations (rounds and prefills) between two re-rankings: a sort of V counts and a gather of S rows
# (~0.1 ms on an H200 at Qwen3's vocabulary) every 64 rounds of ~30 ms.
REFRESH_EVERY = 64


def ranked_ids(counts: torch.Tensor) -> torch.Tensor:
    """Every id of ``counts`` [V], the most counted first, ids of equal count (the never seen too) in id order."""
    return torch.argsort(counts, descending=True, stable=True)


class DraftVocab:
    """The S ids a draft step scores (``ids`` [S] int64, ascending) and their LM-head rows (``rows`` [S, H])."""

    def __init__(self, weight: torch.Tensor, size: int, refresh_every: int = REFRESH_EVERY):
        if not 0 < size < weight.shape[0]:
            raise ValueError(f"a draft vocabulary of {size} ids needs 0 < size < the LM head's {weight.shape[0]} rows")
        self.weight = weight
        self.counts = torch.zeros(weight.shape[0], dtype=torch.float32, device=weight.device)
        self.ids = torch.arange(size, dtype=torch.int64, device=weight.device)
        self.rows = weight[:size].clone()
        self.refresh_every = refresh_every
        self._observed = 0

    @property
    def size(self) -> int:
        return self.ids.shape[0]

    def observe(self, tokens: torch.Tensor) -> None:
        """Count committed token ids (any shape; ids outside the vocabulary, e.g. padding, are not counted)."""
        flat = tokens.reshape(-1).to(torch.int64)
        valid = (flat >= 0) & (flat < self.counts.shape[0])
        self.counts.index_add_(0, flat.clamp(0, self.counts.shape[0] - 1), valid.to(torch.float32))
        self._observed += 1
        if self._observed % self.refresh_every == 0:
            self.refresh()

    def refresh(self) -> None:
        """Rank the ids by their counts (ties in id order) and keep the top S, ascending, with their rows."""
        top = ranked_ids(self.counts)[: self.size]
        self.ids.copy_(top.sort().values)
        torch.index_select(self.weight, 0, self.ids, out=self.rows)

    def to_ids(self, index: torch.Tensor) -> torch.Tensor:
        """Token ids of positions ``index`` (any shape, int64) in the draft vocabulary."""
        return self.ids[index]
