#!/usr/bin/env bash
# Regenerate tests/golden/smollm2.json from independent reference implementations
# (HF transformers fp32 + llama-cpp-python). Needs network access to PyPI.
# Nothing here is needed by the normal build or tests.
#   tools/make-golden.sh            # install (if needed) + generate
#   tools/make-golden.sh --install-only
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$ROOT/.venv-golden"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
PIP="$VENV/bin/pip"
"$PIP" install -q --upgrade pip wheel setuptools

# CPU torch: prefer the CPU-only index, fall back to plain PyPI torch.
if ! "$VENV/bin/python" -c 'import torch' 2>/dev/null; then
  if curl -sfI --max-time 15 https://download.pytorch.org/whl/cpu/torch/ >/dev/null 2>&1; then
    "$PIP" install torch --index-url https://download.pytorch.org/whl/cpu
  else
    "$PIP" install torch
  fi
fi
"$PIP" install transformers accelerate gguf numpy sentencepiece protobuf

# llama-cpp-python builds llama.cpp from source; keep it lean.
if ! "$VENV/bin/python" -c 'import llama_cpp' 2>/dev/null; then
  CMAKE_ARGS="-DGGML_NATIVE=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF" \
  MAKEFLAGS=-j2 CMAKE_BUILD_PARALLEL_LEVEL=2 \
    "$PIP" install --no-cache-dir llama-cpp-python
fi

if [ "${1:-}" = "--install-only" ]; then exit 0; fi
"$VENV/bin/python" "$ROOT/tools/make-golden.py" "$@"
"$VENV/bin/python" "$ROOT/tools/make-golden-rope.py"
"$VENV/bin/python" "$ROOT/tools/make-golden-head-dim.py"
exec "$VENV/bin/python" "$ROOT/tools/make-golden-archs.py"
