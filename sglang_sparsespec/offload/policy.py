"""Which running requests to park when the next decode round does not fit in the GPU pool."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Candidate:
    """One running request that may be parked.

    ``private_tokens``: KV tokens parking would move and free (> 0 to be useful);
    ``remaining``: tokens it may still generate (max_new_tokens - generated);
    ``admitted``: admission sequence number (larger = admitted later).
    """

    key: Hashable  # the request
    private_tokens: int
    remaining: int
    admitted: int


def choose_victims(
    candidates: Sequence[Candidate], tokens_needed: int, host_free: int, max_victims: int
) -> list[Candidate]:
    """Requests to park, in park order, until ``tokens_needed`` device tokens would be freed.

    Furthest from finishing first (it would hold its KV longest), then the most recently
    admitted. A request whose KV does not fit the remaining host budget is skipped; at most
    ``max_victims`` are chosen (the caller keeps one request resident so the batch progresses). The result may
    free less than ``tokens_needed``; the caller falls back to SGLang's retraction for the rest.
    """
    if tokens_needed <= 0:
        return []
    order = sorted(candidates, key=lambda c: (-c.remaining, -c.admitted))
    victims: list[Candidate] = []
    freed = 0
    for cand in order:
        if freed >= tokens_needed or len(victims) >= max_victims:
            break
        if 0 < cand.private_tokens <= host_free:
            victims.append(cand)
            freed += cand.private_tokens
            host_free -= cand.private_tokens
    return victims
