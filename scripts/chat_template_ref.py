#!/usr/bin/env python3
"""chat_template_ref.py: expected chat-template renderings for tests/test_chat.c.

Runs transformers' own chat-template code on the real templates in
tests/fixtures/chat_templates/*.jinja (their sources: SOURCES.md there) over
a set of conversations (system prompt or not, several turns, generation
prompt on and off, tools, tool calls and results, reasoning, unicode and
whitespace edge cases, and requests the template refuses with
raise_exception) and writes tests/fixtures/chat_templates/cases.json:

  [{"name", "template" (file name), "bos", "eos", "messages" (JSON text),
    "tools" (JSON text or null), "extra" (JSON text or null: template
    variables), "gen" (add_generation_prompt), and "expected" (the rendered
    text, leading BOS included) or "error" (the message) with "raised"
    (true when the template's raise_exception gave it)}]

It renders the way tokenizer.apply_chat_template(conversation, tools=...,
add_generation_prompt=..., tokenize=False, **extra) does (same normalisation
of the messages, same render function, bos_token/eos_token from the
tokenizer's special tokens), without needing a tokenizer download.

Usage: python3 scripts/chat_template_ref.py   (needs transformers >= 5, jinja2)
"""
import json
import os
import sys

import jinja2
import transformers
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

HERE = os.path.dirname(os.path.abspath(__file__))
DIR = os.path.join(HERE, "..", "tests", "fixtures", "chat_templates")

# template file -> (bos_token, eos_token) as the model's tokenizer defines them
TEMPLATES = {
    "llama3.2.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "qwen3.jinja": (None, "<|im_end|>"),
    "mistral-nemo.jinja": ("<s>", "</s>"),
    "gemma2.jinja": ("<bos>", "<eos>"),
    "phi3.5.jinja": ("<s>", "<|endoftext|>"),
    "smollm2.jinja": ("<|im_start|>", "<|im_end|>"),
    "mistral-v0.2.jinja": ("<s>", "</s>"),
    "deepseek-coder.jinja": ("<\uff5cbegin\u2581of\u2581sentence\uff5c>", "<|EOT|>"),
    "command-r-plus.jinja": ("<BOS_TOKEN>", "<|END_OF_TURN_TOKEN|>"),
    "qwen2.5.jinja": (None, "<|im_end|>"),
    "gemma3.jinja": ("<bos>", "<eos>"),
}

U = lambda c: {"role": "user", "content": c}
A = lambda c: {"role": "assistant", "content": c}
S = lambda c: {"role": "system", "content": c}

BASIC = [
    ("one_user", [U("What is the capital of France?")], True),
    ("one_user_nogen", [U("What is the capital of France?")], False),
    ("multi_turn", [U("Hi!"), A("Hello. How can I help?"), U("Name a color."), A("Blue."), U("Another?")], True),
    ("multi_turn_nogen", [U("Hi!"), A("Hello."), U("Bye.")], False),
    ("unicode_ws", [U("  Héllo, 世界! 🎉 naïve café\n\ttabs\u00a0nbsp  "), A(" ok \n\n"),
                    U("quotes ' \" back\\slash {{ not jinja }} {% raw %} </s> <|im_end|>\r\nnext line")], True),
    ("empty_content", [U(""), A(""), U(" ")], True),
]
SYSTEM = [
    ("system", [S("You are a pirate. Answer in one line."), U("Where is the treasure?")], True),
    ("system_multi", [S("  Be terse.\n"), U("2+2?"), A("4"), U("3+3?")], True),
    ("system_nogen", [S("Sys."), U("Q1"), A("A1")], False),
]

WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Get the current weather in a city (°C or °F)",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "description": "forecast days", "default": 1},
        "threshold": {"type": "number", "default": 0.5}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": []}}}
TOOLS = [WEATHER, TIME]


def call(name, args, cid=None):
    c = {"type": "function", "function": {"name": name, "arguments": args}}
    if cid is not None:
        c["id"] = cid
    return c


