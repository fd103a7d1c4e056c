/* fuzz_tokenizer.c: libFuzzer harness for the tokenizers.
 *
 * Each input is used three ways:
 *   1. as a llama2.c tokenizer.bin (vocab_size 0: read to the end); when it
 *      loads, encode fixed texts and the input itself, decode the ids, and
 *      stream-decode them;
 *   2. as an llm.c gpt2_tokenizer.bin, decoding every id when it loads, and
 *      as a GGUF file (kn_tokenizer_from_gguf, then the fixed texts);
 *   3. as text for the real vocabularies in $KN_ASSETS (llama2c/tok512.bin,
 *      gguf/ggml-vocab-gpt-2.gguf) when present: encode with and without
 *      special-token parsing, then check decode(encode(x)) == x for valid
 *      UTF-8 (the GPT-2 vocabulary is lossless; SPM too, after its dummy space).
 * Invariants checked with abort(): round trips, streamed output is valid
 * UTF-8, invalid UTF-8 input is rejected with KN_ERR_INVALID.
 *
 * Build and run (from the repository root):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=c11 -D_GNU_SOURCE -Iinclude -Isrc \
 *     fuzz/fuzz_tokenizer.c src/llm/tokenizer.c src/llm/tok_*.c src/formats/gguf.c src/formats/mapfile.c \
 *     src/core/status.c src/core/dtype.c src/core/utf8.c -lm -o /tmp/fuzz_tokenizer
 *   KN_ASSETS=../shared/assets /tmp/fuzz_tokenizer -max_len=4096 fuzz/corpus
 */
#include "kiln_tokenizer.h"
#include "formats/gguf.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kn_tokenizer *g_spm, *g_bpe;

static void load_assets(void) {
    static int done;
    if (done) return;
    done = 1;
    const char *root = getenv("KN_ASSETS");
    if (!root || !*root) root = "../shared/assets";
    char p[1024];
    snprintf(p, sizeof p, "%s/llama2c/tok512.bin", root);
    if (kn_tokenizer_load_llama2c(p, 512, &g_spm) != KN_OK) g_spm = NULL;
    snprintf(p, sizeof p, "%s/gguf/ggml-vocab-gpt-2.gguf", root);
    kn_gguf *g = NULL;
    if (kn_gguf_open(p, &g) == KN_OK) {
        if (kn_tokenizer_from_gguf(g, &g_bpe) != KN_OK) g_bpe = NULL;
        kn_gguf_close(g);
    }
}

static void check(int cond, const char *what) {
    if (!cond) { fprintf(stderr, "invariant failed: %s (%s)\n", what, kn_last_error()); abort(); }
}

/* Encode text, decode it back whole and streamed; with roundtrip, compare. */
static void exercise(const kn_tokenizer *tok, const char *text, size_t len, int roundtrip) {
    int n = 0;
    kn_status st = kn_tokenize(tok, text, len, 0, 0, NULL, 0, &n);
    size_t valid = kn_utf8_valid_prefix(text, len);
    if (valid != len) { check(st == KN_ERR_INVALID, "invalid UTF-8 must be rejected"); return; }
    if (st != KN_OK && st != KN_ERR_LIMIT) return;   /* e.g. a vocabulary without byte fallback */
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    int n2 = 0;
    st = kn_tokenize(tok, text, len, 0, 0, ids, n, &n2);
    check(st == KN_OK && n2 == n, "second call with the counted size succeeds");
    size_t need = 0;
    kn_detokenize(tok, ids, n, KN_DETOK_STRIP_SPACE, NULL, 0, &need);
    char *out = malloc(need + 1);
    st = kn_detokenize(tok, ids, n, KN_DETOK_STRIP_SPACE, out, need + 1, &need);
    check(st == KN_OK, "detokenize");
    if (roundtrip) check(need == len && memcmp(out, text, len) == 0, "decode(encode(x)) == x");
    kn_detok_stream *ds;
    if (kn_detok_stream_new(tok, KN_DETOK_STRIP_SPACE, &ds) == KN_OK) {
        for (int i = 0; i < n; i++) {
            const char *s; size_t l;
            check(kn_detok_stream_push(ds, ids[i], &s, &l) == KN_OK, "stream push");
            check(kn_utf8_valid_prefix(s, l) == l, "streamed chunk is valid UTF-8");
        }
        const char *s; size_t l;
        kn_detok_stream_flush(ds, &s, &l);
        check(kn_utf8_valid_prefix(s, l) == l, "flushed chunk is valid UTF-8");
        kn_detok_stream_free(ds);
    }
    /* with special-token parsing too (no round trip: markers become ids) */
    int n3 = 0;
    kn_tokenize(tok, text, len, 1, 1, ids, n, &n3);
    free(out);
    free(ids);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    load_assets();
    const char *text = (const char *)data;
    kn_tokenizer *t = NULL;
    if (kn_tokenizer_load_llama2c_memory(data, size, 0, &t) == KN_OK) {
        static const char *const samples[] = {"Once upon a time", " \xf0\x9f\x98\x80 caf\xc3\xa9", ""};
        for (int i = 0; i < 3; i++) exercise(t, samples[i], strlen(samples[i]), 0);
        exercise(t, text, size, 0);
        kn_tokenizer_free(t);
    }
    if (kn_tokenizer_load_llmc_memory(data, size, &t) == KN_OK) {
        int32_t n = kn_tokenizer_n_vocab(t);
        for (int32_t i = 0; i < n; i++) { size_t l; kn_token_to_piece(t, i, 1, &l); }
        kn_tokenizer_free(t);
    }
    kn_gguf *g = NULL;
    if (kn_gguf_open_memory(data, size, &g) == KN_OK) {
        if (kn_tokenizer_from_gguf(g, &t) == KN_OK) {
            exercise(t, "Hello world 123 \xf0\x9f\x98\x80", 20, 0);
            kn_tokenizer_free(t);
        }
        kn_gguf_close(g);
    }
    if (g_spm) exercise(g_spm, text, size, 1);
    if (g_bpe) exercise(g_bpe, text, size, 1);
    return 0;
}
