#!/usr/bin/env python3
"""llama.cpp's json_schema constrained decoding on the same model and prompts as
tools/bench-structured.py, beside quern's token-mask time (docs/benchmarks.md).

Against a running llama-server (third_party/llama.cpp/build/bin/llama-server -m MODEL --port P
-t 2 -np 1): --rounds rounds of one unconstrained request (ignore_eos) and one with the
bench's JSON Schema, alternating, batch 1, --tokens tokens each at temperature 0.8; prints the
server's own predicted ms per token for each and the difference, which is what the grammar costs
a token in llama.cpp (its sampler applies it). With --quern PORT it also reads that quern
daemon's /metrics: its mask time per mask (computing and applying), the same quantity.

  tools/bench-structured-llamacpp.py --port 8081 --quern 8080
"""
import argparse
import http.client
import json
import re

SCHEMA = {"type": "object", "properties": {"story": {"type": "string", "minLength": 150}},
          "required": ["story"], "additionalProperties": False}
# the same without minLength: llama.cpp expands a{150,} into 150 grammar copies, which made its
# token ~2 s here (docs/benchmarks.md); this one it handles
SIMPLE = {"type": "object", "properties": {"story": {"type": "string"}},
          "required": ["story"], "additionalProperties": False}


def call(port, method, path, body=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request(method, path, json.dumps(body) if body is not None else None,
              {"Content-Type": "application/json"})
    r = c.getresponse().read()
    c.close()
    return r


def completion(port, body):
    r = json.loads(call(port, "POST", "/completion", body))
    t = r["timings"]
    return t["predicted_n"], t["predicted_ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8081)
    ap.add_argument("--quern", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--schema", choices=["bench", "simple"], default="simple")
    a = ap.parse_args()
    base = {"prompt": "Once upon a time", "n_predict": a.tokens, "temperature": 0.8,
            "cache_prompt": True}
    kinds = {"unconstrained": dict(base, ignore_eos=True),
             "json_schema": dict(base, json_schema=SCHEMA if a.schema == "bench" else SIMPLE)}
    for body in kinds.values():
        completion(a.port, dict(body, n_predict=2))
    tot = {k: [0, 0.0] for k in kinds}
    for i in range(a.rounds):
        for k, body in kinds.items():
            n, ms = completion(a.port, dict(body, seed=i))
            tot[k][0] += n
            tot[k][1] += ms
    per = {k: ms / n for k, (n, ms) in tot.items()}
    for k, (n, ms) in tot.items():
        print(f"llama.cpp {k:14s} {n:5d} tokens {ms / 1e3:7.2f} s {per[k]:7.2f} ms/token")
    print(f"llama.cpp json_schema cost per token: {per['json_schema'] - per['unconstrained']:.3f} ms")
    if a.quern:
        m = call(a.quern, "GET", "/metrics").decode()

        def val(name):
            hit = re.search(rf"^{name} (\S+)$", m, re.M)
            return float(hit.group(1)) if hit else 0.0
        n, s = val("quern_grammar_masks_total"), val("quern_grammar_mask_seconds_total")
        ahead = val("quern_grammar_mask_ahead_seconds_total")
        if n:
            print(f"quern: {n:.0f} masks, {1e6 * s / n:.1f} us per mask computed and applied "
                  f"({1e6 * ahead / n:.1f} us of it computing, ahead of the sampling)")


if __name__ == "__main__":
    main()
