#!/usr/bin/env python3
"""Structured outputs and tool calling against a real daemon with the real model.

Every schema of tests/structured_schemas.json (62 of them: nested objects, arrays, enums, refs,
patterns, formats, numbers) is requested greedy and sampled (seeded) through response_format,
all at once so the engine batches them; every output must finish with "stop", parse, and
validate against its schema (a validator of the keywords quern supports, below; `jsonschema`
cross-checks too when it is installed), but for at most CUT_MAX that a sampled endless string
ran to max_tokens, each of which must still be the start of a JSON text. Then the other sources (json_object, structured_outputs
regex / choice / json / grammar), determinism under load, "length" inside a value, streaming,
the 400s, tool calls (required, named, streamed, auto, a tool result sent back), and the
official openai SDK (a Pydantic response_format, a tool round trip) when test_http's
venv-openai exists.

Needs QUERN_BIN and QUERN_MODEL; exit 77 without the model. Under QUERN_SANITIZED a subset runs."""
import base64
import binascii
import datetime
import ipaddress
import json
import os
import re
import sys
import threading
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http  # noqa: E402
from test_http import Daemon, check  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SANITIZED = bool(os.environ.get("QUERN_SANITIZED"))
CUT_MAX = 2  # schema outputs that may end by max_tokens (see test_schema_suite)


# ---- a validator of the keywords quern compiles ----

def resolve(root, ref):
    node = root
    for part in ref.lstrip("#").split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def type_ok(v, t):
    if t == "object":
        return isinstance(v, dict)
    if t == "array":
        return isinstance(v, list)
    if t == "string":
        return isinstance(v, str)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool)
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "boolean":
        return isinstance(v, bool)
    if t == "null":
        return v is None
    raise ValueError(t)


def format_ok(v, f):
    try:
        if f == "date":
            datetime.date.fromisoformat(v)
        elif f == "date-time":
            datetime.datetime.fromisoformat(v.replace("Z", "+00:00"))
        elif f == "time":
            datetime.time.fromisoformat(v.replace("Z", "+00:00"))
        elif f == "email":
            return re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", v) is not None
        elif f == "uuid":
            uuid.UUID(v)
        elif f == "uri":
            return re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:\S+$", v) is not None
        elif f == "ipv4":
            ipaddress.IPv4Address(v)
        elif f == "ipv6":
            ipaddress.IPv6Address(v)
        elif f == "hostname":
            label = r"[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
            return len(v) <= 253 and re.fullmatch(rf"{label}(\.{label})*", v) is not None
        elif f in ("ipv4interface", "ipv6interface", "ipvanyinterface"):
            ipaddress.ip_interface(v)
            return f == "ipvanyinterface" or f[3] == str(ipaddress.ip_interface(v).version)
        elif f in ("ipv4network", "ipv6network", "ipvanynetwork"):
            ipaddress.ip_network(v)  # strict: host bits zero
            return f == "ipvanynetwork" or f[3] == str(ipaddress.ip_network(v).version)
        elif f == "ipvanyaddress":
            ipaddress.ip_address(v)
        elif f == "base64":
            base64.b64decode(v, validate=True)
        elif f == "duration":  # RFC 3339 appendix A
            t = r"T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S)"
            d = r"([0-9]+D|[0-9]+M([0-9]+D)?|[0-9]+Y([0-9]+M([0-9]+D)?)?)"
            return re.fullmatch(rf"P({d}({t})?|{t}|[0-9]+W)", v) is not None
        return True
    except (ValueError, binascii.Error):
        return False


def same(a, b):
    return type(a) is type(b) and a == b or (
        isinstance(a, (int, float)) and isinstance(b, (int, float))
        and not isinstance(a, bool) and not isinstance(b, bool) and a == b)


