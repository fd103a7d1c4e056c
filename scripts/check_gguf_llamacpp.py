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


def run(llama_cpp, path, tokens):
    """Logits [len(tokens), n_vocab] through llama.cpp's C API. The CPU's
    extra buffer types (AMX / repacked weights) are off unless
    KN_LLAMACPP_EXTRA_BUFTS=1: on a CPU whose kernel does not grant AMX
    tiles, ggml's AMX kernels for Q4_0/Q8_0 die of an illegal instruction."""
    import ctypes, os
    global _quiet                  # llama.cpp's log lines would bury the error message on stderr
    _quiet = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(_quiet, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params()
    if hasattr(mp, "use_extra_bufts"):
        mp.use_extra_bufts = os.environ.get("KN_LLAMACPP_EXTRA_BUFTS") == "1"
    model = llama_cpp.llama_model_load_from_file(path.encode(), mp)
    if not model:
        raise RuntimeError("the model does not load")
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = max(len(tokens), 8)
    cp.n_threads = cp.n_threads_batch = 1
    if os.environ.get("KN_LLAMACPP_KV_F32") == "1":   # exact K/V (llama.cpp's default cache is f16)
        cp.type_k = cp.type_v = 0
    ctx = llama_cpp.llama_init_from_model(model, cp)
    if not ctx:
        raise RuntimeError("no context")
    n = len(tokens)
    batch = llama_cpp.llama_batch_init(n, 0, 1)
    for i, t in enumerate(tokens):
        batch.token[i] = t
        batch.pos[i] = i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = 1
    batch.n_tokens = n
    if llama_cpp.llama_decode(ctx, batch) != 0:
        raise RuntimeError("llama_decode failed")
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    scores = []
    for i in range(n):
        lg = llama_cpp.llama_get_logits_ith(ctx, i)
        scores.append([lg[v] for v in range(n_vocab)])
    llama_cpp.llama_batch_free(batch)
    llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return scores, n_vocab


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
        scores, n_vocab = run(llama_cpp, path, tokens)
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
