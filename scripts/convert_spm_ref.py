#!/usr/bin/env python3
"""convert_spm_ref.py: SentencePiece-style tokenizer.json fixtures for
`kiln convert` (tests/test_convert.c, issue 15): Llama 2 / Mistral style and
Gemma style, each beside a tiny random model of the same vocabulary size.

How the real ones are made, and so how these are: a SentencePiece BPE model
(the `sentencepiece` trainer, byte_fallback on, digits split, whitespace
kept) converted to tokenizer.json by transformers' own converters
(LlamaConverter: Prepend + Replace normalizer, legacy; GemmaConverter:
Replace normalizer, no dummy prefix, Split on " ", <start_of_turn> /
<end_of_turn> special). Their merges are SentencePiece's: every split of a
piece into two pieces, ordered by the piece's score.

Writes tests/fixtures/convert_spm/{llama,gemma}/: tokenizer.json,
tokenizer_config.json, config.json, model.safetensors (f16, 1-2 layers,
random), and tests/fixtures/convert_spm/ref.txt: per test string one line
"HEX llama gemma split*5" (HEX: the UTF-8 bytes; ids comma separated, "-"
for none): what the `tokenizers` library gives for encode(s,
add_special_tokens=False) with the two tokenizers and with split.json (a
small BPE whose pre-tokenizer is Split on " ") under each of the five
Split behaviors (Removed, Isolated, MergedWithPrevious, MergedWithNext,
Contiguous). tests/test_convert.c checks kiln on the
tokenizer.json and on the converted GGUF against it, and llama.cpp on the
GGUF (scripts/tokenize_llamacpp.py) when llama-cpp-python is installed.

usage: python3 scripts/convert_spm_ref.py [TINYSHAKESPEARE]   (needs sentencepiece,
protobuf, transformers, tokenizers, safetensors, numpy)
"""
import json, os, random, sys, tempfile, types
import numpy as np
import sentencepiece as spm
from safetensors.numpy import save_file
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors, trainers
from transformers.convert_slow_tokenizer import GemmaConverter, LlamaConverter, generate_merges

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "convert_spm")
sys.path.insert(0, os.path.join(ROOT, "scripts"))
from hftok_ref import CURATED, POOLS, UNSEEN, with_bytes_in_vocab   # noqa: E402  (the tokenizer tests' strings)

SHAKES = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.environ.get("KN_ASSETS", "/work/shared/assets"), "datasets/tinyshakespeare/input.txt")
VOCAB = 1000
SPLITS = ["Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"]
MULTI = ["Grüße aus Köln, naïve café", "Здравствуй, мир! Привет", "你好，世界！中文字符", "こんにちは世界",
         "def f(x):\n    return x ** 2  # square\n", "for (i = 0; i < n; i++) { a[i] += b[i]; }",
         "    indented\n\tand tabbed\n", "emoji 😀 👍 ✨"]


def spm_bpe(conv, proto):
    """SpmConverter.tokenizer for a BPE model (transformers 5.25's own call of
    its extractor fails): merges from every two-piece split of each piece,
    ordered by the piece's score; control and user-defined pieces as added
    tokens (control ones special, and the converter's own special set)."""
    vocab_scores = conv.vocab(proto)
    vocab = {w: i for i, (w, _) in enumerate(vocab_scores)}
    if "\t" not in vocab and "<0x09>" in vocab:          # GemmaSentencePieceExtractor's tab fix
        vocab["\t"] = vocab["<0x09>"]
    merges = generate_merges(vocab, vocab_scores)
    tok = Tokenizer(models.BPE({w: i for i, (w, _) in enumerate(vocab_scores)}, merges,
                               unk_token=proto.trainer_spec.unk_piece, fuse_unk=True, byte_fallback=True))
    special = getattr(conv, "special_tokens", set())
    tok.add_tokens([AddedToken(p.piece, normalized=False, special=p.type in (2, 3) or p.piece in special)
                    for p in proto.pieces if p.type in (2, 3, 4)])   # 2: <unk>, special in the real files too
    return tok


def train(kind, text, tmp):
    path = os.path.join(tmp, kind)
    with open(path + ".txt", "w") as f:
        f.write(text)
    common = dict(input=path + ".txt", model_prefix=path, model_type="bpe", vocab_size=VOCAB, byte_fallback=True,
                  split_digits=True, allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
                  normalization_rule_name="identity", character_coverage=0.9995, max_sentencepiece_length=16,
                  num_threads=1, minloglevel=2, max_sentence_length=1 << 20, split_by_whitespace=True)
    if kind == "llama":
        spm.SentencePieceTrainer.train(**common, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, add_dummy_prefix=True)
    else:
        spm.SentencePieceTrainer.train(**common, pad_id=0, eos_id=1, bos_id=2, unk_id=3, add_dummy_prefix=False,
                                       pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>",
                                       control_symbols=["<mask>"],
                                       user_defined_symbols=["<start_of_turn>", "<end_of_turn>", "<h1>"])
    sp = spm.SentencePieceProcessor(model_file=path + ".model")
    orig = types.SimpleNamespace(vocab_file=path + ".model", legacy=True, add_prefix_space=True,
                                 convert_ids_to_tokens=sp.id_to_piece, pad_token="<pad>", eos_token="<eos>",
                                 bos_token="<bos>")
    base = LlamaConverter if kind == "llama" else GemmaConverter
    tok = type("Conv", (base,), {"tokenizer": spm_bpe})(orig).converted()
    bos = "<s>" if kind == "llama" else "<bos>"
    tok.post_processor = processors.TemplateProcessing(single=bos + " $A", special_tokens=[(bos, tok.token_to_id(bos))])
    return tok


