#!/usr/bin/env python3
"""bench-spec-vs-llamacpp.py: speculative decoding of quern vs llama.cpp's llama-server, batch 1.

The same GGUF, the same prompts (a GPL-3 passage, then its first words again: the output copies
its input), greedy, --ignore-eos, one request at a time, against each server in turn:

  quern serve --spec off | --spec ngram | --draft-model DRAFT
  llama-server (no speculation) | --spec-type ngram-simple | --spec-type draft-simple -md DRAFT

Each request is measured by the server process's CPU time (utime + stime from /proc, which a
loaded machine changes much less than wall time; both servers on --threads 1 so no thread
spins waiting for another) and by wall time; prints a markdown table of decode tokens per CPU
second and per wall second, with each server's speculation counters where it reports them.

  tools/bench-spec-vs-llamacpp.py --model Q8.gguf --draft Q4.gguf [--requests 2] [-n 128]
Env: QUERN (default build/server/quern), LLAMA_BIN (default third_party/llama.cpp/build/bin).
"""
import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {data[:300]!r}")
    return json.loads(data)


def start(cmd, port_re=None, port=None):
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    if port_re:  # quern prints the port it bound
        for line in p.stderr:
            m = re.search(port_re, line)
            if m:
                port = int(m.group(1))
                break
            if time.time() > deadline:
                break
        # keep draining stderr so the server never blocks on it
        import threading
        threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    else:
        import threading
        threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    while time.time() < deadline:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/health")
            if c.getresponse().status == 200:
                return p, port
        except OSError:
            pass
        if p.poll() is not None:
            raise RuntimeError(f"{cmd[0]} exited {p.returncode}")
        time.sleep(0.5)
    p.kill()
    raise RuntimeError(f"{cmd[0]} did not come up")


def prompts(n, chars=900, again=90):
    text = open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()
    out = []
    for i in range(n):
        off = 2000 + i * 3989 % (len(text) - 2 * chars)
        body = text[off:off + chars]
        out.append(body + "\n\n" + body[:again])
    return out


def run(name, cmd, kind, ps, n_predict, port_re=None):
    port = None if port_re else free_port()
    if not port_re:
        cmd = cmd + ["--port", str(port)]
    p, port = start(cmd, port_re, port)
    rows = []
    try:
        # one warm-up request, not counted
        ask(kind, port, ps[0], 8)
        for text in ps:
            c0, t0 = cpu_s(p.pid), time.time()
            tokens, drafted, accepted = ask(kind, port, text, n_predict)
            rows.append((tokens, cpu_s(p.pid) - c0, time.time() - t0, drafted, accepted))
    finally:
        p.terminate()
        p.wait(30)
    tok = sum(r[0] for r in rows)
    cpu = sum(r[1] for r in rows)
    wall = sum(r[2] for r in rows)
    dr = sum(r[3] or 0 for r in rows)
    ac = sum(r[4] or 0 for r in rows)
    return name, tok, cpu, wall, dr, ac


def ask(kind, port, text, n):
    if kind == "quern":
        r = post(port, "/v1/completions", {"prompt": text, "max_tokens": n, "temperature": 0,
                                           "ignore_eos": True})
        u = r["usage"]
        return (u["completion_tokens"], None,
                u.get("completion_tokens_details", {}).get("accepted_prediction_tokens"))
    r = post(port, "/completion", {"prompt": text, "n_predict": n, "temperature": 0,
                                   "ignore_eos": True, "cache_prompt": False})
    t = r.get("timings", {})
    return r.get("tokens_predicted", 0), t.get("draft_n"), t.get("draft_n_accepted")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated names to run")
    a = ap.parse_args()
    quern = os.environ.get("QUERN", os.path.join(ROOT, "build/server/quern"))
    llama = os.path.join(os.environ.get("LLAMA_BIN", os.path.join(ROOT,
                                                                  "third_party/llama.cpp/build/bin")),
                         "llama-server")
    t = str(a.threads)
    q = [quern, "serve", "--model", a.model, "--port", "0", "--threads", t]
    ll = [llama, "-m", a.model, "-t", t, "-tb", t, "-c", "4096", "-np", "1", "--no-webui"]
    configs = [
        ("quern off", q + ["--spec", "off"], "quern"),
        ("quern ngram", q + ["--spec", "ngram"], "quern"),
        ("quern draft", q + ["--draft-model", a.draft], "quern"),
        ("llama.cpp off", ll, "llama"),
        ("llama.cpp ngram-simple", ll + ["--spec-type", "ngram-simple"], "llama"),
        ("llama.cpp draft-simple", ll + ["--spec-type", "draft-simple", "-md", a.draft,
                                         "--spec-draft-n-max", "8", "-td", t, "-tbd", t],
         "llama"),
    ]
    ps = prompts(a.requests)
    print(f"load average before: {os.getloadavg()}", file=sys.stderr)
    print("| server | spec | tokens | CPU s | tok / CPU s | wall s | tok / wall s | "
          "drafted / accepted |")
    print("|---|---|---|---|---|---|---|---|")
    for name, cmd, kind in configs:
        if a.only and not any(o in name for o in a.only.split(",")):
            continue
        try:
            n, tok, cpu, wall, dr, ac = run(name, cmd, kind, ps, a.n,
                                            r":(\d+) \(loading" if kind == "quern" else None)
        except Exception as e:  # noqa: BLE001 - one server failing must not hide the rest
            print(f"| {name} | failed: {e} | | | | | | |")
            continue
        server, spec = n.split(" ", 1)
        print(f"| {server} | {spec} | {tok} | {cpu:.2f} | {tok / cpu:.1f} | {wall:.2f} | "
              f"{tok / wall:.1f} | {dr or '-'} / {ac or '-'} |", flush=True)
    print(f"load average after: {os.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main()
