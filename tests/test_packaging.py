"""The installed package holds every package of the checkout.

pyproject lists the packages by hand (package-dir maps the top-level patches/ and kernels/ into
``sglang_sparsespec``), and the tests import from the checkout, where a missing entry goes
unnoticed: ``sglang_sparsespec.offload`` was left out of the list, so an installed plugin failed to
import outside a checkout (seen on the H100: benchmarks/results/gpu_tests/gpu_tests_h100_installed_import_a7ca47c.log).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


def site_packages() -> list[str]:
    """This interpreter's package folders (what site adds to sys.path)."""
    import site

    return [*site.getsitepackages(), site.getusersitepackages()]


def test_the_wheel_installs_a_plugin_that_loads_outside_the_checkout(tmp_path: Path) -> None:
    """Build the wheel from a clean copy of the sources (a stale build/ could hide a missing package),
    install it into a folder, and load the plugin from there the way SGLang does (``load_plugins``:
    the entry point, then ``register``), in a process whose working directory is not the checkout."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("sglang_sparsespec", "patches", "kernels"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist"), str(src)], check=True
    )
    (wheel,) = (tmp_path / "dist").glob("sglang_sparsespec-*.whl")
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "--target", str(site), str(wheel)], check=True)
    probe = (
        "from sglang.srt.plugins import load_plugins\n"
        "load_plugins()\n"  # SGLang's own loader: the entry point, then register(), which applies every hook
        "from sglang.srt.speculative.spec_info import SpeculativeAlgorithm\n"
        "assert type(SpeculativeAlgorithm.from_string('PILLAR')).__name__ == 'PillarSpecAlgo'\n"
        "import sys, sglang_sparsespec.patches, sglang_sparsespec.kernels, sglang_sparsespec.offload\n"
        "mods = [m for n, m in sys.modules.items() if n.startswith('sglang_sparsespec')]\n"
        "print(*{getattr(m, '__file__', None) or '' for m in mods}, sep='\\n')\n"
    )
    # -S: no .pth files, so an editable install of the checkout (the test environment's) cannot
    # answer for a module the wheel lacks; the environment's packages stay reachable after the wheel.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *site_packages()])}
    out = subprocess.run([sys.executable, "-S", "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = [Path(f) for f in out.stdout.split()]
    assert len(loaded) > 20 and all(f.is_relative_to(site) for f in loaded), loaded