def split_tok(text):
    """A small byte-fallback BPE whose only pre-tokenizer is Split on the
    literal " " (Gemma's form; kiln's reader of it, tok_hf.c), saved with
    behavior Removed; the test swaps in the other four names."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))   # trained on whole lines: merges
    tok.train_from_iterator(text[:20000].split("\n"), trainers.BpeTrainer(  # with spaces on either side
        vocab_size=160, special_tokens=["<unk>"], show_progress=False))
    tok.pre_tokenizer = pre_tokenizers.Split(" ", "removed")
    d = json.loads(tok.to_str())                       # pieces that start with spaces, so that the
    for a, b in [(" ", " "), (" ", "t"), (" t", "h")]:  # five behaviors give different ids
        d["model"]["vocab"][a + b] = len(d["model"]["vocab"])
        d["model"]["merges"].append([a, b])
    return with_bytes_in_vocab(Tokenizer.from_str(json.dumps(d)), 1)


def config(kind, V):
    if kind == "llama":
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 48,
                "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1, "head_dim": 16,
                "max_position_embeddings": 64, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
                "tie_word_embeddings": True, "vocab_size": V, "bos_token_id": 1, "eos_token_id": 2}
    return {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 32,
            "intermediate_size": 48, "num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 2,
            "head_dim": 16, "query_pre_attn_scalar": 16, "max_position_embeddings": 64, "rms_norm_eps": 1e-6,
            "rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"], "hidden_activation": "gelu_pytorch_tanh",
            "tie_word_embeddings": True, "vocab_size": V, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}


def weights(cfg, seed):
    rng = np.random.default_rng(seed)
    C, F, D = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    H, K = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    gemma = cfg["model_type"] != "llama"
    w = {"model.embed_tokens.weight": (cfg["vocab_size"], C), "model.norm.weight": (C,)}
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        w.update({p + "input_layernorm.weight": (C,), p + "post_attention_layernorm.weight": (C,),
                  p + "self_attn.q_proj.weight": (H * D, C), p + "self_attn.k_proj.weight": (K * D, C),
                  p + "self_attn.v_proj.weight": (K * D, C), p + "self_attn.o_proj.weight": (C, H * D),
                  p + "mlp.gate_proj.weight": (F, C), p + "mlp.up_proj.weight": (F, C), p + "mlp.down_proj.weight": (C, F)})
        if gemma:
            w.update({p + "pre_feedforward_layernorm.weight": (C,), p + "post_feedforward_layernorm.weight": (C,),
                      p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
    return {k: (rng.standard_normal(s) * (0.1 if len(s) == 1 else 0.3)).astype(np.float16) for k, s in sorted(w.items())}


def strings():
    rnd = random.Random(16)
    out = list(CURATED) + [" leading space", "  two leading", "a<s>b</s>c", "<start_of_turn>user\nhi<end_of_turn>\n",
                           "x<h1>y", "<mask> <pad> <unk>", "\t\tdouble tab", "new\n\n\nlines", UNSEEN, "ab" + UNSEEN[:3]]
    for _ in range(120):
        pool = rnd.choice(POOLS + [UNSEEN + "abc "])
        out.append("".join(rnd.choice(pool) for _ in range(rnd.randrange(1, 24))))
    return out


def main():
    with open(SHAKES, encoding="utf-8") as f:
        shakes = f.read()[:300000]
    text = shakes + "\n" + "\n".join(MULTI * 20) + "\n"
    toks = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed, kind in enumerate(["llama", "gemma"]):
            tok = train(kind, text, tmp)
            d = os.path.join(OUT, kind)
            os.makedirs(d, exist_ok=True)
            tok.save(os.path.join(d, "tokenizer.json"))
            V = tok.get_vocab_size()
            cfg = config(kind, V)
            with open(os.path.join(d, "config.json"), "w") as f:
                json.dump(cfg, f, indent=1)
            save_file(weights(cfg, seed), os.path.join(d, "model.safetensors"))
            tc = ({"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "add_bos_token": True,
                   "add_eos_token": False, "legacy": True,
                   "chat_template": "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] "
                                    "{{ m['content'] }} [/INST]{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}"
                                    "{% endfor %}"} if kind == "llama" else
                  {"bos_token": "<bos>", "eos_token": "<eos>", "unk_token": "<unk>", "pad_token": "<pad>",
                   "add_bos_token": True, "add_eos_token": False,
                   "chat_template": "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ m['role'] }}\n"
                                    "{{ m['content'] }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}"
                                    "<start_of_turn>model\n{% endif %}"})
            with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
                json.dump(tc, f, indent=1)
            toks[kind] = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
            print("%s: %d tokens, %d merges" % (kind, V, len(json.loads(tok.to_str())["model"]["merges"])),
                  file=sys.stderr)
    sp = split_tok(text)
    sp.save(os.path.join(OUT, "split.json"))
    for b in SPLITS:
        toks[b] = Tokenizer.from_str(sp.to_str().replace('"behavior":"Removed"', '"behavior":"%s"' % b))
    with open(os.path.join(OUT, "ref.txt"), "w") as f:
        for s in strings():
            ids = [toks[k].encode(s, add_special_tokens=False).ids for k in ["llama", "gemma"] + SPLITS]
            f.write("%s %s\n" % (s.encode("utf-8").hex() or "-", " ".join(",".join(map(str, x)) or "-" for x in ids)))


if __name__ == "__main__":
    main()
