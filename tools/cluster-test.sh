#!/usr/bin/env bash
# cluster-test.sh — three quern replicas on 127.0.0.1 behind HAProxy (deploy/haproxy.cfg, with
# this run's ports), driven by tools/cluster_load.py: multi-turn chats whose turns share a
# prefix (a long system prompt per chat).
#
#   1. round robin (no X-Session-Id): prefix-cache hit rate and output tokens/s
#   2. session affinity (X-Session-Id hashed consistently), other chats: the same figures
#   3. session affinity again, and a third of the way in one replica is SIGKILLed and restarted
#      two seconds later: every request that had not begun its answer must be retried by HAProxy
#      and answered; a stream already begun is cut (the client sees no [DONE]); none may hang
#
# Prints a markdown table; exits 1 when phase 3 loses a request that had not begun, when any
# request hangs, or when affinity does not raise the hit rate above round robin's.
#   tools/cluster-test.sh [--short] [--no-setup]     (--short: fewer chats, for tools/test.sh)
# HAProxy comes from Debian (installed here when missing); the model and build from setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
sessions=12 turns=3 setup=1
for a in "$@"; do
  case $a in
    --short) sessions=4 ;;
    --no-setup) setup=0 ;;
    *) echo "usage: tools/cluster-test.sh [--short] [--no-setup]" >&2; exit 2 ;;
  esac
done
[ "$setup" -eq 0 ] || tools/setup.sh
if ! command -v haproxy >/dev/null; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "cluster-test: installing haproxy" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq haproxy >/dev/null
fi
bin=$PWD/build/server/quern
model=$PWD/models/SmolLM2-135M-Instruct.Q4_1.gguf
work=$(mktemp -d)
# below the kernel's ephemeral range (32768-60999 by default), where a client socket of this or
# another test may hold the port at the moment HAProxy binds it (one CI run's HAProxy never
# answered on 39196)
base=$((20000 + RANDOM % 12000))
router=$base
pids=()
cleanup() {
  for f in "$work"/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true; done
  [ -z "${KEEP_LOGS:-}" ] && rm -rf "$work" || echo "cluster-test: logs kept in $work" >&2
}
trap cleanup EXIT

# start_cmd K: the shell command that starts replica K (also what phase 3 runs to restart it)
start_cmd() {
  echo "$bin serve --model $model --host 127.0.0.1 --port $((base + $1)) --threads 1" \
    "--kv-mem 96M --max-seqs 8 --drain-timeout 2 >>$work/q$1.log 2>&1 & echo \$! >$work/q$1.pid"
}
wait_ready() {
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$1/health/ready" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "cluster-test: 127.0.0.1:$1 never became ready" >&2; return 1
}
for k in 1 2 3; do sh -c "$(start_cmd $k)"; done
for k in 1 2 3; do wait_ready $((base + k)); done
sed -e "s/127.0.0.1:8000/127.0.0.1:$router/" -e "s/127.0.0.1:8081/127.0.0.1:$((base + 1))/" \
  -e "s/127.0.0.1:8082/127.0.0.1:$((base + 2))/" -e "s/127.0.0.1:8083/127.0.0.1:$((base + 3))/" \
  -e 's/^global$/global\n    log stdout format raw local0/' \
  -e 's/^defaults$/defaults\n    log global\n    option httplog/' \
  deploy/haproxy.cfg >"$work/haproxy.cfg"
# started from a subshell, so this shell never reports its death at cleanup
(haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 & echo $! >"$work/haproxy.pid")
up=0
for _ in $(seq 1 100); do
  curl -s -o /dev/null "http://127.0.0.1:$router/health" && { up=1; break; }
  sleep 0.1
done
if [ "$up" -eq 0 ]; then
  echo "cluster-test: FAIL: HAProxy never answered on 127.0.0.1:$router; its log:" >&2
  sed 's/^/  /' "$work/haproxy.log" >&2
  exit 1
fi

reps="http://127.0.0.1:$((base + 1)),http://127.0.0.1:$((base + 2)),http://127.0.0.1:$((base + 3))"
load() { python3 tools/cluster_load.py --router "http://127.0.0.1:$router" --replicas "$reps" \
  --sessions "$sessions" --turns "$turns" --concurrency 4 "$@"; }
echo "cluster-test: 3 replicas on ports $((base + 1))-$((base + 3)), HAProxy on $router;" \
  "$sessions chats x $turns turns per phase" >&2
load --mode none --first 0 >"$work/rr.json"
load --mode session --first 100 >"$work/sess.json"
load --mode session --first 200 --kill-pid-file "$work/q2.pid" --restart-cmd "$(start_cmd 2)" \
  >"$work/kill.json"
python3 - "$work/rr.json" "$work/sess.json" "$work/kill.json" "$work/haproxy.log" <<'PY'
import json, re, sys
rr, se, kl = (json.load(open(p)) for p in sys.argv[1:4])
# HAProxy's httplog: after the 4-letter termination state, "%ac/%fc/%bc/%sc/%rc", the last the
# request's retries ("+N" when it was redispatched to another server)
retried = sum(1 for line in open(sys.argv[4], errors="replace")
              if (m := re.search(r" [-A-Za-z]{4} \d+/\d+/\d+/\d+/\+?(\d+) ", line))
              and int(m.group(1)) > 0)
print("| phase | requests | answered | cut mid-stream | unanswered | hung | output tok/s | prefix-cache hit rate |")
print("|---|---|---|---|---|---|---|---|")
for name, d in (("round robin", rr), ("X-Session-Id, consistent hash", se),
                (f"same, replica 2 SIGKILLed at {kl['killed_at_s']} s and restarted "
                 f"({retried} requests retried elsewhere by HAProxy)", kl)):
    f = d["failed"]
    print(f"| {name} | {d['requests']} | {d['answered']} | {f['streamed']} | {f['unanswered']} | "
          f"{f['hung']} | {d['output_tok_s']} | {d['prefix_hit_rate']:.1%} |")
bad = []
for name, d in (("round robin", rr), ("affinity", se)):
    if d["answered"] != d["requests"]:
        bad.append(f"{name}: {d['requests'] - d['answered']} requests failed: {d['errors']}")
if kl["failed"]["unanswered"] or kl["failed"]["hung"]:
    bad.append(f"kill: requests that had not begun were lost or hung: {kl['errors']}")
if kl["answered"] + kl["failed"]["streamed"] != kl["requests"]:
    bad.append("kill: requests unaccounted for")
if se["prefix_hit_rate"] <= rr["prefix_hit_rate"]:
    bad.append(f"affinity's hit rate {se['prefix_hit_rate']} is not above round robin's "
               f"{rr['prefix_hit_rate']}")
if bad:
    print("cluster-test: FAIL\n  " + "\n  ".join(bad))
    sys.exit(1)
print("cluster-test: ok")
PY
