#!/usr/bin/env python3
"""cluster_load.py: the workload of tools/cluster-test.sh, standard library only.

    cluster_load.py --router URL --replicas URL,URL,URL --sessions S [--first N] --turns T
                    --mode MODE [--concurrency C] [--kill-pid-file F --restart-cmd CMD]

S multi-turn chats, C at a time; each has a long system prompt of its own (so its turns share a
prefix that only the replica which served the previous turn holds), and each turn resends the
whole conversation, as chat clients do. MODE "session" sends X-Session-Id (the router hashes on
it); "none" sends no header (the router round-robins). Half the requests stream.

Prints one JSON line: requests answered and failed, output tokens/s, and the prefix-cache hit
rate over the run (the replicas' quern_prefix_cache_hit_tokens_total over quern_prompt_tokens,
differences of /metrics scraped before and after). With --kill-pid-file, a third of the way
into the run it SIGKILLs the replica whose pid the file holds and runs --restart-cmd two seconds
later: each failure is then classified as "streamed" (the answer had begun: cut, and the client
sees no [DONE]) or "unanswered" (the router gave up before any answer: must not happen, since
HAProxy retries a request no replica has answered). A request that takes longer than 120 s is
"hung".
"""
import argparse
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse

TOPICS = ["rivers", "volcanoes", "bread", "bridges", "owls", "glaciers", "chess", "tides",
          "lighthouses", "bees", "comets", "forests", "deserts", "trains", "clocks", "coral"]


def system_prompt(i):
    topic = TOPICS[i % len(TOPICS)]
    body = " ".join(f"Fact {k} about {topic}: {topic} matter to people in many ways, number {k}."
                    for k in range(18))
    return f"You are a patient teacher who only talks about {topic} (session {i}). {body}"


def scrape(url):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    try:
        c.request("GET", "/metrics")
        text = c.getresponse().read().decode()
    except OSError:
        return None
    finally:
        c.close()
    out = {}
    for name in ("quern_prefix_cache_hit_tokens_total", "quern_prompt_tokens_total"):
        m = re.search(rf"^{name} (\S+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.ok = self.tokens = 0
        self.failed = {"streamed": 0, "unanswered": 0, "hung": 0}
        self.errors = []

    def add_ok(self, tokens):
        with self.lock:
            self.ok += 1
            self.tokens += tokens

    def add_fail(self, kind, why):
        with self.lock:
            self.failed[kind] += 1
            if len(self.errors) < 8:
                self.errors.append(f"{kind}: {why}")


def one_turn(router, messages, session, stream, stats):
    """Returns the assistant's text, or None after recording a failure."""
    u = urllib.parse.urlparse(router)
    body = json.dumps({"messages": messages, "max_tokens": 12, "temperature": 0,
                       "stream": stream, "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if session is not None:
        headers["X-Session-Id"] = session
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
    began = False
    try:
        c.request("POST", "/v1/chat/completions", body, headers)
        r = c.getresponse()
        if r.status != 200:
            stats.add_fail("unanswered", f"HTTP {r.status} {r.read()[:120]!r}")
            return None
        if not stream:
            d = json.loads(r.read())
            stats.add_ok(d["usage"]["completion_tokens"])
            return d["choices"][0]["message"]["content"] or ""
        text, tokens, done = [], 0, False
        for line in r:
            began = True
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            if line == b"data: [DONE]":
                done = True
                break
            d = json.loads(line[6:])
            if d.get("usage"):
                tokens = d["usage"]["completion_tokens"]
            for ch in d.get("choices", []):
                text.append(ch.get("delta", {}).get("content") or "")
        if not done:
            stats.add_fail("streamed", "the stream ended without [DONE]")
            return None
        stats.add_ok(tokens)
        return "".join(text)
    except TimeoutError:
        stats.add_fail("hung", "no answer within 120 s")
    except (OSError, http.client.HTTPException, ValueError) as e:
        stats.add_fail("streamed" if began else "unanswered", f"{type(e).__name__}: {e}")
    finally:
        c.close()
    return None


def session_run(i, a, stats):
    messages = [{"role": "system", "content": system_prompt(i)}]
    for t in range(a.turns):
        messages.append({"role": "user", "content": f"Tell me one more thing, part {t + 1}."})
        stream = (i + t) % 2 == 1
        sid = f"chat-{i}" if a.mode == "session" else None
        reply = one_turn(a.router, messages, sid, stream, stats)
        messages.append({"role": "assistant", "content": reply if reply is not None else "..."})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--router", required=True)
    ap.add_argument("--replicas", required=True)
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--first", type=int, default=0, help="the first session's number")
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--mode", choices=("session", "none"), required=True)
    ap.add_argument("--kill-pid-file")
    ap.add_argument("--restart-cmd")
    a = ap.parse_args()
    replicas = a.replicas.split(",")
    before = [scrape(r) for r in replicas]
    stats = Stats()
    queue = list(range(a.first, a.first + a.sessions))
    qlock = threading.Lock()

    def worker():
        while True:
            with qlock:
                if not queue:
                    return
                i = queue.pop(0)
            session_run(i, a, stats)

    t0 = time.time()
    threads = [threading.Thread(target=worker) for _ in range(a.concurrency)]
    for t in threads:
        t.start()
    killed = None
    if a.kill_pid_file:
        total = a.sessions * a.turns
        while stats.ok + sum(stats.failed.values()) < total // 3 and any(t.is_alive()
                                                                          for t in threads):
            time.sleep(0.05)
        pid = int(open(a.kill_pid_file).read())
        os.kill(pid, signal.SIGKILL)
        killed = time.time() - t0
        time.sleep(2)
        subprocess.Popen(a.restart_cmd, shell=True)
    for t in threads:
        t.join()
    wall = time.time() - t0
    after = [scrape(r) for r in replicas]
    hit = prompt = 0.0
    for b, e in zip(before, after):
        if b and e and e["quern_prompt_tokens_total"] >= b["quern_prompt_tokens_total"]:
            hit += e["quern_prefix_cache_hit_tokens_total"] - b["quern_prefix_cache_hit_tokens_total"]
            prompt += e["quern_prompt_tokens_total"] - b["quern_prompt_tokens_total"]
        elif e:  # the replica restarted: its counters began again
            hit += e["quern_prefix_cache_hit_tokens_total"]
            prompt += e["quern_prompt_tokens_total"]
    out = {"mode": a.mode, "requests": a.sessions * a.turns, "answered": stats.ok,
           "failed": stats.failed, "output_tokens": stats.tokens, "wall_s": round(wall, 2),
           "output_tok_s": round(stats.tokens / wall, 1),
           "prefix_hit_rate": round(hit / (hit + prompt), 3) if hit + prompt else 0.0,
           "killed_at_s": round(killed, 2) if killed is not None else None,
           "errors": stats.errors}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
