"""``mem_cache.allocation.alloc_for_spec_decode``: its closing per-request loop without tensor indexing.

Every speculative decode round (plain PILLAR rounds included) reserves KV through it, and it ends
with ``req.kv.kv_allocated_len = max(..., int(nxt_kv_lens_cpu[i]))`` for each request: a tensor
select and an item per request on the scheduler's critical path (0.7-1.0 ms per round at 256
requests on the CI CPU, against 0.1 ms over a list). With one-token pages SGLang 0.5.17 reads
``nxt_kv_lens_cpu`` only in that loop, so the list of the same values serves it; larger pages pass
the tensor to the paged allocator and keep it. From 0.5.19 SGLang converts the lengths to a list once
itself (the hook's releases: ``Hook.versions``).
"""

from __future__ import annotations

from typing import Any


def listed_next_lens(original, tree_cache, req_to_token_pool, *, nxt_kv_lens_cpu, **kwargs: Any):
    if tree_cache.token_to_kv_pool_allocator.page_size == 1:
        nxt_kv_lens_cpu = nxt_kv_lens_cpu.tolist()
    return original(tree_cache, req_to_token_pool, nxt_kv_lens_cpu=nxt_kv_lens_cpu, **kwargs)
