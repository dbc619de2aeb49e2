#!/usr/bin/env bash
# bench-vs-llamacpp.sh — single-stream throughput of quern vs llama.cpp on this machine.
#
# For each model file (default: SmolLM2-135M-Instruct Q8_0, Q4_0, Q4_1 under models/) and each
# thread count (default 1 2) it runs, interleaved so that machine drift hits both programs:
#   quern:     build/server/quern bench --model FILE --pp 512 --tg 128 --threads T --reps 3 --json
#   llama.cpp: llama-bench -m FILE -p 512 -n 128 -t T -r 3 -o json
# and prints a markdown table (type, threads, test, quern t/s, llama.cpp t/s, ratio). A program
# that fails on a file gets its error in its cell instead of a number.
#
# It also measures memory read bandwidth (a small C read loop compiled here with gcc, 1 GiB
# buffer, per thread count: at the start, and again just before and just after every run, whose
# decode rate is set against the mean of those two) and prints the decode roofline per file:
# bytes of weights read per
# generated token (every tensor in full, except token_embd: one row for the lookup, plus all of
# it again when the output matrix is tied to it, and a mixture's stacked experts: the share
# expert_used_count / expert_count of them; parsed from the GGUF with the Python stdlib)
# divided by bandwidth gives the max tokens/s; both programs' tg is shown as a % of it (quern's
# of the bytes it reads: a file's K-quant and Q5_1 tensors as the Q4_1/Q8_0 they become at
# open, both figures shown where they differ; Q5_0 keeps its bytes on the CPU). A second
# ceiling uses bandwidth measured on a buffer the size of those bytes, which counts what the
# L3 cache holds between tokens.
#
# Shared machines: before each run it waits (up to --idle-wait S, default 60) for the CPUs to
# be idle, and it reports the CPU time other processes took during each run ("others %", of
# all cores); with --rounds N it runs everything N times and keeps each cell's best round.
#
# The quern binary is copied at the start, so a rebuild of build/ during the run does not mix
# two builds into one table. --quern-args adds flags to quern bench (e.g. "--precision f32";
# the CPU's default is q8). --isa "native avx2" runs quern once per kernel ISA (QUERN_CPU_ISA;
# default: native, plus avx2 when the CPU has AVX-512, so every table shows the AVX2 path too).
# The CPU's model and its SIMD flags head the report.
#
#   tools/bench-vs-llamacpp.sh [-r REPS] [--pp N] [--tg N] [-t "1 2"] [--rounds N]
#                              [--idle-wait S] [--quern-args "ARGS"] [--isa "LIST"] [--raw DIR]
#                              [--no-bw] [MODEL.gguf ...]
# Env: QUERN (quern binary), LLAMA_BIN (dir with llama-bench; tools/build-llamacpp.sh makes it;
# its AVX2-only build, LLAMA_ISA=avx2, is build-avx2/bin: the peer of --isa avx2),
# IK_BIN (dir with ik_llama.cpp's llama-bench, run with -rtr 1 as a third column when present;
# default third_party/ik_llama.cpp/build/bin, which tools/build-ikllama.sh makes; its AVX2-only
# build, IK_ISA=avx2, is build-avx2/bin: the peer of --isa avx2 on an AVX-512 machine).
# Make the Q8_0/Q4_0 files first with tools/make-bench-models.sh.
set -euo pipefail

# One function, parsed whole before it runs: editing this file mid-run cannot derail a run.
main() {

ROOT=$(cd "$(dirname "$0")/.." && pwd)
QUERN=${QUERN:-$ROOT/build/server/quern}
LLAMA_BIN=${LLAMA_BIN:-$ROOT/third_party/llama.cpp/build/bin}
IK_BIN=${IK_BIN:-$ROOT/third_party/ik_llama.cpp/build/bin}
reps=3 pp=512 tg=128 threads="1 2" raw="" do_bw=1 rounds=1 idle_wait=60 quern_args="" isas=""
models=()
usage() { awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit "${1:-2}"; }
while [[ $# -gt 0 ]]; do
    case $1 in
        -r|--reps) reps=$2; shift 2 ;;
        --pp) pp=$2; shift 2 ;;
        --tg) tg=$2; shift 2 ;;
        -t|--threads) threads=$2; shift 2 ;;
        --raw) raw=$2; shift 2 ;;
        --rounds) rounds=$2; shift 2 ;;
        --idle-wait) idle_wait=$2; shift 2 ;;
        --quern-args) quern_args=$2; shift 2 ;;
        --isa) isas=$2; shift 2 ;;
        --no-bw) do_bw=0; shift ;;
        -h|--help) usage 0 ;;
        -*) echo "bench-vs-llamacpp: unknown option '$1'" >&2; usage ;;
        *) models+=("$1"); shift ;;
    esac
