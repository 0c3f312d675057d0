"""One entry of the hook list (``patches/__init__.py``): an SGLang symbol, how it is hooked, and why."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Hook:
    target: str  # dotted path of the SGLang symbol
    kind: str  # HookType member name
    fn: Callable
    why: str
