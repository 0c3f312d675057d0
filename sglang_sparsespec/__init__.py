"""sglang-sparsespec: lossless sparse self-speculative decoding (PILLAR) for SGLang 0.5.17 through 0.5.23."""

from __future__ import annotations

from pathlib import Path

# Installed, setuptools maps the top-level patches/ and kernels/ folders into this package
# (see pyproject's package-dir). Imported straight from a source checkout — e.g. a server
# launched from the repository root, where this folder shadows the installed copy — they
# sit beside it instead, so look there too.
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "patches" / "__init__.py").is_file() and not (Path(__file__).parent / "patches").is_dir():
    __path__.append(str(_checkout))  # type: ignore[name-defined]  # noqa: F821
