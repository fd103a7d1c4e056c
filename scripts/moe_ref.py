#!/usr/bin/env python3
"""moe_ref.py: tiny random mixture-of-experts models (Mixtral, Qwen2-MoE,
Qwen3-MoE, OLMoE) and their reference outputs, from Hugging Face transformers
itself (no download: built from small configs with random weights).

For each model below it writes, under tests/fixtures/moe/:
  NAME/config.json + NAME/model.safetensors  transformers' save_pretrained (bf16;
               one matrix per expert, as the Hub checkpoints store them)
  NAME.gguf    the same weights in llama.cpp's layout: experts stacked into
               ffn_{gate,up,down}_exps [E, Fe, C] / [E, C, Fe], the router
               ffn_gate_inp (f32), Qwen2-MoE's shared expert ffn_*_shexp and its
               gate ffn_gate_inp_shexp [C], expert_count / expert_used_count;
               Mixtral as GGUF "llama" with q/k rows permuted for paired rope
               (as convert_hf_to_gguf.py does), the others with HF's row order
  NAME.ref     transformers' logits (float64 forward) and greedy 32 tokens:
               the KNLR v2 format of scripts/qwen_ref.py (tests/test_moe.c)

Weights are random and far from neutral (gains in [0.5, 2), biases of 0.5);
the router's are large (3 / sqrt(C)), so each token's probabilities are far
apart and the top-k choice is not decided by rounding; the script counts the
(token, slot) pairs each expert receives over the prompts and refuses a model
where fewer than all but one expert get any (so the test exercises routing).
Matrices are rounded to bf16 first: the reference uses the weights the files hold.

usage: . scripts/torch_env.sh; python3 scripts/moe_ref.py [OUT_DIR]
"""
import json, os, sys
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import qwen_ref  # noqa: E402  (write_ref, PROMPTS: the same .ref format and prompts)
from llmref_common import byte_symbols, gguf_bf16, gguf_f32, permute_rows, save_hf  # noqa: E402

torch.set_grad_enabled(False)

COMMON = dict(hidden_size=48, num_attention_heads=4, num_key_value_heads=2, vocab_size=300, rms_norm_eps=1e-6,
              max_position_embeddings=256, hidden_act="silu")
MODELS = [
    # Mixtral: Llama attention, 5 experts, top-2, weights renormalised; tied head
    dict(name="mixtral", arch="mixtral", num_hidden_layers=2, num_local_experts=5, num_experts_per_tok=2,
         intermediate_size=32, tie_word_embeddings=True, rope_theta=1000000.0, seed=11),
    # Qwen2-MoE: q/k/v biases, 6 experts top-2 (not renormalised), a shared expert behind a
    # sigmoid gate, layer 1 dense (mlp_only_layers)
    dict(name="qwen2moe", arch="qwen2moe", num_hidden_layers=3, num_experts=6, num_experts_per_tok=2,
         moe_intermediate_size=24, shared_expert_intermediate_size=40, intermediate_size=56, norm_topk_prob=False,
         mlp_only_layers=[1], decoder_sparse_step=1, tie_word_embeddings=False, rope_theta=1000000.0, seed=12),
    # Qwen3-MoE: per-head q/k norms, head_dim 16 != 48 / 4, 10 experts top-3 renormalised
    dict(name="qwen3moe", arch="qwen3moe", num_hidden_layers=2, num_experts=10, num_experts_per_tok=3,
         moe_intermediate_size=24, intermediate_size=64, head_dim=16, norm_topk_prob=True, tie_word_embeddings=False,
         rope_theta=1000000.0, seed=13),
    # OLMoE: q/k norms over the whole projections, 7 experts top-1, not renormalised
    dict(name="olmoe", arch="olmoe", num_hidden_layers=2, num_experts=7, num_experts_per_tok=1, intermediate_size=32,
         norm_topk_prob=False, tie_word_embeddings=False, rope_theta=10000.0, seed=14),
]


def make_model(spec):
    import transformers as tf
    Cfg, Model = {"mixtral": (tf.MixtralConfig, tf.MixtralForCausalLM),
                  "qwen2moe": (tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM),
                  "qwen3moe": (tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM),
                  "olmoe": (tf.OlmoeConfig, tf.OlmoeForCausalLM)}[spec["arch"]]
    kw = dict(COMMON)
    kw.update({k: v for k, v in spec.items() if k not in ("name", "arch", "seed")})
    if spec["arch"] in ("qwen2moe", "qwen3moe"):
        kw["use_sliding_window"] = False
    kw.update(bos_token_id=None, eos_token_id=None, pad_token_id=None)
    cfg = Cfg(**kw)
    cfg._attn_implementation = "eager"
    cfg._experts_implementation = "eager"       # the per-expert loop: grouped_mm takes no float64
    torch.manual_seed(spec["seed"])
    model = Model(cfg).eval()
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):                 # RMS gains, q_norm / k_norm included
            d = torch.rand(p.shape) * 1.5 + 0.5
        elif name.endswith(".bias"):
            d = torch.randn(p.shape) * 0.5
        elif "embed_tokens" in name:
            d = torch.randn(p.shape) * 0.5
        elif name.endswith("gate.weight") and "shared_expert_gate" not in name:    # the router [E, C]
            d = torch.randn(p.shape) * 3.0 / p.shape[-1] ** 0.5
        else:                                            # [out, in] or experts [E, out, in]
            d = torch.randn(p.shape) * (2.0 if "lm_head" in name else 1.0) / p.shape[-1] ** 0.5
        p.copy_(d.to(torch.bfloat16).to(torch.float32))
    return model


