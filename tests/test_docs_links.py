"""Every relative link in the project's Markdown files names a file that exists, and every #anchor a heading
of the file it points to (GitHub's heading ids), so moving or renaming a page or a heading cannot leave a
dead link behind."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Inline links and images: [text](target) or [text](target "title"); a target in <...> may hold spaces.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.S)
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def markdown_files() -> list[Path]:
    """The repository's .md files, outside hidden folders (.git, .venv) and installed packages."""
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and d not in ("node_modules", "site-packages")]
        found += [Path(root) / f for f in files if f.endswith(".md")]
    return sorted(found)


def prose(text: str) -> str:
    """``text`` without fenced code blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's id of a heading: its rendered text lower-cased, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading renders as its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The ids of ``path``'s headings; a repeated heading gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    ids = set()
    for heading in HEADING.findall(FENCE.sub("", path.read_text(encoding="utf-8"))):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        ids.add(base if n == 0 else f"{base}-{n}")
    return ids


def broken_links(path: Path) -> list[str]:
    def shown(dest: Path) -> Path:
        return dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest.relative_to(path.parent)

    broken = []
    for raw in LINK.findall(prose(path.read_text(encoding="utf-8"))):
        target = raw.strip("<>")
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I) or target.startswith("//"):
            continue  # http:, https:, mailto: and the like: not a file of this repository
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            broken.append(f"{target}: no file {shown(dest)}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {shown(dest)}")
    return broken


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_resolve(path: Path) -> None:
    assert broken_links(path) == []


def test_the_checker_finds_dead_links(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## A heading (with, punctuation)\n")
    page.write_text(
        "# Page\n[ok](other.md) [ok](other.md#a-heading-with-punctuation) [ok](#page) [web](https://x.y/z.md)\n"
        "`[code](missing.md)`\n```\n[fenced](missing.md)\n```\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [self](#nowhere)\n"
    )
    assert broken_links(page) == [
        "missing.md: no file missing.md",
        "other.md#nope: no heading #nope in other.md",
        "#nowhere: no heading #nowhere in page.md",
    ]
