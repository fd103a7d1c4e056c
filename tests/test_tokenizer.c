/* test_tokenizer.c: tokenizers (SPM, GPT-2 BPE, llm.c decode-only) and chat
 * templates.
 *
 * Reference ids: llama.cpp's ggml-vocab-*.gguf.inp/.out test files (47 cases,
 * no BOS); every case must match exactly, for the GGUF vocabularies and for
 * llama2.c's tokenizer.bin (same 32000-token vocabulary as the llama-spm one).
 */
#include "kn_test.h"
#include "kn_bytes.h"
#include "kiln_tokenizer.h"
#include "kiln_chat.h"
#include "formats/gguf.h"
#include "llm/tokenizer_impl.h"   // defines: kn__utf8_encode
#include <time.h>

/* ---- helpers ---------------------------------------------------------------- */

static char *read_all(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long sz = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)sz + 1);
    if (b && fread(b, 1, (size_t)sz, f) != (size_t)sz) { free(b); b = NULL; }
    fclose(f);
    if (b) { b[sz] = 0; *n = (size_t)sz; }
    return b;
}

typedef struct vocab_cases {
    int n;
    char *inp_buf, *out_buf;
    const char *text[64]; size_t len[64];
    int32_t ids[64][512]; int n_ids[64];
} vocab_cases;

/* Split .inp on "\n__ggml_vocab_test__\n" and parse .out (one line per case). */
static bool load_cases(const char *inp_rel, const char *out_rel, vocab_cases *vc) {
    const char *ip = kn_asset(inp_rel), *op = kn_asset(out_rel);
    if (!ip || !op) return false;
    size_t ni, no;
    memset(vc, 0, sizeof *vc);
    vc->inp_buf = read_all(ip, &ni);
    vc->out_buf = read_all(op, &no);
    if (!vc->inp_buf || !vc->out_buf) return false;
    const char *sep = "\n__ggml_vocab_test__\n";
    char *p = vc->inp_buf, *end = vc->inp_buf + ni;
    while (vc->n < 64) {
        char *q = memmem(p, (size_t)(end - p), sep, strlen(sep));
        if (!q) break;
        vc->text[vc->n] = p; vc->len[vc->n] = (size_t)(q - p);
        vc->n++;
        p = q + strlen(sep);
    }
    char *line = vc->out_buf;
    for (int i = 0; i < vc->n; i++) {
        char *nl = strchr(line, '\n');
        if (!nl) return false;
        *nl = 0;
        char *s = line;
        while (*s) {
            char *e;
            long v = strtol(s, &e, 10);
            if (e == s) break;
            if (vc->n_ids[i] < 512) vc->ids[i][vc->n_ids[i]++] = (int32_t)v;
            s = e;
        }
        line = nl + 1;
    }
    return true;
}

static void free_cases(vocab_cases *vc) { free(vc->inp_buf); free(vc->out_buf); }

/* Run every case; returns the number of mismatches (and prints them). */
static int run_cases(const kn_tokenizer *tok, const vocab_cases *vc, const char *what, bool roundtrip) {
    int bad = 0;
    int32_t ids[1024];
    char dec[4096];
    for (int i = 0; i < vc->n; i++) {
        int n = -1;
        kn_status st = kn_tokenize(tok, vc->text[i], vc->len[i], false, false, ids, 1024, &n);
        bool ok = st == KN_OK && n == vc->n_ids[i] && memcmp(ids, vc->ids[i], (size_t)n * sizeof *ids) == 0;
        if (!ok) {
            bad++;
            fprintf(stderr, "  %s case %d (\"%.*s\"): status %d, got %d ids:", what, i,
                    (int)(vc->len[i] > 40 ? 40 : vc->len[i]), vc->text[i], (int)st, n);
            for (int k = 0; k < n && k < 24; k++) fprintf(stderr, " %d", ids[k]);
            fprintf(stderr, "\n    expected %d:", vc->n_ids[i]);
            for (int k = 0; k < vc->n_ids[i] && k < 24; k++) fprintf(stderr, " %d", vc->ids[i][k]);
            fprintf(stderr, "\n");
            continue;
        }
        if (roundtrip) {
            size_t need;
            st = kn_detokenize(tok, ids, n, KN_DETOK_STRIP_SPACE, dec, sizeof dec, &need);
            if (st != KN_OK || need != vc->len[i] || memcmp(dec, vc->text[i], need) != 0) {
                bad++;
                fprintf(stderr, "  %s case %d: decode gives \"%.*s\" (%zu bytes), want %zu bytes\n", what, i,
                        (int)need, dec, need, vc->len[i]);
            }
        }
    }
    return bad;
}

static kn_tokenizer *load_gguf_tok(const char *rel, kn_gguf **gout) {
    const char *p = kn_asset(rel);
    if (!p) return NULL;
    kn_gguf *g = NULL;
    if (kn_gguf_open(p, &g) != KN_OK) { fprintf(stderr, "  gguf open: %s\n", kn_last_error()); return NULL; }
    kn_tokenizer *tok = NULL;
    if (kn_tokenizer_from_gguf(g, &tok) != KN_OK) fprintf(stderr, "  from_gguf: %s\n", kn_last_error());
    if (gout) *gout = g; else kn_gguf_close(g);
    return tok;
}

static bool encode(const kn_tokenizer *tok, const char *s, bool bos, bool special, int32_t *ids, int *n) {
    return kn_tokenize(tok, s, strlen(s), bos, special, ids, 4096, n) == KN_OK;
}

/* ---- reference cases -------------------------------------------------------- */

