#!/bin/sh
# make_random_llm_gguf.sh: a llama-architecture GGUF of a real model's shape
# with random weights (issue 12: large-model benchmarks on a GPU machine that
# can download nothing; values do not change speed). Builds dev/quant/rand_gguf
# against the library of BUILD (default build) when needed.
#   sh scripts/make_random_llm_gguf.sh SHAPE TYPE OUT.gguf
#   SHAPE: llama2-7b | llama3-8b | llama3.2-1b | smollm2-135m
#   TYPE:  bf16 | f16 | q8_0 | q4_0 | q4_1 | q5_0 | q5_1 | q4_k | q5_k | q6_k | q4_k_m
# Sizes: llama2-7b bf16 13.5 GB, q8_0 7.2 GB, q4_0 3.8 GB; llama3-8b bf16 16.1 GB.
set -e
[ $# -eq 3 ] || { sed -n '2,10p' "$0"; exit 2; }
case "$1" in
    llama2-7b)    DIMS="4096 32 32 32 11008 32000" ;;
    llama3-8b)    DIMS="4096 32 32 8 14336 128256" ;;
    llama3.2-1b)  DIMS="2048 16 32 8 8192 128256" ;;
    smollm2-135m) DIMS="576 30 9 3 1536 49152" ;;
    *) echo "make_random_llm_gguf.sh: unknown shape '$1' (llama2-7b, llama3-8b, llama3.2-1b, smollm2-135m)" >&2; exit 2 ;;
esac
BUILD=${BUILD:-build}
TOOL=$BUILD/dev/rand_gguf
if [ ! -x "$TOOL" ] || [ dev/quant/rand_gguf.c -nt "$TOOL" ] || [ "$BUILD/libkiln.a" -nt "$TOOL" ]; then
    [ -f "$BUILD/libkiln.a" ] || make -s BUILD="$BUILD" lib
    mkdir -p "$BUILD/dev"
    EXTRA=""
    case "$BUILD" in *cuda*) EXTRA="-L${CUDA_HOME:-/usr/local/cuda}/lib64 -lcudart -lcublas -lnvrtc -lstdc++" ;; esac
    ${CC:-cc} -std=c11 -O2 -fopenmp -Iinclude -Isrc dev/quant/rand_gguf.c "$BUILD/libkiln.a" -lm -lpthread -lz $EXTRA -o "$TOOL"
fi
# shellcheck disable=SC2086
"$TOOL" "$3" "$2" $DIMS