done
cpu_flags=$("$ROOT/tools/cpu-info.sh" --flags)
if [[ -z $isas ]]; then
    isas=native
    [[ " $cpu_flags " == *" avx512f "* ]] && isas="native avx2"
fi
if [[ ${#models[@]} -eq 0 ]]; then
    for q in Q8_0 Q4_0 Q4_1; do models+=("$ROOT/models/SmolLM2-135M-Instruct.$q.gguf"); done
fi
for f in "${models[@]}"; do
    [[ -f "$f" ]] || { echo "bench-vs-llamacpp: no $f (tools/make-bench-models.sh makes the variants)" >&2; exit 1; }
done
[[ -x "$QUERN" ]] || { echo "bench-vs-llamacpp: no $QUERN (build quern first)" >&2; exit 1; }
[[ -x "$LLAMA_BIN/llama-bench" ]] || { echo "bench-vs-llamacpp: no $LLAMA_BIN/llama-bench (tools/build-llamacpp.sh)" >&2; exit 1; }
peers=llama
[[ -x "$IK_BIN/llama-bench" ]] && peers="llama ik"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp "$QUERN" "$work/quern"
quern_rev="$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet 2>/dev/null || echo '+dirty')"
quern_built=$(date -r "$QUERN" '+%F %T')
QUERN=$work/quern
read -r -a qargs <<<"$quern_args"
[[ -z "$raw" ]] || mkdir -p "$raw"
log() { echo "bench-vs-llamacpp: $*" >&2; }
ncpu=$(nproc)

# cpu_busy: busy and total jiffies of all CPUs so far (/proc/stat)
cpu_busy() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat; }
# wait_idle: until the CPUs were < 10% busy over half a second, at most $idle_wait seconds
wait_idle() {
    local a b c d i
    for ((i = 0; i < idle_wait * 2; i++)); do
        read -r a b < <(cpu_busy); sleep 0.5; read -r c d < <(cpu_busy)
        if (( (c - a) * 10 < (d - b) )); then return 0; fi
    done
    log "CPUs still busy after ${idle_wait}s; measuring anyway"
}
# measure OUT ERR CMD...: waits for idle, runs CMD >OUT 2>ERR and sets $others to the % of all
# cores' time that other processes used while it ran
# With bw_threads set (and the bandwidth probe built), it also reads the 1 GiB bandwidth on that
# many threads just before and just after the run into $run_bw ("BEFORE AFTER", GB/s): these
# machines' bandwidth moves by 1.5x between phases of minutes, so a decode rate is only
# comparable to the bandwidth of its own moment.
others="" run_bw="" bw_threads=""
measure() {
    local out=$1 err=$2 b0 t0 b1 t1 w0 w1 tf bw0="" bw1=""
    shift 2
    wait_idle
    tf=$work/time.$$
    [[ -n $bw_threads && -x $work/membw ]] && bw0=$("$work/membw" "$bw_threads" 1024 5)
    read -r b0 t0 < <(cpu_busy); w0=$EPOCHREALTIME
    { TIMEFORMAT='%U %S'; time "$@" >"$out" 2>"$err"; } 2>"$tf" || true
    read -r b1 t1 < <(cpu_busy); w1=$EPOCHREALTIME
    [[ -n $bw0 ]] && bw1=$("$work/membw" "$bw_threads" 1024 5)
    run_bw="${bw0:+$bw0 $bw1}"
    others=$(awk -v b="$((b1 - b0))" -v hz="$(getconf CLK_TCK)" -v w0="$w0" -v w1="$w1" -v n="$ncpu" \
        '{ own = $1 + $2 } END { o = (b / hz - own) / ((w1 - w0) * n) * 100; printf "%.0f", o < 0 ? 0 : o }' "$tf")
}

# ---- GGUF: bytes read per generated token (stdlib only) ----
cat >"$work/gguf_bpt.py" <<'PY'
import struct, sys
# ggml type id -> (elements per block, bytes per block)
T = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
     9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
     15: (256, 292), 16: (256, 66), 17: (256, 74), 18: (256, 98), 19: (256, 50), 20: (32, 18),
     21: (256, 110), 22: (256, 82), 23: (256, 136), 24: (1, 1), 25: (1, 2), 26: (1, 4),
     27: (1, 8), 28: (1, 8), 29: (256, 56), 30: (1, 2), 34: (256, 54), 35: (256, 66), 39: (32, 17)}
N = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 10: "Q2_K",
     11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 20: "IQ4_NL", 23: "IQ4_XS", 30: "BF16",
     39: "MXFP4"}
