#!/usr/bin/env python3
"""chat_template_diff.py: random conversations, kiln vs transformers.

A differential fuzzer for the chat-template interpreter: for each template in
tests/fixtures/chat_templates/ it draws random conversations (roles, text
with unicode, whitespace runs, quotes, braces, control characters, template
markers; system prompts; tool definitions, tool calls with dict or string
arguments, tool results; reasoning; generation prompt on or off), renders
each with transformers (as scripts/chat_template_ref.py does) and with
kiln's kn_chat_apply_json through build/libkiln.so (ctypes), and reports
every difference: output bytes, or one failing where the other does not.

With --snippets it draws random small templates instead (expressions with
literals, operators, slices, filters, tests and methods; if/for/set) and
compares kiln and jinja2 (transformers' environment) on them.

Usage: make lib && python3 scripts/chat_template_diff.py [--snippets] [N per template] [seed]
Exit status 1 when any case differs.
"""
import ctypes
import json
import os
import random
import sys
import warnings

import jinja2
from transformers.utils.chat_template_utils import _normalize_chat_messages, render_jinja_template

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_template_ref import DIR, TEMPLATES, TOOLS  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LIB = os.path.join(HERE, "..", "build", "libkiln.so")


class Request(ctypes.Structure):
    _fields_ = [("messages_json", ctypes.c_char_p), ("tools_json", ctypes.c_char_p), ("extra_json", ctypes.c_char_p),
                ("add_generation_prompt", ctypes.c_bool), ("keep_bos", ctypes.c_bool),
                ("parse_arguments", ctypes.c_bool)]


def load_lib():
    lib = ctypes.CDLL(LIB)
    lib.kn_chat_template_from_string.argtypes = [ctypes.c_char_p, ctypes.c_void_p]
    lib.kn_chat_template_set_tokens.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p]
    lib.kn_chat_apply_json.argtypes = [ctypes.c_void_p, ctypes.POINTER(Request), ctypes.c_char_p, ctypes.c_size_t,
                                       ctypes.POINTER(ctypes.c_size_t)]
    lib.kn_last_error.restype = ctypes.c_char_p
    lib.kn_chat_tmpl_free.argtypes = [ctypes.c_void_p]
    return lib


PIECES = ["hello", "world", " ", "  ", "\n", "\n\n", "\t", "é", "世界", "🎉", "'", '"', "\\", "{{", "}}", "{%", "%}",
          "<think>", "</think>", "<tool_response>", "</tool_response>", "<|im_end|>", "</s>", "[INST]", "\u00a0",
          "\u2028", "\r\n", "\x01", "0", "1.5", "None", "true", "-", ".", ",", "The quick brown fox."]


def text(r):
    return "".join(r.choice(PIECES) for _ in range(r.randint(0, 8)))


def args(r):
    d = {"city": text(r) or "Paris"}
    if r.random() < 0.5:
        d["days"] = r.randint(-3, 10)
    if r.random() < 0.3:
        d["threshold"] = r.choice([0.5, 1.0, 2.25, -0.0, 1e-7, 123456789.0])
    if r.random() < 0.2:
        d["nested"] = {"list": [1, "two", None, True], "empty": {}}
    return d


def conversation(r, tmpl):
    msgs = []
    if r.random() < 0.5:
        msgs.append({"role": "system", "content": text(r)})
    n = r.randint(1, 6)
    tools = TOOLS if r.random() < 0.4 else None
    for i in range(n):
        msgs.append({"role": "user", "content": text(r)})
        if i == n - 1 and r.random() < 0.6:
            break
        if tools and r.random() < 0.5:
            calls = []
            for k in range(r.choice([1, 1, 2])):
                a = args(r)
                c = {"type": "function", "function": {"name": r.choice(["get_weather", "get_time"]),
                                                      "arguments": json.dumps(a) if r.random() < 0.3 else a},
                     "id": "".join(r.choice("abcXYZ0123") for _ in range(9))}
                calls.append(c)
            m = {"role": "assistant", "tool_calls": calls}
            if r.random() < 0.5:
                m["content"] = text(r)
            msgs.append(m)
            for c in calls:
                res = {"role": "tool", "content": text(r) if r.random() < 0.7 else {"temp": r.randint(-20, 40)},
                       "tool_call_id": c["id"]}
                msgs.append(res)
            if r.random() < 0.5:
                msgs.append({"role": "assistant", "content": text(r)})
        else:
            a = {"role": "assistant", "content": text(r)}
            if r.random() < 0.2:
                a["reasoning_content"] = text(r)
            msgs.append(a)
    extra = None
    if tmpl == "llama3.2.jinja":
        extra = {"date_string": "26 Jul 2024"}
        if r.random() < 0.3:
            extra["tools_in_user_message"] = False
    elif tmpl == "qwen3.jinja" and r.random() < 0.3:
        extra = {"enable_thinking": r.random() < 0.5}
    return msgs, tools, extra, r.random() < 0.7


