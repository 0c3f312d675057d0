"""One entry of the hook list (``patches/__init__.py``): an SGLang symbol, how it is hooked, why, and
the SGLang releases it was checked against (its target's signature per release: ``signatures.py``)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from . import versions
from .versions import SUPPORTED


@dataclass(frozen=True)
class Hook:
    target: str  # dotted path of the SGLang symbol
    kind: str  # HookType member name
    fn: Callable
    why: str
    # The releases whose target this hook was written and checked against; it is applied on those only
    # (docs/versions.md says what the others do instead).
    versions: tuple[str, ...] = SUPPORTED

    def applies(self, version: str | None = None) -> bool:
        """Whether this hook is applied on ``version`` (default: the installed release)."""
        return (version or versions.INSTALLED) in self.versions

