"""How deeply a JSON text or a decoded JSON value nests, counted without recursion.

A JSON schema nested thousands of levels deep costs the grammar compiler gigabytes (or its process) and
SGLang's schema conversion a RecursionError; a recursive walk would fail the same way, so both counts here
keep their own stack or counter.

Nothing here touches SGLang.
"""

from __future__ import annotations

from typing import Any


def text_depth(text: str) -> int:
    """The deepest nesting of ``[`` / ``{`` outside string literals in ``text`` (0 for a scalar); counts what the
    brackets say whether or not the text parses."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def value_depth(value: Any) -> int:
    """The deepest nesting of lists and dicts in a decoded JSON value (0 for a scalar)."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in children)
    return deepest
