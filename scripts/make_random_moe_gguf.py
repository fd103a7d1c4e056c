#!/usr/bin/env python3
"""make_random_moe_gguf.py: a Mixtral-shaped random model and a dense Llama
with the same active parameters per token, as Q8_0 GGUFs (norms, embeddings and router f32), to time
what the mixture-of-experts FFN costs in decode on the CPU (docs/PERF.md,
"Mixture of experts on the CPU"). Mixtral: 8 experts of width Fe, 2 used per
token; dense: one FFN of width 2 Fe, so both read 3 * 2Fe * C FFN weights a
token (the MoE file holds 4x as many). Random weights: timings only.
    python3 scripts/make_random_moe_gguf.py OUT_DIR
    ./build/kiln bench -m OUT_DIR/mixtral.q8_0.gguf -p 64 -n 64 -r 5

With --real: OLMoE-1B-7B's shape instead (C 2048, 16 layers, 16 heads (no
GQA), 64 experts of width 1024, 8 used per token, q/k RMS norms over the
full width, vocabulary 50304, untied head) as olmoe-1b-7b.q4_0.gguf (and
.q8_0.gguf with a second argument q8_0), every matrix in that type, router
and norms f32 (docs/PERF.md, "Real-sized models"):
    python3 scripts/make_random_moe_gguf.py --real OUT_DIR [q8_0]
    sh scripts/bench_llm.sh OUT_DIR/olmoe-1b-7b.q4_0.gguf 2 64 16 3
"""
import os, sys
import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

C, L, H, Hkv, Fe, E, K, V = 512, 8, 8, 2, 1024, 8, 2, 8192
D = C // H


def real(out, types):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from random_gguf import placeholder_vocab, rand_quant
    C, L, H, D, Fe, E, K, V = 2048, 16, 16, 128, 1024, 64, 8, 50304
    for qt in types:
        rng = np.random.default_rng(0)
        path = os.path.join(out, f"olmoe-1b-7b.{qt.name.lower()}.gguf")
        w = gguf.GGUFWriter(path, "olmoe")
        w.add_name("OLMoE-1B-7B shape, random weights")
        w.add_context_length(4096); w.add_embedding_length(C); w.add_block_count(L); w.add_feed_forward_length(Fe)
        w.add_head_count(H); w.add_head_count_kv(H); w.add_rope_freq_base(10000.0); w.add_layer_norm_rms_eps(1e-5)
        w.add_expert_count(E); w.add_expert_used_count(K)
        placeholder_vocab(w, V)
        ones = np.ones(C, np.float32)
        w.add_tensor("token_embd.weight", rand_quant(rng, (V, C), qt, std=0.5), raw_dtype=qt)
        w.add_tensor("output.weight", rand_quant(rng, (V, C), qt), raw_dtype=qt)
        w.add_tensor("output_norm.weight", ones)
        for l in range(L):
            b = f"blk.{l}."
            for n in ("attn_q", "attn_k", "attn_v", "attn_output"):
                w.add_tensor(b + n + ".weight", rand_quant(rng, (C, C), qt), raw_dtype=qt)
            w.add_tensor(b + "attn_q_norm.weight", ones); w.add_tensor(b + "attn_k_norm.weight", ones)
            w.add_tensor(b + "attn_norm.weight", ones); w.add_tensor(b + "ffn_norm.weight", ones)
            w.add_tensor(b + "ffn_gate_inp.weight", (rng.standard_normal((E, C)) * 3 / np.sqrt(C)).astype(np.float32))
            w.add_tensor(b + "ffn_gate_exps.weight", rand_quant(rng, (E, Fe, C), qt), raw_dtype=qt)
            w.add_tensor(b + "ffn_up_exps.weight", rand_quant(rng, (E, Fe, C), qt), raw_dtype=qt)
            w.add_tensor(b + "ffn_down_exps.weight", rand_quant(rng, (E, C, Fe), qt), raw_dtype=qt)
        w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
        print("wrote", path)


def main():
    if sys.argv[1] == "--real":
        out = sys.argv[2]
        os.makedirs(out, exist_ok=True)
        return real(out, [Q.Q4_0] + ([Q.Q8_0] if len(sys.argv) > 3 and sys.argv[3] == "q8_0" else []))
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    rng = np.random.default_rng(0)

    def r(*s, sc=None):          # [out, in] (or [E, out, in]) scaled by 1/sqrt(in) unless sc
        return (rng.standard_normal(s) * (sc if sc else 1 / np.sqrt(s[-1]))).astype(np.float32)
    ones = np.ones(C, np.float32)
    tok, head = r(V, C, sc=0.5), r(V, C)
    layers = [dict(q=r(C, C), k=r(Hkv * D, C), v=r(Hkv * D, C), o=r(C, C), router=r(E, C, sc=3 / np.sqrt(C)),
                   g=r(E, Fe, C), u=r(E, Fe, C), d=r(E, C, Fe)) for _ in range(L)]
    for name in ("mixtral", "dense"):
        for qt in (Q.Q8_0,):
            path = os.path.join(out, f"{name}.{qt.name.lower()}.gguf")
            w = gguf.GGUFWriter(path, "llama")
            w.add_context_length(2048); w.add_embedding_length(C); w.add_block_count(L)
            w.add_feed_forward_length(Fe if name == "mixtral" else K * Fe)
            w.add_head_count(H); w.add_head_count_kv(Hkv); w.add_rope_freq_base(10000.0); w.add_layer_norm_rms_eps(1e-5)
            if name == "mixtral":
                w.add_expert_count(E); w.add_expert_used_count(K)
            w.add_tokenizer_model("llama"); w.add_token_list([f"t{i}" for i in range(V)])   # placeholder pieces
            w.add_token_scores([0.0] * V); w.add_token_types([1] * V)

            def mat(n, a):
                if qt == Q.F32: w.add_tensor(n, np.ascontiguousarray(a))
                else: w.add_tensor(n, gguf.quants.quantize(np.ascontiguousarray(a), qt), raw_dtype=qt)
            w.add_tensor("token_embd.weight", tok); mat("output.weight", head); w.add_tensor("output_norm.weight", ones)
            for l, X in enumerate(layers):
                b = f"blk.{l}."
                for n, k in (("attn_q", "q"), ("attn_k", "k"), ("attn_v", "v"), ("attn_output", "o")):
                    mat(b + n + ".weight", X[k])
                w.add_tensor(b + "attn_norm.weight", ones); w.add_tensor(b + "ffn_norm.weight", ones)
                if name == "mixtral":
                    w.add_tensor(b + "ffn_gate_inp.weight", X["router"])
                    mat(b + "ffn_gate_exps.weight", X["g"]); mat(b + "ffn_up_exps.weight", X["u"])
                    mat(b + "ffn_down_exps.weight", X["d"])
                else:   # the first K experts side by side: the same FLOPs and bytes per token
                    mat(b + "ffn_gate.weight", X["g"][:K].reshape(K * Fe, C))
                    mat(b + "ffn_up.weight", X["u"][:K].reshape(K * Fe, C))
                    mat(b + "ffn_down.weight", np.concatenate(list(X["d"][:K]), axis=1))
            w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
            print("wrote", path)


if __name__ == "__main__":
    main()
