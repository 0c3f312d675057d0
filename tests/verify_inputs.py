"""SGLang's EAGLE chain verify input for tests of PILLAR's acceptance: the fields it reads, the
rest of the tree's tensors left empty (a topk=1 chain's mask, positions and links are never read there)."""

from __future__ import annotations

import torch
from sglang.srt.speculative.eagle_info import EagleVerifyInput


def chain_input(bonus: torch.Tensor, drafts: torch.Tensor) -> EagleVerifyInput:
    """bonus [bs] and drafts [bs, k] as SGLang lays a chain out: draft_token [bs * (k + 1)], row
    b * (k + 1) + j holding request b's j-th token (the bonus first)."""
    bs, k = drafts.shape
    return EagleVerifyInput(
        draft_token=torch.cat([bonus.view(bs, 1), drafts], dim=1).reshape(-1),
        custom_mask=None,
        positions=None,
        retrieve_index=torch.arange(bs * (k + 1)).view(bs, k + 1),
        retrieve_next_token=None,
        retrieve_next_sibling=None,
        retrieve_cum_len=None,
        spec_steps=k,
        topk=1,
        draft_token_num=k + 1,
        capture_hidden_mode=None,
        seq_lens_sum=None,
        seq_lens_cpu=None,
    )