SC = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}

class R:
    def __init__(self, fh): self.fh = fh
    def get(self, fmt):
        n = struct.calcsize("<" + fmt); b = self.fh.read(n)
        if len(b) != n: raise ValueError("truncated GGUF")
        return struct.unpack("<" + fmt, b)[0]
    def str(self): return self.fh.read(self.get("Q")).decode("utf-8", "replace")
    def skip(self, t):
        if t in SC: self.fh.seek(struct.calcsize("<" + SC[t]), 1)
        elif t == 8: self.fh.seek(self.get("Q"), 1)
        elif t == 9:
            et, n = self.get("I"), self.get("Q")
            if et in SC: self.fh.seek(n * struct.calcsize("<" + SC[et]), 1)
            else:
                for _ in range(n): self.skip(et)
        else: raise ValueError("bad GGUF kv type %d" % t)

def tensors(path):
    with open(path, "rb") as fh:
        r = R(fh)
        if fh.read(4) != b"GGUF": raise ValueError(path + ": not a GGUF file")
        r.get("I"); nt, nkv = r.get("Q"), r.get("Q")
        moe = {}  # a mixture's expert_count and expert_used_count
        for _ in range(nkv):
            key, t = r.str(), r.get("I")
            part = key.rsplit(".", 1)[-1]
            if part in ("expert_count", "expert_used_count") and t == 4:
                moe[part] = r.get("I")
            else:
                r.skip(t)
        out = {"__moe__": moe}
        for _ in range(nt):
            name = r.str(); dims = [r.get("Q") for _ in range(r.get("I"))]
            typ = r.get("I"); r.get("Q")
            if typ not in T: raise ValueError("%s: unknown ggml type %d" % (name, typ))
            be, bb = T[typ]; ne = 1
            for x in dims: ne *= x
            out[name] = (typ, dims, ne // be * bb, dims[0] // be * bb)
        return out

# the types quern converts as it opens a file (quant/qconv.h): what it reads instead. Q5_0 is
# read as Q8_0 too, but the CPU kernels pack those values back into five bits, the file's 22
# bytes a block (kernels/cpu/qpack.h), so it costs what it does in the file.
CONV = {7: 8, 12: 3, 13: 8, 14: 8}

def per_token(ts, conv):
    """Bytes a decoded token reads: every weight once, one embedding row, and the embedding
    again when it is also the output matrix."""
    def size(t, full):
        be, bb = T[conv.get(t[0], t[0])]
        n = t[1][0]
        for x in t[1][1:] if full else []: n *= x
        return n // be * bb
    moe = ts["__moe__"]
    def share(name):  # a mixture's token reads expert_used_count of the stacked experts
        if "_exps." in name and moe.get("expert_count"):
            return moe.get("expert_used_count", 0) / moe["expert_count"]
        return 1.0
    total = sum(int(size(t, True) * share(n)) for n, t in ts.items() if n != "__moe__")
    emb = ts.get("token_embd.weight")
    out = total
    if emb:
        out += size(emb, False) - size(emb, True)   # the embedding lookup reads one row
        if "output.weight" not in ts: out += size(emb, True)   # the tied output matrix reads all
    return out

for path in sys.argv[1:]:
    ts = tensors(path)
    total = sum(t[2] for n, t in ts.items() if n != "__moe__")
    emb = ts.get("token_embd.weight")
    tied = "output.weight" not in ts
    per_tok = per_token(ts, {})
    per_tok_quern = per_token(ts, CONV)
    by_type = {}
    for name, t in ts.items():
        if name != "__moe__" and len(t[1]) >= 2 and name != "token_embd.weight":
            by_type[t[0]] = by_type.get(t[0], 0) + t[2]
    main = N.get(max(by_type, key=by_type.get), "?") if by_type else "?"
    print("%s\t%s\t%s\t%d\t%d\t%s\t%d" % (path, main, N.get(emb[0], str(emb[0])) if emb else "-",
                                           total, per_tok, "tied" if tied else "untied",
                                           per_tok_quern))
PY

# bpt: what llama.cpp reads a token (the file's types); qbpt: what quern reads, the types it
# converts at open (K-quants, Q5_1) counted as what they become
declare -A label bpt qbpt bw_dram bw_fit
for f in "${models[@]}"; do
    IFS=$'\t' read -r _ main embt _total per_tok tied per_tok_q < <(python3 "$work/gguf_bpt.py" "$f")
    label[$f]="$main (embd $embt)"
    bpt[$f]=$per_tok
    qbpt[$f]=$per_tok_q
done

# ---- memory read bandwidth ----
if [[ $do_bw -eq 1 ]]; then
    cat >"$work/membw.c" <<'C'
/* membw THREADS MIB REPS: each thread first-touches, then reads its own slice of a MIB-MiB
 * buffer, all threads starting together; prints the best of REPS in GB/s (1e9 B/s). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
typedef long long v8 __attribute__((vector_size(64)));
static int nt, reps;
static size_t slice;
static char *buf;
static pthread_barrier_t bar;
static double t0[64], t1[64], best;
static volatile long long sink;
static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}
static void *run(void *arg) {
    long id = (long)arg;
    const v8 *p = (const v8 *)(buf + (size_t)id * slice);
    size_t n = slice / sizeof(v8);
    memset(buf + (size_t)id * slice, 1, slice);
    for (int r = 0; r < reps; r++) {
        pthread_barrier_wait(&bar);
        t0[id] = now();
        v8 a = {0}, b = {0}, c = {0}, d = {0};
        for (size_t i = 0; i < n; i += 4) {
            a += p[i]; b += p[i + 1]; c += p[i + 2]; d += p[i + 3];
        }
        a += b + c + d;
        sink += a[0] + a[7];
        t1[id] = now();
        pthread_barrier_wait(&bar);
        if (id == 0) {
            double s = t0[0], e = t1[0];
            for (int k = 1; k < nt; k++) {
                if (t0[k] < s) s = t0[k];
                if (t1[k] > e) e = t1[k];
            }
            double gbs = (double)slice * nt / (e - s) / 1e9;
            if (gbs > best) best = gbs;
        }
    }
    return NULL;
}
int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: membw THREADS MIB REPS\n"); return 2; }
    nt = atoi(argv[1]); reps = atoi(argv[3]);
    double mib = atof(argv[2]);
    if (nt < 1 || nt > 64 || reps < 1 || mib <= 0) { fprintf(stderr, "membw: bad args\n"); return 2; }
    slice = ((size_t)(mib * 1048576.0 / nt) + 1023) / 1024 * 1024; /* whole 4-vector steps */
    if (posix_memalign((void **)&buf, 4096, slice * (size_t)nt)) { perror("membw"); return 1; }
    pthread_barrier_init(&bar, NULL, (unsigned)nt);
    pthread_t th[64];
    for (long i = 0; i < nt; i++) pthread_create(&th[i], NULL, run, (void *)i);
    for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
    printf("%.2f\n", best);
    return 0;
}
C
    gcc -O2 -march=native -pthread -o "$work/membw" "$work/membw.c"
    for t in $threads; do
        wait_idle
        bw_dram[$t]=$("$work/membw" "$t" 1024 10)
        log "read bandwidth, $t thread(s), 1 GiB buffer: ${bw_dram[$t]} GB/s"
        for f in "${models[@]}"; do
            mib=$(awk -v b="${bpt[$f]}" 'BEGIN { printf "%.3f", b / 1048576 }')
            bw_fit[$f,$t]=$("$work/membw" "$t" "$mib" 30)
            log "read bandwidth, $t thread(s), $mib MiB buffer (${label[$f]}): ${bw_fit[$f,$t]} GB/s"
        done
    done
