#!/usr/bin/env python3
"""Soak and overload test of `quern serve` against hostile and broken clients (stdlib only).

    tools/soak.py --bin PATH [--model PATH] [--duration S] [--clients N] [--seed N]
                  [--log FILE] [--op-timeout S] [--details] [-- extra daemon args]

Usually run through tools/soak.sh. Starts the daemon itself on 127.0.0.1 port 0 with a KV pool
small enough to force preemption (--ctx 256 --kv-mem 12M --max-seqs 16 --max-queue 16
--max-batch-tokens 64 --max-connections 256 --drain-timeout 10; extra args after -- come later
and win), plus --request-timeout 5 --stall-timeout 5 --max-connections-per-client 0 where
`quern serve --help` lists them. Then for
--duration seconds N clients at once, each with a fixed role:
  well-behaved  completions and chat, streamed or not, n>1, logprobs, JSON formats on some
                chats, short/medium prompts, long prompts near the context (and KV pool) limit,
                a few long generations; keep-alive connections; a 429/503 makes it wait
                Retry-After
  disconnect    closes before the answer, mid-stream (FIN or RST), or mid-body, on purpose
  slow reader   tiny SO_RCVBUF; reads a few bytes every few seconds, or stops reading entirely
  idle          connects and sends nothing, or half-sent headers a byte at a time (slow-loris),
                or a body that trickles in
  malformed     bad JSON, wrong types, garbage request lines, NUL bytes, Content-Length larger
                than the body, huge headers, bodies over --max-body, bad chunking, ...
and a /health poller every 0.5 s on a fresh connection with a 5 s timeout. Every socket
operation has a timeout; everything stops at --duration. Then it waits up to 30 s for the daemon
to settle, reads /metrics, sends SIGTERM and prints one table. Exit 0 only when: KV blocks in use
= 0, nothing running/waiting, /health never failed, well-behaved clients saw no transport error
or timeout and no status other than 200/429/503, the daemon exited 0 after SIGTERM, logged no
sanitizer report and never crashed. Exit 1 otherwise, 2 on bad usage or when it cannot start."""
import argparse
import asyncio
import errno
import json
import os
import platform
import random
import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

HOST = "127.0.0.1"
SANITIZER_RE = re.compile(r"ERROR: AddressSanitizer|runtime error:|LeakSanitizer|"
                          r"ThreadSanitizer|ERROR: MemorySanitizer")
# soak daemon settings; the optional ones only when `quern serve --help` lists them
BASE_ARGS = ["--ctx", "256", "--kv-mem", "12M", "--max-seqs", "16", "--max-queue", "16",
             "--max-batch-tokens", "64", "--max-connections", "256", "--drain-timeout", "10"]
OPTIONAL_ARGS = [("--request-timeout", "5"), ("--stall-timeout", "5"),
                 ("--max-connections-per-client", "0")]
ROLES = [("well-behaved", 0.50), ("disconnect", 0.10), ("slow-reader", 0.08), ("idle", 0.12),
         ("malformed", 0.20)]
HOSTILE_HOLD = (15.0, 35.0)  # idle / slow-loris / slow readers give up after this long
MALFORMED_WAIT = 10.0        # a malformed request waits this long for an answer
IO_TIMEOUT = 30.0            # connect and send; waiting for an answer: --op-timeout

WORDS = ("time year people way day man thing woman life child world school state family student "
         "group country problem hand part place case week company system program question work "
         "government number night point home water room mother area money story fact month lot "
         "right study book eye job word business issue side kind head house service friend "
         "father power hour game line end member law car city community name president team "
         "minute idea kid body information back parent face others level office door health "
         "person art war history party result change morning reason research girl guy moment "
         "air teacher force education river mountain garden robot paint color light music").split()
# the JSON formats of some chats: their grammars (masks, forced runs) under the same disconnects
# and load. (Tools would too, but their definitions alone take ~330 tokens of the SmolLM2
# template, past the soak's 256-token context.)
SOAK_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                "n": {"type": "integer"}},
               "required": ["name", "n"], "additionalProperties": False}
SHORT_PROMPTS = [
    "Once upon a time", "The capital of France is", "Write a haiku about the sea.",
    "List three primary colors:", "def fibonacci(n):", "Translate 'good morning' to Spanish:",
    "The best way to learn a language is", "Q: What is 2+2?\nA:", "Hello", "Summarize: the cat sat",
    "Why is the sky blue?", "Tell me a joke about robots.", "1, 2, 3, 4,", "Dear diary,",
    "Explain recursion in one sentence.", "Name a famous painter.", "In 1969, humans",
    "The recipe for pancakes:", "A short poem about autumn:", "What does a CPU do?",
]


def now():
    return time.monotonic()


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def fmt_ms(x):
    return "-" if x is None else f"{x * 1000:.0f} ms"


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + f" ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return (platform.processor() or platform.machine()) + f" ({os.cpu_count()} CPUs)"


def rss_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


# ------------------------------------------------------------------------------------ daemon


class Daemon:
    """quern serve on 127.0.0.1 port 0; its stdout and stderr go to the log file."""

    def __init__(self, argv, log_path):
        self.argv = argv
        self.port = None
        self.ctx = None
        self.ready = threading.Event()
        self.sanitizer = []
        self.tail = []
        self.crashed_at = None
        self.log = open(log_path, "w", errors="replace")
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace",
                                     start_new_session=True)
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.log.write(line)
            line = line.rstrip("\n")
            self.tail = (self.tail + [line])[-40:]
            if SANITIZER_RE.search(line) and len(self.sanitizer) < 20:
                self.sanitizer.append(line)
            if self.port is None:
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
            if "ready in" in line:
                m = re.search(r"context (\d+) tokens", line)
                if m:
                    self.ctx = int(m.group(1))
                self.ready.set()
        self.log.flush()
        self.ready.set()

    def wait_ready(self, timeout):
        end = now() + timeout
        while now() < end and self.proc.poll() is None and not self.ready.is_set():
            self.ready.wait(0.2)
        return self.ready.is_set() and self.port is not None and self.proc.poll() is None

    def stop(self, timeout):
        """SIGTERM; the exit code, or None when it had to be killed."""
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None

    def close(self):
        self.reader.join(10)
        try:
            self.log.close()
        except OSError:
            pass


def supported_flags(binary):
    try:
        p = subprocess.run([binary, "serve", "--help"], capture_output=True, text=True,
                           errors="replace", timeout=30)
        return p.stdout + p.stderr
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)


# ------------------------------------------------------------- blocking HTTP (probes, setup)


def simple_request(port, method, path, body=None, timeout=5.0):
    """One request on a fresh connection with an overall deadline: (status, headers, body)."""
    end = now() + timeout
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout)
        s.connect((HOST, port))
        data = body.encode() if isinstance(body, str) else (body or b"")
        head = f"{method} {path} HTTP/1.1\r\nHost: {HOST}:{port}\r\nConnection: close\r\n"
        if body is not None:
            head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
        s.sendall(head.encode() + b"\r\n" + data)
        buf = b""
        while True:
            left = end - now()
            if left <= 0:
                raise socket.timeout("overall deadline")
            s.settimeout(left)
            chunk = s.recv(65536)
            if not chunk:
                break
            buf += chunk
            if b"\r\n\r\n" in buf:
                h, _, rest = buf.partition(b"\r\n\r\n")
                m = re.search(rb"\r\ncontent-length:\s*(\d+)", h, re.I)
                if m and len(rest) >= int(m.group(1)):
                    break
        h, sep, rest = buf.partition(b"\r\n\r\n")
        if not sep:
            raise ConnectionError("incomplete response head")
        lines = h.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers[k.strip().lower()] = v.strip()
        if "chunked" in headers.get("transfer-encoding", "").lower():
            rest = dechunk_all(rest)
        return status, headers, rest
    finally:
        s.close()


def dechunk_all(b):
    out, i = b"", 0
    while True:
        j = b.find(b"\r\n", i)
        if j < 0:
            return out
        size = int(b[i:j].split(b";")[0] or b"0", 16)
        if size == 0:
            return out
        out += b[j + 2:j + 2 + size]
        i = j + 2 + size + 2


