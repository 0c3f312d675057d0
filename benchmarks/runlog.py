"""Progress log and wall-clock budget shared by the benchmark entry points."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class RunLog:
    """Prints time-stamped progress lines and appends them (and longer blocks) to one log file.

    One log file per invocation because only a handful of files come back from the GPU node.
    """

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.t0 = time.monotonic()
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def line(self, msg: str) -> None:
        text = f"[{time.monotonic() - self.t0:7.1f}s] {msg}"
        print(text, flush=True)
        self._append(text + "\n")

    def block(self, title: str, body: str) -> None:
        """A multi-line block (log tails) that goes to the file only, to keep stdout short."""
        self._append(f"----- {title} -----\n{body.rstrip()}\n----- end {title} -----\n")

    def _append(self, text: str) -> None:
        if self.path is not None:
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(text)


class Deadline:
    """A wall-clock budget counted from construction; ``budget_s`` must be > 0."""

    def __init__(self, budget_s: float) -> None:
        if budget_s <= 0:
            raise ValueError(f"time budget must be > 0 s, got {budget_s}")
        self.budget_s = budget_s
        self.end = time.monotonic() + budget_s

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def allows(self, need_s: float) -> bool:
        return self.remaining() >= need_s


def write_json(path: Path, doc: Any) -> None:
    """Atomic write, so a job killed mid-write still leaves the previous complete version."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)
