#!/bin/sh
# fuzz/run.sh [SECONDS]: build every libFuzzer harness in fuzz/ with ASan+UBSan
# and run each one for SECONDS (default 30) from its seed corpus in
# fuzz/corpus/<name>/ (fuzz_<name>.c; every fuzz/fuzz_*.c is run, with the
# sources listed in srcs_for below). New inputs go to $FUZZ_BUILD/corpus/<name> (default
# build-fuzz/), never into the checked-in seeds. Exits non-zero when a build
# fails or a harness finds a crash (the reproducer is left in $FUZZ_BUILD).
# Needs clang with libFuzzer: on Debian 12, clang-14 and libclang-rt-14-dev.
set -u
T=${1:-30}
cd "$(dirname "$0")/.." || exit 1
OUT=${FUZZ_BUILD:-build-fuzz}
if [ -n "${CC_FUZZ:-}" ]; then CC=$CC_FUZZ
elif command -v clang >/dev/null 2>&1; then CC=clang
elif command -v clang-14 >/dev/null 2>&1; then CC=clang-14
else echo "fuzz/run.sh: clang not found (apt-get install clang-14 libclang-rt-14-dev)"; exit 2; fi
CFLAGS="-g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -Iinclude -Isrc -std=c11 -D_GNU_SOURCE"
CORE="src/core/status.c src/core/dtype.c src/core/utf8.c"
mkdir -p "$OUT" || exit 1

srcs_for() {
    case $1 in
    fuzz_gguf)        echo "src/formats/gguf.c src/formats/mapfile.c $CORE" ;;
    fuzz_safetensors) echo "src/formats/safetensors.c src/formats/hfconfig.c src/formats/mapfile.c $CORE" ;;
    fuzz_llama2c)     echo "src/formats/llama2c.c src/formats/llmc_gpt2.c src/formats/mapfile.c $CORE" ;;
    fuzz_json)        echo "src/formats/hfconfig.c src/formats/mapfile.c $CORE" ;;
    fuzz_chat|fuzz_jinja) echo "src/llm/chat.c $(ls src/llm/jinja_*.c | tr '\n' ' ') src/formats/gguf.c src/formats/hfconfig.c src/formats/mapfile.c $CORE" ;;
    fuzz_tokenizer|fuzz_hftok) echo "src/llm/tokenizer.c $(ls src/llm/tok_*.c | tr '\n' ' ') src/formats/gguf.c src/formats/hfconfig.c src/formats/mapfile.c $CORE" ;;
    fuzz_cli)         echo "tools/cli_args.c tools/cli_num.c" ;;
    fuzz_serve)       echo "tools/serve/jw.c tools/serve/api.c tools/serve/handler.c tools/serve/metrics.c tools/serve/tools.c src/llm/chat.c $(ls src/llm/jinja_*.c | tr '\n' ' ') src/llm/sampler.c src/core/philox.c src/llm/tokenizer.c $(ls src/llm/tok_*.c | tr '\n' ' ') src/formats/gguf.c src/formats/hfconfig.c src/formats/mapfile.c $CORE" ;;
    fuzz_kcache)      echo "src/core/kcache.c src/core/env.c $CORE" ;;
    # the whole library minus the SIMD files (built with -DKN_NO_X86 below): einsum builds graphs and runs them on ref
    fuzz_einsum)      echo "-DKN_NO_X86 -DKN_NO_AVX512 $(find src -name '*.c' ! -name '*_avx2.c' ! -name '*_avx512.c' | sort | tr '\n' ' ') -lz -ldl" ;;
    esac
}

status=0
for src in fuzz/fuzz_*.c; do
    h=$(basename "$src" .c)
    name=${h#fuzz_}
    if [ -z "$(srcs_for "$h")" ]; then
        echo "== $h: no source list in fuzz/run.sh (srcs_for); add one"; status=1; continue
    fi
    echo "== $h: build"
    # shellcheck disable=SC2046
    if ! $CC $CFLAGS -o "$OUT/$h" "fuzz/$h.c" $(srcs_for $h) -lm -lpthread; then
        echo "== $h: BUILD FAILED"; status=1; continue
    fi
    mkdir -p "$OUT/corpus/$name" "$OUT/crashes/$name"
    seeds=""
    [ -d "fuzz/corpus/$name" ] && seeds="fuzz/corpus/$name"
    echo "== $h: run ${T}s"
    # a fixed seed (KN_FUZZ_SEED, default 1) makes a CI run repeatable: the
    # same input sequence, cut off by the time limit
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
    "$OUT/$h" -seed="${KN_FUZZ_SEED:-1}" -max_total_time="$T" -rss_limit_mb=2048 -max_len=65536 -timeout=10 \
        -artifact_prefix="$OUT/crashes/$name/" -print_final_stats=1 \
        "$OUT/corpus/$name" $seeds > "$OUT/$h.log" 2>&1
    rc=$?
    tail -n 12 "$OUT/$h.log" | grep -E '^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ +DONE)' || true
    if [ $rc -ne 0 ]; then
        echo "== $h: FAILED (exit $rc); log: $OUT/$h.log; reproducer(s):"
        ls "$OUT/crashes/$name/" 2>/dev/null
        grep -m1 -E 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error' "$OUT/$h.log"
        status=1
    else
        echo "== $h: ok"
    fi
done
[ $status -eq 0 ] && echo "fuzz: all harnesses ran ${T}s without a crash"
exit $status
