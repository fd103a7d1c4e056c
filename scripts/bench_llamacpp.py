#!/usr/bin/env python3
"""bench_llamacpp.py: prefill and decode tokens/s of llama.cpp (through the
llama-cpp-python package, which builds llama.cpp from source) on a GGUF
model, with the same token pattern, sizes and thread count as `kiln bench`.
Prints one line: "llama.cpp pp<N> <tok/s> tg<M> <tok/s>" (medians).

usage: python3 scripts/bench_llamacpp.py MODEL N_PROMPT N_GEN THREADS REPS
install: CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-binary llama-cpp-python llama-cpp-python
(on a VM whose CPU reports AMX but faults on its tiles, as this one for
Q4_0/Q8_0: -DGGML_NATIVE=OFF with the AVX2/AVX512*/AVX_VNNI switches on and
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF; docs/PERF.md)
"""
import statistics, sys, time

from llama_cpp import Llama


def main():
    model, n_prompt, n_gen, threads, reps = sys.argv[1], *map(int, sys.argv[2:6])
    llm = Llama(model_path=model, n_ctx=n_prompt + n_gen + 16, n_batch=512, n_ubatch=512, n_threads=threads,
                n_threads_batch=threads, verbose=False)
    V = llm.n_vocab()
    prompt = [(i * 7919 + 13) % V for i in range(n_prompt)]
    gen = [(i * 31 + 7) % V for i in range(n_gen)]
    pp, tg = [], []
    llm.eval(prompt[:8])                      # warm-up
    for _ in range(reps):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        pp.append(n_prompt / (time.perf_counter() - t0))
        llm.reset()                           # decode from an empty context, like llama-bench's tg test
        t0 = time.perf_counter()
        for t in gen:
            llm.eval([t])
        tg.append(n_gen / (time.perf_counter() - t0))
    print(f"llama.cpp pp{n_prompt} {statistics.median(pp):.2f} tg{n_gen} {statistics.median(tg):.2f}")


if __name__ == "__main__":
    main()
