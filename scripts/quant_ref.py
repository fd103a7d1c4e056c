#!/usr/bin/env python3
"""quant_ref.py: reference block bytes for kiln's weight quantizers
(src/backends/quant/quantize.c), read by tests/test_quantize.c.

Inputs: a few rows of floats chosen to reach the quantizers' branches
(normal weights, heavy tails, an all-zero block, constant blocks, all-positive
and all-negative blocks, one outlier, values near ggml's 1e-15 group epsilon,
exact ties). References:
  source 0: the `gguf` package's numpy quantizers (gguf.quants.quantize:
            Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; pip install gguf)
  source 1: ggml itself, quantize_row_<type>_ref from the libggml-base.so that
            llama-cpp-python installs (every type, the K types included;
            skipped with a note when llama_cpp is not installed)
File tests/fixtures/quant/quant_ref.bin: "KNQZ", u32 version 1, u32 n_cases;
per case u32 ggml type, u32 source, u32 n floats, n f32, u32 n bytes, bytes.

usage: python3 scripts/quant_ref.py [OUT_FILE]
"""
import ctypes, os, struct, sys
import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]


def inputs():
    r = np.random.default_rng(15)
    rows = [r.normal(0, 0.02, 1024), r.standard_t(2.5, 1024) * 0.05]
    x = r.normal(0, 1, 1024)
    x[0:256] = 0                                  # an all-zero super-block
    x[256:288] = 0.75                             # constant blocks
    x[288:320] = -3.0
    x[320:512] = np.abs(x[320:512]) + 0.5         # all positive (min > 0)
    x[512:768] = -np.abs(x[512:768]) - 0.1        # all negative
    x[800] = 40.0                                 # one outlier
    x[900:1024] = r.normal(0, 1e-16, 124)         # below ggml's GROUP_MAX_EPS
    rows.append(x)
    y = np.round(r.normal(0, 4, 1024)) / 8        # many exact ties on the levels
    rows.append(y)
    return [np.ascontiguousarray(v, dtype=np.float32) for v in rows]


def ggml_lib():
    try:
        import llama_cpp
    except ImportError as e:
        print(f"quant_ref.py: llama_cpp not importable ({e}): no ggml references", file=sys.stderr)
        return None
    d = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
    return ctypes.CDLL(os.path.join(d, "libggml-base.so"))


def ggml_ref(lib, t, x):
    fn = getattr(lib, f"quantize_row_{t.name.lower().replace('_k', '_K')}_ref")
    bs, ts = gguf.GGML_QUANT_SIZES[t]
    out = ctypes.create_string_buffer(len(x) // bs * ts)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn(x.ctypes.data, out, len(x))
    return out.raw


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/quant/quant_ref.bin"
    lib = ggml_lib()
    cases = []
    for x in inputs():
        for t in TYPES:
            if t in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
                cases.append((t, 0, x, gguf.quants.quantize(x.reshape(1, -1), t).tobytes()))
            if lib is not None:
                cases.append((t, 1, x, ggml_ref(lib, t, x)))
    same = sum(1 for a in cases for b in cases if a[1] == 0 and b[1] == 1 and a[0] == b[0] and a[2] is b[2] and a[3] == b[3])
    print(f"{len(cases)} cases; gguf numpy == ggml on {same} of the 32-element ones", file=sys.stderr)
    with open(path, "wb") as f:
        f.write(b"KNQZ" + struct.pack("<II", 1, len(cases)))
        for t, src, x, b in cases:
            f.write(struct.pack("<III", int(t), src, len(x)) + x.tobytes() + struct.pack("<I", len(b)) + b)


if __name__ == "__main__":
    main()
