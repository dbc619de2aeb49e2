#!/usr/bin/env python3
"""The API beyond completions and chat (issue 15) on a real daemon with the real model: models and
the model-name check, prompt logprobs, /v1/embeddings and /v1/responses, and the same through
the official `openai` SDK (test_http's venv; skipped as test_http skips it).

One daemon (test_http's Daemon, no API key) serves every part. Needs QUERN_BIN and QUERN_MODEL;
exit 77 without a model. QUERN_TEST_ONLY=name,... runs only the parts whose names contain one."""
import base64
import json
import math
import os
import struct
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_http  # noqa: E402
from test_http import Daemon, check, FAILS  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# a sanitizer build makes every token some 10x dearer: smaller prompts and generations there
SANITIZED = bool(os.environ.get("QUERN_SANITIZED"))
GOLDEN = os.path.join(HERE, "golden", "smollm2.json")


def test_models(d):
    st, _, body = d.request("GET", "/v1/models")
    data = json.loads(body).get("data", [])
    check(st == 200 and [m["id"] for m in data] == ["smol", "smol-alias"],
          "/v1/models lists the name and its alias", body)
    m = data[0] if data else {}
    check(m.get("owned_by") == "quern" and isinstance(m.get("created"), int) and
          m.get("created") > 1600000000 and m.get("max_model_len", 0) >= 2048 and
          m.get("context_length") == m.get("max_model_len"),
          "a model card has owned_by, created and the context length", m)
    st, _, body = d.request("GET", "/v1/models/smol-alias")
    one = json.loads(body)
    check(st == 200 and one.get("id") == "smol-alias" and one.get("object") == "model" and
          one.get("root") == "smol", "GET /v1/models/{alias}", body)
    st, _, body = d.request("GET", "/v1/models/other")
    err = json.loads(body).get("error", {})
    check(st == 404 and err.get("code") == "model_not_found" and "other" in err.get("message"),
          "GET /v1/models/{unknown}: 404 model_not_found", body)
    for path, body in (("/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
                       ("/v1/chat/completions",
                        {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})):
        st, _, r = d.post(path, dict(body, model="gpt-4o"))
        check(st == 404 and r["error"]["code"] == "model_not_found" and
              r["error"]["param"] == "model", f"{path}: another model's name is a 404", r)
        st, _, r = d.post(path, dict(body, model="smol-alias"))
        check(st == 200 and r.get("model") == "smol-alias",
              f"{path}: an alias is served and named in the response", r)
        st, _, r = d.post(path, body)
        check(st == 200 and r.get("model") == "smol", f"{path}: no model: the served name", r)


def completion(d, body):
    st, _, r = d.post("/v1/completions", dict({"temperature": 0}, **body))
    if st != 200:
        raise RuntimeError(f"completion {st}: {r}")
    return r


def test_prompt_logprobs(d):
    gold = next(g for g in json.load(open(GOLDEN))["generate"] if g["name"] == "once-upon")
    ids = gold["prompt_ids"] + gold["greedy_ids"][:12]
    r = completion(d, {"prompt": ids, "max_tokens": 0, "echo": True, "logprobs": 5,
                       "prompt_logprobs": 5})
    ch = r["choices"][0]
    lp, plp = ch["logprobs"], ch["prompt_logprobs"]
    check(len(lp["tokens"]) == len(ids) and lp["token_logprobs"][0] is None and
          lp["top_logprobs"][0] is None and all(isinstance(v, float)
                                                 for v in lp["token_logprobs"][1:]),
          "echo + logprobs: every prompt token, the first one null", lp["token_logprobs"][:3])
    check(ch["finish_reason"] == "length" and r["usage"]["completion_tokens"] == 0 and
          ch["text"] == "".join(lp["tokens"]), "max_tokens 0: the prompt echoed, nothing generated",
          ch["text"])
    offs = lp["text_offset"]
    check(offs[0] == 0 and all(offs[i] + len(lp["tokens"][i].encode()) == offs[i + 1]
                               for i in range(len(offs) - 1)), "echo text_offset", offs)
    check(len(plp) == len(ids) and plp[0] is None and
          all(str(ids[i]) in plp[i] for i in range(1, len(ids))),
          "prompt_logprobs: one entry per prompt token, keyed by id, the first null")
    # against transformers (fp32 on the dequantized weights): top-5 ids and logit gaps at the
    # recorded positions inside the prompt (logits at pos score token pos + 1)
    for g in gold["logits"]:
        pos = g["pos"]
        if pos + 1 >= len(ids):
            continue
        e = plp[pos + 1]
        ranked = sorted(((v["rank"], int(k), v["logprob"]) for k, v in e.items()
                         if v["rank"] <= 5))
        got_ids = [t for _, t, _ in ranked]
        gaps = [lp_ - ranked[0][2] for _, _, lp_ in ranked]
        want = [x - g["top_logits"][0] for x in g["top_logits"]]
        check(got_ids == g["top_ids"] and max(abs(a - b) for a, b in zip(gaps, want)) < 2e-2,
              f"prompt logprobs at pos {pos} match transformers' top-5 logits",
              f"{ranked} vs {g['top_ids']} {g['top_logits']}")
        mine = e[str(ids[pos + 1])]
        check(mine["rank"] == 1 + sum(1 for v in e.values() if v["logprob"] > mine["logprob"])
              or mine["rank"] > 5, f"the prompt token's rank at pos {pos}", e)
    # a one-token-at-a-time forward: the decode's logprob of each generated token equals the
    # prompt logprob of the same token when the whole text is one prefill
    g = completion(d, {"prompt": gold["prompt_ids"], "max_tokens": 10, "logprobs": 0,
                       "ignore_eos": True})
    dec = g["choices"][0]["logprobs"]["token_logprobs"]
    st, _, tk = d.post("/tokenize", {"prompt": g["choices"][0]["text"],
                                     "add_special_tokens": False})
    gen_ids = tk["tokens"]
    full = gold["prompt_ids"] + gen_ids
    e = completion(d, {"prompt": full, "max_tokens": 0, "prompt_logprobs": 0})
    pl = e["choices"][0]["prompt_logprobs"]
    pre = [pl[i][str(full[i])]["logprob"] for i in range(len(gold["prompt_ids"]), len(full))]
    check(len(gen_ids) == len(dec) and pre == dec,
          "prompt logprobs equal the decode's logprobs bit for bit", f"{pre}\n    {dec}")
    # a prompt longer than a step's prompt-logprob rows (128) is scored over several chunks:
    # its first tokens' logprobs are those of the short prompt alone
    text = " ".join(f"item {i} is {i * 7 % 13}." for i in range(60))
    st, _, tk = d.post("/tokenize", {"prompt": text})
    long_ids = tk["tokens"][:300 if SANITIZED else 400]
    a = completion(d, {"prompt": long_ids, "max_tokens": 1, "prompt_logprobs": 2})
    b = completion(d, {"prompt": long_ids[:150], "max_tokens": 0, "prompt_logprobs": 2})
    pa, pb = a["choices"][0]["prompt_logprobs"], b["choices"][0]["prompt_logprobs"]
    check(len(long_ids) > 256 and len(pa) == len(long_ids) and pa[:150] == pb,
          "a long prompt's logprobs, over several chunks, agree with a short prefix's", len(pa))
    # streamed: the echo, then the prompt's logprobs, then the generated tokens
    chunks = list(d.stream("/v1/completions", {"prompt": ids[:5], "max_tokens": 3, "echo": True,
                                               "logprobs": 1, "temperature": 0,
                                               "stream": True}))
    toks = [t for c in chunks if c != "[DONE]" and c["choices"][0]["logprobs"]
            for t in c["choices"][0]["logprobs"]["tokens"]]
    ns = completion(d, {"prompt": ids[:5], "max_tokens": 3, "echo": True, "logprobs": 1})
    check(toks == ns["choices"][0]["logprobs"]["tokens"],
          "streamed echo + logprobs: the same tokens as not streamed", str(toks))
    st, _, r = d.post("/v1/completions", {"prompt": "Hi", "prompt_logprobs": 1, "stream": True})
    check(st == 400 and r["error"]["param"] == "prompt_logprobs",
          "prompt_logprobs with stream: 400", r)
    st, _, r = d.post("/v1/completions", {"prompt": "Hi", "prompt_logprobs": 21})
    check(st == 400 and r["error"]["param"] == "prompt_logprobs", "prompt_logprobs 21: 400", r)
    st, _, r = d.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                               "max_tokens": 2, "prompt_logprobs": 0})
    pl = r["choices"][0]["prompt_logprobs"] if st == 200 else []
    check(st == 200 and pl[0] is None and len(pl) == r["usage"]["prompt_tokens"],
          "chat: prompt_logprobs over the templated prompt", r)


