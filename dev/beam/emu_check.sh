#!/bin/sh
# emu_check.sh: the CUDA renderer's unrolled elementwise kernels against
# unroll 1, run on the host (dev/beam/emu_gen.c says how). Needs a built
# build/libkiln.a and g++.
#   sh dev/beam/emu_check.sh [DIR]
set -e
BUILD=${BUILD:-build}
DIR=${1:-$(mktemp -d "${TMPDIR:-/tmp}/kn_emu_XXXXXX")}
mkdir -p "$DIR"
cc -std=c11 -D_GNU_SOURCE -Iinclude -Isrc dev/beam/emu_gen.c "$BUILD/libkiln.a" -lm -lpthread -lz -o "$DIR/emu_gen"
"$DIR/emu_gen" "$DIR"
fail=0
for p in "$DIR"/*_u1.cpp; do
    base=${p%_u1.cpp}
    for u in 1 2 4 8; do
        g++ -O1 -w -o "${base}_u$u" "${base}_u$u.cpp"
        "${base}_u$u" > "${base}_u$u.out"
    done
    for u in 2 4 8; do
        if cmp -s "${base}_u1.out" "${base}_u$u.out"; then :; else echo "DIFFER: $(basename "$base") unroll $u"; fail=1; fi
    done
done
[ $fail = 0 ] && echo "all unrolled variants match unroll 1 ($DIR)"
exit $fail
