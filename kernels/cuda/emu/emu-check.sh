#!/usr/bin/env bash
# emu-check: runs the CUDA backend's kernels, as written, on the CPU (cuda_emu.h) under the
# conformance suite (tests/test_cuda_conformance.c): the logic of every kernel (indexing, block
# layouts, warp reductions, online softmax, Q8 quantization, batch invariance) is checked on a
# machine without a GPU. It proves nothing about the hardware: timing, memory-model races,
# register limits and the GPU's own libm are not emulated.
#
#   kernels/cuda/emu/emu-check.sh [BUILD_DIR]   (default build; any configured meson build)
# Links the C libraries (quant, kernels, engine) of BUILD_DIR; builds into build-emu/. The op
# tests always run; the whole-model tests only with EMU_MODEL=1 (slow: minutes per forward batch).
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${1:-build}
E=build-emu
[ -f "$B/engine/libquern_engine.a" ] || ninja -C "$B" engine/libquern_engine.a \
  kernels/libquern_kernels.a quant/libquern_quant.a >/dev/null
rm -rf "$E"
mkdir -p "$E/src" "$E/include" "$E/obj"
for h in cuda_runtime.h cuda_fp16.h cuda_bf16.h cublas_v2.h; do
  echo '#include "cuda_emu.h"' >"$E/include/$h"
done
# k<<<grid, block, smem, stream>>>(args);  ->  emu_launch(grid, block, [=] { k(args); });
python3 - "$E/src" kernels/cuda/*.cu <<'PY'
import os, re, sys
out, srcs = sys.argv[1], sys.argv[2:]
launch = re.compile(r"([A-Za-z_][\w]*(?:<[^<>;]*>)?)\s*<<<(.*?)>>>\s*\((.*?)\);", re.S)
def rewrite(m):
    # grid, block (the shared-memory size and stream are ignored)
    depth, parts, cur = 0, [], ""
    for ch in m.group(2):
        if ch in "([": depth += 1
        if ch in ")]": depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur); cur = ""
        else:
            cur += ch
    parts.append(cur)
    return "emu_launch(%s, %s, [=] { %s(%s); });" % (parts[0].strip(), parts[1].strip(),
                                                     m.group(1), m.group(3))
for f in srcs:
    s = open(f).read()
    s, n = launch.subn(rewrite, s)
    name = os.path.splitext(os.path.basename(f))[0]
    open(os.path.join(out, name + ".cc"), "w").write('#line 1 "%s"\n' % f + s)
    print("emu-check: %s: %d launches" % (f, n))
PY
CXXFLAGS=(-std=c++17 -O2 -g -ffp-contract=off -pthread -DQUERN_HAVE_CUDA=1 -DQUERN_HAVE_CUBLAS=1
          -I"$E/include" -Ikernels/cuda -Ikernels/cuda/emu -Wall -Wno-unused-function -Wno-unknown-pragmas)
for f in "$E"/src/*.cc; do
  g++ "${CXXFLAGS[@]}" -c "$f" -o "$E/obj/$(basename "$f" .cc).o" &
done
CFLAGS=(-std=c11 -O2 -g -D_GNU_SOURCE -DQUERN_HAVE_CUDA=1 -pthread)
gcc "${CFLAGS[@]}" -c kernels/cuda/cuda_pack.c -o "$E/obj/cuda_pack.o" &
gcc "${CFLAGS[@]}" -c tests/test_cuda_conformance.c -o "$E/obj/test.o" &
gcc "${CFLAGS[@]}" -c tests/testutil.c -o "$E/obj/testutil.o" &
wait
# shellcheck disable=SC2046
g++ -o "$E/test_cuda_conformance" "$E"/obj/*.o "$B/engine/libquern_engine.a" \
  "$B/kernels/libquern_kernels.a" "$B/quant/libquern_quant.a" \
  $(pkg-config --libs check libcjson libpcre2-8 libxxhash) -pthread -lm
if [ "${EMU_MODEL:-0}" = 1 ]; then
  export QUERN_MODEL=${QUERN_MODEL:-$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf}
  export QUERN_GOLDEN=$PWD/tests/golden/smollm2.json
else
  export QUERN_MODEL=/nonexistent
fi
timeout "${EMU_TIMEOUT:-3600}" stdbuf -oL "$E/test_cuda_conformance"
