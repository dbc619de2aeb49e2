#!/usr/bin/env bash
# bench-lora.sh — what a LoRA adapter costs: quern serving requests without an adapter, with one
# and with two (request i runs with adapter i mod 2), at concurrency 1 and 16; and llama.cpp
# (llama-cpp-python 0.3.36 from .venv-golden: the same llama.cpp source as the peer builds)
# decoding a single stream without and with the same adapter. The adapters are tests/lorafix.h's
# (rank 8, alpha 16, every layer's seven matrices, float32), written by build/tests/make_lora.
# Rounds are interleaved; prints one markdown table per round.
#
#   tools/bench-lora.sh [-m MODEL.gguf] [-t 2] [--rounds 2]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
QUERN=${QUERN:-$ROOT/build/server/quern}
MAKE_LORA=${MAKE_LORA:-$ROOT/build/tests/make_lora}
PY=${PY:-$ROOT/.venv-golden/bin/python}
model=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf threads=2 rounds=2
while [ $# -gt 0 ]; do
  case $1 in
    -m) model=$2; shift 2 ;;
    -t) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "usage: $0 [-m MODEL] [-t T] [--rounds N]" >&2; exit 2 ;;
  esac
done
[ -x "$QUERN" ] && [ -x "$MAKE_LORA" ] || { echo "build first (ninja -C build)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$MAKE_LORA" "$model" "$tmp/a.gguf"
"$MAKE_LORA" "$model" "$tmp/b.gguf" 11
"$ROOT/tools/cpu-info.sh" 2>/dev/null | head -3 || grep -m1 'model name' /proc/cpuinfo

quern_row() { # label, concurrency, extra args...
  local label=$1 c=$2
  shift 2
  local out
  out=$("$QUERN" bench --model "$model" --requests 32 --input-len 128 --output-len 64 \
    --concurrency "$c" --threads "$threads" "$@" 2>&1)
  local tps tpot
  tps=$(awk '/^output tokens\/s/ {print $3}' <<<"$out")
  tpot=$(awk '/^TPOT ms/ {print $4}' <<<"$out")
  echo "| quern serving, $label | $c | $tps | $tpot |"
}

llama_rows() { # single-stream decode through llama-cpp-python, without and with the adapter
  [ -x "$PY" ] || { echo "| llama.cpp | (no $PY) | | |"; return; }
  "$PY" - "$model" "$tmp/a.gguf" "$threads" <<'PYEOF'
import sys, time
import llama_cpp
model, lora, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
for label, kw in (("no adapter", {}), ("one adapter", {"lora_path": lora})):
    llm = llama_cpp.Llama(model_path=model, n_ctx=512, n_threads=threads, verbose=False, **kw)
    ids = llm.tokenize(b"Once upon a time")
    best = None
    for _ in range(2):
        llm.reset()
        llm.eval(ids)
        t0 = time.perf_counter()
        for _ in range(64):
            llm.eval([int(llm.scores[llm.n_tokens - 1].argmax())])
        dt = (time.perf_counter() - t0) / 64
        best = dt if best is None or dt < best else best
    print(f"| llama.cpp decode, {label} | 1 | {1 / best:.1f} | {best * 1e3:.2f} |")
PYEOF
}

for r in $(seq 1 "$rounds"); do
  echo
  echo "round $r ($(date -u +%H:%M) UTC)"
  echo
  echo "| run | concurrency | output tok/s | TPOT ms (p50) |"
  echo "|---|---|---|---|"
  for c in 1 16; do
    quern_row "no adapter" "$c"
    quern_row "one adapter" "$c" --lora "$tmp/a.gguf"
    quern_row "two adapters" "$c" --lora "$tmp/a.gguf" --lora "$tmp/b.gguf"
  done
  if grep -qw avx512f /proc/cpuinfo; then # the AVX2 path too, where AVX-512 is present
    QUERN_CPU_ISA=avx2 quern_row "no adapter, AVX2 path" 1
    QUERN_CPU_ISA=avx2 quern_row "one adapter, AVX2 path" 1 --lora "$tmp/a.gguf"
  fi
  llama_rows
done
