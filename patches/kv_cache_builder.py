"""``kv_cache_builder.get_draft_kv_pool``: PILLAR owns no draft KV pool.

The stock function dereferences ``draft_worker.draft_worker.draft_runner`` for every
algorithm except NGRAM; a self-speculative worker has no nested draft worker.
"""

from __future__ import annotations

from .spec_algo import is_pillar


def no_draft_pool_for_pillar(original, *args, **kwargs):
    if is_pillar(kwargs.get("spec_algorithm")):
        return None
    return original(*args, **kwargs)