TEST(spm_gguf_llamacpp_cases) {
    vocab_cases vc;
    if (!load_cases("gguf/ggml-vocab-llama-spm.gguf.inp", "gguf/ggml-vocab-llama-spm.gguf.out", &vc)) {
        free_cases(&vc); SKIP("gguf/ggml-vocab-llama-spm.gguf.inp/.out missing");
    }
    if (!kn_asset("gguf/ggml-vocab-llama-spm.gguf")) { free_cases(&vc); SKIP("ggml-vocab-llama-spm.gguf missing"); }
    kn_tokenizer *tok = load_gguf_tok("gguf/ggml-vocab-llama-spm.gguf", NULL);
    REQUIRE(tok, "load: %s", kn_last_error());
    CHECK(vc.n == 46, "%d cases (the file holds 46 separators)", vc.n);
    CHECK(kn_tokenizer_get_kind(tok) == KN_TOKENIZER_SPM, "kind");
    CHECK(kn_tokenizer_n_vocab(tok) == 32000 && kn_tokenizer_bos(tok) == 1 && kn_tokenizer_eos(tok) == 2,
          "n_vocab %d bos %d eos %d", kn_tokenizer_n_vocab(tok), kn_tokenizer_bos(tok), kn_tokenizer_eos(tok));
    CHECK(kn_tokenizer_add_bos(tok), "add_bos_token is true in this file");
    int bad = run_cases(tok, &vc, "spm-gguf", true);
    CHECK(bad == 0, "%d of %d cases differ", bad, vc.n);
    kn_tokenizer_free(tok);
    free_cases(&vc);
}

TEST(spm_llama2c_llamacpp_cases) {
    vocab_cases vc;
    if (!load_cases("gguf/ggml-vocab-llama-spm.gguf.inp", "gguf/ggml-vocab-llama-spm.gguf.out", &vc)) {
        free_cases(&vc); SKIP("gguf/ggml-vocab-llama-spm.gguf.inp/.out missing");
    }
    const char *p = kn_asset("llama2c/tokenizer.bin");
    if (!p) { free_cases(&vc); SKIP("llama2c/tokenizer.bin missing"); }
    kn_tokenizer *tok = NULL;
    REQUIRE(kn_tokenizer_load_llama2c(p, 32000, &tok) == KN_OK, "%s", kn_last_error());
    int bad = run_cases(tok, &vc, "spm-llama2c", true);
    CHECK(bad == 0, "%d of %d cases differ", bad, vc.n);
    /* vocab_size 0 reads to the end of the file: same vocabulary */
    kn_tokenizer *tok2 = NULL;
    REQUIRE(kn_tokenizer_load_llama2c(p, 0, &tok2) == KN_OK, "%s", kn_last_error());
    CHECK(kn_tokenizer_n_vocab(tok2) == 32000, "n_vocab %d", kn_tokenizer_n_vocab(tok2));
    kn_tokenizer *tok3 = NULL;
    CHECK(kn_tokenizer_load_llama2c(p, 32001, &tok3) == KN_ERR_FORMAT && !tok3, "vocab_size too big must fail");
    CHECK(kn_tokenizer_load_llama2c(p, 512, &tok3) == KN_ERR_FORMAT && !tok3, "vocab_size too small must fail");
    kn_tokenizer_free(tok2);
    kn_tokenizer_free(tok);
    free_cases(&vc);
}

TEST(gpt2_gguf_llamacpp_cases) {
    vocab_cases vc;
    if (!load_cases("gguf/ggml-vocab-gpt-2.gguf.inp", "gguf/ggml-vocab-gpt-2.gguf.out", &vc)) {
        free_cases(&vc); SKIP("gguf/ggml-vocab-gpt-2.gguf.inp/.out missing");
    }
    if (!kn_asset("gguf/ggml-vocab-gpt-2.gguf")) { free_cases(&vc); SKIP("ggml-vocab-gpt-2.gguf missing"); }
    kn_tokenizer *tok = load_gguf_tok("gguf/ggml-vocab-gpt-2.gguf", NULL);
    REQUIRE(tok, "load: %s", kn_last_error());
    CHECK(vc.n == 46, "%d cases (the file holds 46 separators)", vc.n);
    CHECK(kn_tokenizer_get_kind(tok) == KN_TOKENIZER_BPE, "kind");
    CHECK(kn_tokenizer_n_vocab(tok) == 50257, "n_vocab %d", kn_tokenizer_n_vocab(tok));
    int bad = run_cases(tok, &vc, "gpt2-gguf", true);
    CHECK(bad == 0, "%d of %d cases differ", bad, vc.n);
    kn_tokenizer_free(tok);
    free_cases(&vc);
}

/* ---- special tokens, limits, queries ---------------------------------------- */

TEST(gpt2_special_tokens_and_limits) {
    kn_tokenizer *tok = load_gguf_tok("gguf/ggml-vocab-gpt-2.gguf", NULL);
    if (!tok) SKIP("gguf/ggml-vocab-gpt-2.gguf missing or unreadable");
    int32_t ids[4096]; int n;
    REQUIRE(encode(tok, "Hello<|endoftext|> world", false, true, ids, &n), "%s", kn_last_error());
    CHECK(n == 3 && ids[0] == 15496 && ids[1] == 50256 && ids[2] == 995, "parse_special: n=%d %d %d %d",
          n, ids[0], ids[1], ids[2]);
    REQUIRE(encode(tok, "Hello<|endoftext|> world", false, false, ids, &n), "%s", kn_last_error());
    CHECK(n > 3, "without parse_special the marker is plain text (n=%d)", n);
    for (int i = 0; i < n; i++) CHECK(ids[i] != 50256, "id %d at %d", ids[i], i);
    CHECK(kn_tokenizer_is_eog(tok, 50256) && !kn_tokenizer_is_eog(tok, 15496), "eog");
    CHECK(kn_tokenizer_token_type(tok, 50256) == KN_TOKEN_CONTROL, "type");
    size_t l;
    const char *p = kn_token_to_piece(tok, 50256, false, &l);
    CHECK(p && l == 0, "control piece hidden without render_special (len %zu)", l);
    p = kn_token_to_piece(tok, 50256, true, &l);
    CHECK(p && l == 13 && memcmp(p, "<|endoftext|>", 13) == 0, "control piece rendered");
    CHECK(kn_token_to_piece(tok, 50257, true, &l) == NULL && l == 0, "out of range id");
    /* KN_ERR_LIMIT reports the needed count and leaves ids alone */
    int32_t small[2] = {-7, -7};
    kn_status st = kn_tokenize(tok, " Hello world, again", 19, false, false, small, 2, &n);
    CHECK(st == KN_ERR_LIMIT && n == 4 && small[0] == -7, "limit: st %d n %d", (int)st, n);
    st = kn_tokenize(tok, " Hello world, again", 19, false, false, NULL, 0, &n);
    CHECK(st == KN_ERR_LIMIT && n == 4, "count only: st %d n %d", (int)st, n);
    /* empty text */
    st = kn_tokenize(tok, "", 0, false, false, ids, 10, &n);
    CHECK(st == KN_OK && n == 0, "empty");
    /* detokenize buffer limit */
    int32_t hw[2] = {15496, 995};
    char buf[8]; size_t need;
    st = kn_detokenize(tok, hw, 2, 0, buf, sizeof buf, &need);
    CHECK(st == KN_ERR_LIMIT && need == 11, "detok limit: st %d need %zu", (int)st, need);
    char big[16];
    st = kn_detokenize(tok, hw, 2, 0, big, sizeof big, &need);
    CHECK(st == KN_OK && strcmp(big, "Hello world") == 0, "detok: '%s'", big);
    int32_t badid = 60000;
    CHECK(kn_detokenize(tok, &badid, 1, 0, big, sizeof big, &need) == KN_ERR_INVALID, "bad id");
    kn_tokenizer_free(tok);
}

