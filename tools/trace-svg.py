#!/usr/bin/env python3
"""trace-svg.py TRACE.json OUT.svg [--from MS] [--to MS] [--width PX]

Draws a quern trace (engine/trace.h, written by `--trace`) as an SVG picture with the standard
library alone: the timeline Perfetto would show, for docs and for machines without a browser.

Tracks, top to bottom: the engine's steps (colored by what the batch held: prompt tokens only,
decode tokens only, or both), inside each its forward and sample slices, the op slices of the
sampled steps (one color per op kind), and one row per request with its queued, prefill and
decode phases. --from/--to pick a window in milliseconds from the trace's start (default: all).
"""
import argparse
import html
import json
import sys
from collections import defaultdict

OP_COLORS = {"matmul": "#4e79a7", "attention": "#f28e2b", "rmsnorm": "#76b7b2",
             "add_rmsnorm": "#76b7b2", "add": "#59a14f", "rope": "#edc948", "silu_mul": "#b07aa1",
             "kv_write": "#ff9da7", "copy": "#9c755f", "embed": "#bab0ac", "get_rows": "#bab0ac"}
PHASE_COLORS = {"queued": "#d3d3d3", "prefill": "#e15759", "decode": "#4e79a7"}


def step_color(args):
    prefill, decode = args.get("prefill_tokens", 0), args.get("decode_tokens", 0)
    if prefill and decode:
        return "#b07aa1"  # mixed: chunked prefill riding with decodes
    return "#e15759" if prefill else "#4e79a7"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("out")
    ap.add_argument("--from", dest="t_from", type=float, default=None)
    ap.add_argument("--to", dest="t_to", type=float, default=None)
    ap.add_argument("--width", type=int, default=1400)
    a = ap.parse_args()
    doc = json.load(open(a.trace))
    ev = doc["traceEvents"]
    xs = [e for e in ev if e.get("ph") == "X"]
    if not xs:
        print("trace-svg: no slices in the trace", file=sys.stderr)
        return 1
    t0 = a.t_from * 1e3 if a.t_from is not None else min(e["ts"] for e in xs)
    t1 = a.t_to * 1e3 if a.t_to is not None else max(e["ts"] + e["dur"] for e in xs)
    left, right, W = 150, 20, a.width
    span = max(t1 - t0, 1e-3)

    def x(ts):
        return left + (min(max(ts, t0), t1) - t0) / span * (W - left - right)

    def visible(ts, dur):
        return ts + dur >= t0 and ts <= t1

    out = []
    y = 40

    def label(text, yy):
        out.append(f'<text x="8" y="{yy + 12}" font-size="12">{html.escape(text)}</text>')

    def bar(ts, dur, yy, h, color, title):
        x0, x1 = x(ts), x(ts + dur)
        out.append(f'<rect x="{x0:.2f}" y="{yy}" width="{max(x1 - x0, 0.6):.2f}" height="{h}" '
                   f'fill="{color}"><title>{html.escape(title)}</title></rect>')

    steps = [e for e in xs if e["name"] == "step" and visible(e["ts"], e["dur"])]
    label("engine steps", y)
    for s in steps:
        ar = s.get("args", {})
        bar(s["ts"], s["dur"], y, 16, step_color(ar),
            f"step {s['dur'] / 1e3:.2f} ms: {ar.get('seqs')} seqs, {ar.get('prefill_tokens')} "
            f"prefill + {ar.get('decode_tokens')} decode tokens, {ar.get('kv_blocks_used')} KV "
            f"blocks")
    y += 22
    label("forward / sample", y)
    for e in xs:
        if e["name"] in ("forward", "sample") and visible(e["ts"], e["dur"]):
            bar(e["ts"], e["dur"], y, 16, "#59a14f" if e["name"] == "forward" else "#edc948",
                f"{e['name']} {e['dur'] / 1e3:.3f} ms")
    y += 22
    ops = [e for e in xs if e.get("cat") == "op" and visible(e["ts"], e["dur"])]
    label(f"ops (1 step in {doc['otherData'].get('ops_every', '?')})", y)
    for o in ops:
        kind = o["name"].split(" ")[0]
        bar(o["ts"], o["dur"], y, 16, OP_COLORS.get(kind, "#888"),
            f"{o['name']} {o['dur']:.1f} us")
    y += 30
    phases = defaultdict(dict)  # request id -> phase -> [b, e]
    for e in ev:
        if e.get("cat") == "request" and e["name"] != "request":
            phases[e["id"]].setdefault(e["name"], [None, None])[0 if e["ph"] == "b" else 1] = e["ts"]
    rows = sorted(phases.items(), key=lambda kv: min(v[0] for v in kv[1].values() if v[0]))
    rows = [r for r in rows if any(b is not None and e is not None and visible(b, e - b)
                                   for b, e in r[1].values())]
    row_h = max(3, min(14, int(500 / max(len(rows), 1))))
    label(f"requests ({len(rows)})", y)
    y += 18
    for rid, ph in rows:
        for name in ("queued", "prefill", "decode"):
            if name in ph and None not in ph[name]:
                b, e = ph[name]
                bar(b, e - b, y, row_h - 1, PHASE_COLORS[name], f"request {rid}: {name} "
                    f"{(e - b) / 1e3:.1f} ms")
        y += row_h
    y += 10
    # time axis
    for i in range(11):
        ts = t0 + span * i / 10
        xx = x(ts)
        out.append(f'<line x1="{xx:.1f}" y1="30" x2="{xx:.1f}" y2="{y}" stroke="#eee"/>')
        out.append(f'<text x="{xx:.1f}" y="{y + 14}" font-size="11" text-anchor="middle">'
                   f'{ts / 1e3:.0f} ms</text>')
    y += 24
    legend = [("prefill step", "#e15759"), ("decode step", "#4e79a7"), ("mixed step", "#b07aa1"),
              ("forward", "#59a14f"), ("sample", "#edc948"), ("queued", "#d3d3d3")]
    legend += [(k, v) for k, v in OP_COLORS.items() if k in ("matmul", "attention", "rmsnorm",
                                                              "rope", "silu_mul", "kv_write")]
    lx = left
    for name, color in legend:
        out.append(f'<rect x="{lx}" y="{y}" width="12" height="12" fill="{color}"/>')
        out.append(f'<text x="{lx + 16}" y="{y + 11}" font-size="11">{html.escape(name)}</text>')
        lx += 22 + 7 * len(name)
    y += 24
    title = (f"quern trace: {len(steps)} steps, {len(rows)} requests, {len(ops)} op slices, "
             f"{span / 1e3:.0f} ms")
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{y}" '
           f'font-family="sans-serif">', f'<rect width="{W}" height="{y}" fill="white"/>',
           f'<text x="8" y="20" font-size="14" font-weight="bold">{html.escape(title)}</text>']
    with open(a.out, "w") as f:
        f.write("\n".join(svg + out + ["</svg>\n"]))
    print(f"trace-svg: {a.out}: {title}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
