#!/usr/bin/env python3
"""e2e.py: `kiln serve` end to end over loopback HTTP with a small model
(tests/test_serve_e2e.sh runs it; stdlib client only): completions, chat,
streaming, usage counts, stop strings, seeds, concurrent requests (each
streamed output equals the same request's greedy output alone), a client
that disconnects mid-stream (its slot is freed), the API key, the queue
limit (429), bad JSON and fields (400), a too-long prompt (400), the
official `openai` client when it is installed, and tool-call requests
through the Qwen2.5 template (the tiny random model with a tokenizer.json
directory given by -z: the replies are noise, so this checks that tools,
tool_calls and tool messages are taken and the replies are well formed)."""
import json
import os
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import BACKEND_ARGS, KILN, Server, Tally, find_model, stream_text  # noqa: E402

T = Tally()
model, extra, why = find_model()
if not model:
    T.skip("serve_e2e", why)
    T.done()
if not os.path.exists(KILN):
    T.skip("serve_e2e", KILN + " not built")
    T.done()

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
PROMPT = "The capital of France is"


def greedy(srv, prompt, n=16, **kw):
    body = {"prompt": prompt, "max_tokens": n, "temperature": 0}
    body.update(kw)
    return srv.post(CMPL, body)


def n_tokens(text):
    out = subprocess.run([KILN, "tokenize", "-m", model, "-p", text], capture_output=True, text=True)
    return len(out.stdout.split())