TEST(spm_special_tokens_and_bos) {
    kn_tokenizer *tok = load_gguf_tok("gguf/ggml-vocab-llama-spm.gguf", NULL);
    if (!tok) SKIP("gguf/ggml-vocab-llama-spm.gguf missing or unreadable");
    int32_t ids[4096]; int n;
    REQUIRE(encode(tok, "Hello world", true, false, ids, &n), "%s", kn_last_error());
    CHECK(n == 3 && ids[0] == 1 && ids[1] == 15043 && ids[2] == 3186, "bos + ids: n=%d %d %d", n, ids[0], ids[1]);
    /* "<s>" is BOS only with parse_special; the text after it gets the dummy space again */
    REQUIRE(encode(tok, "<s>Hello", false, true, ids, &n), "%s", kn_last_error());
    CHECK(n == 2 && ids[0] == 1 && ids[1] == 15043, "parse_special: n=%d %d %d", n, ids[0], ids[1]);
    REQUIRE(encode(tok, "<s>Hello", false, false, ids, &n), "%s", kn_last_error());
    CHECK(n > 2 && ids[0] != 1, "plain: n=%d first %d", n, ids[0]);
    /* decoding drops the dummy space after BOS (as llama2.c) */
    int32_t seq[3] = {1, 15043, 3186};
    char buf[64]; size_t need;
    CHECK(kn_detokenize(tok, seq, 3, 0, buf, sizeof buf, &need) == KN_OK && strcmp(buf, "Hello world") == 0,
          "'%s'", buf);
    CHECK(kn_detokenize(tok, seq, 3, KN_DETOK_SPECIAL, buf, sizeof buf, &need) == KN_OK &&
          strcmp(buf, "<s>Hello world") == 0, "'%s'", buf);
    CHECK(kn_detokenize(tok, seq + 1, 2, 0, buf, sizeof buf, &need) == KN_OK && strcmp(buf, " Hello world") == 0,
          "no strip without flag: '%s'", buf);
    /* byte tokens */
    int32_t nl = 13;   /* <0x0A> */
    size_t l; const char *p = kn_token_to_piece(tok, nl, false, &l);
    CHECK(l == 1 && p[0] == '\n', "byte token");
    CHECK(kn_tokenizer_token_type(tok, 13) == KN_TOKEN_BYTE, "type byte");
    CHECK(kn_tokenizer_is_eog(tok, 2) && !kn_tokenizer_is_eog(tok, 1), "eog");
    CHECK(kn_tokenizer_find(tok, " Hello", 6) == 15043, "find");
    kn_tokenizer_free(tok);
}

TEST(model_gguf_vocab) {
    /* a model GGUF (random weights) whose vocabulary lacks add_bos_token and
     * add_space_prefix: the SPM defaults (both true) apply */
    kn_tokenizer *tok = load_gguf_tok("gguf/llama-2-tiny-random.gguf", NULL);
    if (!tok) SKIP("gguf/llama-2-tiny-random.gguf missing or unreadable");
    int32_t ids[64]; int n;
    REQUIRE(encode(tok, "Hello world", kn_tokenizer_add_bos(tok), false, ids, &n), "%s", kn_last_error());
    CHECK(n == 3 && ids[0] == 1 && ids[1] == 15043 && ids[2] == 3186, "n=%d %d %d %d", n, ids[0], ids[1], ids[2]);
    kn_tokenizer_free(tok);
}

/* ---- tok512: round trips, streaming, long input ----------------------------- */

static kn_tokenizer *load_tok512(void) {
    const char *p = kn_asset("llama2c/tok512.bin");
    if (!p) return NULL;
    kn_tokenizer *t = NULL;
    if (kn_tokenizer_load_llama2c(p, 512, &t) != KN_OK) fprintf(stderr, "  %s\n", kn_last_error());
    return t;
}

TEST(tok512_roundtrip) {
    kn_tokenizer *tok = load_tok512();
    if (!tok) SKIP("llama2c/tok512.bin missing");
    const char *texts[] = {
        "Once upon a time, there was a little girl named Lily.",
        "  two leading spaces and trailing  ",
        "tabs\tand\nnew\nlines\r\n",
        "caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80 emoji",
        "x", " ", "<s> not special </s>", "12345 67.89",
    };
    for (size_t i = 0; i < sizeof texts / sizeof *texts; i++) {
        int32_t ids[4096]; int n;
        REQUIRE(encode(tok, texts[i], true, false, ids, &n), "%s", kn_last_error());
        CHECK(ids[0] == 1, "bos");
        for (int k = 0; k < n; k++) CHECK(ids[k] >= 0 && ids[k] < 512, "id %d", ids[k]);
        char buf[1024]; size_t need;
        REQUIRE(kn_detokenize(tok, ids, n, 0, buf, sizeof buf, &need) == KN_OK, "%s", kn_last_error());
        CHECK(strcmp(buf, texts[i]) == 0, "round trip of '%s' gave '%s'", texts[i], buf);
        REQUIRE(encode(tok, texts[i], false, false, ids, &n), "%s", kn_last_error());
        REQUIRE(kn_detokenize(tok, ids, n, KN_DETOK_STRIP_SPACE, buf, sizeof buf, &need) == KN_OK, "%s", kn_last_error());
        CHECK(strcmp(buf, texts[i]) == 0, "round trip (no bos) of '%s' gave '%s'", texts[i], buf);
    }
    /* the emoji is not in this 512 vocabulary: it must come out as 4 byte tokens */
    int32_t ids[64]; int n;
    REQUIRE(encode(tok, "\xf0\x9f\x98\x80", false, false, ids, &n), "%s", kn_last_error());
    int nbytes = 0;
    for (int k = 0; k < n; k++) nbytes += kn_tokenizer_token_type(tok, ids[k]) == KN_TOKEN_BYTE;
    CHECK(nbytes == 4, "emoji as %d byte tokens (of %d ids)", nbytes, n);
    kn_tokenizer_free(tok);
}

