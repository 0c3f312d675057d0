"""``python -m benchmarks.report``: see the package docstring."""

from __future__ import annotations

import sys

from benchmarks.report import main

sys.exit(main())
