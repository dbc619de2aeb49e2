#!/usr/bin/env python3
"""What share of a corpus of real JSON Schemas quern compiles, and whether what it compiles
writes only valid JSON: JSONSchemaBench's maskbench (github.com/guidance-ai/jsonschemabench,
folder maskbench/data: ~10k schemas from GitHub, Kubernetes, function-calling sets, ..., most
with valid and invalid test instances).

Each schema goes through `quern grammar --jsonl` with its instances written as quern writes JSON
(one space after ',' and ':'). Reported:
- compiled: schemas quern compiles, and the errors of the rest, grouped;
- sound: invalid instances the grammar takes (each is a string quern could write that the
  schema forbids; the tests' own verdicts, JSON Schema 2020-12 with formats asserted);
- complete: valid instances the grammar takes (quern writes properties in schema order and
  strings in a subset of each format, so a valid instance may be refused: not an error).

With --peer llguidance (its Python package importable: pip install llguidance jsonschema) the
same corpus also goes through llguidance, the JSON Schema compiler of vLLM's guidance backend
and of llama.cpp, in the same run and the same terms (its default flexible whitespace takes
quern's spacing too).

usage: tools/schema-coverage.py MASKBENCH_DATA_DIR [--bin build/server/quern] [--show N]
                                [--peer llguidance]
"""
import argparse
import collections
import glob
import json
import os
import re
import subprocess
import sys
import time


def canonical(v):
    return json.dumps(v, ensure_ascii=False, separators=(", ", ": "))


def reason(msg):
    """An error message without its specifics: what kind of failure it is."""
    msg = re.sub(r" \(at [^)]*\)$", "", msg)
    msg = re.sub(r"'[^']*'", "'…'", msg)
    msg = re.sub(r"\d+", "N", msg)
    return msg[:110]


def run_llguidance(lines):
    """The answers `quern grammar --jsonl` gives, from llguidance (bytes as tokens)."""
    import llguidance

    class ByteTokenizer:
        eos_token_id, bos_token_id = 256, None
        tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
        special_token_ids = [256]

        def __call__(self, s):
            return list(s if isinstance(s, bytes) else s.encode())

    tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteTokenizer()))
    out = []
    for line in lines:
        d = json.loads(line)
        t0 = time.time()
        try:
            g = llguidance.LLMatcher.grammar_from_json_schema(d["source"])
            err = llguidance.LLMatcher.validate_grammar(g)
        except Exception as ex:  # a schema it refuses
            err = str(ex) or type(ex).__name__
        ms = (time.time() - t0) * 1e3
        if err:
            out.append({"ok": False, "code": "error", "error": err.splitlines()[0][:200]})
            continue
        takes = []
        for text in d["texts"]:
            m = llguidance.LLMatcher(tok, g, log_level=0)
            takes.append(bool(m.consume_tokens(list(text.encode()))) and m.is_accepting())
        out.append({"ok": True, "ms": ms, "takes": takes})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("data")
    ap.add_argument("--bin", default="build/server/quern")
    ap.add_argument("--show", type=int, default=8, help="unsound cases to print")
    ap.add_argument("--peer", choices=["llguidance"], help="run the corpus through a peer")
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.data, "*.json")))
    if not files:
        sys.exit(f"no *.json in {a.data}")
    lines, meta = [], []
    for f in files:
        try:
            d = json.load(open(f, encoding="utf-8"))
        except (ValueError, UnicodeDecodeError):
            continue
        tests = d.get("tests", [])
        lines.append(json.dumps({"source": d["schema"],
                                 "texts": [canonical(t["data"]) for t in tests]}))
        meta.append((os.path.basename(f), [bool(t["valid"]) for t in tests]))
    t0 = time.time()
    if a.peer == "llguidance":
        out = run_llguidance(lines)
    else:
        r = subprocess.run([a.bin, "grammar", "--jsonl", "-"], input="\n".join(lines) + "\n",
                           capture_output=True, text=True)
        out = [json.loads(x) for x in r.stdout.splitlines()]
        if len(out) != len(lines):
            sys.exit(f"quern grammar answered {len(out)} of {len(lines)} lines: {r.stderr[-500:]}")
    wall = time.time() - t0
    by_src = collections.Counter(m[0].split("---")[0].rsplit("_", 1)[0] for m in meta)
    ok_src = collections.Counter()
    reasons = collections.Counter()
    valid_n = valid_taken = invalid_n = invalid_taken = 0
    unsound, ms = [], []
    for (name, verdicts), res, line in zip(meta, out, lines):
        src = name.split("---")[0].rsplit("_", 1)[0]
        if not res["ok"]:
            reasons[f"{res['code']}: {reason(res['error'])}"] += 1
            continue
        ok_src[src] += 1
        ms.append(res["ms"])
        for valid, took, text in zip(verdicts, res["takes"], json.loads(line)["texts"]):
            if valid:
                valid_n += 1
                valid_taken += took
            else:
                invalid_n += 1
                invalid_taken += took
                if took:
                    unsound.append((name, text))
    n, ok = len(out), sum(ok_src.values())
    print(f"corpus: {n} schemas from {a.data} ({wall:.1f} s), compiler: "
          f"{a.peer or a.bin}")
    print(f"compiled: {ok} of {n} ({100 * ok / n:.1f} %); compile time median "
          f"{sorted(ms)[len(ms) // 2]:.2f} ms, max {max(ms):.0f} ms")
    print("by source (compiled / schemas):")
    for s, c in by_src.most_common():
        print(f"  {s:24s} {ok_src[s]:5d} / {c:5d} ({100 * ok_src[s] / c:5.1f} %)")
    print("why the rest failed (most common first):")
    for msg, c in reasons.most_common(20):
        print(f"  {c:5d}  {msg}")
    # an invalid instance quern takes only for the documented departures (uniqueItems over
    # items other than a short list of values; oneOf compiled as anyOf) is not a bug: it is
    # valid once the schema is relaxed so
    departed, bugs = [], []
    try:
        import jsonschema
    except ImportError:
        jsonschema = None

    def relax(x):
        if isinstance(x, dict):
            return {("anyOf" if k == "oneOf" else k): relax(v) for k, v in x.items()
                    if k != "uniqueItems"}
        return [relax(v) for v in x] if isinstance(x, list) else x

    schemas = {m[0]: json.loads(line)["source"] for m, line in zip(meta, lines)}
    for name, text in unsound:
        ok = False
        if jsonschema is not None:
            try:
                loose = relax(schemas[name])
                v = jsonschema.validators.validator_for(loose)
                ok = v(loose, format_checker=v.FORMAT_CHECKER).is_valid(json.loads(text))
            except Exception:  # a schema the validator cannot read
                ok = False
        (departed if ok else bugs).append((name, text))
    print(f"sound: {invalid_taken} of {invalid_n} invalid instances taken: {len(departed)} only "
          f"for uniqueItems or oneOf (README's departures), {len(bugs)} otherwise"
          f"{'' if jsonschema else ' (pip install jsonschema to tell them apart)'}")
    for name, text in bugs[:a.show]:
        print(f"  {name}: {text[:160]}")
    print(f"complete: {valid_taken} of {valid_n} valid instances taken "
          f"({100 * valid_taken / max(valid_n, 1):.1f} %)")
    return 1 if bugs else 0


if __name__ == "__main__":
    sys.exit(main())