# ---- random snippets -------------------------------------------------------------

# (dicts are not reversed or iterated by filters here: Jinja gives generator objects there)
LITS = ["0", "1", "-3", "2.5", "0.1", "1e3", "'a'", "'héllo wörld'", "''", "' x '", "\"q'\"", "none", "true", "false",
        "[1, 2, 3]", "[]", "['b', 'a']", "{'k': 1, 'j': [2]}", "{}", "(1, 'x')", "messages", "messages[0].role",
        "messages[-1].content", "m", "undefined_var", "'a,b,,c'", "'  pad  '", "'MiXeD Case'", "ns.v"]
SLICEABLE = ["'a'", "'héllo wörld'", "''", "[1, 2, 3]", "[]", "(1, 'x')", "messages", "messages[0].role", "'a,b,,c'"]
BIN = ["+", "-", "*", "/", "//", "%", "~", "==", "!=", "<", "<=", ">", ">=", "in", "not in", "and", "or"]
FILTERS = ["trim", "length", "tojson", "upper", "lower", "title", "capitalize", "first", "last", "list", "string",
           "int", "float", "abs", "unique|list", "sort", "join(',')", "default('d')", "tojson(indent=2)",
           "map(attribute='role')|list", "selectattr('role', 'equalto', 'user')|list", "replace('a', 'b')",
           "round(1)", "count", "dictsort", "select|list", "reject|list", "tojson(sort_keys=true)"]
TESTS = ["defined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence", "odd",
         "even", "true", "false", "boolean", "divisibleby 2", "eq 1", "in [1, 'a']", "lower", "upper"]
METHODS = ["strip()", "lstrip()", "rstrip('x')", "split()", "split(',')", "split(',', 1)", "rsplit(',', 1)",
           "startswith('a')", "endswith(('c', 'x'))", "lower()", "upper()", "replace('a', 'X')", "find('b')",
           "count('a')", "title()", "get('k')", "get('zz', 7)", "items()|list", "keys()|list", "values()|list",
           "splitlines()", "capitalize()"]


def expr(r, d=0):
    k = r.random()
    if d > 3 or k < 0.3:
        return r.choice(LITS)
    if k < 0.5:
        return f"({expr(r, d + 1)} {r.choice(BIN)} {expr(r, d + 1)})"
    if k < 0.62:
        return f"({expr(r, d + 1)}|{r.choice(FILTERS)})"
    if k < 0.7:
        return f"({expr(r, d + 1)} is {r.choice(['', 'not '])}{r.choice(TESTS)})"
    if k < 0.8:
        return f"{r.choice(LITS)}.{r.choice(METHODS)}"
    if k < 0.88:
        # slices of constants that cannot be sliced are folded into Undefined by jinja2's compiler
        # (a Python TypeError at run time): only sliceable values get slices here
        sl = r.choice(["[0]", "[-1]", "[1:]", "[:-1]", "[::-1]", "[::2]", "[1:3]", "['k']", "[5]"])
        base = r.choice(SLICEABLE) if ":" in sl else r.choice(LITS)
        return f"{base}{sl}"
    if k < 0.94:
        return f"({expr(r, d + 1)} if {expr(r, d + 1)} else {expr(r, d + 1)})"
    return f"(not {expr(r, d + 1)})"


def snippet(r):
    parts = ["{% set ns = namespace(v=0) %}"]
    for _ in range(r.randint(1, 4)):
        k = r.random()
        ws = r.choice(["", "-"])
        if k < 0.5:
            parts.append("{{" + ws + " " + expr(r) + " " + ws + "}}" + r.choice(["", " ", "\n", "\n  "]))
        elif k < 0.7:
            parts.append(f"{{%{ws} if {expr(r)} %}}A{{{{ {expr(r)} }}}}{{% else {ws}%}}B{{% endif %}}\n")
        elif k < 0.85:
            parts.append(f"{{% for m in {r.choice(['messages', '[1, 2, 3]', '{1: 2}', 'ns', 'none', 'x'])} %}}"
                         f"{{{{ loop.index }}}}{{{{ {expr(r)} }}}}{{% set ns.v = ns.v + 1 %}}{{% endfor %}}{{{{ ns.v }}}}")
        else:
            parts.append(f"{{% set q = {expr(r)} %}}{{{{ q }}}}")
    return "".join(parts)


