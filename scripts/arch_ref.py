#!/usr/bin/env python3
"""arch_ref.py: tiny random Mistral, Gemma 2, Gemma 3 and Phi-3 models and
their reference outputs, from Hugging Face transformers itself (no download:
each model is built from a small config with random weights).

For each model below it writes, under tests/fixtures/arch/:
  NAME/config.json + NAME/model.safetensors  transformers' save_pretrained (bf16)
  NAME.gguf    the same weights in llama.cpp's layout for the architecture, written
               with the gguf package (matrices bf16, norms and rope factors f32):
                 mistral: "llama" (q/k rows permuted for paired rope, as
                          convert_hf_to_gguf.py does), a small byte-level BPE
                          vocabulary, llama.attention.sliding_window;
                 gemma2/gemma3: norms stored as 1 + w, post_attention_norm,
                          ffn_norm (the pre-MLP norm), post_ffw_norm, soft-caps,
                          sliding window and pattern, no output.weight (tied);
                 phi3:    attn_qkv and ffn_up [2F, C] fused, rope_factors_short
                          / rope_factors_long, original context and attn_factor.
  NAME.ref     transformers' logits (float64 forward, stored f32) for the last
               rows of a few prompts and the greedy continuation (full forward
               each step); the KNLR v2 format of scripts/llm_ref.py
  gemma3_vl/ + gemma3_vl.ref  a Gemma3ForConditionalGeneration (gemma3's text
               settings, a tiny vision tower): its language model, from safetensors
  phi3_long.ref  the phi3 model on a prompt longer than its original context
               (64), where LongRoPE switches to the long factors

What each fixture exercises: windows of 8 (mistral, gemma2, gemma3) and 16
(phi3) against prompts of up to 23 tokens plus 32 generated (and 70 for
phi3_long), so keys fall out of the window both in prefill and in decode;
gemma2's attention cap (2.5) and final cap (4) are small enough to bend the
scores and logits; its query_pre_attn_scalar (24) differs from head_dim (16);
gemma3 has q/k norms, layers sliding, sliding, full (pattern 3), rope base 1e6
with linear scaling 2 on the global layer and 10000 on the local ones; phi3
rotates half of each head (partial_rotary_factor 0.5) with random short and
long factors. Norm gains are drawn far from their neutral value so a loader
that drops (1 + w) or a post-norm misses by far more than the tolerance.
Matrices are rounded to bf16 before the reference runs.

usage: . scripts/torch_env.sh; python3 scripts/arch_ref.py [OUT_DIR]
"""
import os, sys
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmref_common import byte_symbols, gguf_bf16, gguf_f32, permute_rows, save_hf, write_ref as write_knlr  # noqa: E402

torch.set_grad_enabled(False)

COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              intermediate_size=96, vocab_size=300, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=1, eos_token_id=2)
MODELS = [
    dict(name="mistral", arch="mistral", sliding_window=8, rope_theta=10000.0, tie_word_embeddings=False, seed=11),
    dict(name="gemma2", arch="gemma2", sliding_window=8, rope_theta=10000.0, query_pre_attn_scalar=24,
         attn_logit_softcapping=2.5, final_logit_softcapping=4.0, seed=12),
    dict(name="gemma3", arch="gemma3", sliding_window=8, num_hidden_layers=3, query_pre_attn_scalar=16,
         layer_types=["sliding_attention", "sliding_attention", "full_attention"],
         rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}, seed=13),
    # Gemma 3 with vision (Gemma3ForConditionalGeneration): gemma3's text settings, a tiny SigLIP tower that
    # kiln ignores; safetensors only (llama.cpp writes its text part as a "gemma3" GGUF)
    dict(name="gemma3_vl", arch="gemma3_vl", sliding_window=8, num_hidden_layers=3, query_pre_attn_scalar=16,
         layer_types=["sliding_attention", "sliding_attention", "full_attention"],
         rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000000.0},
                          "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}, seed=15),
    dict(name="phi3", arch="phi3", sliding_window=16, max_position_embeddings=256, original_max_position_embeddings=64,
         tie_word_embeddings=False, rms_norm_eps=1e-5, seed=14),
]
PROMPTS = [[5, 17, 42, 99, 250], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
           [299, 0, 150, 77, 77, 77, 31, 8, 200, 123, 45, 67, 89, 101, 222, 17, 3, 260, 9, 14, 55, 56, 57]]
