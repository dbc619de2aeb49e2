#!/usr/bin/env python3
"""Constrained vs unconstrained decode speed through a running daemon (docs/benchmarks.md).

Each request generates exactly --tokens tokens: unconstrained with ignore_eos, constrained by
structured_outputs.regex "[a-z ,.]{1000}" (it cannot end sooner), or by a JSON Schema (a
string of at least 150 characters: it may end sooner, the rate counts the tokens made). Batches of 1 and --batch concurrent requests, alternating
constrained and unconstrained rounds so load from other tenants hits both alike; prints
completion tokens per second of wall time, and the ratio.

  build/server/quern serve --port 8080 &   tools/bench-structured.py --port 8080

--compare PORT:LABEL[,PORT:LABEL...] runs the constrained kinds against several daemons too
(e.g. one per --mask-mode), each round visiting every daemon in turn, so the load of the
moment falls on all alike; ratios are against --port's unconstrained rate.
"""
import argparse
import http.client
import json
import threading
import time

SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 150}},
          "required": ["story"], "additionalProperties": False}


def post(port, body):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = json.loads(c.getresponse().read())
    c.close()
    return r["usage"]["completion_tokens"]


def round_(port, n, body):
    got = [0] * n

    def one(i):
        got[i] = post(port, dict(body, seed=i))
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    t0 = time.time()
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(got), time.time() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compare", default="")
    a = ap.parse_args()
    base = {"prompt": "Once upon a time", "max_tokens": a.tokens, "temperature": 0.8}
    kinds = {"unconstrained": dict(base, ignore_eos=True),
             "regex": dict(base, structured_outputs={"regex": "[a-z ,.]{1000}"}),
             "json_schema": dict(base, response_format={
                 "type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}})}
    runs = [(k, a.port, body) for k, body in kinds.items()]
    for spec in filter(None, a.compare.split(",")):
        port, label = spec.split(":")
        runs += [(f"{k} {label}", int(port), body) for k, body in kinds.items()
                 if k != "unconstrained"]
    for _, port, body in runs:  # compile and cache the grammars, warm the prefix cache
        post(port, dict(body, max_tokens=2))
    for n in (1, a.batch):
        tot = {k: [0, 0.0] for k, _, _ in runs}
        for _ in range(a.rounds):
            for k, port, body in runs:
                toks, secs = round_(port, n, body)
                tot[k][0] += toks
                tot[k][1] += secs
        base_rate = tot["unconstrained"][0] / tot["unconstrained"][1]
        for k, (toks, secs) in tot.items():
            rate = toks / secs
            print(f"batch {n:2d} {k:22s} {toks:6d} tokens {secs:7.2f} s {rate:8.1f} tok/s "
                  f"({rate / base_rate:.3f}x)")


if __name__ == "__main__":
    main()
