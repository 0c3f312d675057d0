"""KV heads that draft over the whole prefix (``--pillar-dense-heads``).

In a few KV heads each draft query looks up positions of its own, which no plan shared by a round's queries holds:
the model's induction and duplicate-token heads, which ``python -m sglang_sparsespec.selection.head_probe`` names
from the model alone (``tools.plan_coverage`` measures the same gap on real texts). Listed heads read every position
below the current one at every draft step; every other head reads its plan. Heads are named ``LAYER.HEAD`` by the
model's KV head index, joined by ``+`` (``7.2+20.1``, which a benchmark config name can carry:
``pillar:dense_heads=7.2+20.1``).
"""

from __future__ import annotations

import torch

FLAG = "--pillar-dense-heads"
# KV splits of a layer with a dense head: at the split count sized for plans its programs are the layer's longest
# (kernels_dense_heads_h200_0795838.json, SmolLM2 256 x 4096: 215 us a layer at 1 split, 142 at 4, 137 at 8).
DENSE_SPLITS = 8


def parse_dense_heads(text: str, flag: str = FLAG) -> tuple[tuple[int, int], ...]:
    """``"7.2+20.1"`` as ((7, 2), (20, 1)), sorted and unique; ValueError on anything but LAYER.HEAD items."""
    heads = set()
    for item in filter(None, (x.strip() for x in text.split("+"))):
        layer, dot, head = item.partition(".")
        if not (dot and layer.isdecimal() and head.isdecimal()):
            raise ValueError(f"{flag} {text!r}: give KV heads as LAYER.HEAD joined by + (e.g. 7.2+20.1)")
        heads.add((int(layer), int(head)))
    return tuple(sorted(heads))


def heads_gap(heads: tuple[tuple[int, int], ...], num_layers: int, num_kv_heads: int, flag: str = FLAG) -> str | None:
    """Why ``heads`` cannot name KV heads of a model of ``num_layers`` x ``num_kv_heads``, or None."""
    bad = [f"{layer}.{head}" for layer, head in heads if layer >= num_layers or head >= num_kv_heads]
    if bad:
        return f"{flag} names {', '.join(bad)}: the model has {num_layers} layers of {num_kv_heads} KV heads"
    return None


def dense_heads_gap(text: str, num_layers: int, num_kv_heads: int) -> str | None:
    """Why ``text`` cannot name KV heads of a model of ``num_layers`` x ``num_kv_heads``, or None."""
    return heads_gap(parse_dense_heads(text), num_layers, num_kv_heads)


def head_table(
    heads: tuple[tuple[int, int], ...], num_layers: int, num_kv_heads: int, flag: str = FLAG
) -> torch.Tensor:
    """[num_layers, num_kv_heads] int32 on the host: listed head i (in ``heads``' order) holds i, every other -1;
    ValueError where ``heads`` names a head the model lacks."""
    gap = heads_gap(heads, num_layers, num_kv_heads, flag)
    if gap is not None:
        raise ValueError(gap)
    table = torch.full((num_layers, num_kv_heads), -1, dtype=torch.int32)
    for i, (layer, head) in enumerate(heads):
        table[layer, head] = i
    return table


def layer_rows(table: torch.Tensor, device: torch.device) -> tuple[torch.Tensor | None, ...]:
    """Each layer's row of a ``head_table`` on ``device``, or None in a layer that lists no head (its draft launch
    compiles that head path out)."""
    return tuple(row.to(device) if (row >= 0).any() else None for row in table)


def dense_head_mask(
    text: str, num_layers: int, num_kv_heads: int, device: torch.device
) -> tuple[torch.Tensor | None, ...] | None:
    """Per layer, the draft kernel's ``dense_heads``: [num_kv_heads] int32, 1 at each listed head, or None in a
    layer with none listed; None when no head is listed."""
    heads = parse_dense_heads(text)
    if not heads:
        return None
    rows = layer_rows(head_table(heads, num_layers, num_kv_heads), device)
    return tuple(None if row is None else (row >= 0).to(torch.int32) for row in rows)