def validate(v, s, root, path="$"):
    """A list of what is wrong with v under schema s (empty: valid)."""
    if s is True or s == {}:
        return []
    errs = []
    if "$ref" in s:
        return validate(v, resolve(root, s["$ref"]), root, path)
    if s.get("nullable") and v is None:
        return []
    if "const" in s and not same(v, s["const"]):
        errs.append(f"{path}: {v!r} is not the const {s['const']!r}")
    if "enum" in s and not any(same(v, e) for e in s["enum"]):
        errs.append(f"{path}: {v!r} not in enum")
    for kw in ("anyOf", "oneOf"):
        if kw in s:
            ok = [not validate(v, b, root, path) for b in s[kw]]
            if not any(ok) or (kw == "oneOf" and sum(ok) != 1):
                errs.append(f"{path}: {kw} matched {sum(ok)} branches")
    for b in s.get("allOf", []):
        errs += validate(v, b, root, path)
    t = s.get("type")
    if t is not None:
        ts = t if isinstance(t, list) else [t]
        if not any(type_ok(v, x) for x in ts):
            return errs + [f"{path}: {v!r} is not of type {t}"]
    if isinstance(v, dict):
        props = s.get("properties", {})
        for r in s.get("required", []):
            if r not in v:
                errs.append(f"{path}: missing {r}")
        pats = s.get("patternProperties", {})
        names = s.get("propertyNames")
        for k, x in v.items():
            if names is not None:
                errs += validate(k, names, root, f"{path}.<name {k}>")
            hit = [p for p in pats if re.search(p, k)]
            for p in hit:
                errs += validate(x, pats[p], root, f"{path}.{k}")
            if k in props:
                errs += validate(x, props[k], root, f"{path}.{k}")
            elif hit:
                pass
            elif "additionalProperties" in s:
                ap = s["additionalProperties"]
                if ap is False:
                    errs.append(f"{path}: extra property {k}")
                elif isinstance(ap, dict):
                    errs += validate(x, ap, root, f"{path}.{k}")
    if isinstance(v, dict) and not (s.get("minProperties", 0) <= len(v) <= s.get("maxProperties", 1 << 30)):
        errs.append(f"{path}: {len(v)} properties")
    if isinstance(v, list):
        prefix = s.get("prefixItems", [])
        for i, x in enumerate(v):
            if i < len(prefix):
                errs += validate(x, prefix[i], root, f"{path}[{i}]")
            elif s.get("items") is False:
                errs.append(f"{path}: item {i} beyond prefixItems")
            elif isinstance(s.get("items"), dict):
                errs += validate(x, s["items"], root, f"{path}[{i}]")
        if len(v) < s.get("minItems", 0) or len(v) > s.get("maxItems", 1 << 30):
            errs.append(f"{path}: {len(v)} items")
        if s.get("uniqueItems") and len({json.dumps(x, sort_keys=True) for x in v}) != len(v):
            errs.append(f"{path}: items repeat")
    if isinstance(v, str):
        if len(v) < s.get("minLength", 0) or len(v) > s.get("maxLength", 1 << 30):
            errs.append(f"{path}: length {len(v)}")
        if "pattern" in s and not re.search(s["pattern"], v):
            errs.append(f"{path}: {v!r} does not match {s['pattern']}")
        if "format" in s and not format_ok(v, s["format"]):
            errs.append(f"{path}: {v!r} is not a {s['format']}")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        if "minimum" in s and v < s["minimum"]:
            errs.append(f"{path}: {v} < minimum")
        if "maximum" in s and v > s["maximum"]:
            errs.append(f"{path}: {v} > maximum")
        if "exclusiveMinimum" in s and v <= s["exclusiveMinimum"]:
            errs.append(f"{path}: {v} <= exclusiveMinimum")
        if "exclusiveMaximum" in s and v >= s["exclusiveMaximum"]:
            errs.append(f"{path}: {v} >= exclusiveMaximum")
        if "multipleOf" in s and abs(round(v / s["multipleOf"]) * s["multipleOf"] - v) > 1e-9:
            errs.append(f"{path}: {v} not a multiple of {s['multipleOf']}")
    return errs


NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def json_prefix_error(text):
    """None when text is the start of some JSON text (what a grammar-constrained output cut off
    by max_tokens must be), else what breaks it and where."""
    stack, expect, i, n = [], "value", 0, len(text)

    def after_value():
        return "comma_or_end" if stack else "done"

    while i < n:
        c = text[i]
        if c in " \t\r\n":
            i += 1
            continue
        if expect == "done":
            return f"text after the value at {i}"
        if expect == "colon":
            if c != ":":
                return f"{c!r} at {i}: want ':'"
            expect, i = "value", i + 1
        elif expect == "comma_or_end":
            close = "}" if stack[-1] == "{" else "]"
            if c == ",":
                expect = "key" if stack[-1] == "{" else "value"
            elif c == close:
                stack.pop()
                expect = after_value()
            else:
                return f"{c!r} at {i}: want ',' or {close!r}"
            i += 1
        elif expect in ("key", "key_or_end") and c == "}" and expect == "key_or_end":
            stack.pop()
            expect, i = after_value(), i + 1
        elif expect == "value_or_end" and c == "]":
            stack.pop()
            expect, i = after_value(), i + 1
        elif c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                if text[j] == "\\":
                    esc = text[j + 1:j + 2]
                    if esc == "u":
                        hexd = text[j + 2:j + 6]
                        if not re.fullmatch(r"[0-9a-fA-F]*", hexd) or (len(hexd) < 4 and j + 6 <= n):
                            return f"bad \\u escape at {j}"
                        j += 6
                    elif esc and esc not in '"\\/bfnrt':
                        return f"bad escape at {j}"
                    else:
                        j += 2
                elif ord(text[j]) < 0x20:
                    return f"control character in a string at {j}"
                else:
                    j += 1
            if j >= n:
                return None  # cut inside the string
            expect, i = ("colon" if expect in ("key", "key_or_end") else after_value()), j + 1
        elif expect in ("key", "key_or_end"):
            return f"{c!r} at {i}: want a key"
        elif c in "{[":
            stack.append(c)
            expect, i = ("key_or_end" if c == "{" else "value_or_end"), i + 1
        elif c in "-0123456789":
            j = i
            while j < n and text[j] in "+-0123456789.eE":
                j += 1
            tok = text[i:j]
            if not NUMBER.fullmatch(tok) and not (j == n and NUMBER.fullmatch(tok + "0")):
                return f"bad number {tok!r} at {i}"
            expect, i = after_value(), j
        else:
            word = next((w for w in ("true", "false", "null") if w[0] == c), None)
            if word is None:
                return f"{c!r} at {i}: want a value"
            if text.startswith(word, i):
                expect, i = after_value(), i + len(word)
            elif word.startswith(text[i:]):
                return None  # cut inside the literal
            else:
                return f"bad literal at {i}"
    return None


try:
    import jsonschema  # optional cross-check
except ImportError:
    jsonschema = None


def chat(d, content, **kw):
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 160}
    body.update(kw)
    return d.post("/v1/chat/completions", body)


