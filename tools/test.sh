#!/usr/bin/env bash
# Sets up (tools/setup.sh), runs every test in build/, validates deploy/, runs three replicas
# behind HAProxy (tools/cluster-test.sh --short), then the unit tests again in a second build
# with AddressSanitizer and UndefinedBehaviorSanitizer (with them a strided failure-injection
# sweep, test_fault; tools/fault-sweep.sh runs it whole), a short run of the fuzzers
# (tools/fuzz.sh), ThreadSanitizer on the threaded suites (tools/tsan.sh), and a 1-minute soak of
# the sanitized daemon (tools/soak.sh). What CI runs (.ci/run).
set -euo pipefail
cd "$(dirname "$0")/.."
# each stage's end, in seconds from the start: where a slow CI machine spends its time
stage_done() { echo "test: $1 done at ${SECONDS} s"; }
tools/setup.sh
stage_done setup
meson test -C build --print-errorlogs --num-processes 2
stage_done "release suite"
# deploy/ against Kubernetes' schemas and the code (tools/validate-deploy.sh)
tools/validate-deploy.sh
# three replicas behind HAProxy on loopback: affinity, and a replica killed mid-run
tools/cluster-test.sh --short --no-setup
stage_done "deploy and cluster checks"
if [ ! -f build-asan/build.ninja ]; then
  # no CUDA here: the sanitized suites run on the CPU, and nvcc's objects were a fifth of the build
  meson setup build-asan --buildtype=debugoptimized -Db_sanitize=address,undefined \
    -Db_lundef=false -Dcuda=disabled -Dfault_injection=true >/dev/null
fi
# failure injection (quant/fault.h) rides on the sanitized build: its meson test test_fault
# fails allocations, KV blocks, client writes and model reads one at a time, strided
# (tools/fault-sweep.sh for all of them); an older build-asan gets the option here
meson configure build-asan -Dfault_injection=true >/dev/null
ninja -C build-asan >/dev/null
stage_done "sanitized build"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  QUERN_SANITIZED=1 meson test -C build-asan --print-errorlogs --num-processes 2 --timeout-multiplier 4
stage_done "sanitized suite"
# every libFuzzer target (tests/fuzz) over its committed corpus, crash regressions included, then
# 4 s of new inputs each (clang build in build-fuzz/; tools/fuzz.sh TARGET SECONDS for long runs)
tools/fuzz.sh --check 4
stage_done fuzzers
# ThreadSanitizer on the worker pool, communicator, scheduler, KV pool and the daemon's HTTP
# threads (build-tsan/, about 2 minutes with its build; tools/tsan.sh alone adds the generating
# parts of test_hostile)
tools/tsan.sh test_threadpool test_comm test_sched test_kv_cache hostile-http
stage_done ThreadSanitizer
# a minute of hundreds of hostile, slow and well-behaved clients against the sanitized daemon
# (tools/soak.sh --duration 600 and more for long soaks)
tools/soak.sh --no-setup --bin build-asan/server/quern --duration 60 --clients 100
stage_done soak
echo "test: all tests passed"
