"""The installed package holds every package of the checkout.

pyproject lists the packages by hand (package-dir maps the top-level patches/ and kernels/ into
``sglang_sparsespec``), and the tests import from the checkout, where a missing entry goes
unnoticed: ``sglang_sparsespec.offload`` was left out of the list, so an installed plugin failed to
import outside a checkout (seen on the H100: benchmarks/results/gpu_tests_h100_installed_import_a7ca47c.log).
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def packages_on_disk(package_dir: dict[str, str]) -> set[str]:
    """Dotted names of the folders with an ``__init__.py`` under the package root and each mapped folder."""
    roots = {"sglang_sparsespec": ROOT / "sglang_sparsespec"} | {name: ROOT / d for name, d in package_dir.items()}
    found = set()
    for name, folder in roots.items():
        for init in folder.rglob("__init__.py"):
            rel = init.parent.relative_to(folder).parts
            found.add(".".join((name, *rel)))
    return found


def test_pyproject_lists_every_package_of_the_checkout() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = packages_on_disk(cfg["package-dir"])
    assert {"sglang_sparsespec.offload", "sglang_sparsespec.patches", "sglang_sparsespec.kernels"} <= on_disk
    assert set(cfg["packages"]) == on_disk