def run_parallel(jobs):
    """jobs: list of callables; runs them on threads, returns results in order."""
    out = [None] * len(jobs)

    def one(i):
        try:
            out[i] = jobs[i]()
        except Exception as ex:  # reported by the caller's checks
            out[i] = ex
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_schema_suite(d):
    suite = json.load(open(os.path.join(HERE, "structured_schemas.json")))
    if SANITIZED:
        suite = suite[::8]
    modes = [("greedy", {"temperature": 0})]
    if not SANITIZED:
        modes.append(("sampled", {"temperature": 0.8, "top_p": 0.95, "seed": 1234}))
    jobs, names = [], []
    for case in suite:
        for mode, params in modes:
            rf = {"type": "json_schema",
                  "json_schema": {"name": case["name"], "schema": case["schema"], "strict": True}}
            jobs.append(lambda c=case, p=params, rf=rf: chat(
                d, c["prompt"] + " Answer in JSON.", response_format=rf, **p))
            names.append((case, mode))
    results = run_parallel(jobs)
    bad, cut = 0, []
    for (case, mode), res in zip(names, results):
        what = f"schema {case['name']} ({mode})"
        if isinstance(res, Exception) or res[0] != 200:
            bad += 1
            check(False, what, repr(res)[:300])
            continue
        ch = res[2]["choices"][0]
        text = ch["message"]["content"]
        errs = []
        if ch["finish_reason"] == "length":
            # A small model can sample its way into an endless free string (a key of
            # additionalProperties, say) and meet max_tokens there: the grammar still held if
            # what came out is the start of a JSON text. A few such cuts are the model's; more
            # would be the decoder's, so they are counted below.
            err = json_prefix_error(text)
            if err is None:
                cut.append(what)
                continue
            errs.append(f"cut by max_tokens and not a JSON prefix: {err}")
        elif ch["finish_reason"] != "stop":
            errs.append(f"finish_reason {ch['finish_reason']}")
        try:
            v = json.loads(text)
            errs += validate(v, case["schema"], case["schema"])
            if jsonschema is not None and not errs:
                jsonschema.validate(v, case["schema"])
        except Exception as ex:
            errs.append(f"{type(ex).__name__}: {ex}")
        if errs:
            bad += 1
            check(False, what, f"{text!r}: {errs}")
    check(bad == 0, f"{len(results) - len(cut)} schema-constrained outputs stop, parse and "
          f"validate ({len(suite)} schemas x {len(modes)} modes"
          f"{', jsonschema too' if jsonschema else ''})")
    check(len(cut) <= CUT_MAX, f"{len(cut)} of {len(results)} cut by max_tokens "
          f"(at most {CUT_MAX}), each the start of a JSON text{': ' if cut else ''}"
          f"{', '.join(cut)}", repr(cut))


def test_sources(d):
    s, _, r = chat(d, "Describe a cat.", temperature=0, response_format={"type": "json_object"},
                   max_tokens=300)
    text = r["choices"][0]["message"]["content"] if s == 200 else ""
    fin = r["choices"][0]["finish_reason"] if s == 200 else ""
    ok = s == 200 and (fin == "length" or isinstance(json.loads(text), dict))
    check(ok and text.startswith("{"), "json_object: a JSON object", text[:200])
    s, _, r = d.post("/v1/completions", {"prompt": "Today's date is", "max_tokens": 20,
                                         "temperature": 0,
                                         "structured_outputs": {"regex": " [0-9]{4}-[0-9]{2}-[0-9]{2}"}})
    text = r["choices"][0]["text"] if s == 200 else ""
    check(s == 200 and re.fullmatch(r" \d{4}-\d{2}-\d{2}", text)
          and r["choices"][0]["finish_reason"] == "stop", "structured_outputs.regex on completions",
          repr(r)[:300])
    s, _, r = chat(d, "Is the sky blue?", temperature=0.7, seed=3,
                   structured_outputs={"choice": ["yes", "no", "it depends"]})
    check(s == 200 and r["choices"][0]["message"]["content"] in ("yes", "no", "it depends"),
          "structured_outputs.choice", repr(r)[:300])
    gbnf = 'root ::= answer " because " reason "."\nanswer ::= "yes" | "no"\nreason ::= [a-z ]{1,40}\n'
    s, _, r = chat(d, "Is the sky blue? Say why.", temperature=0,
                   structured_outputs={"grammar": gbnf})
    text = r["choices"][0]["message"]["content"] if s == 200 else ""
    check(re.fullmatch(r"(yes|no) because [a-z ]{1,40}\.", text) is not None,
          "structured_outputs.grammar (GBNF)", repr(r)[:300])
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    s, _, r = chat(d, "Give a number.", temperature=0, structured_outputs={"json": json.dumps(schema)})
    check(s == 200 and not validate(json.loads(r["choices"][0]["message"]["content"]), schema, schema),
          "structured_outputs.json as a string", repr(r)[:300])
    s, _, r = d.post("/v1/completions", {"prompt": "A JSON list of two primes:", "max_tokens": 30,
                                         "temperature": 0, "response_format": {
                                             "type": "json_schema", "json_schema": {"name": "p", "schema": {
                                                 "type": "array", "items": {"type": "integer"},
                                                 "minItems": 2, "maxItems": 2}}}})
    v = json.loads(r["choices"][0]["text"]) if s == 200 else None
    check(isinstance(v, list) and len(v) == 2, "response_format on /v1/completions", repr(r)[:300])
    m = d.metrics()
    n, secs = m.get("quern_grammar_masks_total", 0), m.get("quern_grammar_mask_seconds_total", 0)
    check(n > 0, f"/metrics counts the masks ({int(n)}, {1e6 * secs / max(n, 1):.1f} us each "
          "computed and applied, in the engine)", repr(n))


