#!/usr/bin/env python3
"""check_trace.py TRACE.json N_REQUESTS: checks a trace that `quern bench --trace` wrote
(engine/trace.h): valid Chrome trace JSON; engine steps in order, never overlapping, each with
its forward and sample slices inside it; one async request slice per request, begun and ended
once, its queued/prefill/decode phases inside it and in that order; and the steps' and requests'
token counts equal to the engine's own counters in the file's metadata. Exit 0 when it holds,
1 (with the reasons) when not."""
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
          f"{other['engine_preemptions']} preemptions)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
