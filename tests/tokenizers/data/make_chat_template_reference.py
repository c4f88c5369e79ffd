#!/usr/bin/env python3
"""Regenerates chat_template_reference.json (Qwen2.5: conversations rendered by the chat template of
qwen2_5/tokenizer_config.json itself), chat_template_llama3_1_reference.json (Llama 3.1 Instruct:
rendered by llama3_1/chat_template.jinja) and chat_template_llama3_reference.json (Llama 3 Instruct:
llama3/chat_template.jinja), the Llama ones with bos_token "<|begin_of_text|>", with Jinja2 set up as
Hugging Face transformers sets it up (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
its tojson filter).
    python3 tests/tokenizers/data/make_chat_template_reference.py   (Debian: python3-jinja2)"""
import json
import pathlib

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

here = pathlib.Path(__file__).resolve().parent


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise TemplateError(message)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
config = json.loads((here / "qwen2_5" / "tokenizer_config.json").read_text(encoding="utf-8"))
template = env.from_string(config["chat_template"])

S, U, A, T = "system", "user", "assistant", "tool"
weather = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city, \"now\".",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "Zürich\n or 東京"},
                                                    "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city"]}}}
calc = {"type": "function", "function": {"name": "calc", "parameters": {"x": 1.5, "y": -2, "z": 1e-07, "w": 1e21,
                                                                       "v": 100.0, "flags": [True, False, None]}}}


def call(name, arguments, wrap=True):
    c = {"name": name, "arguments": arguments}
    return {"type": "function", "function": c} if wrap else c


conversations = [
    ([(U, "What is 2+2?")], None),
    ([(S, "You are a helpful assistant."), (U, "What is 2+2?")], None),
    ([(U, "hi"), (A, "hello"), (U, "and now?")], None),
    ([(S, ""), (U, "")], None),
    ([(U, "first"), (S, "a late system message"), (U, "second")], None),
    ([(S, "one"), (S, "two"), (U, "x")], None),
    ([(U, "weather?"), (A, "", [call("get_weather", {"city": "Paris"})]), (T, "sunny, 21 C"), (A, "It is sunny.")],
     None),
    ([(U, "compare"),
      (A, "Let me check.", [call("get_weather", {"city": "Oslo"}), call("get_weather", {"city": "Rome"}, False)]),
      (T, "rain"), (T, "sun"), (T, "{\"t\": 30}"), (U, "thanks")], None),
    ([(T, "a tool result first"), (U, "then a user")], None),
    ([(U, "q"), (T, "r1"), (A, "a"), (T, "r2")], None),
    ([(U, "What is the weather in Zürich?")], [weather]),
    ([(S, "Be brief."), (U, "compute"),
      (A, None, [call("calc", {"x": 1.5, "list": [1, 2.25, "três"], "q": "a\"b\\c\n\t\u0001"})]), (T, "3.75")],
     [weather, calc]),
    ([(U, "Ünïcödé ✓ 🎉 \u2028 <|im_end|> tags")], None),
    ([(U, "multi\nline\n\n  text  ")], None),
]

cases = []
for messages, tools in conversations:
    msgs = []
    for m in messages:
        msg = {"role": m[0], "content": m[1]}
        if len(m) > 2:
            msg["tool_calls"] = m[2]
        msgs.append(msg)
    for add_generation_prompt in (True, False):
        text = template.render(messages=msgs, tools=tools, add_generation_prompt=add_generation_prompt)
        case = {"messages": msgs, "add_generation_prompt": add_generation_prompt, "text": text}
        if tools is not None:
            case["tools"] = tools
        cases.append(case)
(here / "chat_template_reference.json").write_text(json.dumps(cases, ensure_ascii=False, indent=0) + "\n",
                                                   encoding="utf-8")
print(f"wrote {len(cases)} Qwen2.5 renderings")