def test_determinism_and_length(d):
    schema = json.load(open(os.path.join(HERE, "structured_schemas.json")))[11]["schema"]
    rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    n = 4 if SANITIZED else 12
    jobs = [lambda: chat(d, "Describe a book.", temperature=0.9, seed=99, response_format=rf)
            for _ in range(n)]
    outs = {r[2]["choices"][0]["message"]["content"] for r in run_parallel(jobs)}
    check(len(outs) == 1, f"a seeded constrained request gives the same bytes {n} times at once",
          repr(outs)[:300])
    s, _, r = chat(d, "Describe a book.", temperature=0, max_tokens=5, response_format=rf)
    check(s == 200 and r["choices"][0]["finish_reason"] == "length"
          and r["usage"]["completion_tokens"] == 5
          and json_prefix_error(r["choices"][0]["message"]["content"]) is None,
          "max_tokens inside a value: finish 'length', the start of a JSON text", repr(r)[:300])
    body = {"messages": [{"role": "user", "content": "Describe a book."}], "max_tokens": 160,
            "temperature": 0, "stream": True, "response_format": rf}
    text, fin = "", None
    for ev in d.stream("/v1/chat/completions", body):
        if ev != "[DONE]" and ev["choices"]:
            text += ev["choices"][0]["delta"].get("content") or ""
            fin = ev["choices"][0]["finish_reason"] or fin
    check(fin == "stop" and not validate(json.loads(text), schema, schema),
          "streamed constrained output parses", text[:200])


def test_errors(d):
    def err(body, param, what, status=400, path="/v1/chat/completions"):
        full = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
        full.update(body)
        s, _, r = d.post(path, full)
        e = r.get("error", {}) if isinstance(r, dict) else {}
        check(s == status and (param is None or e.get("param") == param), what,
              f"{s} {json.dumps(r)[:300]}")
        return e.get("message", "")
    m = err({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "contains": {}}}}}}},
        "response_format.json_schema.schema", "an unsupported keyword is a 400 naming the field")
    check("'contains'" in m and "/properties/a" in m, "... and the keyword and where", m)
    err({"response_format": {"type": "xml"}}, "response_format.type", "an unknown response_format type")
    err({"response_format": {"type": "json_schema", "json_schema": {"schema": 5}}},
        "response_format.json_schema.schema", "a schema that is not an object")
    err({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "structured_outputs",
        "structured_outputs with two sources")
    err({"structured_outputs": {"regex": "(a"}}, "structured_outputs.regex", "a bad regex")
    err({"structured_outputs": {"grammar": "root ::= missing"}}, "structured_outputs.grammar",
        "a GBNF grammar naming an undefined rule")
    err({"guided_json": {"type": "object"}}, "guided_json", "the removed guided_json is refused")
    err({"tool_choice": "required"}, "tool_choice", "tool_choice without tools")
    err({"tools": [{"type": "function", "function": {"name": "f"}}],
         "tool_choice": {"type": "function", "function": {"name": "g"}}}, "tool_choice",
        "tool_choice naming an unknown function")
    err({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0]",
        "a tool with a bad name")


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 20},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "get_time", "description": "Get the local time in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                       "required": ["city"], "additionalProperties": False}}}]


