#!/bin/bash
# decode_switches.sh: one device call that checks and times decode-kernel
# switches (KN_CUDA_TUNE, src/backends/cuda/tune.cuh) against the defaults.
# First the CUDA test binaries with every switch of ALT set (they must pass
# as they do with the defaults), then SmolLM2-135M decode (random weights,
# bf16 and Q4_1 kept quantized) against compiled PyTorch in one process,
# rounds alternating: the defaults, all of ALT, and each setting of ALT
# alone, so that each one's gain or loss is read off one run. With L8=1, a
# Llama-3-8B-shaped bf16 model (written on the device, 16 GB) the same way,
# kiln only. Then, time left, an ncu listing of a Q4_1 step (defaults).
#   BIN=build-cuda ALT=gemv_early=0,sdpa_v4=0,qgemv_wr=0,pro_norm=30 L8=1 LIM=500 bash dev/cuda/decode_switches.sh
# Session 27 wrote gemv_early, sdpa_v4 and qgemv_wr off by default; session
# 28 ran them here and turned them on (docs/PERF.md). pro_norm=30 takes the
# RMS norm prologue into every decode GEMV (the default stops at N*K = 2^22).
# Needs the binaries built here (make CUDA=1 BUILD=build-cuda ...; kiln and
# tests/test_cuda_*), torch and transformers on the device, $OUT for logs.
BIN=${BIN:-build-cuda}
ALT=${ALT:-gemv_early=0,sdpa_v4=0,qgemv_wr=0,pro_norm=30}
LIM=${LIM:-500}
OUT=${OUT:-.}
t0=$(date +%s)
left() { echo $(( LIM - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for t in test_cuda_llm test_cuda_quant test_cuda_epilogue test_cuda_ops; do
    [ "$(left)" -lt 300 ] && { echo "skip $t (time)"; continue; }
    s=$(date +%s)
    KN_CUDA_TUNE=$ALT timeout 90 "$BIN/tests/$t" > "$OUT/$t.log" 2>&1
    echo "$t with $ALT: rc=$? $(tail -1 "$OUT/$t.log") ($(( $(date +%s) - s )) s)"
    grep -E "FAIL" "$OUT/$t.log" | head -8
done
python3 scripts/make_random_smollm2.py /tmp/smol > /dev/null 2>&1 &&
    "$BIN/kiln" quantize /tmp/smol /tmp/smol_q4_1.gguf q4_1 > /dev/null 2>&1 || { echo "no model"; exit 1; }
K=$BIN/kiln
B="--backend cuda --bench-prompt 512 -n 128 -r 3"
Q="-m /tmp/smol_q4_1.gguf --gpu-dtype file --backend cuda --bench-prompt 512"
args=(--kiln "$K bench -m /tmp/smol --gpu-dtype bf16 $B"
      --kiln "KN_CUDA_TUNE=$ALT $K bench -m /tmp/smol --gpu-dtype bf16 $B"
      --kiln "$K bench $Q -n 128 -r 3" --kiln "KN_CUDA_TUNE=$ALT $K bench $Q -n 128 -r 3")
IFS=, read -ra one <<< "$ALT"
for s in "${one[@]}"; do args+=(--kiln "KN_CUDA_TUNE=$s $K bench $Q -n 128 -r 3"); done
timeout $(( $(left) - 40 )) python3 scripts/bench_decode_torch.py --shape smollm2-135m --prompt 512 --gen 128 --rounds 3 \
    "${args[@]}" 2>&1 | tee "$OUT/decode.txt" | grep -E "^# " | tail -24
if [ "${L8:-0}" = 1 ] && [ "$(left)" -gt 120 ]; then
    # the peer's model class and shape, saved without compiling the peer
    python3 -c 'import sys, torch; sys.path.insert(0, "scripts"); import bench_decode_torch as b
torch.manual_seed(0); torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"): m = b.LlamaForCausalLM(b.llama3_8b()).eval()
m.save_pretrained("/tmp/l8", safe_serialization=True)' > /dev/null 2>&1 || echo "no 8B model"
    E="--backend cuda --gpu-dtype bf16 --bench-prompt 512 -n 128 -r 1"
    for r in 1 2; do
        for s in "" "$ALT" "${one[@]}"; do
            [ "$(left)" -lt 60 ] && break
            echo "8B round $r [${s:-defaults}]: $(KN_CUDA_TUNE=$s timeout 60 $K bench -m /tmp/l8 $E 2>&1 | grep -E '\| tg' | tr -s ' ')"
        done
    done
fi
if [ "$(left)" -gt 45 ]; then
    timeout $(( $(left) - 5 )) ncu -c 1300 --clock-control none --metrics gpu__time_duration.sum --csv \
        --log-file "$OUT/ncu_q41.csv" $K bench $Q -n 6 -r 1 > "$OUT/ncu_q41.out" 2>&1
    echo "ncu: rc=$? ($OUT/ncu_q41.csv: the last 182 kernels are one decode step)"
fi
echo "done in $(( $(date +%s) - t0 )) s"
