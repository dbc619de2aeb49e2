#!/usr/bin/env python3
"""bench-spec-vs-llamacpp.py: speculative decoding of quern vs llama.cpp's llama-server, batch 1.

The same GGUF, the same prompts, one request at a time. Two modes:

--kinds (chat prompts from tools/spec-prompts.json: code-edit, summarize, extract, extract-json
(under a JSON Schema, sent as response_format), nomatch):
every server is started once and the requests are interleaved (round by round, prompt by
prompt, server by server, the servers' order turned by one each round), streamed, ending at EOS or -n tokens, greedy ('nomatch' samples at
temperature 1, seed = prompt number, so there is nothing for a drafter to copy). Each request's
decode is timed from its first streamed token to its last, in wall time and in the server's
CPU time; the table gives, per kind and server, decode tokens per second (the median of the
rounds' rates, each round summed over the kind's prompts), that over the same server's 'off',
and the drafts kept.

quern's ngram runs with --spec-history 0, prompt lookup alone: the rounds ask the same prompts
again, and its history of earlier answers would draft them from the round before
(tools/bench-spec-history.py measures the history on prompts a server has not seen).

Default (no --kinds): a GPL-3 passage, then its first words again (the output copies its
input), greedy, --ignore-eos, against each server in turn:

  quern serve --spec off | --spec ngram | --draft-model DRAFT
  llama-server (no speculation) | --spec-type ngram-simple | --spec-type draft-simple -md DRAFT

Each request is measured by the server process's CPU time (utime + stime from /proc, which a
loaded machine changes much less than wall time; both servers on --threads 1 so no thread
spins waiting for another) and by wall time; prints a markdown table of decode tokens per CPU
second and per wall second, with each server's speculation counters where it reports them.

  tools/bench-spec-vs-llamacpp.py --model Q8.gguf --draft Q4.gguf [--requests 2] [-n 128]
  tools/bench-spec-vs-llamacpp.py --model M.gguf --kinds code-edit,summarize,extract,nomatch \
      [--rounds 3] [-n 256] [--threads 2] [--only quern,llama]
Env: QUERN (default build/server/quern), LLAMA_BIN (default third_party/llama.cpp/build/bin),
QUERN_BASE (with --kinds: a second quern binary run with --spec ngram too, "quern-base", held
against quern's own off: an A/B of two builds in one run).
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

NO_HISTORY = ["--spec", "ngram", "--spec-history", "0"]

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


def load_kinds(path, kinds):
    d = json.load(open(path, encoding="utf-8"))
    out = []
    for k in kinds:
        if k not in d or not isinstance(d[k], list):
            raise SystemExit(f"{path}: no prompt kind '{k}' (has {', '.join(x for x in d if x != 'about')})")
        # an entry is a prompt, or {"text", "json_schema"}: the answer under that schema
        out += [(k, i, e) if isinstance(e, str) else (k, i, (e["text"], e["json_schema"]))
                for i, e in enumerate(d[k])]
    return out


def stream_chat(kind, port, pid, text, n, temp, seed):
    """One streamed chat request: (tokens, decode wall s, decode CPU s, accepted, drafted), the
    decode measured from the first streamed token to the last."""
    schema = None
    if isinstance(text, tuple):
        text, schema = text
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": n,
            "temperature": temp, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}}
    if schema:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "answer", "schema": schema}}
    if kind == "llama":
        body["cache_prompt"] = False
        body["n_predict"] = n
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", json.dumps(body),
              {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"chat: HTTP {r.status}: {r.read()[:300]!r}")
    t_first = t_last = cpu_first = None
    chunks = tokens = 0
    accepted = drafted = None
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        for ch in ev.get("choices") or []:
            if (ch.get("delta") or {}).get("content"):
                now = time.time()
                if t_first is None:
                    t_first, cpu_first = now, cpu_s(pid)
                t_last = now
                chunks += 1
        u = ev.get("usage")
        if u:
            tokens = u.get("completion_tokens", tokens)
            d = u.get("completion_tokens_details") or {}
            accepted = d.get("accepted_prediction_tokens", accepted)
        t = ev.get("timings")
        if t:
            tokens = t.get("predicted_n", tokens)
            drafted = t.get("draft_n", drafted)
            accepted = t.get("draft_n_accepted", accepted)
    cpu_end = cpu_s(pid)
    c.close()
    if t_first is None:
        return 0, 0.0, 0.0, accepted, drafted
    tokens = tokens or chunks
    return tokens, t_last - t_first, cpu_end - cpu_first, accepted, drafted


def median(v):
    v = sorted(v)
    return v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2


def run_kinds(a, configs, quern_port_re):
    work = load_kinds(a.prompts, a.kinds.split(","))
    servers = []
    try:
        for name, cmd, kind in configs:
            port = None if kind == "quern" else free_port()
            full = cmd if kind == "quern" else cmd + ["--port", str(port)]
            p, port = start(full, quern_port_re if kind == "quern" else None, port)
            servers.append((name, kind, p, port))
            stream_chat(kind, port, p.pid, work[0][2], 8, 0, 0)  # warm-up, not counted
        # rates[(kind, server)] = per round (tokens - 1, wall, cpu); acc = accepted, drafted
        per = {}
        for rnd in range(a.rounds):
            # the servers' order turns each round, so none always runs first or after another
            order = servers[rnd % len(servers):] + servers[:rnd % len(servers)]
            for pk, i, text in work:
                temp = 1.0 if pk == "nomatch" else 0.0
                for name, kind, p, port in order:
                    tok, wall, cpu, ac, dr = stream_chat(kind, port, p.pid, text, a.n, temp, i)
                    e = per.setdefault((pk, name), {"rounds": {}, "tokens": 0, "ac": 0, "dr": 0})
                    r = e["rounds"].setdefault(rnd, [0, 0.0, 0.0])
                    r[0] += max(tok - 1, 0)
                    r[1] += wall
                    r[2] += cpu
                    e["tokens"] += tok
                    e["ac"] += ac or 0
                    e["dr"] += dr or 0
            print(f"round {rnd + 1} of {a.rounds} done, load average {os.getloadavg()}",
                  file=sys.stderr)
    finally:
        for _, _, p, _ in servers:
            p.terminate()
            p.wait(30)
    print("| prompts | server | spec | output tokens | decode tok/s wall (rounds) | median | "
          "vs its off | decode tok/CPU s (median) | vs its off | accepted / drafted |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for pk in a.kinds.split(","):
        base = {}
        for name, _, _ in configs:
            e = per.get((pk, name))
            if not e:
                continue
            rates = [r[0] / r[1] for r in e["rounds"].values() if r[1] > 0]
            cpus = [r[0] / r[2] for r in e["rounds"].values() if r[2] > 0]
            mw, mc = median(rates) if rates else 0, median(cpus) if cpus else 0
            server, spec = name.split(" ", 1)
            if spec == "off":
                base[server] = (mw, mc)
            bw, bc = base.get(server, base.get(server.split("-")[0], (0, 0)))
            vs = f"{mw / bw:.2f}x" if bw and spec != "off" else ""
            vc = f"{mc / bc:.2f}x" if bc and spec != "off" else ""
            dr = e["dr"] if e["dr"] else "-"
            print(f"| {pk} | {server} | {spec} | {e['tokens'] // a.rounds} | "
                  f"{', '.join(f'{x:.1f}' for x in rates)} | {mw:.1f} | {vs} | {mc:.1f} | {vc} | "
                  f"{e['ac'] // a.rounds} / {dr if dr == '-' else dr // a.rounds} |",
                  flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", help="draft model (default mode: required)")
    ap.add_argument("--kinds", default="",
                    help="comma-separated prompt kinds of --prompts: code-edit,summarize,...")
    ap.add_argument("--prompts", default=os.path.join(ROOT, "tools/spec-prompts.json"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--llama-spec", default="ngram-simple",
                    help="with --kinds: comma-separated llama-server --spec-type values")
    ap.add_argument("--requests", type=int, default=2)
    ap.add_argument("-n", type=int, default=None, help="tokens per request (128; --kinds: 256)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="", help="comma-separated names to run")
    a = ap.parse_args()
    if not a.kinds and not a.draft:
        ap.error("--draft is required without --kinds")
    if a.n is None:
        a.n = 256 if a.kinds else 128
    quern = os.environ.get("QUERN", os.path.join(ROOT, "build/server/quern"))
    llama = os.path.join(os.environ.get("LLAMA_BIN", os.path.join(ROOT,
                                                                  "third_party/llama.cpp/build/bin")),
                         "llama-server")
    t = str(a.threads)
    q = [quern, "serve", "--model", a.model, "--port", "0", "--threads", t]
    ll = [llama, "-m", a.model, "-t", t, "-tb", t, "-c", "4096", "-np", "1", "--no-webui"]
    configs = [
        ("quern off", q + ["--spec", "off"], "quern"),
        ("quern ngram", q + NO_HISTORY, "quern"),
        ("quern draft", q + ["--draft-model", a.draft], "quern"),
        ("llama.cpp off", ll, "llama"),
        ("llama.cpp ngram-simple", ll + ["--spec-type", "ngram-simple"], "llama"),
        ("llama.cpp draft-simple", ll + ["--spec-type", "draft-simple", "-md", a.draft,
                                         "--spec-draft-n-max", "8", "-td", t, "-tbd", t],
         "llama"),
    ]
    if a.kinds:
        configs = [("quern off", q + ["--spec", "off"], "quern"),
                   ("quern ngram", q + NO_HISTORY, "quern"),
                   ("llama.cpp off", ll, "llama")]
        configs += [(f"llama.cpp {t}", ll + ["--spec-type", t], "llama")
                    for t in a.llama_spec.split(",") if t]
        if a.draft:
            configs.insert(2, ("quern draft", q + ["--draft-model", a.draft], "quern"))
        if os.environ.get("QUERN_BASE"):  # another quern build, e.g. before a change: A/B
            configs.insert(2, ("quern-base ngram", [os.environ["QUERN_BASE"]] + q[1:] +
                               ["--spec", "ngram"], "quern"))
        configs = [c for c in configs
                   if not a.only or any(o in c[0] for o in a.only.split(","))]
        print(f"load average before: {os.getloadavg()}", file=sys.stderr)
        info = subprocess.run([os.path.join(ROOT, "tools/cpu-info.sh")], capture_output=True,
                              text=True).stdout.strip()
        print(f"{info}; {a.threads} thread(s) per server; {a.rounds} round(s); model "
              f"{os.path.basename(a.model)}\n")
        run_kinds(a, configs, r":(\d+) \(loading")
        print(f"load average after: {os.getloadavg()}", file=sys.stderr)
        return
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
