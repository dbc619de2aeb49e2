#!/usr/bin/env bash
# The quern CLI from the outside: exit codes, one-line errors, a real generation, and a clean
# valgrind run. Needs QUERN_BIN and QUERN_MODEL (meson's test env).
set -u
bin=${QUERN_BIN:?}
model=${QUERN_MODEL:?}
[ -f "$model" ] || { echo "skipping: no model at $model"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0

# expect CODE PATTERN -- ARGS...: runs quern, checks the exit code and that stderr (or stdout,
# for code 0) matches PATTERN.
expect() {
  local code=$1 pattern=$2
  shift 3
  "$bin" "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local text
  if [ "$code" -eq 0 ]; then text=$(cat "$tmp/out"); else text=$(cat "$tmp/err"); fi
  if [ "$rc" -ne "$code" ] || ! grep -qE -- "$pattern" <<<"$text"; then
    echo "FAIL: quern ${*:0:120} -> exit $rc (want $code), output:"
    sed 's/^/    /' "$tmp/out" "$tmp/err" | head -20
    echo "    (wanted /$pattern/)"
    fails=$((fails + 1))
  else
    echo "ok: quern ${*:0:120} -> $rc"
  fi
  if [ "$rc" -ne 0 ] && [ "$(wc -l <"$tmp/err")" -gt 12 ]; then
    echo "FAIL: error output is not short for: quern $*"
    fails=$((fails + 1))
  fi
}

expect 2 'usage' -- 
expect 2 "unknown command 'frobnicate'" -- frobnicate
expect 0 'usage: quern generate' -- generate --help
expect 0 'usage: quern info' -- info --help
expect 2 '--prompt is required' -- generate --model "$model"
expect 2 "-n '-1'" -- generate --model "$model" --prompt hi -n -1
expect 2 "-n '99999999999'" -- generate --model "$model" --prompt hi -n 99999999999
expect 2 'not a number' -- generate --model "$model" --prompt hi --temp abc
expect 2 'unexpected argument' -- info --model "$model" extra

# quern grammar: a schema compiled, texts matched (exit 1 when one is not taken), --jsonl
printf '{"type":"object","properties":{"n":{"type":"integer","maximum":9}},"required":["n"]}' >"$tmp/s.json"
printf '{"n": 7}\n' >"$tmp/yes.json"
printf '{"n": 10}' >"$tmp/no.json"
expect 0 'yes.json: taken' -- grammar --source "$tmp/s.json" "$tmp/yes.json"
"$bin" grammar --source "$tmp/s.json" "$tmp/yes.json" "$tmp/no.json" >"$tmp/out" 2>&1
if [ $? -eq 1 ] && grep -q 'no.json: not taken' "$tmp/out"; then echo "ok: quern grammar: a text not taken -> 1"
else echo "FAIL: quern grammar with a text not taken:"; sed 's/^/    /' "$tmp/out"; fails=$((fails + 1)); fi
printf '{"source":{"contains":{}}}\n{"source":{"enum":["a"]},"texts":["\\"a\\"","\\"b\\""]}\n' >"$tmp/in.jsonl"
"$bin" grammar --jsonl "$tmp/in.jsonl" >"$tmp/out" 2>&1
if grep -q '"code":"unsupported".*contains' "$tmp/out" && grep -q '"takes":\[true,false\]' "$tmp/out"; then
  echo "ok: quern grammar --jsonl"
else echo "FAIL: quern grammar --jsonl:"; sed 's/^/    /' "$tmp/out"; fails=$((fails + 1)); fi
expect 2 "unknown --kind 'xml'" -- grammar --kind xml --source "$tmp/s.json"
expect 1 'exceeds the context length' -- generate --model "$model" --prompt hi -n 1000000
# --rope-scale / --rope-freq-base (llama.cpp's): checked, and the scale stretches the context
expect 2 '--rope-scale wants a number > 0' -- generate --model "$model" --prompt hi --rope-scale 0
expect 2 '--rope-freq-base wants a number > 0' -- generate --model "$model" --prompt hi \
  --rope-freq-base abc
expect 1 'context length of 8192 tokens' -- generate --model "$model" --prompt hi -n 9000
expect 1 'context length of 16384 tokens' -- generate --model "$model" --prompt hi -n 20000 \
  --rope-scale 2
expect 0 '' -- generate --model "$model" --prompt hi -n 2 --rope-scale 2 --rope-freq-base 50000
expect 1 'cannot open' -- generate --model "$tmp/nope.gguf" --prompt hi
expect 0 'architecture +llama' -- info --model "$model"
expect 0 'Q4_1 +210 tensors' -- info --model "$model"
expect 0 'chat template chatml' -- info --model "$model"
# 30 layers x K and V x 3 kv heads x 64: 11520 elements a token
expect 0 'KV cache +22\.5 KiB/token f16, 45\.0 f32, 12\.0 q8 \(180 MiB f16 at the full context\)' -- \
  info --model "$model"

head -c 4000000 "$model" >"$tmp/trunc.gguf"
expect 1 'truncated' -- generate --model "$tmp/trunc.gguf" --prompt hi
printf 'GGML%0100d' 0 >"$tmp/magic.gguf"
expect 1 'bad magic' -- info --model "$tmp/magic.gguf"
expect 1 'UTF-8' -- generate --model "$model" --prompt $'abc\xff\xfedef' -n 1
long=$(printf 'word %.0s' $(seq 1 9000))
expect 1 'exceeds the context length' -- generate --model "$model" --prompt "$long" -n 1

# --precision f32 is the reference path (transformers' greedy answer); the CPU's default, q8, picks
# another first token at this prompt's near-tie (logprob -1.97 vs -2.04), as llama.cpp does
expect 0 'Paris' -- generate --model "$model" --chat --temp 0 -n 24 --precision f32 \
  --prompt "What is the capital of France?"
# --chat-template: a format by name (ChatML without SmolLM2's default system prompt gives the
# same answer), a Jinja file of a known family, a misspelled name (the names listed)
expect 0 'Paris' -- generate --model "$model" --chat-template chatml --temp 0 -n 24 --precision f32 \
  --prompt "What is the capital of France?"
expect 0 '' -- generate --model "$model" --temp 0 -n 4 --prompt hi \
  --chat-template "$(dirname "$0")/golden/templates/deepseek-r1-distill-llama-8b.jinja"
expect 1 "--chat-template: chat template 'chatm1': not a known name \\(chatml, llama3" -- \
  generate --model "$model" --chat-template chatm1 --prompt hi -n 1
expect 1 'not recognized' -- generate --model "$model" --chat-template '{{ messages }}' --prompt hi -n 1
# --chat-template-kwargs: enable_thinking is the one key quern's formats read
expect 2 "quern's chat formats read only enable_thinking" -- serve --model "$model" \
  --chat-template-kwargs '{"thinking": true}'
expect 2 "enable_thinking must be true or false" -- serve --model "$model" \
  --chat-template-kwargs '{"enable_thinking": 0}'
expect 2 "wants a JSON object" -- serve --model "$model" --chat-template-kwargs '[false]'
# ... and on generate: Qwen3's format closes an empty <think> block after the generation prompt
# (9 more tokens: "<think>\n\n</think>\n\n")
prompt_tokens() { "$bin" generate --model "$model" --chat-template qwen3 --temp 0 -n 1 --prompt hi \
  "$@" 2>&1 >/dev/null | sed -n 's/.*prompt \([0-9]*\) tokens.*/\1/p'; }
n_on=$(prompt_tokens)
n_off=$(prompt_tokens --chat-template-kwargs '{"enable_thinking": false}')
if [ -n "$n_on" ] && [ -n "$n_off" ] && [ "$((n_off - n_on))" -eq 9 ]; then
  echo "ok: generate --chat-template-kwargs: $n_on prompt tokens, $n_off with thinking off"
else
  echo "FAIL: generate --chat-template-kwargs: '$n_on' prompt tokens, '$n_off' with thinking off"
  fails=$((fails + 1))
fi
expect 2 "read only enable_thinking" -- generate --model "$model" --chat-template-kwargs '{"x": 1}' \
  --prompt hi
# --lora: an adapter (tests/lorafix.h's, written by make_lora) changes the greedy answer, and at
# scale 0 changes nothing; files that are no adapter, and bad flags, are one-line errors
if [ -n "${QUERN_MAKE_LORA:-}" ] && "$QUERN_MAKE_LORA" "$model" "$tmp/ad.gguf"; then
  lora_gen() { "$bin" generate --model "$model" --chat --temp 0 -n 16 --precision f32 --no-stats \
    --prompt "What is the capital of France?" "$@" 2>/dev/null; }
  plain=$(lora_gen)
  adapted=$(lora_gen --lora "$tmp/ad.gguf")
  zero=$(lora_gen --lora-scaled "$tmp/ad.gguf" 0)
  if [ -n "$plain" ] && [ -n "$adapted" ] && [ "$plain" != "$adapted" ] && [ "$plain" = "$zero" ]; then
    echo "ok: generate --lora changes the answer, --lora-scaled FILE 0 does not"
  else
    echo "FAIL: generate --lora: plain '$plain', adapted '$adapted', scale 0 '$zero'"
    fails=$((fails + 1))
  fi
  expect 0 "adapter +lora for architecture llama" -- info --model "$tmp/ad.gguf"
  expect 1 "not a LoRA adapter \\(general.type" -- generate --model "$model" --lora "$model" \
    --prompt hi -n 1
  expect 1 "$tmp/nope.gguf: cannot open" -- generate --model "$model" --lora "$tmp/nope.gguf" \
    --prompt hi -n 1
  expect 1 "with tensor parallelism \\(--tp 2\\) are not supported" -- generate --model "$model" \
    --device cpu --tp 2 --lora "$tmp/ad.gguf" --prompt hi -n 1
  expect 2 "one --lora at a time" -- generate --model "$model" --lora a="$tmp/ad.gguf" \
    --lora b="$tmp/ad.gguf" --prompt hi
  expect 2 "--lora-scaled wants a file and a scale" -- generate --model "$model" \
    --lora-scaled "$tmp/ad.gguf" --prompt hi
  expect 2 "the name 'a b' may hold letters, digits" -- serve --model "$model" \
    --lora "a b=$tmp/ad.gguf"
  expect 2 "two adapters named 'ad'" -- serve --model "$model" --lora "$tmp/ad.gguf" \
    --lora "$tmp/ad.gguf"
  expect 2 "LoRA adapter 'smol' has the model's name" -- serve --model "$model" \
    --served-model-name smol --lora smol="$tmp/ad.gguf"
else
  echo "FAIL: QUERN_MAKE_LORA ('${QUERN_MAKE_LORA:-}') did not write an adapter"
  fails=$((fails + 1))
fi
expect 2 "--precision 'int4' is not auto, f32 or q8" -- generate --model "$model" --precision int4 --prompt hi
# the backend knobs a user may set (docs/ARCHITECTURE.md, "Knobs")
expect 2 "--kv-type wants f16, f32 or q8" -- generate --model "$model" --prompt hi --kv-type f8
# an int8 (Q8_0) cache is the CPU's alone: a CUDA device refuses it, built with CUDA or not
expect 1 "--device cuda --kv-type q8: the CUDA backend's KV cache is f16 or f32" -- generate \
  --model "$model" --device cuda --kv-type q8 -n 1 --prompt hi
# (the chat question's first token is a near-tie, logprobs -1.97 vs -2.04, that int8 K/V flips to
# "L'Étoile" as q8 activations do; the plain prompt's greedy answer is the same as fp32 K/V's)
expect 0 'The capital of France is Paris' -- generate --model "$model" --device cpu --temp 0 -n 12 \
  --kv-type q8 --precision f32 --prompt "The capital of France is"
expect 0 'Paris' -- generate --model "$model" --device cpu --chat --temp 0 -n 24 --kv-type f16 \
  --precision f32 --prompt "What is the capital of France?"
expect 2 "--gemm wants mma or cublas" -- serve --model "$model" --gemm fast
expect 0 'Paris' -- generate --model "$model" --device cpu --chat --temp 0 -n 24 --kv-type f32 \
  --precision f32 --prompt "What is the capital of France?"
QUERN_CPU_ISA=bogus expect 1 'QUERN_CPU_ISA=bogus' -- generate --model "$model" --device cpu --prompt hi
# --tp: the per-rank split, impossible splits refused, and the same greedy text as one rank
expect 0 'rank 1 +q heads 6-8, kv heads 2-2' -- info --model "$model" --tp 2
expect 2 "--tp '0'" -- generate --model "$model" --prompt hi --tp 0
expect 1 'at most 9 ranks' -- generate --model "$model" --device cpu --prompt hi -n 1 --tp 10
expect 0 'Paris' -- generate --model "$model" --device cpu --chat --temp 0 -n 24 --tp 2 \
  --precision f32 --prompt "What is the capital of France?"
# ... each rank quantizing its own kv heads' rows into an int8 cache
expect 0 'The capital of France is Paris' -- generate --model "$model" --device cpu --temp 0 -n 12 \
  --tp 2 --kv-type q8 --precision f32 --prompt "The capital of France is"
expect 0 '^Once upon a time' -- generate --model "$model" --temp 0.7 --seed 3 -n 8 --prompt "Once upon a time"
# the same seed gives the same text
"$bin" generate --model "$model" --temp 0.9 --seed 11 -n 12 --prompt "Hello" >"$tmp/a" 2>/dev/null
"$bin" generate --model "$model" --temp 0.9 --seed 11 -n 12 --prompt "Hello" >"$tmp/b" 2>/dev/null
if cmp -s "$tmp/a" "$tmp/b"; then echo "ok: seeded output repeats"; else
  echo "FAIL: seeded output differs"; fails=$((fails + 1)); fi

# --spec ngram: byte-identical to --spec off, greedy and seeded, on a prompt the output copies
expect 2 "--spec wants off, ngram or draft" -- generate --model "$model" --prompt hi --spec eagle
expect 2 "--spec-k wants 1..16" -- generate --model "$model" --prompt hi --spec-k 0
expect 2 "--spec-policy wants cost or acceptance" -- serve --model "$model" --spec ngram --spec-policy fast
expect 2 "--spec, --grounded and --lora apply to --requests runs" -- bench --model "$model" --pp 8 --tg 8 --spec ngram
expect 2 "--spec, --grounded and --lora apply to --requests runs" -- bench --model "$model" --pp 8 \
  --tg 8 --lora "$tmp/ad.gguf"
expect 0 'output tokens/s' -- bench --model "$model" --requests 4 --input-len 8 --output-len 4 \
  --lora "$tmp/ad.gguf" --lora b="$tmp/ad.gguf"
copy="Repeat this text exactly: The committee agreed that the annual budget would be reviewed every March, and that any member could propose changes in writing before the first of February."
# same_as_off LABEL PATTERN SAMPLING ARGS...: generate with ARGS gives $tmp/a's bytes (the
# --spec off text of SAMPLING) and its log matches PATTERN
same_as_off() {
  local label=$1 pattern=$2 s=$3
  shift 3
  # shellcheck disable=SC2086
  "$bin" generate --model "$model" --chat $s -n 40 "$@" --prompt "$copy" >"$tmp/b" 2>"$tmp/err"
  if cmp -s "$tmp/a" "$tmp/b" && grep -qE "$pattern" "$tmp/err"; then
    echo "ok: $label $s: the text of --spec off"
  else
    echo "FAIL: $label $s differs from --spec off or its log lacks /$pattern/"; fails=$((fails + 1))
    sed 's/^/    /' "$tmp/a" "$tmp/b" "$tmp/err" | head -20
  fi
}
for s in "--temp 0" "--temp 0.8 --seed 4"; do
  # shellcheck disable=SC2086
  "$bin" generate --model "$model" --chat $s -n 40 --spec off --prompt "$copy" >"$tmp/a" 2>/dev/null
  # the acceptance policy drafts whatever the clock says, so drafts must be accepted; the
  # default cost policy may draft nothing on a slow machine, but never changes the bytes
  same_as_off "--spec ngram (acceptance)" "spec ngram: [0-9]+ drafts, [1-9][0-9]* of" "$s" --spec ngram --spec-policy acceptance
  same_as_off "--spec ngram (cost)" "spec ngram: [0-9]+ drafts" "$s" --spec ngram --spec-policy cost
done

# --spec draft: the model quantized to Q4_0 drafting for itself gives the text of --spec off
"$bin" quantize --in "$model" --out "$tmp/draft.gguf" --type q4_0 >/dev/null 2>&1
# a --spec/--draft-model combination that cannot work is a usage error, before any model loads
expect 2 "--spec draft needs --draft-model PATH" -- generate --model "$model" --prompt hi --spec draft
expect 2 "--draft-model drafts only with --spec draft, not ngram" -- generate --model "$model" --prompt hi --spec ngram --draft-model "$tmp/draft.gguf"
expect 2 "quern serve: --spec draft needs --draft-model PATH" -- serve --model "$model" --spec draft
expect 2 "quern bench: --draft-model drafts only with --spec draft, not off" -- bench --model "$model" --requests 1 --input-len 4 --output-len 2 --spec off --draft-model "$tmp/draft.gguf"
expect 1 "--draft-model $tmp/nothing.gguf: " -- generate --model "$model" --prompt hi --draft-model "$tmp/nothing.gguf"
# bench --kernels times the model's own shapes in its own types (the Q4_0 copy's layers, where
# the default table has Q4_1) with the kernels $QUERN_CPU_ISA names, as every other command does;
# a batch over 512 tokens gives the other ops' attention a context its size (it overran a
# 512-position array, which the sanitized build's run of this test would catch)
kisa=native
if grep -qw avx2 /proc/cpuinfo; then kisa=avx2; fi
QUERN_CPU_ISA=${kisa/native/auto} expect 0 'attn_q/o 576x576 +Q4_0 ' -- bench --kernels --threads 1 --precision q8 \
  --batches 1,520 --model "$tmp/draft.gguf" --pp 16 --tg 2
if [ "$kisa" = avx2 ] && ! grep -q '^matmul, avx2, Q8 activations' "$tmp/out"; then
  echo "FAIL: bench --kernels did not take QUERN_CPU_ISA=avx2"; fails=$((fails + 1))
fi
if ! grep -Eq "^30 layers' KV \([0-9]+ MB\) +[0-9.]+ +[0-9.]+ +[0-9.]+$" "$tmp/out"; then
  echo "FAIL: bench --kernels printed no decode-batch attention row"; fails=$((fails + 1))
fi
QUERN_CPU_ISA=bogus expect 2 'QUERN_CPU_ISA=bogus: want scalar, avx2, avxvnni, avx512, amx or auto' -- bench --kernels
# its numbers are checked before it runs (it took 0, -5 and 'abc' as batches and printed tables)
expect 2 "--batches '1,0': want up to 16 token counts in 1..8192" -- bench --kernels --batches 1,0
expect 2 "--threads 'x': want 1..1024" -- bench --kernels --threads x
for s in "--temp 0" "--temp 0.8 --seed 4"; do
  # shellcheck disable=SC2086
  "$bin" generate --model "$model" --chat $s -n 40 --spec off --prompt "$copy" >"$tmp/a" 2>/dev/null
  same_as_off "--spec draft (acceptance)" "spec draft: [0-9]+ drafts, [1-9][0-9]* of" "$s" --draft-model "$tmp/draft.gguf" --spec-policy acceptance
  same_as_off "--spec draft (cost)" "spec draft: [0-9]+ drafts" "$s" --draft-model "$tmp/draft.gguf" --spec-policy cost
done

# same_text_as ISA BASE PROMPT: where this CPU runs ISA, its greedy text for PROMPT is BASE's
same_text_as() {
  if QUERN_CPU_ISA=$1 "$bin" generate --model "$model" -n 24 --temp 0 --threads 2 \
      --prompt "$3" >"$tmp/isa_$1" 2>/dev/null; then
    QUERN_CPU_ISA=$2 "$bin" generate --model "$model" -n 24 --temp 0 --threads 2 \
      --prompt "$3" >"$tmp/isa_$2" 2>/dev/null
    if cmp -s "$tmp/isa_$2" "$tmp/isa_$1" && [ -s "$tmp/isa_$1" ]; then
      echo "ok: QUERN_CPU_ISA=$1: the text of $2"
    else
      echo "FAIL: QUERN_CPU_ISA=$1 generates other text than $2"; fails=$((fails + 1))
    fi
  fi
}
# the avxvnni path is the avx2 one but for its q8 matmul, bit-exact against the reference as the
# avx2 one is: the same greedy text, where this CPU has AVX-VNNI (other ISAs' attention and
# norms sum in other orders, within 1e-5: their text may differ a few tokens in)
same_text_as avxvnni avx2 "The capital of France is"
# likewise the amx path is the avx512 one but for the q8 matmul of 32 or more tokens (a prompt of
# about 40 here)
same_text_as amx avx512 "$copy"

# --device: a bad name is a usage error; cuda without a usable GPU (or without CUDA in the
# build) is a runtime error naming why; auto falls back to the CPU and says so
expect 2 "--device 'tpu': want auto, cpu, cuda or cuda:N" -- generate --model "$model" --device tpu -n 1 --prompt hi
expect 2 "want auto, cpu, cuda or cuda:N" -- generate --model "$model" --device cuda:x -n 1 --prompt hi
# backend_line DEVICE PATTERN: the one log line naming the backend
backend_line() {
  local dev=$1 want=$2; shift 2
  if "$bin" generate --model "$model" --device "$dev" -n 1 --prompt hi "$@" 2>&1 >/dev/null |
      grep -qE "^quern generate: backend: $want"; then
    echo "ok: --device $dev $* logs 'backend: $want'"
  else
    echo "FAIL: --device $dev $* does not log /backend: $want/"; fails=$((fails + 1))
  fi
}
if ! nvidia-smi >/dev/null 2>&1; then
  expect 1 'cuda' -- generate --model "$model" --device cuda -n 1 --prompt hi
  backend_line auto 'cpu \(auto: .+\), [a-z0-9]+ kernels, q8 activations, f16 KV$'
fi
# the CPU's default precision is q8 (--precision auto) with an fp16 KV cache; f32 (and an fp32
# cache) when asked; --kv-type wins either way
backend_line cpu 'cpu, [a-z0-9]+ kernels, q8 activations, f16 KV$'
backend_line cpu 'cpu, [a-z0-9]+ kernels, f32 activations, f32 KV$' --precision f32
backend_line cpu 'cpu, [a-z0-9]+ kernels, q8 activations, f16 KV$' --precision auto
backend_line cpu 'cpu, [a-z0-9]+ kernels, q8 activations, f32 KV$' --kv-type f32
backend_line cpu 'cpu, [a-z0-9]+ kernels, f32 activations, f16 KV$' --precision f32 --kv-type f16
backend_line cpu 'cpu, [a-z0-9]+ kernels, q8 activations, q8 KV$' --kv-type q8
backend_line auto 'cpu \(auto: --kv-type q8 is the CPU.s\), [a-z0-9]+ kernels, q8 activations, q8 KV$' --kv-type q8

# quern bench --synthetic: random weights of a named shape, made here (engine/synth.h)
expect 2 "--synthetic 'gpt5'" -- bench --synthetic gpt5 --pp 8 --tg 2
expect 2 "--type 'q5_k'" -- bench --synthetic smollm2-135m --type q5_k --pp 8 --tg 2
expect 0 '\| tg4 \|' -- bench --synthetic smollm2-135m --type q4_1 --pp 16 --tg 4 --reps 1 --device cpu
# --write-model keeps the file (for llama-bench beside quern): a GGUF quern opens again
expect 2 '--write-model PATH needs --synthetic NAME' -- bench --write-model "$tmp/s.gguf" --pp 8 --tg 2
expect 0 "^wrote $tmp/s.gguf: synthetic smollm2-135m, Q4_0" -- bench --synthetic smollm2-135m --write-model "$tmp/s.gguf"
expect 0 '\| tg2 \|' -- bench --model "$tmp/s.gguf" --pp 8 --tg 2 --reps 1 --device cpu
expect 1 'cannot' -- bench --synthetic smollm2-135m --write-model "$tmp/no/such/dir/s.gguf"
rm -f "$tmp/s.gguf"
# with two threads, how long the caller waited at the jobs' ends (threadpool.h, pool_stats)
expect 0 '^pool, tg4: [1-9][0-9]*\.[0-9] jobs a step; the caller ran [0-9.]+ % of their tasks, then waited .* [0-9.]+ % of the time' -- bench --model "$model" --pp 16 --tg 4 --reps 1 --threads 2 --device cpu
# B sequences decoding together through the forward (engine/bench_decode.h)
expect 0 '^\| 3 \| 20 \| [0-9.]+ \| [0-9.]+ \|' -- bench --model "$model" --decode-batches 1,3 --pp 20 --tg 3 --device cpu
expect 0 '"decode": \[\{"batch": 2, .*"tokens_per_s": [1-9]' -- bench --model "$model" --decode-batches 2 --pp 8 --tg 2 --device cpu --json
expect 2 "--decode-batches '0,4'" -- bench --model "$model" --decode-batches 0,4
# --batch-invariant: accepted everywhere; the CPU always is (the same greedy text)
expect 0 'Paris' -- generate --model "$model" --prompt "The capital of France is" -n 4 --temp 0 --batch-invariant --device cpu
# --trace: the engine's steps and requests as a Chrome trace, checked against its own counters
# (a pool small enough to preempt)
expect 0 'engine steps' -- bench --model "$model" --requests 6 --input-len 60 --output-len 20 \
  --concurrency 3 --kv-mem 8 --max-batch-tokens 32 --device cpu --threads 2 --trace "$tmp/trace.json"
if python3 "$(dirname "$0")/check_trace.py" "$tmp/trace.json" 6; then
  echo "ok: the bench trace holds together"
else
  fails=$((fails + 1))
fi
expect 0 'prefill 16 tokens: .* tokens/s' -- bench --kernels --no-kernels --threads 1 --model "$model" --pp 16 --tg 2
# generate --trace: each forward a step (its sampling inside), the run one request
expect 0 '^Once upon a time' -- generate --model "$model" --prompt "Once upon a time" -n 20 --temp 0 \
  --device cpu --threads 2 --trace "$tmp/gtrace.json"
if python3 "$(dirname "$0")/check_trace.py" "$tmp/gtrace.json" 1; then
  echo "ok: the generate trace holds together"
else
  echo "FAIL: the generate trace"; fails=$((fails + 1))
fi
# NVTX (a build with the CUDA toolkit's header): with a tool attached, engine steps hold forward
# ranges, forwards one range per layer, layers their ops; ranges nest on every thread
if [ -n "${QUERN_NVTX_INJECT:-}" ]; then
  if NVTX_INJECTION64_PATH=$QUERN_NVTX_INJECT QUERN_NVTX_LOG=$tmp/nvtx.log "$bin" bench \
      --model "$model" --device cpu --threads 2 --requests 3 --input-len 24 --output-len 6 \
      --concurrency 2 >"$tmp/nvtx.out" 2>&1 &&
      grep -q 'NVTX ranges per op' "$tmp/nvtx.out" &&
      python3 "$(dirname "$0")/check_nvtx.py" "$tmp/nvtx.log" 30; then
    echo "ok: NVTX ranges seen by an injected tool"
  else
    echo "FAIL: NVTX ranges"; tail -5 "$tmp/nvtx.out"; fails=$((fails + 1))
  fi
else
  echo "skip: NVTX (this build has no NVTX header)"
fi
# --profile: every op timed, one row per matmul shape; q, k and v run as one job (the row of its
# first weight, wq: 1 a layer), wo alone
expect 0 '^\| matmul_shared \| 576x576 Q4_1 \| 30\.0 \|' -- bench --model "$model" --device cpu \
  --threads 2 --pp 32 --tg 4 --reps 1 --profile
grep -qE '^\| matmul \| 576x576 Q4_1 \| 30\.0 \|' "$tmp/out" && echo "ok: --profile: wo its own row" ||
  { echo "FAIL: --profile: no row for wo"; fails=$((fails + 1)); }
expect 1 'not with --tp' -- bench --model "$model" --device cpu --pp 8 --tg 2 --tp 2 --profile
# ... and per batch of --decode-batches, its timed steps alone (the JSON stays one object)
expect 0 '^decode, batch 2, context 8, 2 steps: [0-9.]+ ms per step' -- bench --model "$model" \
  --device cpu --threads 2 --decode-batches 2 --pp 8 --tg 2 --profile
expect 0 '^\{"context": 8, "steps": 2, .*"decode": \[\{"batch": 2, ' -- bench \
  --model "$model" --device cpu --decode-batches 2 --pp 8 --tg 2 --profile --json
if python3 -c 'import json, sys; json.load(sys.stdin)' <"$tmp/out"; then
  echo "ok: --decode-batches --profile --json prints JSON alone"
else
  echo "FAIL: --decode-batches --profile --json is not one JSON document"; fails=$((fails + 1))
fi
expect 1 'not with --tp' -- bench --model "$model" --device cpu --decode-batches 2 --tp 2 --profile

# valgrind on the CPU path (--device cpu; the CUDA device probe is test_cuda_select's), with no
# suppressions: quern links only the CUDA runtime (cuBLAS is opened only for its GEMM path)
if [ -z "${QUERN_SANITIZED:-}" ] && command -v valgrind >/dev/null; then
  if valgrind --quiet --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite,indirect \
      "$bin" generate --model "$model" --device cpu --threads 2 --temp 0 -n 3 --prompt "Hi there" \
      >"$tmp/vg.out" 2>"$tmp/vg.err"; then
    echo "ok: valgrind clean"
  else
    echo "FAIL: valgrind:"; tail -30 "$tmp/vg.err"; fails=$((fails + 1))
  fi
fi

[ "$fails" -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "all CLI checks passed"
