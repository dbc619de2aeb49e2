#!/usr/bin/env bash
# bench-concurrency.sh — issue 22's "output tok/s at concurrency 16 over concurrency 1", measured
# the way these shared machines need: C = 1 and C = 16 runs alternated round by round (never all
# of one then all of the other), on every ISA asked for (the AVX2 path too on an AVX-512 machine),
# with the CPU line and the read bandwidth and int8 peak of the moment printed beside the table.
#
#   tools/bench-concurrency.sh [-m MODEL] [-r ROUNDS] [-t THREADS] [-c C] [-n REQUESTS]
#                              [--input-len L] [--output-len O] [--isa "native avx2"]
#                              [--quern BIN]...
#
# Defaults: the default Q4_1 model, 3 rounds, 2 threads, C = 16, 32 requests of 128 prompt and
# 64 output tokens (random tokens, greedy), the ISAs this CPU has among native and avx2.
# Each row is one round: C = 1 and C = C output tok/s, their ratio and C's TTFT p50; the last
# rows give the medians. --quern more than once compares builds, alternated within each round.
# Needs python3 (for the JSON) and a built quern.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/models/SmolLM2-135M-Instruct.Q4_1.gguf
rounds=3 threads=2 conc=16 requests=32 input_len=128 output_len=64 isas="" querns=()
while [[ $# -gt 0 ]]; do
    case $1 in
        -m) model=$2; shift 2 ;;
        -r) rounds=$2; shift 2 ;;
        -t) threads=$2; shift 2 ;;
        -c) conc=$2; shift 2 ;;
        -n) requests=$2; shift 2 ;;
        --input-len) input_len=$2; shift 2 ;;
        --output-len) output_len=$2; shift 2 ;;
        --isa) isas=$2; shift 2 ;;
        --quern) querns+=("$2"); shift 2 ;;
        -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
        *) echo "bench-concurrency.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[[ ${#querns[@]} -gt 0 ]] || querns=("$root/build/server/quern")
for q in "${querns[@]}"; do
    [[ -x $q ]] || { echo "bench-concurrency.sh: no quern at $q (build it first)" >&2; exit 1; }
done
quern=${querns[0]}
# a build's name in the table: its file name, or (when two builds share one, as build/server/quern
# and another tree's) the path it was given, so that neither their rows nor their medians mix
uniq_names=$(for q in "${querns[@]}"; do basename "$q"; done | sort -u | wc -l)
label() {
    if [[ $uniq_names -lt ${#querns[@]} ]]; then printf '%s' "${1// /_}"; else basename "$1"; fi
}
[[ -f $model ]] || { echo "bench-concurrency.sh: no model at $model" >&2; exit 1; }
if [[ -z $isas ]]; then
    isas=native
    if "$root/tools/cpu-info.sh" --flags | grep -qw avx512f; then isas="native avx2"; fi
fi

"$root/tools/cpu-info.sh"
ceiling() {
    "$quern" bench --kernels --threads "$threads" --batches 1 2>/dev/null | head -2 | tr '\n' ' '
    echo
}
echo "before: $(ceiling)"
echo "model $(basename "$model"), $threads thread(s), $requests requests of $input_len + $output_len tokens, C = 1 and $conc alternated, $rounds round(s)"
echo
echo "| build | ISA | round | C = 1 tok/s | C = $conc tok/s | ratio | C = $conc TTFT p50 ms |"
echo "|---|---|---|---|---|---|---|"

run() { # build isa concurrency -> the bench's JSON
    local env=()
    [[ $2 != native ]] && env=(QUERN_CPU_ISA="$2")
    env "${env[@]}" "$1" bench --model "$model" --requests "$requests" \
        --input-len "$input_len" --output-len "$output_len" --concurrency "$3" \
        --threads "$threads" --json 2>/dev/null
}

results=$(mktemp)
trap 'rm -f "$results"' EXIT
for r in $(seq "$rounds"); do
    for isa in $isas; do for q in "${querns[@]}"; do
        one=$(run "$q" "$isa" 1)
        many=$(run "$q" "$isa" "$conc")
        python3 - "$(label "$q")" "$isa" "$r" "$one" "$many" "$results" <<'EOF'
import json, sys
q, isa, r = sys.argv[1], sys.argv[2], sys.argv[3]
one, many, out = json.loads(sys.argv[4]), json.loads(sys.argv[5]), sys.argv[6]
for j in (one, many):
    if j["failed"]:
        sys.exit(f"bench-concurrency.sh: {j['failed']} request(s) failed at concurrency {j['concurrency']}")
a, b = one["output_tokens_per_s"], many["output_tokens_per_s"]
print(f"| {q} | {isa} | {r} | {a:.1f} | {b:.1f} | {b / a:.2f} | {many['ttft_ms_p50']:.0f} |")
with open(out, "a") as f:
    f.write(f"{q} {isa} {a} {b} {many['ttft_ms_p50']}\n")
EOF
    done; done
done
python3 - "$results" <<'EOF'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    q, isa, a, b, t = line.split()
    rows.setdefault((q, isa), []).append((float(a), float(b), float(t)))
for (q, isa), v in rows.items():
    med = [statistics.median(x) for x in zip(*v)]
    ratio = statistics.median(b / a for a, b, _ in v)
    print(f"| {q} | {isa} | median | {med[0]:.1f} | {med[1]:.1f} | {ratio:.2f} | {med[2]:.0f} |")
EOF
echo
echo "after: $(ceiling)"
