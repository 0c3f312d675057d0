"""KV heads that also attend each draft query's token matches (``--pillar-match-heads N@LAYER.HEAD+...``).

The heads a shared plan serves worst look positions up by content (``dense_heads.py``; ``head_probe`` names them):
an induction head attends the position after the current token's earlier occurrences, a duplicate-token head the
occurrences themselves. Reading such a head's whole prefix keeps those lookups at a cost that grows with the
context; listing it here adds only what its lookup finds. In every draft step each request's N latest occurrences
of the step's input token below its plan's tail, and the position after each (``kernels/token_match.py``), join
the listed heads' plans, each head's copy without the positions its plan holds. The scan reads the requests' token
ids on the GPU (``TokenIds``), kept by position as req_to_token keeps KV slots: written where tokens become known (a
prefill's whole sequence, each round's pending token and chain) and read only below the tail, where every position
holds a committed token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .dense_heads import FLAG as DENSE_FLAG
from .dense_heads import head_table, heads_gap, layer_rows, parse_dense_heads

FLAG = "--pillar-match-heads"
# Occurrences a step lists at most (twice that many positions): the match buffers' static width.
MAX_LATEST = 256
# The count the head probe suggests: on SmolLM2's texts the 64 latest occurrences keep 93-95% of the tokens a round
# every occurrence adds (tools.draft_fidelity, draft_fidelity_served_*_4096_match64.json against _matchall).
SUGGESTED_LATEST = 64
# ``N@auto[:C]``: the server's warm-up probes the model (``head_probe``'s random sequence shown twice, through the
# served forward) and lists its C highest-scoring heads, by default head_probe's 11: on SmolLM2 those served 1.06x
# PILLAR at the headline's point (throughput_h100-58858b1-match_*.json).
AUTO = "auto"
AUTO_HEADS = 11


def auto_heads(text: str) -> int | None:
    """The head count of an ``N@auto[:C]`` value (C, default AUTO_HEADS); None for any other value."""
    name, colon, count = text.partition("@")[2].strip().partition(":")
    if name != AUTO:
        return None
    if colon and not (count.isdecimal() and int(count) >= 1):
        raise ValueError(f"{FLAG} {text!r}: give N@auto or N@auto:C with C >= 1 heads (e.g. 64@auto:11)")
    return int(count) if colon else AUTO_HEADS


def parse_match_heads(text: str) -> tuple[int, tuple[tuple[int, int], ...]]:
    """``"32@7.2+20.1"`` as (32, ((7, 2), (20, 1))); ``"32@auto"`` as (32, ()) (the probe names the heads); (0, ())
    for an empty value; ValueError otherwise."""
    if not text.strip():
        return 0, ()
    latest, at, heads = text.partition("@")
    if not (at and latest.strip().isdecimal() and 1 <= int(latest) <= MAX_LATEST):
        raise ValueError(
            f"{FLAG} {text!r}: give N@LAYER.HEAD+... or N@auto with N in 1..{MAX_LATEST} occurrences (e.g. 32@7.2+20.1)"
        )
    if auto_heads(text) is not None:
        return int(latest), ()
    parsed = parse_dense_heads(heads, FLAG)
    if not parsed:
        raise ValueError(f"{FLAG} {text!r}: name at least one KV head after the @")
    return int(latest), parsed


def match_heads_gap(text: str, num_layers: int, num_kv_heads: int, dense_heads: str = "") -> str | None:
    """Why ``text`` cannot list match heads of a model of ``num_layers`` x ``num_kv_heads`` beside ``dense_heads``
    (a dense head already reads every position), or None."""
    try:
        _, heads = parse_match_heads(text)
        count = auto_heads(text)
        dense = parse_dense_heads(dense_heads)
        both = sorted(set(heads) & set(dense))
    except ValueError as exc:
        return str(exc)
    if count is not None and dense:
        return f"{FLAG} {text!r} beside {DENSE_FLAG}: the probe could list a dense head; name the match heads instead"
    if count is not None and count > num_layers * num_kv_heads:
        return f"{FLAG} {text!r}: the model has {num_layers * num_kv_heads} KV heads"
    if both:
        named = "+".join(f"{layer}.{head}" for layer, head in both)
        return f"{FLAG} and {DENSE_FLAG} both name {named}: a dense head reads every position already"
    return heads_gap(heads, num_layers, num_kv_heads, FLAG)


@dataclass(frozen=True)
class MatchHeads:
    """The listed KV heads as the draft step's kernels index them: listed head i (in layer, head order) gets row i
    of the step's per-head match lists (``kernels/token_match.py``'s ``match_lists_fwd``).

    rows:   per layer [num_kv_heads] int32, each listed head's row and -1 elsewhere, or None in a layer with none
            listed (its launch compiles the match path out).
    groups: [n] int32, listed head i's plan set: layer x num_kv_heads + head (``selection/state.py``'s groups).
    table:  with ``N@auto``, the [layers, num_kv_heads] tensor every layer's rows view (none listed until
            ``assign``, which the warm-up's probe calls; the captured draft graphs read the same memory).
    """

    rows: tuple[torch.Tensor | None, ...]
    groups: torch.Tensor
    table: torch.Tensor | None = None

    @property
    def count(self) -> int:
        return self.groups.shape[0]

    def assign(self, scores: torch.Tensor) -> torch.Tensor:
        """List the ``count`` highest-scoring heads of a [layers, num_kv_heads] score in place (on the device, no
        host sync); returns their flat indices (layer x num_kv_heads + head), ascending."""
        if self.table is None:
            raise ValueError("only N@auto match heads are assigned by a probe")
        if scores.shape != self.table.shape:
            raise ValueError(f"a {tuple(self.table.shape)} score expected, got {tuple(scores.shape)}")
        top = scores.flatten().topk(self.count).indices.sort().values
        self.table.fill_(-1)
        self.table.view(-1)[top] = torch.arange(self.count, dtype=torch.int32, device=self.table.device)
        self.groups.copy_(top.to(torch.int32))
        return top


def match_heads_of(text: str, num_layers: int, num_kv_heads: int, device: torch.device) -> MatchHeads | None:
    """The heads ``text`` lists, for a model of ``num_layers`` x ``num_kv_heads``; None when it lists none."""
    count = auto_heads(text)
    if count is not None:
        table = torch.full((num_layers, num_kv_heads), -1, dtype=torch.int32, device=device)
        groups = torch.zeros(count, dtype=torch.int32, device=device)
        return MatchHeads(rows=tuple(table.unbind(0)), groups=groups, table=table)
    _, heads = parse_match_heads(text)
    if not heads:
        return None
    table = head_table(heads, num_layers, num_kv_heads, FLAG)  # parse_match_heads sorts them: rows in that order
    groups = torch.tensor([layer * num_kv_heads + head for layer, head in heads], dtype=torch.int32)
    return MatchHeads(rows=layer_rows(table, device), groups=groups.to(device))


class TokenIds:
    """Each request row's token id at each position: ``ids`` [rows, width] int32, rows and positions as in
    SGLang's req_to_token (``width`` covers the context and a round's chain past it)."""

    def __init__(self, rows: int, width: int, device: torch.device | str) -> None:
        self.ids = torch.zeros((rows, width), dtype=torch.int32, device=device)

    def write_sequences(self, rows: Sequence[int], sequences: Sequence[Sequence[int]]) -> None:
        """Each row's whole known sequence from position 0 (a prefill's prompt, and the outputs of a request
        that comes back after retraction): one host-to-device copy for the batch."""
        if not rows:
            return
        lengths = [min(len(s), self.ids.shape[1]) for s in sequences]
        flat = torch.tensor([t for s, n in zip(sequences, lengths) for t in s[:n]], dtype=torch.int32)
        row = torch.repeat_interleave(torch.tensor(rows, dtype=torch.int64), torch.tensor(lengths))
        col = torch.cat([torch.arange(n) for n in lengths])
        device = self.ids.device
        self.ids[row.to(device), col.to(device)] = flat.to(device, non_blocking=True)

    def write_chain(self, rows: torch.Tensor, start: torch.Tensor, tokens: torch.Tensor) -> None:
        """tokens [bs, n] at positions start[b] .. start[b] + n - 1 of row rows[b], on the device (a round's pending
        token and drafts; positions whose drafts are rejected are written again by a later round before any scan
        reads them, since scans read only below the tail)."""
        if tokens.numel() == 0:
            return
        cols = start.to(torch.int64)[:, None] + torch.arange(tokens.shape[1], device=tokens.device)
        self.ids[rows.to(torch.int64)[:, None], cols] = tokens.to(torch.int32)