def test_tools(d):
    q = [{"role": "user", "content": "What is the weather in Paris?"}]
    s, _, r = d.post("/v1/chat/completions", {"messages": q, "tools": TOOLS, "temperature": 0,
                                              "tool_choice": "required", "parallel_tool_calls": False,
                                              "max_tokens": 80})
    ch = r["choices"][0] if s == 200 else {}
    calls = ch.get("message", {}).get("tool_calls") or []
    ok = (ch.get("finish_reason") == "tool_calls" and len(calls) == 1
          and calls[0]["type"] == "function" and calls[0]["id"]
          and calls[0]["function"]["name"] in ("get_weather", "get_time"))
    args = json.loads(calls[0]["function"]["arguments"]) if ok else None
    check(ok and isinstance(args, dict) and "city" in args,
          "tool_choice required: one tool call with JSON arguments, finish 'tool_calls'",
          repr(r)[:400])
    s, _, r = d.post("/v1/chat/completions", {"messages": q, "tools": TOOLS, "temperature": 0.8,
                                              "seed": 5, "max_tokens": 80, "tool_choice": {
                                                  "type": "function", "function": {"name": "get_time"}}})
    calls = r["choices"][0]["message"].get("tool_calls") or [] if s == 200 else []
    check(len(calls) == 1 and calls[0]["function"]["name"] == "get_time"
          and "city" in json.loads(calls[0]["function"]["arguments"]),
          "a named tool_choice calls that function", repr(r)[:400])
    body = {"messages": q, "tools": TOOLS, "temperature": 0, "max_tokens": 80, "stream": True,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    frags, fin = [], None
    for ev in d.stream("/v1/chat/completions", body):
        if ev == "[DONE]" or not ev["choices"]:
            continue
        delta = ev["choices"][0]["delta"]
        frags += delta.get("tool_calls") or []
        fin = ev["choices"][0]["finish_reason"] or fin
    head = frags[0] if frags else {}
    args = "".join(f.get("function", {}).get("arguments", "") for f in frags)
    check(fin == "tool_calls" and head.get("id") and head.get("function", {}).get("name") == "get_weather"
          and isinstance(json.loads(args or "null"), dict),
          "streamed tool call: id and name first, then the arguments", repr(frags)[:400])
    body = {"messages": [{"role": "user", "content": "Tell me a short story about a cat."}],
            "tools": TOOLS, "temperature": 0, "max_tokens": 40, "stream": True}
    parts, fin = [], None
    for ev in d.stream("/v1/chat/completions", body):
        if ev == "[DONE]" or not ev["choices"]:
            continue
        c = ev["choices"][0]["delta"].get("content")
        if c:
            parts.append(c)
        fin = ev["choices"][0]["finish_reason"] or fin
    check(len(parts) > 3 and fin in ("stop", "length", "tool_calls"),
          "streamed with tools offered: text still comes as it is made", repr(parts)[:300])
    # logprobs with tools: the stream carries every token's, as the whole response (they had
    # been left out of a stream with tools); a call, then a cut one (12 tokens)
    for body in ({"messages": q, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
                  "max_tokens": 60, "logprobs": True, "top_logprobs": 2},
                 {"messages": q, "tools": TOOLS, "temperature": 0.9, "seed": 3, "n": 2,
                  "max_tokens": 12, "logprobs": True}):
        s, _, r = d.post("/v1/chat/completions", body)
        whole = {c["index"]: [(x["token"], x["logprob"], len(x.get("top_logprobs") or []))
                              for x in c["logprobs"]["content"]]
                 for c in r["choices"]} if s == 200 else {}
        streamed = {}
        for ev in d.stream("/v1/chat/completions", dict(body, stream=True)):
            if ev == "[DONE]":
                continue
            for c in ev["choices"]:
                for x in (c.get("logprobs") or {}).get("content") or []:
                    streamed.setdefault(c["index"], []).append(
                        (x["token"], x["logprob"], len(x.get("top_logprobs") or [])))
        check(whole and all(whole.values()) and streamed == whole,
              "streamed with tools: the logprobs of every token, as the whole response's",
              f"{repr(whole)[:200]} vs {repr(streamed)[:200]}")
    # a round trip: the call, the tool's result, the final answer
    convo = q + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21, \"sky\": \"sunny\"}"}]
    s, _, r = d.post("/v1/chat/completions", {"messages": convo, "tools": TOOLS, "temperature": 0,
                                              "tool_choice": "none", "max_tokens": 30})
    check(s == 200 and r["choices"][0]["message"]["content"],
          "a role 'tool' message is accepted back", repr(r)[:300])
    s, _, r = d.post("/tokenize", {"messages": convo})
    s2, _, r2 = d.post("/detokenize", {"tokens": r.get("tokens", [])})
    text = r2.get("prompt", "") if isinstance(r2, dict) else ""
    check("<tool_call>\n{\"name\": \"get_weather\"" in text and "<tool_response>" in text,
          "the template writes tool calls and results as the model was trained", text[-300:])
    s, _, r = d.post("/v1/chat/completions", {"messages": q, "tools": TOOLS, "temperature": 0,
                                              "max_tokens": 60})
    ch = r["choices"][0] if s == 200 else {}
    check(s == 200 and (ch["finish_reason"] == "tool_calls") == bool(ch["message"].get("tool_calls")),
          "tool_choice auto: a call or text, consistently reported", repr(r)[:300])