# --batch 24: prompts longer than that are read in chunks, between other sequences' decode steps
srv = Server(model, ["--parallel", "4", "--ctx", "2048", "--batch", "24", "-t", "2"] + extra)
try:
    st, _h, body = srv.request("GET", "/health")
    T.check("health", st == 200 and json.loads(body)["status"] == "ok", "%d %r" % (st, body))
    st, _h, body = srv.request("GET", "/v1/models")
    T.check("models", st == 200 and json.loads(body)["data"][0]["id"] == os.path.basename(model), body[:200])
    st, _h, body = srv.request("GET", "/")
    T.check("page", st == 200 and b"<html" in body and b"http://" not in body and b"https://" not in body,
            "the page must make no external requests")

    # completions: greedy, usage
    st, r = greedy(srv, PROMPT)
    ok = st == 200 and r["object"] == "text_completion" and r["choices"][0]["text"]
    T.check("completions", ok, r)
    base = r["choices"][0]["text"] if ok else ""
    u = r.get("usage", {})
    want_prompt = n_tokens(PROMPT)
    T.check("completions_usage", u.get("prompt_tokens") == want_prompt and
            u.get("total_tokens") == u.get("prompt_tokens", 0) + u.get("completion_tokens", -1) and
            (u.get("completion_tokens") == 16 or r["choices"][0]["finish_reason"] == "stop"),
            "usage %r, prompt has %d tokens" % (u, want_prompt))
    T.check("completions_finish_length", r["choices"][0]["finish_reason"] in ("length", "stop"), r)

    # the same greedy text as `kiln generate` (the single-sequence engine)
    gen = subprocess.run([KILN, "generate", "-m", model, "-p", PROMPT, "-n", "16", "--temp", "0", "-t", "2"] + BACKEND_ARGS,
                         capture_output=True, text=True)
    T.check("greedy_matches_kiln_generate", gen.returncode == 0 and gen.stdout in (base, base + "\n"),
            "serve %r vs generate %r" % (base, gen.stdout))

    # chat, non-streaming and streaming (with usage), the same greedy text
    msgs = [{"role": "user", "content": "What is the capital of France?"}]
    st, r = srv.post(CHAT, {"messages": msgs, "max_tokens": 24, "temperature": 0})
    ok = st == 200 and r["object"] == "chat.completion" and r["choices"][0]["message"]["role"] == "assistant"
    T.check("chat", ok and r["choices"][0]["message"]["content"], r)
    chat_text = r["choices"][0]["message"]["content"] if ok else None
    st, evs, done = srv.stream(CHAT, {"messages": msgs, "max_tokens": 24, "temperature": 0, "stream": True,
                                      "stream_options": {"include_usage": True}})
    usage = [e["usage"] for e in evs if e.get("usage")]
    T.check("chat_stream", st == 200 and done and stream_text(evs) == chat_text and
            evs[0]["choices"][0]["delta"].get("role") == "assistant",
            "stream %r vs %r" % (stream_text(evs), chat_text))
    T.check("chat_stream_usage", len(usage) == 1 and usage[0]["completion_tokens"] == r["usage"]["completion_tokens"]
            and usage[0]["prompt_tokens"] == r["usage"]["prompt_tokens"], "usage %r vs %r" % (usage, r.get("usage")))
    st, evs, done = srv.stream(CMPL, {"prompt": PROMPT, "max_tokens": 16, "temperature": 0, "stream": True})
    T.check("completions_stream", st == 200 and done and stream_text(evs) == base and
            evs[-1]["choices"][0]["finish_reason"] in ("length", "stop") and not any("usage" in e for e in evs),
            "%r vs %r" % (stream_text(evs), base))

    # stop strings: cut before the first occurrence, finish_reason stop
    st, long = greedy(srv, PROMPT, 40)
    text = long["choices"][0]["text"]
    stop = text[len(text) // 2: len(text) // 2 + 3] if len(text) > 8 else None
    if stop and stop.strip():
        st, r = greedy(srv, PROMPT, 40, stop=[stop, "\u00a7never\u00a7"])
        want = text[:text.find(stop)]
        T.check("stop_string", st == 200 and r["choices"][0]["text"] == want and
                r["choices"][0]["finish_reason"] == "stop", "%r vs %r (stop %r)" % (r["choices"][0]["text"], want, stop))
        st, evs, done = srv.stream(CMPL, {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stop": stop,
                                          "stream": True})
        T.check("stop_string_stream", stream_text(evs) == want, "%r vs %r" % (stream_text(evs), want))
    else:
        T.skip("stop_string", "the greedy text is too short or blank: %r" % text)

    # logit_bias: a +100 token is always taken; banning the end tokens gives exactly max_tokens
    tok = int(subprocess.run([KILN, "tokenize", "-m", model, "-p", " banana"], capture_output=True,
                             text=True).stdout.split()[-1])
    st, r = greedy(srv, PROMPT, 4, logit_bias={str(tok): 100})
    t4 = r["choices"][0]["text"] if st == 200 else ""
    T.check("logit_bias_forces", t4 and t4 == t4[:len(t4) // 4] * 4 and r["usage"]["completion_tokens"] == 4, r)
    st, r = srv.post(CHAT, {"messages": [{"role": "user", "content": "Say OK."}], "max_tokens": 30, "temperature": 0,
                            "logit_bias": {"0": -100, "1": -100, "2": -100}})
    T.check("logit_bias_bans_end", st == 200 and r["usage"]["completion_tokens"] == 30 and
            r["choices"][0]["finish_reason"] == "length", r.get("usage"))

    # seeds: the same seed repeats a sampled run
    body = {"prompt": "Once upon a time", "max_tokens": 24, "temperature": 1.0, "top_k": 0, "top_p": 1, "min_p": 0}
    outs = [srv.post(CMPL, dict(body, seed=s))[1]["choices"][0]["text"] for s in (7, 7, 8)]
    T.check("seed_repeats", outs[0] == outs[1], "%r vs %r" % (outs[0], outs[1]))
    T.check("seed_differs", outs[0] != outs[2], "seeds 7 and 8 gave the same text %r" % outs[0])

    # concurrency: 8 streams at once, each equal to its greedy output alone
    prompts = ["Tell me about %s." % w for w in ("cats", "the sea", "Paris", "music", "rain", "trees", "bread", "chess")]
    alone = [greedy(srv, p, 20)[1]["choices"][0]["text"] for p in prompts]
    got = [None] * len(prompts)

    def worker(i):
        st, evs, done = srv.stream(CMPL, {"prompt": prompts[i], "max_tokens": 20, "temperature": 0, "stream": True})
        got[i] = stream_text(evs) if st == 200 and done else ("HTTP %d" % st)
    th = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in th:
        t.start()
    for t in th:
        t.join()
    diff = [(i, got[i], alone[i]) for i in range(len(prompts)) if got[i] != alone[i]]
    T.check("concurrent_equals_alone", not diff, "differ: %r" % diff[:3])
    # a long prompt read in chunks while another sequence decodes: both as alone
    long_prompt = "Here is a list of fruits: " + ", ".join(["apple", "pear", "plum", "fig", "kiwi"] * 30) + ". Now"
    a_alone = greedy(srv, PROMPT, 40)[1]["choices"][0]["text"]
    b_alone = greedy(srv, long_prompt, 8)[1]["choices"][0]["text"]
    res = {}

    def run_a():
        st, evs, done = srv.stream(CMPL, {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "stream": True})
        res["a"] = stream_text(evs)
    ta = threading.Thread(target=run_a)
    ta.start()
    time.sleep(0.3)
    st, rb = greedy(srv, long_prompt, 8)
    ta.join()
    T.check("long_prompt_chunked", res.get("a") == a_alone and rb["choices"][0]["text"] == b_alone and
            rb["usage"]["prompt_tokens"] > 100, "a %r vs %r; b %r vs %r" % (res.get("a"), a_alone, rb, b_alone))
    m = srv.metrics()
    T.check("prefix_cache_reused", m.get("kiln_prefix_tokens_reused_total", 0) >= 96, m.get("kiln_prefix_tokens_reused_total"))

    m = srv.metrics()
    for _ in range(20):      # the last reply may reach us before the engine's bookkeeping
        if m.get("kiln_slots_used") == 0:
            break
        time.sleep(0.1)
        m = srv.metrics()
    T.check("metrics_after_load", m.get("kiln_slots_used") == 0 and m.get("kiln_queue_length") == 0 and
            m.get("kiln_generated_tokens_total", 0) > 100 and m.get("kiln_engine_steps_total", 0) > 0,
            {k: v for k, v in m.items() if "slots" in k or "queue" in k or "total" in k})

    # disconnect mid-stream: the slot is freed
    before = srv.metrics().get("kiln_disconnects_total", 0)
    s = socket.create_connection(("127.0.0.1", srv.port))
    # the end tokens banned, so the request is still running when the client
    # goes away (at temperature 1 it could end on its own right after the
    # third event: a CI run saw "busy 0 then 0")
    req = json.dumps({"prompt": PROMPT, "max_tokens": 1500, "temperature": 1.0, "stream": True,
                      "logit_bias": {"0": -100, "1": -100, "2": -100}})
    s.sendall(("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
               % (len(req), req)).encode())
    got_bytes = b""
    while got_bytes.count(b"data: ") < 3:
        got_bytes += s.recv(4096)
    busy = srv.metrics().get("kiln_slots_used")
    s.close()
    freed = False
    for _ in range(100):
        m = srv.metrics()
        if m.get("kiln_slots_used") == 0 and m.get("kiln_disconnects_total", 0) > before:
            freed = True
            break
        time.sleep(0.1)
    T.check("disconnect_frees_slot", busy == 1 and freed, "busy %r then %r" % (busy, m.get("kiln_slots_used")))

    # bad requests
    st, r = srv.post(CMPL, '{"prompt": "x", ')
    T.check("bad_json_400", st == 400 and "JSON" in r["error"]["message"], r)
    st, r = srv.post(CMPL, {"prompt": "x", "temprature": 0.5})
    T.check("unknown_field_400", st == 400 and "temprature" in r["error"]["message"] and r["error"]["param"] == "temprature", r)
    st, r = srv.post(CMPL, {"prompt": "x", "max_tokens": "ten"})
    T.check("wrong_type_400", st == 400 and "max_tokens" in r["error"]["message"], r)
    st, r = srv.post(CMPL, {"prompt": "word " * 3000})
    T.check("too_long_prompt_400", st == 400 and "context" in r["error"]["message"], r)
    st, r = srv.post(CMPL, {"prompt": "x" * (2 << 20)})
    T.check("body_too_big_413", st == 413, r)
    st, r = srv.post("/v1/nope", {})
    T.check("unknown_path_404", st == 404 and "error" in r, r)

    # the official client, when installed
    try:
        import openai  # noqa: F401
        have_openai = True
    except ImportError:
        have_openai = False
    if have_openai:
        cl = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.port, api_key="none")
        c = cl.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0)
        s = cl.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0, stream=True)
        st_text = "".join((ch.choices[0].delta.content or "") for ch in s if ch.choices)
        p = cl.completions.create(model="x", prompt=PROMPT, max_tokens=16, temperature=0)
        T.check("openai_client", c.choices[0].message.content == chat_text and st_text == chat_text and
                p.choices[0].text == base, "%r / %r / %r" % (c.choices[0].message.content, st_text, p.choices[0].text))
    else:
        T.skip("openai_client", "the openai package is not installed (pip install openai)")
