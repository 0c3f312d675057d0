"""Target rows built from given probabilities, for tests of the acceptance kernels on arbitrary p.

``kernels/target_filter.py`` describes a row by a threshold on its logits; rows of any p are the rows of
logits log p (-inf where p is 0) at temperature 1 with nothing cut. ``listed`` also lists every row's
support (each must fit ``list_cap``), so the draw reads the list instead of the whole vocabulary.
"""

from __future__ import annotations

import torch
from sglang_sparsespec.kernels.logit_bins import RowPath
from sglang_sparsespec.kernels.target_filter import TargetRows


def rows_from_probs(p: torch.Tensor, listed: bool = False, list_cap: int = 64) -> TargetRows:
    """p [bs, k + 1, V] -> the TargetRows of its bs * (k + 1) rows at repeats k + 1 (``dense()`` gives p
    back up to rounding: compare the kernels against the reference run on ``dense()``)."""
    bs, rep, vocab = p.shape
    flat = p.reshape(-1, vocab)
    logits = torch.where(flat > 0, flat.clamp(min=1e-38).log(), -torch.inf).contiguous()
    m = logits.amax(dim=-1)
    scale = 1.0 / torch.exp(logits - m[:, None]).sum(dim=-1)
    n = flat.shape[0]
    desc = torch.stack([m, torch.full_like(m, -torch.inf), scale, torch.full_like(m, float(vocab))], dim=1)
    list_ids = torch.zeros((n, list_cap), dtype=torch.int32, device=p.device)
    list_n = torch.zeros(n, dtype=torch.int32, device=p.device)
    path = torch.full((n,), int(RowPath.VOCAB), dtype=torch.int32, device=p.device)
    if listed:
        for r in range(n):
            ids = (flat[r] > 0).nonzero().view(-1)
            assert ids.numel() <= list_cap, "a listed row's support must fit the list"
            list_ids[r, : ids.numel()] = ids.to(torch.int32)
            list_n[r] = ids.numel()
        path.fill_(int(RowPath.FULL))
    temperature = torch.ones(bs, device=p.device)
    return TargetRows(logits, temperature, rep, desc.contiguous(), list_ids, list_n, path)
