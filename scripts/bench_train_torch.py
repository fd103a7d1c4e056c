#!/usr/bin/env python3
"""bench_train_torch.py: the PyTorch CPU side of bench/bench_train.c.

Times the same training steps as the C bench (same model, batch, AdamW,
thread count) and prints one line per case: "<case> <items per second>".
Cases:
  mlp  784-512-256-10 ReLU MLP, cross-entropy, batch B         (samples/s)
  gpt  GPT-2 block stack (LayerNorm, fused qkv, causal SDPA, gelu-tanh MLP 4C,
       learned positions, tied lm_head), batch B x T             (tokens/s)

PyTorch at its best on the CPU (issue 17): AdamW with fused=True (its
fastest CPU implementation; foreach=False, the slowest, halves the MLP's
speed), and with --compile also torch.compile(model) (inductor); each case
then prints the eager and the compiled rate and the best of the two last:
"<case> <best>  eager <e> compiled <c>".

Usage: python3 scripts/bench_train_torch.py --threads N [--mlp-batch 128]
       [--gpt V,T,C,L,H,B] [--steps 20] [--warmup 3] [--compile]
Needs `. scripts/torch_env.sh` with the PyPI CUDA wheel on a CPU-only machine.
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, h):
        super().__init__()
        self.h = h
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.h, c // self.h).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, v, t, c, n_layers, h):
        super().__init__()
        self.wte = nn.Embedding(v, c)
        self.wpe = nn.Embedding(t, c)
        self.h = nn.ModuleList(Block(c, h) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(c)

    def forward(self, ids):
        t = ids.shape[1]
        x = self.wte(ids) + self.wpe(torch.arange(t))
        for b in self.h:
            x = b(x)
        return self.ln_f(x) @ self.wte.weight.t()


def timed(step, steps, warmup):
    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--mlp-batch", type=int, default=128)
    ap.add_argument("--gpt", default="256,64,128,4,4,8", help="V,T,C,L,H,B")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="also time torch.compile(model)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)

    def run(case, make, n_items, steps):
        """time `case` eager and (with --compile) compiled; print the best"""
        rates = {}
        for mode in ("eager", "compiled") if a.compile else ("eager",):
            torch.manual_seed(0)
            model, loss_fn = make()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01 if case == "gpt" else 0.0,
                                    fused=True)
            fwd = torch.compile(model) if mode == "compiled" else model

            def step():
                opt.zero_grad(set_to_none=True)
                loss_fn(fwd).backward()
                opt.step()

            dt = timed(step, steps, a.warmup)
            assert math.isfinite(dt)
            rates[mode] = n_items * steps / dt
        detail = "  ".join(f"{k} {v:.1f}" for k, v in rates.items())
        print(f"{case} {max(rates.values()):.1f}  {detail}", flush=True)

    B = a.mlp_batch
    x = torch.rand(B, 784)
    y = torch.randint(0, 10, (B,))

    def make_mlp():
        mlp = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 256), nn.ReLU(), nn.Linear(256, 10))
        return mlp, lambda f: F.cross_entropy(f(x), y)

    run("mlp", make_mlp, B, a.steps)

    V, T, C, L, H, GB = (int(s) for s in a.gpt.split(","))
    ids = torch.randint(0, V, (GB, T))
    tg = torch.randint(0, V, (GB, T))

    def make_gpt():
        return GPT(V, T, C, L, H), lambda f: F.cross_entropy(f(ids).view(-1, V), tg.view(-1))

    run("gpt", make_gpt, GB * T, max(1, a.steps // 2))


if __name__ == "__main__":
    main()
