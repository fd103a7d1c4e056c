#!/usr/bin/env python3
"""soak.py [SECONDS] [MAX_REQUESTS]: a bounded soak of `kiln serve` on
loopback (default 25 s, at most 3000 requests): 16 client threads send
completions and chats with random parameters (streaming or not), drop some
connections mid-stream or before the answer, and mix in malformed requests
(garbage bytes, bad JSON, wrong types, unknown fields and paths, oversized
bodies). The server runs with 4 slots and a queue of 8, so 429s happen too
(clients back off a moment after one).
Afterwards: no 500 was seen, the server still answers a greedy request
exactly as before, no slot or queue entry is left (/metrics), and its
resident memory has not grown more than the KV pool's size (committed as
blocks are first used) plus 64 MiB since the warm-up."""
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import KILN, Server, Tally, find_model, read_sse  # noqa: E402

SECONDS = float(sys.argv[1]) if len(sys.argv) > 1 else 25
MAX_REQ = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
T = Tally()
model, extra, why = find_model()
if not model or not os.path.exists(KILN):
    T.skip("serve_soak", why or KILN + " not built")
    T.done()

PROMPTS = ["Once upon a time", "The capital of France is", "def fib(n):", "List three colours:",
           "Write a haiku about rain.", "Why is the sky blue?", "1, 2, 3,", "Hello"]
lock = threading.Lock()
stats = {"sent": 0, "status": {}, "dropped": 0, "malformed": 0, "errors": []}


def note(key):
    with lock:
        stats["status"][key] = stats["status"].get(key, 0) + 1


def raw(port, data, read=True, timeout=30):
    """sends bytes on a fresh connection; the status line's code, None when
    the server closed it without one, "wait" when it is still waiting for
    the rest of a request (garbage need not end a request line)"""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        s.sendall(data)
        if not read:
            return None
        buf = b""
        while b"\r\n" not in buf:
            got = s.recv(4096)
            if not got:
                break
            buf += got
        parts = buf.split(b" ", 2)
        return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
    except socket.timeout:
        if timeout < 30:
            return "wait"
        raise
    finally:
        s.close()


def http_bytes(path, body, method="POST"):
    b = body if isinstance(body, bytes) else body.encode()
    return ("%s %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (method, path, len(b))).encode() + b


def valid_body(rng):
    chat = rng.random() < 0.5
    b = {"max_tokens": rng.randint(1, 48), "temperature": round(rng.uniform(0, 1.5), 2)}
    if rng.random() < 0.5:
        b["top_k"] = rng.randint(0, 50)
    if rng.random() < 0.5:
        b["top_p"] = round(rng.uniform(0.05, 1), 2)
    if rng.random() < 0.3:
        b["seed"] = rng.randint(-2**40, 2**40)
    if rng.random() < 0.3:
        b["stop"] = rng.choice([".", "\n", ["the", "and"]])
    if rng.random() < 0.2:
        b["frequency_penalty"] = round(rng.uniform(-2, 2), 2)
    p = rng.choice(PROMPTS)
    if chat:
        b["messages"] = [{"role": "user", "content": p}]
    else:
        b["prompt"] = p
    return ("/v1/chat/completions" if chat else "/v1/completions"), b


def client(srv, seed, stop_at):
    rng = random.Random(seed)
    while time.time() < stop_at:
        with lock:
            if stats["sent"] >= MAX_REQ:
                return
            stats["sent"] += 1
        r = rng.random()
        try:
            if r < 0.15:        # malformed
                kind = rng.randrange(6)
                with lock:
                    stats["malformed"] += 1
                if kind == 0:
                    code = raw(srv.port, bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))) + b"\r\n\r\n",
                               timeout=3)
                    note("garbage:%s" % code)
                elif kind == 1:
                    note("badjson:%s" % raw(srv.port, http_bytes("/v1/completions", '{"prompt": [1, ')))
                elif kind == 2:
                    note("badtype:%s" % raw(srv.port, http_bytes("/v1/chat/completions", '{"messages": "hi"}')))
                elif kind == 3:
                    note("unknown:%s" % raw(srv.port, http_bytes("/v1/completions", '{"prompt":"x","foo":1}')))
                elif kind == 4:
                    note("path:%s" % raw(srv.port, http_bytes("/v2/" + "a" * rng.randint(1, 2000), "{}", "GET")))
                else:
                    note("big:%s" % raw(srv.port, http_bytes("/v1/completions", '{"prompt":"' + "y" * (1100 * 1024) + '"}')))
                continue
            path, body = valid_body(rng)
            stream = rng.random() < 0.6
            if stream:
                body["stream"] = True
            drop = rng.random() < 0.25
            if drop and not stream:          # gone before the answer
                raw(srv.port, http_bytes(path, json.dumps(body)), read=False)
                with lock:
                    stats["dropped"] += 1
                continue
            c = srv.conn(120)
            c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
            resp = c.getresponse()
            note(str(resp.status))
            if resp.status == 429:          # busy: back off as a client should
                resp.read()
                c.close()
                time.sleep(rng.uniform(0.2, 0.6))
                continue
            if resp.status == 200 and stream:
                n = 0
                keep = rng.randint(1, 6) if drop else 10**9
                for ev in read_sse(resp):
                    n += 1
                    if n >= keep:
                        break
                    if ev != "[DONE]":
                        json.loads(ev)
                if drop:
                    with lock:
                        stats["dropped"] += 1
            else:
                data = resp.read()
                json.loads(data)
            c.close()
        except Exception as e:  # noqa: BLE001 (any failure is reported)
            with lock:
                stats["errors"].append(repr(e)[:200])