SDK_SCRIPT = r"""
import json, sys, openai, pydantic
c = openai.OpenAI(base_url=sys.argv[1], api_key="unused")
out = {}

class Person(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=16)
    age: int = pydantic.Field(ge=0, le=120)
    city: str = pydantic.Field(max_length=16)

parse = getattr(c.chat.completions, "parse", None) or c.beta.chat.completions.parse
r = parse(model="smol", messages=[{"role": "user", "content": "Describe a person."}],
          response_format=Person, temperature=0, max_tokens=80)
p = r.choices[0].message.parsed
out["parsed"] = p.model_dump() if p else None
# Pydantic's set (uniqueItems), dict keyed by an enum (propertyNames) and Decimal (anyOf)
import decimal, enum
class Color(enum.Enum):
    RED = "red"; GREEN = "green"; BLUE = "blue"
class Palette(pydantic.BaseModel):
    name: str = pydantic.Field(max_length=16)
    colors: set[Color]
    stock: dict[Color, int]
    price: decimal.Decimal
r = parse(model="smol", messages=[{"role": "user", "content": "Describe a paint shop's palette."}],
          response_format=Palette, temperature=0, max_tokens=120)
p = r.choices[0].message.parsed
out["palette"] = [r.choices[0].message.content, p.model_dump(mode="json") if p else None]
# the Responses API's structured outputs: text_format becomes text.format (json_schema)
rp = getattr(c.responses, "parse", None)
if rp:
    r = rp(model="smol", input="Describe a person.", text_format=Person, temperature=0,
           max_output_tokens=80)
    out["resp_parsed"] = r.output_parsed.model_dump() if r.output_parsed else None
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}},
                         "required": ["city"], "additionalProperties": False}}}]
msgs = [{"role": "user", "content": "What is the weather in Paris?"}]
r = c.chat.completions.create(model="smol", messages=msgs, tools=tools, tool_choice="required",
                              parallel_tool_calls=False, temperature=0, max_tokens=60)
call = r.choices[0].message.tool_calls[0]
out["call"] = [call.function.name, json.loads(call.function.arguments), r.choices[0].finish_reason]
msgs += [r.choices[0].message.model_dump(exclude_none=True),
         {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temp_c": 21})}]
r = c.chat.completions.create(model="smol", messages=msgs, tools=tools, temperature=0, max_tokens=30)
out["answer"] = [r.choices[0].message.content, r.choices[0].finish_reason]
s = c.chat.completions.create(model="smol", messages=msgs[:1], tools=tools, temperature=0,
                              max_tokens=60, stream=True, parallel_tool_calls=False,
                              tool_choice={"type": "function", "function": {"name": "get_weather"}})
calls, fin = {}, None
for ch in s:
    for x in ch.choices:
        fin = x.finish_reason or fin
        for t in x.delta.tool_calls or []:
            d = calls.setdefault(t.index, {"id": None, "name": "", "arguments": ""})
            d["id"] = d["id"] or t.id
            if t.function and t.function.name: d["name"] += t.function.name
            if t.function and t.function.arguments: d["arguments"] += t.function.arguments
out["stream"] = [calls, fin]
print(json.dumps(out))
"""


