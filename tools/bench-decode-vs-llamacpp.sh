#!/usr/bin/env bash
# bench-decode-vs-llamacpp.sh — batched decode of quern vs llama.cpp on this machine: B
# sequences, each with its own CTX-token prompt, decoding STEPS tokens together.
#
#   quern:     build/server/quern bench --model FILE --decode-batches B1,B2,.. --pp CTX --tg STEPS
#              --threads T --device cpu [--quern-args]        (engine/bench_decode.h)
#   llama.cpp: llama-batched-bench -m FILE -c C -b 2048 -ub 512 -npp CTX -ntg STEPS
#              -npl B1,B2,.. -t T                             (its S_TG t/s column)
#
# Both time the decode steps only (after every sequence's prompt is in the cache). Runs are
# interleaved round by round (--rounds N, best round per cell kept) after waiting for idle CPUs
# (--idle-wait S); prints one markdown table: batch, quern tok/s, llama.cpp tok/s, ratio.
#
#   tools/bench-decode-vs-llamacpp.sh [-m MODEL.gguf] [-b 1,8,64] [--ctx 128] [--steps 16]
#                                     [-t 2] [--rounds 2] [--quern-args "--precision f32"]
# Env: QUERN (quern binary), LLAMA_BIN (dir with llama-batched-bench; tools/build-llamacpp.sh).
set -euo pipefail

main() {

ROOT=$(cd "$(dirname "$0")/.." && pwd)
QUERN=${QUERN:-$ROOT/build/server/quern}
LLAMA_BIN=${LLAMA_BIN:-$ROOT/third_party/llama.cpp/build/bin}
model=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
batches=1,8,64 ctx=128 steps=16 threads=2 rounds=1 idle_wait=60 quern_args=""
while [ $# -gt 0 ]; do
  case $1 in
    -m) model=$2; shift 2 ;;
    -b) batches=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --idle-wait) idle_wait=$2; shift 2 ;;
    --quern-args) quern_args=$2; shift 2 ;;
    *) echo "usage: $0 [-m MODEL] [-b 1,8,64] [--ctx N] [--steps N] [-t T] [--rounds N]" \
         "[--idle-wait S] [--quern-args ARGS]" >&2; exit 2 ;;
  esac
done
[ -x "$QUERN" ] || { echo "no quern at $QUERN (build first)" >&2; exit 1; }
[ -x "$LLAMA_BIN/llama-batched-bench" ] ||
  { echo "no llama-batched-bench in $LLAMA_BIN (tools/build-llamacpp.sh)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp "$QUERN" "$tmp/quern" # a rebuild during the run cannot mix two builds
maxb=$(tr ',' '\n' <<<"$batches" | sort -n | tail -1)
kv=$(((ctx + steps + 16) * maxb))

wait_idle() { # until the last second's CPU use by anything is under 10 % of one core
  local end=$((SECONDS + idle_wait)) a b
  while [ $SECONDS -lt $end ]; do
    a=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
    sleep 1
    b=$(awk '/^cpu /{print $2+$3+$4+$7+$8}' /proc/stat)
    [ $((b - a)) -lt 10 ] && return 0
  done
}

declare -A best_q best_l
for ((r = 1; r <= rounds; r++)); do
  wait_idle
  # shellcheck disable=SC2086
  "$tmp/quern" bench --model "$model" --decode-batches "$batches" --pp "$ctx" --tg "$steps" \
    --threads "$threads" --device cpu $quern_args --json >"$tmp/q.json" 2>"$tmp/q.err" ||
    { cat "$tmp/q.err" >&2; exit 1; }
  wait_idle
  "$LLAMA_BIN/llama-batched-bench" -m "$model" -c "$kv" -b 2048 -ub 512 -npp "$ctx" \
    -ntg "$steps" -npl "$batches" -t "$threads" >"$tmp/l.txt" 2>"$tmp/l.err" ||
    { tail -5 "$tmp/l.err" >&2; exit 1; }
  while read -r b v; do
    awk -v a="$v" -v c="${best_q[$b]:-0}" 'BEGIN{exit !(a > c)}' && best_q[$b]=$v
  done < <(python3 -c 'import json,sys
for d in json.load(open(sys.argv[1]))["decode"]: print(d["batch"], d["tokens_per_s"])' "$tmp/q.json")
  # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | ...
  while read -r b v; do
    awk -v a="$v" -v c="${best_l[$b]:-0}" 'BEGIN{exit !(a > c)}' && best_l[$b]=$v
  done < <(awk -F'|' '$2 ~ /^ *[0-9]+ *$/ {gsub(/ /, "", $4); gsub(/ /, "", $9); print $4, $9}' \
    "$tmp/l.txt")
done

echo "model $(basename "$model"), context $ctx, $steps decode steps, $threads threads," \
  "best of $rounds round(s), quern args: ${quern_args:-none}, QUERN_CPU_ISA ${QUERN_CPU_ISA:-native}"
echo "$("$ROOT/tools/cpu-info.sh")"
echo
echo "| batch | quern tok/s | llama.cpp tok/s | ratio |"
echo "|---|---|---|---|"
for b in $(tr ',' ' ' <<<"$batches"); do
  q=${best_q[$b]:-} l=${best_l[$b]:-}
  ratio=$(awk -v q="$q" -v l="$l" 'BEGIN{if (q > 0 && l > 0) printf "%.2f", q / l; else print "-"}')
  echo "| $b | ${q:--} | ${l:--} | $ratio |"
done

}

main "$@"
