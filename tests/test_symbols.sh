#!/bin/sh
# test_symbols.sh: libkiln.so exports the kn_ API of include/*.h and nothing
# else (the library is built with -fvisibility=hidden; the public headers
# switch default visibility back on). Every defined dynamic symbol must be
# declared in the public headers (read through the preprocessor, so names
# made by macros count), and a program that calls an internal function links
# against libkiln.a but not against libkiln.so.
#
# Run by `make test` (tests/run.sh passes BUILD, KN_CC, KN_SANFLAGS, KN_LDLIBS).
. "$(dirname "$0")/kn_test.sh"    # ok, bad, skip, totals

BUILD=${BUILD:-build}
CC=${KN_CC:-cc}
LDLIBS=${KN_LDLIBS:--lm -lpthread -lz}
SO="$BUILD/libkiln.so"
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

if ! command -v nm >/dev/null 2>&1; then
    skip exported_symbols_are_public "nm not found (binutils)"
elif [ ! -f "$SO" ]; then
    bad exported_symbols_are_public "$SO is not built"
else
    for h in include/*.h; do printf '#include "%s"\n' "$(basename "$h")"; done > "$tmp/all.c"
    # KN_CUDA: declarations of a CUDA build count too
    $CC -E -P -DKN_CUDA -Iinclude "$tmp/all.c" 2>"$tmp/cpp.log" | grep -ow '[A-Za-z_][A-Za-z0-9_]*' | sort -u > "$tmp/public"
    # the sanitizer runtime's own symbols (build-san) are not kiln's
    nm -D --defined-only "$SO" | awk '{print $NF}' | grep -v -E '^(_init|_fini|_edata|_end|__bss_start|__.*|_ZN?[0-9]*__sanitizer.*)$' | sort -u > "$tmp/exported"
    stray=$(comm -23 "$tmp/exported" "$tmp/public")
    if [ ! -s "$tmp/public" ]; then
        bad exported_symbols_are_public "could not read the public headers: $(head -c 300 "$tmp/cpp.log")"
    elif [ -n "$stray" ]; then
        bad exported_symbols_are_public "$(echo "$stray" | wc -l) symbols exported but not declared in include/: $(echo "$stray" | head -20 | tr '\n' ' ')"
    elif ! grep -qx kn_ctx_new "$tmp/exported"; then
        bad exported_symbols_are_public "kn_ctx_new is not exported (is the .so empty?)"
    else
        ok exported_symbols_are_public
    fi
fi

# an internal function (the thread pool's size) is in the static
# library for the tests, but a program linked against the .so cannot reach it
cat > "$tmp/internal.c" <<'C'
#include "kiln.h"
#include <stdio.h>
int kn_pool_nthreads(void);   /* src/backends/cpu/threadpool.h */
int main(void) { printf("%s\n", kn_version()); return kn_pool_nthreads() < 1; }
C
if [ ! -f "$SO" ]; then
    skip internal_symbols_hidden "$SO is not built"
elif ! grep -rq 'kn_pool_nthreads' src; then
    skip internal_symbols_hidden "kn_pool_nthreads is gone: pick another internal function"
elif grep -qw kn_pool_nthreads "$tmp/public" 2>/dev/null; then
    skip internal_symbols_hidden "kn_pool_nthreads is public now: pick another internal function"
else
    # shellcheck disable=SC2086
    if ! $CC ${KN_SANFLAGS:-} -Iinclude -o "$tmp/static" "$tmp/internal.c" "$BUILD/libkiln.a" $LDLIBS > "$tmp/static.log" 2>&1; then
        bad internal_symbols_hidden "does not even link statically: $(head -c 300 "$tmp/static.log")"
    elif $CC ${KN_SANFLAGS:-} -Iinclude -o "$tmp/shared" "$tmp/internal.c" -L"$BUILD" -lkiln $LDLIBS > "$tmp/shared.log" 2>&1; then
        bad internal_symbols_hidden "a program calling kn_pool_nthreads links against libkiln.so"
    elif ! grep -q 'kn_pool_nthreads' "$tmp/shared.log"; then
        bad internal_symbols_hidden "linking against the .so failed for another reason: $(head -c 300 "$tmp/shared.log")"
    else
        ok internal_symbols_hidden
    fi
fi
totals
