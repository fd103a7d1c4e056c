#!/bin/bash
# decode_switches.sh: one device call that checks and times decode-kernel
# switches that are off by default until a GPU has run them (KN_CUDA_TUNE,
# src/backends/cuda/tune.cuh). First the CUDA test binaries with every
# switch on (they must pass as they do with the defaults), then SmolLM2-135M
# decode (random weights, bf16 and Q4_1 kept quantized) against compiled
# PyTorch in one process, rounds alternating: the defaults, all switches on,
# and each switch on alone, so that each one's gain is read off one run.
# Then, time left, an ncu listing of a Q4_1 step at a 512-token context.
#   BIN=build-cuda ON=gemv_early=1,sdpa_v4=1,qgemv_wr=2 LIM=400 bash dev/cuda/decode_switches.sh
# Needs the binaries built here (make CUDA=1 BUILD=build-cuda ...; kiln and
# tests/test_cuda_*), torch and transformers on the device, $OUT for logs.
BIN=${BIN:-build-cuda}
ON=${ON:-gemv_early=1,sdpa_v4=1,qgemv_wr=2}
LIM=${LIM:-500}
OUT=${OUT:-.}
t0=$(date +%s)
left() { echo $(( LIM - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in test_cuda_llm test_cuda_quant test_cuda_epilogue test_cuda_ops; do
    [ "$(left)" -lt 300 ] && { echo "skip $t (time)"; continue; }
    s=$(date +%s)
    KN_CUDA_TUNE=$ON timeout 90 "$BIN/tests/$t" > "$OUT/$t.log" 2>&1
    echo "$t with $ON: rc=$? $(tail -1 "$OUT/$t.log") ($(( $(date +%s) - s )) s)"
    grep -E "FAIL" "$OUT/$t.log" | head -8
done
python3 scripts/make_random_smollm2.py /tmp/smol > /dev/null 2>&1 &&
    "$BIN/kiln" quantize /tmp/smol /tmp/smol_q4_1.gguf q4_1 > /dev/null 2>&1 || { echo "no model"; exit 1; }
K=$BIN/kiln
B="--backend cuda --bench-prompt 512 -n 128 -r 3"
Q="-m /tmp/smol_q4_1.gguf --gpu-dtype file --backend cuda --bench-prompt 512"
args=(--kiln "$K bench -m /tmp/smol --gpu-dtype bf16 $B"
      --kiln "KN_CUDA_TUNE=$ON $K bench -m /tmp/smol --gpu-dtype bf16 $B"
      --kiln "$K bench $Q -n 128 -r 3" --kiln "KN_CUDA_TUNE=$ON $K bench $Q -n 128 -r 3")
IFS=, read -ra one <<< "$ON"
for s in "${one[@]}"; do args+=(--kiln "KN_CUDA_TUNE=$s $K bench $Q -n 128 -r 3"); done
timeout $(( $(left) - 40 )) python3 scripts/bench_decode_torch.py --shape smollm2-135m --prompt 512 --gen 128 --rounds 3 \
    "${args[@]}" 2>&1 | tee "$OUT/decode.txt" | grep -E "^# " | tail -24
if [ "$(left)" -gt 45 ]; then
    KN_CUDA_TUNE=$ON timeout $(( $(left) - 5 )) ncu -c 1300 --clock-control none --metrics gpu__time_duration.sum --csv \
        --log-file "$OUT/ncu_q41.csv" $K bench $Q -n 6 -r 1 > "$OUT/ncu_q41.out" 2>&1
    echo "ncu: rc=$? ($OUT/ncu_q41.csv: the last 182 kernels are one decode step)"
fi
echo "done in $(( $(date +%s) - t0 )) s"