finally:
    rc = srv.stop()
T.check("clean_shutdown", rc == 0, "exit %r" % rc)

# API key and the queue limit: one slot, one waiting request
srv = Server(model, ["--parallel", "1", "--queue", "1", "--ctx", "1024", "--api-key", "s3cret", "-t", "2"] + extra)
try:
    auth = {"Authorization": "Bearer s3cret"}
    st, _h, _b = srv.request("GET", "/health")
    T.check("apikey_health_open", st == 200, st)
    st, r = srv.post(CMPL, {"prompt": "x", "max_tokens": 1})
    T.check("apikey_missing_401", st == 401 and r["error"]["type"] == "authentication_error", r)
    st, r = srv.post(CMPL, {"prompt": "x", "max_tokens": 1}, headers={"Authorization": "Bearer nope"})
    T.check("apikey_wrong_401", st == 401, r)
    st, r = srv.post(CMPL, {"prompt": "x", "max_tokens": 1}, headers=auth)
    T.check("apikey_right_200", st == 200, r)
    statuses = []

    def long_req():
        # the end tokens banned: it runs its full length, so the slot and the queue stay taken
        # (600 tokens: the tiny fallback model makes them in well under a
        # second, so the three requests go out together, not 0.3 s apart;
        # with 400 tokens 0.3 s apart the first had finished before the
        # third arrived in a sanitizer run)
        statuses.append(srv.post(CMPL, {"prompt": PROMPT, "max_tokens": 600, "temperature": 0,
                                        "logit_bias": {"0": -100, "1": -100, "2": -100}}, headers=auth)[0])
    th = [threading.Thread(target=long_req) for _ in range(3)]
    for t in th:
        t.start()
        time.sleep(0.02)
    for t in th:
        t.join()
    T.check("queue_full_429", sorted(statuses) == [200, 200, 429], statuses)
