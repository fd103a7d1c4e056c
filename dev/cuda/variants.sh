#!/bin/sh
# variants.sh: one device call that builds and runs the bench once
# (scripts/cuda_run.sh, sections from KN_BENCH_ONLY), then re-runs single
# sections under KN_CUDA_TUNE variants (src/backends/cuda/tune.cuh), so that
# several versions of a kernel are timed in one build. Each argument is
# "sections:key=value[,key=value]". Logs go to $OUTDIR; tables are printed.
#   OUTDIR=$OUT KN_BENCH_ONLY=gemv,topk sh dev/cuda/variants.sh "gemv:gemv_u=8" "topk:topk_cl=16"
B=${BUILD:-build-cudadev}
O=${OUTDIR:-.}
mkdir -p "$O"
# a hung kernel must not eat the lease: the main run gets 300 s, each variant 120 s
LOG=$O/main.log timeout 300 sh scripts/cuda_run.sh > /dev/null 2>&1
echo "main run: exit $?"
if command -v cuobjdump >/dev/null 2>&1; then
    echo "SASS topk.o: ATOMS $(cuobjdump --dump-sass "$B/topk.o" | grep -c 'ATOMS'), CAS $(cuobjdump --dump-sass "$B/topk.o" | grep -c 'CAS');" \
         "softmax.o: UBLKCP $(cuobjdump --dump-sass "$B/softmax.o" | grep -c 'UBLKCP'), SYNCS $(cuobjdump --dump-sass "$B/softmax.o" | grep -c 'SYNCS')"
fi
grep -E "FAIL|spill" "$O/main.log" | grep -v " 0 bytes spill" | head -20
sed -n '/^kernel  /,$p' "$O/main.log"
for v in "$@"; do
    sec=${v%%:*}; tune=${v#*:}
    f="$O/v_$(echo "$tune" | tr -c 'a-zA-Z0-9_\n' '_').log"
    KN_BENCH_ONLY=$sec KN_CUDA_TUNE=$tune timeout 120 "$B/kn_cuda_bench" > "$f" 2>&1
    echo "=== $sec, KN_CUDA_TUNE=$tune: exit $?"
    grep FAIL "$f" | head -5
    sed -n '/^kernel  /,$p' "$f" | grep -v -E "^kernel|copy \(ceiling|cublas|^$|PASSED"
done