def cases():
    out = []

    def add(tmpl, name, msgs, gen, tools=None, extra=None):
        out.append((tmpl, name, msgs, gen, tools, extra))

    d = {"date_string": "26 Jul 2024"}   # llama 3.2: else strftime_now gives today's date
    for t in TEMPLATES:
        e = d if t == "llama3.2.jinja" else None
        for name, msgs, gen in BASIC:
            add(t, name, msgs, gen, extra=e)
        if t != "gemma2.jinja":
            for name, msgs, gen in SYSTEM:
                add(t, name, msgs, gen, extra=e)
    # gemma2 refuses system messages and non-alternating roles
    add("gemma2.jinja", "err_system", [S("x"), U("y")], True)
    add("gemma2.jinja", "err_alternate", [U("a"), U("b")], True)
    # llama 3.2: tools in the first user message (default) or in the system
    # message, a tool call and its result
    tool_turn = [S("You can check the weather."), U("Weather in Paris?"),
                 {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Paris", "unit": "celsius"})]},
                 {"role": "tool", "content": {"temperature": 21.5, "sky": "clear"}}]
    add("llama3.2.jinja", "tools_user", [U("Weather in Paris?")], True, TOOLS, d)
    add("llama3.2.jinja", "tools_system", [S("Use tools."), U("Time in Tokyo?")], True, TOOLS,
        {"date_string": "1 Jan 2025", "tools_in_user_message": False})
    add("llama3.2.jinja", "tool_call_result", tool_turn, True, TOOLS, d)
    add("llama3.2.jinja", "tool_result_string", tool_turn[:3] + [{"role": "tool", "content": "21 degrees"}], True, TOOLS, d)
    add("llama3.2.jinja", "err_two_calls",
        [U("x"), {"role": "assistant", "tool_calls": [call("get_time", {"tz": "UTC"}), call("get_time", {"tz": "CET"})]}],
        True, TOOLS, d)
    add("llama3.2.jinja", "err_tools_no_user", [], True, TOOLS, d)
    # qwen3: tools, parallel calls, results, reasoning (inline <think> and reasoning_content), enable_thinking
    q_tool = [S("You are helpful."), U("Weather in Paris and the time in Tokyo?"),
              {"role": "assistant", "content": "",
               "tool_calls": [call("get_weather", {"city": "Paris"}), call("get_time", {"tz": "Asia/Tokyo"})]},
              {"role": "tool", "content": "{\"temperature\": 21}"},
              {"role": "tool", "content": "09:30"}]
    add("qwen3.jinja", "tools_only_defs", [U("Hi")], True, TOOLS)
    add("qwen3.jinja", "tools_system", [S("Be brief."), U("Hi")], True, [WEATHER])
    add("qwen3.jinja", "tool_calls_results", q_tool, True, TOOLS)
    add("qwen3.jinja", "tool_calls_then_answer", q_tool + [A("It is 21°C in Paris and 09:30 in Tokyo.")], False, TOOLS)
    add("qwen3.jinja", "tool_call_string_args",
        [U("t?"), {"role": "assistant", "content": "Let me check.",
                   "tool_calls": [{"type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"UTC\"}"}}]},
         {"role": "tool", "content": "12:00"}], True, TOOLS)
    add("qwen3.jinja", "think_inline",
        [U("2+2?"), A("<think>\nadd them\n</think>\n\n4"), U("3+3?"), A("<think>six</think>6")], False)
    add("qwen3.jinja", "think_last_gen", [U("2+2?"), A("<think>\nadd\n</think>\n\n4"), U("and 3+3?")], True)
    add("qwen3.jinja", "reasoning_content",
        [U("2+2?"), {"role": "assistant", "content": "4", "reasoning_content": "two plus two"}], False)
    add("qwen3.jinja", "enable_thinking_false", [U("Hi")], True, None, {"enable_thinking": False})
    add("qwen3.jinja", "enable_thinking_true", [U("Hi")], True, None, {"enable_thinking": True})
    add("qwen3.jinja", "tool_response_user",
        [U("q"), A("a"), U("<tool_response>\nx\n</tool_response>"), A("<think>r</think>done")], False)
    # mistral nemo: tools in the last user message, tool calls with 9-char ids, results
    m_tool = [U("Weather in Oslo?"),
              {"role": "assistant", "tool_calls": [call("get_weather", {"city": "Oslo"}, "abc123XYZ")]},
              {"role": "tool", "tool_call_id": "abc123XYZ", "content": "{\"temp\": -3}"},
              A("It is -3 degrees in Oslo."), U("And Bergen?")]
    add("mistral-nemo.jinja", "tools_defs", [U("Hi"), A("Hello"), U("Weather?")], True, TOOLS)
    add("mistral-nemo.jinja", "tool_calls_results", m_tool, True, TOOLS)
    add("mistral-nemo.jinja", "system_tools", [S("Sys prompt.")] + m_tool, True, [WEATHER])
    add("mistral-nemo.jinja", "err_call_id",
        [U("x"), {"role": "assistant", "tool_calls": [call("get_time", {"tz": "UTC"}, "short")]}], True, TOOLS)
    add("mistral-nemo.jinja", "err_alternate", [U("a"), U("b")], True)
    # qwen2.5: the default system prompt, tools (with and without a system
    # message), parallel calls and their results, arguments as a string, a
    # tool result first, a later system message
    add("qwen2.5.jinja", "tools_only_defs", [U("Hi")], True, TOOLS)
    add("qwen2.5.jinja", "tools_system", [S("Be brief."), U("Hi")], True, [WEATHER])
    add("qwen2.5.jinja", "tool_calls_results", q_tool, True, TOOLS)
    add("qwen2.5.jinja", "tool_calls_then_answer", q_tool + [A("It is 21°C in Paris and 09:30 in Tokyo.")], False, TOOLS)
    add("qwen2.5.jinja", "tool_calls_no_tools", q_tool, True)
    add("qwen2.5.jinja", "tool_call_string_args",
        [U("t?"), {"role": "assistant", "content": "Let me check.",
                   "tool_calls": [{"type": "function", "function": {"name": "get_time", "arguments": "{\"tz\": \"UTC\"}"}}]},
         {"role": "tool", "content": "12:00"}], True, TOOLS)
    add("qwen2.5.jinja", "tool_first", [{"role": "tool", "content": "x"}, U("y")], True)
    add("qwen2.5.jinja", "system_later", [U("a"), A("b"), S("new rules"), U("c")], True)
    # gemma 3: system text (a string or a list of parts) goes before the first
    # user turn; content as parts with images; roles must alternate; tools
    # are not part of the template (ignored)
    add("gemma3.jinja", "content_parts",
        [U([{"type": "image"}, {"type": "text", "text": " Describe this. "}]), A([{"type": "text", "text": "A cat."}]),
         U("More?")], True)
    add("gemma3.jinja", "system_parts", [{"role": "system", "content": [{"type": "text", "text": "Be kind."}]}, U("Hi")], True)
    add("gemma3.jinja", "tools_ignored", [S("Sys."), U("Weather?")], True, TOOLS)
    add("gemma3.jinja", "err_alternate", [U("a"), U("b")], True)
    add("gemma3.jinja", "err_system_only", [S("x"), A("y")], True)
    # phi 3.5: an empty system message is skipped
    add("phi3.5.jinja", "empty_system", [S(""), U("Hi")], True)
    return out


