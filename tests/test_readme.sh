#!/bin/sh
# test_readme.sh: every ```c block of README.md is a complete program; each is
# compiled as written (strict warnings as errors, the README's own link line)
# against this build's libkiln.a and run. A program that takes a model on its
# command line is run on llama2.c's stories260K with its tokenizer from
# KN_ASSETS (skipped when they are missing).
#
# Run by `make test` (tests/run.sh), which passes BUILD, KN_CC, KN_SANFLAGS
# and KN_LDLIBS (the libraries this build needs, CUDA's included). Prints one
# line per block and "# totals: P F S" like the C test binaries.
. "$(dirname "$0")/kn_test.sh"    # ok, bad, skip, totals

BUILD=${BUILD:-build}
CC=${KN_CC:-cc}
LDLIBS=${KN_LDLIBS:--lm -lpthread -lz}
ASSETS=${KN_ASSETS:-../shared/assets}
README=${README:-README.md}

tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT

# one file per block: snippet_N.c, and its first line number in snippet_N.line
awk -v dir="$tmp" '
    /^```c[[:space:]]*$/ { n++; f = dir "/snippet_" n ".c"; print NR + 1 > (dir "/snippet_" n ".line"); inside = 1; next }
    /^```/ && inside     { inside = 0; close(f); next }
    inside               { print > f }
' "$README"

n=0
for src in $(ls "$tmp"/snippet_*.c 2>/dev/null | sort -t_ -k2 -n); do
    n=$((n + 1))
    name="readme_c_block_$n(line $(cat "${src%.c}.line"))"
    exe=${src%.c}
    # shellcheck disable=SC2086
    if ! $CC ${KN_SANFLAGS:-} -std=c11 -Wall -Wextra -pedantic -Werror -Iinclude -o "$exe" "$src" \
            "$BUILD/libkiln.a" $LDLIBS > "$exe.log" 2>&1; then
        bad "$name" "does not compile as written: $(grep -m 3 -E 'error|undefined' "$exe.log" | tr '\n' ' ')"
        continue
    fi
    if grep -q 'argv\[1\]' "$src"; then
        # takes a model: the usage line first, then stories260K
        "$exe" > "$exe.out" 2>&1; rc=$?
        if [ $rc -ne 2 ] || ! grep -q usage "$exe.out"; then
            bad "$name" "without arguments: exit $rc, '$(head -c 200 "$exe.out")' (want exit 2 and a usage line)"; continue
        fi
        model="$ASSETS/llama2c/stories260K.bin" tok="$ASSETS/llama2c/tok512.bin"
        if [ ! -f "$model" ] || [ ! -f "$tok" ]; then
            skip "$name" "llama2c/stories260K.bin or tok512.bin missing under KN_ASSETS ($ASSETS; sh scripts/fetch_assets.sh)"
            continue
        fi
        "$exe" "$model" "$tok" > "$exe.out" 2> "$exe.err"; rc=$?
        # stories260K's greedy continuation is its documented story about Lily
        if [ $rc -ne 0 ] || ! grep -q 'Lily' "$exe.out"; then
            bad "$name" "exit $rc, printed '$(head -c 200 "$exe.out")' $(head -c 300 "$exe.err")"; continue
        fi
    else
        "$exe" > "$exe.out" 2>&1; rc=$?
        if [ $rc -ne 0 ]; then bad "$name" "exit $rc: $(head -c 300 "$exe.out")"; continue; fi
    fi
    ok "$name"
done
[ $n -gt 0 ] || bad readme_c_blocks "no \`\`\`c block found in $README"
totals
