#!/usr/bin/env bash
# Sets up (tools/setup.sh) and runs quern on the default model. Until the HTTP daemon lands this
# runs one chat generation; extra arguments go to `quern generate`.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
if [ $# -eq 0 ]; then
  set -- --chat --temp 0 -n 64 --prompt "What is the capital of France?"
fi
exec build/server/quern generate --model models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"