# Llama 3.1 Instruct. Extra template variables per case: tools, builtin_tools, tools_in_user_message,
# date_string (the template's defaults when absent: none, undefined, true, "26 Jul 2024").
llama = env.from_string((here / "llama3_1" / "chat_template.jinja").read_text(encoding="utf-8"))
search = {"type": "function", "function": {"name": "brave_search", "arguments": {"query": "Zürich weather"}}}
llama_conversations = [
    ([(U, "What is 2+2?")], {}),
    ([(S, "  You are a helpful assistant.\n"), (U, "\tWhat is 2+2?  ")], {}),
    ([(U, "hi"), (A, " hello "), (U, "and now?")], {}),
    ([(S, ""), (U, "")], {}),
    ([(U, "first"), (S, "a late system message"), (U, "second")], {}),
    ([(U, "Ünïcödé ✓ 🎉 <|eot_id|> tags\u2028\u3000\u00a0"), (A, "\u2003x\u200b")], {}),
    ([(U, "multi\nline\n\n  text  \x1f\x85")], {"date_string": "01 Jan 2025"}),
    ([(U, "weather?"), (A, "", [call("get_weather", {"city": "Paris"})]), (T, "sunny, 21 C"), (A, "It is sunny.")],
     {"tools": [weather]}),
    ([(S, "Be brief."), (U, "  compute  "),
      (A, None, [call("calc", {"x": 1.5, "list": [1, 2.25, "três"], "q": "a\"b"})]), ("ipython", "{\"r\": 3.75}"),
      (A, "3.75")], {"tools": [weather, calc], "tools_in_user_message": False}),
    ([(A, "an assistant turn first"), (U, "then a user")], {"tools": [calc]}),
    ([(U, "search it"), (A, "", [search]), ("ipython", "rain"), (A, "It rains.")],
     {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}),
    ([(S, "sys"), (U, "w?"), (A, "", [call("get_weather", {"city": "Oslo"})]), (T, "cold")],
     {"builtin_tools": ["code_interpreter"], "tools": [weather], "tools_in_user_message": False}),
]
llama_cases = []
for messages, variables in llama_conversations:
    msgs = []
    for m in messages:
        msg = {"role": m[0], "content": m[1]}
        if len(m) > 2:
            msg["tool_calls"] = m[2]
        msgs.append(msg)
    for add_generation_prompt in (True, False):
        text = llama.render(messages=msgs, bos_token="<|begin_of_text|>", add_generation_prompt=add_generation_prompt,
                            **variables)
        llama_cases.append({"messages": msgs, "add_generation_prompt": add_generation_prompt, **variables,
                            "text": text})
(here / "chat_template_llama3_1_reference.json").write_text(
    json.dumps(llama_cases, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
print(f"wrote {len(llama_cases)} Llama 3.1 renderings")

# Llama 3 Instruct: no system turn of its own, no tools.
llama3 = env.from_string((here / "llama3" / "chat_template.jinja").read_text(encoding="utf-8"))
llama3_conversations = [
    [(U, "What is 2+2?")],
    [(S, "  You are a helpful assistant.\n"), (U, "\tWhat is 2+2?  "), (A, " 4 "), (U, "and 3+3?")],
    [(S, ""), (U, "")],
    [(U, "first"), (S, "a late system message"), (T, "a tool result"), (U, "second")],
    [(U, "Ünïcödé ✓ 🎉 <|eot_id|> tags\u2028\u3000\u00a0"), (A, "\u2003x\u200b")],
    [(A, "an assistant turn first"), (U, "multi\nline\n\n  text  \x1f\x85")],
    [],
]
llama3_cases = []
for messages in llama3_conversations:
    msgs = [{"role": role, "content": content} for role, content in messages]
    for add_generation_prompt in (True, False):
        text = llama3.render(messages=msgs, bos_token="<|begin_of_text|>", add_generation_prompt=add_generation_prompt)
        llama3_cases.append({"messages": msgs, "add_generation_prompt": add_generation_prompt, "text": text})
(here / "chat_template_llama3_reference.json").write_text(
    json.dumps(llama3_cases, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
print(f"wrote {len(llama3_cases)} Llama 3 renderings")
