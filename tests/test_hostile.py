#!/usr/bin/env python3
"""quern serve against hostile and broken clients (issue 12), with real sockets on loopback.

Each part starts the real daemon on the real model with short limits, so the limits show in
seconds: shutdown while a stream's client does not read (under a poisoning allocator), a second
signal, idle and half-sent connections past --max-connections, slow-loris heads, the cap per
client address, a stream whose client stops reading (back-pressure), request heads with NUL
bytes or garbage, and the smaller items (JSON error bodies, 499 log lines, abort metrics, the
Bearer scheme's case). Exit 0 when every check passed, 1 when one failed, 77 without a model.
QUERN_TEST_ONLY=name,... runs only the parts whose names contain one of them."""
import json
import os
import signal
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http  # noqa: E402  (its Daemon, check and helpers; its main() does not run)
from test_http import Daemon, check, check_sanitizers, kv_idle, wait_until  # noqa: E402

KEY = "k1"
SANITIZED = bool(os.environ.get("QUERN_SANITIZED"))
SLOW = 3 if SANITIZED else 1  # sanitized daemons are a few times slower


def raw(d, data, timeout=5.0, rcvbuf=None, source="127.0.0.1"):
    """Sends data on a fresh connection (from the loopback address source), reads until the
    server closes it (or timeout); returns (bytes, seconds, closed_by_server)."""
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.bind((source, 0))
    s.settimeout(timeout)
    s.connect(("127.0.0.1", d.port))
    t0 = time.time()
    out, closed = b"", False
    try:
        s.sendall(data)
        while True:
            b = s.recv(65536)
            if not b:
                closed = True
                break
            out += b
    except socket.timeout:
        pass
    except (ConnectionResetError, BrokenPipeError):
        closed = True
    finally:
        s.close()
    return out, time.time() - t0, closed


def status_of(resp):
    try:
        return int(resp.split(b" ", 2)[1])
    except (IndexError, ValueError):
        return None


def json_body(resp):
    try:
        return json.loads(resp.split(b"\r\n\r\n", 1)[1])
    except (IndexError, ValueError):
        return None


def health_ok(d, timeout=5.0):
    out, _, _ = raw(d, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", timeout)
    return status_of(out) == 200


def metrics_from(d, source):
    """/metrics fetched from another loopback address (the per-client cap counts addresses)."""
    out, _, _ = raw(d, b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                    source=source)
    m = {}
    for line in out.split(b"\r\n\r\n", 1)[-1].decode(errors="replace").splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            m[k] = float(v)
    return m


def stream_request(d, body, rcvbuf=None):
    """Starts a streamed completion on a raw socket and returns it unread."""
    s = socket.socket()
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", d.port))
    data = json.dumps(dict(body, stream=True)).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " +
              str(len(data)).encode() + b"\r\n\r\n" + data)
    return s


