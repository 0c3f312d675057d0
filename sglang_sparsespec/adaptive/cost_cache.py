"""The round costs a server measured, kept in a file per GPU and server setup.

Adaptive speculation prices each round from costs the server measures itself (``adaptive/policy.py``):
a fresh server knows none, so every (batch, context) cell it meets first runs a plain round and a
k_max round to price them, whatever they cost there (a plain probe at 256 requests emits a sixth of
a k_max round's tokens for a third of its time). The server writes its cost table to a file every
few thousand rounds, and a server of the same setup reads it at start: its cells begin priced and
are re-measured on the usual schedule (their estimates then follow this server's own rounds).

The setup (``identity``) is what moves round costs: GPU, model, TP size, attention backend, KV dtype,
k and the draft counts, the plain-round path, the selection policy, cadence and budget, the plugin
version. A file whose identity differs is not read (another setup writes its own file: the name carries
a hash of the identity). A missing, unreadable or malformed file is not an error: the server measures
from scratch.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_sparsespec.config import cache_root

SCHEMA = 1


def _canonical(identity: Any) -> str:
    """The identity as JSON with sorted keys: equal setups give equal text whatever their key order."""
    return json.dumps(identity, sort_keys=True, default=str)


@dataclass(frozen=True)
class CostFile:
    """``path``: the JSON file; ``identity``: the setup it belongs to (JSON-ready values)."""

    path: Path
    identity: dict[str, Any]

    @classmethod
    def resolve(cls, setting: str, identity: Mapping[str, Any], root: Path | None = None) -> CostFile | None:
        """``setting`` is SPARSESPEC_COST_CACHE: ``off`` -> None; ``auto`` -> a file under ``<cache
        root>/costs`` named after the identity; anything else is the file's path."""
        ident = dict(identity)
        if setting.strip().lower() == "off":
            return None
        if setting.strip().lower() != "auto":
            return cls(Path(setting).expanduser(), ident)
        digest = hashlib.sha256(_canonical(ident).encode()).hexdigest()[:16]
        gpu = "".join(ch if ch.isalnum() else "-" for ch in str(ident.get("gpu", "gpu")))[:40]
        return cls((root or cache_root()) / "costs" / f"{gpu}-{digest}.json", ident)

    def load(self) -> dict[str, Any] | None:
        """The stored cells if the file exists, parses and belongs to this identity; else None."""
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            return None
        if _canonical(doc.get("identity")) != _canonical(self.identity):
            return None
        cells = doc.get("cells")
        return cells if isinstance(cells, dict) else None

    def save(self, cells: Mapping[str, Any]) -> None:
        """Write atomically (a reader never sees half a file, and a failed write leaves no temporary file behind);
        OSError when the folder is not writable or the path is a folder."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            doc = {"schema": SCHEMA, "identity": self.identity, "cells": dict(cells)}
            tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
