#!/usr/bin/env python3
"""bench-spec-history.py: what drafting from earlier answers (--spec-history) adds to --spec ngram.

A server that drafts from its finished answers is only faster on prompts it has not answered
before if the model repeats itself across requests; asking the same prompts again would measure
a cache. So every round starts a fresh server per configuration and sends it the same sequence
of distinct chat prompts, one at a time: for each of --passages passages of a text (default the
GPL-3 on Debian), a summary, three questions with answers, and a list of the terms the passage
defines, greedy, up to --max-tokens each. Configurations: --spec off, --spec ngram
--spec-history 0 (prompt lookup alone) and --spec ngram (with the default history). Decode is
timed from each streamed answer's first token to its last; a kind's rate in a round is its
tokens over its decode time. Prints, per kind and in all, the median over the rounds (the
configurations' order turned each round), the ratio to off, and checks that every configuration
gave the same bytes for every prompt.

  tools/bench-spec-history.py [--model M.gguf] [--text FILE] [--passages 12] [--rounds 3]
                              [--threads 2] [--max-tokens 160]
Env: QUERN (default build/server/quern).
"""
import argparse
import http.client
import json
import os
import re
import statistics
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = {
    "summary": "Summarize the following passage.\n\n{}",
    "questions": "Write three questions a reader might ask about the text below, each followed "
                 "by its answer.\n\n{}",
    "terms": "List every term that the text below defines or names, one per line, as "
             "'term: meaning'.\n\n{}",
}
CONFIGS = {
    "off": ["--spec", "off"],
    "ngram, no history": ["--spec", "ngram", "--spec-history", "0"],
    "ngram + history": ["--spec", "ngram"],
}


def start(quern, model, threads, args):
    p = subprocess.Popen([quern, "serve", "--model", model, "--port", "0", "--threads",
                          str(threads)] + args, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    for line in p.stderr:
        m = re.search(r":(\d+) \(loading", line)
        if m:
            threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
            return p, int(m.group(1))
    raise RuntimeError("quern serve did not start")


def stream(port, text, max_tokens):
    """(answer text, tokens, seconds from the first token to the last)."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            c.request("POST", "/v1/chat/completions", json.dumps(body),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            if r.status == 503:
                r.read()
                time.sleep(0.2)
                continue
            break
        except ConnectionError:
            time.sleep(0.2)
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:300]!r}")
    parts, tokens, first, last = [], 0, None, None
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        d = json.loads(line[6:])
        if d.get("usage"):
            tokens = d["usage"]["completion_tokens"]
        for ch in d.get("choices", []):
            piece = ch.get("delta", {}).get("content")
            if piece:
                now = time.monotonic()
                first = first or now
                last = now
                parts.append(piece)
    return "".join(parts), tokens, (last - first) if first else 0.0


def passages(path, n):
    paras = [p.strip() for p in open(path, encoding="utf-8").read().split("\n\n")]
    paras = [p for p in paras if len(p) > 400]
    step = max(1, len(paras) // n)
    return [p[:900] for p in paras[::step][:n]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--text", default="/usr/share/common-licenses/GPL-3")
    ap.add_argument("--passages", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=160)
    a = ap.parse_args()
    quern = os.environ.get("QUERN", os.path.join(ROOT, "build/server/quern"))
    texts = passages(a.text, a.passages)
    # one passage after another, its three kinds in turn: what a history has seen grows as a
    # server's would
    prompts = [(kind, t.format(p)) for p in texts for kind, t in KINDS.items()]
    names = list(CONFIGS)
    rates = {(c, k): [] for c in names for k in list(KINDS) + ["all"]}
    answers = {}
    for rnd in range(a.rounds):
        order = names[rnd % len(names):] + names[:rnd % len(names)]
        for c in order:
            p, port = start(quern, a.model, a.threads, CONFIGS[c])
            tok = {k: 0 for k in KINDS}
            sec = {k: 0.0 for k in KINDS}
            try:
                for i, (kind, text) in enumerate(prompts):
                    ans, n, s = stream(port, text, a.max_tokens)
                    prev = answers.setdefault(i, ans)
                    if ans != prev:
                        raise SystemExit(f"prompt {i} ({kind}): '{c}' answered otherwise")
                    tok[kind] += max(n - 1, 0)  # the first token is not timed
                    sec[kind] += s
            finally:
                p.terminate()
                p.wait(30)
            for k in KINDS:
                rates[(c, k)].append(tok[k] / sec[k] if sec[k] else 0)
            rates[(c, "all")].append(sum(tok.values()) / max(sum(sec.values()), 1e-9))
    print(f"{len(prompts)} prompts ({a.passages} passages x {len(KINDS)} kinds), {a.rounds} "
          f"rounds, {a.threads} threads, greedy, up to {a.max_tokens} tokens; every configuration "
          f"gave the same bytes\n")
    print("| kind | " + " | ".join(f"{c}: tok/s" for c in names) + " | " +
          " | ".join(f"{c} / off" for c in names[1:]) + " |")
    print("|---|" + "---|" * (2 * len(names) - 1))
    for k in list(KINDS) + ["all"]:
        med = {c: statistics.median(rates[(c, k)]) for c in names}
        cells = [f"{med[c]:.1f} ({', '.join(f'{x:.0f}' for x in rates[(c, k)])})" for c in names]
        ratios = [f"{med[c] / med['off']:.2f}" for c in names[1:]]
        print(f"| {k} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")


if __name__ == "__main__":
    main()
