#!/usr/bin/env python3
"""Failure-injection sweep of quern serve (issue 20), after SQLite's malloc-failure tests.

Needs a binary built with -Dfault_injection=true (quant/fault.h; tools/test.sh's build-asan has
it, so leaks and memory errors on the error paths are caught too); exits 77 (skipped) on any
other. The short run is: load the real model, four requests (a completion, a chat, a streamed
completion, an embedding), SIGTERM. Greedy, --precision f32, so every answer is exact.

1. Counting run (QUERN_FAULT=count): the reference answers, and how many points of each kind
   (alloc, kv_block, write, read) start-up and each request pass through.
2. Request sweep, one daemon (QUERN_FAULT=request): each request is sent again and again with
   "X-Quern-Fault: KIND:N", N = 1, 1 + STRIDE, ... until one passes with no failure injected.
   Each injected failure must give an HTTP 4xx/5xx with a JSON error, a stream ending in an
   error event, or (for a write, whose client is gone by definition) a dropped connection; or,
   where the code can do without what failed, the exact reference answer. Never a wrong answer,
   a hang, or a crash; after each failure a clean request of the next kind must give its exact
   reference answer (the daemon's state survived), and at the end no request may be left running.
3. Start-up sweep (QUERN_FAULT=KIND:N, a daemon start each): N over the points before ready with
   a stride. Each must exit non-zero with a line naming what failed, or come up and answer
   correctly.
4. Shutdown: the points SIGTERM passes through (counted with no request), each failed once.
Every daemon must exit without a sanitizer report (LeakSanitizer runs at exit).

  QUERN_FAULT_STRIDE=S   request allocation points: every Sth (default 1: all; the other kinds
                         have a few points a request, all failed)
  QUERN_FAULT_STARTS=K   start-up points: about K per kind, evenly spread (default 12)
  QUERN_FAULT_ONLY=REQUEST:KIND,...  only these request sweeps (e.g. stream:alloc), no start-up
                         or shutdown sweep
Exit 0 when every check passed, 1 when one failed, 77 when not a fault-injection build."""
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

BIN = os.environ.get("QUERN_BIN", "build/server/quern")
MODEL = os.environ.get("QUERN_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf")
STRIDE = max(1, int(os.environ.get("QUERN_FAULT_STRIDE", "1")))
STARTS = max(1, int(os.environ.get("QUERN_FAULT_STARTS", "12")))
ONLY = [w for w in os.environ.get("QUERN_FAULT_ONLY", "").split(",") if w]
SLOW = 3 if os.environ.get("QUERN_SANITIZED") else 1
ARGS = ["--precision", "f32", "--threads", "2", "--ctx", "256", "--kv-mem", "8M",
        "--drain-timeout", "5"]
KINDS = ("alloc", "kv_block", "write", "read")
SANITIZER_MARKS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
                   "WARNING: ThreadSanitizer")
FAILS = []
TALLY = {}  # (phase, kind) -> {outcome: count}


def check(cond, what, detail=""):
    if not cond:
        FAILS.append(what)
        print(f"FAIL: {what}" + (f"\n    {detail}" if detail else ""), flush=True)
    return cond


def tally(phase, kind, outcome):
    t = TALLY.setdefault((phase, kind), {})
    t[outcome] = t.get(outcome, 0) + 1


# the short run's requests: (name, path, body, streamed)
REQUESTS = [
    ("completion", "/v1/completions",
     {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}, False),
    ("chat", "/v1/chat/completions",
     {"messages": [{"role": "user", "content": "Name a colour."}], "max_tokens": 6,
      "temperature": 0}, False),
    ("stream", "/v1/completions",
     {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "stream": True}, True),
    ("embedding", "/v1/embeddings", {"input": "fault injection"}, False),
]


