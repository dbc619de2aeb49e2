#!/usr/bin/env bash
# emu-check: runs the CUDA backend's kernels, as written, on the CPU (cuda_emu.h) under the
# conformance suite (tests/test_backend_ops.c): the logic of every kernel (indexing, block
# layouts, warp reductions, online softmax, Q8 quantization, batch invariance) is checked on a
# machine without a GPU. It proves nothing about the hardware: timing, memory-model races,
# register limits and the GPU's own libm are not emulated. meson runs the op tests the same way
# as test_backend_ops_emu; this script is for running it by hand, and for the whole-model tests.
#
#   kernels/cuda/emu/emu-check.sh [BUILD_DIR]   (default build; any configured meson build)
# Links the C libraries (quant, kernels, engine) of BUILD_DIR (not a sanitized one); builds into
# build-emu/ ($EMU_DIR, to run two at once). The op tests always run; the whole-model tests only
# with EMU_MODEL=1 (slow: about a second per forward; one case at a time with CK_RUN_CASE: model
# (golden logits and greedy text, ~2 min per prompt), model_kv16 (the fp16 KV cache),
# model_graphs (replayed steps = direct, ~1 min), model_invariance (F32 and Q8, about an hour);
# the model cases live in tests/test_model_cuda.c). Extra
# environment: EMU_TIMEOUT (seconds, default 3600), EMU_UBSAN=1 (UndefinedBehaviorSanitizer with
# its alignment check over the kernels and the test).
set -euo pipefail
cd "$(dirname "$0")/../../.."
B=${1:-build}
E=${EMU_DIR:-build-emu}
ninja -C "$B" engine/libquern_engine.a kernels/libquern_kernels.a quant/libquern_quant.a \
  >/dev/null
rm -rf "$E"
mkdir -p "$E/src" "$E/obj"
python3 kernels/cuda/emu/emu_rewrite.py "$E/src" kernels/cuda/*.cu
SAN=()
[ "${EMU_UBSAN:-0}" = 1 ] && SAN=("-fsanitize=undefined,alignment" -fno-sanitize-recover=all)
CXXFLAGS=(-std=c++17 -O2 -g -ffp-contract=off -DQUERN_HAVE_CUDA=1 -DQUERN_HAVE_CUBLAS=1
          -Ikernels/cuda/emu/include -Ikernels/cuda -Wall -Wextra -Wno-unknown-pragmas "${SAN[@]}")
for f in "$E"/src/*.cc; do
  g++ "${CXXFLAGS[@]}" -c "$f" -o "$E/obj/$(basename "$f" .cc).o" &
done
CFLAGS=(-std=c11 -O2 -g -D_GNU_SOURCE -pthread "${SAN[@]}")
gcc "${CFLAGS[@]}" -c kernels/cuda/cuda_pack.c -o "$E/obj/cuda_pack.o" &
gcc "${CFLAGS[@]}" -DQUERN_TEST_MODEL_CASES=1 -c tests/test_backend_ops.c -o "$E/obj/test.o" &
gcc "${CFLAGS[@]}" -c tests/testmodel.c -o "$E/obj/testmodel.o" &
gcc "${CFLAGS[@]}" -c tests/test_model_cuda.c -o "$E/obj/test_model_cuda.o" &
gcc "${CFLAGS[@]}" -c tests/testutil.c -o "$E/obj/testutil.o" &
wait
# shellcheck disable=SC2046
g++ "${SAN[@]}" -o "$E/test_backend_ops" "$E"/obj/*.o "$B/engine/libquern_engine.a" \
  "$B/kernels/libquern_kernels.a" "$B/quant/libquern_quant.a" \
  $(pkg-config --libs check libcjson libpcre2-8 libxxhash) -pthread -lm
if [ "${EMU_MODEL:-0}" = 1 ]; then
  export QUERN_MODEL=${QUERN_MODEL:-$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf}
  export QUERN_GOLDEN=$PWD/tests/golden/smollm2.json
else
  export QUERN_MODEL=/nonexistent
fi
timeout "${EMU_TIMEOUT:-3600}" stdbuf -oL "$E/test_backend_ops"
