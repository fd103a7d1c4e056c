#!/usr/bin/env python3
"""ops_extra_ref.py: PyTorch references for sort, einsum, interpolate,
unfold/fold and conv3d (issue 15), written to tests/fixtures/ops_extra.bin
in the KNFX format of tests/torch_refs.py (read by tests/kn_fixture.h).

Each case is named "<case>." + "in.X" (inputs), "out" (the op's result, and
"idx" for sort's indices), "w" (a random weight for the loss sum(out * w))
and "grad.X" (that loss's gradient). Inputs are float32 values; the
computation runs in float32 (the dtype kiln's f32 path must match, with its
own rounding) and, for the gradient, in float64 on the same values.
tests/test_ops_extra.c rebuilds every case on the ref and cpu backends.

usage: . scripts/torch_env.sh; python3 scripts/ops_extra_ref.py [OUT]
"""
import os, struct, sys
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from torch_refs import write_fixture  # noqa: E402

torch.manual_seed(15)
T = []


def rnd(*shape, ints=False):
    """float32 values (torch_refs sets the default dtype to float64)"""
    if ints:   # ties for the stable sort
        return torch.randint(-3, 4, shape).float()
    return torch.rand(*shape, dtype=torch.float32) * 2 - 1


def case(name, fn, ins, grad=True):
    """fn(*tensors) -> output; inputs are float32 tensors."""
    for k, v in ins.items():
        T.append((f"{name}.in.{k}", v.float()))
    out = fn(*[v.float() for v in ins.values()])
    if isinstance(out, tuple):
        out, idx = out
        T.append((f"{name}.idx", idx.long()))
    T.append((f"{name}.out", out.float()))
    if not grad:
        return
    xs = [v.double().requires_grad_(True) for v in ins.values()]
    y = fn(*xs)
    if isinstance(y, tuple):
        y = y[0]
    w = torch.rand(y.shape, dtype=torch.float64) * 2 - 1
    T.append((f"{name}.w", w))
    (y * w).sum().backward()
    for k, x in zip(ins.keys(), xs):
        T.append((f"{name}.grad.{k}", x.grad))


# sort: stable, with ties and a NaN-free tensor (NaN is checked in C)
case("sort0", lambda x: torch.sort(x, dim=1, stable=True), {"x": rnd(3, 17, 2, ints=True)})
case("sort1", lambda x: torch.sort(x, dim=-1, descending=True, stable=True), {"x": rnd(4, 9, ints=True)})
case("sort2", lambda x: torch.sort(x, dim=0, descending=True, stable=True), {"x": rnd(33, 3)})

# einsum
case("ein0", lambda a, b: torch.einsum("bij,bjk->bik", a, b), {"a": rnd(2, 3, 4), "b": rnd(2, 4, 5)})
case("ein1", lambda a: torch.einsum("ii->i", a), {"a": rnd(4, 4)})
case("ein2", lambda a: torch.einsum("ii", a), {"a": rnd(5, 5)})
case("ein3", lambda a, b: torch.einsum("...ij,...jk->...ik", a, b), {"a": rnd(2, 1, 3, 4), "b": rnd(3, 4, 2)})
case("ein4", lambda a, b, c: torch.einsum("ab,bc,cd->ad", a, b, c), {"a": rnd(2, 3), "b": rnd(3, 4), "c": rnd(4, 2)})
case("ein5", lambda a, b: torch.einsum("i,j->ij", a, b), {"a": rnd(3), "b": rnd(4)})
case("ein6", lambda a, b: torch.einsum("bhqd,bhkd->bhqk", a, b), {"a": rnd(2, 2, 3, 4), "b": rnd(2, 2, 5, 4)})
case("ein7", lambda a: torch.einsum("ijk->kji", a), {"a": rnd(2, 3, 4)})
case("ein8", lambda a, b: torch.einsum("ij,ij->", a, b), {"a": rnd(3, 4), "b": rnd(3, 4)})
case("ein9", lambda a, b: torch.einsum("Ba,ab", a, b), {"a": rnd(2, 3), "b": rnd(3, 4)})
case("ein10", lambda a, b: torch.einsum("iij,jk->ik", a, b), {"a": rnd(3, 3, 2), "b": rnd(2, 4)})
case("ein11", lambda a, b: torch.einsum("ij,jk->ik", a, b), {"a": rnd(3, 1), "b": rnd(4, 5)})
case("ein12", lambda a: torch.einsum("...i->i", a), {"a": rnd(2, 3, 4)})

# interpolate: nearest and (bi)linear, size and scale, align_corners both ways
case("int0", lambda x: F.interpolate(x, size=(5, 7), mode="nearest"), {"x": rnd(2, 3, 4, 3)})
case("int1", lambda x: F.interpolate(x, scale_factor=(1.7, 0.6), mode="nearest"), {"x": rnd(1, 2, 5, 6)})
case("int2", lambda x: F.interpolate(x, size=(7, 5), mode="bilinear", align_corners=False), {"x": rnd(2, 2, 4, 3)})
case("int3", lambda x: F.interpolate(x, size=(7, 5), mode="bilinear", align_corners=True), {"x": rnd(2, 2, 4, 3)})
case("int4", lambda x: F.interpolate(x, scale_factor=(2.5, 0.5), mode="bilinear", align_corners=False), {"x": rnd(1, 3, 3, 8)})
case("int5", lambda x: F.interpolate(x, size=(3, 2), mode="bilinear", align_corners=False), {"x": rnd(1, 2, 6, 5)})
case("int6", lambda x: F.interpolate(x, size=9, mode="linear", align_corners=False), {"x": rnd(2, 3, 4)})
case("int7", lambda x: F.interpolate(x, size=(3, 4, 5), mode="trilinear", align_corners=True), {"x": rnd(1, 2, 2, 3, 3)})
case("int8", lambda x: F.interpolate(x, size=(3, 4, 2), mode="nearest"), {"x": rnd(1, 2, 2, 3, 3)})

# unfold / fold
case("unf0", lambda x: F.unfold(x, (2, 3), dilation=(1, 2), padding=(1, 0), stride=(2, 1)), {"x": rnd(2, 3, 5, 7)})
case("unf1", lambda x: F.unfold(x, 3, padding=1), {"x": rnd(1, 2, 4, 4)})
case("fold0", lambda x: F.fold(x, (5, 7), (2, 3), dilation=(1, 2), padding=(1, 0), stride=(2, 1)), {"x": rnd(2, 18, 9)})
case("fold1", lambda x: F.fold(x, (4, 5), 2, stride=1), {"x": rnd(1, 8, 12)})

# conv3d
case("c3d0", lambda x, w, b: F.conv3d(x, w, b, stride=(1, 2, 1), padding=(1, 0, 1), dilation=(2, 1, 1)),
     {"x": rnd(2, 3, 5, 6, 4), "w": rnd(4, 3, 2, 3, 2), "b": rnd(4)})
case("c3d1", lambda x, w: F.conv3d(x, w, None, stride=2, padding=1, groups=2),
     {"x": rnd(1, 4, 5, 5, 5), "w": rnd(6, 2, 3, 3, 3)})

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures")
    write_fixture(os.path.join(out, "ops_extra.bin"), T)
