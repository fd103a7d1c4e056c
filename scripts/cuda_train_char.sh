#!/bin/bash
# cuda_train_char.sh: on a GPU machine, train the character-level GPT on
# tinyshakespeare through the CUDA backend (docs/PERF-train-gpu.md).
#
# Prepare (on a machine with nvcc; the binaries need no build on the GPU host):
#   make CUDA=1 BUILD=build-cuda -j && mkdir -p build-gpu
#   cp build-cuda/kiln build-cuda/tests/test_cuda_ops build-gpu/
#   cp ../shared/assets/datasets/tinyshakespeare/input.txt build-gpu/
# Run (logs under $OUT, default ./cuda-char-logs):
#   bash scripts/cuda_train_char.sh [L C H T B LR TRAIN_S STEPS]
# Steps: the op tests (stop if they fail), a per-node trace of 2 steps
# (KN_CUDA_TRACE, top 25 node kinds), a synced per-op profile of 5 steps
# (KN_PROFILE with KN_CUDA_SYNC), a 30-step speed probe, then the run: STEPS
# steps, or as many as fit TRAIN_S seconds at the probe's speed; evals every
# tenth of the run, a 500-character sample at the end. Last, the CPU run's
# small configuration (docs/PERF-train.md) for its speed.
D=${D:-build-gpu}
OUT=${OUT:-cuda-char-logs}
mkdir -p "$OUT"
L=${1:-6}; C=${2:-384}; H=${3:-6}; T=${4:-256}; B=${5:-64}; LR=${6:-1e-3}; TRAIN_S=${7:-360}; FIXED=${8:-0}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 150 $D/test_cuda_ops > $OUT/ops.log 2>&1; rc=$?
echo "test_cuda_ops rc=$rc $(tail -1 $OUT/ops.log)"
if [ $rc -ne 0 ]; then grep -iB2 -A3 "fail" $OUT/ops.log | head -40; exit 1; fi
export KN_BACKEND=cuda
M="--data $D/input.txt --layers $L --dim $C --heads $H --ctx $T --batch $B --lr $LR"
KN_CUDA_TRACE=1 timeout 100 $D/kiln train char $M --steps 2 --eval-every 1000 --eval-batches 1 \
    --sample-every 1000 --sample-len 1 --log-every 1 2> $OUT/trace.log > /dev/null
echo "trace: $(grep -c cuda-trace $OUT/trace.log) nodes; top node kinds (op, dst) by time over 2 steps:"
grep cuda-trace $OUT/trace.log | awk '{k=$2" "$5; t[k]+=$3; n[k]++} END {for (k in t) printf "%10.0f us %5d  %s\n", t[k], n[k], k}' \
    | sort -rn | head -25
KN_PROFILE=1 KN_CUDA_SYNC=1 timeout 100 $D/kiln train char $M --steps 5 --eval-every 1000 --eval-batches 1 \
    --sample-every 1000 --sample-len 10 --log-every 1 > $OUT/prof.log 2>&1
sed -n "/kiln profile/,\$p" $OUT/prof.log | head -12
timeout 100 $D/kiln train char $M --steps 30 --eval-every 1000 --eval-batches 1 --sample-every 1000 --sample-len 10 \
    --log-every 10 > $OUT/speed.log 2>&1
grep -E "^(char: GPT|step|done)" $OUT/speed.log
TOKS=$(sed -n 's/^done: .* \([0-9]*\) tok\/s.*/\1/p' $OUT/speed.log)
[ -z "$TOKS" ] && { tail -5 $OUT/speed.log; exit 1; }
STEPS=$(( TRAIN_S * TOKS / (B * T) ))
[ $STEPS -gt 5000 ] && STEPS=5000
[ $FIXED -gt 0 ] && STEPS=$FIXED
EV=$(( STEPS / 10 )); [ $EV -lt 1 ] && EV=1
echo "== $TOKS tok/s -> $STEPS steps, eval every $EV"
set -o pipefail
timeout $(( TRAIN_S + 150 )) /usr/bin/time -f "wall %e s" $D/kiln train char $M --steps $STEPS --eval-every $EV \
    --eval-batches 4 --sample-every $STEPS --sample-len 500 --log-every 50 --out /tmp/char.safetensors 2>&1 \
    | tee $OUT/train.log | grep -v "^step"
echo "rc=$?"
timeout 60 $D/kiln train char --data $D/input.txt --layers 4 --dim 128 --heads 4 --ctx 64 --batch 16 --steps 200 \
    --lr 3e-3 --clip 0 --eval-every 1000 --eval-batches 1 --sample-every 1000 --sample-len 10 --log-every 100 > $OUT/small.log 2>&1
grep -E "^(char: GPT|done)" $OUT/small.log
