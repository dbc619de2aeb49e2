#!/usr/bin/env bash
# gpu-check: the CUDA backend's checks on a lent GPU machine (issue 6), in one call of under
# 8 minutes, so it can run twice within 15 minutes of device time.
#
#   1. environment: GPU, driver, nvcc, meson, python/torch versions
#   2. dependencies: the GPU machine has no apt and none of Check, cJSON, PCRE2, xxHash,
#      libmicrohttpd or pkg-config. Prepare them here first with tools/gpu-debs.sh (build-debs/,
#      carried); this script unpacks them into build-gpu-prefix/ (never into /)
#   3. build: meson setup build-gpu (-Dcuda=enabled, release), then only the targets the checks
#      need (the server is not built: libmicrohttpd's own dependencies may be missing there)
#   4. tests: test_cuda_pack, test_cuda_select, test_backend_ops (every op against the CPU
#      reference), then test_model and test_engine on the CUDA backend (QUERN_TEST_DEVICE=cuda:
#      the golden tests, batched = sequential in the engine, and test_model's CUDA cases in
#      tests/test_model_cuda.c: fp16 KV, MMA GEMM, graphs, batch invariance in passes; these
#      need models/SmolLM2-135M-Instruct.Q4_1.gguf, there or joined from build-model-a/b, see
#      tools/gpu-debs.sh --model); test_tp over NCCL when the machine has 2 GPUs or more
#   5. benchmark: tools/bench-cuda.c (copy bandwidth, GEMV GB/s, GEMM TFLOP/s, synthetic decode
#      and its per-op profile); then `quern bench` serving 256 requests at concurrency 64 on a
#      synthetic Llama-3-8B (when the server builds there; GPU_CHECK_SKIP_SERVING=1 skips it)
#   6. baselines in the same run: torch.matmul bf16 on the GEMM shapes, and Hugging Face
#      transformers generating with a Llama-3-8B-shaped random bf16 model at batch 1, 8 and 64
#
# Device tool calls (from the repository root here; the model is over the 64 MiB one call carries,
# so its halves travel in two calls to one warm machine, the second within its 30 s of warmth):
#   tools/gpu-debs.sh --model    # once, on the development machine
#   run(command: "true", carry: ["build-debs", "build-model-a"], timeout_s: 60)
#   run(command: "bash tools/gpu-check.sh", carry: ["build-debs", "build-model-b"], timeout_s: 560)
# Everything is also written to $OUT (the tool's return folder) when it is set, else
# build-gpu/out: gpu-check.md (all tables), build.log, tests.log, bench.md, torch.md.
#
# Environment: GPU_CHECK_BUDGET (seconds, default 470: every step's timeout is cut to fit),
# GPU_CHECK_QUICK=1 (bench --quick), GPU_CHECK_BENCH_ARGS (more bench arguments),
# GPU_CHECK_SKIP_TORCH=1, GPU_CHECK_SANITIZER=1 (the op tests once more under compute-sanitizer
# memcheck, and racecheck, when the budget allows).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
START=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-470}
OUTD=${OUT:-$ROOT/build-gpu/out}
mkdir -p "$OUTD"
REPORT=$OUTD/gpu-check.md
: >"$REPORT"

log() { printf '[gpu-check %3ds] %s\n' $(($(date +%s) - START)) "$*" | tee -a "$REPORT"; }
left() { echo $((START + BUDGET - $(date +%s))); }
# step timeout: min(wanted, what is left of the budget), at least 5 s
tmo() {
  local want=$1 l
  l=$(left)
  [ "$l" -lt "$want" ] && want=$l
  [ "$want" -lt 5 ] && want=5
  echo "$want"
}
STATUS=()
result() { STATUS+=("| $1 | $2 |"); log "$1: $2"; }

# ---- 1. environment ----
for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin /opt/cuda/bin; do
  [ -x "$d/nvcc" ] && export PATH="$d:$PATH" && break
done
# meson and ninja may be Python packages only (the torch venv): run them through python3 then
MESON=(meson)
command -v meson >/dev/null || MESON=(python3 -m mesonbuild.mesonmain)
if ! command -v ninja >/dev/null; then
  nb=$(python3 -c 'import ninja, os; print(os.path.join(ninja.BIN_DIR, "ninja"))' 2>/dev/null)
  if [ -n "$nb" ] && [ -x "$nb" ]; then
    PATH="$(dirname "$nb"):$PATH"
    export PATH
  fi
