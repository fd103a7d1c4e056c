"""make_random_llama.py: a Llama-shaped Hugging Face checkpoint with random
weights, for speed tests on a machine without network or model files.

    python3 scripts/make_random_llama.py OUT_DIR [--dtype bf16|f16|f32] [--config smollm2-135m]

Writes OUT_DIR/config.json and OUT_DIR/model.safetensors (transformers'
save_pretrained), which `kiln bench -m OUT_DIR` loads. The shapes are the
named model's; the values are torch's default initialisation (seed 0), so
generated text is noise but every kernel does the real model's work.
"""
import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

CONFIGS = {
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu"),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f16", "f32"])
    ap.add_argument("--config", default="smollm2-135m", choices=sorted(CONFIGS))
    a = ap.parse_args()
    torch.manual_seed(0)
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[a.dtype]
    model = LlamaForCausalLM(LlamaConfig(**CONFIGS[a.config])).to(dt)
    model.save_pretrained(a.out, safe_serialization=True)
    print(f"wrote {a.out} ({a.config}, {a.dtype})")


if __name__ == "__main__":
    main()