def read_metrics(port, timeout=5.0):
    st, _, body = simple_request(port, "GET", "/metrics", timeout=timeout)
    if st != 200:
        raise ConnectionError(f"/metrics answered {st}")
    out = {}
    for line in body.decode("utf-8", "replace").splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                out[name] = float(value)
            except ValueError:
                pass
    return out


# ------------------------------------------------------------------------ async raw client


class EOFErr(ConnectionError):
    pass


class Protocol(Exception):
    pass


class Conn:
    """A raw non-blocking socket; every operation has a timeout."""

    def __init__(self, sock):
        self.sock = sock
        self.buf = b""
        self.closed = False

    @classmethod
    async def open(cls, port, timeout, rcvbuf=None):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            if rcvbuf:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            s.setblocking(False)
            await asyncio.wait_for(asyncio.get_running_loop().sock_connect(s, (HOST, port)),
                                   timeout)
        except BaseException:
            s.close()
            raise
        return cls(s)

    async def send(self, data, timeout):
        await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(self.sock, data), timeout)

    async def recv(self, timeout, n=65536):
        data = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(self.sock, n), timeout)
        if not data:
            raise EOFErr("closed by the server")
        return data

    async def fill(self, timeout):
        self.buf += await self.recv(timeout)

    async def read_head(self, timeout, limit=1 << 17):
        """Status and headers (lower-case names); skips 1xx answers."""
        while True:
            while b"\r\n\r\n" not in self.buf:
                if len(self.buf) > limit:
                    raise Protocol("response head too large")
                await self.fill(timeout)
            head, _, self.buf = self.buf.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            parts = lines[0].split(" ", 2)
            if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
                raise Protocol(f"bad status line {lines[0][:60]!r}")
            status = int(parts[1])
            headers = {}
            for ln in lines[1:]:
                k, _, v = ln.partition(":")
                headers[k.strip().lower()] = v.strip()
            if 100 <= status < 200:
                continue
            return status, headers

    async def body_pieces(self, headers, timeout, head_only=False):
        """Yields the body's bytes as they arrive (chunked, Content-Length or until close)."""
        if head_only:
            return
        if "chunked" in headers.get("transfer-encoding", "").lower():
            while True:
                while b"\r\n" not in self.buf:
                    if len(self.buf) > 4096:
                        raise Protocol("bad chunk size line")
                    await self.fill(timeout)
                line, _, self.buf = self.buf.partition(b"\r\n")
                try:
                    size = int(line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise Protocol(f"bad chunk size {line[:20]!r}")
                if size == 0:
                    while b"\r\n" not in self.buf:  # trailers end with an empty line
                        await self.fill(timeout)
                    while not self.buf.startswith(b"\r\n"):
                        _, _, self.buf = self.buf.partition(b"\r\n")
                        while b"\r\n" not in self.buf:
                            await self.fill(timeout)
                    self.buf = self.buf[2:]
                    return
                while len(self.buf) < size + 2:
                    await self.fill(timeout)
                piece, self.buf = self.buf[:size], self.buf[size + 2:]
                yield piece
        elif "content-length" in headers:
            left = int(headers["content-length"])
            while left > 0:
                if not self.buf:
                    await self.fill(timeout)
                piece, self.buf = self.buf[:left], self.buf[left:]
                left -= len(piece)
                yield piece
        else:
            while True:
                if self.buf:
                    piece, self.buf = self.buf, b""
                    yield piece
                try:
                    await self.fill(timeout)
                except EOFErr:
                    return

    async def read_body(self, headers, timeout, limit=64 << 20):
        out = bytearray()
        async for piece in self.body_pieces(headers, timeout):
            out += piece
            if len(out) > limit:
                raise Protocol("response body too large")
        return bytes(out)

    def close(self, rst=False):
        if self.closed:
            return
        self.closed = True
        try:
            if rst:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.sock.close()
        except OSError:
            pass


def http_request_bytes(port, method, path, body=None, headers=None, close=False):
    data = b""
    if body is not None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = [f"{method} {path} HTTP/1.1", f"Host: {HOST}:{port}", "User-Agent: quern-soak"]
    if body is not None:
        h += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    if close:
        h.append("Connection: close")
    for k, v in (headers or {}).items():
        h.append(f"{k}: {v}")
    return ("\r\n".join(h) + "\r\n\r\n").encode() + data


# ------------------------------------------------------------------------------- results


class Result:
    __slots__ = ("group", "scen", "outcome", "status", "retry_after", "phase", "detail", "t",
                 "ttft", "latency", "stream", "held", "rid", "events")

    def __init__(self, group, scen, t):
        self.group, self.scen, self.t = group, scen, t
        self.outcome = self.status = self.retry_after = self.detail = None
        self.phase = "connect"
        self.ttft = self.latency = self.held = self.rid = None
        self.stream = False
        self.events = 0

    def set_status(self, status, headers):
        self.status = status
        self.retry_after = headers.get("retry-after")
        self.rid = headers.get("x-request-id")
        self.outcome = f"status {status}"


TRANSPORT = ("closed by the server", "reset by the server", "timeout", "connection refused",
             "broken pipe", "bad response", "socket error")


def classify(exc, r):
    ph = r.phase
    if isinstance(exc, (asyncio.TimeoutError, socket.timeout)):
        return f"timeout ({ph})"
    if isinstance(exc, EOFErr):
        return f"closed by the server ({ph})"
    if isinstance(exc, ConnectionResetError):
        return f"reset by the server ({ph})"
    if isinstance(exc, ConnectionRefusedError):
        return f"connection refused ({ph})"
    if isinstance(exc, BrokenPipeError):
        return f"broken pipe ({ph})"
    if isinstance(exc, (Protocol, ValueError, KeyError, TypeError, UnicodeDecodeError)):
        r.detail = str(exc)[:160]
        return f"bad response ({ph})"
    if isinstance(exc, OSError):
        return f"socket error {errno.errorcode.get(exc.errno, exc.errno)} ({ph})"
    r.detail = repr(exc)[:160]
    return f"client bug {type(exc).__name__} ({ph})"


def is_transport(outcome):
    return outcome is not None and outcome.startswith(TRANSPORT)


# ---------------------------------------------------------------------------------- soak


class Soak:
    def __init__(self, a, port, ctx, kv_total, flags):
        self.a = a
        self.port = port
        self.ctx = ctx
        self.kv_total = kv_total
        self.flags = flags  # optional daemon flags in use
        self.results = []
        self.deadline = None
        self.start = None
        self.long_completion = []  # calibrated near-limit prompts
        self.long_chat = []
        self.long_budget = 0
        self.stale_retries = 0

    # ---- prompts

    def words(self, rng, n):
        return " ".join(rng.choice(WORDS) for _ in range(n))

    def calibrate(self, rng):
        """Prompts whose token count is just under min(ctx, KV pool) - max_tokens."""
        pool_tokens = self.kv_total * 16 if self.kv_total else self.ctx
        limit = min(self.ctx, pool_tokens)
        self.long_budget = limit
        target = limit - 8 - 16  # max_tokens <= 8, one block of slack
        if target < 64:
            return
        base = self.words(rng, target)
        for i in range(6):
            for chat in (False, True):
                # half share a prefix with the base text (prefix-cache hits), half are fresh
                text = base if i % 2 == 0 else self.words(rng, target)
                words = text.split()
                if i % 2 == 0 and i:
                    cut = len(words) * 3 // 4
                    words = words[:cut] + self.words(rng, len(words) - cut).split()
                for _ in range(4):
                    if chat:
                        body = {"messages": [{"role": "user", "content": " ".join(words)}]}
                    else:
                        body = {"prompt": " ".join(words)}
                    st, _, resp = simple_request(self.port, "POST", "/tokenize",
                                                 json.dumps(body), timeout=30)
                    if st != 200:
                        break
                    count = json.loads(resp)["count"]
                    if count <= target:
                        if count >= target - 24:
                            (self.long_chat if chat else self.long_completion).append(
                                (" ".join(words), count))
                        break
                    words = words[:max(1, int(len(words) * target / count) - 2)]

    def gen_body(self, rng, stream=None, chat=None, heavy=False):
        """A valid completion or chat request; returns (path, body, n)."""
        chat = rng.random() < 0.5 if chat is None else chat
        stream = rng.random() < 0.5 if stream is None else stream
        r = rng.random()
        n = 1
        max_tokens = 1 + int(31 * rng.random() ** 1.5)  # 1..32, mostly small (mean ~13)
        long_pool = self.long_chat if chat else self.long_completion
        near_limit = False  # a prompt sized to just fit: nothing may be added to it
        if heavy:  # slow readers: enough bytes to back up the socket
            prompt = rng.choice(SHORT_PROMPTS)
            max_tokens = rng.randint(16, 48)
            n = rng.randint(1, 2)
        elif r < 0.04 and long_pool:
            prompt, _ = rng.choice(long_pool)  # near the context and KV pool limit
            max_tokens = rng.randint(1, 8)
            near_limit = True
        elif r < 0.08:
            # a few long generations, some n=3: several sequences growing at once run the
            # small KV pool dry, which forces preemption
            prompt = rng.choice(SHORT_PROMPTS)
            max_tokens = rng.randint(40, 64)
            n = rng.choice([1, 3])
        elif r < 0.25:
            prompt = self.words(rng, rng.randint(20, 80))
        else:
            prompt = rng.choice(SHORT_PROMPTS)
        if max_tokens <= 32 and not heavy and rng.random() < 0.15:
            n = rng.randint(2, 4)
        body = {"max_tokens": max_tokens, "temperature": rng.choice([0, 0, 0.7, 1.0])}
        if n > 1:
            body["n"] = n
        if rng.random() < 0.3:
            body["seed"] = rng.randint(0, 1 << 30)
        if rng.random() < 0.3 or max_tokens > 32:
            body["ignore_eos"] = True
        if rng.random() < 0.15:
            # a predicted output: drafted from whatever the server's --spec mode is, so
            # rejected drafts' rollback runs under load, preemption and disconnects too
            body["prediction"] = {"type": "content", "content": rng.choice(
                [prompt, self.words(rng, rng.randint(4, 60))])}
        if rng.random() < 0.2:
            # vLLM's priority: the queue and the preemption victims reorder under load
            body["priority"] = rng.choice([-1, 1, 5])
        if rng.random() < 0.1:
            body["stop"] = rng.sample([" the", ".", "\n", " a"], 2)
            body["include_stop_str_in_output"] = rng.random() < 0.5
        if rng.random() < 0.05:
            body["truncate_prompt_tokens"] = rng.randint(1, 48)
        if chat:
            msgs = [{"role": "user", "content": prompt}]
            if rng.random() < 0.2:
                msgs = [{"role": "system", "content": "You are a terse assistant."},
                        {"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello."}] + msgs
            if rng.random() < 0.1 and not near_limit:
                # an assistant prefill the model writes on (continue_final_message)
                msgs = msgs + [{"role": "assistant", "content": self.words(rng, rng.randint(1, 6))}]
                body["continue_final_message"] = True
            body["messages"] = msgs
            if rng.random() < 0.25 or heavy:
                body["logprobs"] = True
                body["top_logprobs"] = rng.randint(0, 20 if heavy else 5)
            if rng.random() < 0.15 and not heavy:
                body["response_format"] = rng.choice([
                    {"type": "json_object"},
                    {"type": "json_schema", "json_schema": {"name": "s", "schema": SOAK_SCHEMA}}])
        else:
            body["prompt"] = prompt
            if rng.random() < 0.25 or heavy:
                body["logprobs"] = rng.randint(0, 20 if heavy else 5)
        if stream:
            body["stream"] = True
            if rng.random() < 0.5:
                body["stream_options"] = {"include_usage": True}
        return ("/v1/chat/completions" if chat else "/v1/completions"), body, n

    # ---- bookkeeping

    def new(self, group, scen):
        return Result(group, scen, now() - self.start)

    def done(self, r):
        self.results.append(r)

    def left(self):
        return self.deadline - now()

    async def nap(self, s):
        await asyncio.sleep(max(0.0, min(s, self.left())))

    # ---- well-behaved

    async def well_behaved(self, rng):
        conn = None
        reuse = rng.randint(1, 5)  # requests per keep-alive connection
        used = 0
        retry = None  # a request refused with 429/503 is sent again (up to 5 times)
        try:
            while self.left() > 0:
                if retry and retry[3] < 5:
                    path, body, n, tries = retry
                    retry = (path, body, n, tries + 1)
                else:
                    path, body, n = self.gen_body(rng)
                    retry = (path, body, n, 0)
                if conn is not None and used >= reuse:
                    conn.close()
                    conn, used = None, 0
                r = self.new("well-behaved", ("streamed " if body.get("stream") else "") +
                             ("chat" if "chat" in path else "completion") +
                             (f" n={n}" if n > 1 else ""))
                r.stream = bool(body.get("stream"))
                reused = conn is not None
                try:
                    conn, keep = await self.wb_request(conn, path, body, n, r, reused)
                    used += 1
                    if not keep:
                        conn.close()
                        conn, used = None, 0
                except asyncio.CancelledError:
                    if r.outcome is None:
                        r.outcome = "cut off by the end of the soak"
                    self.done(r)
                    raise
                except Exception as e:
                    r.outcome = classify(e, r)
                    r.held = now() - self.start - r.t
                    plen = len(body.get("prompt") or json.dumps(body.get("messages")))
                    r.detail = (f"n={n} max_tokens={body['max_tokens']} prompt {plen} chars" +
                                (f"; {r.detail}" if r.detail else ""))
                    if conn is not None:
                        conn.close()
                    conn, used = None, 0
                self.done(r)
                if r.status not in (429, 503):
                    retry = None
                if r.status in (429, 503):
                    try:
                        ra = min(5.0, max(0.2, float(r.retry_after or 1)))
                    except ValueError:
                        ra = 1.0
                    await self.nap(ra * rng.uniform(0.5, 1.5))
                else:
                    await self.nap(rng.uniform(0, 0.5))
        finally:
            if conn is not None:
                conn.close()

    async def wb_request(self, conn, path, body, n, r, reused):
        T = self.a.op_timeout
        data = http_request_bytes(self.port, "POST", path, body)
        t0 = now()
        for attempt in (0, 1):
            if conn is None:
                r.phase = "connect"
                conn = await Conn.open(self.port, IO_TIMEOUT)
                reused = False
            try:
                r.phase = "send"
                await conn.send(data, IO_TIMEOUT)
                r.phase = "response head"
                status, headers = await conn.read_head(T)
                break
            except (EOFErr, ConnectionResetError, BrokenPipeError):
                # a kept-alive connection the server closed between requests: retry once on a
                # fresh one, as every HTTP client does
                if not reused or conn.buf or attempt:
                    raise
                conn.close()
                conn = None
                self.stale_retries += 1
        keep = headers.get("connection", "").lower() != "close"
        r.set_status(status, headers)
        if status != 200 or not body.get("stream"):
            r.phase = "response body"
            raw = await conn.read_body(headers, T)
            if status == 200:
                doc = json.loads(raw)
                if len(doc.get("choices", [])) != n:
                    raise Protocol(f"{len(doc.get('choices', []))} choices, asked for {n}")
                bad = [c.get("finish_reason") for c in doc["choices"]
                       if c.get("finish_reason") not in ("stop", "length")]
                if bad:
                    raise Protocol(f"finish_reason {bad[0]!r}")
                r.latency = now() - t0
            return conn, keep
        # streamed 200: SSE until [DONE]
        r.phase = "stream"
        text = b""
        finished, done, usage = set(), False, False
        async for piece in conn.body_pieces(headers, T):
            text += piece  # a chunk may end inside a UTF-8 sequence: split on bytes
            while b"\n\n" in text:
                ev, text = text.split(b"\n\n", 1)
                for line in ev.decode("utf-8").split("\n"):
                    if not line.startswith("data: "):
                        continue
                    r.events += 1
                    payload = line[6:]
                    if payload == "[DONE]":
                        done = True
                        continue
                    doc = json.loads(payload)
                    if "error" in doc:
                        raise Protocol(f"error event: {payload[:120]}")
                    if doc.get("usage"):
                        usage = True
                    for ch in doc.get("choices", []):
                        piece_text = ch.get("text")
                        if piece_text is None:
                            piece_text = (ch.get("delta") or {}).get("content")
                        if piece_text and r.ttft is None:
                            r.ttft = now() - t0
                        fr = ch.get("finish_reason")
                        if fr:
                            if fr not in ("stop", "length"):
                                raise Protocol(f"finish_reason {fr!r}")
                            finished.add(ch.get("index"))
        if not done:
            raise Protocol("stream ended without [DONE]")
        if len(finished) != n:
            raise Protocol(f"{len(finished)} of {n} choices finished")
        if body.get("stream_options", {}).get("include_usage") and not usage:
            raise Protocol("no usage chunk")
        r.latency = now() - t0
        return conn, keep

    # ---- clients that disconnect on purpose

    async def disconnect(self, rng):
        T = self.a.op_timeout
        while self.left() > 0:
            mode = rng.choice(["before answer", "before answer", "mid-stream", "mid-stream RST",
                               "mid-body", "right after send"])
            stream = mode.startswith("mid-stream")
            path, body, n = self.gen_body(rng, stream=stream)
            if mode.startswith("before") and not stream:
                body["max_tokens"] = rng.randint(16, 48)
            r = self.new("disconnect", mode)
            r.stream = stream
            conn = None
            try:
                conn = await Conn.open(self.port, IO_TIMEOUT)
                data = http_request_bytes(self.port, "POST", path, body)
                r.phase = "send"
                if mode == "mid-body":
                    await conn.send(data[:rng.randint(1, len(data) - 1)], IO_TIMEOUT)
                    await self.nap(rng.uniform(0, 2))
                    r.outcome = "closed by the client on purpose"
                elif mode == "right after send":
                    await conn.send(data, IO_TIMEOUT)
                    r.outcome = "closed by the client on purpose"
                elif mode == "before answer":
                    await conn.send(data, IO_TIMEOUT)
                    await self.nap(rng.uniform(0.05, 3))
                    r.outcome = "closed by the client on purpose"
                else:
                    await conn.send(data, IO_TIMEOUT)
                    r.phase = "response head"
                    status, headers = await conn.read_head(T)
                    r.set_status(status, headers)
                    if status == 200:
                        r.phase = "stream"
                        want = rng.randint(1, 8)
                        got = 0
                        async for piece in conn.body_pieces(headers, T):
                            got += piece.count(b"data: ")
                            if got >= want:
                                r.outcome = "closed by the client on purpose"
                                break
                    else:
                        await conn.read_body(headers, T)
            except asyncio.CancelledError:
                r.outcome = r.outcome or "cut off by the end of the soak"
                self.done(r)
                raise
            except Exception as e:
                r.outcome = classify(e, r)
            finally:
                if conn is not None:
                    conn.close(rst=mode.endswith("RST"))
            self.done(r)
            await self.nap(rng.uniform(0, 0.5) + (1 if r.status in (429, 503) else 0))

    # ---- slow readers

    async def slow_reader(self, rng):
        while self.left() > 0:
            mode = rng.choice(["trickle", "stop reading"])
            heavy = rng.random() < 0.3
            path, body, n = self.gen_body(rng, stream=True, heavy=heavy)
            r = self.new("slow-reader", mode)
            r.stream = True
            conn = None
            t0 = now()
            hold = rng.uniform(*HOSTILE_HOLD)
            try:
                conn = await Conn.open(self.port, IO_TIMEOUT, rcvbuf=1024)
                r.phase = "send"
                await conn.send(http_request_bytes(self.port, "POST", path, body), IO_TIMEOUT)
                r.phase = "response head"
                status, headers = await conn.read_head(self.a.op_timeout, limit=1 << 17)
                r.set_status(status, headers)
                if status != 200:
                    await conn.read_body(headers, self.a.op_timeout)
                else:
                    r.phase = "stream"
                    r.outcome = None
                    end = min(t0 + hold, self.deadline)
                    if mode == "trickle":
                        complete = False
                        while now() < end:
                            await self.nap(min(rng.uniform(1, 4), end - now()))
                            if now() >= end:
                                break
                            try:
                                conn.buf += await conn.recv(max(0.1, end - now()),
                                                            n=rng.randint(8, 64))
                            except asyncio.TimeoutError:
                                break
                            if b"[DONE]" in conn.buf[-64:] or b"\r\n0\r\n\r\n" in conn.buf[-16:]:
                                complete = True
                                break
                            conn.buf = conn.buf[-64:]
                        r.held = now() - t0
                        r.outcome = ("status 200 (read slowly to the end)" if complete
                                     else "closed by the client on purpose")
                    else:
                        await self.nap(end - now())
                        r.held = now() - t0
                        r.outcome = await self.drain_verdict(conn)
            except asyncio.CancelledError:
                r.outcome = r.outcome or "cut off by the end of the soak"
                self.done(r)
                raise
            except (EOFErr, ConnectionResetError) as e:
                r.held = now() - t0
                r.outcome = classify(e, r) if r.phase != "stream" else "aborted by the server"
            except Exception as e:
                r.outcome = classify(e, r)
            finally:
                if conn is not None:
                    conn.close()
            self.done(r)
            await self.nap(rng.uniform(0, 1) + (1 if r.status in (429, 503) else 0))

    async def drain_verdict(self, conn):
        """After not reading for a while: did the server finish, abort, or is it still there?"""
        data = conn.buf
        try:
            while True:
                data = (data + await conn.recv(2.0))[-256:]
                if data.endswith(b"0\r\n\r\n") and b"[DONE]" in data:
                    return "status 200 (all of it sat in buffers)"
        except (EOFErr, ConnectionResetError):
            return "status 200 (all of it sat in buffers)" if b"[DONE]" in data else \
                "aborted by the server"
        except asyncio.TimeoutError:
            return "closed by the client on purpose"

    # ---- idle connections and slow-loris

    async def idle(self, rng):
        while self.left() > 0:
            mode = rng.choice(["send nothing", "slow-loris headers", "slow body"])
            r = self.new("idle", mode)
            conn = None
            recv = None
            t0 = now()
            hold = rng.uniform(*HOSTILE_HOLD)
            end = min(t0 + hold, self.deadline)
            try:
                conn = await Conn.open(self.port, IO_TIMEOUT)
                r.phase = "hold"
                recv = asyncio.ensure_future(conn.recv(max(0.1, end - now()), n=4096))
                pending = b""
                if mode == "slow-loris headers":
                    pending = (f"POST /v1/completions HTTP/1.1\r\nHost: {HOST}\r\n"
                               "X-Soak: " + "a" * 400).encode()
                elif mode == "slow body":
                    body = json.dumps({"prompt": "hi " * 40, "max_tokens": 1}).encode()
                    head = http_request_bytes(self.port, "POST", "/v1/completions", body)
                    cut = len(head) - len(body)
                    await conn.send(head[:cut], IO_TIMEOUT)
                    pending = body
                while not recv.done() and now() < end:
                    if pending:
                        step = 1 if mode == "slow-loris headers" else rng.randint(1, 3)
                        await conn.send(pending[:step], IO_TIMEOUT)
                        pending = pending[step:]
                    await asyncio.wait([recv], timeout=min(rng.uniform(1, 2.5), end - now()))
                r.held = now() - t0
                if recv.done():
                    try:
                        data = recv.result()
                        m = re.match(rb"HTTP/1\.[01] (\d{3})", data)
                        r.status = int(m.group(1)) if m else None
                        r.outcome = f"closed by the server with {r.status or 'bytes'}"
                    except EOFErr:
                        r.outcome = "closed by the server (no answer)"
                    except ConnectionResetError:
                        r.outcome = "reset by the server (no answer)"
                    except asyncio.TimeoutError:
                        r.outcome = "closed by the client on purpose"
                else:
                    recv.cancel()
                    # a hold the soak's deadline cut short may end before the server's timeout
                    r.outcome = ("cut off by the end of the soak" if end < t0 + hold
                                 else "closed by the client on purpose")
            except asyncio.CancelledError:
                r.outcome = r.outcome or "cut off by the end of the soak"
                self.done(r)
                raise
            except (EOFErr, ConnectionResetError, BrokenPipeError) as e:
                r.held = now() - t0
                r.outcome = ("closed by the server (while the client was sending)"
                             if r.phase == "hold" else classify(e, r))
            except Exception as e:
                r.outcome = classify(e, r)
            finally:
                if recv is not None and not recv.done():
                    recv.cancel()
                elif recv is not None and not recv.cancelled():
                    recv.exception()  # retrieved: no 'never retrieved' warning
                if conn is not None:
                    conn.close()
            self.done(r)
            await self.nap(rng.uniform(0, 1))

    # ---- malformed requests

    def malformed_case(self, rng):
        """(name, bytes, how): how is 'read', 'shut' (half-close after sending) or 'hold'."""
        p = self.port
        post = lambda body, path="/v1/completions", hdr=None: http_request_bytes(  # noqa: E731
            p, "POST", path, body, hdr, close=True)
        wrong = [{"prompt": 5}, {"prompt": "hi", "max_tokens": "ten"}, {"prompt": "hi", "n": "2"},
                 {"prompt": "hi", "n": 0}, {"prompt": "hi", "n": 1000},
                 {"prompt": "hi", "max_tokens": -1}, {"prompt": "hi", "stream": "yes"},
                 {"prompt": "hi", "temperature": "hot"}, {"prompt": "hi", "top_p": 7},
                 {"prompt": "hi", "logprobs": 50}, {"prompt": "hi", "stop": 5},
                 {"prompt": "hi", "stop": [1, 2]}, {"prompt": []}, {"prompt": [[]]},
                 {"prompt": [-1]}, {"prompt": [999999999]}, {"prompt": None},
                 {"prompt": {"a": 1}}, {"prompt": "hi", "seed": "x"},
                 {"prompt": "hi", "stream_options": 3}, {"prompt": "hi", "max_tokens": 1e300},
                 {"prompt": "hi", "logit_bias": "x"}, {"prompt": ["a"] * 100, "max_tokens": 1}]
        wrong_chat = [{"messages": "hi"}, {"messages": []}, {"messages": [{"role": 5}]},
                      {"messages": [{"role": "user"}]},
                      {"messages": [{"role": "wizard", "content": "x"}]},
                      {"messages": [{"role": "user", "content": 5}]},
                      {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
                      {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 3},
                      {"messages": [{"role": "user", "content": "x"}], "logprobs": "yes"}]
        cases = [
            ("bad JSON", lambda: post(rng.choice([b'{"prompt": "hi", "max_tokens": ',
                                                  b'{"prompt": "hi"}}', b"{'prompt': 'hi'}",
                                                  b'{"prompt": "hi\\x"}', b"\xff\xfe\x00{"])),
             "read"),
            ("not an object", lambda: post(rng.choice([b"[1,2,3]", b'"str"', b"null", b"",
                                                       b"42", b"true"])), "read"),
            ("wrong types", lambda: post(rng.choice(wrong)), "read"),
            ("wrong types (chat)", lambda: post(rng.choice(wrong_chat), "/v1/chat/completions"),
             "read"),
            ("garbage request line", lambda: rng.choice([
                b"GARBAGE\r\n\r\n", b"GET\r\n\r\n", b"GET / HTTP/1.1 extra words\r\n\r\n",
                b"GET /health HTTP/7.0\r\nHost: x\r\n\r\n", b"\r\n\r\n\r\n",
                b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + os.urandom(64),
                b"POST /v1/completions HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}",
                b"GET " + b"/a" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                b"BREW /coffee HTCPCP/1.0\r\n\r\n"]), "shut"),
            ("random bytes", lambda: os.urandom(rng.randint(1, 4096)), "shut"),
            ("NUL in path", lambda: rng.choice([
                b"GET /hea\x00lth HTTP/1.1\r\nHost: x\r\n\r\n",
                b"POST /v1/completions\x00/x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
                b"GET /\x00\x00\x00 HTTP/1.1\r\nHost: x\r\n\r\n",
                b"GET /health HTTP/1.1\r\nHost: x\r\nX-Nul: a\x00b\r\n\r\n"]), "shut"),
            ("NUL in body", lambda: post(rng.choice([
                b'{"prompt": "a\x00b", "max_tokens": 1}',
                b'{"prompt": "a\\u0000b", "max_tokens": 1}',
                b'{"messages": [{"role": "user", "content": "x\\u0000"}], "max_tokens": 1}'])),
             "read"),
            ("invalid UTF-8 / lone surrogate", lambda: post(rng.choice([
                b'{"prompt": "\xff\xfe\xc3", "max_tokens": 1}',
                b'{"prompt": "\\ud800", "max_tokens": 1}',
                b'{"messages": [{"role": "user", "content": "\\udfff\xc0\xaf"}], "max_tokens": 1}'
            ]), "/v1/chat/completions" if rng.random() < 0.5 else "/v1/completions"), "read"),
            ("Content-Length > body", lambda: (
                f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {rng.randint(100, 5000)}\r\n\r\n").encode() +
                b'{"prompt": "hi", "max_tokens": 1}', rng.choice(["hold", "shut"])),
            ("bad Content-Length", lambda: (
                "POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + rng.choice([
                    "Content-Length: -1\r\n", "Content-Length: abc\r\n",
                    "Content-Length: 2\r\nContent-Length: 30\r\n",
                    "Content-Length: 99999999999999999999999\r\n",
                    "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"]) +
                "\r\n{}").encode(), "shut"),
            ("bad chunking", lambda: (
                b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                rng.choice([b"zz\r\nhello\r\n0\r\n\r\n", b"FFFFFFFFFFFFFFFF\r\nabc",
                            b"5\r\n{}\r\n0\r\n\r\n", b"-1\r\n\r\n", b"3\r\n{}"])), "shut"),
            ("huge headers", lambda: rng.choice([
                b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * rng.randint(9000, 200000) +
                b"\r\n\r\n",
                b"GET /health HTTP/1.1\r\nHost: x\r\n" +
                b"".join(b"X-H%d: v\r\n" % i for i in range(rng.randint(200, 3000))) + b"\r\n"]),
             "shut"),
            ("body over --max-body", lambda: (
                f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {rng.choice([3 << 20, 100 << 20, 1 << 40])}\r\n\r\n").encode() +
                b'{"prompt": "' + b"x" * rng.randint(0, 1 << 16), "shut"),
            ("wrong method or path", lambda: rng.choice([
                http_request_bytes(p, "DELETE", "/v1/completions", close=True),
                http_request_bytes(p, "GET", "/v1/chat/completions", close=True),
                http_request_bytes(p, "POST", "/nope", {"a": 1}, close=True),
                http_request_bytes(p, "GET", "/../../etc/passwd", close=True),
                http_request_bytes(p, "PUT", "/health", b"x", close=True),
                http_request_bytes(p, "GET", "/v1/models?x=" + "%00" * 50, close=True),
                http_request_bytes(p, "OPTIONS", "*", close=True)]), "read"),
            ("deep nesting", lambda: post(rng.choice([b"[" * 200000, b'{"a":' * 100000,
                                                      b'{"prompt": ' + b"[" * 50000])), "shut"),
            ("prompt over the context", lambda: post(
                {"prompt": self.words(rng, self.ctx * 2), "max_tokens": 4}), "read"),
            ("too many messages", lambda: post(
                {"messages": [{"role": "user", "content": "hi"}] * 2000, "max_tokens": 1},
                "/v1/chat/completions"), "read"),
            ("pipelined", lambda: http_request_bytes(p, "GET", "/health") +
             http_request_bytes(p, "POST", "/tokenize", {"prompt": "hi"}) +
             http_request_bytes(p, "GET", "/nope", close=True), "shut"),
            ("HTTP/1.0, no Host", lambda: b"GET /health HTTP/1.0\r\n\r\n", "read"),
            ("Expect: 100-continue", lambda: post(
                {"prompt": "hi", "max_tokens": 1}, hdr={"Expect": "100-continue"}), "read"),
            ("bad tokenize/detokenize", lambda: rng.choice([
                post({"tokens": [10 ** 9]}, "/detokenize"), post({"tokens": "x"}, "/detokenize"),
                post({"tokens": [-5]}, "/detokenize"), post({"prompt": 7}, "/tokenize"),
                post(b"{", "/tokenize")]), "read"),
        ]
        return rng.choice(cases)

    async def malformed(self, rng):
        while self.left() > 0:
            name, build, how = self.malformed_case(rng)
            r = self.new("malformed", name)
            conn = None
            t0 = now()
            try:
                data = build()
                conn = await Conn.open(self.port, IO_TIMEOUT)
                r.phase = "send"
                try:
                    await conn.send(data, MALFORMED_WAIT)
                except (ConnectionResetError, BrokenPipeError):
                    pass  # the server answered and closed before taking it all: read the answer
                if how == "shut":
                    try:
                        conn.sock.shutdown(socket.SHUT_WR)
                    except OSError:
                        pass
                r.phase = "response head"
                wait = min(MALFORMED_WAIT, max(0.1, self.left()))
                try:
                    status, headers = await conn.read_head(wait)
                except asyncio.TimeoutError:
                    r.held = now() - t0
                    r.outcome = f"no answer in {wait:.0f} s; closed by the client on purpose"
                else:
                    r.set_status(status, headers)
                    r.phase = "response body"
                    await conn.read_body(headers, wait)
            except asyncio.CancelledError:
                r.outcome = r.outcome or "cut off by the end of the soak"
                self.done(r)
                raise
            except Exception as e:
                if r.status is None:
                    r.outcome = classify(e, r)
                    r.held = now() - t0
            finally:
                if conn is not None:
                    conn.close()
            self.done(r)
            await self.nap(rng.uniform(0.2, 1.5) + (1 if r.status in (429, 503) else 0))

    # ---- run

    async def run(self, roles, seed):
        self.start = now()
        self.deadline = self.start + self.a.duration
        funcs = {"well-behaved": self.well_behaved, "disconnect": self.disconnect,
                 "slow-reader": self.slow_reader, "idle": self.idle, "malformed": self.malformed}

        async def client(i, role):
            rng = random.Random(seed * 100003 + i)
            await asyncio.sleep(rng.uniform(0, min(3.0, self.a.duration / 10)))
            while self.left() > 0:
                try:
                    await funcs[role](rng)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # a bug in this script: keep the client going
                    r = self.new(role, "client")
                    r.outcome = f"client bug {type(e).__name__}"
                    r.detail = repr(e)[:200]
                    self.done(r)
                    await self.nap(1)

        tasks = [asyncio.ensure_future(client(i, role)) for i, role in enumerate(roles)]
        while self.left() > 0 and not STOP.is_set():
            await asyncio.sleep(min(0.25, max(0.0, self.left())))
        for t in tasks:
            t.cancel()
        await asyncio.wait(tasks, timeout=10)


STOP = threading.Event()  # set when the daemon died: the clients stop at once


class HealthPoller(threading.Thread):
    def __init__(self, port, until):
        super().__init__(daemon=True)
        self.port, self.until = port, until
        self.made = self.ok = 0
        self.failures = []
        self.slowest = 0.0

    def run(self):
        nxt = now()
        while now() < self.until and not STOP.is_set():
            t0 = now()
            self.made += 1
            try:
                st, _, body = simple_request(self.port, "GET", "/health", timeout=5.0)
                if st == 200:
                    self.ok += 1
                else:
                    self.failures.append((t0, f"status {st} {body[:80]!r}"))
            except Exception as e:
                self.failures.append((t0, f"{type(e).__name__}: {e}"[:100]))
            self.slowest = max(self.slowest, now() - t0)
            nxt += 0.5
            time.sleep(max(0.0, min(nxt - now(), self.until - now())))
            nxt = max(nxt, now())


class Sampler(threading.Thread):
    """RSS after warm-up and the peak; notices the daemon dying."""

    def __init__(self, daemon, t0, warmup, until):
        super().__init__(daemon=True)
        self.d, self.t0, self.warmup, self.until = daemon, t0, warmup, until
        self.rss_warm = None
        self.rss_peak = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            if self.d.proc.poll() is not None:
                self.d.crashed_at = now() - self.t0
                STOP.set()
                return
            rss = rss_kib(self.d.proc.pid)
            if rss:
                self.rss_peak = max(self.rss_peak, rss)
                if self.rss_warm is None and now() - self.t0 >= self.warmup:
                    self.rss_warm = rss
            self.stop.wait(0.5)


def assign_roles(n, rng):
    counts = [int(n * w) for _, w in ROLES]
    rema = sorted(range(len(ROLES)), key=lambda i: -(n * ROLES[i][1] - counts[i]))
    for i in rema[:n - sum(counts)]:
        counts[i] += 1
    roles = [name for (name, _), c in zip(ROLES, counts) for _ in range(c)]
    rng.shuffle(roles)
    return roles, dict(zip([r for r, _ in ROLES], counts))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", default=None)
    ap.add_argument("--duration", type=float, default=600)
    ap.add_argument("--clients", type=int, default=300)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--op-timeout", type=float, default=120.0,
                    help="how long a client waits for the next bytes of an answer (120 s; "
                    "connect and send: 30 s)")
    ap.add_argument("--log", default=None, help="daemon log file (default: a temp file)")
    ap.add_argument("--details", action="store_true",
                    help="also print outcomes per client kind and scenario")
    ap.add_argument("--cmdline", default=None, help=argparse.SUPPRESS)
    ap.add_argument("daemon_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    extra = a.daemon_args[1:] if a.daemon_args[:1] == ["--"] else a.daemon_args
    if not 1 <= a.duration <= 600:
        ap.error("--duration wants 1..600 seconds")
    if not 1 <= a.clients <= 2000:
        ap.error("--clients wants 1..2000")
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    t_begin = now()

    print(f"soak: cpu: {cpu_model()}")
    print(f"soak: command: {a.cmdline or ' '.join([sys.argv[0]] + sys.argv[1:])}")
    help_text = supported_flags(a.bin)
    if "--kv-mem" not in help_text:
        print(f"soak: `{a.bin} serve --help` does not look like quern serve:\n{help_text[:500]}")
        return 2
    opt = []
    missing = []
    for flag, val in OPTIONAL_ARGS:
        if re.search(re.escape(flag) + r"\b", help_text):
            opt += [flag, val]
        else:
            missing.append(flag)
    argv = [a.bin, "serve", "--host", HOST, "--port", "0"]
    if a.model:
        argv += ["--model", a.model]
    argv += BASE_ARGS + opt + extra
    log_path = a.log or os.path.join(
        os.environ.get("TMPDIR", "/tmp"), f"quern-soak-{os.getpid()}.log")
    print(f"soak: daemon: {' '.join(argv)}")
    if missing:
        print(f"soak: not passed (not in serve --help yet): {' '.join(missing)}")
    print(f"soak: daemon log: {log_path}; seed {seed}")
    sys.stdout.flush()

    d = Daemon(argv, log_path)
    DAEMONS.append(d)
    if not d.wait_ready(180):
        rc = d.stop(10)
        d.close()
        print(f"soak: FAIL: the daemon did not become ready (exit {rc}):\n  " +
              "\n  ".join(d.tail[-20:]))
        return 2
    t_ready = now() - t_begin
    try:
        m0 = read_metrics(d.port, 10)
    except Exception as e:
        m0 = {}
        print(f"soak: warning: /metrics at start: {e}")
    kv_total = int(m0.get("quern_kv_blocks_total", 0))
    soak = Soak(a, d.port, d.ctx or 512, kv_total, opt)
    rng = random.Random(seed)
    try:
        soak.calibrate(rng)
    except Exception as e:
        print(f"soak: warning: long-prompt calibration failed: {e}")
    roles, counts = assign_roles(a.clients, rng)
    print(f"soak: ready in {t_ready:.1f} s on port {d.port}: context {d.ctx}, "
          f"{kv_total} KV blocks; long prompts: {len(soak.long_completion)} completion, "
          f"{len(soak.long_chat)} chat (~{max([c for _, c in soak.long_completion] or [0])} "
          f"tokens); {a.clients} clients for {a.duration:.0f} s: " +
          ", ".join(f"{c} {r}" for r, c in counts.items()))
    sys.stdout.flush()

    t_clients = now()
    warmup = min(15.0, a.duration / 4)
    sampler = Sampler(d, t_clients, warmup, t_clients + a.duration)
    sampler.start()
    health = HealthPoller(d.port, t_clients + a.duration)
    health.start()
    # the hard stop: whatever happens, never run past duration + 150 s
    watchdog = threading.Timer(a.duration + 150, lambda: (
        print("soak: FAIL: watchdog: still running at duration + 150 s; killing the daemon",
              flush=True), d.proc.kill(), os._exit(1)))
    watchdog.daemon = True
    watchdog.start()

    asyncio.run(soak.run(roles, seed))
    health.join(10)
    t_stop = now()

    # settle: KV blocks and the queues drain once every client is gone
    settle = None
    mend = {}
    settle_err = None
    while now() - t_stop < 30 and d.proc.poll() is None:
        try:
            mend = read_metrics(d.port, 5)
            settle_err = None
            if (mend.get("quern_kv_blocks_used", -1) == 0 and
                    mend.get("quern_requests_running", -1) == 0 and
                    mend.get("quern_requests_waiting", -1) == 0):
                settle = now() - t_stop
                break
        except Exception as e:
            settle_err = f"{type(e).__name__}: {e}"
        time.sleep(0.5)
    sampler.stop.set()
    sampler.join(5)
    crashed = d.proc.poll() is not None
    crash_rc = d.proc.returncode if crashed else None
    rss_end = rss_kib(d.proc.pid) if not crashed else None
    t_term = now()
    exit_rc = d.stop(60) if not crashed else crash_rc
    t_exit = now() - t_term
    d.close()
    watchdog.cancel()
    total = now() - t_begin
    return report(a, soak, d, counts, health, sampler, mend, settle, settle_err, crashed,
                  crash_rc, rss_end, exit_rc, t_exit, total, missing)


def report(a, soak, d, counts, health, sampler, mend, settle, settle_err, crashed, crash_rc,
           rss_end, exit_rc, t_exit, total, missing):
    res = soak.results
    fails, warns = [], []
    rows = []

    def row(item, value, check=""):
        rows.append((item, str(value), check))

    def by_group(rs):
        g = {}
        for r in rs:
            g[r.group] = g.get(r.group, 0) + 1
        return ", ".join(f"{k} {v}" for k, v in sorted(g.items(), key=lambda kv: -kv[1]))

    row("soak", f"{a.duration:.0f} s, {a.clients} clients (" +
        ", ".join(f"{c} {r}" for r, c in counts.items()) + f"); {total:.0f} s in all")
    n_req = len(res)
    row("requests (attempts)", f"{n_req} ({n_req / max(1.0, a.duration):.1f}/s)")
    wb = [r for r in res if r.group == "well-behaved"]
    # statuses
    statuses = {}
    for r in res:
        if r.status is not None and r.outcome and r.outcome.startswith("status"):
            statuses.setdefault(r.status, []).append(r)
    for code in sorted(statuses):
        rs = statuses[code]
        v = f"{len(rs)} ({by_group(rs)})"
        if code in (429, 503):
            with_ra = sum(1 for r in rs if r.retry_after)
            v += f"; Retry-After on {with_ra} of {len(rs)}"
            if with_ra != len(rs):
                warns.append(f"{len(rs) - with_ra} of the {code}s had no Retry-After")
        label = {200: "200"}.get(code, f"{code}")
        row(f"status {label}", v)
    if 429 not in statuses:
        row("status 429", "0")
    if 503 not in statuses:
        row("status 503", "0")
    slow_done = [r for r in res if r.outcome and r.outcome.startswith("status 200 (")]
    on_purpose = [r for r in res if r.outcome and "closed by the client on purpose" in r.outcome]
    row("aborted/disconnected by the client on purpose",
        f"{len(on_purpose)} ({by_group(on_purpose)})")
    srv_closed = [r for r in res if r.group != "well-behaved" and r.outcome and
                  (r.outcome.startswith("closed by the server") or
                   r.outcome.startswith("reset by the server") or
                   r.outcome == "aborted by the server" or is_transport(r.outcome))]
    kinds = {}
    for r in srv_closed:
        kinds[r.outcome] = kinds.get(r.outcome, 0) + 1
    row("closed by the server / transport errors, hostile clients (expected)",
        f"{len(srv_closed)}" + (": " + "; ".join(f"{k} {v}" for k, v in
                                                  sorted(kinds.items(), key=lambda kv: -kv[1])[:8])
                                if kinds else ""))
    unexpected = [r for r in wb if r.outcome and (is_transport(r.outcome) or
                                                  r.outcome.startswith("client bug"))]
    ukinds = {}
    for r in unexpected:
        ukinds[r.outcome] = ukinds.get(r.outcome, 0) + 1
    row("transport errors/timeouts, well-behaved clients (unexpected)",
        f"{len(unexpected)}" + (": " + "; ".join(f"{k} {v}" for k, v in ukinds.items())
                                if ukinds else ""), "ok" if not unexpected else "FAIL")
    if unexpected:
        fails.append(f"{len(unexpected)} unexpected transport errors/timeouts for well-behaved "
                     "clients")
    wb_bad_status = [r for r in wb if r.outcome and r.outcome.startswith("status") and
                     r.status not in (200, 429, 503)]
    row("well-behaved requests answered other than 200/429/503", len(wb_bad_status),
        "ok" if not wb_bad_status else "FAIL")
    if wb_bad_status:
        fails.append(f"{len(wb_bad_status)} well-behaved requests got statuses other than "
                     "200/429/503")
    srv5 = [r for r in res if r.group != "well-behaved" and r.status and r.status >= 500 and
            r.status not in (503, 505)]
    if srv5:
        warns.append(f"{len(srv5)} hostile requests got a 5xx: " + ", ".join(
            sorted({f"{r.scen} -> {r.status}" for r in srv5}))[:300])
    def admitted(multi):
        rs = [r for r in wb if r.status is not None and (" n=" in r.scen) == multi]
        return sum(1 for r in rs if r.status == 200), len(rs)
    a1, t1 = admitted(False)
    an, tn = admitted(True)
    row("well-behaved attempts admitted (200): n=1 / n>1",
        f"{a1} of {t1} ({100.0 * a1 / max(1, t1):.1f}%) / {an} of {tn} "
        f"({100.0 * an / max(1, tn):.1f}%)")
    if tn >= 50 and an * 5 < tn * a1 / max(1, t1):
        warns.append(f"n>1 requests were admitted far less often than n=1 ({an} of {tn} vs {a1} "
                     f"of {t1}): each choice takes a queue slot, so under overload they starve")
    cut = [r for r in res if r.outcome == "cut off by the end of the soak"]
    row("in flight when the soak ended (not counted)", f"{len(cut)} ({by_group(cut)})")
    bugs = [r for r in res if r.outcome and r.outcome.startswith("client bug") and
            r.group != "well-behaved"]

    ru = resource.getrusage(resource.RUSAGE_SELF)
    row("soak client CPU (this script)", f"{ru.ru_utime + ru.ru_stime:.1f} s "
        f"({100.0 * (ru.ru_utime + ru.ru_stime) / max(1.0, total):.0f}% of one core)")
    if bugs:
        warns.append(f"{len(bugs)} soak client errors: {bugs[0].outcome} {bugs[0].detail}")
    if soak.stale_retries:
        row("kept-alive connections found closed, retried", soak.stale_retries)
    # hostile details
    idle = [r for r in res if r.group == "idle" and r.outcome != "cut off by the end of the soak"]
    idle_closed = [r for r in idle if r.outcome and ("by the server" in r.outcome)]
    held = sorted(r.held for r in idle_closed if r.held is not None)
    v = f"{len(idle_closed)} of {len(idle)}"
    if held:
        v += f" (median after {pct(held, 50):.1f} s)"
    rt = "--request-timeout" not in missing
    row("idle/slow-loris connections closed by the server", v,
        "" if not rt or not idle or len(idle_closed) == len(idle) else "WARN")
    if rt and idle and len(idle_closed) < len(idle):
        warns.append(f"--request-timeout 5: {len(idle) - len(idle_closed)} of {len(idle)} idle/"
                     "slow-loris connections were still open when the client gave up "
                     f"({HOSTILE_HOLD[0]:.0f}-{HOSTILE_HOLD[1]:.0f} s)")
    slow = [r for r in res if r.group == "slow-reader" and r.status == 200 or
            (r.group == "slow-reader" and r.outcome == "aborted by the server")]
    slow_ab = [r for r in slow if r.outcome == "aborted by the server"]
    slow_fin = [r for r in slow if r.outcome and r.outcome.startswith("status 200 (")]
    row("admitted slow readers: aborted by the server / finished anyway / gave up",
        f"{len(slow_ab)} / {len(slow_fin)} / "
        f"{sum(1 for r in slow if r.outcome == 'closed by the client on purpose')}")
    # end state
    if not mend:
        fails.append("could not read /metrics at the end" +
                     (f" ({settle_err})" if settle_err else ""))
    kv_used = mend.get("quern_kv_blocks_used")
    running = mend.get("quern_requests_running")
    waiting = mend.get("quern_requests_waiting")
    pre = mend.get("quern_preemptions_total")
    row("preemptions", "?" if pre is None else int(pre), "ok" if pre else "WARN")
    if not pre:
        warns.append("no preemption happened: the KV pool was not small enough to force it")
    gen = mend.get("quern_generation_tokens_total")
    if gen is not None:
        row("tokens generated / prompt tokens prefilled / from the prefix cache",
            f"{int(gen)} ({gen / max(1.0, a.duration):.0f}/s) / "
            f"{int(mend.get('quern_prompt_tokens_total', 0))} / "
            f"{int(mend.get('quern_prefix_cache_hit_tokens_total', 0))}")
    ok_kv = kv_used == 0
    row("KV blocks in use at the end",
        f"{'?' if kv_used is None else int(kv_used)} of {soak.kv_total} (peak "
        f"{int(mend.get('quern_kv_blocks_peak', 0))})" +
        (f"; settled {settle:.1f} s after the clients stopped" if settle is not None else
         "; did not settle in 30 s"), "ok" if ok_kv else "FAIL")
    if not ok_kv and mend:
        fails.append(f"KV blocks in use at the end: {kv_used} (must be 0)")
    ok_q = running == 0 and waiting == 0
    row("requests running / waiting at the end",
        f"{'?' if running is None else int(running)} / {'?' if waiting is None else int(waiting)}",
        "ok" if ok_q else "FAIL")
    if not ok_q and mend:
        fails.append(f"requests running/waiting at the end: {running}/{waiting} (must be 0/0)")
    rw = sampler.rss_warm
    if rw and rss_end:
        growth = rss_end - rw
        row(f"daemon RSS after warm-up ({sampler.warmup:.0f} s) / at the end / growth",
            f"{rw / 1024:.1f} MiB / {rss_end / 1024:.1f} MiB / {growth / 1024:+.1f} MiB "
            f"({100.0 * growth / rw:+.1f}%); peak {sampler.rss_peak / 1024:.1f} MiB")
    else:
        row("daemon RSS after warm-up / at the end", f"{rw} / {rss_end} KiB")
    ttft = [r.ttft for r in wb if r.stream and r.status == 200 and r.ttft is not None]
    lat = [r.latency for r in wb if not r.stream and r.status == 200 and r.latency is not None]
    row("TTFT of admitted streamed requests p50 / p99",
        f"{fmt_ms(pct(ttft, 50))} / {fmt_ms(pct(ttft, 99))} (n={len(ttft)})")
    row("latency of non-streamed 200s p50 / p99",
        f"{fmt_ms(pct(lat, 50))} / {fmt_ms(pct(lat, 99))} (n={len(lat)})")
    hf = len(health.failures)
    row("/health polls / answered 200 / failed",
        f"{health.made} / {health.ok} / {hf} (slowest {health.slowest:.2f} s)",
        "ok" if hf == 0 and health.made else "FAIL")
    if hf:
        first = health.failures[0]
        fails.append(f"/health failed {hf} times (first at {first[0] - sampler.t0:.1f} s: "
                     f"{first[1]})")
    if crashed:
        row("daemon exit code after SIGTERM",
            f"crashed during the soak at {d.crashed_at or 0:.1f} s: exit {crash_rc}"
            + (f" (signal {-crash_rc})" if crash_rc and crash_rc < 0 else ""), "FAIL")
        fails.append(f"the daemon crashed (exit {crash_rc}) at {d.crashed_at or 0:.1f} s")
    else:
        row("daemon exit code after SIGTERM",
            ("killed: still running 60 s after SIGTERM" if exit_rc is None else
             f"{exit_rc} (in {t_exit:.1f} s)"), "ok" if exit_rc == 0 else "FAIL")
        if exit_rc != 0:
            fails.append("the daemon " + ("did not exit within 60 s of SIGTERM" if exit_rc is None
                                          else f"exited {exit_rc} after SIGTERM (must be 0)"))
    row("sanitizer report in the daemon log",
        "none" if not d.sanitizer else f"yes: {d.sanitizer[0][:120]}",
        "ok" if not d.sanitizer else "FAIL")
    if d.sanitizer:
        fails.append("the daemon logged a sanitizer report: " + d.sanitizer[0][:160])

    w = [max(len(r[i]) for r in rows + [("item", "value", "check")]) for i in range(3)]
    w[1] = min(w[1], 110)
    print()
    print(f"| {'item'.ljust(w[0])} | {'value'.ljust(w[1])} | {'check'.ljust(w[2])} |")
    print(f"|{'-' * (w[0] + 2)}|{'-' * (w[1] + 2)}|{'-' * (w[2] + 2)}|")
    for item, value, check in rows:
        print(f"| {item.ljust(w[0])} | {value.ljust(w[1])} | {check.ljust(w[2])} |")
    print()
    if a.details:
        per = {}
        for r in res:
            k = (r.group, r.scen)
            per.setdefault(k, {})
            o = r.outcome or "?"
            per[k][o] = per[k].get(o, 0) + 1
        print("outcomes per client kind and scenario:")
        for (g, sc), outs in sorted(per.items()):
            print(f"  {g} / {sc}: " + "; ".join(
                f"{o} {c}" for o, c in sorted(outs.items(), key=lambda kv: -kv[1])))
        print()
    if unexpected or wb_bad_status:
        print("unexpected outcomes for well-behaved clients (first 15):")
        for r in (unexpected + wb_bad_status)[:15]:
            extra = [f"request id {r.rid}"] if r.rid else []
            if r.stream and r.status == 200:
                extra.append(f"{r.events} SSE events in {r.held or 0:.1f} s")
            if r.detail:
                extra.append(r.detail)
            print(f"  t={r.t:6.1f}s {r.scen}: {r.outcome}" +
                  (f" ({'; '.join(extra)})" if extra else ""))
    if health.failures:
        print("/health failures (first 10):")
        for t, what in health.failures[:10]:
            print(f"  t={t - sampler.t0:6.1f}s {what}")
    for wmsg in warns:
        print(f"soak: warning: {wmsg}")
    if d.sanitizer:
        print("sanitizer lines:\n  " + "\n  ".join(d.sanitizer[:10]))
    if fails:
        for f in fails:
            print(f"soak: FAIL: {f}")
        print(f"soak: daemon log: {d.log.name}; last lines:\n  " + "\n  ".join(d.tail[-8:]))
        print("soak: FAILED")
        return 1
    print("soak: PASSED")
    return 0


DAEMONS = []  # to kill if this script is interrupted


def interrupted(signum, frame):
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupted)
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        for d in DAEMONS:
            if d.proc.poll() is None:
                d.proc.kill()
        print("soak: interrupted", flush=True)
        sys.exit(130)
