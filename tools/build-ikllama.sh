#!/usr/bin/env bash
# build-ikllama.sh — build ik_llama.cpp's llama-bench, the CPU-tuned llama.cpp fork that issue 22
# asks quern to be measured against (run-time repacking: llama-bench -rtr 1).
#
# There is no package that carries its source, so give it one: IK_SRC is either a git directory
# (a clone, or a bare mirror such as the tool library's fetch of github:ikawrakow/ik_llama.cpp)
# or an unpacked source tree (blobs a mirror lacks are skipped and named). A git directory is exported at IK_REF (default HEAD) into
# third_party/ik_llama.cpp (git-ignored), with the commit in .ik-commit; a tree is copied there.
# Then llama-bench alone is built (Release, native ISA, static, no curl; flash attention for
# f16, q8_0 and q6_0 K/V only, as llama-bench's default f16 cache needs: with the 4-bit K/V
# types too the build had reached 8 % after 7 minutes): 23 minutes on a 2-core Zen 3 next to a
# llama.cpp build. Binaries end up in third_party/ik_llama.cpp/build/bin/; the path is printed
# last.
#
# IK_ISA=avx2 builds for AVX2 + FMA + F16C only (no AVX-512, no AVX-VNNI: what an AMD Zen 3
# runs) into build-avx2/, the peer for quern's AVX2 path forced on an AVX-512 machine
# (tools/bench-vs-llamacpp.sh --ik-isa avx2).
#
#   IK_SRC=/path/to/ik_llama.cpp[.git] [IK_REF=commit] [IK_ISA=native|avx2] [JOBS=N] \
#       tools/build-ikllama.sh
set -euo pipefail

main() {
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST="$ROOT/third_party/ik_llama.cpp"
JOBS=${JOBS:-$(nproc)}
: "${IK_SRC:?set IK_SRC to an ik_llama.cpp git directory or source tree}"
REF=${IK_REF:-HEAD}

IK_SRC=$(cd "$IK_SRC" && pwd)
# A git directory is a repository's top (or a bare mirror), never a folder inside another
# repository: third_party/ik_llama.cpp itself sits inside quern's checkout, and taking it for
# a git directory would export quern over it.
is_git_top() {
    [[ $(git -C "$1" rev-parse --is-bare-repository 2>/dev/null) == true ]] ||
        [[ $(git -C "$1" rev-parse --show-toplevel 2>/dev/null) == "$1" ]]
}

if [[ $IK_SRC == "$DEST" ]]; then
    [[ -f $DEST/CMakeLists.txt ]] || { echo "build-ikllama: $DEST holds no source" >&2; exit 1; }
    echo "== building the source already in $DEST" >&2
elif is_git_top "$IK_SRC"; then
    commit=$(git -C "$IK_SRC" rev-parse "$REF^{commit}")
    if [[ "$(cat "$DEST/.ik-commit" 2>/dev/null)" != "$commit" ]]; then
        echo "== exporting ik_llama.cpp $commit" >&2
        rm -rf "$DEST"
        mkdir -p "$DEST"
        # A shallow mirror may lack some large blobs (web UI assets, none that llama-bench needs):
        # export everything but those.
        local -a skip=()
        while read -r _ type obj path; do
            [[ $type == blob ]] && ! git -C "$IK_SRC" cat-file -e "$obj" 2>/dev/null &&
                skip+=(":(exclude)$path") && echo "skip: $path (not in $IK_SRC)" >&2
        done < <(git -C "$IK_SRC" ls-tree -r "$commit")
        git -C "$IK_SRC" archive "$commit" -- . "${skip[@]}" | tar -x -C "$DEST"
        echo "$commit" > "$DEST/.ik-commit"
    fi
elif [[ -f "$IK_SRC/CMakeLists.txt" ]]; then
    if [[ "$(cd "$IK_SRC" && pwd)" != "$DEST" ]]; then
        rm -rf "$DEST"
        mkdir -p "$ROOT/third_party"
        cp -a "$IK_SRC" "$DEST"
    fi
    [[ -f "$DEST/.ik-commit" ]] || echo unknown > "$DEST/.ik-commit"
else
    echo "build-ikllama: $IK_SRC is neither a git directory nor a source tree" >&2
    exit 1
fi
commit=$(cat "$DEST/.ik-commit")
local build=build
local -a isa=(-DGGML_NATIVE=ON)
case ${IK_ISA:-native} in
native) ;;
avx2)
    build=build-avx2
    isa=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON
        -DGGML_AVXVNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF
        -DGGML_AVX512_BF16=OFF)
    ;;
*)
    echo "build-ikllama: IK_ISA must be native or avx2, not ${IK_ISA}" >&2
    exit 2
    ;;
esac
echo "== ik_llama.cpp ${commit:0:9} (${IK_ISA:-native})" >&2
cmake -S "$DEST" -B "$DEST/$build" -DCMAKE_BUILD_TYPE=Release "${isa[@]}" \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_IQK_FA_ALL_QUANTS=OFF \
    -DLLAMA_BUILD_COMMIT="${commit:0:9}" -DLLAMA_BUILD_NUMBER=0 >&2
cmake --build "$DEST/$build" --config Release -j "$JOBS" --target llama-bench >&2
echo "$DEST/$build/bin"
}
main "$@"