def test_sdk(d):
    """The official openai SDK (from test_http's venv, when it exists): a Pydantic
    response_format through parse(), and a tool round trip, plain and streamed."""
    import subprocess
    py = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(test_http.BIN))),
                      "venv-openai", "bin", "python")
    if SANITIZED or os.environ.get("QUERN_TEST_NO_SDK") or not os.path.exists(py) or \
            subprocess.run([py, "-c", "import openai, pydantic"], capture_output=True).returncode:
        print("skip: openai SDK (no venv-openai with openai and pydantic; test_http makes it)")
        return
    r = subprocess.run([py, "-c", SDK_SCRIPT, f"http://127.0.0.1:{d.port}/v1"],
                       capture_output=True, text=True, timeout=300)
    try:
        out = json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        check(False, "openai SDK script ran", r.stdout[-500:] + r.stderr[-1500:])
        return
    p = out.get("parsed") or {}
    check(isinstance(p.get("name"), str) and 0 <= p.get("age", -1) <= 120,
          "SDK: parse() with a Pydantic model gives a validated object", repr(out["parsed"]))
    text, pal = out["palette"]
    raw = json.loads(text) if pal else {}
    check(pal is not None and len(raw.get("colors", [])) == len(set(raw.get("colors", [])))
          and set(raw.get("stock", {})) <= {"red", "green", "blue"}
          and text.count('"red":') <= 1 and text.count('"green":') <= 1
          and text.count('"blue":') <= 1,
          "SDK: a Pydantic set, enum-keyed dict and Decimal parse, each value and key once",
          repr(out["palette"]))
    if "resp_parsed" in out:
        rp = out["resp_parsed"] or {}
        check(rp == p, "SDK: responses.parse() with text_format gives chat's parsed object",
              repr(out["resp_parsed"]) + " vs " + repr(p))
    check(out["call"][0] == "get_weather" and "city" in out["call"][1]
          and out["call"][2] == "tool_calls", "SDK: a required tool call", repr(out["call"]))
    check(bool(out["answer"][0]), "SDK: the tool result goes back and an answer comes",
          repr(out["answer"]))
    calls, fin = out["stream"]
    c0 = calls.get("0") or {}
    check(fin == "tool_calls" and c0.get("id") and c0.get("name") == "get_weather"
          and "city" in json.loads(c0.get("arguments") or "{}"),
          "SDK: a streamed tool call assembles from its fragments", repr(out["stream"]))


def main():
    if not test_http.MODEL or not os.path.exists(test_http.MODEL):
        print("skip: no model")
        return 77
    # the SDK part names the model "smol": a request naming another model is a 404 (issue 15)
    d = Daemon("--max-seqs", "128", "--max-queue", "512", "--served-model-name", "smol")
    try:
        only = os.environ.get("QUERN_TEST_ONLY")
        for name, fn in [("suite", test_schema_suite), ("sources", test_sources),
                         ("determinism", test_determinism_and_length), ("errors", test_errors),
                         ("tools", test_tools), ("sdk", test_sdk)]:
            if only and not any(o in name for o in only.split(",")):
                continue
            try:
                fn(d)
            except Exception as ex:
                check(False, f"{name} raised", repr(ex))
    finally:
        d.stop()
        d.reader.join(10)
        bad = [x for x in d.lines if "runtime error" in x or "Sanitizer" in x]
        check(not bad, "the daemon logged no sanitizer report", "\n".join(bad[:10]))
    print(f"{len(test_http.FAILS)} failed" if test_http.FAILS else "all passed")
    return 1 if test_http.FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
