"""``ServerArgs.add_cli_args`` / ``ServerArgs.from_cli_args``: PILLAR's knobs and the request caps as
launch flags.

``python -m sglang.launch_server --help`` lists ``--pillar-<knob>`` for every knob of
``sglang_sparsespec.config.KNOBS`` and every cap of ``sglang_sparsespec.limits.LIMIT_KNOBS`` (which
serve stock decoding too), with the knob's own description (``Knob.help``). A flag that was given
wins over the ``SPARSESPEC_<KNOB>`` variable: the launcher writes it into its own environment before
ServerArgs validates (so a bad value fails there, in one line), and every scheduler process it
spawns inherits that environment and resolves the same PillarConfig. ServerArgs itself gets no new
field, so the argument set SGLang pickles to its processes is unchanged.
"""

from __future__ import annotations

import argparse
import os

from sglang_sparsespec.config import KNOBS, Knob
from sglang_sparsespec.limits import LIMIT_KNOBS


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
                type=str,
                default=None,
                choices=knob.choices,
                # argparse %-formats help texts.
                help=f"{knob.help} (default {knob.default}; fallback: the {knob.env} variable)".replace("%", "%%"),
            )
    return result


def export_pillar_flags(original, *args, **kwargs):
    namespace = next(a for a in (*args, *kwargs.values()) if isinstance(a, argparse.Namespace))
    for knob in (*KNOBS, *LIMIT_KNOBS):
        value = getattr(namespace, _dest(knob.flag), None)
        if value is not None:
            os.environ[knob.env] = value
    return original(*args, **kwargs)
