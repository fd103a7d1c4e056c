#!/bin/sh
# bench_cpu.sh: issue 17's CPU comparisons in one run, each kiln against its
# peer at its best, alternating in rounds (medians):
#   1. f32 decode of llama2.c checkpoints (stories260K, a stories15M-shaped
#      one with random weights) against llama2.c's `run` (1 thread) and
#      `runomp` (2 threads); give their paths in L2C_RUN / L2C_RUNOMP (build
#      them in a llama2.c checkout: gcc -O3 -march=native -ffast-math [-fopenmp]
#      run.c -lm; nothing of llama2.c is in this repository). Skipped without.
#   2. quantized decode and prefill, SmolLM2-135M as Q4_1 (the file), Q4_0 and
#      Q8_0 (requantized by kiln quantize --allow-requantize --pure), against
#      llama.cpp (scripts/bench_llm.sh, llama-cpp-python built with GGML_NATIVE=ON).
#   3. training: bench/bench_train -c (PyTorch with fused AdamW, eager and
#      torch.compile, the faster counted).
# Usage: [ROUNDS=3] [KN_ASSETS=../shared/assets] sh scripts/bench_cpu.sh [OUT_DIR]
set -eu
OUT=${1:-/tmp/kiln-bench-cpu}
ROUNDS=${ROUNDS:-3}
A=${KN_ASSETS:-../shared/assets}
mkdir -p "$OUT"
make -s build/kiln build/bench/bench_train
echo "== $(date -u '+%Y-%m-%d %H:%M UTC'), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), load $(cut -d' ' -f1-3 /proc/loadavg)"

median() { printf '%s\n' "$@" | sort -g | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
tg() { ./build/kiln bench -m "$1" -z "$2" -p 1 -n "$3" -r 3 -t "$4" | awk -F'|' '/ tg/ {gsub(/ /,"",$7); print $7}'; }

echo "== 1. f32 decode, llama2.c checkpoints (tok/s, median of $ROUNDS rounds)"
[ -f "$OUT/stories15M-random.bin" ] || python3 scripts/make_random_llama2c.py "$OUT/stories15M-random.bin"
if [ -n "${L2C_RUN:-}" ] && [ -x "$L2C_RUN" ] && [ -n "${L2C_RUNOMP:-}" ] && [ -x "$L2C_RUNOMP" ]; then
    echo "| model | threads | kiln | llama2.c | kiln / llama2.c |"
    echo "|---|---|---|---|---|"
    for m in "$A/llama2c/stories260K.bin $A/llama2c/tok512.bin 512" "$OUT/stories15M-random.bin $A/llama2c/tokenizer.bin 256"; do
        set -- $m
        for t in 1 2; do
            ks=; ls=; r=0
            while [ $r -lt "$ROUNDS" ]; do
                ks="$ks $(tg "$1" "$2" $(($3 - 1)) $t)"
                if [ $t = 1 ]; then l=$("$L2C_RUN" "$1" -z "$2" -n "$3" -t 0 2>&1 | awk '/achieved/ {print $3}')
                else l=$(OMP_NUM_THREADS=2 "$L2C_RUNOMP" "$1" -z "$2" -n "$3" -t 0 2>&1 | awk '/achieved/ {print $3}'); fi
                ls="$ls $l"; r=$((r + 1))
            done
            k=$(median $ks); l=$(median $ls)
            echo "| $(basename "$1") | $t | $k | $l | $(awk -v a="$k" -v b="$l" 'BEGIN { printf "%.2fx", a / b }') |"
            echo "  rounds: kiln$ks / llama2.c$ls" >&2
        done
    done
else
    echo "L2C_RUN / L2C_RUNOMP not set: llama2.c comparison skipped (kiln alone):"
    for t in 1 2; do echo "  stories260K $t threads: $(tg "$A/llama2c/stories260K.bin" "$A/llama2c/tok512.bin" 511 $t) tok/s"; done
fi

echo "== 2. quantized decode / prefill vs llama.cpp"
M=models/SmolLM2-135M-Instruct.Q4_1.gguf
[ -f "$M" ] || sh scripts/fetch_model.sh
for q in q4_0 q8_0; do
    [ -f "$OUT/smollm2-$q.gguf" ] || ./build/kiln quantize --allow-requantize --pure "$M" "$OUT/smollm2-$q.gguf" $q >/dev/null
done
for f in "$M" "$OUT/smollm2-q4_0.gguf" "$OUT/smollm2-q8_0.gguf"; do
    ROUNDS=$ROUNDS sh scripts/bench_llm.sh "$f" 2 128 64 3 | tail -2
done

echo "== 3. training vs PyTorch at its best"
./build/bench/bench_train -t 2 -s 40 -r "$ROUNDS" -c
