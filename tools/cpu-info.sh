#!/usr/bin/env bash
# cpu-info.sh — one line naming this machine's CPU for benchmark tables: model, online cores and
# the SIMD flags the kernels choose between (avx*, fma, f16c, amx*), e.g.
#   CPU: AMD EPYC 9B45, 2 cores; flags: avx avx2 avx512f avx512_vnni ... fma
# With --flags it prints only the flags (space-separated), for scripts to test.
set -euo pipefail
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx|fma|f16c|amx)' | sort |
    tr '\n' ' ' | sed 's/ $//')
if [[ ${1:-} == --flags ]]; then echo "$flags"; exit 0; fi
model=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "CPU: ${model:-unknown}, $(nproc) cores; flags: $flags"
