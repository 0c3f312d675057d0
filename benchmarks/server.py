"""Lifecycle of one SGLang server subprocess: start, wait until it generates, watch, stop.

The server runs in its own session (process group) so that stopping it reaches the
scheduler and detokenizer children too, and it gets SIGKILL if this harness dies without
running its cleanup (PR_SET_PDEATHSIG; SGLang's children do the same towards the
launcher). A GPU left occupied by an orphaned server would poison every later run on the
node, so every exit path ends in ``stop()``: the context manager, an atexit hook, and
SIGTERM/SIGHUP turned into SystemExit by ``install_signal_handlers``.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.runlog import Deadline, RunLog

DEFAULT_HEALTH_PATH = "/health_generate"  # 200 only once a 1-token generation went through
STOP_RESERVE_S = 25.0  # budget every entry point keeps back so a server can still be stopped and its JSON written
MIN_START_S = 60.0  # no server start took less (60-225 s on the H100): none is launched with less budget left
_LIVE: set[Server] = set()


class ServerError(RuntimeError):
    """The server failed to start, died, or did not become healthy in time; the message ends with its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def launch_command(model: str, flags: Sequence[str], host: str, port: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        model,
        "--host",
        host,
        "--port",
        str(port),
        *flags,
    ]


def log_tail(path: Path, max_lines: int = 60, max_bytes: int = 64_000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            data = f.read().decode("utf-8", errors="replace")
    except OSError as e:
        return f"(no log: {e})"
    return "\n".join(data.splitlines()[-max_lines:])


def http_json(url: str, body: Any | None = None, timeout: float = 30.0) -> Any:
    """GET (body None) or POST JSON; returns the decoded reply. Raises urllib/OSError/ValueError."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read() or b"null")


def scheduler_state(info: dict[str, Any]) -> dict[str, Any]:
    """The first scheduler's ``internal_states`` entry of a /server_info reply (PILLAR's ``pillar``,
    the offloader's ``offload``, ...); {} when the reply has none."""
    states = info.get("internal_states") or [{}]
    return states[0] if isinstance(states[0], dict) else {}


def _die_with_parent() -> None:
    if sys.platform == "linux":
        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _group_members(pgid: int) -> list[int]:
    """PIDs of live (non-zombie) processes in process group ``pgid``.

    Reads /proc rather than probing with killpg(pgid, 0) because zombies count for
    killpg, and a container's PID 1 may never reap them.
    """
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
            return [pgid]
        except ProcessLookupError:
            return []
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # Fields after the parenthesised command name: state ppid pgrp ...
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry))
    return members


def _signal_group(leader: subprocess.Popen[bytes], sig: signal.Signals, wait_s: float) -> bool:
    """Send ``sig`` to the leader's process group; True once leader and group are gone (within ``wait_s``)."""
    pgid = leader.pid  # a session leader's pid is its group id
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    end = time.monotonic() + wait_s
    while True:
        if leader.poll() is not None and not _group_members(pgid):
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.2)


