#!/usr/bin/env python3
"""Request priority (vLLM's `priority`) under load: what a high-priority request waits for.

A daemon that runs at most --max-seqs sequences at once is kept full by --clients background
clients that each send streamed completions (priority 0, --max-tokens) back to back, so a queue
builds. Meanwhile probe requests are sent one at a time, alternating priority 0 and -1 (the same
prompt, 8 tokens), and each probe's time to first token is measured. With priorities, a -1
probe waits only for a running sequence to finish; a 0 probe waits behind the queue. Prints the
median and p90 TTFT of each kind and the background clients' output tok/s.

    tools/bench-priority.py [--model M] [--threads 2] [--clients 12] [--max-seqs 4]
                            [--probes 16] [--max-tokens 64]
"""
import argparse
import json
import statistics
import sys
import threading
import time
import urllib.request

import quern_serve


def stream(port, body):
    """Streams a completion; returns (seconds to the first text, completion tokens)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        json.dumps(dict(body, stream=True, stream_options={"include_usage": True})).encode(),
        {"Content-Type": "application/json"})
    t0 = time.time()
    first, tokens = None, 0
    for line in urllib.request.urlopen(req, timeout=600):
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        if ev.get("usage"):
            tokens = ev["usage"]["completion_tokens"]
        for c in ev.get("choices", []):
            if c.get("text") and first is None:
                first = time.time() - t0
    return first, tokens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=quern_serve.BIN)
    ap.add_argument("--model", default=quern_serve.MODEL)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--clients", type=int, default=12)
    ap.add_argument("--max-seqs", type=int, default=4)
    ap.add_argument("--probes", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--port", type=int, default=18830)
    a = ap.parse_args()
    srv = quern_serve.start(a.bin, a.model, a.port, a.threads, "--max-seqs", str(a.max_seqs))
    stop = threading.Event()
    made = []

    def background(i):
        body = {"prompt": f"Story {i}: once upon a time", "max_tokens": a.max_tokens,
                "temperature": 0.8, "seed": i, "ignore_eos": True}
        while not stop.is_set():
            try:
                made.append(stream(a.port, body)[1])
            except OSError:
                return  # the daemon is gone: the run is over

    try:
        threads = [threading.Thread(target=background, args=(i,), daemon=True)
                   for i in range(a.clients)]
        for t in threads:
            t.start()
        time.sleep(2)  # the queue fills
        t0, made_before = time.time(), sum(made)
        ttft = {0: [], -1: []}
        probe = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
        for k in range(a.probes):
            prio = 0 if k % 2 == 0 else -1
            ttft[prio].append(stream(a.port, dict(probe, priority=prio))[0])
        rate = (sum(made) - made_before) / (time.time() - t0)
        stop.set()
    finally:
        srv.terminate()
        srv.wait()
    cpu = quern_serve.cpu_line()
    print(f"{cpu}; {a.threads} threads; --max-seqs {a.max_seqs}; {a.clients} background clients "
          f"(priority 0, {a.max_tokens} tokens each); {a.probes} probes of 8 tokens\n")
    print("| probe priority | TTFT p50 s | TTFT p90 s | probes |")
    print("|---|---|---|---|")
    for prio in (0, -1):
        v = sorted(ttft[prio])
        print(f"| {prio} | {statistics.median(v):.3f} | {v[int(0.9 * (len(v) - 1))]:.3f} "
              f"| {len(v)} |")
    print(f"\nbackground output while probing: {rate:.1f} tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
