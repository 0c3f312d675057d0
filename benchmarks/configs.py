"""Named server configurations compared by the benchmarks.

Every configuration shares ``COMMON_FLAGS`` so that only the decoding method (and, for
``stock-flashinfer``, the attention backend) differs between rows of a results table.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

# --disable-radix-cache: the AIME workload repeats prompts once N exceeds the 70 problems,
# and prefix hits would then depend on run order and on how many requests each config
# managed to finish; without the cache every config does the same prefill work, and the
# decode-dominated numbers (200 prompt tokens vs thousands of output tokens) lose nothing.
# --cuda-graph-max-bs-decode is the 0.5.17 name (--cuda-graph-max-bs is a deprecated alias).
COMMON_FLAGS: tuple[str, ...] = (
    "--page-size", "1",
    "--mem-fraction-static", "0.85",
    "--context-length", "8192",
    "--max-running-requests", "256",
    "--cuda-graph-max-bs-decode", "256",
    "--disable-radix-cache",
)  # fmt: skip

DEFAULT_PILLAR_STEPS = 8
NGRAM_DRAFT_TOKENS = 8

_PILLAR_NAME = re.compile(r"pillar(?:-k(\d+))?(?:-(coarse|streaming|oracle))?")
KNOWN_CONFIGS = ("stock", "stock-flashinfer", "ngram", "pillar", "pillar-k<N>", "pillar[-k<N>]-{coarse,streaming,oracle}")


@dataclass(frozen=True)
class ServerConfig:
    """One named server setup: ``flags`` are the launch_server flags after --model-path/--host/--port,
    ``env`` the server environment it needs on top of the caller's (PILLAR's own knobs)."""

    name: str
    flags: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()

    def environment(self, base: dict[str, str]) -> dict[str, str]:
        """The server's environment: ``base`` (the caller's ``--env``) plus what this config needs."""
        return {**base, **dict(self.env)}

    @property
    def speculative(self) -> bool:
        return "--speculative-algorithm" in self.flags


def resolve_config(name: str, extra_flags: tuple[str, ...] = ()) -> ServerConfig:
    """Flags of a named config; ``pillar-k4`` means PILLAR with 4 draft steps (``pillar`` = 8);
    a ``-coarse`` / ``-streaming`` / ``-oracle`` suffix selects that draft policy
    (SPARSESPEC_POLICY) instead of per-layer, per-KV-head PillarAttn."""
    env: tuple[tuple[str, str], ...] = ()
    if name == "stock":
        method: tuple[str, ...] = ("--attention-backend", "triton")
    elif name == "stock-flashinfer":
        method = ("--attention-backend", "flashinfer")
    elif name == "ngram":
        method = (
            "--attention-backend", "triton",
            "--speculative-algorithm", "NGRAM",
            "--speculative-num-draft-tokens", str(NGRAM_DRAFT_TOKENS),
        )  # fmt: skip
    elif m := _PILLAR_NAME.fullmatch(name):
        steps = int(m.group(1)) if m.group(1) else DEFAULT_PILLAR_STEPS
        if steps < 1:
            raise ValueError(f"config {name!r}: PILLAR needs at least 1 draft step")
        method = (
            "--attention-backend", "triton",
            "--speculative-algorithm", "PILLAR",
            "--speculative-num-steps", str(steps),
        )  # fmt: skip
        if m.group(2):
            env = (("SPARSESPEC_POLICY", m.group(2)),)
    else:
        raise ValueError(f"unknown config {name!r}; choose from {', '.join(KNOWN_CONFIGS)}")
    return ServerConfig(name=name, flags=method + COMMON_FLAGS + tuple(extra_flags), env=env)


def parse_env(items: Sequence[str]) -> dict[str, str]:
    """``["KEY=VAL", ...]`` -> dict; PILLAR's own knobs (SPARSESPEC_*) reach the server this way."""
    env = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--env expects KEY=VAL, got {item!r}")
        env[key] = val
    return env
