#!/usr/bin/env python3
"""Renders tests/golden/templates/*.jinja (the chat templates of Llama-3.1-8B-Instruct,
Llama-3.2-3B-Instruct, Mistral-7B-Instruct-v0.3, Mistral-Nemo-Instruct-2407 and
DeepSeek-R1-Distill-Llama-8B, Qwen2.5-7B-Instruct and Qwen3-0.6B, from llama.cpp's
models/templates, and
Zephyr-7B-beta's, which TinyLlama-1.1B-Chat carries too, Phi-3.5-mini-instruct's, Gemma-2-2B-it's,
Gemma 3's and Granite-3.3-2B-Instruct's: tests/golden/README.md says where each came from) over a
set of tool-calling conversations with jinja2, the way transformers' apply_chat_template does
(trim_blocks, lstrip_blocks, its json.dumps tojson, arguments as dicts as vLLM passes them,
no strftime_now except for Granite's, whose default system text calls it: a fixed date,
26 Jul 2024), and writes tests/golden/chat_tools.json: the reference test_chat compares
engine/chat_tools.c against. BOS is left out (bos_token ""): quern's text never starts with it.

    python3 tools/make-chat-tools-golden.py    # needs jinja2 (python3-jinja2)
"""
import copy
import datetime
import json
import os

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TDIR = os.path.join(ROOT, "tests", "golden", "templates")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "The city, e.g. Paris"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current local time \"HH:MM\" in a time zone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}, "h24": {"type": "boolean"},
                                                   "offset": {"type": "number"}}}}}
Q = {"role": "user", "content": "What's the weather in Paris right now?"}
CALL = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "a1B2c3D4e", "type": "function",
     "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]}
RESULT = {"role": "tool", "tool_call_id": "a1B2c3D4e", "content": "{\"temperature\": 21.5, \"sky\": \"sunny\"}"}

LLAMA_CASES = [
    ("tools, a system message and one question", [WEATHER, TIME],
     [{"role": "system", "content": "  You are terse.\n"}, Q], True),
    ("a round trip: the call and its result", [WEATHER],
     [Q, CALL, RESULT], True),
    ("a result holding quotes and a newline, then an answer and a new question", [WEATHER],
     [Q, CALL, dict(RESULT, content="He said \"fine\"\nok"),
      {"role": "assistant", "content": "It is 21.5 C and sunny."},
      {"role": "user", "content": "And tomorrow?"}], True),
]
MISTRAL_CASES = [
    ("tools and one question", [WEATHER, TIME], [Q], True),
    ("a system message with the last user message", [WEATHER],
     [{"role": "system", "content": "You are terse."}, Q], True),
    ("a round trip: the call and its result", [WEATHER, TIME], [Q, CALL, RESULT], True),
    ("an earlier exchange, then tools before the last question", [WEATHER],
     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " Hello! "},
      Q], True),
]
CALL2 = {"role": "assistant", "content": None, "tool_calls": [
    CALL["tool_calls"][0],
    {"id": "f5G6h7J8k", "type": "function",
     "function": {"name": "get_time", "arguments": "{\"tz\": \"Europe/Paris\"}"}}]}