TEST(stream_never_splits_utf8) {
    kn_tokenizer *tok = load_tok512();
    if (!tok) SKIP("llama2c/tok512.bin missing");
    const char *text = "Hi \xf0\x9f\x98\x80\xf0\x9f\x8e\x89 caf\xc3\xa9 \xe6\x97\xa5!";
    int32_t ids[256]; int n;
    REQUIRE(encode(tok, text, true, false, ids, &n), "%s", kn_last_error());
    kn_detok_stream *ds;
    REQUIRE(kn_detok_stream_new(tok, 0, &ds) == KN_OK, "new");
    char acc[256]; size_t al = 0;
    int held = 0;
    for (int i = 0; i < n; i++) {
        const char *s; size_t l;
        REQUIRE(kn_detok_stream_push(ds, ids[i], &s, &l) == KN_OK, "%s", kn_last_error());
        CHECK(kn_utf8_valid_prefix(s, l) == l, "chunk %d is not whole UTF-8", i);
        size_t pl; kn_token_to_piece(tok, ids[i], false, &pl);
        if (pl > 0 && l == 0) held++;
        memcpy(acc + al, s, l); al += l;
    }
    const char *s; size_t l;
    REQUIRE(kn_detok_stream_flush(ds, &s, &l) == KN_OK, "flush");
    CHECK(l == 0, "nothing left at the end (%zu)", l);
    CHECK(held >= 3 * 2, "byte tokens of the two emoji were held back (%d pushes gave nothing)", held);
    CHECK(al == strlen(text) && memcmp(acc, text, al) == 0, "stream gives '%.*s'", (int)al, acc);

    /* broken sequences become U+FFFD, never raw partial bytes */
    int32_t e2 = kn_tokenizer_find(tok, "<0xE2>", 6), a = kn_tokenizer_find(tok, "a", 1);
    REQUIRE(e2 >= 0 && a >= 0, "byte token <0xE2> and 'a' exist in tok512");
    REQUIRE(kn_detok_stream_push(ds, e2, &s, &l) == KN_OK && l == 0, "lead byte held");
    REQUIRE(kn_detok_stream_push(ds, a, &s, &l) == KN_OK, "push");
    CHECK(l == 4 && memcmp(s, "\xef\xbf\xbd" "a", 4) == 0, "broken lead: %zu bytes", l);
    REQUIRE(kn_detok_stream_push(ds, e2, &s, &l) == KN_OK && l == 0, "lead byte held");
    REQUIRE(kn_detok_stream_flush(ds, &s, &l) == KN_OK, "flush");
    CHECK(l == 3 && memcmp(s, "\xef\xbf\xbd", 3) == 0, "unfinished at flush: %zu bytes", l);
    CHECK(kn_detok_stream_push(ds, 100000, &s, &l) == KN_ERR_INVALID, "bad id");
    kn_detok_stream_free(ds);
    kn_detok_stream_free(NULL);
    kn_tokenizer_free(tok);
}

TEST(long_prompt_is_fast) {
    const char *p = kn_asset("llama2c/tokenizer.bin");
    const char *tp = kn_asset("datasets/tinyshakespeare/input.txt");
    if (!p || !tp) SKIP("llama2c/tokenizer.bin or tinyshakespeare missing");
    kn_tokenizer *tok = NULL;
    REQUIRE(kn_tokenizer_load_llama2c(p, 32000, &tok) == KN_OK, "%s", kn_last_error());
    size_t n; char *text = read_all(tp, &n);
    REQUIRE(text, "read");
    size_t len = n < 300000 ? n : 300000;
    while (len > 0 && ((unsigned char)text[len] & 0xC0) == 0x80) len--;
    int32_t *ids = malloc(len * sizeof *ids + 64);
    int nid;
    clock_t t0 = clock();
    kn_status st = kn_tokenize(tok, text, len, true, false, ids, (int)len + 16, &nid);
    double sec = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK(st == KN_OK, "%s", kn_last_error());
    printf("  spm: %zu bytes -> %d tokens in %.3f s\n", len, nid, sec);
    CHECK(sec < 5.0, "encoding %zu bytes took %.2f s", len, sec);
    char *back = malloc(len + 1); size_t need;
    CHECK(kn_detokenize(tok, ids, nid, 0, back, len + 1, &need) == KN_OK && need == len &&
          memcmp(back, text, len) == 0, "round trip of %zu bytes", len);
    free(back); free(ids); free(text);
    kn_tokenizer_free(tok);
}

TEST(bpe_long_and_pathological_inputs) {
    kn_tokenizer *tok = load_gguf_tok("gguf/ggml-vocab-gpt-2.gguf", NULL);
    const char *tp = kn_asset("datasets/tinyshakespeare/input.txt");
    if (!tok || !tp) { kn_tokenizer_free(tok); SKIP("ggml-vocab-gpt-2.gguf or tinyshakespeare missing"); }
    size_t n; char *text = read_all(tp, &n);
    REQUIRE(text, "read");
    size_t len = n < 300000 ? n : 300000;
    int32_t *ids = malloc((len + 64) * sizeof *ids);
    int nid;
    clock_t t0 = clock();
    kn_status st = kn_tokenize(tok, text, len, false, false, ids, (int)len + 16, &nid);
    double sec = (double)(clock() - t0) / CLOCKS_PER_SEC;
    CHECK(st == KN_OK, "%s", kn_last_error());
    printf("  gpt2: %zu bytes -> %d tokens in %.3f s\n", len, nid, sec);
    CHECK(sec < 5.0, "encoding %zu bytes took %.2f s", len, sec);
    char *back = malloc(len + 1); size_t need;
    CHECK(kn_detokenize(tok, ids, nid, 0, back, len + 1, &need) == KN_OK && need == len &&
          memcmp(back, text, len) == 0, "round trip of %zu bytes", len);
    /* one 200 KB word, 200 KB of spaces, 200 KB of punctuation: each is one pre-token */
    const char fill[3] = {'a', ' ', '!'};
    size_t big = 200000;
    for (int k = 0; k < 3; k++) {
        memset(text, fill[k], big);
        t0 = clock();
        st = kn_tokenize(tok, text, big, false, false, ids, (int)len + 16, &nid);
        sec = (double)(clock() - t0) / CLOCKS_PER_SEC;
        CHECK(st == KN_OK && nid > 0 && sec < 5.0, "run of '%c': st %d, %d ids, %.2f s", fill[k], (int)st, nid, sec);
        CHECK(kn_detokenize(tok, ids, nid, 0, back, len + 1, &need) == KN_OK && need == big &&
              memcmp(back, text, big) == 0, "round trip of the '%c' run", fill[k]);
    }
    free(back); free(ids); free(text);
    kn_tokenizer_free(tok);
}

