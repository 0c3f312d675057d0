"""The layout rules the formatter cannot enforce on its own: no Python line past the formatter's width
(``[tool.ruff] line-length`` in pyproject.toml) except a table row, and no module of the installed package
(sglang_sparsespec/, patches/, kernels/) over 400 lines, so a module that grows is cut along a seam rather
than squeezed under the limit.

The one exempt line is a Markdown table row inside a string or a comment: its text, after the comment's
``#``, starts and ends with ``|``. A row cannot wrap without breaking the table; nothing else is exempt,
code, prose and long string literals included.
"""

from __future__ import annotations

import io
import os
import tokenize
import tomllib
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 400
PACKAGE_DIRS = ("sglang_sparsespec", "patches", "kernels")


def width() -> int:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["ruff"]["line-length"]


def python_files() -> list[str]:
    """The repository's .py files (paths relative to it), outside hidden folders (.git, .venv) and builds."""
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("build", "dist", "__pycache__")]
        found += [os.path.relpath(os.path.join(root, f), REPO) for f in files if f.endswith(".py")]
    return sorted(found)


def text_lines(source: str) -> set[int]:
    """The numbers of the lines that hold only a comment or only part of a string (a docstring's lines)."""
    lines = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and not tok.line[: tok.start[1]].strip():
            lines.add(tok.start[0])
        elif tok.type == tokenize.STRING:
            lines.update(range(tok.start[0], tok.end[0] + 1))
    return lines


def is_table_row(line: str) -> bool:
    text = line.strip().removeprefix("#").strip()
    return len(text) > 1 and text.startswith("|") and text.endswith("|")


def long_lines(source: str, limit: int) -> list[int]:
    """The numbers of the lines over ``limit`` characters that are not a table row in a string or comment."""
    lines = source.splitlines()
    over = [i for i, line in enumerate(lines, 1) if len(line) > limit]
    if not over:
        return []
    text = text_lines(source)
    return [i for i in over if not (i in text and is_table_row(lines[i - 1]))]


def offenders() -> dict[str, list[str]]:
    """What each breaking file breaks, by path."""
    limit, found = width(), {}
    for path in python_files():
        source = (REPO / path).read_text()
        problems = []
        if over := long_lines(source, limit):
            problems.append(f"lines over {limit} characters: {over[:8]}{' ...' if len(over) > 8 else ''}")
        n = source.count("\n")
        if path.startswith(tuple(d + "/" for d in PACKAGE_DIRS)) and n > MAX_LINES:
            problems.append(f"{n} lines, over {MAX_LINES}")
        if problems:
            found[path] = problems
    return found


def by_folder(found: dict[str, list[str]]) -> str:
    folders = defaultdict(list)
    for path, problems in sorted(found.items()):
        folders[os.path.dirname(path) or "."].append(f"  {os.path.basename(path)}: {'; '.join(problems)}")
    return "\n".join(f"{folder}/\n" + "\n".join(rows) for folder, rows in folders.items())


def test_lines_fit_the_formatter_width_and_package_modules_stay_short() -> None:
    found = offenders()
    assert not found, "files that break the layout rules, by folder:\n" + by_folder(found)


def test_the_rules_see_long_code_lines_and_exempt_only_table_rows() -> None:
    row = "| " + " | ".join(["cell"] * 40) + " |"
    code = "x = " + " + ".join(["1"] * 60)
    prose = "word " * 40
    source = f'"""Doc.\n\n{row}\n{prose}\n"""\n# {row}\n{code}\ny = "{row}"\n'
    assert long_lines(source, 120) == [4, 7, 8]
    assert is_table_row("    # | a | b |") and not is_table_row("    | b")