def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def embed(d, inp, **kw):
    st, _, r = d.post("/v1/embeddings", dict({"input": inp, "model": "smol"}, **kw))
    if st != 200:
        raise RuntimeError(f"embeddings {st}: {r}")
    return r


SENTENCES = ["The cat sat on the warm mat.", "A kitten was sleeping on the rug.",
             "The stock market fell sharply today.", "Investors sold shares as prices dropped.",
             "How do I bake bread at home?", "A simple recipe for homemade bread."]


def test_embeddings(d):
    r = embed(d, "The cat sat on the warm mat.")
    v = r["data"][0]["embedding"]
    st, _, tk = d.post("/tokenize", {"prompt": "The cat sat on the warm mat."})
    check(r["object"] == "list" and r["data"][0]["object"] == "embedding" and
          r["data"][0]["index"] == 0 and len(v) == 576 and abs(sum(x * x for x in v) - 1) < 1e-5 and
          r["usage"]["prompt_tokens"] == tk["count"] == r["usage"]["total_tokens"] and
          r["model"] == "smol", "one input: a unit vector of the hidden size, usage counted",
          {k: r[k] for k in ("model", "usage")})
    e = [x["embedding"] for x in embed(d, SENTENCES)["data"]]
    ok = all(cos(e[i], e[i + 1]) > max(cos(e[i], e[j]) for j in range(len(e)) if j // 2 != i // 2)
             for i in range(0, len(e), 2))
    check(ok, "related sentences are closer than unrelated ones (cosine)",
          [[round(cos(a, b), 3) for b in e] for a in e])
    # bit for bit: alone, in a batch of 32, and while a generation shares the steps
    texts = [f"Sentence number {i}: " + SENTENCES[i % len(SENTENCES)] * (1 + i % 3)
             for i in range(32)]
    alone = [embed(d, t)["data"][0]["embedding"] for t in texts[:4]]
    gen = threading.Thread(target=lambda: d.post("/v1/completions", {
        "prompt": "Once upon a time", "max_tokens": 40 if SANITIZED else 200, "temperature": 0,
        "ignore_eos": True}))
    gen.start()
    batch = embed(d, texts)["data"]
    gen.join()
    check([x["index"] for x in batch] == list(range(32)) and
          [x["embedding"] for x in batch[:4]] == alone,
          "embeddings are bit-identical alone and in a batch of 32 beside a generation")
    b64 = embed(d, texts[:2], encoding_format="base64")["data"]
    dec = [list(struct.unpack(f"<{len(v)}f", base64.b64decode(x["embedding"]))) for x in b64]
    # JSON numbers carry 15 significant digits: enough to name a float32 exactly
    f32 = [list(struct.unpack(f"<{len(v)}f", struct.pack(f"<{len(v)}f", *x["embedding"])))
           for x in batch[:2]]
    check(dec == f32, "encoding_format base64: the same float32 values")
    ids = [d.post("/tokenize", {"prompt": t})[2]["tokens"] for t in texts[:2]]
    check([x["embedding"] for x in embed(d, ids)["data"]] == [x["embedding"] for x in batch[:2]]
          and embed(d, ids[0])["data"][0]["embedding"] == batch[0]["embedding"],
          "token-id inputs embed as their text does")
    check(test_http.wait_until(lambda: test_http.kv_idle(d) and
                               d.metrics().get("quern_kv_blocks_used") == 0),
          "no KV blocks are kept after embedding", d.metrics().get("quern_kv_blocks_used"))

    def expect(status, what, body, param):
        st, _, r = d.post("/v1/embeddings", body)
        err = r.get("error", {}) if isinstance(r, dict) else {}
        check(st == status and err.get("param") == param, f"embeddings: {what}: {status}", r)
    expect(400, "dimensions", {"input": "x", "dimensions": 64}, "dimensions")
    expect(400, "encoding_format int8", {"input": "x", "encoding_format": "int8"},
           "encoding_format")
    expect(400, "no input", {"model": "smol"}, "input")
    expect(400, "an empty list", {"input": []}, "input")
    expect(400, "a number", {"input": 5}, "input")
    expect(400, "a token out of the vocabulary", {"input": [[1, 10**7]]}, "input")
    expect(400, "an input longer than the context", {"input": [[1] * 9000]}, "input")
    expect(404, "another model", {"input": "x", "model": "text-embedding-3-small"}, "model")


def test_pooling(d):
    """--pooling last and cls on their own daemons: position 0's state depends on token 0 alone,
    so cls of a text equals every mode's vector of its first token alone."""
    ids = d.post("/tokenize", {"prompt": "Paris is the capital of France"})[2]["tokens"]
    mean1 = embed(d, [ids[:1]])["data"][0]["embedding"]
    mean = embed(d, [ids])["data"][0]["embedding"]
    got = {}
    for mode in ("last", "cls"):
        p = Daemon("--pooling", mode, "--max-seqs", "4", "--precision", "f32")  # as d
        try:
            got[mode] = [x["embedding"] for x in embed(p, [ids, ids[:1]], model=None)["data"]]
        finally:
            p.stop()
            test_http.check_sanitizers(p)
    check(got["cls"][0] == got["cls"][1] == got["last"][1] == mean1,
          "--pooling cls: the first token's state, as a one-token input gives in every mode")
    check(got["last"][0] not in (mean, got["cls"][0]) and cos(got["last"][0], mean) > 0.2,
          "--pooling last: another vector than mean or cls", cos(got["last"][0], mean))


def resp_text(r):
    return "".join(c["text"] for o in r["output"] for c in o["content"])


def resp_events(d, body):
    """A streamed /v1/responses request: its HTTP status and (event type, payload) pairs."""
    events, kind = [], None
    conn = d.conn()
    conn.request("POST", "/v1/responses", body=json.dumps(dict(body, stream=True)),
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    for line in resp.read().decode().splitlines():
        if line.startswith("event: "):
            kind = line[7:]
        elif line.startswith("data: "):
            events.append((kind, json.loads(line[6:])))
    conn.close()
    return resp.status, events


def test_responses(d):
    body = {"model": "smol", "instructions": "Answer in one short sentence.",
            "input": "What is the capital of France?", "max_output_tokens": 24, "temperature": 0}
    st, _, r = d.post("/v1/responses", body)
    check(st == 200 and r["object"] == "response" and r["id"].startswith("resp_") and
          r["status"] in ("completed", "incomplete") and r["store"] is False and
          r["instructions"] == body["instructions"] and r["usage"]["input_tokens"] > 0 and
          r["usage"]["total_tokens"] == r["usage"]["input_tokens"] + r["usage"]["output_tokens"],
          "responses: a response object", r)
    st, _, c = d.post("/v1/chat/completions", {
        "messages": [{"role": "system", "content": body["instructions"]},
                     {"role": "user", "content": body["input"]}],
        "max_tokens": 24, "temperature": 0})
    text = resp_text(r)
    check(text and text == c["choices"][0]["message"]["content"] and
          r["usage"]["input_tokens"] == c["usage"]["prompt_tokens"],
          "responses: the chat path's answer to instructions + input", f"{text!r} {c}")
    status, events = resp_events(d, body)
    names = [k for k, _ in events]
    deltas = "".join(e["delta"] for k, e in events if k == "response.output_text.delta")
    final = events[-1][1]["response"] if events else {}
    want = ["response.created", "response.in_progress", "response.output_item.added",
            "response.content_part.added"]
    last = "response.completed" if r["status"] == "completed" else "response.incomplete"
    check(status == 200 and names[:4] == want and
          names[-4:] == ["response.output_text.done", "response.content_part.done",
                         "response.output_item.done", last] and
          all(k == e["type"] for k, e in events) and
          [e["sequence_number"] for _, e in events] == list(range(len(events))),
          "responses stream: the events in order, numbered", names)
    counts = ("input_tokens", "output_tokens")  # cached_tokens depends on the prefix cache
    check(deltas == text and resp_text(final) == text and
          all(final["usage"][k] == r["usage"][k] for k in counts),
          "responses stream: the deltas and the final response equal the non-streamed text",
          f"{deltas!r} {final}")
    st, _, r = d.post("/v1/responses", {
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Say hi."}]},
                  {"type": "message", "role": "assistant",
                   "content": [{"type": "output_text", "text": "Hi!"}]},
                  {"role": "user", "content": "Again."}],
        "max_output_tokens": 3, "temperature": 0, "store": True})
    check(st == 200 and r["status"] == "incomplete" and
          r["incomplete_details"] == {"reason": "max_output_tokens"} and
          r["usage"]["output_tokens"] == 3 and r["store"] is False,
          "responses: input as messages; max_output_tokens ends it incomplete", r)

    # no max_output_tokens (the SDK's default): what the context and the KV pool leave
    st, _, r = d.post("/v1/responses", {"input": "Say hi.", "temperature": 0})
    check(st == 200 and r["status"] == "completed" and r["max_output_tokens"] is None,
          "responses: no max_output_tokens", r)

    def expect(status, what, body, param):
        st, _, r = d.post("/v1/responses", body)
        err = r.get("error", {}) if isinstance(r, dict) else {}
        check(st == status and err.get("param") == param, f"responses: {what}: {status}", r)
    expect(400, "previous_response_id", {"input": "x", "previous_response_id": "resp_1"},
           "previous_response_id")
    expect(400, "no input", {"instructions": "x"}, "input")
    expect(400, "a function_call item without a name",
           {"input": [{"type": "function_call", "arguments": "{}"}]}, "input[0]")
    expect(400, "a reasoning item", {"input": [{"type": "reasoning", "summary": []}]}, "input[0]")
    expect(400, "an image part", {"input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "http://x"}]}]}, "input[0].content")
    expect(400, "a bad role", {"input": [{"role": "robot", "content": "x"}]}, "messages[0].role")
    expect(400, "a web_search tool", {"input": "x", "tools": [{"type": "web_search"}]},
           "tools[0]")
    expect(400, "max_output_tokens 0", {"input": "x", "max_output_tokens": 0},
           "max_output_tokens")
    expect(404, "another model", {"input": "x", "model": "gpt-4.1"}, "model")


def test_responses_format(d):
    """text.format: chat's response_format in the Responses API's flat shape, echoed back."""
    schema = {"type": "object", "properties": {"title": {"type": "string", "maxLength": 30},
                                               "year": {"type": "integer"}},
              "required": ["title", "year"], "additionalProperties": False}
    fmt = {"type": "json_schema", "name": "movie", "schema": schema, "strict": True}
    st, _, r = d.post("/v1/responses", {"input": "A movie as JSON.", "temperature": 0,
                                        "max_output_tokens": 60, "text": {"format": fmt}})
    st2, _, c = d.post("/v1/chat/completions", {
        "messages": [{"role": "user", "content": "A movie as JSON."}], "temperature": 0,
        "max_tokens": 60, "response_format": {"type": "json_schema", "json_schema": {
            "name": "movie", "schema": schema, "strict": True}}})
    text = resp_text(r) if st == 200 else None
    try:
        v = json.loads(text or "")
    except ValueError:
        v = None
    check(st == 200 and st2 == 200 and isinstance(v, dict) and set(v) == {"title", "year"}
          and text == c["choices"][0]["message"]["content"] and r["text"]["format"] == fmt,
          "responses: text.format json_schema constrains as chat's response_format, echoed",
          f"{text!r} {r.get('text')}")
    st, _, r = d.post("/v1/responses", {"input": "A cat as JSON.", "temperature": 0,
                                        "max_output_tokens": 30,
                                        "text": {"format": {"type": "json_object"}}})
    text = resp_text(r) if st == 200 else ""
    check(st == 200 and text.lstrip().startswith("{"), "responses: text.format json_object", r)
    for body, param in (({"type": "xml"}, "text.format.type"),
                        ({"type": "json_schema", "schema": 3}, "text.format.schema")):
        st, _, r = d.post("/v1/responses", {"input": "x", "text": {"format": body}})
        check(st == 400 and r["error"]["param"] == param, f"responses: a bad text.format: {param}",
              r)


WEATHER = [{"type": "function", "name": "get_weather", "description": "The weather of a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}}]


def test_responses_tools(d):
    body = {"input": "What is the weather in Paris?", "tools": WEATHER, "temperature": 0,
            "tool_choice": {"type": "function", "name": "get_weather"},
            "parallel_tool_calls": False, "max_output_tokens": 60}
    st, _, r = d.post("/v1/responses", body)
    calls = [o for o in r.get("output", []) if o["type"] == "function_call"]
    check(st == 200 and r["status"] == "completed" and len(calls) == 1 and
          calls[0]["name"] == "get_weather" and "city" in json.loads(calls[0]["arguments"]) and
          calls[0]["call_id"], "responses tools: a named function's call as a function_call item",
          r)
    events = []
    conn = d.conn()
    conn.request("POST", "/v1/responses", body=json.dumps(dict(body, stream=True)),
                 headers={"Content-Type": "application/json"})
    for line in conn.getresponse().read().decode().splitlines():
        if line.startswith("data: "):
            events.append(json.loads(line[6:]))
    conn.close()
    types = [e["type"] for e in events]
    args = [e["arguments"] for e in events if e["type"] == "response.function_call_arguments.done"]
    final = events[-1].get("response", {}) if events else {}
    check("response.output_text.delta" not in types and
          types.count("response.output_item.added") == 1 and calls and
          args == [calls[0]["arguments"]] and
          [o["arguments"] for o in final.get("output", [])] == args,
          "responses tools stream: the call's item and argument events", types)
    st, _, r = d.post("/v1/responses", {
        "input": [{"role": "user", "content": "What is the weather in Paris?"},
                  {"type": "function_call", "call_id": "c1", "name": "get_weather",
                   "arguments": "{\"city\": \"Paris\"}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "22 C, sunny"}],
        "tools": WEATHER, "tool_choice": "none", "temperature": 0, "max_output_tokens": 20})
    check(st == 200 and r["output"][0]["type"] == "message" and resp_text(r),
          "responses tools: a call and its output in input, answered as text", r)


SDK_SCRIPT = r"""
import json, sys, openai
c = openai.OpenAI(base_url=sys.argv[1], api_key="unused")
out = {"models": [m.id for m in c.models.list()], "model": c.models.retrieve("smol-alias").id}
try:
    c.models.retrieve("gpt-4o")
except openai.NotFoundError as e:
    out["missing"] = e.status_code
texts = json.loads(sys.argv[2])
e = c.embeddings.create(model="smol", input=texts)  # the SDK asks for base64 and decodes it
out["emb"] = [x.embedding for x in e.data]
out["emb_tokens"] = e.usage.prompt_tokens
r = c.responses.create(model="smol", instructions="Answer in one short sentence.",
                       input="What is the capital of France?", max_output_tokens=24, temperature=0)
out["resp"] = r.output_text
out["resp_status"] = r.status
parts, types = [], []
with c.responses.stream(model="smol", instructions="Answer in one short sentence.",
                        input="What is the capital of France?", max_output_tokens=24,
                        temperature=0) as s:
    for ev in s:
        types.append(ev.type)
        if ev.type == "response.output_text.delta":
            parts.append(ev.delta)
    final = s.get_final_response()
out["stream"] = "".join(parts)
out["stream_final"] = final.output_text
out["stream_types"] = types
r = c.completions.create(model="smol", prompt="Once upon a time", max_tokens=2, echo=True,
                         logprobs=1, temperature=0)
out["echo_lp"] = r.choices[0].logprobs.token_logprobs
r = c.responses.create(model="smol", input="What is the weather in Paris?", temperature=0,
                       tools=json.loads(sys.argv[3]), tool_choice="required",
                       parallel_tool_calls=False, max_output_tokens=60)
out["call"] = [(o.type, o.name, json.loads(o.arguments)) for o in r.output]
print(json.dumps(out))
"""


def test_sdk(d):
    py = test_http.sdk_python()
    if not py:
        return
    texts = [f"Sentence number {i}: " + SENTENCES[i % len(SENTENCES)] for i in range(32)]
    r = subprocess.run([py, "-c", SDK_SCRIPT, f"http://127.0.0.1:{d.port}/v1", json.dumps(texts),
                        json.dumps(WEATHER)],
                       capture_output=True, text=True, timeout=240)
    if not check(r.returncode == 0, "openai SDK script runs", r.stderr[-1500:]):
        return
    o = json.loads(r.stdout)
    check(o["models"] == ["smol", "smol-alias"] and o["model"] == "smol-alias" and
          o["missing"] == 404, "SDK: models.list, models.retrieve, NotFoundError")
    raw = embed(d, texts)
    f32 = [list(struct.unpack(f"<{len(x['embedding'])}f",
                              struct.pack(f"<{len(x['embedding'])}f", *x["embedding"])))
           for x in raw["data"]]
    check(len(o["emb"]) == 32 and o["emb"] == f32 and
          o["emb_tokens"] == raw["usage"]["prompt_tokens"],
          "SDK: a batch of 32 embeddings (base64) equals the float answer")
    st, _, ref = d.post("/v1/responses", {"instructions": "Answer in one short sentence.",
                                          "input": "What is the capital of France?",
                                          "max_output_tokens": 24, "temperature": 0})
    check(o["resp"] and o["resp"] == resp_text(ref) and o["resp_status"] == ref["status"],
          "SDK: responses.create", o["resp"])
    check(o["stream"] == o["stream_final"] == o["resp"] and
          o["stream_types"][0] == "response.created" and
          o["stream_types"][-1] in ("response.completed", "response.incomplete"),
          "SDK: responses.stream assembles the same response", json.dumps(o["stream_types"]))
    check(o["echo_lp"][0] is None and len(o["echo_lp"]) > 2, "SDK: echo with logprobs",
          o["echo_lp"])
    check(len(o["call"]) == 1 and o["call"][0][:2] == ["function_call", "get_weather"] and
          "city" in o["call"][0][2], "SDK: responses with a tool: a function_call", o["call"])


THINK_END = {"9617": 8, "17400": 8, "46": 8}  # "</", "think", ">": SmolLM2 writes </think> first


def test_reasoning(_d):
    """A template that opens a <think> block (DeepSeek-R1-Distill-Llama's, from a file): the
    answer's reasoning is message.reasoning_content, the rest content, streamed the same; a
    response_format holds after the reasoning; tools are refused (the template lists none)."""
    tmpl = os.path.join(HERE, "golden", "templates", "deepseek-r1-distill-llama-8b.jinja")
    d = Daemon("--chat-template", tmpl)
    try:
        q = [{"role": "user", "content": "What is 2+2?"}]

        def both(body):
            st, _, r = d.post("/v1/chat/completions", body)
            check(st == 200, "reasoning: the request is served", str(r)[:300])
            m = r["choices"][0]["message"]
            rs, cs, fin, su = "", "", None, {}
            for ch in d.stream("/v1/chat/completions",
                               dict(body, stream=True, stream_options={"include_usage": True})):
                if ch != "[DONE]" and ch.get("usage"):
                    su = ch["usage"]
                if ch == "[DONE]" or not ch["choices"]:
                    continue
                delta = ch["choices"][0]["delta"]
                rs += delta.get("reasoning_content") or ""
                cs += delta.get("content") or ""
                fin = ch["choices"][0]["finish_reason"] or fin
            u = r["usage"]
            check(rs == m["reasoning_content"] and cs == (m["content"] or "")
                  and fin == r["choices"][0]["finish_reason"]
                  and su.get("completion_tokens_details") == u["completion_tokens_details"],
                  "reasoning: streamed deltas (and usage) add up to the response",
                  f"{rs!r} / {cs!r} vs {m!r}; {su} vs {u}")
            return m, r["choices"][0]["finish_reason"], u

        # the prompt ends in "<think>\n": cut short, all of the answer is reasoning
        m, fin, u = both({"messages": q, "max_tokens": 12, "temperature": 0})
        check(m["content"] is None and m["reasoning_content"] and fin == "length"
              and u["completion_tokens_details"]["reasoning_tokens"] == u["completion_tokens"] == 12,
              "reasoning: an answer cut before </think> is reasoning, content null, all its tokens",
              f"{m} {u}")
        # the same tokens as a plain completion: the split is of that very text
        st, _, tk = d.post("/tokenize", {"messages": q})
        body = {"prompt": tk["tokens"], "max_tokens": 12, "temperature": 0, "logit_bias": THINK_END}
        st, _, raw = d.post("/v1/completions", body)
        raw = raw["choices"][0]["text"]
        m, _, u = both({"messages": q, "max_tokens": 12, "temperature": 0, "logit_bias": THINK_END})
        m_split, rt = m, u["completion_tokens_details"]["reasoning_tokens"]
        check("</think>" in raw and m["reasoning_content"] + "</think>" + m["content"] == raw
              and 0 < rt < u["completion_tokens"],
              "reasoning: reasoning_content + </think> + content is the output; the reasoning's "
              "tokens counted apart", f"{raw!r} {m!r} {u}")
        # a response_format holds once the reasoning has ended
        m, fin, _ = both({"messages": q, "max_tokens": 24, "temperature": 0,
                          "logit_bias": THINK_END, "response_format": {"type": "json_object"}})
        check("{" not in m["reasoning_content"] and (m["content"] or "").lstrip().startswith("{"),
              "reasoning: json_object constrains the answer after </think>", str(m))
        # /v1/responses: a reasoning item first, the message after it; streamed as events
        body = {"input": q[0]["content"], "max_output_tokens": 12, "temperature": 0,
                "logit_bias": THINK_END}
        st, _, r = d.post("/v1/responses", body)
        out = r.get("output", [])
        check(st == 200 and [o["type"] for o in out] == ["reasoning", "message"]
              and out[0]["content"][0]["text"] == m_split["reasoning_content"]
              and out[1]["content"][0]["text"] == m_split["content"]
              and r["id"].replace("resp_", "rs_") == out[0]["id"]
              and r["usage"]["output_tokens_details"]["reasoning_tokens"] == rt,
              "reasoning: /v1/responses gives a reasoning item, then the message", str(r)[:600])
        _, events = resp_events(d, body)
        names = [k for k, _ in events]
        rs = "".join(e["delta"] for k, e in events if k == "response.reasoning_text.delta")
        txt = "".join(e["delta"] for k, e in events if k == "response.output_text.delta")
        final = events[-1][1].get("response", {}) if events else {}
        check(rs == m_split["reasoning_content"] and txt == m_split["content"]
              and names.index("response.reasoning_text.done") < names.index("response.output_text.delta")
              and all(e["output_index"] == 1 for k, e in events if k == "response.output_text.delta")
              and [e["sequence_number"] for _, e in events] == list(range(len(events)))
              and [(o["type"], o["content"][0]["text"]) for o in final.get("output", [])]
              == [(o["type"], o["content"][0]["text"]) for o in out],
              "reasoning: the streamed response's events add up to the same output", str(names))
        # cut before </think>: the reasoning item holds it all, streamed as reasoning deltas
        body = {"input": q[0]["content"], "max_output_tokens": 12, "temperature": 0}
        st, _, r = d.post("/v1/responses", body)
        out = r.get("output", [])
        _, events = resp_events(d, body)
        rs = "".join(e["delta"] for k, e in events if k == "response.reasoning_text.delta")
        check(r.get("status") == "incomplete" and [o["type"] for o in out] == ["reasoning", "message"]
              and out[0]["content"][0]["text"] and out[0]["content"][0]["text"] == rs
              and out[1]["content"][0]["text"] == ""
              and not any(k == "response.output_text.delta" for k, _ in events),
              "reasoning: /v1/responses cut while reasoning: all of it in the reasoning item",
              f"{r!r}"[:500])
        st, _, r = d.post("/v1/chat/completions", {"messages": q, "tools": [
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]})
        check(st == 400 and "tool" in json.dumps(r), "reasoning: tools on this template are a 400",
              f"{st} {r}")
    finally:
        check(d.stop() == 0, "reasoning: its daemon exits 0")
        d.reader.join(10)
        test_http.check_sanitizers(d)


def test_qwen3_thinking(_d):
    """Qwen3's template (from a file): the model may open a <think> block itself, so an answer
    without one is all content (reasoning_content null, no reasoning tokens), streamed the same;
    chat_template_kwargs' enable_thinking false closes an empty block in the prompt; an earlier
    answer's reasoning_content is written where the template keeps it; a malformed switch is a
    400. (SmolLM2 never writes <think>: the split itself is test_oai's.)"""
    tmpl = os.path.join(HERE, "golden", "templates", "qwen3-0.6b.jinja")
    d = Daemon("--chat-template", tmpl)
    try:
        q = [{"role": "user", "content": "What is 2+2?"}]
        body = {"messages": q, "max_tokens": 16, "temperature": 0}
        st, _, r = d.post("/v1/chat/completions", body)
        m, u = r["choices"][0]["message"], r["usage"]
        st2, _, tk = d.post("/tokenize", {"messages": q})
        st3, _, raw = d.post("/v1/completions", {"prompt": tk["tokens"], "max_tokens": 16,
                                                 "temperature": 0})
        check(st == st2 == st3 == 200 and m["content"] == raw["choices"][0]["text"]
              and m["reasoning_content"] is None
              and u["completion_tokens_details"]["reasoning_tokens"] == 0,
              "qwen3: an answer without <think> is all content, reasoning null, 0 reasoning tokens",
              f"{m} {u}")
        rs, cs = "", ""
        for ch in d.stream("/v1/chat/completions", dict(body, stream=True)):
            if ch == "[DONE]" or not ch["choices"]:
                continue
            rs += ch["choices"][0]["delta"].get("reasoning_content") or ""
            cs += ch["choices"][0]["delta"].get("content") or ""
        check(rs == "" and cs == m["content"], "qwen3: streamed, the same content and no reasoning",
              f"{rs!r} {cs!r}")
        st, _, off = d.post("/tokenize", {"messages": q,
                                          "chat_template_kwargs": {"enable_thinking": False}})
        st2, _, txt = d.post("/detokenize", {"tokens": off["tokens"][len(tk["tokens"]):]})
        check(st == st2 == 200 and off["tokens"][:len(tk["tokens"])] == tk["tokens"]
              and txt.get("prompt") == "<think>\n\n</think>\n\n",
              "qwen3: enable_thinking false ends the prompt with an empty <think> block", str(txt))
        st, _, r = d.post("/v1/chat/completions",
                          dict(body, chat_template_kwargs={"enable_thinking": False}))
        check(st == 200 and "reasoning_content" not in r["choices"][0]["message"],
              "qwen3: with thinking off the answer is not split", str(r)[:300])
        call = {"role": "assistant", "content": "", "reasoning_content": "Look it up.",
                "tool_calls": [{"id": "c1", "type": "function",
                                "function": {"name": "add", "arguments": "{\"a\": 2}"}}]}
        st, _, loop = d.post("/tokenize", {"messages": q + [call, {"role": "tool",
                                                                   "tool_call_id": "c1",
                                                                   "content": "4"}]})
        st2, _, txt = d.post("/detokenize", {"tokens": loop["tokens"]})
        check(st == st2 == 200 and "<think>\nLook it up.\n</think>\n\n<tool_call>" in txt["prompt"],
              "qwen3: a call's reasoning_content is written inside the tool loop", str(txt)[:400])
        for bad_kw in ({"enable_thinking": "no"}, [True]):
            st, _, r = d.post("/v1/chat/completions", dict(body, chat_template_kwargs=bad_kw))
            check(st == 400 and r["error"]["param"].startswith("chat_template_kwargs"),
                  "qwen3: a malformed chat_template_kwargs is a 400 naming it", f"{st} {r}")
        st, _, r = d.post("/v1/chat/completions", dict(body, messages=q + [
            {"role": "assistant", "content": "4", "reasoning_content": 7}, q[0]]))
        check(st == 400 and r["error"]["param"] == "messages[1].reasoning_content",
              "qwen3: a reasoning_content that is not a string is a 400", f"{st} {r}")
    finally:
        check(d.stop() == 0, "qwen3: its daemon exits 0")
        d.reader.join(10)
        test_http.check_sanitizers(d)
    # --chat-template-kwargs: thinking off for requests that do not say; a request's own wins
    d = Daemon("--chat-template", tmpl, "--chat-template-kwargs", '{"enable_thinking": false}')
    try:
        st, _, dflt = d.post("/tokenize", {"messages": q})
        st2, _, on = d.post("/tokenize", {"messages": q,
                                          "chat_template_kwargs": {"enable_thinking": True}})
        check(st == st2 == 200 and dflt["tokens"] == off["tokens"] and on["tokens"] == tk["tokens"],
              "qwen3: --chat-template-kwargs sets the default, a request's enable_thinking wins",
              f"{dflt} {on}")
    finally:
        check(d.stop() == 0, "qwen3: its second daemon exits 0")
        d.reader.join(10)
        test_http.check_sanitizers(d)


def lora_files(label, *adapters):
    """A directory of adapters written by make_lora (QUERN_MAKE_LORA), one per (name, [SEED
    [ALPHA]]) as name.gguf: (directory, [paths]), or None (skipped, said) when the writer is not
    set."""
    make = os.environ.get("QUERN_MAKE_LORA")
    if not make:
        print(f"skip {label}: QUERN_MAKE_LORA not set")
        return None
    tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"quern-{label}-{os.getpid()}")
    os.makedirs(tmp, exist_ok=True)
    paths = []
    for name, args in adapters:
        paths.append(os.path.join(tmp, name + ".gguf"))
        subprocess.run([make, test_http.MODEL, paths[-1], *map(str, args)], check=True)
    return tmp, paths


def stop_lora_daemon(d, label, files):
    """Stops d (checking it exits 0 and clean) and removes the adapters lora_files wrote."""
    rc = d.stop()
    d.reader.join(10)
    check(rc == 0, f"the {label} daemon exits 0", str(rc))
    test_http.check_sanitizers(d)
    tmp, paths = files
    for p in paths:
        os.unlink(p)
    os.rmdir(tmp)


def test_lora(_d):
    """--lora: adapters a request names as its model (vLLM's way), listed by /v1/models with
    their parent. The golden adapter (tests/lorafix.h, written by make_lora) at scale 0.75 gives
    llama.cpp's greedy text (tests/golden/smollm2-lora.json) after the same prompt ran without
    it, so cached prompt K/V never cross between the model and an adapter; the model's own text
    is unchanged after and beside it; an unknown name is still a 404."""
    files = lora_files("lora", ("gold", [7]), ("other", [11]))
    if not files:
        return
    gold, other = files[1]
    ref = json.load(open(os.path.join(HERE, "golden", "smollm2-lora.json")))
    c = ref["cases"][0]
    d = Daemon("--precision", "f32", "--lora-scaled", "gold=" + gold, str(ref["scale"]),
               "--lora", other)
    try:
        st, _, body = d.request("GET", "/v1/models")
        data = json.loads(body).get("data", [])
        base = data[0]["id"] if data else None
        check(st == 200 and [m["id"] for m in data][1:] == ["gold", "other"] and
              data[0]["parent"] is None and all(m["parent"] == base for m in data[1:]),
              "/v1/models lists the adapters after the model, their parent the model", body)
        st, _, body = d.request("GET", "/v1/models/other")
        check(st == 200 and json.loads(body).get("parent") == base, "GET /v1/models/{adapter}",
              body)
        n = len(c["greedy_ids"])
        req = {"prompt": c["prompt_ids"], "max_tokens": n, "temperature": 0, "ignore_eos": True}
        st, _, plain = d.post("/v1/completions", req)
        st2, _, want = d.post("/detokenize", {"tokens": c["greedy_ids"]})
        st3, _, got = d.post("/v1/completions", dict(req, model="gold"))
        check(st == st2 == st3 == 200 and got["model"] == "gold" and
              got["choices"][0]["text"] == want["prompt"] and
              plain["choices"][0]["text"] != want["prompt"],
              "an adapter's greedy text is llama.cpp's, after the same prompt without it",
              f"{got} / want {want}")
        st, _, again = d.post("/v1/completions", req)
        check(st == 200 and again["choices"][0]["text"] == plain["choices"][0]["text"],
              "the model's own text is unchanged after an adapter ran", str(again)[:300])
        out = {}

        def one(name):
            out[name] = d.post("/v1/completions", dict(req, model=name))[2]
        ts = [threading.Thread(target=one, args=(m,)) for m in ("gold", base, "other")]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        check(out["gold"]["choices"][0]["text"] == want["prompt"] and
              out[base]["choices"][0]["text"] == plain["choices"][0]["text"] and
              out["other"]["choices"][0]["text"] not in (want["prompt"],
                                                         plain["choices"][0]["text"]),
              "side by side, each request gets its own adapter's text",
              str({k: v["choices"][0]["text"][:40] for k, v in out.items()}))
        st, _, r = d.post("/v1/chat/completions", {"model": "gold", "max_tokens": 4,
                                                   "messages": [{"role": "user", "content": "Hi"}]})
        check(st == 200 and r["model"] == "gold", "chat names the adapter it ran", str(r)[:300])
        st, _, r = d.post("/v1/completions", dict(req, model="gold2"))
        check(st == 404 and r["error"]["code"] == "model_not_found", "an unknown adapter: 404",
              str(r))
        # the engine publishes its counters after the step that answered: poll a moment
        for _ in range(50):
            st, _, text = d.request("GET", "/metrics")
            text = text.decode() if isinstance(text, bytes) else text
            got = {m: float(v) for m, v in
                   (ln.rsplit(" ", 1) for ln in text.splitlines() if ln.startswith("quern_lora_"))}
            if got.get('quern_lora_requests_finished_total{lora_name="gold"}') == 3:
                break
            time.sleep(0.05)
        check(st == 200 and got.get('quern_lora_requests_finished_total{lora_name="gold"}') == 3
              and got.get('quern_lora_requests_finished_total{lora_name="other"}') == 1
              and got.get('quern_lora_requests_running{lora_name="gold"}') == 0
              and 'quern_lora_requests_waiting{lora_name="other"}' in got,
              "/metrics counts each adapter's requests", str(got))
        st, _, r = d.post("/v1/load_lora_adapter", {"lora_name": "x", "lora_path": gold})
        check(st == 404 and "--lora-runtime" in r["error"]["message"],
              "without --lora-runtime, loading an adapter is a 404 naming the flag", str(r))
    finally:
        stop_lora_daemon(d, "LoRA", files)


def test_lora_runtime(_d):
    """--lora-runtime: vLLM's POST /v1/load_lora_adapter and /v1/unload_lora_adapter. A slot
    freed by an unload and filled again serves the new adapter's own text although the old one's
    prompt K/V are still cached (slot and generation key them); the golden adapter loaded at
    runtime (alpha 12 at scale 1: the golden alpha 16 at 0.75) gives llama.cpp's greedy text; an
    adapter a request is using cannot be unloaded (409); bad loads are 400s naming the cause."""
    ref = json.load(open(os.path.join(HERE, "golden", "smollm2-lora.json")))
    alpha = ref["adapter"]["alpha"] * ref["scale"]
    files = lora_files("lorart", ("gold", [ref["adapter"]["seed"], alpha]), ("other", [11]))
    if not files:
        return
    gold, other = files[1]
    tmp = files[0]
    c = ref["cases"][0]
    req = {"prompt": c["prompt_ids"], "max_tokens": len(c["greedy_ids"]), "temperature": 0,
           "ignore_eos": True}
    d = Daemon("--precision", "f32", "--lora-runtime")

    def load(name, path):
        return d.request("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload(name):
        return d.request("POST", "/v1/unload_lora_adapter", {"lora_name": name})

    def text(model):
        st, _, r = d.post("/v1/completions", dict(req, model=model))
        return r["choices"][0]["text"] if st == 200 else (st, r)
    try:
        st, _, body = load("o", other)
        check(st == 200 and b"added successfully" in body, "load_lora_adapter: 200", body)
        st, _, body = d.request("GET", "/v1/models")
        ids = [m["id"] for m in json.loads(body)["data"]]
        check(ids[1:] == ["o"], "/v1/models lists the loaded adapter", body)
        first = text("o")
        st, _, body = unload("o")
        check(st == 200 and b"removed successfully" in body, "unload_lora_adapter: 200", body)
        st, _, r = d.post("/v1/completions", dict(req, model="o"))
        check(st == 404 and r["error"]["code"] == "model_not_found",
              "an unloaded adapter's name is a 404", str(r))
        st, _, body = load("gold", gold)
        st2, _, want = d.post("/detokenize", {"tokens": c["greedy_ids"]})
        check(st == 200 and text("gold") == want["prompt"],
              "the freed slot's next adapter gives its own text (llama.cpp's), not the cached "
              "K/V of the one before", str(body))
        check(text("gold") != text(None) and first != want["prompt"],
              "the two adapters and the model all answer differently")
        st, _, body = load("gold", other)
        check(st == 400 and b"already been loaded" in body, "a name already loaded: 400", body)
        st, _, body = load("x", os.path.join(tmp, "nope.gguf"))
        check(st == 400 and b"cannot open" in body, "a missing file: 400 naming it", body)
        st, _, body = load("x", test_http.MODEL)
        check(st == 400 and b"not a LoRA adapter" in body, "a model file: 400", body)
        st, _, body = load("a b", other)
        check(st == 400 and b"letters, digits" in body, "a bad name: 400", body)
        st, _, body = unload("nope")
        check(st == 404, "unloading an unknown adapter: 404", body)
        # an adapter a running request uses stays
        long = dict(req, model="gold", max_tokens=400, stream=True)
        chunks = d.stream("/v1/completions", long)
        next(chunks)
        st, _, body = unload("gold")
        check(st == 409 and b"in use by 1 request" in body, "unloading an adapter in use: 409",
              body)
        for _ in chunks:
            pass
        st, _, body = unload("gold")
        check(st == 200, "once its request is done, it unloads", body)
        st, _, body = load("o", other)
        check(st == 200 and text("o") == first, "loaded again, the same adapter gives the same "
              "text", str(body))
    finally:
        stop_lora_daemon(d, "runtime-LoRA", files)


def main():
    if not test_http.BIN or not os.path.exists(test_http.BIN):
        print("skip: QUERN_BIN not set or missing")
        return 77
    if not test_http.MODEL or not os.path.exists(test_http.MODEL):
        print(f"skip: no model at {test_http.MODEL!r}")
        return 77
    # f32: the exact path, whose prompt logprobs are held to transformers' (the CPU's default
    # q8 moves logits by quantization noise, docs/quant.md)
    d = Daemon("--served-model-name", "smol,smol-alias", "--precision", "f32")
    only = os.environ.get("QUERN_TEST_ONLY", "")
    try:
        for t in (test_models, test_prompt_logprobs, test_embeddings, test_pooling,
                  test_responses, test_responses_format, test_responses_tools, test_sdk,
                  test_reasoning, test_qwen3_thinking, test_lora, test_lora_runtime):
            if only and not any(o in t.__name__ for o in only.split(",")):
                continue
            t0 = time.time()
            try:
                t(d)
            except Exception as e:  # noqa: BLE001 - one broken part must not hide the rest
                check(False, f"{t.__name__} raised {type(e).__name__}: {e}")
            print(f"-- {t.__name__}: {time.time() - t0:.1f} s")
    finally:
        rc = d.stop()
        d.reader.join(10)
        check(rc == 0, "the daemon exits 0 on SIGTERM", str(rc))
        test_http.check_sanitizers(d)
    if FAILS:
        print(f"\n{len(FAILS)} check(s) failed; daemon log tail:")
        for line in d.lines[-30:]:
            print("    " + line)
        return 1
    print("test_api: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
