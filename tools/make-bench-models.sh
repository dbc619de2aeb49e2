#!/usr/bin/env bash
# make-bench-models.sh — derive the benchmark model variants from the default model.
#
# From models/SmolLM2-135M-Instruct.Q4_1.gguf (token_embd Q8_0, layers Q4_1) make
#   models/SmolLM2-135M-Instruct.Q8_0.gguf, models/SmolLM2-135M-Instruct.Q4_0.gguf and
#   models/SmolLM2-135M-Instruct.Q4_K_M.gguf (llama.cpp's most downloaded mix; on SmolLM2's
#   576-wide rows mostly Q5_0, with Q4_K and Q6_K where rows are 1536 wide: quern converts
#   those types as it reads the file, docs/quant.md)
# with llama.cpp's llama-quantize --allow-requantize. Requantizing from Q4_1 is lossy;
# these files are for speed comparisons only, not for quality.
#
# Idempotent: a variant is (re)made only when missing or older than the source.
# Needs llama-quantize: tools/build-llamacpp.sh builds it (LLAMA_BIN overrides the dir).
#
#   tools/make-bench-models.sh [SOURCE.gguf]
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SRC=${1:-$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf}
LLAMA_BIN=${LLAMA_BIN:-$ROOT/third_party/llama.cpp/build/bin}
QUANT=$LLAMA_BIN/llama-quantize

[[ -f "$SRC" ]] || { echo "make-bench-models: no source model $SRC" >&2; exit 1; }
[[ -x "$QUANT" ]] || { echo "make-bench-models: no $QUANT (run tools/build-llamacpp.sh)" >&2; exit 1; }

base=${SRC%.gguf}
base=${base%.*}  # strip the quant suffix (.Q4_1)
for type in Q8_0 Q4_0 Q4_K_M; do
    out=$base.$type.gguf
    if [[ -f "$out" && "$out" -nt "$SRC" ]]; then
        echo "make-bench-models: $out is up to date" >&2
        continue
    fi
    echo "make-bench-models: $SRC -> $out" >&2
    "$QUANT" --allow-requantize "$SRC" "$out.tmp" "$type" "$(nproc)" >"$out.log" 2>&1 || {
        echo "make-bench-models: llama-quantize failed, see $out.log" >&2
        rm -f "$out.tmp"; exit 1; }
    mv "$out.tmp" "$out"
    rm -f "$out.log"
done