finally:
    srv.stop()

# a KV pool of 64 tokens for two requests that need 60 each: the youngest is
# ended with a clear 503 when the pool runs out, the other completes
srv = Server(model, ["--parallel", "2", "--ctx", "64", "-t", "2"] + extra)
try:
    out = {}

    def req(k):
        out[k] = srv.post(CMPL, {"prompt": "Once upon a time", "max_tokens": 50, "temperature": 1.0, "seed": k,
                                 "min_p": 0, "top_k": 0, "top_p": 1})
    # 0.02 s apart: 0.2 s let the first finish its 50 tokens before the second
    # came (both 200) on a fast enough machine
    th = [threading.Thread(target=req, args=(k,)) for k in range(2)]
    for t in th:
        t.start()
        time.sleep(0.02)
    for t in th:
        t.join()
    sts = sorted(out[k][0] for k in out)
    msgs = [out[k][1].get("error", {}).get("message", "") for k in out if out[k][0] == 503]
    ended_early = [out[k][1] for k in out if out[k][0] == 200 and out[k][1]["choices"][0]["finish_reason"] == "stop"]
    T.check("kv_pool_full_503", (sts == [200, 503] and "KV cache is full" in msgs[0]) or ended_early,
            "%r" % out)
    m = srv.metrics()
    T.check("kv_pool_full_metrics", m.get("kiln_preempted_total", 0) >= (1 if sts == [200, 503] else 0) and
            m.get("kiln_slots_used") == 0, m)
