#!/bin/sh
# gpu_compiler_check.sh: on a GPU machine, the compiler's CUDA checks and
# numbers in one go (docs/COMPILER.md): generated-kernel tests with the CUDA
# backend, the fused-chain bandwidth bench (with the heuristic, then with a
# KN_BEAM=2 kernel search and its choices), and SmolLM2-shaped decode with
# fusion on and off in alternating rounds (random bf16 weights made with
# transformers: no model file needed).
#   sh scripts/gpu_compiler_check.sh [ROUNDS]      env: BUILD (default build-cuda, built beforehand
#   with `make CUDA=1 lib build-cuda/kiln build-cuda/tests/... build-cuda/bench/bench_fuse`,
#   test_search among the tests), OUT (logs)
BUILD=${BUILD:-build-cuda}
ROUNDS=${1:-5}
OUT=${OUT:-/tmp/kiln-gpu-check}
mkdir -p "$OUT"
export KN_CACHE_DIR=${KN_CACHE_DIR:-$OUT/kcache}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader
for t in test_cuda_jit test_fuse test_rewrite test_cuda_ops test_search; do
    [ -x "$BUILD/tests/$t" ] || { echo "$t: not built"; continue; }
    start=$(date +%s)
    KN_BACKEND=cuda timeout 300 "$BUILD/tests/$t" > "$OUT/$t.log" 2>&1
    echo "$t (KN_BACKEND=cuda): rc=$? $(tail -1 "$OUT/$t.log") ($(( $(date +%s) - start )) s)"
    grep -E "FAIL" "$OUT/$t.log" | head -5
done
KN_BACKEND=cuda "$BUILD/bench/bench_fuse" 64 7
# kernel search (docs/COMPILER.md, "Kernel search"): a cache of its own, so
# the first run searches every kernel (one `kiln: beam:` line each) and the
# second runs the choices; compare with the heuristic's run above
KN_CACHE_DIR=$OUT/kcache-beam KN_BEAM=2 KN_BACKEND=cuda "$BUILD/bench/bench_fuse" 64 7 2>&1 | grep "kiln: beam:"
KN_CACHE_DIR=$OUT/kcache-beam KN_BACKEND=cuda "$BUILD/bench/bench_fuse" 64 7
M=$OUT/smollm2-random
[ -f "$M/model.safetensors" ] || python3 scripts/make_random_smollm2.py "$M" > /dev/null
B="$BUILD/kiln bench -m $M --backend cuda --gpu-dtype bf16 --bench-prompt 512 -n 128 -r 3"
$B 2>&1 | tail -3                      # cold: compiles the generated kernels (timed apart below)
r=0
while [ $r -lt "$ROUNDS" ]; do
    echo "fused   $($B 2>/dev/null | awk -F'|' '/ pp512| tg128/ {gsub(/ /,"",$7); printf "%s ", $7}')"
    echo "nofuse  $(KN_NOFUSE=1 $B 2>/dev/null | awk -F'|' '/ pp512| tg128/ {gsub(/ /,"",$7); printf "%s ", $7}')"
    r=$((r + 1))
done > "$OUT/rounds.txt"
# medians with sort (mawk has no asort)
med() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
for k in fused nofuse; do
    pp=$(grep "^$k " "$OUT/rounds.txt" | awk '{print $2}' | med)
    tg=$(grep "^$k " "$OUT/rounds.txt" | awk '{print $3}' | med)
    echo "$k: pp512 $pp tg128 $tg tok/s (medians of $ROUNDS rounds; tg rounds: $(grep "^$k " "$OUT/rounds.txt" | awk '{printf "%.0f ", $3}'))"
done