def test_shutdown_with_a_stuck_stream():
    """Item 1: SIGTERM while a stream's client stops reading, under a poisoning allocator: the
    daemon must exit 0, promptly, whatever the order in which things end."""
    env = {"MALLOC_PERTURB_": "165", "GLIBC_TUNABLES": "glibc.malloc.tcache_count=0"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        d = Daemon("--drain-timeout", "1", "--api-key", KEY)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    try:
        s = stream_request(d, {"prompt": "Count forever:", "n": 6, "logprobs": 20,
                               "max_tokens": 1400, "ignore_eos": True}, rcvbuf=1024)
        check(wait_until(lambda: d.metrics().get("quern_generation_tokens_total", 0) > 60, 60),
              "shutdown: the stuck stream generates")
        t0 = time.time()
        d.proc.send_signal(signal.SIGTERM)
        try:
            rc = d.proc.wait(30 * SLOW)
        except Exception:  # noqa: BLE001
            rc = None
        check(rc == 0, "shutdown with a stream nobody reads exits 0 (MALLOC_PERTURB_, no tcache)",
              f"rc={rc} after {time.time() - t0:.1f} s\n    " + "\n    ".join(d.lines[-10:]))
        s.close()
        d.reader.join(10)
        check_sanitizers(d)
    finally:
        d.stop()

    # a second signal cuts the drain short: the daemon exits at once, not after --drain-timeout
    d = Daemon("--drain-timeout", "60", "--api-key", KEY)
    try:
        s = stream_request(d, {"prompt": "Count forever:", "max_tokens": 3000, "ignore_eos": True})
        check(wait_until(lambda: d.metrics().get("quern_requests_running") == 1, 30),
              "second signal: a stream runs")
        d.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        t0 = time.time()
        d.proc.send_signal(signal.SIGINT)
        try:
            rc = d.proc.wait(10 * SLOW)
        except Exception:  # noqa: BLE001
            rc = None
        took = time.time() - t0
        check(rc is not None and took < 5 * SLOW,
              "a second signal during the drain ends the daemon promptly",
              f"rc={rc} after {took:.1f} s")
        s.close()
        d.reader.join(10)
        check(any("second signal" in l for l in d.lines), "the second signal is logged")
        check_sanitizers(d)
    finally:
        d.stop()


def test_idle_connections(d):
    """Item 2: connections that send nothing, or half a head, past --max-connections (20) must
    not lock anyone out: the one idle the longest makes room."""
    idle = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(30)]
    half = []
    for _ in range(20):
        s = socket.create_connection(("127.0.0.1", d.port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        half.append(s)
    time.sleep(1.2)  # a connection may be evicted once it has sat idle for a second
    t0 = time.time()
    ok = health_ok(d)
    check(ok, f"50 idle and half-sent connections (limit 20): /health answers "
          f"({time.time() - t0:.2f} s)")
    st, _, body = d.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, key=KEY)
    check(st == 200, "and a completion is served", f"{st} {body}")
    m = d.metrics()
    check(m.get('quern_http_connections_closed_total{reason="evicted_idle"}', 0) >= 1,
          "/metrics counts the evicted idle connections",
          str(m.get('quern_http_connections_closed_total{reason="evicted_idle"}')))
    for s in idle + half:
        s.close()
    # the next part times a connection from its connect, so it starts once the server has let
    # these 50 go (a guess at why CI once saw its cut 8 s late: the connection accepted late,
    # behind the server's handling of the 50 closing ones; not reproduced here)
    check(wait_until(lambda: d.metrics().get("quern_http_connections_open", 99) <= 1, 30 * SLOW),
          "the 50 connections are let go once their clients close them")


def test_slow_loris(d):
    """Item 3: a head that trickles in one byte at a time is cut at --request-timeout (2 s), and
    so is an idle keep-alive connection."""
    s = socket.create_connection(("127.0.0.1", d.port))
    s.settimeout(10 * SLOW)
    t0 = time.time()
    closed_after = None
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Drip: " + b"a" * 100
    try:
        for ch in head:
            s.sendall(bytes([ch]))
            time.sleep(0.25)
            if time.time() - t0 > 10 * SLOW:
                break
    except (BrokenPipeError, ConnectionResetError):
        closed_after = time.time() - t0
    if closed_after is None:
        try:
            closed_after = time.time() - t0 if s.recv(100) == b"" else None
        except (socket.timeout, ConnectionResetError):
            closed_after = time.time() - t0
    s.close()
    check(closed_after is not None and closed_after < 2 + 2 * SLOW,
          "a head sent one byte every 0.25 s is cut at --request-timeout 2",
          f"closed after {closed_after}; " + ", ".join(
              f"{k} {v:g}" for k, v in d.metrics().items() if k.startswith("quern_http_conn")))
    # an idle keep-alive connection after an answer
    s = socket.create_connection(("127.0.0.1", d.port))
    s.settimeout(10 * SLOW)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    first = s.recv(4096)
    t0 = time.time()
    try:
        rest = s.recv(4096)
        while rest:
            rest = s.recv(4096)
        took = time.time() - t0
    except (socket.timeout, ConnectionResetError):
        took = time.time() - t0 if not isinstance(sys.exc_info()[1], socket.timeout) else None
    s.close()
    check(status_of(first) == 200 and took is not None and took < 2 + 2 * SLOW,
          "an idle keep-alive connection is closed at --request-timeout", f"{took}")
    # a body shorter than its Content-Length: closed at the deadline, not held
    out, took, closed = raw(d, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: "
                            b"Bearer k1\r\nContent-Length: 100\r\n\r\n{\"a\":", timeout=15 * SLOW)
    check(closed and took < 2 + 2 * SLOW and status_of(out) == 408 and
          (json_body(out) or {}).get("error", {}).get("code") == "request_timeout",
          "a body short of its Content-Length is answered 408 (JSON) at --request-timeout",
          f"{took} {out[:300]}")
    check(wait_until(lambda: any(" 408 " in l for l in d.lines), 5 * SLOW),
          "the cut request is logged as 408")


def test_slow_first_token():
    """A stream (or a non-streamed request) that waits in the queue longer than --stall-timeout
    is not the client's idleness: it must be answered in full."""
    d = Daemon("--max-seqs", "1", "--stall-timeout", "1", "--request-timeout", "1",
               "--api-key", test_http.KEY)  # collect() streams with test_http's key
    try:
        # the hog streams until the queued requests have waited past --stall-timeout, then
        # hangs up: a hog of fixed length freed the sequence too soon once decode got faster
        release = threading.Event()

        def hog_stream():
            c = d.conn()
            c.request("POST", "/v1/completions", body=json.dumps({
                "prompt": "Count:", "max_tokens": 3000, "ignore_eos": True, "stream": True}),
                headers={"Authorization": f"Bearer {test_http.KEY}"})
            r = c.getresponse()
            while not release.is_set() and r.readline():
                pass
            c.sock.shutdown(socket.SHUT_RDWR)
            c.close()

        hog = threading.Thread(target=hog_stream)
        hog.start()
        check(wait_until(lambda: d.metrics().get("quern_requests_running") == 1, 30),
              "slow first token: the engine's only sequence is taken")
        results = {}

        def streamed():
            t0 = time.time()
            texts, finish, _, _, done = test_http.collect(d, "/v1/completions", {
                "prompt": "Hi", "max_tokens": 3, "ignore_eos": True, "stream": True})
            results["stream"] = (finish.get(0), done, time.time() - t0)

        def plain():
            st, _, body = d.post("/v1/completions", {"prompt": "Hello", "max_tokens": 3,
                                                     "ignore_eos": True})
            results["plain"] = (st, body)

        ts = [threading.Thread(target=streamed), threading.Thread(target=plain)]
        for t in ts:
            t.start()
        time.sleep(1.5)
        release.set()
        for t in ts + [hog]:
            t.join(120 * SLOW)
        finish, done, took = results.get("stream", (None, False, 0))
        check(finish == "length" and done and took > 1,
              f"a stream queued {took:.1f} s (over --stall-timeout 1) gets every chunk and [DONE]",
              str(results.get("stream")))
        st, body = results.get("plain", (None, None))
        check(st == 200, "so does a non-streamed request queued as long", f"{st} {body}")
        check_sanitizers(d)
    finally:
        d.stop()


def test_per_client_cap():
    """Item 3: one address may hold at most --max-connections-per-client connections; past it,
    the client's own idlest connection makes room, and with none idle the new one is refused."""
    d = Daemon("--max-connections-per-client", "2", "--api-key", KEY, "--max-seqs", "4")
    try:
        busy = [stream_request(d, {"prompt": "Count:", "max_tokens": 3000, "ignore_eos": True})
                for _ in range(2)]
        other = "127.0.0.2"
        check(wait_until(lambda: metrics_from(d, other).get("quern_requests_running") == 2, 30),
              "per client: two streams run")
        time.sleep(1.2)
        out, took, closed = raw(d, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", timeout=5)
        check(closed and status_of(out) is None,
              "a third connection from the address is refused while two are being served",
              f"{out[:80]} closed={closed} {took:.2f}s")
        m = metrics_from(d, other)
        check(m.get('quern_http_connections_closed_total{reason="refused"}', 0) >= 1,
              "/metrics counts the refusal")
        for s in busy:
            s.close()
        check(wait_until(lambda: metrics_from(d, other).get("quern_requests_running") == 0, 30),
              "per client: the streams end")
        check(wait_until(lambda: metrics_from(d, other).get("quern_http_connections_open", 9) <= 1,
                         10), "their connections close")
        idle = [socket.create_connection(("127.0.0.1", d.port)) for _ in range(2)]
        time.sleep(1.2)
        check(health_ok(d), "with two idle connections, a new one evicts the idlest")
        for s in idle:
            s.close()
        check_sanitizers(d)
    finally:
        d.stop()


def test_back_pressure(d):
    """Item 4: a stream whose client stops reading stops generating, and is aborted at
    --stall-timeout (3 s) with its KV blocks freed."""
    before = d.metrics()
    s = stream_request(d, {"prompt": "Write a very long story.", "n": 2, "logprobs": 20,
                           "max_tokens": 3000, "ignore_eos": True}, rcvbuf=1024)
    fail = 'quern_request_failure_total{finished_reason="abort"}'
    paused = wait_until(lambda: d.metrics().get("quern_requests_paused", 0) == 2 or
                        d.metrics().get(fail, 0) >= before.get(fail, 0) + 2, 60 * SLOW) and \
        d.metrics().get("quern_requests_paused", 0) == 2
    # Under a sanitizer the engine may be too slow to fill the channel before the socket's
    # --stall-timeout cuts the connection; the stream must still end, bounded.
    check(paused or SANITIZED, "a client that stops reading pauses its stream "
          "(quern_requests_paused)", str(d.metrics().get("quern_requests_paused")))
    if paused:
        gen = d.metrics()["quern_generation_tokens_total"]
        time.sleep(1)
        m = d.metrics()
        check(m["quern_generation_tokens_total"] == gen or m.get("quern_requests_paused") != 2,
              "a paused stream generates nothing",
              f"{gen} -> {m['quern_generation_tokens_total']}")
    check(wait_until(lambda: d.metrics().get(fail, 0) >= before.get(fail, 0) + 2, 15 * SLOW),
          "after --stall-timeout it is aborted")
    check(wait_until(lambda: kv_idle(d) and d.metrics().get("quern_kv_blocks_used") == 0,
                     15 * SLOW), "and its KV blocks are free", str(d.metrics()))
    generated = d.metrics()["quern_generation_tokens_total"] - before["quern_generation_tokens_total"]
    check(generated < 2 * 600, f"it generated a bounded number of tokens ({generated:.0f})")
    s.close()
    st, _, _ = d.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2}, key=KEY)
    check(st == 200, "the daemon keeps serving")


