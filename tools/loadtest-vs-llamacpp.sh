#!/usr/bin/env bash
# loadtest-vs-llamacpp.sh — concurrent serving throughput of quern vs llama.cpp's llama-server.
#
# For each round it starts one server on a free loopback port, waits for /health, runs
# tools/loadtest.sh against it, stops it, then does the same for the other (quern first,
# then llama.cpp, alternating per round so machine drift hits both):
#   llama.cpp: llama-server -m FILE -t 2 -np 16 -c 16384 --host 127.0.0.1 --port P
#   quern:     build/server/quern serve --model FILE --host 127.0.0.1 --port Q
# and prints requests/s, output tokens/s and TTFT/latency p50 for each, with quern/llama.cpp
# ratios (means over the rounds). Each server gets 2 short warm-up requests first. On a shared
# machine it waits (up to IDLE_WAIT s, default 60) for idle CPUs before each measurement and
# reports the % of all cores' time other processes took during it ("others %").
#
#   tools/loadtest-vs-llamacpp.sh [-n REQUESTS] [-c CONCURRENCY] [-t MAX_TOKENS] [--rounds R]
#                                 [--chat] [--logs DIR] [MODEL.gguf]
# Env: QUERN (quern binary), LLAMA_BIN (dir with llama-server; tools/build-llamacpp.sh),
#      QUERN_SERVE_ARGS / LLAMA_SERVER_ARGS (extra flags, word-split; e.g. QUERN_SERVE_ARGS=
#      "--precision f32"; the CPU default is q8), THREADS (default 2),
#      IDLE_WAIT (default 60).
set -euo pipefail

# One function, parsed whole before it runs: editing this file mid-run cannot derail a run.
main() {

ROOT=$(cd "$(dirname "$0")/.." && pwd)
QUERN=${QUERN:-$ROOT/build/server/quern}
LLAMA_BIN=${LLAMA_BIN:-$ROOT/third_party/llama.cpp/build/bin}
THREADS=${THREADS:-2}
LOADTEST=$ROOT/tools/loadtest.sh
n=64 c=16 t=128 rounds=1 chat=() logs=""
model=$ROOT/models/SmolLM2-135M-Instruct.Q4_1.gguf
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-2}"; }
while [[ $# -gt 0 ]]; do
    case $1 in
        -n) n=$2; shift 2 ;;
        -c) c=$2; shift 2 ;;
        -t) t=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --chat) chat=(--chat); shift ;;
        --logs) logs=$2; shift 2 ;;
        -h|--help) usage 0 ;;
        -*) echo "loadtest-vs-llamacpp: unknown option '$1'" >&2; usage ;;
        *) model=$1; shift ;;
    esac
done
log() { echo "loadtest-vs-llamacpp: $*" >&2; }
IDLE_WAIT=${IDLE_WAIT:-60}
ncpu=$(nproc)
# cpu_busy: busy and total jiffies of all CPUs so far (/proc/stat)
cpu_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }
# wait_idle: until the CPUs (a server idling counts) were < 10% busy over half a second
wait_idle() {
    local a b c d i
    for ((i = 0; i < IDLE_WAIT * 2; i++)); do
        read -r a b < <(cpu_busy); sleep 0.5; read -r c d < <(cpu_busy)
        if (( (c - a) * 10 < (d - b) )); then return 0; fi
    done
    log "CPUs still busy after ${IDLE_WAIT}s; measuring anyway"
}
# proc_jiffies PID: utime + stime of one process (the server: its threads included)
proc_jiffies() { awk '{ sub(/^.*\) /, ""); print $12 + $13 }' "/proc/$1/stat" 2>/dev/null || echo 0; }
[[ -f "$model" ]] || { log "no model $model"; exit 1; }
[[ -x "$LOADTEST" ]] || { log "no $LOADTEST"; exit 1; }
[[ -x "$LLAMA_BIN/llama-server" ]] || { log "no $LLAMA_BIN/llama-server (tools/build-llamacpp.sh)"; exit 1; }
[[ -x "$QUERN" ]] || { log "no $QUERN (build quern first)"; exit 1; }
if ! "$QUERN" serve --help >/dev/null 2>&1; then
    log "$QUERN has no 'serve' subcommand yet; nothing to compare"; exit 1
fi

work=$(mktemp -d)
server_pid=""
cleanup() {
    if [[ -n "$server_pid" ]]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
[[ -z "$logs" ]] || mkdir -p "$logs"

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# start_server NAME PORT: starts it in the background, sets server_pid, waits for /health
start_server() {
    local name=$1 port=$2 extra
    case $name in
        llama)
            read -r -a extra <<<"${LLAMA_SERVER_ARGS:-}"
            "$LLAMA_BIN/llama-server" -m "$model" -t "$THREADS" -np 16 -c 16384 \
                --host 127.0.0.1 --port "$port" "${extra[@]}" >"$work/$name.log" 2>&1 &
            ;;
        quern)
            read -r -a extra <<<"${QUERN_SERVE_ARGS:-}"
            "$QUERN" serve --model "$model" --threads "$THREADS" --host 127.0.0.1 --port "$port" \
                "${extra[@]}" >"$work/$name.log" 2>&1 &
            ;;
    esac
    server_pid=$!
    local i
    for ((i = 0; i < 240; i++)); do
        if ! kill -0 "$server_pid" 2>/dev/null; then
            log "$name exited during startup:"; tail -20 "$work/$name.log" >&2; server_pid=""; return 1
        fi
        if curl -sf --max-time 2 "http://127.0.0.1:$port/health" >/dev/null 2>&1; then return 0; fi
        sleep 0.5
    done
    log "$name did not become healthy in 120 s"; tail -20 "$work/$name.log" >&2
    return 1
}
stop_server() {
    [[ -n "$server_pid" ]] || return 0
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
}