/* ---- llm.c decode-only -------------------------------------------------------- */

TEST(llmc_decode) {
    const char *p = kn_asset("gpt2/gpt2_tokenizer.bin");
    if (!p) SKIP("gpt2/gpt2_tokenizer.bin missing");
    kn_tokenizer *tok = NULL;
    REQUIRE(kn_tokenizer_load_llmc(p, &tok) == KN_OK, "%s", kn_last_error());
    CHECK(kn_tokenizer_n_vocab(tok) == 50257 && kn_tokenizer_eot(tok) == 50256, "vocab/eot");
    CHECK(kn_tokenizer_is_eog(tok, 50256), "eot is eog");
    int32_t ids[] = {15496, 995, 11, 314, 1101, 257, 3303, 2746, 13};
    char buf[128]; size_t need;
    REQUIRE(kn_detokenize(tok, ids, 9, 0, buf, sizeof buf, &need) == KN_OK, "%s", kn_last_error());
    CHECK(strcmp(buf, "Hello world, I'm a language model.") == 0, "'%s'", buf);
    int n;
    CHECK(kn_tokenize(tok, "Hello", 5, false, false, ids, 9, &n) == KN_ERR_UNSUPPORTED, "decode only");
    /* every piece equals the GGUF GPT-2 vocabulary's decoded piece */
    kn_tokenizer *g = load_gguf_tok("gguf/ggml-vocab-gpt-2.gguf", NULL);
    if (g) {
        int diff = 0;
        for (int32_t i = 0; i < 50257; i++) {
            size_t la, lb;
            const char *a = kn_token_to_piece(tok, i, true, &la), *b = kn_token_to_piece(g, i, true, &lb);
            if (la != lb || memcmp(a, b, la) != 0) diff++;
        }
        CHECK(diff == 0, "%d pieces differ between llm.c and GGUF GPT-2 vocabularies", diff);
        kn_tokenizer_free(g);
    }
    kn_tokenizer_free(tok);
}

/* ---- bad input ----------------------------------------------------------------- */

TEST(invalid_utf8_is_an_error) {
    kn_tokenizer *tok = load_tok512();
    if (!tok) SKIP("llama2c/tok512.bin missing");
    const char *bad[] = {"ab\xff", "\xc3", "\xed\xa0\x80", "\xc0\xaf", "ok \xf4\x90\x80\x80", "\x80x"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int32_t ids[64]; int n;
        kn_status st = kn_tokenize(tok, bad[i], strlen(bad[i]), true, false, ids, 64, &n);
        CHECK(st == KN_ERR_INVALID, "case %zu: status %d", i, (int)st);
        CHECK(strstr(kn_last_error(), "UTF-8") != NULL, "message: %s", kn_last_error());
    }
    kn_tokenizer *g = load_gguf_tok("gguf/ggml-vocab-gpt-2.gguf", NULL);
    if (g) {
        int32_t ids[64]; int n;
        CHECK(kn_tokenize(g, "\xe2\x82", 2, false, false, ids, 64, &n) == KN_ERR_INVALID, "bpe");
        kn_tokenizer_free(g);
    }
    CHECK(kn_utf8_valid_prefix("a\xc3\xa9\xe2\x82", 5) == 3, "valid prefix");
    kn_tokenizer_free(tok);
}

TEST(corrupt_files_give_errors) {
    const char *p = kn_asset("llama2c/tok512.bin");
    if (!p) SKIP("llama2c/tok512.bin missing");
    size_t n; char *d = read_all(p, &n);
    REQUIRE(d, "read");
    kn_tokenizer *t = NULL;
    /* every truncation fails cleanly with an error message */
    int ok_trunc = 0;
    for (size_t cut = 0; cut < n; cut += 1 + (cut > 64) * 13) {
        kn_status st = kn_tokenizer_load_llama2c_memory(d, cut, 512, &t);
        if (st == KN_OK) { ok_trunc++; kn_tokenizer_free(t); continue; }
        CHECK(t == NULL && kn_last_error()[0], "cut %zu", cut);
    }
    CHECK(ok_trunc == 0, "%d truncated files loaded", ok_trunc);
    /* random corruption: load may fail or succeed, and must never crash */
    kn_test_seed(7);
    char *c = malloc(n);
    int loaded = 0;
    for (int it = 0; it < 300; it++) {
        memcpy(c, d, n);
        int flips = 1 + (int)(kn_test_u64() % 8);
        for (int k = 0; k < flips; k++) c[kn_test_u64() % n] = (char)kn_test_u64();
        if (kn_tokenizer_load_llama2c_memory(c, n, 0, &t) == KN_OK) {
            loaded++;
            int32_t ids[256]; int m;
            kn_tokenize(t, "Once upon a time \xf0\x9f\x98\x80", 21, true, true, ids, 256, &m);
            char out[2048]; size_t need;
            kn_detokenize(t, ids, m < 256 ? m : 0, KN_DETOK_SPECIAL, out, sizeof out, &need);
            kn_tokenizer_free(t);
        } else CHECK(kn_last_error()[0], "message set");
    }
    printf("  %d of 300 corrupted tok512 files still loaded\n", loaded);
    free(c);
    CHECK(kn_tokenizer_load_llama2c("/nonexistent/tokenizer.bin", 0, &t) == KN_ERR_IO && !t, "missing file");
    CHECK(kn_tokenizer_load_llama2c_memory("\xff\xff\xff\xff", 4, 0, &t) == KN_ERR_FORMAT, "bad header");
    free(d);

    p = kn_asset("gpt2/gpt2_tokenizer.bin");
    if (p) {
        d = read_all(p, &n);
        REQUIRE(d, "read");
        for (size_t cut = 0; cut < n; cut += 997) {
            CHECK(kn_tokenizer_load_llmc_memory(d, cut, &t) != KN_OK && !t, "llmc cut %zu loaded", cut);
        }
        d[0] ^= 1;
        CHECK(kn_tokenizer_load_llmc_memory(d, n, &t) == KN_ERR_FORMAT, "bad magic");
        d[0] ^= 1;
        d[1024] = 0;   /* zero-length token */
        CHECK(kn_tokenizer_load_llmc_memory(d, n, &t) == KN_ERR_FORMAT, "zero-length token");
        free(d);
    }
}