def test_malformed_heads(d):
    """Item 6: NUL bytes, garbage request lines, missing versions."""
    cases = [
        ("a NUL in the path", b"GET /health\0x HTTP/1.1\r\nHost: x\r\n\r\n"),
        ("a NUL in Authorization",
         b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k1\0junk\r\n"
         b"Connection: close\r\n\r\n"),
        ("a NUL in the last header",
         b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
         b"Authorization: Bearer k1\0junk\r\n\r\n"),
        ("a NUL in a header name", b"GET /health HTTP/1.1\r\nHo\0st: x\r\n\r\n"),
        # found by tests/fuzz/fuzz_http_head: MHD took the line for the empty one that ends the
        # head and dropped it unseen
        ("a header line that starts with NULs",
         b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\0\0Authorization: Bearer k1\0junk\r\n\r\n"),
        ("a header line of NULs", b"GET /health HTTP/1.1\r\nHost: x\r\n\0\0\0\r\n\r\n"),
        ("a NUL in the method", b"GE\0T /health HTTP/1.1\r\nHost: x\r\n\r\n"),
    ]
    for what, data in cases:
        out, took, closed = raw(d, data)
        check(status_of(out) == 400 and closed and
              (json_body(out) or {}).get("error", {}).get("code") in ("malformed_request", None),
              f"{what}: 400 and closed", repr(out[:200]))
    for what, data in [("a garbage request line", b"HELLO\r\n\r\n"),
                       ("binary garbage", b"\x16\x03\x01\x00\xa5\x01\x00garbage\r\n\r\n"),
                       ("no HTTP version", b"GET /health\r\n\r\n"),
                       ("a space in the URL", b"GET /hea lth HTTP/1.1\r\nHost: x\r\n\r\n")]:
        out, took, closed = raw(d, data)
        check(closed and took < 1.5 * SLOW and status_of(out) in (None, 400),
              f"{what}: a 400 or a prompt close", f"{took:.2f}s {out[:80]!r}")
    for what, data in [("bare LF line ends", b"GET /v1/models HTTP/1.1\nHost: x\nAuthorization: "
                        b"Bearer k1\nConnection: close\n\n"),
                       ("the scheme in lower case", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                        b"Authorization: bearer k1\r\nConnection: close\r\n\r\n"),
                       ("the scheme in upper case", b"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                        b"Authorization: BEARER k1\r\nConnection: close\r\n\r\n")]:
        out, _, _ = raw(d, data)
        check(status_of(out) == 200, f"well-formed, {what}: 200", repr(out[:120]))
    out, _, _ = raw(d, b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearerk1\r\n"
                    b"Connection: close\r\n\r\n")
    check(status_of(out) == 401, "'Bearerk1' (no space) is refused", repr(out[:80]))


def test_error_bodies(d):
    """Item 7: 413, 414 and 431 answers are the OpenAI JSON error shape."""
    for what, want, data in [
        ("a 10 KB URL", 414, b"GET /health?" + b"a" * 10000 +
         b" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        ("70 KB of headers", 431, b"GET /health HTTP/1.1\r\nHost: x\r\n" +
         b"".join(b"X-%d: %s\r\n" % (i, b"v" * 1000) for i in range(70)) +
         b"Connection: close\r\n\r\n"),
    ]:
        out, _, _ = raw(d, data)
        body = json_body(out) or {}
        check(status_of(out) == want and isinstance(body.get("error"), dict) and
              body["error"].get("message"), f"{what}: {want} with a JSON error body",
              repr(out[:300]))
    big = b"x" * (3 << 20)
    out, _, _ = raw(d, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k1\r\n"
                    b"Content-Length: " + str(len(big)).encode() + b"\r\nConnection: close\r\n\r\n"
                    + big)
    check(status_of(out) == 413 and isinstance((json_body(out) or {}).get("error"), dict),
          "a 3 MB body: 413 with a JSON error body", repr(out[:200]))


def test_abort_accounting(d):
    """Item 7: a stream cut short logs 499 with the tokens it streamed, and counts as a
    failure (abort), not a success."""
    before = d.metrics()
    c = d.conn()
    c.request("POST", "/v1/completions", body=json.dumps({
        "prompt": "Write a long essay.", "max_tokens": 2000, "ignore_eos": True,
        "stream": True}), headers={"Authorization": f"Bearer {KEY}"})
    r = c.getresponse()
    got = 0
    while got < 6:
        got += r.readline().startswith(b"data: ")
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    fail = 'quern_request_failure_total{finished_reason="abort"}'
    check(wait_until(lambda: d.metrics().get(fail, 0) >= before.get(fail, 0) + 1, 15 * SLOW),
          "an aborted stream counts in quern_request_failure_total{abort}")
    after = d.metrics()
    check('quern_request_success_total{finished_reason="abort"}' not in after,
          "and quern_request_success_total has no abort")
    lines = [l for l in d.lines if " 499 " in l and "/v1/completions" in l]
    out = int(lines[-1].split("output=")[1].split()[0]) if lines else 0
    check(out >= 5, "the 499 log line counts the streamed tokens", lines[-1] if lines else "none")


def test_trace_on_sigusr1():
    """Issue 21's trace from a serving daemon: written on SIGUSR1 while it serves, and at exit;
    each holds together (tests/check_trace.py)."""
    import subprocess
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"quern-trace-{os.getpid()}.json")
    checker = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_trace.py")
    d = Daemon("--api-key", test_http.KEY, "--trace", path)
    try:
        for _ in range(3):
            st, _, _ = d.post("/v1/completions", {"prompt": "Hello there", "max_tokens": 4})
            check(st == 200, "trace: a request is served")
        check(wait_until(lambda: kv_idle(d), 10 * SLOW), "trace: the engine is idle")
        d.proc.send_signal(signal.SIGUSR1)
        check(wait_until(lambda: any("trace written" in l for l in d.lines), 10 * SLOW),
              "SIGUSR1 writes the trace and the daemon goes on")
        r = subprocess.run([sys.executable, checker, path, "3"], capture_output=True, text=True)
        check(r.returncode == 0, "the SIGUSR1 trace holds together", r.stdout + r.stderr)
        st, _, _ = d.post("/v1/completions", {"prompt": "Hello", "max_tokens": 2})
        check(st == 200, "trace: served after SIGUSR1")
        rc = d.stop()
        check(rc == 0, "trace: the daemon exits 0", str(rc))
        r = subprocess.run([sys.executable, checker, path, "4"], capture_output=True, text=True)
        check(r.returncode == 0, "the trace written at exit holds together", r.stdout + r.stderr)
        check_sanitizers(d)
    finally:
        d.stop()
        if os.path.exists(path):
            os.unlink(path)


def test_idle_rss(d):
    """Item 7: an idle daemon with the default 256 MiB KV pool is resident for what it uses
    (weights, tokenizer), not for its pools (1.28 GB before)."""
    if SANITIZED:
        print("-- test_idle_rss: skipped under a sanitizer (its shadow memory counts)")
        return
    with open(f"/proc/{d.proc.pid}/status") as f:
        rss = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024
    check(rss < 300, f"an idle daemon is resident for {rss:.0f} MiB (< 300)")


def main():
    if not test_http.BIN or not os.path.exists(test_http.BIN):
        print("skip: QUERN_BIN not set or missing")
        return 77
    if not test_http.MODEL or not os.path.exists(test_http.MODEL):
        print(f"skip: no model at {test_http.MODEL!r}")
        return 77
    only = os.environ.get("QUERN_TEST_ONLY", "")

    def run(t, *args):
        if only and not any(o in t.__name__ for o in only.split(",")):
            return
        t0 = time.time()
        try:
            t(*args)
        except Exception as e:  # noqa: BLE001 - one broken part must not hide the rest
            check(False, f"{t.__name__} raised {type(e).__name__}: {e}")
        print(f"-- {t.__name__}: {time.time() - t0:.1f} s")

    d = Daemon("--api-key", KEY, "--max-connections", "20", "--max-connections-per-client", "0",
               "--request-timeout", "2", "--stall-timeout", "3")
    try:
        if not only or "rss" in only:
            test_idle_rss(d)
        for t in (test_malformed_heads, test_error_bodies, test_idle_connections, test_slow_loris,
                  test_back_pressure, test_abort_accounting):
            run(t, d)
    finally:
        rc = d.stop()
        d.reader.join(10)
        check(rc == 0, "the daemon exits 0 on SIGTERM", str(rc))
        check_sanitizers(d)
    run(test_per_client_cap)
    run(test_slow_first_token)
    run(test_trace_on_sigusr1)
    run(test_shutdown_with_a_stuck_stream)
    if test_http.FAILS:
        print(f"\n{len(test_http.FAILS)} check(s) failed; daemon log tail:")
        for l in d.lines[-40:]:
            print("    " + l)
        return 1
    print("test_hostile: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
