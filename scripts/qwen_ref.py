#!/usr/bin/env python3
"""qwen_ref.py: tiny random Qwen2 / Qwen3 models and their reference outputs,
from Hugging Face transformers itself (no download: the models are built from
small configs and random weights).

For each model below it writes, under tests/fixtures/qwen/:
  NAME/config.json + NAME/model.safetensors  transformers' save_pretrained (bf16)
  NAME.gguf    the same weights in llama.cpp's qwen2 / qwen3 layout (matrices
               bf16, norms and biases f32, as convert_hf_to_gguf.py writes them)
               with a small byte-level BPE vocabulary whose pre-tokenizer is
               "qwen2" (the ids have no meaning; tests feed token ids)
  NAME.ref     transformers' logits (float64 forward, stored f32) for the last
               rows of a few prompts and the greedy continuation; the KNLR v2
               format of scripts/llm_ref.py (read by tests/test_qwen.c)
and, for the tokenizer:
  qwen2_vocab.gguf  a vocabulary-only GGUF: a byte-level BPE trained by the
               Hugging Face `tokenizers` library on a small built-in text with
               GPT-2's split (so its merges join digits, leading spaces and
               words across the boundaries Qwen2's split draws), pre "qwen2"
  qwen2_vocab.tok   ids that `tokenizers` gives for a list of strings with
               Qwen2's own pre-tokenizer (tokenizer.json of Qwen2/Qwen2.5/Qwen3:
               Split(PATTERN, isolated) then ByteLevel without its regex):
               "KNTK", u32 n; per string u32 n_bytes, bytes, u32 n_ids, i32 ids

Weights are random and large enough to matter: every q/k/v bias, q/k norm gain
and RMS norm gain is drawn far from 0 (biases) or 1 (gains), so a loader that
drops one of them moves the logits far past the test's tolerance. Matrices
are rounded to bf16 before the reference runs, so the reference computes with
exactly the weights the files hold.

usage: . scripts/torch_env.sh; python3 scripts/qwen_ref.py [OUT_DIR]
"""
import json, os, struct, sys
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmref_common import byte_symbols, gguf_bf16, gguf_f32, save_hf, write_ref as write_knlr  # noqa: E402

torch.set_grad_enabled(False)

MODELS = [
    # Qwen2.5-style: q/k/v biases, tied head, rope_theta 1e6
    dict(name="qwen2_tied", arch="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, intermediate_size=96, vocab_size=300, rope_theta=1000000.0, rms_norm_eps=1e-6,
         tie_word_embeddings=True, seed=1),
    # separate lm_head, another eps and theta
    dict(name="qwen2_untied", arch="qwen2", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, intermediate_size=96, vocab_size=300, rope_theta=20000.0, rms_norm_eps=1e-5,
         tie_word_embeddings=False, seed=2),
    # Qwen3: q/k norms, head_dim 32 != 64 / 4, no biases
    dict(name="qwen3", arch="qwen3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
         num_key_value_heads=2, head_dim=32, intermediate_size=96, vocab_size=300, rope_theta=1000000.0,
         rms_norm_eps=1e-6, tie_word_embeddings=False, seed=3),
]
PROMPTS = [[5, 17, 42, 99, 250], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
           [299, 0, 150, 77, 77, 77, 31, 8, 200, 123, 45, 67, 89, 101, 222, 17, 3, 260, 9, 14, 55, 56, 57]]
N_GEN, ROWS = 32, 8


# Qwen2's pre-tokenizer pattern, as its tokenizer.json writes it
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TOK_CORPUS = [
    "The year 2024 had 365 days; 1999 and 2000 were years too, 12 12 123 1234 12345.",
    "I'm sure they'll say it's what we've done, and you'd agree we're right. DON'T SHOUT, WE'LL HEAR.",
    "    indented code: x = y + 42  # comment\n\tif (a && b) { return c; }\n\n\n",
    "Prices: $100.50, 3,000 EUR, 99% off!!! ... ?!? --- ***",
    "caf\u00e9 na\u00efve \u00fcber \u6771\u4eac \u0645\u0631\u062d\u0628\u0627 \u0663\u0664\u0665 \u00bd \u2167",
    "the quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX. the the the then there",
    "line one\r\nline two\r\n\r\n  spaced   out    words     here      ",
]
TOK_TESTS = [
    "Hello world", "x123y", "12345", "in 2024, 365 days", " 12 123 1234", "I'm 42 and you're 7.",
    "DON'T we'LL They'Ve", "  two leading", "trailing  ", "tabs\tand\nnewlines\n\n\nend", "a  b   c    d",
    "$100.50 + 3,000 = ?", "!!! ... ---", "caf\u00e9 \u6771\u4eac \u0663\u0664 \u00bd\u2167", "line\r\nbreak\r\n",
    "    indented code: x = y + 42", "the then there", "\n\n  \n x",
]