/* ---- a SmolLM2-style GGUF built in memory ------------------------------------
 * The GPT-2 vocabulary and merges with tokenizer.ggml.pre = "smollm" (digits
 * split one by one) and SmolLM2's chat template, to test that pre-tokenizer
 * and template detection through kn_tokenizer_from_gguf. */

static void gb_key(bb *b, const char *k, uint32_t type) { bb_strn(b, k, strlen(k)); bb_u32(b, type); }
static void gb_kv_str(bb *b, const char *k, const char *v) { gb_key(b, k, KN_GGUF_STRING); bb_strn(b, v, strlen(v)); }

static const char SMOLLM2_TEMPLATE[] =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/* drop_cp >= 0: the token that is exactly that code point (a byte's
 * printable form) is renamed, so the vocabulary has no token for that byte,
 * and unknown_token_id is 0 (SmolLM2's vocabulary lacks 21 bytes so) */
static bb build_smollm_like_drop(const kn_gguf *src, const char *pre, int drop_cp) {
    bb b = {0};
    bb_put(&b, "GGUF", 4); bb_u32(&b, 3); bb_u64(&b, 0); bb_u64(&b, drop_cp >= 0 ? 7 : 6);
    if (drop_cp >= 0) { gb_key(&b, "tokenizer.ggml.unknown_token_id", KN_GGUF_U32); bb_u32(&b, 0); }
    char dropped[8];
    int nd = drop_cp >= 0 ? kn__utf8_encode((uint32_t)drop_cp, dropped) : 0;
    gb_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    gb_kv_str(&b, "tokenizer.ggml.pre", pre);
    gb_kv_str(&b, "tokenizer.chat_template", SMOLLM2_TEMPLATE);
    const char *arrs[2] = {"tokenizer.ggml.tokens", "tokenizer.ggml.merges"};
    for (int a = 0; a < 2; a++) {
        kn_gguf_type et; uint64_t n; const void *d;
        kn_gguf_get_arr(src, arrs[a], &et, &n, &d);
        gb_key(&b, arrs[a], KN_GGUF_ARRAY); bb_u32(&b, KN_GGUF_STRING); bb_u64(&b, n);
        for (uint64_t i = 0; i < n; i++) {
            kn_gguf_str s = kn_gguf_arr_str(src, arrs[a], i);
            if (a == 0 && nd && s.len == (uint64_t)nd && !memcmp(s.ptr, dropped, (size_t)nd)) bb_strn(&b, "<gone>", 6);
            else bb_strn(&b, s.ptr, s.len);
        }
    }
    {
        kn_gguf_type et; uint64_t n; const void *d;
        kn_gguf_get_arr(src, "tokenizer.ggml.token_type", &et, &n, &d);
        gb_key(&b, "tokenizer.ggml.token_type", KN_GGUF_ARRAY); bb_u32(&b, et); bb_u64(&b, n);
        bb_put(&b, d, n * 4);
    }
    while (b.n % 32) bb_put(&b, "", 1);
    return b;
}
static bb build_smollm_like(const kn_gguf *src, const char *pre) { return build_smollm_like_drop(src, pre, -1); }

/* A byte with no token in a byte-level vocabulary is dropped (Hugging
 * Face's BPE model has no unknown token), not mapped to unknown_token_id:
 * byte 0x04 (printable form U+0104) removed from the GPT-2 vocabulary,
 * "a\x04b" must be "a" then "b" (64 65), with no id 0 between. */
TEST(byte_without_token_is_dropped) {
    kn_gguf *src = NULL;
    kn_tokenizer *gpt2 = load_gguf_tok("gguf/ggml-vocab-gpt-2.gguf", &src);
    if (!gpt2) { kn_gguf_close(src); SKIP("gguf/ggml-vocab-gpt-2.gguf missing or unreadable"); }
    bb b = build_smollm_like_drop(src, "smollm", 0x104);
    kn_gguf *g = NULL;
    kn_tokenizer *tok = NULL;
    REQUIRE(kn_gguf_open_memory(b.p, b.n, &g) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_tokenizer_from_gguf(g, &tok) == KN_OK, "%s", kn_last_error());
    int32_t ids[64]; int n;
    REQUIRE(encode(tok, "a\x04" "b", false, false, ids, &n), "%s", kn_last_error());
    CHECK(n == 2 && ids[0] == 64 && ids[1] == 65, "'a\\x04b': %d ids (%d %d %d)", n, ids[0], n > 1 ? ids[1] : -1, n > 2 ? ids[2] : -1);
    REQUIRE(encode(tok, "\x04", false, false, ids, &n), "%s", kn_last_error());
    CHECK(n == 0, "a lone dropped byte gave %d ids", n);
    /* the full vocabulary still has it: one token, not dropped */
    REQUIRE(encode(gpt2, "a\x04" "b", false, false, ids, &n), "%s", kn_last_error());
    CHECK(n == 3 && ids[1] != 0, "gpt2 'a\\x04b': %d ids", n);
    kn_tokenizer_free(tok);
    kn_gguf_close(g);
    free(b.p);
    kn_gguf_close(src);
    kn_tokenizer_free(gpt2);
}

