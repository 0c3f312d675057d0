"""Every ``python -m`` command of this checkout's own modules that the Markdown files, the scripts and the module
docstrings give a user (``python -m benchmarks.sweep``, ``python -m tools.kernels_bench``, ...) names a module that
exists and runs as a command, so moving or renaming a module cannot leave a dead command behind. Shell comments
(a command kept for the record, from an older checkout) are not commands."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # benchmarks/ and tools/ are folders of the checkout, not installed packages
OWN = ("benchmarks", "tools", "sglang_sparsespec")
COMMAND = re.compile(r"python3? -m ((?:" + "|".join(OWN) + r")(?:\.\w+)*)")
RAW_RESULTS = REPO / "benchmarks" / "results"  # measurement logs, as they were written


def sources() -> list[Path]:
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [
            d for d in dirs if not d.startswith(".") and d not in ("node_modules", "site-packages", "__pycache__")
        ]
        if Path(root).is_relative_to(RAW_RESULTS):
            continue
        found += [Path(root) / f for f in files if f.endswith((".md", ".py", ".sh"))]
    return sorted(p for p in found if p != Path(__file__).resolve())  # this file's examples are no commands


def commands(text: str) -> list[str]:
    """The modules of the commands in ``text`` outside shell comments; ``python -m benchmarks.<name>`` (a
    placeholder after the dot) names the package."""
    found = []
    for line in text.splitlines():
        if line.lstrip().startswith("#") and not line.lstrip().startswith("#!"):
            continue
        found += [m.group(1) for m in COMMAND.finditer(line)]
    return found


def runs_as_command(module: str) -> bool:
    """``python -m module`` runs something: a package with ``__main__``, a module with a main guard, or a
    package named in a placeholder command (``benchmarks.<name>``)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        return False
    if spec.submodule_search_locations is not None:  # a package: its __main__, or the folder of a placeholder
        return True
    return '__name__ == "__main__"' in Path(spec.origin).read_text(encoding="utf-8")


def test_the_scanner_reads_commands_and_skips_comments() -> None:
    text = (
        "run `python -m benchmarks.sweep --data-dir D` or python3 -m tools.<name>\n"
        "# python3 -m benchmarks.gone (kept for the record)\n    python -m sglang.launch_server\n"
    )
    assert commands(text) == ["benchmarks.sweep", "tools"]
    assert runs_as_command("benchmarks.sweep") and runs_as_command("benchmarks.report")
    assert not runs_as_command("benchmarks.gone") and not runs_as_command("benchmarks.configs")


def test_every_command_names_a_module_that_runs() -> None:
    found = {(path, m) for path in sources() for m in commands(path.read_text(encoding="utf-8"))}
    assert len({m for _, m in found}) > 20  # the docs' commands were read
    assert [f"{path.relative_to(REPO)}: {m}" for path, m in sorted(found) if not runs_as_command(m)] == []