srv = Server(model, ["--parallel", "4", "--queue", "8", "--ctx", "2048", "-t", "2"] + extra)
try:
    st, ref = srv.post("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0})
    ref_text = ref["choices"][0]["text"]
    t0 = time.time()
    stop_at = t0 + SECONDS
    threads = [threading.Thread(target=client, args=(srv, 1000 + i, stop_at)) for i in range(16)]
    for t in threads:
        t.start()
    time.sleep(min(5, SECONDS / 5))
    rss_warm = srv.rss_kib()
    for t in threads:
        t.join()
    m = {}
    for _ in range(100):
        m = srv.metrics()
        if m.get("kiln_slots_used") == 0 and m.get("kiln_queue_length") == 0 and m.get("kiln_kv_blocks_used") == 0:
            break
        time.sleep(0.1)
    rss_end = srv.rss_kib()
    print("# soak: %.0f s, %d requests (%d malformed, %d dropped), statuses %s, RSS %d -> %d KiB, %d tokens generated"
          % (time.time() - t0, stats["sent"], stats["malformed"], stats["dropped"], json.dumps(stats["status"], sort_keys=True),
             rss_warm, rss_end, m.get("kiln_generated_tokens_total", 0)), flush=True)
    T.check("soak_no_client_errors", not stats["errors"], "%d: %s" % (len(stats["errors"]), stats["errors"][:3]))
    T.check("soak_no_500", not any(k.endswith("500") for k in stats["status"]), stats["status"])
    T.check("soak_served", stats["status"].get("200", 0) > 16, stats["status"])
    T.check("soak_no_slot_leaked", m.get("kiln_slots_used") == 0 and m.get("kiln_queue_length") == 0 and
            m.get("kiln_kv_blocks_used") == 0, {k: v for k, v in m.items() if "slots" in k or "queue" in k or "blocks" in k})
    st, again = srv.post("/v1/completions", {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0})
    T.check("soak_still_answers", st == 200 and again["choices"][0]["text"] == ref_text, "%r vs %r" % (again, ref_text))
    if "sanitize" in os.environ.get("KN_SANFLAGS", ""):
        # ASan holds freed memory in its quarantine (256 MiB): RSS says nothing there
        T.skip("soak_memory_bounded", "sanitizer build (RSS grew %d KiB)" % (rss_end - rss_warm))
    else:
        # The KV pool is a reserved mapping whose pages are committed as
        # blocks are first written and kept (the prefix cache reuses them),
        # so RSS may grow by up to the pool's size (kiln_kv_bytes); beyond
        # it the bound leaves 64 MiB for glibc's cache of freed thread stacks
        # (one thread per connection) and its per-thread malloc arenas.
        kv_kib = int(m.get("kiln_kv_bytes", 0)) // 1024
        T.check("soak_memory_bounded", rss_end - rss_warm < kv_kib + 64 * 1024,
                "RSS grew %d KiB (KV pool %d KiB)" % (rss_end - rss_warm, kv_kib))
finally:
    rc = srv.stop()
T.check("soak_clean_shutdown", rc == 0, "exit %r" % rc)
T.done()
