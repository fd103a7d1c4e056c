#!/usr/bin/env python3
"""ckpt_ref.py: check that PyTorch's safetensors reads kiln checkpoints, and
write one back for kiln to read (tests/test_ckpt.c, test torch_interop_fixtures).

    make BUILD=build build/tests/test_ckpt
    KN_CKPT_FIXTURE_OUT=tests/fixtures/ckpt_kiln.safetensors build/tests/test_ckpt
    . scripts/torch_env.sh
    python3 scripts/ckpt_ref.py tests/fixtures/ckpt_kiln.safetensors tests/fixtures/ckpt_torch.safetensors

Reads the kiln file with safetensors.torch.load_file, checks every tensor
(name, dtype, shape, values) against the formulas the C test uses, and the
metadata; then writes the transformed tensors (floats 2v+1, ints v+1, u8 v-1,
bool not) plus "torch_only" = [1, 2] with torch's own writer, metadata step+1
and checked_by. Needs torch and safetensors (pip install safetensors).
"""
import sys

import torch
import safetensors
from safetensors import safe_open
from safetensors.torch import load_file, save_file


def expected():
    """The standard tensors of tests/test_ckpt.c (std_tensors)."""
    k = torch.arange(12, dtype=torch.float32)
    return {
        "w": ((k - 5) * 0.25).reshape(3, 4),
        "b": (torch.arange(5, dtype=torch.float32) * 0.5 - 1.0).to(torch.bfloat16),
        "h": (torch.arange(6, dtype=torch.float32) * 0.125).to(torch.float16).reshape(2, 3),
        "d": torch.tensor([0 + 0.1, 1 + 0.1], dtype=torch.float64),
        "i": torch.tensor([-(1 << 40) + j for j in range(3)], dtype=torch.int64),
        "j": torch.tensor([j * 1000 - 1500 for j in range(4)], dtype=torch.int32).reshape(2, 2),
        "u": torch.tensor([250 + j for j in range(4)], dtype=torch.uint8),
        "m": torch.tensor([j % 2 == 0 for j in range(3)], dtype=torch.bool),
        "s": torch.tensor(3.5, dtype=torch.float32),
        "e": torch.zeros(0, 3, dtype=torch.float32),
    }


def transform(t):
    if t.dtype == torch.bool:
        return ~t
    if t.dtype == torch.uint8:
        return t - 1
    if t.is_floating_point():
        return t * 2 + 1
    return t + 1


def main():
    src, dst = sys.argv[1], sys.argv[2]
    got = load_file(src)
    with safe_open(src, framework="pt") as f:
        meta = f.metadata()
    want = expected()
    assert set(got) == set(want), f"names: {sorted(got)} vs {sorted(want)}"
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype, f"{name}: dtype {g.dtype} vs {w.dtype}"
        assert g.shape == w.shape, f"{name}: shape {tuple(g.shape)} vs {tuple(w.shape)}"
        assert torch.equal(g, w), f"{name}: values {g} vs {w}"
    assert meta == {"step": "123", "rng": "0x1234"}, f"metadata {meta}"
    out = {name: transform(t).contiguous() for name, t in got.items()}
    out["torch_only"] = torch.tensor([1.0, 2.0])
    save_file(out, dst, metadata={"step": str(int(meta["step"]) + 1), "rng": meta["rng"],
                                  "checked_by": f"torch {torch.__version__} safetensors {safetensors.__version__}"})
    print(f"{src}: {len(got)} tensors and metadata match; wrote {dst}")


if __name__ == "__main__":
    main()
