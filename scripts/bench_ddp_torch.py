#!/usr/bin/env python3
"""bench_ddp_torch.py: the data-parallel peer of `kiln train gpt2 --gpus N`.

The GPT-2 model of scripts/bench_train_gpu_torch.py, trained with PyTorch at
its best on each GPU (bf16 autocast, torch.compile over the DDP-wrapped
model, flash SDPA, fused AdamW) under DistributedDataParallel, one process
per GPU started by torchrun; random tokens (values do not change the speed).
Rank 0 prints "torch-ddp N <tok/s>" with tok/s over all ranks (B x T x N a
step).

    torchrun --nproc_per_node N scripts/bench_ddp_torch.py [--gpt V,T,C,L,H,B] [--steps 15] [--warmup 5]
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train_gpu_torch import GPT  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpt", default="50257,1024,768,12,12,8", help="V,T,C,L,H,B (B per GPU)")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=5)
    a = ap.parse_args()
    v, t, c, n_layers, h, b = (int(x) for x in a.gpt.split(","))
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    torch.manual_seed(0)
    model = DDP(GPT(v, t, c, n_layers, h).cuda())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model)
    ids = torch.randint(0, v, (b, t + 1), device="cuda", generator=None)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = fwd(ids[:, :-1])
            loss = F.cross_entropy(logits.float().view(-1, v), ids[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    dist.barrier()
    rate = b * t * world * a.steps / (time.perf_counter() - t0)
    if rank == 0:
        print(f"torch-ddp {world} {rate:.0f} tok/s", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
