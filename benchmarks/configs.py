"""Named server configurations compared by the benchmarks.

Every configuration shares ``COMMON_FLAGS`` so that only the decoding method (and, for the
``-flashinfer`` configs, the attention backend) differs between rows of a results table.
A PILLAR config name may carry knob suffixes, ``pillar-streaming:verify_kernel=sglang:recent_window=16``:
each ``:knob=value`` sets ``SPARSESPEC_<KNOB>=value`` for that server only.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from sglang_sparsespec.config import ENV_PREFIX, KNOBS, PillarConfig

# SPARSESPEC_* variables of the test runner (examples/run_tests.sh: the venv, the SGLang release, the random
# order's seed) and of the harness's own provenance (the commit a result is stamped with): no server reads them.
RUNNER_ENV = frozenset(f"{ENV_PREFIX}{name}" for name in ("VENV", "SGLANG", "TEST_SEED", "GIT_COMMIT"))

# --disable-radix-cache: the AIME workload repeats prompts once N exceeds the 70 problems,
# and prefix hits would then depend on run order and on how many requests each config
# managed to finish; without the cache every config does the same prefill work, and the
# decode-dominated numbers (200 prompt tokens vs thousands of output tokens) lose nothing.
# --cuda-graph-max-bs-decode is the 0.5.17 name (--cuda-graph-max-bs is a deprecated alias).
# --stream-interval 8: SmolLM2-135M decodes faster than SGLang's Python streaming path delivers
# one event per token; at stream interval 1 stock delivered a flat ~13-14K tok/s from 32 to 256
# concurrent requests while the scheduler logged 45-64K tok/s at 256
# (results/throughput/throughput_h100-e2aee79-2k.log), i.e. the HTTP path, not decoding, was measured.
# TPOT and TTFT (the first token still streams at once) are unaffected; ITL becomes per chunk.
COMMON_FLAGS: tuple[str, ...] = (
    "--page-size",
    "1",
    "--mem-fraction-static",
    "0.85",
    "--context-length",
    "8192",
    "--max-running-requests",
    "256",
    "--cuda-graph-max-bs-decode",
    "256",
    "--disable-radix-cache",
    "--stream-interval",
    "8",
)

DEFAULT_PILLAR_STEPS = 8
NGRAM_DRAFT_TOKENS = 8

_FIXED: dict[str, tuple[str, ...]] = {
    "stock": ("--attention-backend", "triton"),
    "stock-flashinfer": ("--attention-backend", "flashinfer"),
    "ngram": (
        "--attention-backend",
        "triton",
        "--speculative-algorithm",
        "NGRAM",
        "--speculative-num-draft-tokens",
        str(NGRAM_DRAFT_TOKENS),
    ),
}
_PILLAR_NAME = re.compile(r"pillar(?:-k(\d+))?(?:-(coarse|streaming|oracle))?(-flashinfer)?")
_KNOB = re.compile(r"([a-z_]+)=(.+)")
KNOWN_CONFIGS = (
    *_FIXED,
    "pillar",
    "pillar-k<N>",
    "pillar[-k<N>]-{coarse,streaming,oracle}",
    "<any pillar config>-flashinfer",
    "<pillar config>:<knob>=<value>[:...]",
)
CONFIGS_HELP = f"comma-separated config names: {', '.join(KNOWN_CONFIGS)} (knobs: see benchmarks/README.md)"


PILLAR_KNOBS = tuple(knob.name for knob in KNOBS)


@dataclass(frozen=True)
class ServerConfig:
    """One named server setup: ``flags`` are the launch_server flags after --model-path/--host/--port,
    ``env`` the server environment it needs on top of the caller's (PILLAR's own knobs)."""

    name: str
    flags: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        """The server's environment: the caller's SPARSESPEC_* variables, ``base`` (its ``--env``) and what
        this config needs, later ones winning. A PILLAR server starts without the costs an earlier server of
        its setup measured (SPARSESPEC_COST_CACHE=off, unless a config or ``--env`` says otherwise), so every
        run is measured from the same cold start."""
        cold = {"SPARSESPEC_COST_CACHE": "off"} if "PILLAR" in self.flags else {}
        # The caller's own SPARSESPEC_* variables reach the server too (it inherits the environment): they
        # belong in the record, below what this invocation sets; the test runner's and the harness's own
        # (RUNNER_ENV) configure no server.
        inherited = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX) and k not in RUNNER_ENV}
        return {**inherited, **cold, **base, **dict(self.env)}

    @property
    def speculative(self) -> bool:
        return "--speculative-algorithm" in self.flags

    def pillar_config(self, base: dict[str, str]) -> dict[str, Any] | None:
        """The knobs a PILLAR server resolves from ``environment(base)``, defaults included (None for other
        servers). Recorded with every result: defaults change between commits, so the environment alone
        does not say what ran."""
        if "PILLAR" not in self.flags:
            return None
        steps = int(self.flags[self.flags.index("--speculative-num-steps") + 1])
        return asdict(PillarConfig.from_env(steps, self.environment(base)))


def resolve_config(name: str, extra_flags: tuple[str, ...] = ()) -> ServerConfig:
    """Flags of a named config; ``pillar-k4`` means PILLAR with 4 draft steps (``pillar`` = 8);
    a ``-coarse`` / ``-streaming`` / ``-oracle`` suffix selects that draft policy
    (SPARSESPEC_POLICY) instead of per-layer, per-KV-head PillarAttn; a final ``-flashinfer``
    prefills through FlashInfer (PILLAR still drafts and verifies through its Triton kernels);
    ``:knob=value`` suffixes set other PILLAR knobs. The name keeps its suffixes, so results tell
    the variants apart."""
    base, *knobs = name.split(":")
    if m := _PILLAR_NAME.fullmatch(base):
        method, env = _pillar(name, m, knobs)
    elif base in _FIXED and not knobs:
        method, env = _FIXED[base], {}
    elif base in _FIXED:
        raise ValueError(f"config {name!r}: :knob=value suffixes are PILLAR knobs; {base!r} takes none")
    else:
        raise ValueError(f"unknown config {name!r}; choose from {', '.join(KNOWN_CONFIGS)}")
    return ServerConfig(name=name, flags=method + COMMON_FLAGS + tuple(extra_flags), env=tuple(env.items()))


def with_radix_cache(config: ServerConfig) -> ServerConfig:
    """``config`` with SGLang's radix (prefix) cache back on: COMMON_FLAGS turn it off for the throughput
    tables, but a workload whose requests share a prefix is what the cache is for (lossless --radix-cache)."""
    return replace(config, flags=tuple(f for f in config.flags if f != "--disable-radix-cache"))


def flag_value(flags: Sequence[str], flag: str) -> str | None:
    """The value of the last ``flag`` in ``flags`` (SGLang's parser keeps the last), None if absent."""
    values = [flags[i + 1] for i, f in enumerate(flags[:-1]) if f == flag]
    return values[-1] if values else None


def stream_interval(flags: Sequence[str]) -> int:
    """The server's --stream-interval (SGLang's default is 1)."""
    value = flag_value(flags, "--stream-interval")
    return 1 if value is None else int(value)


def _pillar(name: str, m: re.Match[str], knobs: Sequence[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """Flags and environment of a PILLAR config; the knobs are checked by PillarConfig itself, so a bad
    value fails here (at argument parsing) and not on the GPU node."""
    steps = int(m.group(1)) if m.group(1) else DEFAULT_PILLAR_STEPS
    if steps < 1:
        raise ValueError(f"config {name!r}: PILLAR needs at least 1 draft step")
    method = (
        "--attention-backend",
        "flashinfer" if m.group(3) else "triton",
        "--speculative-algorithm",
        "PILLAR",
        "--speculative-num-steps",
        str(steps),
    )
    env = {f"{ENV_PREFIX}POLICY": m.group(2)} if m.group(2) else {}
    for knob in knobs:
        key, value = _knob(name, knob)
        if key in env and m.group(2) and key == f"{ENV_PREFIX}POLICY":
            raise ValueError(f"config {name!r}: the -{m.group(2)} suffix already sets the policy; drop {knob!r}")
        if key in env:
            raise ValueError(f"config {name!r}: {knob.split('=')[0]} given twice")
        env[key] = value
    try:
        PillarConfig.from_env(steps, env)
    except ValueError as e:
        raise ValueError(f"config {name!r}: {e}") from None
    return method, env


def _knob(name: str, knob: str) -> tuple[str, str]:
    """``recent_window=16`` -> (SPARSESPEC_RECENT_WINDOW, 16), for the knobs PillarConfig reads."""
    m = _KNOB.fullmatch(knob)
    if not m:
        raise ValueError(f"config {name!r}: suffix {knob!r} is not <knob>=<value> (lower-case knob, non-empty value)")
    if m.group(1).upper() not in PILLAR_KNOBS:
        known = ", ".join(k.lower() for k in PILLAR_KNOBS)
        raise ValueError(f"config {name!r}: unknown PILLAR knob {m.group(1)!r}; choose from {known}")
    return ENV_PREFIX + m.group(1).upper(), m.group(2)


def file_stem(name: str) -> str:
    """``name`` as part of a file name: files come back from the GPU node only when named in letters,
    digits, '.', '_' and '-' (``pillar:verify_kernel=sglang`` -> ``pillar.verify_kernel-sglang``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", name.replace(":", ".").replace("=", "-"))


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """``["KEY=VAL", ...]`` -> dict; PILLAR's own knobs (SPARSESPEC_*) reach the server this way."""
    env = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env expects KEY=VAL, got {item!r}")
        env[key] = val
    return env


def add_server_options(p: argparse.ArgumentParser, time_budget_s: float = 560.0) -> None:
    """The options of every entry point that starts servers (each keeps its own budget default)."""
    p.add_argument(
        "--extra-server-args", default="", help='flags for every server; use the = form: --extra-server-args="--x 1"'
    )
    p.add_argument("--env", action="append", default=[], metavar="KEY=VAL", help="server environment (repeatable)")
    p.add_argument("--startup-timeout", type=float, default=400.0)
    p.add_argument("--time-budget", type=float, default=time_budget_s, help="seconds for the whole invocation")