fi

# ---- interleaved runs ----
# cell FILE.json FILE.err KIND: prints "pp_ts pp_sd tg_ts tg_sd" or "ERR message"
cell() {
    python3 - "$@" "$pp" "$tg" <<'PY'
import json, sys
out, err, kind, pp, tg = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def fail():
    try: lines = [l.strip() for l in open(err, errors="replace") if l.strip()]
    except OSError: lines = []
    msg = lines[-1] if lines else "no output"
    for l in lines:
        if "error" in l.lower() or "unsupported" in l.lower() or "not supported" in l.lower():
            msg = l; break
    print("ERR " + msg.replace("|", "/")[:90])
try:
    d = json.load(open(out))
    if kind == "quern":
        print(d["pp_tokens_per_s"], d["pp_sd"], d["tg_tokens_per_s"], d["tg_sd"])
    else:
        p = next(x for x in d if x["n_prompt"] == pp and x["n_gen"] == 0)
        g = next(x for x in d if x["n_prompt"] == 0 and x["n_gen"] == tg)
        print(p["avg_ts"], p["stddev_ts"], g["avg_ts"], g["stddev_ts"])
except Exception:
    fail()
PY
}
declare -A res oth rbw
llama_commit="" llama_cpu=""
# better NEW OLD WHICH(2|4: pp|tg field): true when result NEW beats OLD (errors lose)
better() {
    [[ $1 == ERR* ]] && return 1
    [[ -z $2 || $2 == ERR* ]] && return 0
    awk -v a="$1" -v b="$2" 'BEGIN { split(a, x, " "); split(b, y, " "); exit !(x[1] + x[3] > y[1] + y[3]) }'
}
n=0
for ((round = 1; round <= rounds; round++)); do
    for f in "${models[@]}"; do
        for t in $threads; do
            n=$((n + 1))
            tag=$(basename "$f" .gguf).t$t.r$round
            [[ $do_bw -eq 1 ]] && bw_threads=$t
            for prog in $(for i in $isas; do echo "quern-$i"; done) $peers; do
                log "[$n] round $round: $prog $(basename "$f") threads=$t"
                if [[ $prog == quern-* ]]; then
                    isa_env=()
                    [[ $prog == quern-native ]] || isa_env=(env "QUERN_CPU_ISA=${prog#quern-}")
                    measure "$work/$tag.$prog.json" "$work/$tag.$prog.err" "${isa_env[@]}" \
                        "$QUERN" bench --model "$f" --pp "$pp" --tg "$tg" --threads "$t" --reps "$reps" --json "${qargs[@]}"
                elif [[ $prog == ik ]]; then # run-time repacking, as its README advises on CPUs
                    measure "$work/$tag.$prog.json" "$work/$tag.$prog.err" \
                        "$IK_BIN/llama-bench" -m "$f" -p "$pp" -n "$tg" -t "$t" -r "$reps" -rtr 1 -o json
                else
                    measure "$work/$tag.$prog.json" "$work/$tag.$prog.err" \
                        "$LLAMA_BIN/llama-bench" -m "$f" -p "$pp" -n "$tg" -t "$t" -r "$reps" -o json
                fi
                r=$(cell "$work/$tag.$prog.json" "$work/$tag.$prog.err" "${prog%%-*}")
                log "    -> $r  (others used ${others}% of the CPUs${run_bw:+; read GB/s before, after: $run_bw})"
                echo "$others" >"$work/$tag.$prog.others"
                [[ -z $run_bw ]] || echo "$run_bw" >"$work/$tag.$prog.bw"
                # pp and tg of one program come from the same round: the one with the best sum
                if better "$r" "${res[$f,$t,$prog]:-}" || [[ -z ${res[$f,$t,$prog]:-} ]]; then
                    res[$f,$t,$prog]=$r oth[$f,$t,$prog]=$others rbw[$f,$t,$prog]=$run_bw
                fi
            done
            if [[ -z "$llama_commit" ]]; then
                read -r llama_commit llama_cpu < <(python3 -c '
import json, sys
try:
    d = json.load(open(sys.argv[1]))[0]; print(d.get("build_commit", "?"), d.get("cpu_info", "?"))
except Exception: print("? ?")' "$work/$tag.llama.json") || true
            fi
            [[ -z "$raw" ]] || cp "$work/$tag".* "$raw"/
        done
    done
done

# ---- report ----
fmt() { # fmt "RESULT" which(pp|tg): "123.45 ± 1.20" or the error
    local r=$1 w=$2
    if [[ $r == ERR* ]]; then echo "${r#ERR }"; return; fi
    read -r a b c d <<<"$r"
    if [[ $w == pp ]]; then printf "%.2f ± %.2f" "$a" "$b"; else printf "%.2f ± %.2f" "$c" "$d"; fi
}
val() { # val "RESULT" which: the mean or empty
    local r=$1 w=$2
    [[ $r == ERR* ]] && return 0
    read -r a _ c _ <<<"$r"
    if [[ $w == pp ]]; then echo "$a"; else echo "$c"; fi
}
ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }' || echo "-"; }

