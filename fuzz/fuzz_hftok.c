/* fuzz_hftok.c: libFuzzer harness for the tokenizer.json reader
 * (kn_tokenizer_load_hf_memory) and the pipeline it builds.
 *
 * Each input is used two ways:
 *   1. as a tokenizer.json (and, split at the first NUL byte, a
 *      tokenizer_config.json after it); loading must give KN_OK or an error
 *      with *out = NULL. When it loads, fixed texts and the input itself are
 *      encoded (parse_special on and off) and every id is decoded, whole and
 *      streamed;
 *   2. as text for the fixture tokenizers in tests/fixtures/hftok/ (one per
 *      model kind and pre-tokenizer family) when run from the repository
 *      root: encode, decode, and check that invalid UTF-8 is rejected with
 *      KN_ERR_INVALID and that the byte-level ones round-trip exactly.
 * Invariants are checked with abort().
 *
 * Build and run: fuzz/run.sh (sources in its srcs_for), seeds in
 * fuzz/corpus/hftok/.
 */
#include "kiln_tokenizer.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static kn_tokenizer *g_tok[11];
static int g_lossless[11];

static void load_fixtures(void) {
    static int done;
    if (done) return;
    done = 1;
    static const char *const names[] = {"gpt2.json", "llama3", "qwen2.json", "smollm.json", "llama2.json",
                                        "bert.json", "unigram.json", "unigram_bf.json",
                                        "misc_bpe.json", "misc_wp.json", "bert_uncased.json"};
    for (int i = 0; i < 11; i++) {
        char p[256];
        snprintf(p, sizeof p, "tests/fixtures/hftok/%s", names[i]);
        if (kn_tokenizer_load_hf(p, &g_tok[i]) != KN_OK) g_tok[i] = NULL;
        g_lossless[i] = i < 4;                    /* byte-level BPE: decode(encode(x)) == x */
    }
}

static void check(int cond, const char *what) {
    if (!cond) { fprintf(stderr, "invariant failed: %s (%s)\n", what, kn_last_error()); abort(); }
}

static void exercise(const kn_tokenizer *tok, const char *text, size_t len, int lossless) {
    for (int ps = 0; ps < 2; ps++) {
        int n = 0;
        kn_status st = kn_tokenize(tok, text, len, ps, ps, NULL, 0, &n);
        if (kn_utf8_valid_prefix(text, len) != len) { check(st == KN_ERR_INVALID, "invalid UTF-8 must be rejected"); return; }
        if (st != KN_OK && st != KN_ERR_LIMIT) { check(kn_last_error()[0] != 0, "error without a message"); continue; }
        int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
        int n2 = 0;
        st = kn_tokenize(tok, text, len, ps, ps, ids, n, &n2);
        check(st == KN_OK && n2 == n, "second tokenize call must agree with the count");
        size_t need = 0;
        kn_detokenize(tok, ids, n, 0, NULL, 0, &need);
        char *buf = malloc(need + 1);
        check(kn_detokenize(tok, ids, n, 0, buf, need + 1, &need) == KN_OK, "detokenize");
        if (lossless && !ps) check(need == len && memcmp(buf, text, len) == 0, "byte-level round trip");
        kn_detok_stream *ds = NULL;
        if (kn_detok_stream_new(tok, KN_DETOK_STRIP_SPACE, &ds) == KN_OK) {
            const char *s; size_t l;
            for (int i = 0; i < n; i++) {
                check(kn_detok_stream_push(ds, ids[i], &s, &l) == KN_OK, "stream push");
                check(kn_utf8_valid_prefix(s, l) == l, "streamed text must be valid UTF-8");
            }
            kn_detok_stream_flush(ds, &s, &l);
            kn_detok_stream_free(ds);
        }
        free(buf); free(ids);
    }
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    load_fixtures();
    const char *d = (const char *)data;
    const char *nul = memchr(d, 0, size);
    size_t jl = nul ? (size_t)(nul - d) : size;
    kn_tokenizer *tok = (kn_tokenizer *)1;
    kn_status st = kn_tokenizer_load_hf_memory(d, jl, nul ? nul + 1 : NULL, nul ? size - jl - 1 : 0, &tok);
    if (st != KN_OK) check(tok == NULL && kn_last_error()[0] != 0, "failed load: *out NULL and a message");
    else {
        static const char *const texts[] = {"", "Hello world", " a  b\n\n\tc ", "I'm 12345 caf\xc3\xa9 \xf0\x9f\x98\x80",
                                            "<s></s><unk>[UNK]<|endoftext|>", "\xe4\xbd\xa0\xe5\xa5\xbd"};
        for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) exercise(tok, texts[i], strlen(texts[i]), 0);
        exercise(tok, d, size, 0);
        int32_t nv = kn_tokenizer_n_vocab(tok);
        for (int32_t id = 0; id < nv && id < 4096; id++) { size_t l; kn_token_to_piece(tok, id, true, &l); }
        kn_tokenizer_free(tok);
    }
    for (int i = 0; i < 11; i++) if (g_tok[i]) exercise(g_tok[i], d, size, g_lossless[i]);
    return 0;
}
