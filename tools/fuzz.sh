#!/usr/bin/env bash
# Runs the libFuzzer targets of tests/fuzz (issue 20) in build-fuzz/, a clang build with ASan,
# UBSan and coverage instrumentation, configured and built here when needed.
#
#   tools/fuzz.sh TARGET SECONDS   one target (gguf, oai, tokenizer, detok, chat, grammar, http_head, or
#                                  all: each in turn) for SECONDS each, growing its corpus in
#                                  build-fuzz/fuzz-corpus/TARGET from tests/fuzz/corpus/TARGET
#   tools/fuzz.sh --check SECONDS  what tools/test.sh runs: every target over its committed
#                                  corpus (the crash regressions included), then SECONDS of new
#                                  inputs each, writing nothing back
#
# A crash leaves its input in build-fuzz/fuzz-artifacts/ and fails the run. Fix it, then add the
# input to tests/fuzz/corpus/TARGET so every later run replays it. One process per target:
# the fuzzers never take more than one core.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGETS=(gguf oai tokenizer detok chat grammar http_head)
usage() { echo "usage: tools/fuzz.sh TARGET|all SECONDS | --check SECONDS" >&2; exit 2; }
[ $# -eq 2 ] || usage
mode=run
if [ "$1" = --check ]; then mode=check; shift; set -- all "$1"; fi
target=$1 seconds=$2
[[ $seconds =~ ^[0-9]+$ ]] || usage
if [ "$target" = all ]; then list=("${TARGETS[@]}"); else list=("$target"); fi
for t in "${list[@]}"; do [ -d "tests/fuzz/corpus/$t" ] || usage; done

if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang meson setup build-fuzz -Dfuzz=true -Dcuda=disabled -Db_sanitize=address,undefined \
    -Db_lundef=false --buildtype=debugoptimized >/dev/null
fi
ninja -C build-fuzz "${list[@]/#/tests/fuzz/fuzz_}" >/dev/null

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
mkdir -p build-fuzz/fuzz-artifacts
for t in "${list[@]}"; do
  if [ $mode = check ]; then
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
  else
    work=build-fuzz/fuzz-corpus/$t
    mkdir -p "$work"
  fi
  log=build-fuzz/fuzz-artifacts/$t.log
  # new inputs go to the first directory; the committed seeds are only read
  # -timeout: an input that takes over 60 s (a hang, or work out of all proportion) fails too
  if ! build-fuzz/tests/fuzz/fuzz_$t -max_total_time="$seconds" -timeout=60 -print_final_stats=1 \
      -artifact_prefix="build-fuzz/fuzz-artifacts/$t-" "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1
  then
    tail -n 40 "$log" >&2
    echo "fuzz: $t crashed; the input is in build-fuzz/fuzz-artifacts/ (log: $log)" >&2
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
  echo "fuzz: $t: ${runs:-?} executions in ${seconds} s (${rate:-?}/s), no crash"
  if [ $mode = check ]; then rm -rf "$work"; fi
done
