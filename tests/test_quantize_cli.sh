#!/usr/bin/env bash
# quern quantize and quern eval from the outside, on the real model: exit codes and one-line
# errors, files quern info and quern generate read, no partial file after any failure (also a
# real ENOSPC on a 1 MiB tmpfs where a mount namespace can be had), eval's statistics, and the
# gguf Python package (llama.cpp's own reader and reference quantizers) reading the output and
# agreeing byte for byte with our Q4_0 blocks, and its decoders the reference for the types
# quern converts on reading (tests/kquant_model.py). Needs QUERN_BIN and QUERN_MODEL (meson's env).
set -u
bin=${QUERN_BIN:?}
model=${QUERN_MODEL:?}
[ -f "$model" ] || { echo "skipping: no model at $model"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
text=/usr/share/common-licenses/GPL-3
if [ ! -f "$text" ]; then # not a Debian machine: any English prose of ~300 tokens will do
  for i in $(seq 1 40); do echo "The quick brown fox jumps over the lazy dog near the river bank."; done >"$tmp/text.txt"
  text=$tmp/text.txt
fi

fail() { echo "FAIL: $*"; fails=$((fails + 1)); }

# expect CODE PATTERN -- ARGS...: runs quern, checks the exit code and that stderr (or stdout,
# for code 0) matches PATTERN; errors must be short.
expect() {
  local code=$1 pattern=$2
  shift 3
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local out
  if [ "$code" -eq 0 ]; then out=$(cat "$tmp/out" "$tmp/err"); else out=$(cat "$tmp/err"); fi
  if [ "$rc" -ne "$code" ] || ! grep -qE -- "$pattern" <<<"$out"; then
    fail "quern ${*:0:160} -> exit $rc (want $code), wanted /$pattern/, output:"
    sed 's/^/    /' "$tmp/out" "$tmp/err" | head -20
  else
    echo "ok: quern ${*:0:160} -> $rc"
  fi
  if [ "$rc" -ne 0 ] && [ "$(wc -l <"$tmp/err")" -gt 3 ]; then
    fail "error output is not short for: quern $*"
  fi
}

# no_leftovers DIR: nothing named *.tmp.* in DIR
no_leftovers() {
  if ls -A "$1" | grep -q '\.tmp\.'; then fail "temporary file left in $1: $(ls -A "$1")"; else
    echo "ok: nothing left behind in $1"; fi
}

# ---- usage errors ----
expect 0 'usage: quern quantize' -- quantize --help
expect 0 'usage: quern eval' -- eval --help
expect 2 'are required' -- quantize --in "$model" --type q8_0
expect 2 "unknown --type 'q5_k'" -- quantize --in "$model" --out "$tmp/x.gguf" --type q5_k
expect 2 '--text is required' -- eval --model "$model"
expect 2 "--precision 'int3'" -- eval --model "$model" --text "$text" --precision int3

# ---- quantize the real model ----
# the scale search costs 30 s under the sanitizers: there (only) q8_0 rounds as llama.cpp does;
# test_quantize searches scales under them, and the release run compares its output with gguf-py's
q8_round=()
[ -n "${QUERN_SANITIZED:-}" ] && q8_round=(--rounding ref)
expect 0 'wrote .*q8_0.gguf \(Q8_0\)' -- quantize --in "$model" --out "$tmp/q8_0.gguf" --type q8_0 \
  "${q8_round[@]}"
expect 0 'wrote .*q4_0.gguf \(Q4_0\)' -- quantize --in "$model" --out "$tmp/q4_0.gguf" --type Q4_0 \
  --rounding ref
expect 0 '62 copied' -- quantize --in "$model" --out "$tmp/q4_0k.gguf" --type q4_0 --keep-output \
  --rounding ref
expect 2 "unknown --rounding 'best'" -- quantize --in "$model" --out "$tmp/x.gguf" --type q8_0 \
  --rounding best
no_leftovers "$tmp"
expect 0 'Q8_0 +211 tensors' -- info --model "$tmp/q8_0.gguf"
expect 0 'Q4_0 +211 tensors' -- info --model "$tmp/q4_0.gguf"
expect 0 'Q8_0 +1 tensors' -- info --model "$tmp/q4_0k.gguf" # token_embd kept as Q8_0
# a mixture of experts: its routers (ffn_gate_inp) stay float32, as llama-quantize keeps them,
# with the five norm vectors; the stacked experts are quantized
moe=$(dirname "$0")/fuzz/corpus/gguf/tiny-moe.gguf
expect 0 '8 converted, 6 copied' -- quantize --in "$moe" --out "$tmp/moe.gguf" --type q4_0
expect 0 'F32 +6 tensors' -- info --model "$tmp/moe.gguf"
expect 0 '4 experts of 32, 2 used' -- info --model "$tmp/moe.gguf"
expect 0 '' -- generate --model "$tmp/moe.gguf" --prompt "hi" -n 4 --temp 0 --threads 2
expect 0 'chat template chatml' -- info --model "$tmp/q4_0.gguf"
expect 0 'Paris' -- generate --model "$tmp/q8_0.gguf" --temp 0 -n 8 --prompt "The capital of France is"

# ---- failures leave nothing behind ----
expect 1 'cannot create' -- quantize --in "$model" --out "$tmp/no/such/dir/x.gguf" --type q8_0
mkdir "$tmp/isdir"
expect 1 'cannot rename' -- quantize --in "$model" --out "$tmp/isdir" --type q4_0 --rounding ref
no_leftovers "$tmp"
expect 1 'cannot open' -- quantize --in "$tmp/nope.gguf" --out "$tmp/x.gguf" --type q8_0
# a 2-D tensor with 40-element rows
python3 - "$tmp/odd.gguf" <<'EOF'
import struct, sys
def s(x): return struct.pack('<Q', len(x)) + x
b = b'GGUF' + struct.pack('<IQQ', 3, 1, 1)
b += s(b'general.architecture') + struct.pack('<I', 8) + s(b'llama')
b += s(b'blk.0.bad.weight') + struct.pack('<IQQIQ', 2, 40, 2, 0, 0)
b += b'\0' * (-len(b) % 32) + struct.pack('<80f', *[i / 80 for i in range(80)])
open(sys.argv[1], 'wb').write(b)
EOF
expect 1 "tensor 'blk.0.bad.weight' has rows of 40 elements" -- quantize --in "$tmp/odd.gguf" --out "$tmp/odd-q.gguf" --type q4_1
[ -e "$tmp/odd-q.gguf" ] && fail "a file was written for the odd tensor"
expect 0 'wrote' -- quantize --in "$tmp/odd.gguf" --out "$tmp/odd-f16.gguf" --type f16
# a real full disk: a 1 MiB tmpfs in a private mount namespace (root, or a user namespace)
mkdir "$tmp/small"
tried=
for u in "unshare -m" "unshare -rm"; do
  if $u true 2>/dev/null; then
    $u sh -c 'mount -t tmpfs -o size=1m none "$1" || exit 77
      "$2" quantize --in "$3" --out "$1/full.gguf" --type q4_0 --rounding ref 2>"$4/enospc.err"; rc=$?
      ls -A "$1" >"$4/enospc.ls"; exit $rc' sh "$tmp/small" "$bin" "$model" "$tmp"
    rc=$?
    [ "$rc" -eq 77 ] && continue
    tried=1
    if [ "$rc" -eq 1 ] && grep -q 'No space left on device' "$tmp/enospc.err" && [ ! -s "$tmp/enospc.ls" ]; then
      echo "ok: ENOSPC on a 1 MiB tmpfs -> exit 1, nothing left: $(cat "$tmp/enospc.err")"
    else
      fail "ENOSPC: exit $rc, files '$(cat "$tmp/enospc.ls")', stderr: $(cat "$tmp/enospc.err")"
    fi
    break
  fi
done
[ -n "$tried" ] || echo "skip: real ENOSPC (no mount namespace with a tmpfs here)"

# ---- eval: 2 windows of 128 tokens ----
ev=(--text "$text" --ctx 128 --chunks 2 --threads 2)
expect 0 'mean KL +0\.000000 ' -- eval --model "$model" --ref "$model" "${ev[@]}"
grep -qE 'top-1 agreement +100\.000 %' "$tmp/out" || fail "the model against itself: top-1 is not 100 %"
expect 0 'top-1 agreement' -- eval --model "$tmp/q8_0.gguf" --ref "$model" "${ev[@]}"
ppl=$(awk '$1 == "perplexity" {print $2}' "$tmp/out")
kl=$(awk '$1 == "mean" && $2 == "KL" {print $3}' "$tmp/out")
top=$(awk '$1 == "top-1" {print $3}' "$tmp/out")
echo "   q8_0 vs the Q4_1 file: ppl $ppl, mean KL $kl, top-1 $top %"
awk -v p="$ppl" -v k="$kl" -v t="$top" 'BEGIN { exit !(p > 1 && p < 100 && k >= 0 && k < 0.05 && t > 85) }' ||
  fail "q8_0 statistics out of range: ppl $ppl, KL $kl, top-1 $t"
expect 0 'perplexity +[0-9.]+ ' -- eval --model "$tmp/q4_0.gguf" --precision q8 "${ev[@]}"
expect 1 'cannot open' -- eval --model "$model" --text "$tmp/nope.txt"
expect 1 'exceeds the context length' -- eval --model "$model" --text "$text" --ctx 100000
echo "a few words" >"$tmp/short.txt"
expect 1 'fewer than one window' -- eval --model "$model" --text "$tmp/short.txt" --ctx 128

# ---- the gguf Python package reads our files (skipped when PyPI cannot be reached) ----
venv="$(dirname "$(dirname "$bin")")/venv-gguf"
py="$venv/bin/python"
if [ -n "${QUERN_SANITIZED:-}" ]; then
  # it reads the files the release run's quern wrote the same way; no quern code runs in it
  echo "skip: gguf package (the sanitized run checks quern, not the file format)"
elif [ ! -x "$py" ] && ! python3 -m venv "$venv" >/dev/null 2>&1; then
  echo "skip: gguf package (cannot create a venv)"
elif ! "$py" -c 'import gguf' 2>/dev/null &&
  ! "$py" -m pip install -q --retries 0 --timeout 15 gguf >"$tmp/pip.log" 2>&1; then
  echo "skip: gguf package (pip cannot reach PyPI): $(tail -1 "$tmp/pip.log")"
else
  if "$py" - "$model" "$tmp/q4_0.gguf" "$tmp/q8_0.gguf" <<'EOF'; then
import sys
import numpy as np
import gguf
from gguf import quants
src, q4, q8 = (gguf.GGUFReader(p) for p in sys.argv[1:4])
names = [t.name for t in src.tensors]
for r in (q4, q8):
    got = [t.name for t in r.tensors]
    assert got == names, "tensor list differs"
    assert r.fields["general.file_type"].contents() in (2, 7)
    assert r.fields["tokenizer.ggml.merges"].contents()[:3] == src.fields["tokenizer.ggml.merges"].contents()[:3]
print(f"gguf lists all {len(names)} tensors of both files")
st = {t.name: t for t in src.tensors}
same = blocks = 0
for t in q4.tensors:
    if t.tensor_type != gguf.GGMLQuantizationType.Q4_0:
        continue
    # llama.cpp's reference quantizer (gguf-py mirrors quantize_row_q4_0_ref) on the same floats
    x = quants.dequantize(st[t.name].data, st[t.name].tensor_type)
    want = quants.quantize(x, gguf.GGMLQuantizationType.Q4_0).reshape(-1, 18)
    got = np.asarray(t.data).reshape(-1, 18)
    same += int((want == got).all(axis=1).sum())
    blocks += got.shape[0]
assert blocks > 0 and same == blocks, f"{blocks - same} of {blocks} Q4_0 blocks differ from gguf-py"
print(f"all {blocks} Q4_0 blocks equal gguf-py's reference quantizer")
# q8_0.gguf has searched scales (the default): per block no larger squared error than
# llama.cpp's reference quantizer on the same floats, and far less in all
for name in ("blk.0.attn_q.weight", "blk.7.ffn_down.weight"):
    t = next(t for t in q8.tensors if t.name == name)
    y = quants.dequantize(t.data, t.tensor_type).reshape(-1, 32)
    x = quants.dequantize(st[name].data, st[name].tensor_type).reshape(-1, 32)
    r = quants.dequantize(quants.quantize(x.reshape(st[name].data.shape[0], -1),
                                          gguf.GGMLQuantizationType.Q8_0),
                          gguf.GGMLQuantizationType.Q8_0).reshape(-1, 32)
    e_search = ((y.astype(np.float64) - x) ** 2).sum(axis=1)
    e_ref = ((r.astype(np.float64) - x) ** 2).sum(axis=1)
    assert (e_search <= e_ref * (1 + 1e-6) + 1e-18).all(), int((e_search > e_ref * (1 + 1e-6) + 1e-18).sum())
    ratio = e_search.sum() / e_ref.sum()
    assert ratio < 0.5, ratio
    print(f"{name}: searched Q8_0 squared error {ratio:.3f} x llama.cpp's reference rounding")
EOF
    echo "ok: gguf Python package"
  else
    fail "gguf Python package check"
  fi
  # the types quern converts as it reads a file (Q5_0, Q5_1, Q4_K, Q5_K, Q6_K): the real model
  # with its first layers in them, against a copy holding gguf-py's decoding of those weights
  if "$py" "$(dirname "$0")/kquant_model.py" "$model" "$tmp/kq.gguf" "$tmp/kq_ref.gguf"; then
    expect 0 'Q4_K +2 tensors .*read as Q4_1' -- info --model "$tmp/kq.gguf"
    expect 0 'top-1 agreement' -- eval --model "$tmp/kq.gguf" --ref "$tmp/kq_ref.gguf" \
      --precision f32 "${ev[@]}"
    kl=$(awk '$1 == "mean" && $2 == "KL" {print $3}' "$tmp/out")
    top=$(awk '$1 == "top-1" {print $3}' "$tmp/out")
    echo "   converted types vs gguf-py's decoding: mean KL $kl, top-1 $top %"
    awk -v k="$kl" -v t="$top" 'BEGIN { exit !(k >= 0 && k < 0.002 && t >= 98) }' ||
      fail "converted types: mean KL $kl, top-1 $top % against gguf-py's decoding"
    expect 0 '' -- generate --model "$tmp/kq.gguf" --prompt "The capital of France is" -n 8 \
      --temp 0 --threads 2
    # two ranks read each converted tensor; the last frees it once packed (model.c release_host)
    expect 0 '' -- generate --model "$tmp/kq.gguf" --prompt "The capital of France is" -n 8 \
      --temp 0 --threads 1 --tp 2
  else
    fail "kquant_model.py could not write the converted-type model"
  fi
  rm -f "$tmp/kq.gguf" "$tmp/kq_ref.gguf"
fi

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all quantize/eval CLI checks passed"
