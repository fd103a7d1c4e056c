#!/bin/sh
# cuda_test.sh: on a GPU machine, build kiln with the CUDA backend and run
# the CUDA op tests (tests/test_cuda_ops.c: every op kind, ref vs GPU), the
# generated-kernel entries (tests/test_cuda_jit.c: NVRTC, kernel_run,
# syms_upload, the cubin cache), CUDA graphs (test_cuda_graph.c), matmul
# epilogues (test_cuda_epilogue.c), LLM inference on the GPU (test_cuda_llm.c,
# test_qwen.c, test_arch.c, test_moe.c: mixture of experts; test_moe_ops.c: TOPK, MUL_MAT_ID), flash attention, quantized weights and the fused loss
# (test_cuda_flash.c, test_cuda_quant.c, test_ce.c), fusion and mixed precision
# with the GPU as the default backend (test_fuse.c, test_precision.c), then
# the core test binaries on the default (cpu) backend with the CUDA build;
# paged attention and the batched engine (test_paged_attn.c, test_batch.c);
# `kiln serve` end to end with --backend cuda (tests/serve/e2e.py).
#   sh scripts/cuda_test.sh [LOGDIR]     env: BUILD (default build-cuda), JOBS (16)
#   NO_BUILD=1: run the binaries already in $BUILD (built elsewhere and carried).
# Prints one line per test binary and exits non-zero if any failed.
BUILD=${BUILD:-build-cuda}
JOBS=${JOBS:-16}
LOG=${1:-$BUILD/logs}
mkdir -p "$LOG"
export PATH="$PATH:/usr/local/cuda/bin"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | tee "$LOG/gpu.txt"
TESTS="test_cuda_ops test_ops_extra test_dist test_cuda_jit test_search test_cuda_graph test_cuda_epilogue test_cuda_llm test_cuda_flash test_cuda_quant test_ce test_qwen test_arch test_moe_ops test_moe test_epilogue test_core test_ops_math test_ops_index test_ops_nn test_ops_nn_grad test_vec test_gemm test_quant test_paged_attn test_batch"
# these run on the default backend: with KN_BACKEND=cuda they test the
# generated CUDA kernels (split reductions, column tiles, segments) and the
# mixed-precision policy on the GPU
ON_GPU="test_fuse test_precision"
TARGETS=""
for t in $TESTS $ON_GPU; do [ -f "tests/$t.c" ] && TARGETS="$TARGETS $BUILD/tests/$t"; done
if [ -z "$NO_BUILD" ] && ! make CUDA=1 BUILD="$BUILD" -j"$JOBS" lib $TARGETS > "$LOG/build.log" 2>&1; then
    grep -E "error|Error" "$LOG/build.log" | head -40
    echo "build failed (log: $LOG/build.log)"
    exit 1
fi
grep -i "warning" "$LOG/build.log" | head -20
fail=0
for t in $TESTS $ON_GPU; do
    [ -x "$BUILD/tests/$t" ] || continue
    start=$(date +%s)
    be=cpu
    case " $ON_GPU " in *" $t "*) be=cuda ;; esac
    KN_BACKEND=$be timeout 300 "$BUILD/tests/$t" > "$LOG/$t.log" 2>&1
    rc=$?
    echo "$t: rc=$rc $(tail -1 "$LOG/$t.log") ($(( $(date +%s) - start )) s)"
    [ $rc -ne 0 ] && fail=1
done
# the GEMM's matmul tests again under each forced variant of the wgmma
# kernel's plan (gemm_bf16_sm90.cu: the tile order's swaths, the tile
# widths, split-K, clusters), which the defaults pick only at sizes too big
# for the reference to check quickly
for v in gemm_swath=1 gemm_swath=3 gemm_bn=128 gemm_bn=192 gemm_bn=256 gemm_split=0 gemm_cluster=1; do
    [ -x "$BUILD/tests/test_cuda_ops" ] || break
    start=$(date +%s)
    KN_TEST_ONLY=matmul KN_CUDA_TUNE=$v timeout 300 "$BUILD/tests/test_cuda_ops" > "$LOG/test_cuda_ops.$v.log" 2>&1
    rc=$?
    echo "test_cuda_ops matmul, KN_CUDA_TUNE=$v: rc=$rc $(tail -1 "$LOG/test_cuda_ops.$v.log") ($(( $(date +%s) - start )) s)"
    [ $rc -ne 0 ] && fail=1
done
# kiln serve on the GPU: the end-to-end test (tests/serve/e2e.py) with
# --backend cuda on the server and on the `kiln generate` it compares with
# (f32 weights: its greedy texts are compared across batch compositions)
if make CUDA=1 BUILD="$BUILD" -j"$JOBS" "$BUILD/kiln" >> "$LOG/build.log" 2>&1; then
    start=$(date +%s)
    KN_SERVE_ARGS="--backend cuda --gpu-dtype f32" BUILD="$BUILD" timeout 600 python3 tests/serve/e2e.py > "$LOG/serve_e2e.log" 2>&1
    rc=$?
    echo "serve_e2e (cuda): rc=$rc $(tail -1 "$LOG/serve_e2e.log") ($(( $(date +%s) - start )) s)"
    [ $rc -ne 0 ] && fail=1
else
    echo "serve_e2e (cuda): build of $BUILD/kiln failed (log: $LOG/build.log)"; fail=1
fi
exit $fail
