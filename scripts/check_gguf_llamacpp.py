#!/usr/bin/env python3
"""check_gguf_llamacpp.py: load a GGUF file with llama.cpp (through
llama-cpp-python) and print the logits it computes for given token ids, so
that a test can compare them with kiln's.

    python3 scripts/check_gguf_llamacpp.py MODEL.gguf 0,5,17,3

Output (stdout): one line "n_vocab N", then one line per token position with
its N logits (space separated, %.9g). Exit status: 0 ok, 1 the file does not
load or evaluate, 2 usage, 3 llama_cpp is not installed (a test skips then).
"""
import sys


def main():
    if len(sys.argv) != 3:
        sys.stderr.write("usage: check_gguf_llamacpp.py MODEL.gguf ID[,ID...]\n")
        return 2
    path, ids = sys.argv[1], sys.argv[2]
    try:
        tokens = [int(t) for t in ids.split(",")]
    except ValueError:
        sys.stderr.write("check_gguf_llamacpp.py: token ids must be integers separated by commas, got %r\n" % ids)
        return 2
    try:
        import llama_cpp
    except ImportError as e:
        sys.stderr.write("check_gguf_llamacpp.py: llama_cpp is not importable (%s); pip install llama-cpp-python\n" % e)
        return 3
    try:
        llm = llama_cpp.Llama(model_path=path, n_ctx=len(tokens), n_batch=len(tokens), logits_all=True,
                              n_threads=1, verbose=False)
        llm.eval(tokens)
        scores = llm.scores[: len(tokens)]
        n_vocab = llm.n_vocab()
    except Exception as e:  # llama.cpp reports load failures as exceptions
        sys.stderr.write("check_gguf_llamacpp.py: llama.cpp cannot run %s: %s\n" % (path, e))
        return 1
    out = sys.stdout
    out.write("n_vocab %d\n" % n_vocab)
    for row in scores:
        out.write(" ".join("%.9g" % float(x) for x in row[:n_vocab]))
        out.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