# Small templates for the interpreter's semantics (rendered with the messages
# below): operators, slices, loops, filters, tests, methods, whitespace rules.
SNIPPET_MSGS = [S("sys"), U(" Hi there "), A("Hello"), U("bye")]
SNIPPETS = [
    "{{ messages[::-1] | map(attribute='role') | join(',') }}|{{ messages[1:3]|length }}|{{ messages[-1].content }}",
    "{{ 'abcdef'[1:-1] }}|{{ 'abcdef'[::2] }}|{{ 'héllo'[::-1] }}|{{ 'abc'[5:] }}|{{ [1,2,3,4][-3:-1] }}|{{ 'x'[0] }}",
    "{% for m in messages %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}"
    "{{ loop.revindex }}{{ loop.revindex0 }}-{% endfor %}",
    "{% for m in messages if m.role != 'system' %}{{ loop.index }}:{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %}",
    "{% for m in messages %}{% if loop.index == 3 %}{% break %}{% endif %}{% if m.role == 'system' %}{% continue %}{% endif %}"
    "{{ m.content|trim }};{% endfor %}",
    "{% for x in [] %}a{% else %}empty{% endfor %}|{% for k, v in {'a': 1, 'b': [2]}.items() %}{{ k }}={{ v }} {% endfor %}",
    "{% set ns = namespace(n=0, s='') %}{% for m in messages %}{% set ns.n = ns.n + 1 %}{% set ns.s = ns.s ~ m.role[0] %}"
    "{% endfor %}{{ ns.n }} {{ ns.s }}",
    "{% set x = 1 %}{% for m in messages %}{% set x = x + 1 %}{% endfor %}{{ x }}",
    "{{ 1 + 2 * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 7 / 2 }} {{ 1.5 + 1 }} {{ 10 / 4 * 2 }}",
    "{{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1.0 }} {{ 3.14159 }} {{ 1e-5 }} {{ 100000.0 }} {{ -0.0 }} {{ 2.5e16 }}",
    "{{ [1, 'a', none, true, 1.5, {'k': 'v'}] }} {{ {'a': [1, 2], 'b': none} }} {{ \"it's\" }} {{ ['it\\'s'] }}",
    "{{ none }} {{ true }} {{ false }} {{ undefined_thing }}|{{ 'a' ~ 1 ~ none ~ true }}",
    "{{ 'a' in 'cat' }} {{ 'x' not in ['x', 'y'] }} {{ 'role' in messages[0] }} {{ 2 in [1, 2] }} {{ 1 == 1.0 }} {{ true == 1 }}",
    "{{ 1 < 2 < 3 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 'B' < 'a' }} {{ not 0 }} {{ 0 or 'x' }} {{ 'y' and 0 }}",
    "{{ 'yes' if messages else 'no' }} {{ 'a' if false }}|{{ (1, 2) }} {{ () }}",
    "{{ '  x y  '|trim }}|{{ 'Hello World'|lower }}|{{ 'hello world'|upper }}|{{ 'hello world'|title }}|"
    "{{ 'hello WORLD'|capitalize }}|{{ 'abc'|length }}|{{ [1, 2]|length }}|{{ {'a': 1}|length }}",
    "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }}"
    "{{ messages|rejectattr('role', 'equalto', 'user')|list|length }}{{ [0, 1, '', 'a']|select|list }}",
    "{{ messages|first }}|{{ (messages|last).role }}|{{ [3, 1, 2]|sort }}|{{ [1, 1, 2]|unique|list }}|{{ [1, 2]|reverse|list }}",
    "{{ x|default('dflt') }} {{ ''|default('e', true) }} {{ none|default('n') }} {{ '42'|int + 1 }} {{ 'x'|int }} {{ '2.5'|float }} "
    "{{ 3|float }} {{ -3|abs }} {{ 2.567|round(2) }} {{ 42|string ~ '!' }}",
    "{{ messages[0]|tojson }}|{{ {'a': [1, 2.5, true, none, 'é\\n\"'], 'b': {}}|tojson }}|{{ [1, [2, {}], []]|tojson(indent=2) }}",
    "{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ 'tab\\there'|tojson }}|{{ '\\u0001'|tojson }}",
    "{{ ' a b  c '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} {{ 'a b c'.rsplit(' ', 1) }} {{ ' x '.strip() }}"
    "{{ 'xxhixx'.strip('x') }} {{ '  l'.lstrip() }} {{ 'r  '.rstrip() }}|",
    "{{ 'Hello'.startswith('He') }} {{ 'Hello'.endswith(('x', 'lo')) }} {{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '', 1) }} "
    "{{ 'MiXeD'.lower() }} {{ 'MiXeD'.upper() }} {{ 'hello'.find('l') }} {{ 'hello'.count('l') }} {{ ', '.join(['a', 'b']) }}",
    "{{ messages[0].get('role') }} {{ messages[0].get('nope') }} {{ messages[0].get('nope', 'd') }} "
    "{{ messages[0].keys()|list }} {{ messages[0].values()|list }} {{ messages[0]|items|list }}",
    "{{ x is defined }} {{ messages is defined }} {{ none is none }} {{ 'a' is string }} {{ 1 is number }} {{ 1 is integer }} "
    "{{ 1.0 is float }} {{ {} is mapping }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 3 is odd }} {{ 4 is even }} "
    "{{ 6 is divisibleby 3 }} {{ x is not defined }} {{ true is boolean }} {{ false is false }} {{ 'a' is eq 'a' }}",
    "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(3, 0, -1)|list }} {{ dict(a=1, b='x') }}",
    "a\n  {% if true %}\n    b\n  {% endif %}\n  c {{ 'd' }}\n{# comment #}\ne\n",
    "a  {%- if true -%}  b  {%- endif -%}  c\n{{- ' d ' -}}\n e {%+ if true %} f {% endif +%}\ng\n\n",
    "{%- set s = 'x' -%}\n  {{ s }}  \n{% for i in [1, 2] %}\n    {{ i }}\n{% endfor %}\nend",
    "{{ 'a' 'b' }} {{ \"q'\" }} {{ '\\x41\\u00e9\\t|' }} {{ 'caf\\u00e9'|length }} {{ '日本語'|length }} {{ '日本語'[1] }}",
    "{% if messages[0]['role'] == 'system' %}{% set rest = messages[1:] %}{% else %}{% set rest = messages %}{% endif %}"
    "{{ rest|length }}{% for m in rest %}{% set n = loop.index %}{% endfor %}{{ n is defined }}",
    "{{ messages[1]['content'] * 2 }}|{{ [1] * 3 }}|{{ 'ab' * 0 }}|{{ messages|map('length')|list if false else 1 }}",
    "{% set d = {'x': {'y': [10, 20]}} %}{{ d.x.y[1] }} {{ d['x']['y'][0] }} {{ d.x.y.0 }} {{ d.missing }} {{ d.x.missing is defined }}",
    "{{ messages|map(attribute='role')|unique|join('|') }} {{ messages|selectattr('content')|list|length }} "
    "{{ [{'a': {'b': 1}}, {'a': {'b': 0}}]|selectattr('a.b')|list|length }}",
    "{% generation %}gen {{ 1 }}{% endgeneration %}|{{ raise_exception is defined }}|{{ strftime_now is defined }}",
    "{% macro f(x, y='d') %}[{{ x }}|{{ y }}]{% endmacro %}{{ f(1) }}{{ f(2, 3) }}{{ f(y=4, x=5) }}{{ f() }}",
    "{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}|"
    "{% set x = 'outer' %}{% macro g() %}{{ x }}{% set x = 'inner' %}{{ x }}{% endmacro %}{{ g() }}{{ x }}|"
    "{% macro h(a, b=a ~ '!') %}{{ b }}{% endmacro %}{{ h('hi') }}",
    "{%- macro render(c) -%}{%- if c is string -%}{{ c }}{%- else -%}{%- for i in c -%}{{ i.text }}{%- endfor -%}"
    "{%- endif -%}{%- endmacro -%}{% for m in messages %}{{ render(m.content)|trim }};{% endfor %}"
    "{{ render([{'text': 'a'}, {'text': 'b'}]) }}",
]