# run_one NAME ROUND: one server, one loadtest; appends
# "name rps tps ttft50 lat50 others% non200" to results
run_one() {
    local name=$1 r=$2 port out rc=0 b0 t0 b1 t1 s0 s1 own w0 w1 others
    port=$(free_port)
    log "round $r: $name on port $port"
    start_server "$name" "$port" || { echo "$name - - - - - startup-failed" >>"$work/results"; return 0; }
    out=$work/$name.r$r.txt
    "$LOADTEST" -n 2 -c 1 -t 8 -u "http://127.0.0.1:$port" "${chat[@]}" >/dev/null 2>&1 || true
    wait_idle
    read -r b0 t0 < <(cpu_busy); s0=$(proc_jiffies "$server_pid"); w0=$EPOCHREALTIME
    # bash's `times` would miss the server; count the loadtest client as "own" via time
    { TIMEFORMAT='%U %S'; time "$LOADTEST" -n "$n" -c "$c" -t "$t" -u "http://127.0.0.1:$port" "${chat[@]}" \
        >"$out" 2>&1; } 2>"$work/time" || rc=$?
    read -r b1 t1 < <(cpu_busy); s1=$(proc_jiffies "$server_pid"); w1=$EPOCHREALTIME
    others=$(awk -v b="$((b1 - b0))" -v s="$((s1 - s0))" -v hz="$(getconf CLK_TCK)" -v w0="$w0" \
        -v w1="$w1" -v n="$ncpu" '{ own = $1 + $2 + s / hz }
        END { o = (b / hz - own) / ((w1 - w0) * n) * 100; printf "%.0f", o < 0 ? 0 : o }' "$work/time")
    log "others used ${others}% of the CPUs during the $name run"
    stop_server
    cat "$out" >&2
    [[ -z "$logs" ]] || cp "$out" "$work/$name.log" "$logs/" 2>/dev/null || true
    awk -v name="$name" -v rc="$rc" -v oth="$others" '
        /requests\/s/      { rps = $2 }
        /output tokens\/s/ { tps = $3 }
        /^ *TTFT/          { ttft = $3 }
        /^ *latency/       { lat = $3 }
        /non-200/          { bad = $2 }
        END { printf "%s %s %s %s %s %s %s\n", name, rps == "" ? "-" : rps, tps == "" ? "-" : tps,
                     ttft == "" ? "-" : ttft, lat == "" ? "-" : lat, oth, bad == "" ? "rc" rc : bad }' \
        "$out" >>"$work/results"
}

: >"$work/results"
for ((r = 1; r <= rounds; r++)); do
    if ((r % 2)); then run_one quern "$r"; run_one llama "$r"; else run_one llama "$r"; run_one quern "$r"; fi
done

echo "## serving: quern vs llama.cpp — $(basename "$model"), $n requests, concurrency $c, max_tokens $t, $THREADS threads, $rounds round(s)"
echo
echo "$("$ROOT/tools/cpu-info.sh")"
echo
echo "| server | requests/s | output tok/s | TTFT p50 s | latency p50 s | others % | non-200 |"
echo "|---|---|---|---|---|---|---|"
awk '
    function add(k, v) { if (v != "-") { s[$1, k] += v; m[$1, k]++ } }
    { add("rps", $2); add("tps", $3); add("ttft", $4); add("lat", $5); oth[$1] = oth[$1] " " $6
      bad[$1] = bad[$1] " " $7 }
    function avg(x, k) { return m[x, k] ? sprintf("%.3f", s[x, k] / m[x, k]) : "-" }
    END {
        printf "| quern | %s | %s | %s | %s |%s |%s |\n", avg("quern", "rps"), avg("quern", "tps"), avg("quern", "ttft"), avg("quern", "lat"), oth["quern"], bad["quern"]
        printf "| llama.cpp | %s | %s | %s | %s |%s |%s |\n", avg("llama", "rps"), avg("llama", "tps"), avg("llama", "ttft"), avg("llama", "lat"), oth["llama"], bad["llama"]
        r = "| quern/llama.cpp"
        split("rps tps ttft lat", ks, " ")
        for (i = 1; i <= 4; i++) {
            a = avg("quern", ks[i]); b = avg("llama", ks[i])
            r = r sprintf(" | %s", (a != "-" && b != "-" && b + 0 > 0) ? sprintf("%.2f", a / b) : "-")
        }
        print r " | | |"
    }' "$work/results"
}
main "$@"