def expert_use(model, spec):
    """(token, slot) pairs each expert gets over the prompts, per MoE layer"""
    E = model.config.num_local_experts if spec["arch"] in ("mixtral", "qwen3moe") else model.config.num_experts
    K = model.config.num_experts_per_tok
    counts, hooks = {}, []
    for name, mod in model.named_modules():
        if name.endswith(".gate") and hasattr(mod, "weight") and mod.weight.shape[0] == E:
            def hook(mod, inp, out, name=name):
                logits = torch.nn.functional.linear(inp[0].reshape(-1, inp[0].shape[-1]), mod.weight)
                idx = torch.topk(torch.softmax(logits.float(), -1), K, -1).indices.flatten()
                counts.setdefault(name, np.zeros(E, int))
                np.add.at(counts[name], idx.numpy(), 1)
            hooks.append(mod.register_forward_hook(hook))
    for p in qwen_ref.PROMPTS:
        model(torch.tensor([p]))
    for h in hooks:
        h.remove()
    for name, c in counts.items():
        print(f"  {name}: expert use {c.tolist()}", file=sys.stderr)
        assert (c > 0).sum() >= E - 1, f"{name}: the random router sends tokens to too few experts: {c}"
    assert counts, "no router found"


def write_gguf(spec, d, path):
    import gguf
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(d, "config.json")))
    sd = {k: v.float().numpy() for k, v in load_file(os.path.join(d, "model.safetensors")).items()}
    arch = {"mixtral": "llama"}.get(spec["arch"], spec["arch"])
    mixtral = spec["arch"] == "mixtral"
    E = cfg.get("num_experts", cfg.get("num_local_experts"))     # Qwen3-MoE writes the latter
    H, Hkv, C = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["hidden_size"]
    w = gguf.GGUFWriter(path, arch)
    w.add_name(spec["name"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(C)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_rope_freq_base(spec["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_expert_count(E)
    w.add_expert_used_count(cfg["num_experts_per_tok"])
    if "moe_intermediate_size" in cfg:
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if cfg.get("shared_expert_intermediate_size"):
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    if cfg.get("head_dim") and cfg["head_dim"] != C // H:
        w.add_key_length(cfg["head_dim"])
        w.add_value_length(cfg["head_dim"])
    V = cfg["vocab_size"]                        # a byte-level vocabulary: 256 bytes, then filler merges
    tokens = byte_symbols()
    merges = []
    for a in "abcdefghijklmnop":
        for b in "abcdefghijklmnop":
            if len(tokens) < V - 1:
                merges.append(f"{a} {b}"); tokens.append(a + b)
    tokens.append("<|endoftext|>")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.NORMAL] * (V - 1) + [gguf.TokenType.CONTROL])
    w.add_token_merges(merges)
    w.add_eos_token_id(V - 1)

    def mat(name, a):
        gguf_bf16(w, name, a)

    def vec(name, a):
        gguf_f32(w, name, a)
    mat("token_embd.weight", sd["model.embed_tokens.weight"])
    if "lm_head.weight" in sd:
        mat("output.weight", sd["lm_head.weight"])
    vec("output_norm.weight", sd["model.norm.weight"])
    for l in range(cfg["num_hidden_layers"]):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        vec(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        for hf, gg, nh in (("q_proj", "attn_q", H), ("k_proj", "attn_k", Hkv), ("v_proj", "attn_v", 0)):
            a = sd[p + "self_attn." + hf + ".weight"]
            mat(b + gg + ".weight", permute_rows(a, nh) if mixtral and nh else a)
            if p + "self_attn." + hf + ".bias" in sd:
                vec(b + gg + ".bias", sd[p + "self_attn." + hf + ".bias"])
        for nm in ("q_norm", "k_norm"):
            if p + "self_attn." + nm + ".weight" in sd:
                vec(b + "attn_" + nm + ".weight", sd[p + "self_attn." + nm + ".weight"])
        mat(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        vec(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        moe = p + ("block_sparse_moe." if mixtral else "mlp.")
        if moe + "gate.weight" not in sd:            # a dense layer (Qwen2-MoE mlp_only_layers)
            for hf, gg in (("gate_proj", "ffn_gate"), ("up_proj", "ffn_up"), ("down_proj", "ffn_down")):
                mat(b + gg + ".weight", sd[p + "mlp." + hf + ".weight"])
            continue
        vec(b + "ffn_gate_inp.weight", sd[moe + "gate.weight"])
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        for hf, gg in zip(names, ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")):
            mat(b + gg + ".weight", np.stack([sd[f"{moe}experts.{e}.{hf}.weight"] for e in range(E)]))
        if moe + "shared_expert_gate.weight" in sd:
            for hf, gg in (("gate_proj", "ffn_gate_shexp"), ("up_proj", "ffn_up_shexp"), ("down_proj", "ffn_down_shexp")):
                mat(b + gg + ".weight", sd[moe + "shared_expert." + hf + ".weight"])
            vec(b + "ffn_gate_inp_shexp.weight", sd[moe + "shared_expert_gate.weight"][0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/moe"
    os.makedirs(out, exist_ok=True)
    for spec in MODELS:
        print(spec["name"], file=sys.stderr)
        model = make_model(spec)
        expert_use(model, spec)
        d = os.path.join(out, spec["name"])
        save_hf(model, d)
        write_gguf(spec, d, os.path.join(out, spec["name"] + ".gguf"))
        qwen_ref.write_ref(model, os.path.join(out, spec["name"] + ".ref"))


if __name__ == "__main__":
    main()
