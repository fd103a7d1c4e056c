"""common.py: what the `kiln serve` script tests share: finding a model,
starting the server on a free loopback port, small HTTP helpers (stdlib
only: http.client), and the ok/FAIL/skip lines that tests/run.sh adds up."""
import http.client
import json
import os
import re
import subprocess
import sys
import time

BUILD = os.environ.get("BUILD", "build")
KILN = os.path.join(BUILD, "kiln")
# KN_SERVE_ARGS="--backend cuda --gpu-dtype f32": options for every server
# (and for the kiln generate that e2e.py compares with), e.g. to run them
# on the GPU (scripts/cuda_test.sh)
BACKEND_ARGS = os.environ.get("KN_SERVE_ARGS", "").split()


class Tally:
    def __init__(self):
        self.p = self.f = self.s = 0

    def ok(self, name):
        self.p += 1
        print("ok   " + name, flush=True)

    def bad(self, name, why):
        self.f += 1
        print("FAIL %s: %s" % (name, why), flush=True)

    def skip(self, name, why):
        self.s += 1
        print("skip %s: %s" % (name, why), flush=True)

    def check(self, name, cond, why=""):
        if cond:
            self.ok(name)
        else:
            self.bad(name, why)
        return cond

    def done(self):
        print("# totals: %d %d %d" % (self.p, self.f, self.s), flush=True)
        sys.exit(1 if self.f else 0)


def find_model():
    """(path, extra args, why-not): SmolLM2 from models/ (or $KN_SMOLLM2),
    else the tiny random Llama of the assets with the plain chat template."""
    p = os.environ.get("KN_SMOLLM2", "models/SmolLM2-135M-Instruct.Q4_1.gguf")
    if os.path.isfile(p):
        return p, [], None
    assets = os.environ.get("KN_ASSETS") or "../shared/assets"
    t = os.path.join(assets, "gguf/llama-2-tiny-random.gguf")
    if os.path.isfile(t):
        return t, ["--chat-template", "plain"], None
    return None, [], "no model: models/SmolLM2-135M-Instruct.Q4_1.gguf (sh scripts/fetch_model.sh) and " \
                     "$KN_ASSETS/gguf/llama-2-tiny-random.gguf are missing"


class Server:
    """kiln serve on 127.0.0.1 with --port 0; the port is read from its
    first stderr line. Stopped with SIGTERM (then SIGKILL) by stop()."""

    def __init__(self, model, args=(), log=None):
        Server.count = getattr(Server, "count", 0) + 1
        self.log = log or os.path.join(BUILD, "tests", "serve_%d_%d.log" % (os.getpid(), Server.count))
        os.makedirs(os.path.dirname(self.log), exist_ok=True)
        self.logf = open(self.log, "w")
        cmd = [KILN, "serve", "-m", model, "--host", "127.0.0.1", "--port", "0"] + BACKEND_ARGS + list(args)
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.port = None
        deadline = time.time() + 120
        lines = []
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            self.logf.write(line)
            m = re.search(r"listening on http://127\.0\.0\.1:(\d+)/", line)
            if m:
                self.port = int(m.group(1))
                break
        if self.port is None:
            self.stop()
            raise RuntimeError("kiln serve did not start: " + "".join(lines[-5:]))
        # keep draining stderr into the log so the server never blocks on it
        import threading
        threading.Thread(target=self._drain, daemon=True).start()

    def _drain(self):
        for line in self.proc.stderr:
            self.logf.write(line)
            self.logf.flush()

    def conn(self, timeout=120):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, headers dict, body bytes)"""
        c = self.conn(timeout)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        return r.status, dict(r.getheaders()), data

    def post(self, path, body, headers=None, timeout=120):
        st, _h, data = self.request("POST", path, body, headers, timeout)
        try:
            return st, json.loads(data)
        except ValueError:
            return st, {"raw": data.decode("utf-8", "replace")}

    def stream(self, path, body, headers=None, timeout=120):
        """(status, [event dicts], saw [DONE])"""
        c = self.conn(timeout)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request("POST", path, body=json.dumps(body), headers=h)
        r = c.getresponse()
        if r.status != 200:
            data = r.read()
            c.close()
            return r.status, [json.loads(data)], False
        events, done = [], False
        for ev in read_sse(r):
            if ev == "[DONE]":
                done = True
            else:
                events.append(json.loads(ev))
        c.close()
        return 200, events, done

    def metrics(self, headers=None):
        st, _h, data = self.request("GET", "/metrics", headers=headers)
        out = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def rss_kib(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.logf.close()
        return self.proc.returncode


def read_sse(resp):
    """yields the data of each server-sent event"""
    buf = b""
    while True:
        chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(1)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if ev.startswith(b"data: "):
                yield ev[6:].decode()


def stream_text(events):
    """the text of a completions or chat stream"""
    out = []
    for e in events:
        for ch in e.get("choices", []):
            if "delta" in ch:
                out.append(ch["delta"].get("content") or "")
            else:
                out.append(ch.get("text") or "")
    return "".join(out)
