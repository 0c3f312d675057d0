"""Every Triton kernel compiles for sm_90 (H100 / H200) at its serving shapes, checked on any machine.

The CPU suite runs the kernels in Triton's interpreter, which accepts code the compiler refuses; this
runs ``kernel_compile.py`` in a fresh process (the interpreter switch is read at import) to compile them
to cubins with the ptxas that Triton ships, so such an error fails here instead of on the GPU.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_every_kernel_compiles_for_sm90() -> None:
    script = Path(__file__).with_name("kernel_compile.py")
    env = {**os.environ, "TRITON_INTERPRET": "0", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=Path(__file__).parent.parent,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "for sm_90" in done.stdout.splitlines()[-1], out[-2000:]
