#!/usr/bin/env python3
"""tokenize_llamacpp.py: tokenize test strings with llama.cpp's own tokenizer
(llama-cpp-python, the GGUF's vocabulary only) and compare with expected ids.

    python3 scripts/tokenize_llamacpp.py MODEL.gguf REF.txt COLUMN

REF.txt: lines "HEX ids ids ..." as scripts/convert_spm_ref.py writes them
(HEX: the string's UTF-8 bytes, "-" for empty; ids comma separated, "-" for
none); COLUMN (0-based) picks the ids to compare with. Each string is
tokenized with add_special=False, parse_special=True (special tokens
written in the text are matched, as transformers does). Output (stdout): a
line "DIFF HEX llama.cpp=.. want=.." per string that differs, then "strings
N same S". Exit status: 0 ran (the caller judges the counts), 1 the file does
not load, 2 usage, 3 llama_cpp is not installed.
"""
import ctypes, sys


def main():
    if len(sys.argv) != 4:
        sys.stderr.write("usage: tokenize_llamacpp.py MODEL.gguf REF.txt COLUMN\n")
        return 2
    path, ref, col = sys.argv[1], sys.argv[2], int(sys.argv[3])
    try:
        import llama_cpp
    except ImportError as e:
        sys.stderr.write("tokenize_llamacpp.py: llama_cpp is not importable (%s); pip install llama-cpp-python\n" % e)
        return 3
    quiet = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    mp.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
    if not model:
        sys.stderr.write("tokenize_llamacpp.py: llama.cpp cannot load %s\n" % path)
        return 1
    vocab = llama_cpp.llama_model_get_vocab(model)
    n = same = 0
    with open(ref) as f:
        for line in f:
            parts = line.split()
            if len(parts) <= col + 1:
                continue
            text = b"" if parts[0] == "-" else bytes.fromhex(parts[0])
            want = [] if parts[col + 1] == "-" else [int(x) for x in parts[col + 1].split(",")]
            cap = 4 * len(text) + 8
            buf = (llama_cpp.llama_token * cap)()
            k = llama_cpp.llama_tokenize(vocab, text, len(text), buf, cap, False, True)
            got = list(buf[:k]) if k >= 0 else ["error %d" % k]
            n += 1
            if got == want:
                same += 1
            else:
                print("DIFF %s llama.cpp=%s want=%s" % (parts[0], ",".join(map(str, got)), ",".join(map(str, want))))
    llama_cpp.llama_model_free(model)
    print("strings %d same %d" % (n, same))
    return 0


if __name__ == "__main__":
    sys.exit(main())
