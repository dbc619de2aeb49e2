#!/usr/bin/env bash
# Sets up (tools/setup.sh) and runs the HTTP daemon on the default model, on 127.0.0.1:8080.
# Extra arguments go to `quern serve` (e.g. --port 9000 --api-key KEY; see quern serve --help).
# Ctrl-C (SIGINT) or SIGTERM drains in-flight requests and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
exec build/server/quern serve --model models/SmolLM2-135M-Instruct.Q4_1.gguf "$@"
