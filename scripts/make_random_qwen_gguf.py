#!/usr/bin/env python3
"""make_random_qwen_gguf.py: the same random f32 weights as three GGUFs,
llama, qwen2 (plus q/k/v biases) and qwen3 (plus q/k norm gains), SmolLM2's
width (C 576, 9 heads, 3 kv heads, F 1536) with 8 layers and an 8192-token
placeholder vocabulary: what the Qwen blocks cost next to Llama's on the same
matrices (docs/PERF.md, "Qwen2 / Qwen3 on the CPU"). Random weights: timings
only, the text is noise.
    python3 scripts/make_random_qwen_gguf.py OUT_DIR
    ./build/kiln bench -m OUT_DIR/qwen2.gguf -p 128 -n 64 -r 5

With --real: Qwen2.5-0.5B's shape instead (C 896, 24 layers, 14 heads, 2 kv
heads, head dim 64, F 4864, vocabulary 151936, tied head, q/k/v biases) as
qwen2.5-0.5b.q4_0.gguf and .q8_0.gguf, every matrix in that type (llama.cpp's
--pure), for kiln against llama.cpp (docs/PERF.md, "Real-sized models"):
    python3 scripts/make_random_qwen_gguf.py --real OUT_DIR
    sh scripts/bench_llm.sh OUT_DIR/qwen2.5-0.5b.q4_0.gguf 2 64 32 3
"""
import os, sys
import numpy as np
import gguf

C, L, H, Hkv, F, V = 576, 8, 9, 3, 1536, 8192
D = C // H


def real(out):
    from gguf import GGMLQuantizationType as Q
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from random_gguf import placeholder_vocab, rand_quant
    C, L, H, Hkv, D, F, V = 896, 24, 14, 2, 64, 4864, 151936
    for qt in (Q.Q4_0, Q.Q8_0):
        rng = np.random.default_rng(0)
        path = os.path.join(out, f"qwen2.5-0.5b.{qt.name.lower()}.gguf")
        w = gguf.GGUFWriter(path, "qwen2")
        w.add_name("Qwen2.5-0.5B shape, random weights")
        w.add_context_length(32768); w.add_embedding_length(C); w.add_block_count(L); w.add_feed_forward_length(F)
        w.add_head_count(H); w.add_head_count_kv(Hkv); w.add_rope_freq_base(1000000.0); w.add_layer_norm_rms_eps(1e-6)
        placeholder_vocab(w, V)
        ones = np.ones(C, np.float32)
        w.add_tensor("token_embd.weight", rand_quant(rng, (V, C), qt, std=0.5), raw_dtype=qt)   # tied: the head too
        w.add_tensor("output_norm.weight", ones)
        for l in range(L):
            b = f"blk.{l}."
            for n, shp in (("attn_q", (H * D, C)), ("attn_k", (Hkv * D, C)), ("attn_v", (Hkv * D, C)),
                           ("attn_output", (C, H * D)), ("ffn_gate", (F, C)), ("ffn_up", (F, C)), ("ffn_down", (C, F))):
                w.add_tensor(b + n + ".weight", rand_quant(rng, shp, qt), raw_dtype=qt)
            for n, k in (("attn_q", H * D), ("attn_k", Hkv * D), ("attn_v", Hkv * D)):
                w.add_tensor(b + n + ".bias", (rng.standard_normal(k) * 0.5).astype(np.float32))
            w.add_tensor(b + "attn_norm.weight", ones); w.add_tensor(b + "ffn_norm.weight", ones)
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
        print("wrote", path)


def main():
    if sys.argv[1] == "--real":
        out = sys.argv[2]
        os.makedirs(out, exist_ok=True)
        return real(out)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)

    def r(*s, sc=None):          # [out, in] scaled by 1/sqrt(in) unless sc
        return (rng.standard_normal(s) * (sc if sc else 1 / np.sqrt(s[-1]))).astype(np.float32)
    ones = np.ones(C, np.float32)
    tok, head = r(V, C, sc=0.5), r(V, C)
    layers = [dict(q=r(C, C), k=r(Hkv * D, C), v=r(Hkv * D, C), o=r(C, C), g=r(F, C), u=r(F, C), d=r(C, F),
                   bq=r(C, sc=0.5), bk=r(Hkv * D, sc=0.5), bv=r(Hkv * D, sc=0.5)) for _ in range(L)]
    for arch in ("llama", "qwen2", "qwen3"):
        w = gguf.GGUFWriter(os.path.join(out, arch + ".gguf"), arch)
        w.add_context_length(2048); w.add_embedding_length(C); w.add_block_count(L); w.add_feed_forward_length(F)
        w.add_head_count(H); w.add_head_count_kv(Hkv); w.add_rope_freq_base(10000.0); w.add_layer_norm_rms_eps(1e-5)
        w.add_tokenizer_model("llama"); w.add_token_list([f"t{i}" for i in range(V)])   # placeholder pieces
        w.add_token_scores([0.0] * V); w.add_token_types([1] * V)
        w.add_tensor("token_embd.weight", tok); w.add_tensor("output.weight", head); w.add_tensor("output_norm.weight", ones)
        for l, X in enumerate(layers):
            b = f"blk.{l}."
            for n, k in (("attn_q", "q"), ("attn_k", "k"), ("attn_v", "v"), ("attn_output", "o"), ("ffn_gate", "g"),
                         ("ffn_up", "u"), ("ffn_down", "d")):
                w.add_tensor(b + n + ".weight", X[k])
            w.add_tensor(b + "attn_norm.weight", ones); w.add_tensor(b + "ffn_norm.weight", ones)
            if arch == "qwen2":
                for n, k in (("attn_q", "bq"), ("attn_k", "bk"), ("attn_v", "bv")):
                    w.add_tensor(b + n + ".bias", X[k])
            if arch == "qwen3":
                w.add_tensor(b + "attn_q_norm.weight", np.ones(D, np.float32))
                w.add_tensor(b + "attn_k_norm.weight", np.ones(D, np.float32))
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
        print("wrote", os.path.join(out, arch + ".gguf"))


if __name__ == "__main__":
    main()