def main():
    rows = []
    for i, text in enumerate(SNIPPETS):
        row = {"name": f"snippet/{i}", "template_text": text, "bos": "<s>", "eos": "</s>",
               "messages": json.dumps(SNIPPET_MSGS, ensure_ascii=False), "tools": None, "extra": None, "gen": False}
        try:
            out, _ = render_jinja_template(conversations=[SNIPPET_MSGS], chat_template=text, add_generation_prompt=False,
                                           bos_token="<s>", eos_token="</s>")
            row["expected"] = out[0]
        except jinja2.exceptions.TemplateError as e:
            row["error"] = str(e)
            row["raised"] = type(e) is jinja2.exceptions.TemplateError
        rows.append(row)
    for tmpl, name, msgs, gen, tools, extra in cases():
        with open(os.path.join(DIR, tmpl), encoding="utf-8") as f:
            text = f.read()
        bos, eos = TEMPLATES[tmpl]
        kw = {}
        if bos is not None:
            kw["bos_token"] = bos
        if eos is not None:
            kw["eos_token"] = eos
        kw.update(extra or {})
        row = {"name": tmpl.replace(".jinja", "") + "/" + name, "template": tmpl, "bos": bos, "eos": eos,
               "messages": json.dumps(msgs, ensure_ascii=False),
               "tools": json.dumps(tools, ensure_ascii=False) if tools is not None else None,
               "extra": json.dumps(extra, ensure_ascii=False) if extra is not None else None,
               "gen": gen}
        try:
            conv = _normalize_chat_messages(msgs) if msgs else []
            out, _ = render_jinja_template(conversations=[conv], tools=tools, chat_template=text,
                                           add_generation_prompt=gen, **kw)
            row["expected"] = out[0]
        except jinja2.exceptions.TemplateError as e:
            row["error"] = str(e)
            # raise_exception raises the base class; other errors (undefined) a subclass
            row["raised"] = type(e) is jinja2.exceptions.TemplateError
        rows.append(row)
    path = os.path.join(DIR, "cases.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump(rows, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_err = sum("error" in r for r in rows)
    print(f"wrote {path}: {len(rows)} cases ({n_err} errors) with transformers {transformers.__version__}, "
          f"jinja2 {jinja2.__version__}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
