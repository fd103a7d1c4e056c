#!/usr/bin/env python3
"""bench_train_gpu_torch.py: the GPU training peer for `kiln train gpt2` on a GPU.

The GPT-2 model of scripts/bench_train_torch.py (LayerNorm, fused qkv, causal
SDPA, gelu-tanh MLP, learned positions, tied head) on the GPU, trained with
AdamW on random tokens (values do not change the speed), timed in the modes
a user would pick: f32 eager, and PyTorch at its best (bf16 autocast,
torch.compile, flash SDPA, fused AdamW). Prints "torch <mode> <tok/s>" per
mode; --kiln CMD (a shell command running `kiln train`) runs between the
torch modes, so both see the same GPU state in the same run.

    python3 scripts/bench_train_gpu_torch.py [--gpt V,T,C,L,H,B] [--steps 20] [--warmup 5]
        [--modes f32-eager,bf16-compiled] [--rounds 1] [--kiln CMD] [--profile N]

--profile N: after the timed rounds of each mode, N more steps under
torch.profiler, and the kernels that took the most GPU time (where the
peer's step goes, beside kiln's KN_PROFILE=shapes).
"""
import argparse
import os
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train_torch import GPT as _GPT  # noqa: E402  (the same model as the CPU bench)


class GPT(_GPT):
    """positions on the tokens' device (the CPU bench makes them on the host)"""

    def forward(self, ids):
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[1], device=ids.device))
        for b in self.h:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


def make(mode, v, t, c, n_layers, h, b, steps, warmup):
    """Builds (and warms: compiles) the model of mode; returns a function
    that times `steps` steps and returns tok/s."""
    torch.manual_seed(0)
    model = GPT(v, t, c, n_layers, h).cuda()
    best = mode == "bf16-compiled"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=best)
    fwd = torch.compile(model) if best else model
    ids = torch.randint(0, v, (b, t + 1), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=best):
            logits = fwd(ids[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, v), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(warmup):
        step()

    def timed():
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        return b * t * steps / (time.perf_counter() - t0)

    def profile(n, top=40):
        from torch.profiler import ProfilerActivity, profile as tprof
        with tprof(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n):
                step()
            torch.cuda.synchronize()
        ev = [e for e in prof.key_averages() if e.device_time_total > 0]
        total = sum(e.device_time_total for e in ev)
        print(f"# profile: {n} steps, {total / n / 1e3:.2f} ms of kernels a step; per step:")
        for e in sorted(ev, key=lambda e: -e.device_time_total)[:top]:
            print(f"  {e.device_time_total / n / 1e3:8.3f} ms {e.count // n:5d}x  {e.key[:110]}")

    timed.profile = profile
    return timed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpt", default="50257,1024,768,12,12,8", help="V,T,C,L,H,B")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--modes", default="f32-eager,bf16-compiled")
    ap.add_argument("--rounds", type=int, default=1, help="timed rounds per mode, kiln after each")
    ap.add_argument("--kiln", action="append", default=[])
    ap.add_argument("--profile", type=int, default=0, help="steps to profile after timing (0: none)")
    a = ap.parse_args()
    v, t, c, n_layers, h, b = (int(x) for x in a.gpt.split(","))
    print(f"# torch {torch.__version__}, {torch.cuda.get_device_name()}, GPT V={v} T={t} C={c} L={n_layers} H={h} B={b}")
    for mode in a.modes.split(","):
        timed = make(mode, v, t, c, n_layers, h, b, a.steps, a.warmup)
        for _ in range(a.rounds):
            print(f"torch {mode} {timed():.0f} tok/s", flush=True)
            for cmd in a.kiln:
                out = subprocess.run(cmd, shell=True, capture_output=True, text=True)
                lines = [ln for ln in (out.stdout + out.stderr).splitlines() if "tok/s" in ln or "error" in ln.lower()]
                print(f"kiln: {lines[-1] if lines else '(no rate line) ' + out.stderr[-300:]}   ({cmd})", flush=True)
        if a.profile:
            timed.profile(a.profile)
        del timed
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
