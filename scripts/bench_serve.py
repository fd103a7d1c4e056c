#!/usr/bin/env python3
"""bench_serve.py: load test of `kiln serve` (and, when installed, of
llama.cpp's server through llama-cpp-python as the peer) on loopback.

For each server and each client count (default 1, 4, 16), every client
sends --requests streamed completions one after another with the same
prompt, temperature and seed per request index, max_tokens --max-tokens,
and the end-of-text tokens banned through logit_bias (--ban, SmolLM2's ids
by default) so that every request generates exactly max_tokens tokens.
Printed per row: aggregate generated tokens/s (all clients' tokens over the
wall time), time to first token p50/p99, inter-token latency p50/p99 (gaps
between streamed chunks), and the server's peak resident memory (VmHWM).
Bounded: at most clients x requests requests per row; stdlib only.

  python3 scripts/bench_serve.py -m models/SmolLM2-135M-Instruct.Q4_1.gguf -t 2
  python3 scripts/bench_serve.py ... --no-peer --clients 1,4
"""
import argparse
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

PROMPT = ("Once upon a time, in a small village by the sea, there lived an old fisherman who told stories to "
          "the children every evening. One day he began a new story:")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def pct(xs, q):
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def wait_up(port, proc, path, timeout=300):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError("the server exited (%d)" % proc.returncode)
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            if r.status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the server did not come up")


BAN = {}


def one(port, i, max_tokens, out):
    """a streamed completion: (ttft, [gaps], tokens)"""
    body = json.dumps({"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.8, "seed": 1000 + i,
                       "stream": True, "logit_bias": BAN})
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    t0 = time.time()
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError("HTTP %d: %s" % (r.status, r.read()[:200]))
    last, ttft, gaps, n, buf = None, None, [], 0, b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf = (buf + chunk).replace(b"\r\n", b"\n")   # sse-starlette (the peer) ends lines with CRLF
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: ") or ev[6:] == b"[DONE]":
                continue
            js = json.loads(ev[6:])
            ch = js.get("choices") or []
            if not ch or not ch[0].get("text"):
                continue
            now = time.time()
            if ttft is None:
                ttft = now - t0
            else:
                gaps.append(now - last)
            last = now
            n += 1
    c.close()
    out.append((ttft if ttft is not None else time.time() - t0, gaps, n))


def run_row(port, clients, requests, max_tokens):
    results, errors = [], []

    def client(k):
        for j in range(requests):
            try:
                one(port, k * requests + j, max_tokens, results)
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))
    t0 = time.time()
    th = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.time() - t0
    toks = sum(r[2] for r in results)
    gaps = [g for r in results for g in r[1]]
    ttfts = [r[0] for r in results]
    return {"clients": clients, "requests": len(results), "errors": len(errors), "tokens": toks, "wall_s": wall,
            "tok_s": toks / wall if wall > 0 else 0, "ttft_p50": pct(ttfts, 50), "ttft_p99": pct(ttfts, 99),
            "itl_p50": pct(gaps, 50), "itl_p99": pct(gaps, 99)}


def peak_rss_mib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


def bench(name, cmd, port, health, args):
    print("# %s: %s" % (name, " ".join(cmd)), flush=True)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_up(port, proc, health)
        idle = peak_rss_mib(proc.pid)
        one(port, 0, 8, [])            # warm up (kernels compiled, caches touched)
        for c in args.clients:
            r = run_row(port, c, args.requests, args.max_tokens)
            r["server"] = name
            r["peak_rss_mib"] = peak_rss_mib(proc.pid)
            r["idle_rss_mib"] = idle
            rows.append(r)
            print("| %s | %d | %d | %d | %.1f | %.0f / %.0f | %.0f / %.0f | %.0f |" % (
                name, c, r["requests"], r["tokens"], r["tok_s"], 1000 * r["ttft_p50"], 1000 * r["ttft_p99"],
                1000 * r["itl_p50"], 1000 * r["itl_p99"], r["peak_rss_mib"]) +
                (" %d errors" % r["errors"] if r["errors"] else ""), flush=True)
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--requests", type=int, default=2, help="requests per client per row")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--kiln", default="build/kiln")
    ap.add_argument("--backend", default="cpu")
    ap.add_argument("--no-peer", action="store_true")
    ap.add_argument("--ban", default="0,1,2", help="token ids banned (logit_bias -100): the end-of-text tokens")
    ap.add_argument("--json", help="write the rows here too")
    args = ap.parse_args()
    BAN.update({i: -100 for i in args.ban.split(",") if i})
    args.clients = [int(x) for x in args.clients.split(",")]
    par = max(args.clients)
    print("| server | clients | requests | tokens | tokens/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | peak RSS MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    port = free_port()
    rows = bench("kiln serve", [args.kiln, "serve", "-m", args.model, "--port", str(port), "--parallel", str(par),
                                "--ctx", str(par * 256), "-t", str(args.threads), "--backend", args.backend],
                 port, "/health", args)
    if not args.no_peer:
        try:
            import llama_cpp  # noqa: F401
            import llama_cpp.server  # noqa: F401
            port = free_port()
            rows += bench("llama-cpp-python %s" % llama_cpp.__version__,
                          [sys.executable, "-m", "llama_cpp.server", "--model", args.model, "--host", "127.0.0.1", "--port", str(port),
                           "--n_threads", str(args.threads), "--n_ctx", "2048", "--verbose", "False",
                           # queue concurrent requests (its default lets a new request cut off the running one)
                           "--interrupt_requests", "False"],
                          port, "/v1/models", args)
        except ImportError as e:
            print("# peer skipped: llama-cpp-python[server] is not installed (%s)" % e)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