echo "## quern vs llama.cpp — single stream, pp$pp / tg$tg, $reps reps (mean ± sd, tokens/s), best of $rounds round(s)"
echo
echo "quern: git $quern_rev, binary built $quern_built, bench args '${quern_args:-(defaults)}';" \
     "llama.cpp: build_commit ${llama_commit:-?} (third_party/llama.cpp/.llama-cpp-commit: $(cat "$ROOT/third_party/llama.cpp/.llama-cpp-commit" 2>/dev/null || echo '?'));" \
     "$("$ROOT/tools/cpu-info.sh"); quern kernels: $isas" \
     "(QUERN_CPU_ISA; native = the best this CPU has)"
if [[ $peers == *ik* ]]; then
    # which build: build/ is -march=native, build-avx2/ AVX2 only (IK_ISA=avx2 build-ikllama.sh)
    echo
    echo "ik_llama.cpp: $(cat "$IK_BIN/../../.ik-commit" 2>/dev/null | cut -c1-9), $IK_BIN"
fi
echo
hdr="| type | threads | test |" sep="|---|---|---|"
for i in $isas; do hdr+=" quern $i t/s |"; sep+="---|"; done
hdr+=" llama.cpp t/s |"; sep+="---|"
[[ $peers == *ik* ]] && { hdr+=" ik_llama.cpp -rtr 1 t/s |"; sep+="---|"; }
for i in $isas; do hdr+=" quern $i / llama.cpp |"; sep+="---|"; done
if [[ $peers == *ik* ]]; then for i in $isas; do hdr+=" quern $i / ik |"; sep+="---|"; done; fi
echo "$hdr others % (quern $(echo "$isas" | sed 's/ / \/ /g') / $(echo "$peers" | sed 's/ / \/ /g') run) |"
echo "$sep---|"
for f in "${models[@]}"; do
    for t in $threads; do
        for w in pp tg; do
            l=${res[$f,$t,llama]} k=${res[$f,$t,ik]:-}
            [[ $w == pp ]] && test=pp$pp || test=tg$tg
            row="| ${label[$f]} | $t | $test |" ratios="" kratios="" others=""
            for i in $isas; do
                q=${res[$f,$t,quern-$i]}
                row+=" $(fmt "$q" $w) |"
                ratios+=" $(ratio "$(val "$q" $w)" "$(val "$l" $w)") |"
                kratios+=" $(ratio "$(val "$q" $w)" "$(val "$k" $w)") |"
                others+="${oth[$f,$t,quern-$i]} / "
            done
            if [[ $peers == *ik* ]]; then
                echo "$row $(fmt "$l" $w) | $(fmt "$k" $w) |$ratios$kratios ${others}${oth[$f,$t,llama]} / ${oth[$f,$t,ik]} |"
            else
                echo "$row $(fmt "$l" $w) |$ratios ${others}${oth[$f,$t,llama]} |"
            fi
        done
    done
