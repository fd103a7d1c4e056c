#!/usr/bin/env python3
"""hftok_ref.py: reference fixtures for kiln's tokenizer.json reader (issue 15).

Trains small tokenizers with Hugging Face `tokenizers` (pip install tokenizers)
on tinyshakespeare plus the strings below, saves each as
tests/fixtures/hftok/<name>.json (llama3: llama3/tokenizer.json with a
tokenizer_config.json), and writes tests/fixtures/hftok/ref.bin.gz:
the test strings and, per tokenizer, the ids of encode(s,
add_special_tokens=False) and decode(ids) (skip_special_tokens=True).
tests/test_hftok.c must reproduce every id and every decoding.

Nothing is downloaded. The strings are deterministic (fixed seed); the
trainers may break ties differently from run to run, so a rerun can give
other vocabularies: the fixtures and ref.bin.gz always come from one run.

ref.bin.gz (gzip, little endian):
  "KNHT" u32 version=1 u32 n_strings u32 n_tokenizers
  per string: u32 len, bytes
  per tokenizer: u32 name_len, name; per string: u32 n_ids, u16 ids[n_ids]
                 (n_ids = 0xFFFFFFFF: encode raised an error), then
                 u8 same (1: decode == the string), else u32 len, bytes
Usage: python3 scripts/hftok_ref.py [/path/to/tinyshakespeare/input.txt]
"""
import gzip, json, os, random, struct, sys
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers, trainers)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "fixtures", "hftok")
SHAKES = sys.argv[1] if len(sys.argv) > 1 else "/work/shared/assets/datasets/tinyshakespeare/input.txt"

GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
             r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = LLAMA3_RE.replace(r"\p{N}{1,3}", r"\p{N}")

# Hand-picked strings: scripts, emoji, code, whitespace, control bytes, specials.
CURATED = [
    "", " ", "  ", "\n", "\t", " \n ", "a", "Hello world", " Hello  world ", "hello\n\nworld",
    "I'm sure you'll see they've done it, he'd say. WE'LL GO. It'S", "don't can't won't",
    "12345 3.14159 1,000,000 007 ١٢٣٤ ߁߂ ½ ² Ⅻ", "x=1;y=22;z=333;w=4444",
    "Grüße aus Köln, naïve café, ÅNGSTRÖM, İstanbul, ß ẞ", "e\u0301 o\u0308 a\u030a (combining)",
    "Здравствуй, мир! Привет", "Καλημέρα κόσμε ΣΊΣΥΦΟΣ", "שלום עולם", "مرحبا بالعالم ١٢",
    "नमस्ते दुनिया", "สวัสดีชาวโลก", "こんにちは世界、カタカナ", "你好，世界！中文字符测试", "안녕하세요 세계",
    "ქართული ენა", "Հայերեն", "ትግርኛ", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚", "ＦＵＬＬＷＩＤＴＨ １２３",
    "emoji 😀😃 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ ✨", "🤖🦀🐍", "\u200b\u200d\ufeff zero width",
    "tabs\tand\ttabs\t\t\tend", "trailing spaces   ", "   leading spaces", "\r\n\r\nwindows\r\n",
    "mixed \n \t \n\n  \u3000 \u00a0 nbsp", "\x00\x01\x02\x1f\x7f control", "bell\x07 esc\x1b[0m",
    "def f(x):\n    return x ** 2  # square\n", "int main(void) { printf(\"%d\\n\", 42); }",
    "for (i = 0; i < n; i++) { a[i] += b[i] * c; }", "{\"key\": [1, 2, 3], \"ok\": true}",
    "https://example.com/path?q=1&r=two#frag", "user@example.org", "C:\\Windows\\System32",
    "<|endoftext|>", "a<|endoftext|>b", "<s>hello</s>", "[CLS] hello [SEP] [MASK]", "<unk>",
    "<|begin_of_text|>Hi<|eot_id|>", "x<|custom|>y", "<0x41> literal byte token text",
    "▁already▁metaspace", "##suffix", "UPPER lower MiXeD", "...!!!???,,,;;;", "--- *** ___ ~~~",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "supercalifragilisticexpialidocious",
    "ROMEO:\nBut, soft! what light through yonder window breaks?", "’curly’ “quotes” — dash – en",
    "ﬁ ﬂ ligatures", "Ⓐⓑ ㍿ ℃ ™", "\u00e9\u00e8\u00ea \u0107\u010d\u0161\u017e", "Ελληνικά ά έ ή",
]

