#!/usr/bin/env python3
"""make_random_moe_gguf.py: a Mixtral-shaped random model and a dense Llama
with the same active parameters per token, as Q8_0 GGUFs (norms, embeddings and router f32), to time
what the mixture-of-experts FFN costs in decode on the CPU (docs/PERF.md,
"Mixture of experts on the CPU"). Mixtral: 8 experts of width Fe, 2 used per
token; dense: one FFN of width 2 Fe, so both read 3 * 2Fe * C FFN weights a
token (the MoE file holds 4x as many). Random weights: timings only.
    python3 scripts/make_random_moe_gguf.py OUT_DIR
    ./build/kiln bench -m OUT_DIR/mixtral.q8_0.gguf -p 64 -n 64 -r 5
"""
import os, sys
import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q

C, L, H, Hkv, Fe, E, K, V = 512, 8, 8, 2, 1024, 8, 2, 8192
D = C // H


def main():
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
