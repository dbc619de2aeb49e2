#!/usr/bin/env python3
"""Predicted outputs (a request's `prediction`) on a server run with `--spec off` (the default: the
prediction is the only drafter), `--spec ngram` or `--spec draft` (with --draft-model: the
prediction first, the draft model where it does not match): each prompt greedy with no prediction, with its own answer as the prediction, and with that answer edited (every 20th
word replaced); decode tok/s from the first streamed token to the last, the median of the
rounds, and the drafted tokens kept (usage.completion_tokens_details.accepted_prediction_tokens).
Every run must give the answer's bytes.

    tools/bench-prediction.py [--model M] [--threads 2] [--rounds 3] [--max-tokens 160]
                              [--spec off|ngram|draft] [--draft-model D]
"""
import argparse
import json
import statistics
import sys
import time
import urllib.request

import quern_serve
PROMPTS = ["Tell me a story about a dragon who learns to bake bread.",
           "Write a short poem about the sea at night.",
           "Explain how a bicycle works to a child.",
           "Describe a day in the life of a lighthouse keeper."]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=quern_serve.BIN)
    ap.add_argument("--model", default=quern_serve.MODEL)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--port", type=int, default=18820)
    ap.add_argument("--spec", choices=("off", "ngram", "draft"), default="off")
    ap.add_argument("--draft-model", help="with --spec draft: the draft model's GGUF")
    a = ap.parse_args()
    if (a.spec == "draft") != bool(a.draft_model):
        ap.error("--spec draft and --draft-model go together")
    draft = ["--draft-model", a.draft_model] if a.draft_model else []
    # no history: a repeated prompt would draft from its own earlier answer
    srv = quern_serve.start(a.bin, a.model, a.port, a.threads, "--spec", a.spec,
                            "--spec-history", "0", *draft)
    try:
        rows = [bench(a, p) for p in PROMPTS]
    finally:
        srv.terminate()
        srv.wait()
    cpu = quern_serve.cpu_line()
    print(f"{cpu}; {a.threads} threads; {a.rounds} rounds; --spec {a.spec} --spec-history 0"
          f"{' --draft-model ' + a.draft_model if a.draft_model else ''}\n")
    print("| prompt | no prediction tok/s | its answer predicted | ratio | the answer edited "
          "| ratio | kept drafts / tokens (none, answer, edited) |")
    print("|---|---|---|---|---|---|---|")
    for p, r in zip(PROMPTS, rows):
        (r0, a0), (r1, a1), (r2, a2) = r
        print(f"| {p[:40]} | {r0:.1f} | {r1:.1f} | {r1 / r0:.2f} | {r2:.1f} | {r2 / r0:.2f} "
              f"| {a0}, {a1}, {a2} |")


def run(a, body):
    req = urllib.request.Request(
        f"http://127.0.0.1:{a.port}/v1/chat/completions",
        json.dumps(dict(body, stream=True, stream_options={"include_usage": True})).encode(),
        {"Content-Type": "application/json"})
    first = last = None
    text, usage = "", None
    for line in urllib.request.urlopen(req, timeout=600):
        line = line.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        usage = ev.get("usage") or usage
        for c in ev["choices"]:
            t = (c.get("delta") or {}).get("content")
            if t:
                last = time.time()
                first = first or last
                text += t
    n = usage["completion_tokens"]
    kept = usage["completion_tokens_details"]["accepted_prediction_tokens"]
    return text, (n - 1) / (last - first), f"{kept}/{n}"


def bench(a, prompt):
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": a.max_tokens}
    answer = run(a, body)[0]
    edited = " ".join("banana" if i % 20 == 10 else w for i, w in enumerate(answer.split(" ")))
    bodies = [body, dict(body, prediction={"type": "content", "content": answer}),
              dict(body, prediction={"type": "content", "content": edited})]
    rates, kept = [[] for _ in bodies], [None] * len(bodies)
    for _ in range(a.rounds):
        for i, b in enumerate(bodies):
            text, rate, k = run(a, b)
            if text != answer:
                sys.exit(f"bench-prediction: '{prompt}' gave other bytes: {text[:80]!r}")
            rates[i].append(rate)
            kept[i] = k
    return [(statistics.median(r), k) for r, k in zip(rates, kept)]


if __name__ == "__main__":
    main()
