#!/usr/bin/env python3
"""ce_ref.py: PyTorch references for the fused cross-entropy (tests/test_ce.c).

Writes tests/fixtures/ce_torch.bin (regenerate with `python3 scripts/ce_ref.py`):
for each case, the logits [N, C] (f32; the bf16 case holds values that are
exact in bf16), the targets (as f32, -100 or the case's ignore_index marks
ignored rows), F.cross_entropy's mean loss, per-row losses (reduction
'none') and the gradient of the mean loss w.r.t. the logits (f32 math).

Format (as scripts/nn_ref.py): magic b"KNNN", u32 version 1, u32 record
count, then records: u32 name length, name bytes, u32 ndim, i64 shape[ndim],
f32 data (row-major). Case k's records are "ce.k.cfg" = [N, C, ignore_index,
label_smoothing, is_bf16], "ce.k.logits", "ce.k.targets", "ce.k.mean",
"ce.k.none", "ce.k.grad"; "ce.count" holds the number of cases.
"""
import struct
import sys

import torch
import torch.nn.functional as F

# (N, C, ignore_index, label_smoothing, bf16, scale of the logits)
CASES = [
    (13, 7, -100, 0.0, False, 3.0),
    (9, 11, 2, 0.1, False, 2.0),       # ignore_index inside [0, C): rows with target 2 are ignored
    (5, 37, -100, 0.0, True, 4.0),     # bf16 logits (kiln reads them as bf16, torch computes in f32)
    (3, 1001, -100, 0.05, False, 8.0), # wide rows, large logits
]


def main(path):
    g = torch.Generator().manual_seed(1234)
    recs = []

    def add(name, t):
        t = torch.as_tensor(t).detach().to(torch.float32).contiguous()
        if t.dim() == 0:
            t = t.reshape(1)
        recs.append((name, t))

    add("ce.count", [len(CASES)])
    for k, (N, C, ign, ls, bf16, scale) in enumerate(CASES):
        x = (torch.rand(N, C, generator=g) * 2 - 1) * scale
        if bf16:
            x = x.to(torch.bfloat16).to(torch.float32)
        t = torch.randint(0, C, (N,), generator=g)
        t[1] = ign                      # one ignored row at least
        if N > 4:
            t[N - 2] = ign
        x.requires_grad_(True)
        mean = F.cross_entropy(x, t, ignore_index=ign, label_smoothing=ls)
        (grad,) = torch.autograd.grad(mean, x)
        none = F.cross_entropy(x, t, ignore_index=ign, label_smoothing=ls, reduction="none")
        add(f"ce.{k}.cfg", [N, C, ign, ls, 1.0 if bf16 else 0.0])
        add(f"ce.{k}.logits", x)
        add(f"ce.{k}.targets", t.to(torch.float32))
        add(f"ce.{k}.mean", mean)
        add(f"ce.{k}.none", none)
        add(f"ce.{k}.grad", grad)

    with open(path, "wb") as f:
        f.write(b"KNNN")
        f.write(struct.pack("<II", 1, len(recs)))
        for name, t in recs:
            nb = name.encode()
            f.write(struct.pack("<I", len(nb)))
            f.write(nb)
            f.write(struct.pack("<I", t.dim()))
            f.write(struct.pack("<%dq" % t.dim(), *t.shape))
            f.write(t.numpy().astype("<f4").tobytes())
    print(f"wrote {path}: {len(recs)} records", file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/ce_torch.bin")
