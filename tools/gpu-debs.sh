#!/usr/bin/env bash
# gpu-debs: fetches, on the Debian development machine, the .deb files of the libraries the GPU
# machine lacks (it has no apt: no Check, cJSON, PCRE2, xxHash, libmicrohttpd, pkg-config) into
# build-debs/ (ignored by git through build-*/). Name that folder in the device tool's `carry`;
# tools/gpu-check.sh unpacks it into a prefix inside the working tree (never into /).
#
# Optionally (--model) also splits models/SmolLM2-135M-Instruct.Q4_1.gguf (98 MB, over the 64 MiB
# a call carries) into build-model-a/ and build-model-b/: carry build-model-a in one call (its
# command can be `true`), then build-model-b with the gpu-check.sh call, which joins the two
# halves (ignored paths stay on a warm machine between calls, and a machine stays warm only ~30 s
# after a call: make the second call at once) and runs the golden tests too.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(pkgconf-bin libpkgconf3 check libsubunit-dev libsubunit0 libpcre2-dev libpcre2-8-0
          libcjson-dev libcjson1 libxxhash-dev libxxhash0 libmicrohttpd-dev libmicrohttpd12)

mkdir -p build-debs
(cd build-debs && apt-get download "${PACKAGES[@]}" 2>&1 | { grep -v '^Get:' || true; })
ls build-debs/*.deb >/dev/null
printf 'gpu-debs: %s in build-debs/ (%s)\n' "$(ls build-debs/*.deb | wc -l) packages" \
  "$(du -sh build-debs | cut -f1)"

if [ "${1:-}" = "--model" ]; then
  m=models/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f "$m" ] || { echo "gpu-debs: $m missing (run tools/setup.sh)" >&2; exit 1; }
  mkdir -p build-model-a build-model-b
  half=$(( ($(stat -c %s "$m") + 1) / 2 ))
  head -c "$half" "$m" >build-model-a/part
  tail -c +$((half + 1)) "$m" >build-model-b/part
  sha256sum "$m" | cut -d' ' -f1 >build-model-b/sha256
  echo "gpu-debs: model split into build-model-a/part and build-model-b/part"
fi
