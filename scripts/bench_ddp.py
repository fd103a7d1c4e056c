#!/usr/bin/env python3
"""bench_ddp.py: data-parallel training throughput, kiln against PyTorch DDP,
in one run on the same GPUs, alternating.

For each round and each world size N in --gpus: PyTorch (torchrun, one
process per GPU: bf16 autocast, torch.compile over the DDP-wrapped model,
flash SDPA, fused AdamW; scripts/bench_ddp_torch.py), then `kiln train gpt2
--gpus N` on the same shape. Both are measured after --warmup steps (kiln's
progress lines give the cumulative rate per step, from which the rate of the
steps after the warm-up follows), tokens over all ranks. Prints medians,
the scaling efficiency tok/s(N) / (N tok/s(1)) and kiln / PyTorch.

    python3 scripts/bench_ddp.py --data input.txt --tokenizer ggml-vocab-gpt-2.gguf [--kiln build-cuda/kiln]
        [--gpus 1,2] [--rounds 2] [--steps 30] [--warmup 5] [--gpt V,T,C,L,H,B]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def sh(cmd):
    p = subprocess.run(cmd, shell=True, capture_output=True, text=True)
    return p.stdout + p.stderr


def kiln_rate(out, items, warmup):
    """Rate of the steps after `warmup` from the cumulative 'step k/N ... R tok/s' lines."""
    pts = {int(k): float(r) for k, r in re.findall(r"^step (\d+)/\d+ loss \S+ lr \S+ (\d+) tok/s", out, re.M)}
    if not pts:
        sys.stdout.write(out[-1500:])
        return float("nan")
    last = max(pts)
    t = lambda k: k * items / pts[k]  # noqa: E731  (seconds of the first k steps)
    return (last - warmup) * items / (t(last) - t(warmup))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kiln", default="build-cuda/kiln")
    ap.add_argument("--data", required=True)
    ap.add_argument("--tokenizer", required=True)
    ap.add_argument("--gpus", default="1,2")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--gpt", default="50257,1024,768,12,12,8", help="V,T,C,L,H,B (B per GPU)")
    a = ap.parse_args()
    v, t, c, n_layers, h, b = (int(x) for x in a.gpt.split(","))
    ns = [int(x) for x in a.gpus.split(",")]
    res = {("torch", n): [] for n in ns} | {("kiln", n): [] for n in ns}
    for r in range(a.rounds):
        for n in ns:
            out = sh(f"torchrun --nproc_per_node {n} --master_port {29700 + n} {HERE}/bench_ddp_torch.py --gpt {a.gpt} "
                     f"--steps {a.steps - a.warmup} --warmup {a.warmup}")
            m = re.search(r"^torch-ddp \d+ (\d+) tok/s", out, re.M)
            res[("torch", n)].append(float(m.group(1)) if m else float("nan"))
            if not m:
                sys.stdout.write(out[-1500:])
            out = sh(f"KN_BACKEND=cuda {a.kiln} train gpt2 --data {a.data} --tokenizer {a.tokenizer} --layers {n_layers} "
                     f"--dim {c} --heads {h} --ctx {t} --batch {b} --steps {a.steps} --eval-every 0 --eval-batches 1 "
                     f"--sample-len 0 --warmup 2 --clip 0 --precision bf16 --log-every 1 --gpus {n}")
            res[("kiln", n)].append(kiln_rate(out, b * t * n, a.warmup))
            print(f"round {r + 1} N={n}: torch {res[('torch', n)][-1]:,.0f}  kiln {res[('kiln', n)][-1]:,.0f} tok/s", flush=True)
    med = {k: statistics.median(x) for k, x in res.items()}
    print("\n| GPUs | kiln tok/s | kiln scaling | PyTorch DDP tok/s | PyTorch scaling | kiln / PyTorch |")
    print("|---|---|---|---|---|---|")
    for n in ns:
        ks = med[("kiln", n)] / (n * med[("kiln", ns[0])] / ns[0])
        ts = med[("torch", n)] / (n * med[("torch", ns[0])] / ns[0])
        print(f"| {n} | {med[('kiln', n)]:,.0f} | {ks:.2f} | {med[('torch', n)]:,.0f} | {ts:.2f} | "
              f"{med[('kiln', n)] / med[('torch', n)]:.2f} |")


if __name__ == "__main__":
    main()