def write_vocab(out):
    """A BPE trained with GPT-2's split, used with Qwen2's; the GGUF and the
    ids `tokenizers` gives (see the module docstring)."""
    import gguf
    from tokenizers import Tokenizer, Regex, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)         # GPT-2's split, for training
    tr = trainers.BpeTrainer(vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
                             special_tokens=["<|endoftext|>"])
    tok.train_from_iterator(TOK_CORPUS * 4, tr)
    tok.pre_tokenizer = pre_tokenizers.Sequence([                                  # Qwen2's, for use
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    w = gguf.GGUFWriter(os.path.join(out, "qwen2_vocab.gguf"), "qwen2")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([gguf.TokenType.CONTROL if t == "<|endoftext|>" else gguf.TokenType.NORMAL for t, _ in vocab])
    w.add_token_merges(merges)
    w.add_eos_token_id(model["vocab"]["<|endoftext|>"])
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with open(os.path.join(out, "qwen2_vocab.tok"), "wb") as f:
        f.write(b"KNTK" + struct.pack("<I", len(TOK_TESTS)))
        for s in TOK_TESTS:
            b, ids = s.encode(), tok.encode(s, add_special_tokens=False).ids
            f.write(struct.pack("<I", len(b)) + b + struct.pack(f"<I{len(ids)}i", len(ids), *ids))
    print(f"vocab: {len(vocab)} tokens, {len(merges)} merges; e.g. {TOK_TESTS[1]!r} -> "
          f"{tok.encode(TOK_TESTS[1]).tokens}", file=sys.stderr)


def make_model(spec):
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM
    kw = {k: v for k, v in spec.items() if k not in ("name", "arch", "seed")}
    kw.update(max_position_embeddings=256, hidden_act="silu", use_sliding_window=False)
    Cfg, Model = (Qwen2Config, Qwen2ForCausalLM) if spec["arch"] == "qwen2" else (Qwen3Config, Qwen3ForCausalLM)
    cfg = Cfg(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(spec["seed"])
    model = Model(cfg).eval()
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):                 # every RMS gain, q_norm / k_norm included
            d = torch.rand(p.shape) * 1.5 + 0.5          # [0.5, 2)
        elif name.endswith(".bias"):
            d = torch.randn(p.shape) * 0.5
        elif "embed_tokens" in name:                     # small next to the layers' output, so
            d = torch.randn(p.shape) * 0.5               # a tied head does not echo the input
        else:                                            # [out, in]
            d = torch.randn(p.shape) * (2.0 if "lm_head" in name else 1.0) / p.shape[1] ** 0.5
        p.copy_(d.to(torch.bfloat16).to(torch.float32))  # the reference uses the bf16 values the files hold
    return model


def write_gguf(model, spec, path):
    import gguf
    cfg, arch = model.config, spec["arch"]
    w = gguf.GGUFWriter(path, arch)
    w.add_name(spec["name"])
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(spec["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch == "qwen3":
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    # a byte-level BPE vocabulary of V entries: the 256 byte symbols, merges
    # (among them "1 2", which the "qwen2" split never applies inside "123"
    # while Llama 3's would), then three ChatML control tokens
    V = cfg.vocab_size
    tokens = byte_symbols()
    merges = []
    pairs = [("1", "2"), ("Ġ", "t"), ("h", "e"), ("Ġt", "he")] + [(a, b) for a in "abcdefgh" for b in "ijklmnop"]
    for a, b in pairs:
        if len(tokens) >= V - 3:
            break
        merges.append(f"{a} {b}")
        tokens.append(a + b)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [gguf.TokenType.NORMAL] * len(tokens) + [gguf.TokenType.CONTROL] * len(specials)
    tokens += specials
    assert len(tokens) == V
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_eos_token_id(V - 1)
    sd = {k: v.detach().to(torch.float32).numpy() for k, v in model.state_dict().items()}

    def mat(name, a):
        gguf_bf16(w, name, a)

    def vec(name, a):
        gguf_f32(w, name, a)
    mat("token_embd.weight", sd["model.embed_tokens.weight"])
    if not cfg.tie_word_embeddings:
        mat("output.weight", sd["lm_head.weight"])
    vec("output_norm.weight", sd["model.norm.weight"])
    for l in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{l}.", f"blk.{l}."
        vec(b + "attn_norm.weight", sd[p + "input_layernorm.weight"])
        for hf, gg in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v")):
            mat(b + gg + ".weight", sd[p + "self_attn." + hf + ".weight"])      # HF row order: NEOX rope, no permute
            if p + "self_attn." + hf + ".bias" in sd:
                vec(b + gg + ".bias", sd[p + "self_attn." + hf + ".bias"])
        if arch == "qwen3":
            vec(b + "attn_q_norm.weight", sd[p + "self_attn.q_norm.weight"])
            vec(b + "attn_k_norm.weight", sd[p + "self_attn.k_norm.weight"])
        mat(b + "attn_output.weight", sd[p + "self_attn.o_proj.weight"])
        vec(b + "ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        mat(b + "ffn_gate.weight", sd[p + "mlp.gate_proj.weight"])
        mat(b + "ffn_up.weight", sd[p + "mlp.up_proj.weight"])
        mat(b + "ffn_down.weight", sd[p + "mlp.down_proj.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_ref(model, path):
    """the KNLR reference of model (converted to float64 in place) on PROMPTS"""
    write_knlr(model.to(torch.float64), PROMPTS, path, N_GEN, ROWS)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/qwen"
    os.makedirs(out, exist_ok=True)
    write_vocab(out)
    for spec in MODELS:
        print(spec["name"], file=sys.stderr)
        model = make_model(spec)
        save_hf(model, os.path.join(out, spec["name"]))
        write_gguf(model, spec, os.path.join(out, spec["name"] + ".gguf"))
        write_ref(model, os.path.join(out, spec["name"] + ".ref"))


if __name__ == "__main__":
    main()
