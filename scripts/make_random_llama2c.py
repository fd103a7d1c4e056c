#!/usr/bin/env python3
"""Write a llama2.c checkpoint (legacy "version 0" layout, f32) with random
weights, for decode benchmarks of kiln against llama2.c's `run`/`runomp`
(issue 17). Values do not change speed; shapes do.

    python3 scripts/make_random_llama2c.py OUT.bin [--shape stories15M]

Layout (llama2.c run.c / kiln's src/formats/llama2c.h): a header of seven
int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
a positive vocab_size means the classifier shares the embedding), then f32
arrays in this order: token_embedding [V, D], rms_att [L, D], wq [L, D, D],
wk [L, KV, D], wv [L, KV, D], wo [L, D, D], rms_ffn [L, D], w1 [L, H, D],
w2 [L, D, H], w3 [L, H, D], rms_final [D], freq_cis_real and freq_cis_imag
[seq_len, head_size / 2] (unused by today's readers; written as RoPE tables).
"""
import argparse
import struct
import sys

import numpy as np

SHAPES = {
    # name: dim, hidden, layers, heads, kv_heads, vocab, seq_len
    "stories15M": (288, 768, 6, 6, 6, 32000, 256),
    "stories42M": (512, 1376, 8, 8, 8, 32000, 1024),
    "stories110M": (768, 2048, 12, 12, 12, 32000, 1024),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", default="stories15M", choices=sorted(SHAPES))
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    D, H, L, NH, NKV, V, T = SHAPES[a.shape]
    hs = D // NH
    KV = NKV * hs
    rng = np.random.default_rng(a.seed)

    def w(*shape, scale=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype("<f4")

    with open(a.out, "wb") as f:
        f.write(struct.pack("<7i", D, H, L, NH, NKV, V, T))
        f.write(w(V, D).tobytes())
        f.write(np.ones((L, D), "<f4").tobytes())
        for shape in ((L, D, D), (L, KV, D), (L, KV, D), (L, D, D)):
            f.write(w(*shape).tobytes())
        f.write(np.ones((L, D), "<f4").tobytes())
        f.write(w(L, H, D).tobytes())
        f.write(w(L, D, H).tobytes())
        f.write(w(L, H, D).tobytes())
        f.write(np.ones(D, "<f4").tobytes())
        freqs = 1.0 / (10000.0 ** (np.arange(0, hs, 2, dtype=np.float32) / hs))
        ang = np.outer(np.arange(T, dtype=np.float32), freqs)
        f.write(np.cos(ang).astype("<f4").tobytes())
        f.write(np.sin(ang).astype("<f4").tobytes())
    n = V * D + L * (2 * D * D + 2 * KV * D + 3 * H * D)
    print(f"{a.out}: {a.shape}, {n / 1e6:.1f}M parameters", file=sys.stderr)


if __name__ == "__main__":
    main()
