#!/usr/bin/env python3
"""spec-replay.py: how far prompt lookup can go on a model's own answers, without timing.

Asks a quern server for the greedy answer to each grounded chat prompt of
tools/spec-prompts.json, then replays the answer through an n-gram drafter (quern's rule: the
most recent earlier occurrence of the last 4, 3, 2 tokens, or down to --ngram-min) as if every
step drafted up to k tokens and verification were free. Prints, per prompt, the tokens per step
(answer tokens / steps: the ceiling of any speed-up from that drafter on that answer) and the
drafted and kept tokens; then, over all prompts, how often the first token of a draft was kept
by the class of what the draft rests on (the match counted back past the n-gram searched, up to
16: engine/spec.h's spec_match_class).

  tools/spec-replay.py [--model M.gguf] [--kinds code-edit,summarize,extract] [-k 8]
Env: QUERN (default build/server/quern).
"""
import argparse
import http.client
import json
import os
import re
import subprocess
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MATCH_MAX = 16


def post(port, path, body):
    for _ in range(600):
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
            c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
            r = c.getresponse()
            data = r.read()
            if r.status == 503:  # still loading
                time.sleep(0.2)
                continue
            if r.status != 200:
                raise RuntimeError(f"{path}: HTTP {r.status}: {data[:300]!r}")
            return json.loads(data)
        except ConnectionError:
            time.sleep(0.2)
    raise RuntimeError("the server did not answer")


def prompt_of(entry):
    """A prompt of tools/spec-prompts.json: a string, or {"text", "json_schema"}."""
    if isinstance(entry, dict):
        return entry["text"], entry.get("json_schema")
    return entry, None


def response_format(schema):
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


def answers(model, kinds):
    quern = os.environ.get("QUERN", os.path.join(ROOT, "build/server/quern"))
    p = subprocess.Popen([quern, "serve", "--model", model, "--port", "0"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    port = None
    for line in p.stderr:
        m = re.search(r":(\d+) \(loading", line)
        if m:
            port = int(m.group(1))
            break
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    prompts = json.load(open(os.path.join(ROOT, "tools/spec-prompts.json"), encoding="utf-8"))
    out = []
    try:
        for kind in kinds:
            for i, entry in enumerate(prompts[kind]):
                text, schema = prompt_of(entry)
                msgs = [{"role": "user", "content": text}]
                body = {"messages": msgs, "max_tokens": 256, "temperature": 0}
                if schema:
                    body["response_format"] = response_format(schema)
                r = post(port, "/v1/chat/completions", body)
                answer = r["choices"][0]["message"]["content"]
                ctx = post(port, "/tokenize", {"messages": msgs, "add_generation_prompt": True})
                ids = post(port, "/tokenize", {"prompt": answer, "add_special_tokens": False})
                out.append((f"{kind} {i}", ctx["tokens"], ids["tokens"]))
    finally:
        p.terminate()
        p.wait(30)
    return out


def draft(ctx, k, gmin, gmax):
    """quern's n-gram drafter: (guess, match length) or ([], 0)."""
    n = len(ctx)
    for g in range(gmax, gmin - 1, -1):
        if g >= n:
            continue
        tail = ctx[n - g:]
        for at in range(n - g - 1, -1, -1):
            if ctx[at:at + g] == tail:
                length = g
                while (length < MATCH_MAX and at - (length - g) > 0 and
                       ctx[at - (length - g) - 1] == ctx[n - length - 1]):
                    length += 1
                return ctx[at + g:at + g + k], length
    return [], 0


def match_class(m):
    return 0 if m <= 0 else m if m <= 3 else 4 if m < 8 else 5


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--kinds", default="code-edit,summarize,extract")
    ap.add_argument("-k", type=int, default=8)
    ap.add_argument("--ngram-min", type=int, default=2)
    a = ap.parse_args()
    by_class = {}
    print("| prompt | answer tokens | steps | tokens per step | drafted | kept |")
    print("|---|---|---|---|---|---|")
    for name, prompt, ans in answers(a.model, a.kinds.split(",")):
        i = steps = drafted = kept = 0
        while i < len(ans):
            guess, m = draft(prompt + ans[:i], a.k, a.ngram_min, 4)
            j = 0
            while j < len(guess) and i + j < len(ans) and guess[j] == ans[i + j]:
                j += 1
            if guess:
                c = by_class.setdefault(match_class(m), [0, 0, 0])
                c[0] += 1
                c[1] += j > 0
                c[2] += j
            drafted += len(guess)
            kept += j
            steps += 1
            i += j + 1
        print(f"| {name} | {len(ans)} | {steps} | {len(ans) / max(steps, 1):.2f} | {drafted} | "
              f"{kept} |")
    print("\n| match class | drafts | first token kept | tokens kept per draft |")
    print("|---|---|---|---|")
    names = {1: "1 token", 2: "2 tokens", 3: "3 tokens", 4: "4-7 tokens", 5: "8 or more"}
    for c in sorted(by_class):
        d, first, total = by_class[c]
        print(f"| {names.get(c, c)} | {d} | {100 * first / d:.0f} % | {total / d:.2f} |")


if __name__ == "__main__":
    main()
