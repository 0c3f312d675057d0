"""A long-lived bench_serving client: imports SGLang's bench module once, then runs one benchmark per request.

Importing ``sglang.benchmark.serving`` takes 26 s on the H100 node (measured 2026-11-23: it pulls in torch
and SGLang's server stack), and a fresh ``python -m sglang.benchmark.serving`` per run paid it every run:
6 runs per server, 108 in the full sweep. The parent starts the driver while a server boots, so even the
one import is hidden. Each run still goes through bench_serving's own ``cli_main`` with its own argv, so
its output file and metrics are those of the command line.

Protocol, one JSON object per line: driver -> parent ``{"ready": import seconds}`` once; then per run
parent -> driver ``{"argv": [...], "log": path}`` and driver -> parent ``{"code": exit code, "seconds": s}``.
A run's stdout and stderr go to its log file, the driver's own to the stderr it was given; the protocol
pipe is a private copy of fd 1, so nothing a run prints can break it.

The parent side (``BenchDriver``) kills the driver's process group when a run outlives its time or the
server dies, and starts a new driver for the next run. This file imports only the standard library: it
runs as a script (``python bench_driver.py --module M``) and needs no package on the path.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import select
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

BENCH_MODULE = "sglang.benchmark.serving"  # what `python -m sglang.bench_serving` forwards to in 0.5.17
POLL_S = 2.0  # how often the parent checks the server and the clock while it waits for a reply


# --------------------------------------------------------------------------- driver (child) side


def run_one(cli_main: Callable[[], Any], prog: str, argv: Sequence[str], log_path: Path) -> int:
    """Run ``cli_main`` with ``sys.argv = [prog, *argv]``, its fds 1 and 2 sent to ``log_path``; its exit code."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            sys.argv = [prog, *argv]
            cli_main()
            code = 0
        except SystemExit as e:  # argparse errors and bench_serving's own sys.exit calls
            if e.code is not None and not isinstance(e.code, int):
                print(e.code, file=sys.stderr)
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except Exception:
            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)
    return code


def serve(module_name: str, requests: IO[str], replies: IO[str]) -> int:
    """Import ``module_name`` (it must define ``cli_main()``), announce it, and answer run requests until EOF."""
    t0 = time.monotonic()
    module = importlib.import_module(module_name)
    send(replies, {"ready": round(time.monotonic() - t0, 3)})
    for line in requests:
        if not line.strip():
            continue
        req = json.loads(line)
        t1 = time.monotonic()
        code = run_one(module.cli_main, module_name, req["argv"], Path(req["log"]))
        send(replies, {"code": code, "seconds": round(time.monotonic() - t1, 3)})
    return 0


def send(stream: IO[str], msg: dict[str, Any]) -> None:
    stream.write(json.dumps(msg) + "\n")
    stream.flush()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="bench_serving driver (started by BenchDriver; not for direct use)")
    p.add_argument("--module", default=BENCH_MODULE, help="module with cli_main() reading sys.argv")
    args = p.parse_args(argv)
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # stray prints between runs go to the driver's log, never into the protocol pipe
    return serve(args.module, sys.stdin, replies)


# --------------------------------------------------------------------------- parent side


class DriverError(RuntimeError):
    """The driver exited or answered out of protocol."""


class BenchDriver:
    """Parent-side handle of one driver process; ``start`` early (it imports while a server boots), then ``run``.

    ``check`` is called every ``POLL_S`` while a reply is awaited (e.g. the server's liveness check); an
    exception it raises, a timeout or a dead driver kill the driver's process group and propagate, and the
    next ``run`` starts a fresh driver. ``import_s``: the last driver's import time, once it is ready.
    """

    def __init__(self, log_path: Path, module: str | None = None) -> None:
        self.log_path = log_path
        self.module = module or BENCH_MODULE  # read at construction, so tests can point it at a fake
        self.proc: subprocess.Popen[bytes] | None = None
        self.import_s: float | None = None
        self._buf = b""

    def start(self) -> None:
        if self.proc is not None:
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).resolve()), "--module", self.module],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self.import_s = None
        self._buf = b""

    def run(self, argv: Sequence[str], log_path: Path, timeout_s: float, check: Callable[[], None]) -> int:
        """One benchmark with ``argv`` (no program name); its exit code. Raises TimeoutError, DriverError or
        whatever ``check`` raises, after killing the driver."""
        end = time.monotonic() + timeout_s
        self.start()
        try:
            if self.import_s is None:
                self.import_s = float(self._reply(end, check, "ready"))
            assert self.proc is not None and self.proc.stdin is not None
            try:
                self.proc.stdin.write((json.dumps({"argv": list(argv), "log": str(log_path)}) + "\n").encode())
                self.proc.stdin.flush()
            except BrokenPipeError:
                raise DriverError(f"bench_serving driver exited (log: {self.log_path})") from None
            return int(self._reply(end, check, "code"))
        except BaseException:
            self.close()
            raise

    def _reply(self, end: float, check: Callable[[], None], key: str) -> Any:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"bench_serving driver gave no {key!r} reply in time")
            ready, _, _ = select.select([fd], [], [], min(POLL_S, left))
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    code = self.proc.wait()
                    raise DriverError(f"bench_serving driver exited with code {code} (log: {self.log_path})")
                self._buf += chunk
            else:
                check()
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            msg = json.loads(line)
            return msg[key]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise DriverError(f"bench_serving driver sent {line[:200]!r}, expected {key!r}") from None

    def close(self) -> None:
        """Kill the driver's process group (a run in flight dies with it)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self.proc = None

    def __enter__(self) -> BenchDriver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


if __name__ == "__main__":
    sys.exit(main())