def run_snippets(lib, n, seed):
    warnings.simplefilter("ignore")   # Python's SyntaxWarnings about literal subscripts in the generated code
    r = random.Random(seed)
    env_msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": " Hi "},
                {"role": "assistant", "content": "a,b"}]
    total = bad = both_fail = 0
    for i in range(n):
        src = snippet(r)
        try:
            want = render_jinja_template(conversations=[env_msgs], chat_template=src, add_generation_prompt=False,
                                         bos_token="<s>", eos_token="</s>")[0][0]
        except Exception as e:   # any jinja2 / Python error: kiln must refuse too
            want, why = None, f"{type(e).__name__}: {e}"
        t = ctypes.create_string_buffer(4096)
        got, err = None, ""
        if lib.kn_chat_template_from_string(src.encode(), t) == 0:
            rq = Request(json.dumps(env_msgs).encode(), None, None, False, True, False)
            buf = ctypes.create_string_buffer(1 << 20)
            need = ctypes.c_size_t(0)
            if lib.kn_chat_apply_json(t, ctypes.byref(rq), buf, 1 << 20, ctypes.byref(need)) == 0:
                got = buf.raw[:need.value].decode("utf-8", errors="replace")
            lib.kn_chat_tmpl_free(t)
        if got is None:
            err = lib.kn_last_error().decode("utf-8", errors="replace")
        total += 1
        if want is None and got is None:
            both_fail += 1
            continue
        if want != got:
            bad += 1
            if bad <= 25:
                print("--- template:", src)
                print("    jinja2:", repr(want) if want is not None else "error " + why)
                print("    kiln:  ", repr(got) if got is not None else "error " + err)
    print(f"{total} random snippets: {total - bad} agree ({both_fail} refused by both), {bad} differ")
    return 1 if bad else 0


def main():
    argv = [a for a in sys.argv[1:] if a != "--snippets"]
    n_per = int(argv[0]) if len(argv) > 0 else 300
    seed = int(argv[1]) if len(argv) > 1 else 1
    lib = load_lib()
    if "--snippets" in sys.argv:
        return run_snippets(lib, n_per, seed)
    r = random.Random(seed)
    total = bad = both_fail = 0
    for tmpl, (bos, eos) in TEMPLATES.items():
        text_t = open(os.path.join(DIR, tmpl), encoding="utf-8").read()
        t = ctypes.create_string_buffer(4096)   # >= sizeof(kn_chat_tmpl)
        assert lib.kn_chat_template_from_string(text_t.encode(), t) == 0, lib.kn_last_error()
        lib.kn_chat_template_set_tokens(t, (bos or "").encode(), (eos or "").encode())
        for _ in range(n_per):
            msgs, tools, extra, gen = conversation(r, tmpl)
            kw = {}
            if bos is not None:
                kw["bos_token"] = bos
            if eos is not None:
                kw["eos_token"] = eos
            kw.update(extra or {})
            try:
                want = render_jinja_template(conversations=[_normalize_chat_messages(msgs)], tools=tools,
                                             chat_template=text_t, add_generation_prompt=gen, **kw)[0][0]
            except (jinja2.exceptions.TemplateError, TypeError) as e:
                want = None
                why = f"{type(e).__name__}: {e}"
            rq = Request(json.dumps(msgs).encode(), json.dumps(tools).encode() if tools else None,
                         json.dumps(extra).encode() if extra else None, gen, True, False)
            need = ctypes.c_size_t(0)
            st = lib.kn_chat_apply_json(t, ctypes.byref(rq), None, 0, ctypes.byref(need))
            got = None
            if st == 8:   # KN_ERR_LIMIT: measured
                buf = ctypes.create_string_buffer(need.value + 1)
                st = lib.kn_chat_apply_json(t, ctypes.byref(rq), buf, need.value + 1, ctypes.byref(need))
                if st == 0:
                    got = buf.raw[:need.value].decode("utf-8", errors="replace")
            err = lib.kn_last_error().decode("utf-8", errors="replace") if got is None else ""
            total += 1
            if want is None and got is None:
                both_fail += 1
                continue
            if want != got:
                bad += 1
                if bad <= 10:
                    print(f"--- {tmpl}: differs")
                    print("messages:", json.dumps(msgs, ensure_ascii=False)[:600])
                    print("tools:", bool(tools), "extra:", extra, "gen:", gen)
                    print("transformers:", repr(want)[:600] if want is not None else "error " + why)
                    print("kiln:        ", repr(got)[:600] if got is not None else "error " + err)
        lib.kn_chat_tmpl_free(t)
    print(f"{total} random conversations over {len(TEMPLATES)} templates: {total - bad} agree "
          f"({both_fail} refused by both), {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
