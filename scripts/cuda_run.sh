#!/bin/sh
# cuda_run.sh: build + test + benchmark kiln's CUDA kernels in one go on a
# GPU machine (Hopper for the wgmma path). Prints a short table last.
#   sh scripts/cuda_run.sh [--quick|--tests|--build-only]   env: BUILD (default build-cudadev),
#   ARCH (default "-gencode=arch=compute_90a,code=sm_90a"), LOG (full log file),
#   KN_BENCH_ONLY (sections), KN_CUDA_TUNE (kernel variants, see
#   src/backends/cuda/tune.cuh; dev/cuda/variants.sh times several in one call)
set -e
BUILD=${BUILD:-build-cudadev}
ARCH=${ARCH:--gencode=arch=compute_90a,code=sm_90a}
NVCC=${NVCC:-nvcc}
mkdir -p "$BUILD"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader || true
"$NVCC" --version | tail -1
FLAGS="-O3 -std=c++17 -Iinclude -Isrc -Idev/cuda $ARCH"
pids=""
# the standalone kernels and their bench driver; the backend glue (cuda_backend.cu,
# cuda_ops_*.cu, the JIT, graphs, collectives, flash and paged attention) needs
# the whole library and is tested by scripts/cuda_test.sh
for f in src/backends/cuda/*.cu dev/cuda/kernels/*.cu dev/cuda/bench.cu; do
    case "$(basename "$f")" in
        cuda_backend.cu|cuda_ops_*.cu|cuda_jit.cu|cuda_graph.cu|cuda_dist.cu|cuda_paged_attn.cu|flash_attn.cu|flash_sm90.cu) continue ;;
    esac
    o="$BUILD/$(basename "$f" .cu).o"
    "$NVCC" $FLAGS --resource-usage -c "$f" -o "$o" > "$o.log" 2>&1 &
    pids="$pids $!"
done
cc -std=c11 -O2 -Iinclude -c src/core/status.c -o "$BUILD/status.o"
cc -std=c11 -O2 -Iinclude -Isrc -c src/core/dtype.c -o "$BUILD/dtype.o"   # kn_dtype_get (quantized GEMV, dequantize)
fail=0
for p in $pids; do wait "$p" || fail=1; done
if [ $fail -ne 0 ]; then cat "$BUILD"/*.o.log; echo "build failed"; exit 1; fi
grep -h -E "spill|Used" "$BUILD"/*.o.log | grep -v " 0 bytes spill stores, 0 bytes spill loads" | grep -i spill || true
"$NVCC" $ARCH -o "$BUILD/kn_cuda_bench" "$BUILD"/*.o -lcublas
if command -v cuobjdump >/dev/null 2>&1; then
    echo "SASS: HGMMA in gemm_bf16_sm90: $(cuobjdump --dump-sass "$BUILD/gemm_bf16_sm90.o" | grep -c HGMMA)," \
         "LDG.E.128 in sgemm: $(cuobjdump --dump-sass "$BUILD/sgemm.o" | grep -c 'LDG.E.128')," \
         "LDS.128 in sgemm: $(cuobjdump --dump-sass "$BUILD/sgemm.o" | grep -c 'LDS.128')," \
         "UTMALDG: $(cuobjdump --dump-sass "$BUILD/gemm_bf16_sm90.o" | grep -c UTMALDG)"
fi
# --build-only: compile and link, run nothing (CI, which has no GPU, checks
# that the standalone kernels still link without the library)
if [ "$1" = "--build-only" ]; then echo "built $BUILD/kn_cuda_bench"; exit 0; fi
if [ -n "$LOG" ]; then
    "$BUILD/kn_cuda_bench" "$@" 2>&1 | tee "$LOG"
else
    "$BUILD/kn_cuda_bench" "$@"
fi
