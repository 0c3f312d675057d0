"""Which ``stop_regex`` patterns could stall a scheduler: nested repetition, and too many open-ended repeats.

SGLang searches every stop pattern of every request in the latest output at every decode step, in the
scheduler's one thread. A backtracking engine (Python's ``re``) takes exponential time on patterns
whose repeated group can itself match a run of text in several ways: ``(a+)+$`` took 0.39 s on 22
characters and doubles with each one more. ``nested_repetition`` finds the shape: a group repeated
more than once (``+``, ``*``, ``{2,}``, ``{1,9}``, ...) whose body holds a quantifier of variable count
or alternatives. Possessive quantifiers and atomic groups, which never backtrack, are not counted.

What remains is polynomial in the text searched, of a degree one above the pattern's count of repeats that can
take a run of the text: ``.*.*.*.*Z`` took 2.0 s on 164 characters (a 32-token window), ``.*.*.*Z`` 66 ms,
``.*.*Z`` 2 ms, ``.*Z`` 0.07 ms. ``variable_repeats`` counts the repeats of unbounded or wide count, and the
boundary takes at most ``MAX_VARIABLE_REPEATS`` a pattern, searched in a window of the latest tokens
(``limits.RequestLimits.stop_regex_window``). Other exponential shapes (back-references) are not detected.

Nothing here touches SGLang.
"""

from __future__ import annotations

from typing import Any

try:  # Python 3.11+: the parser behind re
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse  # type: ignore[no-redef]

_C = sre_parse  # the opcode names (MAX_REPEAT, SUBPATTERN, ...) live beside the parser
_REPEATS = (_C.MAX_REPEAT, _C.MIN_REPEAT)
# Variable repeats a stop pattern may hold: at most ~2 ms a search of a 32-token window (cubic).
MAX_VARIABLE_REPEATS = 2
# A repeat whose count may vary by more than this is a factor of the text's length (``?``, ``{1,3}``: a constant).
WIDE_REPEAT = 8


def _varies(op: Any, av: Any) -> bool:
    """Whether a node can match in more than one way by itself: a repeat of variable count, or a branch."""
    if op in _REPEATS:
        low, high, _ = av
        return high != low
    return op is _C.BRANCH


def _children(op: Any, av: Any) -> list[Any]:
    """The sub-patterns directly under one node (possessive and atomic bodies excluded: no backtracking)."""
    if op in _REPEATS:
        return [av[2]]
    if op is _C.SUBPATTERN:
        return [av[-1]]
    if op is _C.BRANCH:
        return list(av[1])
    if op in (_C.ASSERT, _C.ASSERT_NOT):
        return [av[1]]
    if op is _C.GROUPREF_EXISTS:
        return [b for b in av[1:] if b is not None]
    return []


def _walk(pattern: Any, inside_repeat: bool) -> bool:
    for op, av in pattern:
        if inside_repeat and _varies(op, av):
            return True
        repeated = inside_repeat or (op in _REPEATS and av[1] > 1)
        if any(_walk(child, repeated) for child in _children(op, av)):
            return True
    return False


def nested_repetition(pattern: str) -> bool:
    """Whether ``pattern`` (which compiles) repeats a group whose body can match in several ways."""
    return _walk(sre_parse.parse(pattern), inside_repeat=False)


def _count(pattern: Any) -> int:
    total = 0
    for op, av in pattern:
        total += op in _REPEATS and av[1] - av[0] > WIDE_REPEAT
        total += sum(_count(child) for child in _children(op, av))
    return total


def variable_repeats(pattern: str) -> int:
    """How many repeats of unbounded or wide count (``*``, ``+``, ``{m,}``, ``{m,n}`` with n - m > WIDE_REPEAT)
    ``pattern`` (which compiles) holds, nested ones included; possessive and atomic bodies, which never backtrack,
    are not counted."""
    return _count(sre_parse.parse(pattern))
