#!/usr/bin/env python3
"""ppl_llamacpp.py: llama.cpp's perplexity of a text, through llama-cpp-python,
for comparison with `kiln perplexity`.

    python3 scripts/ppl_llamacpp.py -m models/SmolLM2-135M-Instruct.Q4_1.gguf \
        -f ../shared/assets/datasets/tinyshakespeare/input.txt --bytes 8192 --ctx 128 [--stride 32]

It rebuilds what llama.cpp's perplexity tool (tools/perplexity/perplexity.cpp)
does, on llama.cpp's own tokenizer and forward pass:
  - the whole text is tokenized with add_special = true (BOS only when the
    model's tokenizer.ggml.add_bos_token says so) and no special-token parsing;
  - default (stride 0): windows of CTX tokens side by side, n // CTX of them;
    each is evaluated from an empty cache with its first token replaced by
    BOS when the model adds BOS, and the tokens at positions CTX/2+1 .. CTX-1
    are scored;
  - --stride S (llama-perplexity --ppl-stride S): ceil((n - CTX) / S) windows
    starting every S tokens, the last S tokens of each scored (llama.cpp
    writes BOS into its token list only after that window was evaluated, so
    no BOS is substituted);
  - perplexity = exp(mean of -log softmax(logits)[next token]), the softmax
    taken in float64 here.
Prints the settings and the result as "key value" lines (the format of
tests/fixtures/ppl_*.txt). Unlike llama-perplexity it does not insist on
2*CTX tokens: one window is enough.
"""
import argparse
import math
import sys

import numpy as np


def log_softmax_nll(logits, targets):
    """sum of -log softmax(row)[target] over rows, float64"""
    x = np.asarray(logits, dtype=np.float64)
    mx = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - mx).sum(axis=1)) + mx[:, 0]
    return float((lse - x[np.arange(len(targets)), targets]).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("--bytes", type=int, default=0, help="use only the first N bytes of the file (0 = all)")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--stride", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    try:
        from llama_cpp import Llama
        import llama_cpp
    except ImportError:
        sys.exit("ppl_llamacpp.py: llama-cpp-python is not installed (pip install llama-cpp-python)")
    # ggml's AMX / repacked-weight buffers die of an illegal instruction on a
    # CPU whose kernel does not grant AMX tiles (Q4_0/Q8_0 files here); off
    # unless KN_LLAMACPP_EXTRA_BUFTS=1 (the results are the same numbers)
    import os
    _defaults = llama_cpp.llama_cpp.llama_model_default_params

    def _model_params():
        p = _defaults()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = os.environ.get("KN_LLAMACPP_EXTRA_BUFTS") == "1"
        return p
    llama_cpp.llama_cpp.llama_model_default_params = _model_params

    data = open(a.file, "rb").read()
    if a.bytes:
        data = data[: a.bytes]
    C, S = a.ctx, a.stride
    llm = Llama(model_path=a.model, n_ctx=C, n_batch=C, n_ubatch=C, logits_all=True,
                n_threads=a.threads, n_threads_batch=a.threads, verbose=False)
    add_bos = llm._model.add_bos_token() if hasattr(llm._model, "add_bos_token") else None
    bos = llm.token_bos()
    # add_bos=True here means llama_tokenize's add_special: BOS only if the
    # model asks for it, as common_tokenize(ctx, text, true) in llama.cpp
    toks = llm.tokenize(data, add_bos=True, special=False)
    n = len(toks)
    if add_bos is None:
        add_bos = n > 0 and toks[0] == bos
    if S == 0:
        first = C // 2
        starts = [i * C for i in range(n // C)]
    else:
        assert 0 < S < C, "stride must be in 1 .. ctx-1"
        first = C - S - 1
        starts = [i * S for i in range(max(0, (n - C + S - 1) // S))] if n > C else []
    if not starts:
        sys.exit(f"ppl_llamacpp.py: {n} tokens are too few for a context of {C}")
    nll, count = 0.0, 0
    for start in starts:
        win = list(toks[start:start + C])
        if S == 0 and add_bos:
            win[0] = bos
        llm.reset()
        llm.eval(win)
        logits = np.array(llm.scores[:C], dtype=np.float32)   # one row per position
        rows = logits[first:C - 1]
        nll += log_softmax_nll(rows, np.array(win[first + 1:C]))
        count += C - 1 - first
    print(f"model {a.model.split('/')[-1]}")
    print(f"text {a.file.split('/')[-2] + '/' + a.file.split('/')[-1] if '/' in a.file else a.file}")
    print(f"bytes {len(data)}")
    print(f"ctx {C}")
    print(f"stride {S}")
    print(f"add_bos {int(bool(add_bos))}")
    print(f"tokens {n}")
    print(f"windows {len(starts)}")
    print(f"scored {count}")
    print(f"llama_cpp_python {llama_cpp.__version__}")
    print(f"perplexity {math.exp(nll / count):.6f}")


if __name__ == "__main__":
    main()
