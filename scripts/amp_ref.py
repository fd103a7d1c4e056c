#!/usr/bin/env python3
"""amp_ref.py: PyTorch bf16-autocast reference for tests/test_precision.c.

Writes tests/fixtures/amp_mlp.bin (regenerate with
`. scripts/torch_env.sh; python3 scripts/amp_ref.py`): a bias-free MLP
16 -> 64 -> 64 -> 4 with ReLU, trained with plain SGD on one fixed batch,
once in float32 and once under torch.autocast("cpu", torch.bfloat16) from
the same initial weights. The master weights and their gradients stay f32 in
both runs, as in kiln's policy.

Why bias-free ReLU layers: under autocast torch adds a Linear's bias inside
the bf16 matmul and runs the activation on the bf16 output, where kiln adds
the bias and applies the activation in f32 after casting the product back.
ReLU of a bf16 value is exact, so without biases the two forward passes
round at the same places and the loss sequences must agree closely; the gap
to the f32 run is the signal that bf16 was used at all.

Format "KNFX" v1 (tests/kn_fixture.h): u32 count, then per tensor u32 name
length, name, u32 dtype (1 f32, 2 i64), u32 ndim, i64 shape[ndim], data.
"""
import struct
import sys

import torch
import torch.nn.functional as F

STEPS, LR = 30, 0.2
B, IN, H, OUT = 32, 16, 64, 4


def save(path, recs):
    with open(path, "wb") as f:
        f.write(b"KNFX")
        f.write(struct.pack("<II", 1, len(recs)))
        for name, t in recs:
            t = t.detach().contiguous()
            code = {torch.float32: 1, torch.int64: 2}[t.dtype]
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)) + nb)
            f.write(struct.pack("<II", code, t.dim()))
            f.write(struct.pack("<%dq" % t.dim(), *t.shape))
            f.write(t.numpy().tobytes())


def run(ws, x, y, bf16):
    ws = [w.clone().requires_grad_(True) for w in ws]
    opt = torch.optim.SGD(ws, lr=LR, foreach=False)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            h = F.relu(F.linear(x, ws[0]))
            h = F.relu(F.linear(h, ws[1]))
            logits = F.linear(h, ws[2])
            loss = F.cross_entropy(logits, y)          # autocast runs it in f32
        assert loss.dtype == torch.float32 and (logits.dtype == torch.bfloat16) == bf16
        loss.backward()
        assert all(w.grad.dtype == torch.float32 for w in ws)
        opt.step()
        losses.append(loss.item())
    return torch.tensor(losses, dtype=torch.float32)


def main():
    torch.manual_seed(0)
    x = torch.randn(B, IN)
    y = torch.randint(0, OUT, (B,))
    ws = [torch.randn(H, IN) / IN ** 0.5, torch.randn(H, H) / H ** 0.5, torch.randn(OUT, H) / H ** 0.5]
    lf, lb = run(ws, x, y, False), run(ws, x, y, True)
    print("f32 ", " ".join("%.4f" % v for v in lf[::5]))
    print("bf16", " ".join("%.4f" % v for v in lb[::5]))
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/amp_mlp.bin"
    save(out, [("in.x", x), ("in.y", y), ("w0", ws[0]), ("w1", ws[1]), ("w2", ws[2]),
               ("loss.f32", lf), ("loss.bf16", lb), ("cfg.lr", torch.tensor([LR]))])


if __name__ == "__main__":
    main()
