"""make_random_smollm2.py: a random-weight SmolLM2-135M-shaped Llama in bf16,
saved as a Hugging Face directory (config.json + model.safetensors) that
kiln loads with -m DIR: for GPU benchmarks on machines without model files
(no tokenizer: `kiln bench` needs none).
    python3 scripts/make_random_smollm2.py OUT_DIR
The shape is scripts/bench_llm_torch.py's smollm2_135m()."""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    out = sys.argv[1]
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, hidden_act="silu")
    LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out, safe_serialization=True)
    print("wrote", out)


if __name__ == "__main__":
    main()
