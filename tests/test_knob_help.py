"""Every PILLAR knob carries its own one-line description, the one place it is described: the launch flags'
--help prints it and the README's knob table is made from it."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest
from sglang_sparsespec.config import KNOBS, PillarConfig
from sglang_sparsespec.knob_table import BEGIN, END, knob_table, with_knob_table
from sglang_sparsespec.limits import LIMIT_KNOBS, RequestLimits

from patches.server_args_flags import add_pillar_flags

REPO = Path(__file__).resolve().parents[1]
# What a number-valued knob is counted in; its description must name one of them.
UNITS = re.compile(r"\b(fraction|tokens|rounds|verify passes|quantile|GB|ms|requests|strings|characters|levels)\b")


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
    # Without whitespace, argparse's line wrapping (which also breaks words at hyphens) is gone.
    text = "".join(parser.format_help().split())
    for knob in (*KNOBS, *LIMIT_KNOBS):
        expected = "".join(f"{knob.help} (default {knob.default}; fallback: the {knob.env} variable)".split())
        assert f"{knob.flag}" in text and expected in text, knob.name
    assert "--pillar-force-steps" in text and "-1=theadaptivepolicy'schoice" in text


def test_readme_knob_table_is_the_one_the_knobs_make():
    """The README's knob table is ``knob_table``'s, made from ``KNOBS``: a knob added, renamed, re-described or
    given another default fails here until ``python -m sglang_sparsespec.knob_table README.md`` rewrites it."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme.count(BEGIN) == readme.count(END) == 1
    assert with_knob_table(readme) == readme, "stale: run python -m sglang_sparsespec.knob_table README.md"
    rows = knob_table().splitlines()[2:]
    assert [row.split("`")[1] for row in rows] == [k.name for k in KNOBS]  # every knob, in KNOBS order
    assert "| `BATCH_PHASES` | `split` | how full-length" in readme and "| `SPEC_PREMIUM` | 0.15 |" in readme


def test_knob_table_rewrites_only_its_block():
    readme = f"# Title\n\nbefore\n{BEGIN}\n| stale |\n{END}\nafter\n"
    assert with_knob_table(readme) == f"# Title\n\nbefore\n{BEGIN}\n\n{knob_table()}\n\n{END}\nafter\n"
    with pytest.raises(ValueError, match="knob table"):
        with_knob_table("# no markers\n")


def test_docs_name_only_real_flags():
    """Every --pillar-* flag the docs name exists (a renamed or removed knob cannot linger in the docs)."""
    flags = {knob.flag for knob in (*KNOBS, *LIMIT_KNOBS)}
    for page in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        for flag in re.findall(r"--pillar-[a-z][a-z-]*[a-z]", page.read_text(encoding="utf-8")):
            assert flag in flags, f"{page.relative_to(REPO)} names {flag}, which is no knob's flag"


def _exported(monkeypatch, argv: list[str]) -> dict[str, str]:
    """The variables the launcher exports for ``argv`` (SGLang's own flags reduced to the algorithm)."""
    import os

    from patches.server_args_flags import export_pillar_flags

    parser = argparse.ArgumentParser()
    parser.add_argument("--speculative-algorithm", default=None)
    add_pillar_flags(None, parser)
    env: dict[str, str] = {}
    monkeypatch.setattr(os, "environ", env)
    assert export_pillar_flags(lambda namespace: "parsed", parser.parse_args(argv)) == "parsed"
    return env


def test_flags_reach_the_variables_and_choices_take_any_case(monkeypatch):
    argv = ["--speculative-algorithm", "pillar", "--pillar-policy", "STREAMING", "--pillar-budget-ratio", "0.1"]
    assert _exported(monkeypatch, argv) == {"SPARSESPEC_POLICY": "streaming", "SPARSESPEC_BUDGET_RATIO": "0.1"}


def test_a_pillar_flag_without_pillar_or_an_empty_flag_fails_at_launch(monkeypatch):
    """Either would leave the server on its defaults without a word; the offload pool and the request caps serve
    stock decoding too."""
    stock = ["--pillar-offload-host-gb", "4", "--pillar-max-fanout", "64"]
    assert _exported(monkeypatch, stock) == {"SPARSESPEC_OFFLOAD_HOST_GB": "4", "SPARSESPEC_MAX_FANOUT": "64"}
    for argv, named in (
        (["--pillar-budget-ratio", "0.1"], "--speculative-algorithm none"),
        (["--speculative-algorithm", "NGRAM", "--pillar-policy", "oracle"], "--speculative-algorithm NGRAM"),
    ):
        with pytest.raises(ValueError, match=f"configures --speculative-algorithm PILLAR, .*{named}"):
            _exported(monkeypatch, argv)
    with pytest.raises(ValueError, match="--pillar-budget-ratio was given an empty value; give one"):
        _exported(monkeypatch, ["--speculative-algorithm", "PILLAR", "--pillar-budget-ratio", " "])


def test_a_knobs_error_names_its_flag_beside_its_variable():
    from patches.server_args_flags import with_flags

    text = "SPARSESPEC_BUDGET_RATIO must be in (0, 1]; SPARSESPEC_MAX_FANOUT too; SPARSESPEC_CACHE is no knob"
    assert with_flags(text) == (
        "--pillar-budget-ratio / SPARSESPEC_BUDGET_RATIO must be in (0, 1]; --pillar-max-fanout / SPARSESPEC_MAX_FANOUT"
        " too; SPARSESPEC_CACHE is no knob"
    )
