#!/usr/bin/env python3
"""check_trace.py TRACE.json N_REQUESTS: checks a trace that `quern bench --trace` wrote
(engine/trace.h): valid Chrome trace JSON; engine steps in order, never overlapping, each with
its forward and sample slices inside it; every sampled step's op slices inside its forward (7
matmuls a layer, plus the logits'); one async request slice per request, begun and ended
once, its queued/prefill/decode phases inside it and in that order; and the steps' and requests'
token counts equal to the engine's own counters in the file's metadata. Exit 0 when it holds,
1 (with the reasons) when not."""
import bisect
import json
import sys
from collections import defaultdict

EPS = 0.01  # microseconds: the file's timestamps have three decimals


def main():
    path, want_requests = sys.argv[1], int(sys.argv[2])
    with open(path) as f:
        doc = json.load(f)
    other, events = doc["otherData"], doc["traceEvents"]
    fails = []

    def check(cond, what):
        if not cond:
            fails.append(what)

    steps = [e for e in events if e.get("ph") == "X" and e["name"] == "step"]
    inner = [e for e in events if e.get("ph") == "X" and e["name"] in ("forward", "sample")]
    ops = [e for e in events if e.get("cat") == "op"]
    for e in inner:
        if e["name"] == "sample":
            a = e["args"]
            check(-EPS <= a["sampler_us"] <= e["dur"] + EPS and
                  abs(a["sampler_us"] + a["detokenize_and_events_us"] - e["dur"]) < 1,
                  f"sample slice at {e['ts']}: {a} against {e['dur']} us")
    check(len(steps) == other["steps"], f"{len(steps)} step slices, metadata says {other['steps']}")
    check(other["steps_dropped"] == 0 and other["requests_dropped"] == 0, "nothing dropped")
    check(len(steps) == other["engine_steps"],
          f"{len(steps)} steps traced, the engine ran {other['engine_steps']}")
    for a, b in zip(steps, steps[1:]):
        check(a["ts"] + a["dur"] <= b["ts"] + EPS, f"steps at {a['ts']} and {b['ts']} overlap")
    check(len(inner) == 2 * len(steps), "a forward and a sample slice per step")
    for e in inner:
        check(any(s["ts"] - EPS <= e["ts"] and e["ts"] + e["dur"] <= s["ts"] + s["dur"] + EPS
                  for s in steps), f"{e['name']} at {e['ts']} lies inside a step")
    check(len(ops) == other["ops"] and other["ops_dropped"] == 0,
          f"{len(ops)} op slices, metadata says {other['ops']} ({other['ops_dropped']} dropped)")
    forwards = sorted((e for e in inner if e["name"] == "forward"), key=lambda e: e["ts"])
    starts = [f["ts"] for f in forwards]
    matmuls = defaultdict(int)  # forward index -> matmul ops inside it
    for o in ops:
        i = bisect.bisect_right(starts, o["ts"] + EPS) - 1
        inside = i >= 0 and o["ts"] + o["dur"] <= forwards[i]["ts"] + forwards[i]["dur"] + EPS
        check(inside, f"op {o['name']} at {o['ts']} lies inside a forward")
        if inside and o["name"].startswith("matmul "):
            matmuls[i] += 1
    layers = {n // 7 for n in matmuls.values()}
    check(len(layers) <= 1 and all(n % 7 in (0, 1) and n >= 7 for n in matmuls.values()),
          f"matmul slices per sampled forward: {sorted(set(matmuls.values()))}")
    check(len(steps) < 2 * other["ops_every"] or matmuls,
          f"{len(steps)} steps and no sampled step's ops (1 in {other['ops_every']})")
    for key, meta in (("prompt_tokens", "engine_prompt_tokens"),
                      ("sampled", "engine_generation_tokens"),
                      ("preemptions", "engine_preemptions")):
        total = sum(s["args"][key] for s in steps)
        check(total == other[meta], f"steps' {key} sum to {total}, the engine counted {other[meta]}")
    for s in steps:
        a = s["args"]
        check(a["prefill_tokens"] >= a["prompt_tokens"] >= 0 and a["decode_tokens"] >= 0,
              f"step at {s['ts']}: token counts {a}")

    spans = defaultdict(lambda: defaultdict(list))  # id -> name -> [(ph, ts)]
    args = {}
    for e in events:
        if e.get("cat") != "request":
            continue
        spans[e["id"]][e["name"]].append((e["ph"], e["ts"]))
        if e["name"] == "request" and e["ph"] == "b":
            args[e["id"]] = e["args"]
    check(len(spans) == want_requests == other["requests"],
          f"{len(spans)} requests traced, {want_requests} run, metadata {other['requests']}")
    completion = 0
    for rid, by_name in spans.items():
        req = by_name.get("request", [])
        if [p for p, _ in req] != ["b", "e"]:
            check(False, f"request {rid}: request slice {req}")
            continue
        b, e = req[0][1], req[1][1]
        check(b <= e + EPS, f"request {rid} ends before it begins")
        last = b
        for phase in ("queued", "prefill", "decode"):
            marks = by_name.get(phase, [])
            if not marks:
                continue
            check([p for p, _ in marks] == ["b", "e"], f"request {rid}: {phase} {marks}")
            pb, pe = marks[0][1], marks[-1][1]
            check(last - EPS <= pb <= pe + EPS and pe <= e + EPS,
                  f"request {rid}: {phase} [{pb}, {pe}] out of order or outside [{b}, {e}]")
            last = pe
        check("queued" in by_name, f"request {rid} has no queued phase")
        completion += args[rid]["completion_tokens"]
    check(completion == other["engine_generation_tokens"],
          f"requests' completion tokens sum to {completion}, the engine generated "
          f"{other['engine_generation_tokens']}")
    if fails:
        print("check_trace: " + "\n  ".join(["FAIL"] + fails[:20]))
        return 1
    print(f"check_trace: ok ({len(steps)} steps, {len(spans)} requests, "
          f"{other['engine_preemptions']} preemptions, {len(ops)} op slices in "
          f"{len(matmuls)} sampled forwards)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