fi
{
  echo "# gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo '```'
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
    --format=csv 2>&1 | head -3
  command -v nvcc >/dev/null && nvcc --version | tail -2
  echo "meson $("${MESON[@]}" --version 2>&1), ninja $(ninja --version 2>&1), $(python3 --version 2>&1)"
  echo "gcc: $(gcc --version 2>&1 | head -1)"
  echo "pkg-config: $(command -v pkg-config || echo none)"
  ls -d /usr/local/cuda*/lib64/libcublas.so* 2>/dev/null | head -2
  echo '```'
} >>"$REPORT" 2>&1
cat "$REPORT"
command -v nvcc >/dev/null || { log "no nvcc on PATH: cannot build"; exit 1; }

# ---- 2. dependencies from carried .deb files ----
PREFIX=$ROOT/build-gpu-prefix
if ls build-debs/*.deb >/dev/null 2>&1; then
  rm -rf "$PREFIX"
  mkdir -p "$PREFIX"
  for f in build-debs/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$f" "$PREFIX"
    else # ar + tar, for a machine without dpkg
      tmpd=$(mktemp -d)
      (cd "$tmpd" && ar x "$ROOT/$f" && tar -xf data.tar.* -C "$PREFIX")
      rm -rf "$tmpd"
    fi
  done
  LIBD=$PREFIX/usr/lib/x86_64-linux-gnu
  # most .pc files derive their paths from prefix=/usr; libcjson's names /usr/... outright
  sed -i -E "s@^(prefix|libdir|includedir)=/usr(/|\$)@\1=$PREFIX/usr\2@" "$LIBD"/pkgconfig/*.pc
  # libmicrohttpd's .pc names gnutls for static links only; without the gnutls .pc pkg-config
  # refuses it, and the server (its only user) is not built here
  sed -i '/^Requires.private:/d' "$LIBD"/pkgconfig/libmicrohttpd.pc
  export PKG_CONFIG_PATH=$LIBD/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$LIBD${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LIBRARY_PATH=$LIBD${LIBRARY_PATH:+:$LIBRARY_PATH}
  export C_INCLUDE_PATH=$PREFIX/usr/include${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}
  if ! command -v pkg-config >/dev/null && [ -x "$PREFIX/usr/bin/pkgconf" ]; then
    export PKG_CONFIG=$PREFIX/usr/bin/pkgconf
  fi
  log "unpacked $(ls build-debs/*.deb | wc -l) packages into build-gpu-prefix/"
else
  log "no build-debs/ (run tools/gpu-debs.sh here and carry it): using the system's libraries"
fi

# the real model, when both halves were carried (tools/gpu-debs.sh --model)
MODEL=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$MODEL" ] && [ -f build-model-a/part ] && [ -f build-model-b/part ]; then
  mkdir -p models
  cat build-model-a/part build-model-b/part >"$MODEL.part"
  if [ -f build-model-b/sha256 ] &&
    [ "$(sha256sum "$MODEL.part" | cut -d' ' -f1)" != "$(cat build-model-b/sha256)" ]; then
    log "model halves do not match their sha256: model tests will be skipped"
    rm -f "$MODEL.part"
  else
    mv "$MODEL.part" "$MODEL"
    log "model joined from build-model-a/b"
  fi
fi

# ---- 3. build ----
TARGETS=(tests/test_cuda_pack tests/test_cuda_select tests/test_backend_ops
         tests/test_model tests/test_engine tests/test_tp tools/quern-bench-cuda)
{
  if [ -f build-gpu/build.ninja ]; then
    "${MESON[@]}" setup --reconfigure build-gpu -Dcuda=enabled
  else
    "${MESON[@]}" setup build-gpu --buildtype=release -Dcuda=enabled
  fi && timeout "$(tmo 300)" ninja -C build-gpu "${TARGETS[@]}"
} >"$OUTD/build.log" 2>&1
rc=$?
tail -5 "$OUTD/build.log"
if [ $rc -ne 0 ]; then
  result build "FAILED (rc $rc): see build.log"
  grep -E 'error|ERROR|Dependency .* found: NO' "$OUTD/build.log" | head -20 | tee -a "$REPORT"
  printf '\n| step | result |\n|---|---|\n' >>"$REPORT"
  printf '%s\n' "${STATUS[@]}" >>"$REPORT"
  exit 1
fi
result build "ok ($(grep -c 'Compiling\|Linking' "$OUTD/build.log") steps)"

# ---- 4. tests ----
export QUERN_MODEL=$MODEL QUERN_GOLDEN=$ROOT/tests/golden/smollm2.json
: >"$OUTD/tests.log"
for t in test_cuda_pack test_cuda_select test_backend_ops; do
  echo "==== $t" >>"$OUTD/tests.log"
  timeout "$(tmo 300)" "build-gpu/tests/$t" >>"$OUTD/tests.log" 2>&1
  rc=$?
  case $rc in
    0) result "$t" "passed" ;;
    77) result "$t" "SKIPPED: $(grep -m1 skipping "$OUTD/tests.log")" ;;
    124) result "$t" "TIMED OUT" ;;
    *) result "$t" "FAILED (rc $rc)" ;;
  esac
done
# the model and engine suites on the CUDA backend (tests/testbackend.h): golden logits and greedy
# text (fp32 KV, as on the CPU), batched = one at a time under chunked prefill and preemption
if [ -f "$MODEL" ]; then
  for t in test_model test_engine; do
    echo "==== $t (cuda)" >>"$OUTD/tests.log"
    kv=$([ $t = test_model ] && echo f32 || echo f16)
    QUERN_TEST_DEVICE=cuda CK_FORK=no QUERN_CUDA_KV=$kv timeout "$(tmo 240)" "build-gpu/tests/$t" \
      >>"$OUTD/tests.log" 2>&1
    rc=$?
    case $rc in
      0) result "$t on cuda" "passed" ;;
      124) result "$t on cuda" "TIMED OUT" ;;
      *) result "$t on cuda" "FAILED (rc $rc)" ;;
    esac
  done
fi
# tensor parallelism over NCCL (tests/test_tp.c): with 2-3 GPUs its two-rank case (bit-identical
# runs, the engine batched = alone), with 4 or more all of it (--tp 2/3/4 against --tp 1)
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "$NGPU" -ge 2 ] && [ -f "$MODEL" ]; then
  tp_case=$([ "$NGPU" -ge 4 ] && echo "" || echo tp2)
  echo "==== test_tp (cuda, $NGPU GPUs${tp_case:+, case $tp_case})" >>"$OUTD/tests.log"
  # an empty CK_RUN_CASE would select no case: set it only to name one
  env ${tp_case:+CK_RUN_CASE=$tp_case} QUERN_TEST_DEVICE=cuda CK_FORK=no timeout "$(tmo 240)" \
    build-gpu/tests/test_tp >>"$OUTD/tests.log" 2>&1
  rc=$?
  result "test_tp over NCCL ($NGPU GPUs${tp_case:+, case $tp_case})" \
    "$([ $rc = 0 ] && echo passed || echo "FAILED (rc $rc)")"
else
  result "test_tp over NCCL" "not run: this machine has $NGPU GPU; tensor parallelism needs 2"
fi
grep -E '^[0-9]+%:|worst|bit-exact|device:|backend:|batched:|skipped|:[0-9]+:[EF]:' \
  "$OUTD/tests.log" | head -80 | tee -a "$REPORT"

# compute-sanitizer over the op tests: memcheck (bad accesses), racecheck (shared-memory hazards,
# such as the staged attention kernel's per-warp buffers; slow: it may reach its cap)
if [ "${GPU_CHECK_SANITIZER:-0}" = 1 ] && command -v compute-sanitizer >/dev/null; then
  for tool in memcheck racecheck; do
    [ "$(left)" -gt 200 ] || break
    QUERN_MODEL=/nonexistent timeout "$(tmo 150)" compute-sanitizer --tool $tool \
      --error-exitcode 9 build-gpu/tests/test_backend_ops >"$OUTD/$tool.log" 2>&1
    rc=$?
    result "compute-sanitizer $tool (ops)" "$([ $rc = 0 ] && echo clean ||
      echo "rc $rc: $(grep -m3 -E 'Invalid|hazard|Race|ERROR' "$OUTD/$tool.log")")"
  done
fi

# ---- 5. benchmark ----
# --profile: the per-op table of the 8B decode step (where its time goes); GPU_CHECK_BENCH_ARGS
# adds more (--only decode: a rerun that needs only the decode tables)
BENCH_ARGS=(--profile)
[ "${GPU_CHECK_QUICK:-0}" = 1 ] && BENCH_ARGS+=(--quick)
# shellcheck disable=SC2206 # word splitting wanted: several arguments
[ -n "${GPU_CHECK_BENCH_ARGS:-}" ] && BENCH_ARGS+=(${GPU_CHECK_BENCH_ARGS})
[ -f "$MODEL" ] && BENCH_ARGS+=(--model "$MODEL")
timeout "$(tmo 200)" build-gpu/tools/quern-bench-cuda "${BENCH_ARGS[@]}" >"$OUTD/bench.md" 2>&1
rc=$?
result quern-bench-cuda "$([ $rc = 0 ] && echo ok || echo "rc $rc")"
cat "$OUTD/bench.md" >>"$REPORT"

# ---- 5b. serving: quern bench's requests through the engine on a synthetic 8B ----
# (issue 11's figure: 256 requests of 128 in / 128 out at concurrency 64, the default precision
# and q8 activations). The quern binary needs libmicrohttpd's own libraries (gnutls), which the
# machine may lack: a failed build is reported, not fatal.
if [ "${GPU_CHECK_SKIP_SERVING:-0}" != 1 ] && [ "$(left)" -gt 120 ]; then
  if timeout "$(tmo 120)" ninja -C build-gpu server/quern >build-gpu/build-quern.log 2>&1; then
    : >"$OUTD/serving.md"
    for prec in auto q8; do
      [ "$(left)" -gt 60 ] || break
      timeout "$(tmo 150)" build-gpu/server/quern bench --device cuda --synthetic llama3-8b \
        --precision $prec --requests 256 --input-len 128 --output-len 128 --concurrency 64 \
        >build-gpu/serving-$prec.txt 2>&1
      rc=$?
      { echo "## quern bench --device cuda --synthetic llama3-8b --precision $prec (rc $rc)"
        echo '```'; cat build-gpu/serving-$prec.txt; echo '```'; } >>"$OUTD/serving.md"
      result "serving, synthetic llama3-8b Q4_0, precision $prec" "$([ $rc = 0 ] &&
        grep -m1 'output tokens/s' build-gpu/serving-$prec.txt || echo "rc $rc")"
    done
    cat "$OUTD/serving.md" >>"$REPORT"
  else
    result "serving" "quern not built here: $(grep -m1 -iE 'error|cannot' build-gpu/build-quern.log)"
  fi
fi

# ---- 6. torch / transformers baselines, same GPU, same run ----
if [ "${GPU_CHECK_SKIP_TORCH:-0}" != 1 ] && [ "$(left)" -gt 40 ]; then
  PYTHONUNBUFFERED=1 timeout "$(tmo 150)" python3 - >"$OUTD/torch.md" 2>&1 <<'PY'
import time
import torch

dev = "cuda"
print("\n## baselines (torch %s, same GPU)\n" % torch.__version__)
print("| rows x cols | tokens | path | ms/call | TFLOP/s |\n|---|---|---|---|---|")
for rows, cols in [(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]:
    w = torch.randn(rows, cols, device=dev, dtype=torch.bfloat16)
    for n in (512, 4096):
        x = torch.randn(n, cols, device=dev, dtype=torch.bfloat16)
        for _ in range(3):
            y = x @ w.T
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(10):
            y = x @ w.T
        e1.record()
        torch.cuda.synchronize()
        ms = e0.elapsed_time(e1) / 10
        print(f"| {rows} x {cols} | {n} | torch.matmul bf16 | {ms:.2f} | "
              f"{2 * rows * cols * n / ms / 1e9:.1f} |", flush=True)
    del w, x, y
torch.cuda.empty_cache()

try:
    from transformers import LlamaConfig, LlamaForCausalLM
    import transformers

    cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                      max_position_embeddings=8192, rope_theta=500000.0)
    t0 = time.time()
    torch.set_default_dtype(torch.bfloat16)
    with torch.device(dev):
        model = LlamaForCausalLM(cfg)
    torch.set_default_dtype(torch.float32)
    model.eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    print(f"\n## Hugging Face transformers {transformers.__version__}, Llama-3-8B shape, "
          f"random bf16 (built in {time.time() - t0:.0f} s), context 128, greedy\n")
    print("| batch | ms/step | tokens/s |\n|---|---|---|")
    with torch.no_grad():
        for b in (1, 8, 64):
            ids = torch.randint(0, cfg.vocab_size, (b, 128), device=dev)
            model.generate(ids, max_new_tokens=2, min_new_tokens=2, do_sample=False)
            times = []
            for new in (1, 17):
                torch.cuda.synchronize()
                t = time.time()
                model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False)
                torch.cuda.synchronize()
                times.append(time.time() - t)
            step = (times[1] - times[0]) / 16
            print(f"| {b} | {step * 1e3:.2f} | {b / step:.0f} |", flush=True)
except Exception as e:  # the baseline is informative; its failure must not hide the rest
    print(f"transformers baseline failed: {type(e).__name__}: {e}")
PY
  rc=$?
  result "torch baselines" "$([ $rc = 0 ] && echo ok || echo "rc $rc")"
  cat "$OUTD/torch.md" >>"$REPORT"
else
  result "torch baselines" "skipped (budget or GPU_CHECK_SKIP_TORCH)"
fi

printf '\n## summary (%d s)\n\n| step | result |\n|---|---|\n' $(($(date +%s) - START)) >>"$REPORT"
printf '%s\n' "${STATUS[@]}" >>"$REPORT"
echo
cat "$OUTD/bench.md" "$OUTD/torch.md" 2>/dev/null
printf '\n| step | result |\n|---|---|\n'
printf '%s\n' "${STATUS[@]}"
if printf '%s\n' "${STATUS[@]}" | grep -q 'FAILED\|TIMED OUT'; then exit 1; fi
exit 0