# Character pools for the random strings.
POOLS = [
    "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " \t\n\r  ",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~", "äöüßéèêàçñøåæœÄÖÜÉ", "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВ",
    "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΣΩ", "你好世界中文字符测试汉语", "ひらがなカタカナ", "한국어문자",
    "العربية", "עברית", "हिन्दी", "ไทย", "😀😃👍🏽❤️✨🤖🦀", "\x00\x01\x1b\x7f\u0085\u200b",
]

# Characters kept out of the training corpus: unknown to every vocabulary, so
# the unknown-token, fuse_unk and byte-fallback paths run.
UNSEEN = "ᚠᚢᚦᚨᚱᚲꦲꦏⴰⴱⴳᏣᎳᎩ∮∯∰⌘⌥♔♕♖🜁🜂ꙮ𐌰𐌱"

def make_strings(shakes):
    rnd = random.Random(15)
    lines = [l for l in shakes.split("\n") if l.strip()]
    out = list(CURATED)
    for _ in range(300):                      # Shakespeare slices, with line breaks
        i = rnd.randrange(len(shakes) - 200)
        out.append(shakes[i:i + rnd.randrange(1, 90)])
    for _ in range(700):                      # random mixtures
        parts = []
        for _ in range(rnd.randrange(1, 6)):
            k = rnd.random()
            if k < 0.3:
                parts.append(rnd.choice(lines)[:rnd.randrange(1, 40)])
            elif k < 0.45:
                parts.append(rnd.choice(CURATED))
            else:
                pool = rnd.choice(POOLS + [UNSEEN, UNSEEN + "abc "])
                parts.append("".join(rnd.choice(pool) for _ in range(rnd.randrange(1, 12))))
        out.append("".join(parts)[:80])
    return out

def corpus(shakes):
    return [shakes] + CURATED * 3 + ["".join(p) for p in POOLS] * 3

def byte_tokens():
    return ["<0x%02X>" % b for b in range(256)]

def with_bytes_in_vocab(tok, first, scores=None):
    """Insert <0x00>..<0xFF> into the model vocabulary at ids first.. (as
    Llama 2 / sentencepiece conversions have them), shifting later ids."""
    d = json.loads(tok.to_str())
    m = d["model"]
    if m["type"] == "BPE":
        v = sorted(m["vocab"].items(), key=lambda kv: kv[1])
        items = [k for k, _ in v if k not in byte_tokens()]
        items = items[:first] + byte_tokens() + items[first:]
        m["vocab"] = {k: i for i, k in enumerate(items)}
    else:                                     # Unigram: [piece, score] list
        items = [p for p in m["vocab"] if p[0] not in byte_tokens()]
        items = items[:first] + [[b, scores] for b in byte_tokens()] + items[first:]
        m["vocab"] = items
    m["byte_fallback"] = True
    return Tokenizer.from_str(json.dumps(d))

