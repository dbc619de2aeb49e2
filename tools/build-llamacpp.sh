#!/usr/bin/env bash
# build-llamacpp.sh — build the llama.cpp peer that quern is benchmarked against.
#
# Source: the llama.cpp tree vendored in the llama-cpp-python sdist
# (vendor/llama.cpp), pinned by LLAMA_CPP_PYTHON_VERSION. It is extracted into
# third_party/llama.cpp (git-ignored) and built with CMake (Release, native ISA,
# no curl, no tests) into third_party/llama.cpp/build. Binaries end up in
# third_party/llama.cpp/build/bin/.
#
# Idempotent: the sdist is downloaded/extracted only if third_party/llama.cpp is
# missing or was extracted from a different version; cmake rebuilds only what
# changed.
#
# Env: LLAMA_CPP_PYTHON_VERSION (default 0.3.36), JOBS (default nproc),
#      LLAMA_TARGETS (default: llama-bench llama-batched-bench llama-server llama-quantize
#      llama-cli).
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

# Keep only target names that exist in this llama.cpp version.
cmake -S "$DEST" -B "$DEST/build" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_COMMIT="${COMMIT:0:9}" -DLLAMA_BUILD_NUMBER=0 >&2
# (Makefiles list "... name", Ninja lists "name: phony").
avail=$(cmake --build "$DEST/build" --target help | sed -E 's/^\.\.\. //; s/:.*//; s/ .*//')
want=()
for t in $TARGETS; do
    if grep -qx "$t" <<<"$avail"; then want+=("$t"); else echo "skip: no target $t" >&2; fi
done
cmake --build "$DEST/build" --config Release -j "$JOBS" --target "${want[@]}" >&2
echo "$DEST/build/bin"
}
main "$@"
