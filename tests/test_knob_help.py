"""Every PILLAR knob carries its own one-line description, and the launch flags' --help prints it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from sglang_sparsespec.config import KNOBS, PillarConfig
from sglang_sparsespec.limits import LIMIT_KNOBS, RequestLimits

from patches.server_args_flags import add_pillar_flags

# What a number-valued knob is counted in; its description must name one of them.
UNITS = re.compile(r"\b(fraction|tokens|rounds|verify passes|quantile|GB|ms|requests|strings)\b")


def test_every_knob_has_a_one_line_description_with_its_unit():
    for knob in (*KNOBS, *LIMIT_KNOBS):
        assert knob.help.strip(), knob.name
        assert "\n" not in knob.help and "PILLAR knob" not in knob.help, knob.name
        if knob.kind in (int, float):
            assert UNITS.search(knob.help), f"{knob.name}: no unit in {knob.help!r}"
        for value in knob.choices or ():
            assert f"{value} =" in knob.help, f"{knob.name}: choice {value!r} not described"
    # Every PillarConfig field but num_steps (--speculative-num-steps) is a knob.
    assert {k.field for k in KNOBS} == set(PillarConfig.__dataclass_fields__) - {"num_steps"}
    assert {k.field for k in LIMIT_KNOBS} == set(RequestLimits.__dataclass_fields__)


def test_launch_flags_help_prints_each_description():
    parser = argparse.ArgumentParser()
    add_pillar_flags(None, parser)
    # Collapse argparse's line wrapping so each description reads as one string.
    text = " ".join(parser.format_help().split())
    for knob in (*KNOBS, *LIMIT_KNOBS):
        expected = " ".join(f"{knob.help} (default {knob.default}; fallback: the {knob.env} variable)".split())
        assert f"{knob.flag} " in text and expected in text, knob.name
    assert "--pillar-force-steps" in text and "-1 = the adaptive policy's choice" in text


def test_readme_knob_table_matches_the_knobs():
    """The README's table of knobs names only real knobs, with their real defaults; every --pillar-* flag the
    docs name exists (a renamed or removed knob cannot linger in the docs)."""
    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "README.md").read_text(encoding="utf-8")
    by_name = {knob.name: knob for knob in KNOBS}
    rows = re.findall(r"^\| `SPARSESPEC_(\w+)` \| ([^|]+) \|", readme, re.M)
    assert rows, "README.md has no knob table"
    for name, default in rows:
        assert name in by_name, f"README row SPARSESPEC_{name} is not a knob"
        knob, text = by_name[name], default.strip().strip("`")
        same = float(text) == knob.default if knob.kind is float else text == str(knob.default)
        assert same, f"README says SPARSESPEC_{name} defaults to {text}, the knob to {knob.default}"
    flags = {knob.flag for knob in (*KNOBS, *LIMIT_KNOBS)}
    for page in [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]:
        for flag in re.findall(r"--pillar-[a-z][a-z-]*[a-z]", page.read_text(encoding="utf-8")):
            assert flag in flags, f"{page.relative_to(repo)} names {flag}, which is no knob's flag"
