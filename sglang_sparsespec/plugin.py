"""SGLang plugin entry point (group ``sglang.srt.plugins``, name ``sparsespec``).

SGLang calls :func:`register` with no arguments in the launcher and in every scheduler
process, then applies the registered hooks (``sglang.srt.plugins.load_plugins``).
"""

from __future__ import annotations


def register() -> None:
    from sglang_sparsespec.patches import apply

    apply()
