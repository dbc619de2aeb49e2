#!/usr/bin/env bash
# build-llamacpp.sh — build the llama.cpp peer that quern is benchmarked against.
#
# Source: the llama.cpp tree vendored in the llama-cpp-python sdist
# (vendor/llama.cpp), pinned by LLAMA_CPP_PYTHON_VERSION. It is extracted into
# third_party/llama.cpp (git-ignored) and built with CMake (Release, native ISA
# but AMX, no curl, no tests) into third_party/llama.cpp/build. Binaries end up in
# third_party/llama.cpp/build/bin/.
#
# Idempotent: the sdist is downloaded/extracted only if third_party/llama.cpp is
# missing or was extracted from a different version; cmake rebuilds only what
# changed.
#
# Env: LLAMA_CPP_PYTHON_VERSION (default 0.3.36), JOBS (default nproc),
#      LLAMA_TARGETS (default: llama-bench llama-batched-bench llama-server llama-quantize
#      llama-cli), LLAMA_ISA (native; avx2 or avxvnni: into build-<isa>/), LLAMA_AMX (1: -march=native
#      on a CPU with AMX too; see below).
#
# The body is one function, so bash parses it whole before running it (editing the
# file while it runs cannot change what a running build does).
set -euo pipefail

main() {

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VER=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
DEST="$ROOT/third_party/llama.cpp"
STAMP="$DEST/.from-llama-cpp-python"
JOBS=${JOBS:-$(nproc)}
TARGETS=${LLAMA_TARGETS:-"llama-bench llama-batched-bench llama-server llama-quantize llama-cli"}

if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$VER" ]]; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT  # $tmp is global on purpose: the trap runs after main
    echo "== downloading llama-cpp-python==$VER sdist" >&2
    python3 -m pip download --no-deps --no-binary :all: \
        "llama-cpp-python==$VER" -d "$tmp" >&2
    shopt -s nullglob
    sdists=("$tmp"/llama_cpp_python-*.tar.gz "$tmp"/llama-cpp-python-*.tar.gz)
    shopt -u nullglob
    (( ${#sdists[@]} )) || { echo "no sdist found in $tmp" >&2; exit 1; }
    sdist=${sdists[0]}
    top=$(basename "$sdist" .tar.gz)
    echo "== extracting $top/vendor/llama.cpp" >&2
    tar -xzf "$sdist" -C "$tmp" "$top/vendor/llama.cpp" "$top/CHANGELOG.md"
    # The llama.cpp commit: the submodule gitlink in the sdist's own .git when
    # git is available, else the short hash the CHANGELOG names for $VER.
    commit=""
    if command -v git >/dev/null && tar -xzf "$sdist" -C "$tmp" "$top/.git" 2>/dev/null; then
        commit=$(git -c safe.directory='*' -C "$tmp/$top" ls-tree HEAD vendor/llama.cpp \
                 2>/dev/null | awk '{print $3}') || commit=""
    fi
    if [[ -z "$commit" ]]; then
        commit=$(awk -v v="## [$VER]" '$0 == v {f = 1; next} /^## / {f = 0}
                 f && match($0, /llama\.cpp@[0-9a-f]+/) {print substr($0, RSTART + 10, RLENGTH - 10); exit}' \
                 "$tmp/$top/CHANGELOG.md")
    fi
    rm -rf "$DEST"
    mkdir -p "$ROOT/third_party"
    mv "$tmp/$top/vendor/llama.cpp" "$DEST"
    # The .git file there points into the sdist's .git/modules, which we drop.
    rm -f "$DEST/.git"
    echo "${commit:-unknown}" > "$DEST/.llama-cpp-commit"
    echo "$VER" > "$STAMP"
fi
COMMIT=$(cat "$DEST/.llama-cpp-commit" 2>/dev/null || echo unknown)
echo "== llama.cpp ${COMMIT} (from llama-cpp-python $VER)" >&2

# The ISA: -march=native, except on a CPU with AMX. There this llama.cpp (0c1e57098) registers
# its AMX weight buffers for Q4_0, Q4_1 and Q8_0, and every matmul on them dies in ldtilecfg
# (SIGSEGV in ggml_backend_amx_mul_mat, seen on a 2-vCPU Sapphire Rapids VM with the default
# model; llama-bench --repack 0 avoids it but also drops the repacked AVX-512 kernels). So on
# such a CPU the build names each x86 extension the CPU has, AMX left out: llama.cpp's best
# kernels that run. LLAMA_AMX=1 keeps -march=native anyway. LLAMA_ISA=avx2 builds for AVX2,
# FMA, F16C and BMI2 only (an AMD Zen 3) into build-avx2/: the peer of quern's AVX2 path
# forced on an AVX-512 machine (LLAMA_BIN=third_party/llama.cpp/build-avx2/bin).
# LLAMA_ISA=avxvnni adds AVX-VNNI (an Intel Alder Lake or Xeon 6 E-core class CPU: VNNI on 256
# bits, no AVX-512) into build-avxvnni/: the peer of quern's avxvnni path.
local build=build f on
local -a isa_flags=(-DGGML_NATIVE=ON)
local cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
case ${LLAMA_ISA:-native} in
native)
    if [[ "$cpu_flags" == *" amx_int8 "* && "${LLAMA_AMX:-0}" != 1 ]]; then
        isa_flags=(-DGGML_NATIVE=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
        for f in sse4_2:SSE42 f16c:F16C fma:FMA bmi2:BMI2 avx:AVX avx2:AVX2 avx_vnni:AVX_VNNI \
            avx512f:AVX512 avx512vbmi:AVX512_VBMI avx512_vnni:AVX512_VNNI \
            avx512_bf16:AVX512_BF16; do
            on=OFF
            [[ "$cpu_flags" == *" ${f%%:*} "* ]] && on=ON
            isa_flags+=("-DGGML_${f#*:}=$on")
        done
        echo "== AMX CPU: building without AMX (${isa_flags[*]})" >&2
    fi
    ;;
avx2 | avxvnni)
    build=build-${LLAMA_ISA}
    on=OFF
    [[ $LLAMA_ISA == avxvnni ]] && on=ON
    isa_flags=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
        -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=$on -DGGML_AVX512=OFF
        -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
        -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
    ;;
*)
    echo "build-llamacpp: LLAMA_ISA must be native, avx2 or avxvnni, not ${LLAMA_ISA}" >&2
    exit 2
    ;;
esac
# Keep only target names that exist in this llama.cpp version.
cmake -S "$DEST" -B "$DEST/$build" -DCMAKE_BUILD_TYPE=Release \
    "${isa_flags[@]}" -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_COMMIT="${COMMIT:0:9}" -DLLAMA_BUILD_NUMBER=0 >&2
# (Makefiles list "... name", Ninja lists "name: phony").
avail=$(cmake --build "$DEST/$build" --target help | sed -E 's/^\.\.\. //; s/:.*//; s/ .*//')
want=()
for t in $TARGETS; do
    if grep -qx "$t" <<<"$avail"; then want+=("$t"); else echo "skip: no target $t" >&2; fi
done
cmake --build "$DEST/$build" --config Release -j "$JOBS" --target "${want[@]}" >&2
echo "$DEST/$build/bin"
}
main "$@"