finally:
    srv.stop()

# tools: the tiny random Llama with a Hugging Face tokenizer directory whose
# tokenizer_config.json carries Qwen2.5's template (which renders tools)
assets = os.environ.get("KN_ASSETS") or "../shared/assets"
tiny = os.path.join(assets, "gguf/llama-2-tiny-random.gguf")
if not os.path.isfile(tiny):
    T.skip("tools", "$KN_ASSETS/gguf/llama-2-tiny-random.gguf is missing")
else:
    import tempfile
    tdir = tempfile.mkdtemp(prefix="kiln_tools_")
    with open("tests/fixtures/chat_templates/qwen2.5.jinja") as f:
        tmpl = f.read()
    with open("tests/fixtures/hftok/qwen2.json") as f, open(os.path.join(tdir, "tokenizer.json"), "w") as g:
        g.write(f.read())
    with open(os.path.join(tdir, "tokenizer_config.json"), "w") as g:
        json.dump({"eos_token": "<|im_end|>", "chat_template": tmpl}, g)
    srv = Server(tiny, ["-z", tdir, "--parallel", "2", "--ctx", "2048", "-t", "2"])
    try:
        tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                   "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                                  "required": ["city"]}}}]
        msgs = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "abc123XYZ", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "abc123XYZ", "content": "21 C"}]
        body = {"messages": msgs, "tools": tools, "tool_choice": "auto", "max_tokens": 8, "temperature": 0}
        st, r = srv.post(CHAT, body)
        ok = st == 200 and r["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls")
        m = r["choices"][0]["message"] if ok else {}
        T.check("tools_request", ok and (isinstance(m.get("content"), str) or m.get("tool_calls")), r)
        st2, r2 = srv.post(CHAT, dict(body, tool_choice="none"))
        T.check("tools_in_prompt", ok and st2 == 200 and r["usage"]["prompt_tokens"] > r2["usage"]["prompt_tokens"] + 50,
                "the tool definitions are rendered: %r vs %r" % (r.get("usage"), r2.get("usage")))
        st, evs, done = srv.stream(CHAT, dict(body, stream=True))
        T.check("tools_stream", st == 200 and done and stream_text(evs) == (m.get("content") or ""),
                "%r vs %r" % (stream_text(evs), m.get("content")))
        st, r = srv.post(CHAT, dict(body, tool_choice={"type": "function", "function": {"name": "nope"}}))
        T.check("tools_bad_choice_400", st == 400 and "nope" in r["error"]["message"], r)
        try:
            import openai  # noqa: F401
            cl = openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % srv.port, api_key="none")
            c = cl.chat.completions.create(model="x", messages=msgs, tools=tools, max_tokens=8, temperature=0)
            T.check("tools_openai_client", c.choices[0].message.content == m.get("content"), c)
        except ImportError:
            T.skip("tools_openai_client", "the openai package is not installed (pip install openai)")
    finally:
        srv.stop()
T.done()
