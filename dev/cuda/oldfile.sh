#!/bin/sh
# oldfile.sh: time an older version of one kernel file in the same device call
# as the current one. After scripts/cuda_run.sh has built $BUILD, compiles OLD
# (a copy of the older .cu, made beforehand with e.g.
# `git show REV:src/backends/cuda/topk.cu > old/topk.cu`) in place of its
# namesake, links $BUILD/kn_cuda_bench_old and runs the bench sections given.
#   sh dev/cuda/oldfile.sh old/topk.cu topk        (env: BUILD, ARCH, NVCC)
B=${BUILD:-build-cudadev}
ARCH=${ARCH:--gencode=arch=compute_90a,code=sm_90a}
NVCC=${NVCC:-nvcc}
old=$1; sec=$2
name=$(basename "$old" .cu)
mkdir -p "$B/old"      # not $B/*.o: scripts/cuda_run.sh links those
"$NVCC" -O3 -std=c++17 -Iinclude -Isrc -Idev/cuda $ARCH -c "$old" -o "$B/old/$name.o" || exit 1
objs=$(ls "$B"/*.o | grep -v "/$name.o\$")
"$NVCC" $ARCH -o "$B/kn_cuda_bench_old" $objs "$B/old/$name.o" -lcublas || exit 1
KN_BENCH_ONLY=$sec "$B/kn_cuda_bench_old"
