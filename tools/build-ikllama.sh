#!/usr/bin/env bash
# build-ikllama.sh — build ik_llama.cpp's llama-bench, the CPU-tuned llama.cpp fork that issue 22
# asks quern to be measured against (run-time repacking: llama-bench -rtr 1).
#
# There is no package that carries its source, so give it one: IK_SRC is either a git directory
# (a clone, or a bare mirror such as the tool library's fetch of github:ikawrakow/ik_llama.cpp)
# or an unpacked source tree (blobs a mirror lacks are skipped and named). A git directory is exported at IK_REF (default HEAD) into
# third_party/ik_llama.cpp (git-ignored), with the commit in .ik-commit; a tree is copied there.
# Then llama-bench alone is built (Release, native ISA, static, no curl): about 20 minutes on 2
# cores. Binaries end up in third_party/ik_llama.cpp/build/bin/; the path is printed last.
#
#   IK_SRC=/path/to/ik_llama.cpp[.git] [IK_REF=commit] [JOBS=N] tools/build-ikllama.sh
set -euo pipefail

main() {
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST="$ROOT/third_party/ik_llama.cpp"
JOBS=${JOBS:-$(nproc)}
: "${IK_SRC:?set IK_SRC to an ik_llama.cpp git directory or source tree}"
REF=${IK_REF:-HEAD}

if git -C "$IK_SRC" rev-parse --git-dir >/dev/null 2>&1; then
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
echo "== ik_llama.cpp ${commit:0:9}" >&2
cmake -S "$DEST" -B "$DEST/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_COMMIT="${commit:0:9}" -DLLAMA_BUILD_NUMBER=0 >&2
cmake --build "$DEST/build" --config Release -j "$JOBS" --target llama-bench >&2
echo "$DEST/build/bin"
}
main "$@"