LONG_PROMPT = [(i * 37 + 11) % 300 for i in range(70)]
N_GEN, ROWS = 32, 8
PHI3_ROT = 8                                             # head_dim 16 * partial_rotary_factor 0.5


def make_model(spec):
    import transformers as tf
    kw = {k: v for k, v in spec.items() if k not in ("name", "arch", "seed")}
    kw = {**COMMON, **kw}
    torch.manual_seed(spec["seed"])
    if spec["arch"] == "mistral":
        cfg = tf.MistralConfig(max_position_embeddings=256, hidden_act="silu", **kw)
        Model = tf.MistralForCausalLM
    elif spec["arch"] == "gemma2":
        cfg = tf.Gemma2Config(max_position_embeddings=256, hidden_activation="gelu_pytorch_tanh", **kw)
        Model = tf.Gemma2ForCausalLM
    elif spec["arch"] == "gemma3_vl":
        vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                      patch_size=14)
        cfg = tf.Gemma3Config(text_config=dict(max_position_embeddings=256, hidden_activation="gelu_pytorch_tanh", **kw),
                              vision_config=vision, mm_tokens_per_image=4, image_token_index=299, boi_token_index=297,
                              eoi_token_index=298)
        Model = tf.Gemma3ForConditionalGeneration
    elif spec["arch"] == "gemma3":
        cfg = tf.Gemma3TextConfig(max_position_embeddings=256, hidden_activation="gelu_pytorch_tanh", **kw)
        Model = tf.Gemma3ForCausalLM
    else:
        g = torch.Generator().manual_seed(99)
        short = (torch.rand(PHI3_ROT // 2, generator=g) * 2 + 1).tolist()     # [1, 3)
        long = (torch.rand(PHI3_ROT // 2, generator=g) * 6 + 2).tolist()      # [2, 8)
        kw.pop("head_dim")
        cfg = tf.Phi3Config(hidden_act="silu", rope_parameters={
            "rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
            "short_factor": short, "long_factor": long, "original_max_position_embeddings": 64}, **kw)
        Model = tf.Phi3ForCausalLM
    cfg._attn_implementation = "eager"
    model = Model(cfg).eval()
    gemma = spec["arch"].startswith("gemma")
    for name, p in model.named_parameters():
        if gemma and name.endswith(("model.norm.weight", "language_model.norm.weight")) and "layers" not in name:      # final gain 1 + w in [6, 11): logits of a few units,
            d = torch.rand(p.shape) * 5 + 5              # where gemma2's final cap of 4 bends them
        elif name.endswith("norm.weight"):               # every RMS gain (Gemma: the gain is 1 + w)
            d = torch.rand(p.shape) * 1.5 + (-0.5 if gemma else 0.5)
        elif "embed_tokens" in name:                     # Gemma scales it by sqrt(64) = 8; small next to the
            d = torch.randn(p.shape) * (0.05 if gemma else 0.5)   # layers' output, so the tied head does not echo
        elif p.dim() != 2:                               # the vision tower's biases, patch kernels, ...
            d = torch.randn(p.shape) * 0.1
        else:                                            # [out, in]
            d = torch.randn(p.shape) * (2.0 if "lm_head" in name else 1.0) / p.shape[1] ** 0.5
        p.copy_(d.to(torch.bfloat16).to(torch.float32))  # the reference uses the bf16 values the files hold
    return model


def bpe_vocab(V):
    """A byte-level BPE vocabulary of V entries (ids only matter to the test)."""
    tokens, merges = byte_symbols(), []
    for a, b in [("Ġ", "t"), ("h", "e"), ("Ġt", "he")] + [(a, b) for a in "abcdefgh" for b in "ijklmnop"]:
        if len(tokens) >= V - 1:
            break
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    tokens.append("</s>")
    return tokens, merges


def write_gguf(model, spec, path):
    import gguf
    cfg, arch = model.config, spec["arch"]
    garch = "llama" if arch == "mistral" else arch
    gemma = arch.startswith("gemma")
    w = gguf.GGUFWriter(path, garch)
    w.add_name(spec["name"])
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_key_length(16)
    w.add_value_length(16)
    w.add_sliding_window(spec["sliding_window"])
    if arch == "mistral":
        w.add_rope_freq_base(spec["rope_theta"])
        tokens, merges = bpe_vocab(cfg.vocab_size)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_types([gguf.TokenType.NORMAL] * (len(tokens) - 1) + [gguf.TokenType.CONTROL])
        w.add_token_merges(merges)
        w.add_eos_token_id(len(tokens) - 1)
    elif arch == "gemma2":
        w.add_rope_freq_base(spec["rope_theta"])
        w.add_attn_logit_softcapping(spec["attn_logit_softcapping"])
        w.add_final_logit_softcapping(spec["final_logit_softcapping"])
        w.add_attention_scale(spec["query_pre_attn_scalar"] ** -0.5)   # llama.cpp's files leave the scale implied
    elif arch == "gemma3":
        w.add_rope_freq_base(1000000.0)
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(2.0)
        w.add_sliding_window_pattern(3)                    # layers 0, 1 sliding, 2 full
    else:
        rp = cfg.rope_parameters
        w.add_rope_freq_base(rp["rope_theta"])
        w.add_rope_dimension_count(PHI3_ROT)
        w.add_rope_scaling_orig_ctx_len(64)
        factor = cfg.max_position_embeddings / 64
        w.add_rope_scaling_attn_factors(float(np.sqrt(1 + np.log(factor) / np.log(64))))
        w.add_tensor("rope_factors_long.weight", np.array(rp["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rp["short_factor"], dtype=np.float32))
    sd = {k: v.detach().to(torch.float32).numpy() for k, v in model.state_dict().items()}

    def mat(name, a):
        gguf_bf16(w, name, a)

    def norm(name, a):
        gguf_f32(w, name, a + 1 if gemma else a)
    mat("token_embd.weight", sd["model.embed_tokens.weight"])
    if "lm_head.weight" in sd and not cfg.tie_word_embeddings:
        mat("output.weight", sd["lm_head.weight"])
    norm("output_norm.weight", sd["model.norm.weight"])
    H, Hkv = cfg.num_attention_heads, cfg.num_key_value_heads
    for l in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        norm(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        if arch == "phi3":
            mat(b + "attn_qkv.weight", sd[p + "self_attn.qkv_proj.weight"])
            mat(b + "ffn_up.weight", sd[p + "mlp.gate_up_proj.weight"])        # gate rows first, then up
        else:
            q, k = sd[p + "self_attn.q_proj.weight"], sd[p + "self_attn.k_proj.weight"]
            if arch == "mistral":
                q, k = permute_rows(q, H), permute_rows(k, Hkv)
            mat(b + "attn_q.weight", q)
            mat(b + "attn_k.weight", k)
            mat(b + "attn_v.weight", sd[p + "self_attn.v_proj.weight"])
            mat(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
            mat(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        mat(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        mat(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
        if gemma:
            norm(b + "post_attention_norm.weight", sd[p + "post_attention_layernorm.weight"])
            norm(b + "ffn_norm.weight", sd[p + "pre_feedforward_layernorm.weight"])
            norm(b + "post_ffw_norm.weight", sd[p + "post_feedforward_layernorm.weight"])
        else:
            norm(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        if arch == "gemma3":
            norm(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            norm(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_ref(m64, prompts, path):
    write_knlr(m64, prompts, path, N_GEN, ROWS)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/arch"
    os.makedirs(out, exist_ok=True)
    for spec in MODELS:
        print(spec["name"], file=sys.stderr)
        model = make_model(spec)
        save_hf(model, os.path.join(out, spec["name"]))
        if spec["arch"] != "gemma3_vl":
            write_gguf(model, spec, os.path.join(out, spec["name"] + ".gguf"))
        m64 = model.to(torch.float64)
        write_ref(m64, PROMPTS, os.path.join(out, spec["name"] + ".ref"))
        if spec["arch"] == "phi3":
            write_ref(m64, [LONG_PROMPT], os.path.join(out, "phi3_long.ref"))


if __name__ == "__main__":
    main()