def train(kind, shakes):
    if kind in ("gpt2", "llama3", "qwen2", "smollm"):
        tok = Tokenizer(models.BPE(ignore_merges=kind in ("llama3", "qwen2")))
        if kind == "gpt2":
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        elif kind == "smollm":
            tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                         pre_tokenizers.ByteLevel(add_prefix_space=False)])
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(LLAMA3_RE if kind == "llama3" else QWEN2_RE), "isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        if kind == "qwen2":                   # as Qwen2's own tokenizer.json
            tok.normalizer = normalizers.NFC()
        tok.decoder = decoders.ByteLevel()
        specials = {"gpt2": ["<|endoftext|>"], "smollm": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                    "llama3": ["<|begin_of_text|>", "<|eot_id|>"], "qwen2": ["<|endoftext|>", "<|im_end|>"]}[kind]
        tr = trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False,
                                 initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(corpus(shakes), tr)
        tok.add_tokens([AddedToken("<|custom|>", normalized=False)])
        return tok
    if kind == "llama2":
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
        tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                         decoders.Fuse(), decoders.Strip(" ", 1, 0)])
        tr = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                 limit_alphabet=120, show_progress=False)
        tok.train_from_iterator(corpus(shakes), tr)
        return with_bytes_in_vocab(tok, 3)
    if kind == "mistral":                     # newer Llama 2 / Mistral files: Metaspace "first", no split
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tr = trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                 limit_alphabet=120, show_progress=False)
        tok.train_from_iterator(shakes.split("\n") + corpus(shakes)[1:], tr)
        tok = with_bytes_in_vocab(tok, 3)
        tok.add_tokens([AddedToken("<|custom|>", normalized=False)])
        return tok
    if kind in ("bert", "bert_uncased"):    # bert_uncased: strip_accents follows lowercase
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=24))
        tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                    strip_accents=None if kind == "bert_uncased" else False,
                                                    lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        tr = trainers.WordPieceTrainer(vocab_size=700, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
                                       limit_alphabet=150, show_progress=False)
        tok.train_from_iterator(corpus(shakes), tr)
        return tok
    if kind == "misc_bpe":                    # no decoder: the library joins tokens with spaces
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.normalizer = normalizers.Sequence([normalizers.Strip(), normalizers.Lowercase()])
        tok.pre_tokenizer = pre_tokenizers.Whitespace()
        tr = trainers.BpeTrainer(vocab_size=500, special_tokens=["[UNK]"], limit_alphabet=150, show_progress=False)
        tok.train_from_iterator(corpus(shakes), tr)
        return tok
    if kind == "misc_wp":
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.Sequence([normalizers.Replace("``", '"'), normalizers.Lowercase(),
                                               normalizers.Strip(left=False, right=True)])
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation(),
                                                     pre_tokenizers.Digits(individual_digits=False)])
        tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
        tr = trainers.WordPieceTrainer(vocab_size=500, special_tokens=["[UNK]", "[SEP]"], limit_alphabet=150,
                                       show_progress=False)
        tok.train_from_iterator(corpus(shakes), tr)
        return tok
    if kind in ("unigram", "unigram_bf"):
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always", split=True)
        tr = trainers.UnigramTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"], unk_token="<unk>",
                                     max_piece_length=12, show_progress=False)
        tok.train_from_iterator(corpus(shakes), tr)
        if kind == "unigram_bf":
            tok = with_bytes_in_vocab(tok, 3, -30.0)
        return tok
    raise ValueError(kind)

NAMES = ["gpt2", "llama3", "qwen2", "smollm", "llama2", "mistral", "bert", "bert_uncased", "misc_bpe", "misc_wp", "unigram", "unigram_bf"]

def main():
    shakes = open(SHAKES, encoding="utf-8").read()[:300000]
    strings = make_strings(shakes)
    os.makedirs(OUT, exist_ok=True)
    blob = bytearray(b"KNHT" + struct.pack("<III", 1, len(strings), len(NAMES)))
    for s in strings:
        b = s.encode("utf-8"); blob += struct.pack("<I", len(b)) + b
    for name in NAMES:
        tok = train(name, shakes)
        path = os.path.join(OUT, name + ".json")
        if name == "llama3":                  # a model directory, with tokenizer_config.json
            os.makedirs(os.path.join(OUT, "llama3"), exist_ok=True)
            path = os.path.join(OUT, "llama3", "tokenizer.json")
        js = tok.to_str()                     # compact: no indentation
        if name == "gpt2":                    # merges in the older "a b" string form
            d = json.loads(js)
            d["model"]["merges"] = [" ".join(m) for m in d["model"]["merges"]]
            js = json.dumps(d, ensure_ascii=False, separators=(",", ":"))
            tok = Tokenizer.from_str(js)      # the reference is what the library reads back
        with open(path, "w", encoding="utf-8") as f:
            f.write(js)
        nb = name.encode(); blob += struct.pack("<I", len(nb)) + nb
        n_ids = 0
        for s in strings:
            ids = tok.encode(s, add_special_tokens=False).ids
            assert max(ids, default=0) < 65536
            n_ids += len(ids)
            blob += struct.pack("<I", len(ids)) + struct.pack("<%dH" % len(ids), *ids)
            d = tok.decode(ids)
            if d == s: blob += b"\x01"
            else:
                db = d.encode("utf-8"); blob += b"\x00" + struct.pack("<I", len(db)) + db
        print("%-10s vocab %4d  %6d ids over %d strings" % (name, tok.get_vocab_size(), n_ids, len(strings)))
    with open(os.path.join(OUT, "llama3", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>", "special": True},
                   "add_bos_token": True, "chat_template": "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"}, f)
    with gzip.GzipFile(os.path.join(OUT, "ref.bin.gz"), "wb", mtime=0) as f:
        f.write(bytes(blob))

if __name__ == "__main__":
    main()
