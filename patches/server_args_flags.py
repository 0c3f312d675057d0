"""``ServerArgs.add_cli_args`` / ``ServerArgs.from_cli_args``: PILLAR's knobs and the request caps as
launch flags.

``python -m sglang.launch_server --help`` lists ``--pillar-<knob>`` for every knob of
``sglang_sparsespec.config.KNOBS`` and every cap of ``sglang_sparsespec.limits.LIMIT_KNOBS`` (which
serve stock decoding too), with the knob's own description (``Knob.help``). A flag that was given
wins over the ``SPARSESPEC_<KNOB>`` variable: the launcher writes it into its own environment before
ServerArgs validates (so a bad value fails there, in one line), and every scheduler process it
spawns inherits that environment and resolves the same PillarConfig. ServerArgs itself gets no new
field, so the argument set SGLang pickles to its processes is unchanged. An enumerated knob's flag takes its choice
in any case, as its variable does. A PILLAR knob's flag given to a server of another algorithm, or any flag given an
empty value, fails at launch: either would otherwise leave the server on defaults without a word (a stray
``SPARSESPEC_<KNOB>`` variable in the environment is not an error: only a PILLAR server reads it).
"""

from __future__ import annotations

import argparse
import os
import re

from sglang_sparsespec.config import ALGORITHM_NAME, ENV_PREFIX, KNOBS, Knob, knob_named
from sglang_sparsespec.limits import LIMIT_KNOBS

# Knobs that serve stock decoding too: the offload pool and the request caps.
ANY_ALGORITHM = (knob_named("OFFLOAD_HOST_GB"), *LIMIT_KNOBS)


def _dest(flag: str) -> str:
    return flag.removeprefix("--").replace("-", "_")


def add_pillar_flags(result, parser: argparse.ArgumentParser, *args, **kwargs):
    groups: tuple[tuple[str, tuple[Knob, ...]], ...] = (
        ("PILLAR speculative decoding (sglang-sparsespec)", KNOBS),
        ("Request caps, any algorithm (sglang-sparsespec)", LIMIT_KNOBS),
    )
    for title, knobs in groups:
        group = parser.add_argument_group(title)
        for knob in knobs:
            group.add_argument(
                knob.flag,
                dest=_dest(knob.flag),
                type=str.lower if knob.choices is not None else str,
                default=None,
                choices=knob.choices,
                # argparse %-formats help texts.
                help=f"{knob.help} (default {knob.default}; fallback: the {knob.env} variable)".replace("%", "%%"),
            )
    return result


def export_pillar_flags(original, *args, **kwargs):
    namespace = next(a for a in (*args, *kwargs.values()) if isinstance(a, argparse.Namespace))
    algorithm = (getattr(namespace, "speculative_algorithm", None) or "").upper()
    for knob in (*KNOBS, *LIMIT_KNOBS):
        value = getattr(namespace, _dest(knob.flag), None)
        if value is None:
            continue
        if not value.strip():
            raise ValueError(f"{knob.flag} was given an empty value; give one (default {knob.default}) or drop it")
        if algorithm != ALGORITHM_NAME and knob not in ANY_ALGORITHM:
            raise ValueError(
                f"{knob.flag} configures --speculative-algorithm {ALGORITHM_NAME}, which this server does not run "
                f"(--speculative-algorithm {algorithm or 'none'}); add it or drop the flag"
            )
        os.environ[knob.env] = value
    return original(*args, **kwargs)


def with_flags(message: str) -> str:
    """``message`` with each knob's variable named beside its launch flag (``--pillar-x / SPARSESPEC_X``): the
    knobs' own checks name the variable, which a user who gave the flag never typed."""
    flags = {knob.env: knob.flag for knob in (*KNOBS, *LIMIT_KNOBS)}
    return re.sub(rf"\b{ENV_PREFIX}[A-Z_]+\b", lambda m: f"{flags[m[0]]} / {m[0]}" if m[0] in flags else m[0], message)
