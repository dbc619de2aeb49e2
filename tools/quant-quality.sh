#!/usr/bin/env bash
# The quality table of docs/quant.md: the default model dequantized to F32 is the reference
# (REF); REF is quantized back to each type with quern quantize (its default rounding: searched
# Q8_0 scales; plus one Q8_0 row with --rounding ref) and scored against REF with
# quern eval (perplexity, mean KL divergence, top-1 agreement), printed as markdown rows.
#
# usage: tools/quant-quality.sh [BUILD_DIR] [TEXT] [CTX]
#   defaults: build, /usr/share/common-licenses/GPL-3, 512. $QUERN_MODEL picks the model.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
text=${2:-/usr/share/common-licenses/GPL-3}
ctx=${3:-512}
bin=$build/server/quern
model=${QUERN_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$bin" quantize --in "$model" --out "$work/ref.gguf" --type f32 2>/dev/null
echo "REF: $model dequantized to F32 ($bin quantize --in $model --out ref.gguf --type f32)"
echo "text: $text, --ctx $ctx, all windows; the second half of each window scored"
echo
echo "| weights | precision | MiB | PPL | PPL/PPL(REF) | mean KL | 99% KL | top-1 agreement |"
echo "|---|---|---:|---:|---:|---:|---:|---:|"

# row LABEL FILE PRECISION
row() {
  "$bin" eval --model "$2" --ref "$work/ref.gguf" --text "$text" --ctx "$ctx" --precision "$3" \
    >"$work/out" 2>"$work/err" || { cat "$work/err" >&2; exit 1; }
  local mib
  mib=$(awk -v b="$(stat -c %s "$2")" 'BEGIN { printf "%.1f", b / 1048576 }')
  awk -v label="$1" -v prec="$3" -v mib="$mib" '
    $1 == "perplexity" { ppl = $2 " ± " $4 }
    $1 == "ppl" && $2 == "ratio" { ratio = $3 }
    $1 == "mean" && $2 == "KL" { kl = $3 " ± " $5 }
    $1 == "99%" { p99 = $3 }
    $1 == "top-1" { top = $3 " ± " $6 " %" }
    END { printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n", label, prec, mib, ppl, ratio, kl, p99, top }
  ' "$work/out"
}

row "REF itself (F32)" "$work/ref.gguf" f32
row "the original file (Q4_1, token_embd Q8_0)" "$model" f32
"$bin" quantize --in "$work/ref.gguf" --out "$work/q8_0-ref.gguf" --type q8_0 --rounding ref \
  2>/dev/null
row "q8_0, reference rounding (llama-quantize's bytes)" "$work/q8_0-ref.gguf" f32
for spec in "q8_0" "q8_0 --keep-output" "q4_1" "q4_1 --keep-output" "q4_0" "q4_0 --keep-output"; do
  read -r type keep <<<"$spec"
  out="$work/$type${keep:+-keep}.gguf"
  # shellcheck disable=SC2086
  "$bin" quantize --in "$work/ref.gguf" --out "$out" --type "$type" $keep 2>/dev/null
  row "$type${keep:+ (token_embd kept F32)}" "$out" f32
  if [ -z "$keep" ]; then row "$type" "$out" q8; fi
done
