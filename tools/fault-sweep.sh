#!/usr/bin/env bash
# The whole failure-injection sweep (issue 20, tests/test_fault.py): every allocation, KV-block,
# client-write and model-read point of the short run (load, four requests, SIGTERM) failed once,
# on the sanitized build-asan/ (-Dfault_injection=true, as tools/test.sh sets it up). tools/test.sh
# runs it strided (its meson test test_fault); this is the unstrided run, 8 minutes on 2 quiet
# cores (docs/reliability.md).
#   tools/fault-sweep.sh [STRIDE [STARTS]]   STRIDE: every Nth request point (1); STARTS: start-up
#                                            points per kind (200)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build-asan/build.ninja ]; then
  meson setup build-asan --buildtype=debugoptimized -Db_sanitize=address,undefined \
    -Db_lundef=false -Dcuda=disabled -Dfault_injection=true >/dev/null
fi
meson configure build-asan -Dfault_injection=true >/dev/null
ninja -C build-asan server/quern >/dev/null
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export QUERN_SANITIZED=1 QUERN_BIN=$PWD/build-asan/server/quern
export QUERN_MODEL=$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf
QUERN_FAULT_STRIDE=${1:-1} QUERN_FAULT_STARTS=${2:-200} exec python3 tests/test_fault.py