TEST(smollm_pretokenizer_and_template_from_gguf) {
    kn_gguf *src = NULL;
    kn_tokenizer *gpt2 = load_gguf_tok("gguf/ggml-vocab-gpt-2.gguf", &src);
    if (!gpt2) { kn_gguf_close(src); SKIP("gguf/ggml-vocab-gpt-2.gguf missing or unreadable"); }
    bb b = build_smollm_like(src, "smollm");
    kn_gguf *g = NULL;
    kn_tokenizer *tok = NULL;
    REQUIRE(kn_gguf_open_memory(b.p, b.n, &g) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_tokenizer_from_gguf(g, &tok) == KN_OK, "%s", kn_last_error());
    struct { const char *text; int n; int32_t ids[12]; } cases[] = {
        {"333333", 6, {18, 18, 18, 18, 18, 18}},
        {" 3 33", 5, {220, 18, 220, 18, 18}},
        {"Hello 2024 world", 7, {15496, 220, 17, 15, 17, 19, 995}},
        {"a1b", 3, {64, 16, 65}},
        {"Hello world", 2, {15496, 995}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int32_t ids[64]; int n;
        REQUIRE(encode(tok, cases[c].text, false, false, ids, &n), "%s", kn_last_error());
        bool same = n == cases[c].n && memcmp(ids, cases[c].ids, (size_t)n * 4) == 0;
        CHECK(same, "'%s': got %d ids (%d %d %d ...)", cases[c].text, n, ids[0], n > 1 ? ids[1] : -1,
              n > 2 ? ids[2] : -1);
    }
    /* the plain GPT-2 split keeps digit runs together: the two must differ */
    int32_t ids[64]; int n;
    REQUIRE(encode(gpt2, "333333", false, false, ids, &n), "%s", kn_last_error());
    CHECK(n == 2 && ids[0] == 24840 && ids[1] == 2091, "gpt2 split of 333333: n=%d", n);

    kn_chat_tmpl t;
    REQUIRE(kn_chat_template_from_gguf(g, &t) == KN_OK, "%s", kn_last_error());
    CHECK(t.format == KN_CHAT_JINJA, "format %d", (int)t.format);
    kn_chat_msg m[] = {{"user", "What is the capital of France?"}};
    char out[1024]; size_t need;
    REQUIRE(kn_chat_apply(&t, m, 1, true, out, sizeof out, &need) == KN_OK, "%s", kn_last_error());
    const char *want = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                       "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                       "<|im_start|>assistant\n";
    CHECK(strcmp(out, want) == 0, "rendered:\n%s", out);
    kn_chat_tmpl_free(&t);
    kn_tokenizer_free(tok);
    kn_gguf_close(g);
    free(b.p);
    /* an unknown pre-tokenizer is refused with a message naming it */
    b = build_smollm_like(src, "some-new-pre");
    REQUIRE(kn_gguf_open_memory(b.p, b.n, &g) == KN_OK, "%s", kn_last_error());
    CHECK(kn_tokenizer_from_gguf(g, &tok) == KN_ERR_UNSUPPORTED && !tok, "unknown pre accepted");
    CHECK(strstr(kn_last_error(), "some-new-pre") != NULL, "message: %s", kn_last_error());
    kn_gguf_close(g);
    free(b.p);
    kn_gguf_close(src);
    kn_tokenizer_free(gpt2);
}

/* The Llama 3 split on the GPT-2 vocabulary. Expected ids: the tiktoken-style
 * pattern run by Python's `regex` module, then plain GPT-2 BPE per word (a
 * word that is a whole vocabulary entry is taken as is). Offline, the same
 * comparison agreed on 4000 random strings mixing letters, digits, marks,
 * CJK, emoji, contractions and Unicode spaces (and 3000 each for the GPT-2
 * and SmolLM splits). */
TEST(llama3_pretokenizer_on_gpt2_vocab) {
    kn_gguf *src = NULL;
    kn_tokenizer *gpt2 = load_gguf_tok("gguf/ggml-vocab-gpt-2.gguf", &src);
    if (!gpt2) { kn_gguf_close(src); SKIP("gguf/ggml-vocab-gpt-2.gguf missing or unreadable"); }
    bb b = build_smollm_like(src, "llama-bpe");
    kn_gguf *g = NULL;
    kn_tokenizer *tok = NULL;
    REQUIRE(kn_gguf_open_memory(b.p, b.n, &g) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_tokenizer_from_gguf(g, &tok) == KN_OK, "%s", kn_last_error());
    struct { const char *text; int n; int32_t ids[12]; } cases[] = {
        {"Hello 12345 world", 5, {15496, 220, 10163, 2231, 995}},          /* 'Hello' ' ' '123' '45' ' world' */
        {"I'M here\n\n  x", 7, {40, 6, 44, 994, 628, 220, 2124}},        /* 'I' "'M" ' here' '\n\n' ' ' ' x' */
        {"(word) don'T stop!!\n", 9, {7, 4775, 8, 836, 6, 51, 2245, 3228, 198}},
        {"\t\tfoo  \n bar", 7, {197, 197, 21943, 220, 220, 198, 2318}}, /* '\t' '\tfoo' '  \n' ' bar' */
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        int32_t ids[64]; int n;
        REQUIRE(encode(tok, cases[c].text, false, false, ids, &n), "%s", kn_last_error());
        bool same = n == cases[c].n && memcmp(ids, cases[c].ids, (size_t)n * 4) == 0;
        CHECK(same, "case %zu: got %d ids (%d %d %d %d ...)", c, n, ids[0], n > 1 ? ids[1] : -1,
              n > 2 ? ids[2] : -1, n > 3 ? ids[3] : -1);
    }
    kn_tokenizer_free(tok);
    kn_gguf_close(g);
    free(b.p);
    kn_gguf_close(src);
    kn_tokenizer_free(gpt2);
}

/* ---- chat templates -------------------------------------------------------------- */

static const char *render(const kn_chat_tmpl *t, const kn_chat_msg *m, size_t n, bool gen) {
    static char buf[4096];
    size_t need;
    if (kn_chat_apply(t, m, n, gen, buf, sizeof buf, &need) != KN_OK) return kn_last_error();
    return buf;
}

TEST(chat_chatml) {
    kn_chat_tmpl t;
    REQUIRE(kn_chat_template_from_string(SMOLLM2_TEMPLATE, &t) == KN_OK, "%s", kn_last_error());
    kn_chat_msg m[] = {
        {"system", "You are terse."}, {"user", "Hi!"}, {"assistant", "Hello."}, {"user", "2+2?"},
    };
    const char *want =
        "<|im_start|>system\nYou are terse.<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
        "<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n";
    const char *got = render(&t, m, 4, true);
    CHECK(strcmp(got, want) == 0, "explicit system:\n%s", got);
    /* no system message: SmolLM2's default one is inserted; no generation prompt */
    want = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
           "<|im_start|>user\nHi!<|im_end|>\n"
           "<|im_start|>assistant\nHello.<|im_end|>\n";
    got = render(&t, m + 1, 2, false);
    CHECK(strcmp(got, want) == 0, "default system:\n%s", got);
    /* the built-in chatml has no default system prompt, smollm has SmolLM2's */
    kn_chat_tmpl_free(&t);
    REQUIRE(kn_chat_template_from_name("chatml", &t) == KN_OK, "name");
    got = render(&t, m + 1, 1, true);
    CHECK(strcmp(got, "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n") == 0, "%s", got);
    REQUIRE(kn_chat_template_from_name("smollm", &t) == KN_OK, "name");
    got = render(&t, m + 1, 1, true);
    CHECK(strncmp(got, "<|im_start|>system\nYou are a helpful AI assistant named SmolLM", 62) == 0, "%s", got);
    /* measuring and limits */
    size_t need;
    CHECK(kn_chat_apply(&t, m, 4, true, NULL, 0, &need) == KN_ERR_LIMIT && need > 0, "measure");
    char small[16];
    CHECK(kn_chat_apply(&t, m, 4, true, small, sizeof small, &need) == KN_ERR_LIMIT, "limit");
    kn_chat_msg badm = {"user", NULL};
    CHECK(kn_chat_apply(&t, &badm, 1, true, small, sizeof small, &need) == KN_ERR_INVALID, "NULL content");
}

/* plain: "Role: content" lines (content trimmed, role capitalised), the
 * assistant's turn opened with "Assistant:"; no special tokens */
TEST(chat_plain) {
    kn_chat_tmpl t;
    REQUIRE(kn_chat_template_from_name("plain", &t) == KN_OK, "name: %s", kn_last_error());
    kn_chat_msg m[3] = {{"system", "Be brief."}, {"user", "  Hello there \n"}, {"assistant", "Hi."}};
    char buf[256];
    size_t need;
    REQUIRE(kn_chat_apply(&t, m, 3, true, buf, sizeof buf, &need) == KN_OK, "%s", kn_last_error());
    CHECK(!strcmp(buf, "System: Be brief.\nUser: Hello there\nAssistant: Hi.\nAssistant:"), "got '%s'", buf);
    CHECK(need == strlen(buf), "need %zu", need);
    REQUIRE(kn_chat_apply(&t, m + 1, 1, false, buf, sizeof buf, &need) == KN_OK, "%s", kn_last_error());
    CHECK(!strcmp(buf, "User: Hello there\n"), "no generation prompt: got '%s'", buf);
}

TEST(chat_llama2) {
    kn_chat_tmpl t;
    REQUIRE(kn_chat_template_from_name("llama2", &t) == KN_OK && t.format == KN_CHAT_LLAMA2, "name");
    kn_chat_msg m[] = {
        {"system", "Be brief."}, {"user", " Hi there \n"}, {"assistant", "Hello!"}, {"user", "Name a color."},
    };
    const char *want = "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi there [/INST] Hello! </s>"
                       "<s>[INST] Name a color. [/INST]";
    const char *got = render(&t, m, 4, true);
    CHECK(strcmp(got, want) == 0, "with system:\n%s", got);
    want = "[INST] Hi there [/INST] Hello! </s><s>[INST] Name a color. [/INST]";
    got = render(&t, m + 1, 3, false);
    CHECK(strcmp(got, want) == 0, "without system:\n%s", got);
    kn_chat_msg bad[] = {{"user", "a"}, {"user", "b"}};
    size_t need; char buf[64];
    CHECK(kn_chat_apply(&t, bad, 2, true, buf, sizeof buf, &need) == KN_ERR_INVALID, "roles must alternate");
}

TEST(chat_llama3) {
    kn_chat_tmpl t;
    REQUIRE(kn_chat_template_from_name("llama3", &t) == KN_OK && t.format == KN_CHAT_LLAMA3, "name");
    /* the Llama 3 template through the interpreter renders the same (BOS dropped) */
    const char *j = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
                    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
                    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
                    "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
                    "<|end_header_id|>\n\n' }}{% endif %}";
    kn_chat_tmpl tj;
    REQUIRE(kn_chat_template_from_string(j, &tj) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_chat_template_set_tokens(&tj, "<|begin_of_text|>", "<|eot_id|>") == KN_OK, "tokens");
    kn_chat_msg m[] = {{"system", "You are a pirate."}, {"user", "Hello\n"}, {"assistant", " Arr!"}};
    const char *want = "<|start_header_id|>system<|end_header_id|>\n\nYou are a pirate.<|eot_id|>"
                       "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\nArr!<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\n";
    const char *got = render(&t, m, 3, true);
    CHECK(strcmp(got, want) == 0, "%s", got);
    got = render(&tj, m, 3, true);
    CHECK(strcmp(got, want) == 0, "interpreter: %s", got);
    kn_chat_tmpl_free(&tj);
}

TEST(chat_unknown_template) {
    kn_chat_tmpl t;
    /* any template compiles now; one using a feature the interpreter lacks is refused with a hint */
    kn_status st = kn_chat_template_from_string("{% for m in messages %}<start_of_turn>{{ m.content }}{% endfor %}", &t);
    CHECK(st == KN_OK, "status %d: %s", (int)st, kn_last_error());
    kn_chat_tmpl_free(&t);
    st = kn_chat_template_from_string("{% call f() %}{% endcall %}", &t);
    CHECK(st == KN_ERR_UNSUPPORTED, "status %d", (int)st);
    CHECK(strstr(kn_last_error(), "--chat-template chatml|llama2|llama3") != NULL, "hint: %s", kn_last_error());
    CHECK(kn_chat_template_from_name("vicuna", &t) == KN_ERR_UNSUPPORTED, "name");
    kn_gguf *g = NULL;
    const char *p = kn_asset("gguf/ggml-vocab-gpt-2.gguf");
    if (p && kn_gguf_open(p, &g) == KN_OK) {
        CHECK(kn_chat_template_from_gguf(g, &t) == KN_ERR_UNSUPPORTED, "GGUF without a template");
        kn_gguf_close(g);
    }
}

KN_TEST_MAIN()