done

if [[ $do_bw -eq 1 ]]; then
    echo
    echo "## decode roofline (weights only; KV cache reads not counted)"
    echo
    echo "read bandwidth at the start, 1 GiB buffer:$(for t in $threads; do printf " %s thread(s) %s GB/s;" "$t" "${bw_dram[$t]}"; done)"
    echo "Each decode rate is set against the 1 GiB read bandwidth measured just before and just"
    echo "after its own run (the mean of the two; both shown), since this bandwidth moves between"
    echo "phases of the machine; the cache-aware ceiling uses a buffer of the bytes read a token,"
    echo "measured at the start."
    echo
    khdr="" ksep=""
    [[ $peers == *ik* ]] && { khdr=" ik -rtr 1 tg t/s | read GB/s around it | % |"; ksep="---|---|---|"; }
    echo "| type | threads | quern kernels | MB read / token | quern tg t/s | read GB/s around it | DRAM roofline t/s | % | llama.cpp tg t/s | read GB/s around it | % |$khdr BW at that size GB/s (start) | cache-aware roofline t/s | quern % | llama.cpp % |"
    echo "|---|---|---|---|---|---|---|---|---|---|---|$ksep---|---|---|---|"
    for f in "${models[@]}"; do
        for t in $threads; do
            for i in $isas; do
                qv=$(val "${res[$f,$t,quern-$i]}" tg) lv=$(val "${res[$f,$t,llama]}" tg) kv=""
                [[ $peers == *ik* ]] && kv=$(val "${res[$f,$t,ik]:-ERR}" tg)
                awk -v b="${bpt[$f]}" -v qb="${qbpt[$f]}" -v bf="${bw_fit[$f,$t]}" \
                    -v qbw="${rbw[$f,$t,quern-$i]:-}" -v lbw="${rbw[$f,$t,llama]:-}" \
                    -v kbw="${rbw[$f,$t,ik]:-}" -v ik="$([[ $peers == *ik* ]] && echo 1 || echo 0)" \
                    -v q="$qv" -v l="$lv" -v k="$kv" -v lab="${label[$f]}" -v t="$t" -v isa="$i" '
                function mean(s,   x, n) { n = split(s, x, " "); return n == 2 ? (x[1] + x[2]) / 2 : 0 }
                function shown(s,   x) { split(s, x, " "); return s == "" ? "-" : sprintf("%.1f (%s, %s)", mean(s), x[1], x[2]) }
                # rate v against bandwidth string s for B bytes a token
                function pct(v, s, B) { return v == "" || mean(s) == 0 ? "-" : sprintf("%.0f%%", 100 * v / (mean(s) * 1e9 / B)) }
                BEGIN {
                    # quern against the bytes it reads, the peers against those of the file (the
                    # same unless quern converted some types at open: then both, quern first)
                    two = qb != b
                    qm = mean(qbw) * 1e9 / qb; mf = bf * 1e9 / b; qmf = bf * 1e9 / qb
                    row = sprintf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |",
                        lab, t, isa,
                        two ? sprintf("%.2f / %.2f", qb / 1e6, b / 1e6) : sprintf("%.2f", b / 1e6),
                        q == "" ? "-" : sprintf("%.2f", q), shown(qbw),
                        qm == 0 ? "-" : sprintf("%.1f", qm), pct(q, qbw, qb),
                        l == "" ? "-" : sprintf("%.2f", l), shown(lbw), pct(l, lbw, b))
                    if (ik)
                        row = row sprintf(" %s | %s | %s |", k == "" ? "-" : sprintf("%.2f", k),
                                          shown(kbw), pct(k, kbw, b))
                    printf "%s %.2f | %s | %s | %s |\n", row,
                        bf, two ? sprintf("%.1f / %.1f", qmf, mf) : sprintf("%.1f", mf),
                        q == "" ? "-" : sprintf("%.0f%%", 100 * q / qmf), l == "" ? "-" : sprintf("%.0f%%", 100 * l / mf) }'
            done
        done
    done
fi
}
main "$@"