class Server:
    """One server process group. ``argv`` must make the server listen on ``host:port``.

    Use as a context manager around ``start``: ``with Server(...) as s: s.start(600); ...``.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        port: int,
        log_path: Path,
        host: str = "127.0.0.1",
        env: Mapping[str, str] | None = None,
        health_path: str = DEFAULT_HEALTH_PATH,
    ) -> None:
        self.argv = list(argv)
        self.host, self.port = host, port
        self.log_path = log_path
        self.env = dict(env or {})
        self.health_path = health_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.startup_s: float | None = None

    @classmethod
    def sglang(
        cls, model: str, flags: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None
    ) -> Server:
        """An (unstarted) ``python -m sglang.launch_server`` on a free loopback port."""
        host = "127.0.0.1"
        port = free_port(host)
        return cls(launch_command(model, flags, host, port), port=port, host=host, log_path=log_path, env=env)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout_s: float, poll_s: float = 1.0) -> float:
        """Launch and block until the health endpoint answers 200; returns the startup seconds.

        Raises ServerError (after stopping the group) if the process exits first or
        ``timeout_s`` passes.
        """
        if self.proc is not None:
            raise RuntimeError("server already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **self.env},
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        _LIVE.add(self)
        try:
            while True:
                self.check_alive()
                if self._healthy():
                    self.startup_s = time.monotonic() - t0
                    return self.startup_s
                if time.monotonic() - t0 > timeout_s:
                    raise ServerError(f"server not healthy after {timeout_s:.0f} s\n{log_tail(self.log_path)}")
                time.sleep(poll_s)
        except BaseException:
            self.stop()
            raise

    def check_alive(self, grace_s: float = 0.0) -> None:
        """Raise ServerError with the log tail if the server process has exited (waiting up to ``grace_s``).

        A grace period lets a caller whose request just failed tell a crashed server
        (the informative error) from a merely refused request.
        """
        if self.proc is None:
            raise ServerError("server was never started")
        if grace_s > 0:
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        code = self.proc.poll()
        if code is not None:
            raise ServerError(f"server exited with code {code}\n{log_tail(self.log_path)}")

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base_url + self.health_path, timeout=10) as r:
                return r.status == 200
        except (OSError, ValueError):  # refused / 503 (HTTPError is an OSError) / timeout
            return False

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM the group, SIGKILL what is left after ``grace_s``, wait until it is gone. Idempotent.

        The server stays registered until the group is gone, so a stop interrupted by a
        second signal is finished by the atexit hook.
        """
        proc = self.proc
        if proc is None:
            return
        for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            if _signal_group(proc, sig, wait_s):
                break
        self.proc = None
        _LIVE.discard(self)


def stop_all() -> None:
    for server in list(_LIVE):
        server.stop()


def install_signal_handlers() -> None:
    """Turn SIGTERM/SIGHUP into SystemExit so ``finally``/``with`` blocks stop the servers."""

    def _exit(signum: int, _frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, _exit)
    signal.signal(signal.SIGHUP, _exit)


atexit.register(stop_all)


def begin(time_budget_s: float, log_path: Path) -> tuple[Deadline, RunLog]:
    """The start of an entry point that runs servers: SIGTERM/SIGHUP stop them, its budget clock, its log."""
    install_signal_handlers()
    return Deadline(time_budget_s), RunLog(log_path)


def start_recorded(server: Server, name: str, record: dict[str, Any], timeout_s: float, log: RunLog) -> bool:
    """Start ``server`` and record the outcome in ``record``: ``startup_s`` and status ok, or status
    failed with the error, a log line and the server log's tail. Returns whether it is up."""
    try:
        record["startup_s"] = server.start(timeout_s=timeout_s)
    except ServerError as e:
        record.update(status="failed", error=str(e))
        log.line(f"{name}: server failed to start: {str(e).splitlines()[0]}")
        log.block(f"{name} server log tail", log_tail(server.log_path, 200))
        return False
    record["status"] = "ok"
    return True


_DECODE_LINE = re.compile(r"Decode batch, #running-req: (\d+), #token: (\d+), .*gen throughput \(token/s\): ([\d.]+)")


def decode_intervals(log_text: str) -> list[tuple[int, int, float]]:
    """Stock SGLang's decode steps from its own log lines (every 40 decode steps: running requests, their
    tokens, output tok/s over the interval): (running requests, tokens, ms per step = running / tok/s) per
    interval. Only intervals that followed another decode interval count (one with a prefill or an idle
    stretch in it is not a decode step's time)."""
    out: list[tuple[int, int, float]] = []
    previous_was_decode = False
    for line in log_text.splitlines():
        m = _DECODE_LINE.search(line)
        if m is None:
            previous_was_decode = previous_was_decode and "Prefill batch" not in line
            continue
        running, tokens, tok_s = int(m.group(1)), int(m.group(2)), float(m.group(3))
        if previous_was_decode and running > 0 and tok_s > 0:
            out.append((running, tokens, 1000.0 * running / tok_s))
        previous_was_decode = True
    return out
