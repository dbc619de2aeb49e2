#!/usr/bin/env bash
# Load test for an OpenAI-compatible server (quern serve, llama-server, vLLM) with curl only.
#
#   tools/loadtest.sh [-n REQUESTS] [-c CONCURRENCY] [-t MAX_TOKENS] [-u URL] [-k KEY]
#                     [-p PROMPT] [-m MODEL] [--chat] [--no-ignore-eos] [--allow-remote]
#
# Sends REQUESTS streamed completions (each asks for usage), CONCURRENCY at a time, and prints
# requests/s, output tokens/s, latency and time-to-first-token percentiles (p50/p95/p99), and
# every non-200. TTFT is when the first chunk carrying text arrives (bash's $EPOCHREALTIME).
# Bounded on purpose: at most 100000 requests and 256 at once, and only loopback URLs unless
# --allow-remote. The API key comes from -k or $QUERN_API_KEY.
set -euo pipefail

n=100 c=8 max_tokens=64 url=http://127.0.0.1:8080 key=${QUERN_API_KEY:-} model="" chat=0
ignore_eos=true remote=0 prompt="Write a short story about a robot who learns to paint. Story"

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [ $# -gt 0 ]; do
  case $1 in
    -n) n=$2; shift 2 ;;
    -c) c=$2; shift 2 ;;
    -t) max_tokens=$2; shift 2 ;;
    -u) url=${2%/}; shift 2 ;;
    -k) key=$2; shift 2 ;;
    -p) prompt=$2; shift 2 ;;
    -m) model=$2; shift 2 ;;
    --chat) chat=1; shift ;;
    --no-ignore-eos) ignore_eos=false; shift ;;
    --allow-remote) remote=1; shift ;;
    -h|--help) usage 0 ;;
    *) echo "loadtest: unknown option '$1'" >&2; usage ;;
  esac
done
int_in() { [[ $1 =~ ^[0-9]+$ ]] && [ "$1" -ge "$2" ] && [ "$1" -le "$3" ]; }
int_in "$n" 1 100000 || { echo "loadtest: -n wants 1..100000" >&2; exit 2; }
int_in "$c" 1 256 || { echo "loadtest: -c wants 1..256" >&2; exit 2; }
int_in "$max_tokens" 1 100000 || { echo "loadtest: -t wants 1..100000" >&2; exit 2; }
command -v curl >/dev/null || { echo "loadtest: needs curl" >&2; exit 2; }
[ -n "${EPOCHREALTIME:-}" ] || { echo "loadtest: needs bash >= 5 (EPOCHREALTIME)" >&2; exit 2; }
host=$(sed -E 's#^[a-z]+://(\[[^]]*\]|[^/:]*).*#\1#' <<<"$url")
case $host in
  127.*|localhost|\[::1\]) ;;
  *) [ "$remote" -eq 1 ] || { echo "loadtest: $host is not loopback (--allow-remote)" >&2; exit 2; } ;;
esac
[ "$c" -le "$n" ] || c=$n

auth=()
[ -n "$key" ] && auth=(-H "Authorization: Bearer $key")
if [ -z "$model" ]; then
  model=$(curl -sS --max-time 10 "${auth[@]}" "$url/v1/models" 2>/dev/null |
    sed -nE 's/.*"data":\[\{[^}]*"id":"([^"]*)".*/\1/p') || true
  [ -n "$model" ] || model=default
fi
json_str() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }
if [ "$chat" -eq 1 ]; then
  path=/v1/chat/completions
else
  path=/v1/completions
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# one_request I: prints "status latency_s ttft_s completion_tokens"
one_request() {
  local i=$1 body t0 first="" status=000 tokens=0 line now
  if [ "$chat" -eq 1 ]; then
    body="{\"model\":$(json_str "$model"),\"messages\":[{\"role\":\"user\",\"content\":$(json_str "$prompt $i")}]"
  else
    body="{\"model\":$(json_str "$model"),\"prompt\":$(json_str "$prompt $i:")"
  fi
  body+=",\"max_tokens\":$max_tokens,\"temperature\":0.8,\"seed\":$i,\"ignore_eos\":$ignore_eos"
  body+=",\"stream\":true,\"stream_options\":{\"include_usage\":true}}"
  t0=$EPOCHREALTIME
  while IFS= read -r line; do
    case $line in
      'data: {'*'"usage":{'*)
        tokens=$(sed -nE 's/.*"completion_tokens":([0-9]+).*/\1/p' <<<"$line") ;;
      'data: {'*'"text":"'[!\"]*|'data: {'*'"content":"'[!\"]*)
        [ -n "$first" ] || first=$EPOCHREALTIME ;;
      '@status '*) status=${line#@status } ;;
    esac
  done < <(curl -sS -N --max-time 600 "${auth[@]}" -H 'Content-Type: application/json' \
             -d "$body" -w '\n@status %{http_code}\n' "$url$path" 2>/dev/null || true)
  now=$EPOCHREALTIME
  [ -n "$first" ] || first=$now
  awk -v s="$status" -v t0="$t0" -v f="$first" -v e="$now" -v k="${tokens:-0}" \
    'BEGIN { printf "%s %.4f %.4f %d\n", s, e - t0, f - t0, k }'
}

worker() {
  local w=$1 i
  for ((i = w; i < n; i += c)); do one_request "$i"; done >"$tmp/w$w"
}

echo "loadtest: $n requests, concurrency $c, max_tokens $max_tokens, ignore_eos $ignore_eos," \
     "model '$model', $url$path"
start=$EPOCHREALTIME
for ((w = 0; w < c; w++)); do worker "$w" & done
wait
end=$EPOCHREALTIME
cat "$tmp"/w* >"$tmp/all"

awk '$1 == "200" { print $2 }' "$tmp/all" | sort -g >"$tmp/lat"
awk '$1 == "200" { print $3 }' "$tmp/all" | sort -g >"$tmp/ttft"
# pct FILE: p50 p95 p99 of the sorted values in FILE
pct() {
  awk '{ v[NR] = $1 }
       function at(p,   k) { k = int(p * NR + 0.999999); if (k < 1) k = 1; return v[k] }
       END { if (NR) printf "p50 %.3f s  p95 %.3f s  p99 %.3f s", at(.50), at(.95), at(.99) }' "$1"
}
wall=$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')
awk -v wall="$wall" -v lat="$(pct "$tmp/lat")" -v ttft="$(pct "$tmp/ttft")" '
  { total++
    if ($1 == "200") { ok++; toks += $4 } else bad[$1]++ }
  END {
    printf "  wall time        %.2f s\n", wall
    printf "  requests/s       %.2f  (%d ok of %d)\n", ok / wall, ok, total
    printf "  output tokens/s  %.1f  (%d tokens)\n", toks / wall, toks
    if (ok) {
      printf "  latency          %s\n", lat
      printf "  TTFT             %s\n", ttft
    }
    nb = 0; line = ""
    for (s in bad) { nb += bad[s]; line = line sprintf(" %s x%d", s == "000" ? "no-response" : s, bad[s]) }
    printf "  non-200          %d%s\n", nb, line
    exit nb > 0
  }' "$tmp/all"
