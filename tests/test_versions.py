"""The supported SGLang releases: the hooks and signatures recorded per release, the launch check against
the installed one, and the refusal of a release outside the range.

Every test reads the installed release (``versions.INSTALLED``), so the suite's 0.5.17 pass checks
0.5.17's row of the signature table and its 0.5.23 pass checks 0.5.23's.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

pytest.importorskip("sglang")

from sglang.srt.plugins import load_plugins  # noqa: E402

load_plugins()

from sglang_sparsespec.patches import HOOKS, signatures, versions  # noqa: E402
from sglang_sparsespec.patches.signatures import SIGNATURES  # noqa: E402
from sglang_sparsespec.patches.versions import SUPPORTED, out_of_range  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def test_the_installed_sglang_is_a_supported_release():
    assert versions.INSTALLED in SUPPORTED and out_of_range() is None


def test_pyproject_declares_exactly_the_supported_range():
    (dep,) = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert dep == f"sglang>={SUPPORTED[0]},<={SUPPORTED[-1]}"
    assert SUPPORTED == versions.releases() and list(SUPPORTED) == sorted(SUPPORTED, key=versions.release)


def test_every_recorded_signature_of_the_installed_release_is_the_installed_one():
    """The table row of the installed release, symbol by symbol, against SGLang's own objects (hooked
    ones through HookRegistry's wrappers): what the launch check compares."""
    present = {s: signatures.recorded(s) for s in SIGNATURES if signatures.recorded(s) is not None}
    assert len(present) > 60
    assert {s: signatures.installed_signature(s) for s in present} == present
    # And what the table says is gone from this release is gone.
    absent = [s for s in SIGNATURES if signatures.recorded(s) is None]
    assert [s for s in absent if signatures.installed_signature(s) is not None] == []
    assert signatures.signature_drift() == [] and signatures.launch_refusal() is None


def test_every_hook_names_releases_whose_target_was_surveyed():
    for hook in HOOKS:
        assert hook.versions and set(hook.versions) <= set(SUPPORTED), hook.target
        if hook.target.startswith("sglang."):
            assert [v for v in hook.versions if signatures.recorded(hook.target, v) is None] == [], hook.target


def test_the_hooks_of_the_installed_release_are_applied_and_no_other():
    from sglang.srt.plugins.hook_registry import HookRegistry

    applied = {hook.target for hook in HOOKS if hook.applies()}
    assert applied <= HookRegistry._patched
    # A hook of other releases only (its target may be absent here) is not registered.
    others = {hook.target for hook in HOOKS} - applied
    assert not others & set(HookRegistry._hooks)


@pytest.mark.parametrize("version", ["0.5.16", "0.5.24", "0.6.0", "0.5.23.post1"])
def test_a_release_outside_the_range_is_refused_with_one_line_naming_it(version):
    text = signatures.launch_refusal(version)
    assert text == out_of_range(version)
    assert "SGLang 0.5.17 through 0.5.23" in text and f"installed: sglang {version}" in text and "\n" not in text


def test_pillar_on_a_release_outside_the_range_fails_at_launch(llama_config_dir, monkeypatch):
    from test_plugin import _args

    monkeypatch.setattr(versions, "INSTALLED", "0.5.24")
    with pytest.raises(ValueError) as err:
        _args(llama_config_dir)
    text = str(err.value)
    assert text.startswith("--speculative-algorithm PILLAR: sglang-sparsespec serves SGLang 0.5.17 through 0.5.23")
    assert "\n" not in text


def test_a_signature_that_moved_fails_at_launch_naming_the_symbol(llama_config_dir, monkeypatch):
    from test_plugin import _args

    symbol = "sglang.srt.speculative.eagle_utils.eagle_sample"
    moved = {**SIGNATURES, symbol: {SUPPORTED[0]: "(verify_input, batch)"}}
    monkeypatch.setattr(signatures, "SIGNATURES", moved)
    with pytest.raises(ValueError) as err:
        _args(llama_config_dir)
    text = str(err.value)
    assert f"differs from the released {versions.INSTALLED}" in text and symbol in text and "\n" not in text


def test_out_of_range_applies_no_hook_and_keeps_pillar_to_refuse(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    import sglang_sparsespec.patches as patches

    registered, hooked = [], []
    monkeypatch.setattr(patches, "_applied", False)
    monkeypatch.setattr(versions, "INSTALLED", "0.5.24")
    monkeypatch.setattr(SpeculativeAlgorithm, "register", lambda name, **kw: lambda f: registered.append(name))
    monkeypatch.setattr(HookRegistry, "register", lambda *a, **kw: hooked.append(a))
    patches.apply()
    assert registered == ["PILLAR"] and hooked == []


def test_for_release_picks_the_value_in_force():
    changes = {"0.5.17": "a", "0.5.19": "b", "0.5.23": "c"}
    picked = [versions.for_release(changes, v) for v in ("0.5.16", *SUPPORTED, "0.5.24")]
    assert picked == ["a", "a", "a", "b", "b", "b", "b", "c", "c"]
    assert versions.releases("0.5.19", "0.5.21") == ("0.5.19", "0.5.20", "0.5.21")
