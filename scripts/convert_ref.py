#!/usr/bin/env python3
"""convert_ref.py: a small byte-level BPE tokenizer.json (+ tokenizer_config.json)
for the `kiln convert` tests (tests/test_convert.c), which put it beside the
tiny random models of tests/fixtures/{arch,qwen,moe} (whose vocabularies are
300 ids) so that the converted GGUF files carry a vocabulary, as llama.cpp needs.

Trained by the Hugging Face `tokenizers` library to 297 entries plus three
special tokens (<|endoftext|> = bos/eos, <|im_start|>, <|im_end|>), with
Qwen2's pre-tokenizer (Split on its regex, then ByteLevel without regex), so
that kiln convert names it "qwen2". tokenizer_config.json sets the specials
and a ChatML chat template.
Also gpt2/: a tiny random GPT2LMHeadModel (transformers' save_pretrained,
bf16; 2 layers, 32 wide, 300 ids) for the GPT-2 conversion (Conv1D weights).

usage: python3 scripts/convert_ref.py [OUT_DIR]
"""
import json, os, sys
from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, trainers

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CORPUS = ["the quick brown fox jumps over the lazy dog. " * 3, "Once upon a time there was a little model. " * 3,
          "hello world, hello kiln; 12 34 5678", "def f(x):\n    return x + 1\n"]


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures/convert"
    os.makedirs(out, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tr = trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                             show_progress=False, special_tokens=specials)
    tok.train_from_iterator(CORPUS * 4, tr)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    assert tok.get_vocab_size() <= 300, tok.get_vocab_size()
    tok.save(os.path.join(out, "tokenizer.json"))
    cfg = {"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "add_bos_token": False,
           "chat_template": "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                            "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"}
    with open(os.path.join(out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(5)
    m = GPT2LMHeadModel(GPT2Config(vocab_size=300, n_positions=64, n_embd=32, n_layer=2, n_head=4)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn(p.shape) * 0.3)
    m.to(torch.bfloat16).save_pretrained(os.path.join(out, "gpt2"))
    print(f"{tok.get_vocab_size()} tokens: {tok.encode('hello world 1234').tokens}", file=sys.stderr)


if __name__ == "__main__":
    main()
