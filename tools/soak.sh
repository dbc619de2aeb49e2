#!/usr/bin/env bash
# Soak and overload test: quern serve against hundreds of hostile and broken clients at once.
#
#   tools/soak.sh [--no-setup] [--bin PATH] [--model PATH] [--duration SECONDS] [--clients N]
#                 [--seed N] [--log FILE] [--details] [-- extra quern serve args]
#
# Runs tools/setup.sh first (unless --no-setup), then tools/soak.py (Python 3 standard library
# only), which starts `quern serve` itself on 127.0.0.1 port 0 with a small KV pool (--ctx 256
# --kv-mem 12M --max-seqs 16 --max-queue 16 --max-batch-tokens 64 --max-connections 256
# --drain-timeout 10, and --request-timeout 5 --stall-timeout 5 --max-connections-per-client 0
# where serve --help lists them; args after -- come later and win). For --duration seconds
# (default 600, at most 600) it runs --clients (default 300) clients at once: well-behaved
# completions and chats (streamed, n>1, logprobs, long and short prompts), clients that
# disconnect on purpose, slow readers, idle connections and slow-loris, malformed requests, and
# a /health poll every 0.5 s. Then it prints one table and exits 0 only when: no KV blocks in
# use and nothing running or waiting at the end, /health never failed, well-behaved clients saw
# no transport error or timeout and no status but 200/429/503, and the daemon exited 0 after
# SIGTERM with no sanitizer report and never crashed.
# Defaults: --bin build/server/quern, --model: the daemon's default (models/SmolLM2-...gguf);
# --log: the daemon's output (default /tmp/quern-soak-PID.log); --details: outcomes per scenario.
# ASAN_OPTIONS defaults to detect_leaks=1 (for sanitizer builds; ignored otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."

setup=1 bin=build/server/quern model="" duration=600 clients=300 seed="" log="" details=0
usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
cmdline="$0${*:+ $*}"
while [ $# -gt 0 ]; do
  case $1 in
    --no-setup) setup=0; shift ;;
    --bin) bin=${2:?--bin wants a path}; shift 2 ;;
    --model) model=${2:?--model wants a path}; shift 2 ;;
    --duration) duration=${2:?--duration wants seconds}; shift 2 ;;
    --clients) clients=${2:?--clients wants a number}; shift 2 ;;
    --seed) seed=${2:?--seed wants a number}; shift 2 ;;
    --log) log=${2:?--log wants a path}; shift 2 ;;
    --details) details=1; shift ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) echo "soak: unknown option '$1'" >&2; usage ;;
  esac
done
int_in() { [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -ge "$2" ] && [ "$1" -le "$3" ]; }
int_in "$duration" 1 600 || { echo "soak: --duration wants 1..600 seconds" >&2; exit 2; }
int_in "$clients" 1 2000 || { echo "soak: --clients wants 1..2000" >&2; exit 2; }
[ -z "$seed" ] || int_in "$seed" 0 1073741823 ||
  { echo "soak: --seed wants 0..2^30-1" >&2; exit 2; }
command -v python3 >/dev/null || { echo "soak: needs python3" >&2; exit 2; }

if [ "$setup" -eq 1 ]; then
  tools/setup.sh
fi
[ -x "$bin" ] || { echo "soak: no executable at $bin (run tools/setup.sh)" >&2; exit 2; }
[ -z "$model" ] || [ -f "$model" ] || { echo "soak: no model at $model" >&2; exit 2; }

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
args=(--bin "$bin" --duration "$duration" --clients "$clients" --cmdline "$cmdline")
[ -z "$model" ] || args+=(--model "$model")
[ -z "$seed" ] || args+=(--seed "$seed")
[ -z "$log" ] || args+=(--log "$log")
[ "$details" -eq 0 ] || args+=(--details)
exec python3 -u tools/soak.py "${args[@]}" -- "$@"