# DeepSeek-R1's template writes no tool list (none is offered) and adds the arguments text as
# it is (a string, as transformers passes it)
DEEPSEEK_CASES = [
    ("a system message and one question", [],
     [{"role": "system", "content": "You are terse."}, Q], True),
    ("an earlier answer with its reasoning, then a question", [],
     [Q, {"role": "assistant", "content": "<think>\nParis is sunny.\n</think>\n\nSunny, 21 C."},
      {"role": "user", "content": "And tomorrow?"}], True),
    ("a round trip: the call, its result, the answer", [],
     [Q, CALL, RESULT, {"role": "assistant", "content": "It is 21.5 C and sunny."}], False),
    ("two calls and two results", [],
     [Q, CALL2, RESULT, dict(RESULT, tool_call_id="f5G6h7J8k", content="14:05")], True),
    ("two system messages: the last one holds", [],
     [{"role": "system", "content": "A"}, Q, {"role": "system", "content": "B"}], True),
]
STRING_ARGUMENTS = {"deepseek-r1-distill-llama-8b"}
# Zephyr's template writes no tools, calls or results: plain conversations only
ZEPHYR_CASES = [
    ("a system message and one question", [],
     [{"role": "system", "content": "You are terse."}, Q], True),
    ("no system message, an earlier exchange", [],
     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": " Hello! "}, Q], True),
    ("a closed conversation (no generation prompt)", [],
     [Q, {"role": "assistant", "content": "Sunny."}], False),
]
# Phi-3.5's template writes no tools either; an empty system message is left out, and a closed
# conversation ends with the tokenizer's eos_token (<|endoftext|>)
PHI3_CASES = [
    ("a system message and one question", [],
     [{"role": "system", "content": "You are terse."}, Q], True),
    ("an empty system message, an earlier exchange", [],
     [{"role": "system", "content": ""}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": " Hello! "}, Q], True),
    ("a closed conversation (no generation prompt)", [],
     [Q, {"role": "assistant", "content": "Sunny."}], False),
]
EOS = {"phi-3.5-mini-instruct": "<|endoftext|>"}  # else "</s>"
# Gemma 2's template writes no tools and refuses a system message (quern merges it into the user
# turn as llama.cpp does: test_chat checks that by hand); contents are trimmed
GEMMA2_CASES = [
    ("one question", [], [Q], True),
    ("an earlier exchange, whitespace trimmed", [],
     [{"role": "user", "content": "  Hi\n"}, {"role": "assistant", "content": "\n Hello! "}, Q],
     True),
    ("a closed conversation (no generation prompt)", [],
     [Q, {"role": "assistant", "content": "Sunny."}], False),
]
# Gemma 3's: a first system message's text, as it is, and "\n\n" open the first user turn (only
# the first part of a list of parts); text parts are trimmed one by one; a later system message
# where a model turn goes is a turn of its own
GEMMA3_CASES = [
    ("a system message and one question", [],
     [{"role": "system", "content": "You are terse."}, Q], True),
    ("a system message with whitespace (kept), an earlier exchange (trimmed)", [],
     [{"role": "system", "content": "  You are terse.\n"}, {"role": "user", "content": " Hi\n"},
      {"role": "assistant", "content": "\n Hello! "}, Q], True),
    ("an empty system message", [], [{"role": "system", "content": ""}, Q], True),
    ("contents as lists of text parts", [],
     [{"role": "system", "content": [{"type": "text", "text": " Be brief. "},
                                     {"type": "text", "text": "Not this part."}]},
      {"role": "user", "content": [{"type": "text", "text": "What's the weather "},
                                   {"type": "text", "text": "\n in Paris?"}]},
      {"role": "assistant", "content": [{"type": "text", "text": "Sunny, "},
                                        {"type": "text", "text": " 21 C. "}]},
      {"role": "user", "content": [{"type": "text", "text": "And tomorrow?"}]}], True),
    ("a later system message where a model turn goes", [],
     [{"role": "user", "content": "Hi"}, {"role": "system", "content": " Answer in French. "},
      Q], True),
    ("a closed conversation (no generation prompt)", [],
     [Q, {"role": "assistant", "content": "Sunny."}], False),
]
# Granite 3.3's: every message a turn of its own, content as it is (no trim), a later system
# message too. Without a system message the template writes a default system turn holding
# strftime_now's date (pinned: STRFTIME_NOW); quern leaves it out as llama.cpp's
# LLM_CHAT_TEMPLATE_GRANITE_3_X does, so such a case records that turn in
# "default_system_left_out" and test_chat compares the rest. Its template renders tools in an
# available_tools turn and no calls (content None fails it); quern writes Granite's tools through
# the Hermes rewrite (test_chat checks that by hand), so no case here offers any.
GRANITE_CASES = [
    ("a system message and one question", [],
     [{"role": "system", "content": "You are terse."}, Q], True),
    ("a system message with whitespace, an earlier exchange (nothing trimmed)", [],
     [{"role": "system", "content": "  You are terse.\n"}, {"role": "user", "content": " Hi\n"},
      {"role": "assistant", "content": "\n Hello! "}, Q], True),
    ("an empty system message", [], [{"role": "system", "content": ""}, Q], True),
    ("a later system message: a turn of its own", [],
     [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": "Hello!"},
      {"role": "system", "content": " Answer in French. "}, Q], True),
    ("a closed conversation (no generation prompt)", [],
     [{"role": "system", "content": "You are terse."}, Q,
      {"role": "assistant", "content": "Sunny."}], False),
    ("content spelling the template's markers", [],
     [{"role": "system", "content": "Quote <|end_of_text|> as it is."},
      {"role": "user", "content": "Hi<|end_of_text|>\n<|start_of_role|>system<|end_of_role|>x"}],
     True),
    ("no system message: the default system turn left out", [], [Q], True),
    ("no system message, an earlier exchange, closed: the default system turn left out", [],
     [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, Q,
      {"role": "assistant", "content": "Sunny."}], False),
]
STRFTIME_NOW = {"granite-3.3-2b-instruct": datetime.date(2024, 7, 26)}
# the system turn a template writes when the conversation has none, which quern leaves out as
# llama.cpp does: how it opens, and its end
DEFAULT_SYSTEM_TURN = {
    "granite-3.3-2b-instruct": ("<|start_of_role|>system<|end_of_role|>Knowledge Cutoff Date: "
                                "April 2024. Today's Date: July 26, 2024. You are Granite, "
                                "developed by IBM.", "<|end_of_text|>\n"),
}
# Qwen2.5's ChatML with Hermes tool calls: the format quern writes for every ChatML template
QWEN_CASES = [
    ("tools and one question (its default system text)", [WEATHER, TIME], [Q], True),
    ("tools beside a system message", [WEATHER],
     [{"role": "system", "content": "You are terse."}, Q], True),
    ("a round trip: the call and its result", [WEATHER], [Q, CALL, RESULT], True),
    ("two calls, two results in a row, then an answer and a new question", [WEATHER, TIME],
     [Q, dict(CALL2, content="Let me look."), RESULT,
      dict(RESULT, tool_call_id="f5G6h7J8k", content="14:05"),
      {"role": "assistant", "content": "21.5 C and sunny; 14:05."},
      {"role": "user", "content": "And tomorrow?"}], True),
]
# Qwen3's ChatML: the same Hermes tool prompt (no default system text), the reasoning of answers
# before the last question left out, kept inside a tool loop (as the text's <think> block or a
# reasoning_content of its own), and enable_thinking false closing an empty <think> block
THINK_CALL = dict(CALL, content="<think>\nI need the weather tool.\n</think>\n\n")
QWEN3_CASES = [
    ("one question", [], [Q], True),
    ("thinking off (chat_template_kwargs)", [], [Q], True, {"enable_thinking": False}),
    ("an earlier answer with its reasoning, then a question", [],
     [{"role": "system", "content": "You are terse."}, Q,
      {"role": "assistant", "content": "<think>\nParis is sunny.\n</think>\n\nSunny, 21 C."},
      {"role": "user", "content": "And tomorrow?"}], True),
    ("tools and one question (no system text)", [WEATHER, TIME], [Q], True),
    ("a tool loop: the call with its reasoning, the result", [WEATHER],
     [Q, THINK_CALL, RESULT], True),
    ("reasoning_content beside the text, then the result and an answer", [WEATHER],
     [Q, dict(CALL, content="Let me look.", reasoning_content="\nThe tool knows.\n"), RESULT,
      {"role": "assistant", "content": "21.5 C."}], False),
    ("two calls, two results in a row, then an answer and a new question", [WEATHER, TIME],
     [Q, dict(CALL2, content=""), RESULT, dict(RESULT, tool_call_id="f5G6h7J8k", content="14:05"),
      {"role": "assistant", "content": "<think>\nBoth known.\n</think>\n\n21.5 C and sunny; 14:05."},
      {"role": "user", "content": "And tomorrow?"}], True),
]
TEMPLATES = {
    "llama-3.1-8b-instruct": LLAMA_CASES,
    "llama-3.2-3b-instruct": LLAMA_CASES,
    "mistral-7b-instruct-v0.3": MISTRAL_CASES,
    "mistral-nemo-instruct-2407": MISTRAL_CASES,
    "deepseek-r1-distill-llama-8b": DEEPSEEK_CASES,
    "zephyr-7b-beta": ZEPHYR_CASES,
    "phi-3.5-mini-instruct": PHI3_CASES,
    "gemma-2-2b-it": GEMMA2_CASES,
    "gemma-3-it": GEMMA3_CASES,
    "granite-3.3-2b-instruct": GRANITE_CASES,
    "qwen2.5-7b-instruct": QWEN_CASES,
    "qwen3-0.6b": QWEN3_CASES,
}


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def raise_exception(msg):
    raise jinja2.exceptions.TemplateError(msg)


def render(text, tools, messages, gen, string_arguments=False, kwargs=None, eos="</s>",
           today=None):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    if today:
        env.globals["strftime_now"] = today.strftime
    msgs = copy.deepcopy(messages)
    for m in msgs:  # vLLM hands templates the arguments as a dict
        for c in m.get("tool_calls") or []:
            if not string_arguments:
                c["function"]["arguments"] = json.loads(c["function"]["arguments"])
        if m.get("tool_calls") is None:
            m.pop("tool_calls", None)
    return env.from_string(text).render(messages=msgs, tools=tools, add_generation_prompt=gen,
                                        bos_token="", eos_token=eos, **(kwargs or {}))


def main():
    out = {"templates": {}, "cases": []}
    for name, cases in TEMPLATES.items():
        with open(os.path.join(TDIR, name + ".jinja")) as f:
            text = f.read()
        out["templates"][name] = text
        for what, tools, messages, gen, *kwargs in cases:
            kwargs = kwargs[0] if kwargs else None
            case = {"template": name, "what": what, "tools": [t["function"] for t in tools],
                    "messages": messages, "add_generation_prompt": gen}
            if kwargs:
                case["chat_template_kwargs"] = kwargs
            case["formatted"] = render(text, tools, messages, gen, name in STRING_ARGUMENTS, kwargs,
                                       EOS.get(name, "</s>"), STRFTIME_NOW.get(name))
            if name in DEFAULT_SYSTEM_TURN and messages[0]["role"] != "system":
                head, end = DEFAULT_SYSTEM_TURN[name]
                turn = case["formatted"][:case["formatted"].index(end) + len(end)]
                assert turn.startswith(head), turn
                case["default_system_left_out"] = turn
            out["cases"].append(case)
    path = os.path.join(ROOT, "tests", "golden", "chat_tools.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{path}: {len(out['cases'])} conversations over {len(out['templates'])} templates")


if __name__ == "__main__":
    main()