class Daemon:
    """quern serve on port 0 with $QUERN_FAULT set; wait=False returns before it is ready."""

    def __init__(self, fault, wait=True):
        env = dict(os.environ, QUERN_FAULT=fault)
        self.lines = []
        self.port = None
        self.ready = threading.Event()
        self.proc = subprocess.Popen([BIN, "serve", "--model", MODEL, "--port", "0", *ARGS],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, errors="replace", env=env)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if wait and not self.wait_ready():
            raise RuntimeError("daemon did not become ready:\n" + "\n".join(self.lines[-30:]))

    def _read(self):
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            self.lines.append(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if "ready in" in line:
                self.ready.set()

    def wait_ready(self, timeout=60 * SLOW):
        """True once ready; False when it exited (or timed out) first."""
        end = time.time() + timeout
        while time.time() < end:
            if self.ready.wait(0.05) and self.port:
                return True
            if self.proc.poll() is not None:
                self.reader.join(5)
                return self.ready.is_set() and self.port is not None
        return False

    def count(self, pat):
        return sum(1 for line in list(self.lines) if pat in line)

    def settle(self, n_logged, timeout=10 * SLOW):
        """Waits for the log line of POST n_logged (each logs one when done, after any injection
        line it caused; the GETs of /metrics are not counted)."""
        end = time.time() + timeout
        while time.time() < end and self.count(" POST /v1/") < n_logged:
            time.sleep(0.005)
        return self.count(" POST /v1/") >= n_logged

    def points(self, phase, timeout=5):
        """The counts the daemon printed at phase (ready or exit); its line follows "ready in"
        (or the exit) closely, so it is waited for a little."""
        end = time.time() + timeout
        while True:
            for line in list(self.lines):
                m = re.search(r"fault: points at " + phase + r": (.*)", line)
                if m:
                    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(1))}
            if time.time() > end:
                return None
            time.sleep(0.02)

    def stop(self, timeout=60 * SLOW):
        """SIGTERM; returns the exit status (None: it hung and was killed)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            rc = None
        self.reader.join(10)
        return rc

    def metrics(self):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30 * SLOW)
        try:
            c.request("GET", "/metrics")
            text = c.getresponse().read().decode()
        finally:
            c.close()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def sanitizer_report(self):
        hits = [i for i, l in enumerate(self.lines) if any(m in l for m in SANITIZER_MARKS)]
        return "\n    ".join(self.lines[hits[0]:hits[0] + 40]) if hits else None


def send(d, req, fault=None, timeout=30 * SLOW):
    """One request; returns (kind of outcome, status, answer): outcome is 'ok', 'error' (a 4xx/
    5xx with a JSON error, or a stream ending in an error event), 'dropped' (the connection
    closed without a whole answer), 'hang', or 'bad' (an answer that is none of those)."""
    _, path, body, streamed = req
    headers = {"Content-Type": "application/json"}
    if fault:
        headers["X-Quern-Fault"] = fault
    c = http.client.HTTPConnection("127.0.0.1", d.port, timeout=timeout)
    try:
        c.request("POST", path, body=json.dumps(body), headers=headers)
        r = c.getresponse()
        data = r.read()
    except TimeoutError:
        return "hang", None, None
    except (ConnectionError, http.client.HTTPException) as e:
        return "dropped", None, repr(e)
    finally:
        c.close()
    if r.status >= 400:
        try:
            msg = json.loads(data)["error"]["message"]
            return ("error" if msg else "bad"), r.status, msg
        except (ValueError, KeyError, TypeError, IndexError):
            return "bad", r.status, data[:300]
    if not streamed:
        try:
            return "ok", r.status, answer_of(json.loads(data))
        except (ValueError, KeyError, TypeError, IndexError):
            return "bad", r.status, data[:300]
    text, done, error = "", False, None
    for line in data.decode("utf-8", "replace").splitlines():
        if not line.startswith("data: "):
            continue
        if line == "data: [DONE]":
            done = True
            continue
        try:
            ev = json.loads(line[6:])
        except ValueError:
            return "bad", r.status, line[:300]
        if "error" in ev:
            error = ev["error"].get("message") or "?"
            continue
        text += "".join(ch.get("text", "") for ch in ev.get("choices", []))
    if error:
        return "error", r.status, error
    return ("ok" if done else "dropped"), r.status, text


def answer_of(j):
    if "data" in j:  # embeddings: exact floats (f32, one thread order)
        return [round(x, 6) for x in j["data"][0]["embedding"]]
    ch = j["choices"][0]
    return ch["message"]["content"] if "message" in ch else ch["text"]


def wait_idle(d, timeout=5 * SLOW):
    """True once no request is running or waiting (the engine may take a step to notice an
    abort)."""
    end = time.time() + timeout
    while True:
        m = d.metrics()
        if m.get("quern_requests_running") == 0 and m.get("quern_requests_waiting") == 0:
            return True
        if time.time() > end:
            return False
        time.sleep(0.02)


def diff(a, b):
    return f"got {str(a)[:120]!r}, want {str(b)[:120]!r}"


def counting_run():
    d = Daemon("count")
    ref, n = {}, 0
    for req in REQUESTS:
        out, st, ans = send(d, req)
        n += 1
        check(out == "ok", f"count run: {req[0]} answers", f"{out} {st} {ans}")
        ref[req[0]] = ans
    d.settle(n)
    rc = d.stop()
    check(rc == 0, "count run: exit 0 on SIGTERM", f"rc={rc}")
    check(not d.sanitizer_report(), "count run: no sanitizer report", d.sanitizer_report() or "")
    ready, total = d.points("ready"), d.points("exit")
    if ready is None or total is None:
        return None
    print(f"count run: points at ready {ready}; at exit {total}", flush=True)
    return ref, ready, total


def request_sweep(ref):
    d = Daemon("request")
    n_sent = 0
    for kind in ("alloc", "kv_block", "write", "read"):
        for ri, req in enumerate(REQUESTS):
            name = req[0]
            if ONLY and f"{name}:{kind}" not in ONLY:
                continue
            n, fired_total = 1, 0
            step = STRIDE if kind == "alloc" else 1  # the others have a few points each
            while True:
                if d.proc.poll() is not None:
                    check(False, f"request sweep: daemon alive ({kind}:{n} {name})",
                          d.sanitizer_report() or "\n    ".join(d.lines[-30:]))
                    d.stop()
                    d = Daemon("request")
                    n_sent = 0
                inj = d.count("fault: injected")
                out, st, ans = send(d, req, fault=f"{kind}:{n}")
                n_sent += 1
                d.settle(n_sent)
                fired = d.count("fault: injected") > inj
                tag = f"request sweep: {name} with {kind}:{n}"
                if out == "hang":
                    check(False, f"{tag}: no hang")
                    tally("request", kind, "hang")
                    return d
                if not fired:
                    check(out == "ok" and ans == ref[name], f"{tag}: clean answer",
                          f"{out} {st} {diff(ans, ref[name])}")
                    break
                fired_total += 1
                if out == "ok":
                    ok = check(ans == ref[name], f"{tag}: a tolerated failure gives the answer",
                               f"{out} {st} {diff(ans, ref[name])}")
                    tally("request", kind, "tolerated" if ok else "WRONG")
                elif out == "error" or (out == "dropped" and kind == "write"):
                    tally("request", kind, out)
                else:
                    check(False, f"{tag}: a clear error", f"{out} {st} {ans}")
                    tally("request", kind, out)
                # nothing of the failed request may stay in the engine
                idle = wait_idle(d)
                check(idle, f"{tag}: nothing left running", str(idle))
                # the next request of the run, clean, must be exact
                nxt = REQUESTS[(ri + 1) % len(REQUESTS)]
                o2, s2, a2 = send(d, nxt)
                n_sent += 1
                check(o2 == "ok" and a2 == ref[nxt[0]],
                      f"{tag}: the next request ({nxt[0]}) is exact", f"{o2} {s2} "
                      f"{diff(a2, ref[nxt[0]])}")
                n += step
            print(f"request sweep: {name}: {kind}: {fired_total} point(s) failed "
                  f"(of about {(n - 1)} at stride {step})", flush=True)
    # nothing may be left holding a sequence or a KV block
    m = d.metrics()
    check(m.get("quern_requests_running") == 0 and m.get("quern_requests_waiting") == 0,
          "request sweep: no request left running or waiting", str(m)[:300])
    return d


def finish(d, what):
    rc = d.stop()
    check(rc == 0, f"{what}: exit 0 on SIGTERM", f"rc={rc}\n    " + "\n    ".join(d.lines[-20:]))
    rep = d.sanitizer_report()
    check(not rep, f"{what}: no sanitizer report", rep or "")


def start_sweep(ref, ready):
    for kind in ("alloc", "read", "kv_block"):
        total = ready.get(kind, 0)
        if total == 0:
            print(f"start-up sweep: {kind}: no points", flush=True)
            continue
        step = max(1, total // STARTS)
        points = sorted(set(list(range(1, total + 1, step)) + [total]))
        for n in points:
            d = Daemon(f"{kind}:{n}", wait=False)
            up = d.wait_ready()
            tag = f"start-up sweep: {kind}:{n}"
            if up:
                out, st, ans = send(d, REQUESTS[0])
                ok = check(out == "ok" and ans == ref["completion"],
                           f"{tag}: came up and answers exactly", f"{out} {st} {ans}")
                tally("start-up", kind, "tolerated" if ok else "WRONG")
                finish(d, tag)
                continue
            rc = d.stop(10 * SLOW)
            # its last words name what failed (not a progress line)
            said = [l for l in d.lines if "quern: fault:" not in l]
            last = said[-1] if said else ""
            named = last.startswith("quern serve: ") and not re.match(
                r"quern serve: (listening on|backend: |ready in|KV pool: )", last)
            rep = d.sanitizer_report()
            ok = check(rc is not None and rc > 0 and named and not rep,
                       f"{tag}: a clean start-up error",
                       f"rc={rc} last={last!r}\n    " + (rep or "\n    ".join(d.lines[-15:])))
            tally("start-up", kind, "error" if ok else "crash")
        print(f"start-up sweep: {kind}: {len(points)} of {total} points "
              f"(stride {step})", flush=True)


def shutdown_sweep(ref):
    d = Daemon("count")
    ready = d.points("ready")
    finish(d, "shutdown count")
    total = d.points("exit")
    for kind in ("alloc", "kv_block", "write", "read"):
        lo, hi = ready.get(kind, 0), total.get(kind, 0)
        for n in range(lo + 1, hi + 1):
            d = Daemon(f"{kind}:{n}")
            finish(d, f"shutdown sweep: {kind}:{n}")
            tally("shutdown", kind, "error")
        print(f"shutdown sweep: {kind}: {hi - lo} point(s)", flush=True)


def main():
    if not os.path.exists(MODEL):
        print(f"skip: no model at {MODEL}")
        return 77
    probe = subprocess.run([BIN, "serve", "--model", "/nonexistent", "--port", "0"],
                           env=dict(os.environ, QUERN_FAULT="bogus"), capture_output=True,
                           text=True)
    if "QUERN_FAULT" not in probe.stderr:
        print("skip: not a -Dfault_injection=true build")
        return 77
    t0 = time.time()
    got = counting_run()
    if not got:
        print("FAIL: the count run printed no fault points")
        return 1
    ref, ready, _ = got
    d = request_sweep(ref)
    finish(d, "request sweep")
    if not ONLY:
        start_sweep(ref, ready)
        shutdown_sweep(ref)
    for (phase, kind), t in sorted(TALLY.items()):
        print(f"outcomes: {phase}: {kind}: " + ", ".join(f"{k} {v}" for k, v in t.items()))
    print(f"{len(FAILS)} failure(s) in {time.time() - t0:.0f} s")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
