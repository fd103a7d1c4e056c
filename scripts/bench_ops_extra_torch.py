#!/usr/bin/env python3
"""bench_ops_extra_torch.py: the cases of bench/bench_ops_extra.c in PyTorch
on the CPU (float32, median of RUNS after a warm-up; torch threads = the
KN_THREADS value or 2). usage: python3 scripts/bench_ops_extra_torch.py [RUNS]"""
import os, sys, time
import torch
import torch.nn.functional as F

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 9
torch.set_num_threads(int(os.environ.get("KN_THREADS", "2")))
torch.manual_seed(0)


def med(fn):
    fn()
    t = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        t.append((time.perf_counter() - t0) * 1e3)
    return sorted(t)[runs // 2]


x = (torch.rand(2, 16, 16, 32, 32) * 2 - 1).requires_grad_(True)
w = (torch.rand(32, 16, 3, 3, 3) * 2 - 1).requires_grad_(True)
with torch.no_grad():
    print(f"conv3d fwd [2,16,16,32,32] * [32,16,3,3,3] p1: {med(lambda: F.conv3d(x, w, padding=1)):.2f} ms")


def fb():
    y = F.conv3d(x, w, padding=1)
    torch.autograd.grad(y.sum(), (x, w))


print(f"conv3d fwd+bwd (dx, dw): {med(fb):.2f} ms")
s = torch.rand(256, 4096) * 2 - 1
print(f"sort [256,4096] dim -1: {med(lambda: torch.sort(s, dim=-1, stable=True)):.2f} ms")
im = torch.rand(8, 32, 64, 64) * 2 - 1
print(f"bilinear [8,32,64,64] -> 128x128: {med(lambda: F.interpolate(im, size=(128, 128), mode='bilinear')):.2f} ms")
