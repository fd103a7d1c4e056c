#!/bin/sh
# trace_train.sh: why bf16 GPT-2 training on the GPU measured slower with the
# fused cross-entropy (35.7k tok/s) than with the composite (KN_CE_COMPOSITE=1,
# 40.2k tok/s) on an H200 on 2026-11-28, while bench_ce measured the loss
# block itself 16.8x faster and the classifier block (with its three
# matmuls) 4.4x faster (docs/PERF.md, "Fused cross-entropy"). Not run yet:
# the session's device time ran out. Run from the repo root after
# `make CUDA=1 build-cuda/kiln build-cuda/bench/bench_ce`:
#
#   sh dev/cuda/ce/trace_train.sh [OUTDIR]
#
# It prints, for 3 steps of each variant, the device time per op and the 12
# costliest (op, shapes) from KN_CUDA_TRACE (every node alone between two
# events, no graph replay), then tok/s of the variants that would isolate a
# cause: KN_CUDA_GRAPH=0 (a capture that fails only for the fused plan?),
# KN_CUDA_NO_WGMMA=1 (the dlogits matmuls on the wgmma path?) and KN_NOFUSE=1
# (the fused plan keeps 16 more groups fused than the composite's arena rule
# lets it: dev/cuda/ce/plan_cuda_nogpu.c prints both plans without a GPU).
O=${1:-/tmp/ce_trace}; mkdir -p $O
export KN_BACKEND=cuda KN_ASSETS=${KN_ASSETS:-../shared/assets}
B="train gpt2 --data ${KN_DATA:-../shared/assets/datasets/tinyshakespeare/input.txt} --layers 12 --dim 768 --heads 12 --ctx 1024 --batch 8 --full-vocab 1 --eval-every 0 --eval-batches 1 --sample-len 0 --warmup 2 --precision bf16"
summ() { awk '/^cuda-trace/ {s[$2]+=$3; n[$2]++; t+=$3} END {for (k in s) printf "%-18s %6d %10.1f ms\n", k, n[k], s[k]/1e3; printf "TOTAL %.1f ms\n", t/1e3}' $1 | sort -k3 -n -r | head -n 16; }
tops() { awk '/^cuda-trace/ {k=$2" "$5" "$7" "$8; s[k]+=$3; n[k]++} END {for (k in s) printf "%9.1f ms %4d  %s\n", s[k]/1e3, n[k], k}' $1 | sort -n -r | head -n 12; }
echo "== trace fused"; KN_CUDA_TRACE=1 build-cuda/kiln $B --steps 3 > $O/trace_fused.log 2>&1; echo "rc $?"; summ $O/trace_fused.log; tops $O/trace_fused.log
echo "== trace composite"; KN_CE_COMPOSITE=1 KN_CUDA_TRACE=1 build-cuda/kiln $B --steps 3 > $O/trace_comp.log 2>&1; echo "rc $?"; summ $O/trace_comp.log; tops $O/trace_comp.log
for v in "KN_CUDA_GRAPH=0" "KN_CUDA_NO_WGMMA=1" "KN_NOFUSE=1"; do
    echo "== $v fused"; env $v build-cuda/kiln $B --steps 14 2>&1 | grep "^done"
    echo "== $v composite"; env $v KN_CE_COMPOSITE=1 build-cuda/kiln $B --steps 14 2>&1 | grep "^done"
done
echo "== bench_ce traced"; KN_CUDA_TRACE=1 build-cuda/bench/bench_ce > $O/trace_bench.log 2>&1; grep -v "^cuda-trace" $O/trace_bench.log | tail -n 8; tops $O/trace_bench.log
