/* test_hftok.c: kn_tokenizer_load_hf against the Hugging Face `tokenizers`
 * library. scripts/hftok_ref.py trains twelve small tokenizers (GPT-2,
 * Llama 3, Qwen2 (with NFC) and SmolLM-style byte-level BPE, Llama 2 and Mistral-style
 * (Metaspace "first") byte-fallback
 * BPE, BERT WordPiece (cased, and uncased with strip_accents), Whitespace/Punctuation/Digits BPE and WordPiece, Unigram
 * with and without byte fallback), saves their
 * tokenizer.json under tests/fixtures/hftok/ and records, for 1,068 strings
 * (all scripts, emoji, whitespace runs, control bytes, code, added tokens in
 * the text, the empty string), the library's ids and decodings in
 * ref.bin.gz. Every id and every decoding must match exactly. Also: the
 * tokenizer_config.json hook, and clear errors for bad or unsupported files.
 */
#include "kn_test.h"
#include "kiln.h"
#include "kiln_tokenizer.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define DIR "tests/fixtures/hftok/"

/* ---- ref.bin.gz (format in scripts/hftok_ref.py) ---- */
typedef struct rd { const unsigned char *p; size_t n, o; bool bad; } rd;
static uint32_t rd_u32(rd *r) {
    if (r->o + 4 > r->n) { r->bad = true; return 0; }
    uint32_t v; memcpy(&v, r->p + r->o, 4); r->o += 4; return v;
}
static const unsigned char *rd_bytes(rd *r, size_t n) {
    if (r->o + n > r->n) { r->bad = true; return NULL; }
    const unsigned char *p = r->p + r->o; r->o += n; return p;
}

static unsigned char *gunzip(const char *path, size_t *n) {
    gzFile f = gzopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 20, len = 0;
    unsigned char *b = malloc(cap);
    for (;;) {
        if (len == cap) { cap *= 2; b = realloc(b, cap); }
        int k = gzread(f, b + len, (unsigned)(cap - len));
        if (k <= 0) break;
        len += (size_t)k;
    }
    gzclose(f);
    *n = len;
    return b;
}

static void show(const char *what, const unsigned char *s, size_t n) {
    fprintf(stderr, "    %s: \"", what);
    for (size_t i = 0; i < n && i < 120; i++)
        fprintf(stderr, s[i] >= 32 && s[i] < 127 && s[i] != '"' ? "%c" : "\\x%02x", s[i]);
    fprintf(stderr, "\"\n");
}

TEST(reference_encodings) {
    size_t n = 0;
    unsigned char *blob = gunzip(DIR "ref.bin.gz", &n);
    REQUIRE(blob, "cannot read " DIR "ref.bin.gz (run scripts/hftok_ref.py)");
    rd r = {blob, n, 0, false};
    const unsigned char *magic = rd_bytes(&r, 4);
    REQUIRE(magic && !memcmp(magic, "KNHT", 4) && rd_u32(&r) == 1, "bad magic/version");
    uint32_t ns = rd_u32(&r), nt = rd_u32(&r);
    REQUIRE(ns >= 1000 && nt >= 8, "only %u strings, %u tokenizers", ns, nt);
    const unsigned char **str = malloc(ns * sizeof *str);
    size_t *len = malloc(ns * sizeof *len);
    for (uint32_t i = 0; i < ns; i++) { len[i] = rd_u32(&r); str[i] = rd_bytes(&r, len[i]); }
    REQUIRE(!r.bad, "truncated string table");
    int32_t *ids = malloc(1 << 20);
    char *dec = malloc(1 << 16);
    long total_ids = 0;
    for (uint32_t k = 0; k < nt; k++) {
        uint32_t nl = rd_u32(&r);
        const unsigned char *nm = rd_bytes(&r, nl);
        REQUIRE(nm && nl < 64, "bad tokenizer name");
        char name[64], path[256];
        memcpy(name, nm, nl); name[nl] = 0;
        if (!strcmp(name, "llama3")) snprintf(path, sizeof path, DIR "llama3");   /* a directory */
        else snprintf(path, sizeof path, DIR "%s.json", name);
        kn_tokenizer *tok = NULL;
        kn_status st = kn_tokenizer_load_hf(path, &tok);
        REQUIRE(st == KN_OK, "%s: %s", path, kn_last_error());
        CHECK(kn_tokenizer_get_kind(tok) == KN_TOKENIZER_HF, "%s: kind", name);
        int bad_enc = 0, bad_dec = 0, refused = 0;
        bool nfc = !strcmp(name, "qwen2");
        long nids = 0;
        for (uint32_t i = 0; i < ns; i++) {
            uint32_t m = rd_u32(&r);
            REQUIRE(!r.bad && m < 65536, "%s: truncated ids", name);
            const unsigned char *rid = rd_bytes(&r, 2u * m);
            const unsigned char *same = rd_bytes(&r, 1);
            REQUIRE(rid && same, "%s: truncated", name);
            const unsigned char *want = str[i]; size_t want_n = len[i];
            if (!*same) { want_n = rd_u32(&r); want = rd_bytes(&r, want_n); REQUIRE(want, "%s: truncated", name); }
            int got = 0;
            st = kn_tokenize(tok, (const char *)str[i], len[i], false, true, ids, 1 << 18, &got);
            /* qwen2 has an NFC normalizer: text NFC might change is refused, not guessed */
            bool refuse = st == KN_ERR_UNSUPPORTED && nfc && strstr(kn_last_error(), "NFC");
            refused += refuse;
            bool ok = refuse || (st == KN_OK && (uint32_t)got == m);
            for (uint32_t j = 0; ok && !refuse && j < m; j++) ok = ids[j] == (int32_t)(rid[2 * j] | rid[2 * j + 1] << 8);
            nids += m;
            if (!ok) {
                if (bad_enc++ < 3) {
                    fprintf(stderr, "  %s: string %u encodes differently (%s; %d ids, want %u)\n", name, i,
                            st == KN_OK ? "ok" : kn_last_error(), got, m);
                    show("text", str[i], len[i]);
                    fprintf(stderr, "    got :");
                    for (int j = 0; j < got && j < 24; j++) fprintf(stderr, " %d", ids[j]);
                    fprintf(stderr, "\n    want:");
                    for (uint32_t j = 0; j < m && j < 24; j++) fprintf(stderr, " %d", rid[2 * j] | rid[2 * j + 1] << 8);
                    fprintf(stderr, "\n");
                }
            }
            /* decode the reference ids: the library's decode(ids) */
            for (uint32_t j = 0; j < m; j++) ids[j] = rid[2 * j] | rid[2 * j + 1] << 8;
            size_t need = 0;
            st = kn_detokenize(tok, ids, (int)m, KN_DETOK_STRIP_SPACE, dec, 1 << 16, &need);
            if (st != KN_OK || need != want_n || memcmp(dec, want, want_n)) {
                if (bad_dec++ < 3) {
                    fprintf(stderr, "  %s: string %u decodes differently\n", name, i);
                    show("got ", (const unsigned char *)dec, need);
                    show("want", want, want_n);
                }
            }
        }
        printf("  %-10s %4u strings, %6ld ids: %d encodings and %d decodings differ", name, ns, nids, bad_enc, bad_dec);
        if (nfc) printf(" (%d strings refused: NFC might change them)", refused);
        printf("\n");
        CHECK(refused * 10 < (int)ns, "%s: %d of %u strings refused", name, refused, ns);
        CHECK(bad_enc == 0 && bad_dec == 0, "%s: %d encodings, %d decodings differ from the tokenizers library",
              name, bad_enc, bad_dec);
        total_ids += nids;
        kn_tokenizer_free(tok);
    }
    CHECK(total_ids > 100000, "only %ld reference ids", total_ids);
    CHECK(r.o == r.n, "trailing bytes in ref.bin.gz");
    free(ids); free(dec); free(str); free(len); free(blob);
}

/* tokenizer_config.json beside tokenizer.json: BOS/EOS/add_bos/chat template */
TEST(config_and_added_tokens) {
    kn_tokenizer *tok = NULL;
    REQUIRE(kn_tokenizer_load_hf(DIR "llama3", &tok) == KN_OK, "%s", kn_last_error());
    int32_t bos = kn_tokenizer_find(tok, "<|begin_of_text|>", 17), eot = kn_tokenizer_find(tok, "<|eot_id|>", 10);
    CHECK(bos >= 0 && kn_tokenizer_bos(tok) == bos, "bos %d, want %d", kn_tokenizer_bos(tok), bos);
    CHECK(eot >= 0 && kn_tokenizer_eos(tok) == eot && kn_tokenizer_is_eog(tok, eot), "eos");
    CHECK(kn_tokenizer_add_bos(tok), "add_bos_token");
    const char *ct = kn_tokenizer_chat_template(tok);
    CHECK(ct && strstr(ct, "bos_token"), "chat_template kept");
    CHECK(kn_tokenizer_token_type(tok, bos) == KN_TOKEN_CONTROL, "special added token is CONTROL");
    int32_t cu = kn_tokenizer_find(tok, "<|custom|>", 10);
    CHECK(cu >= 0 && kn_tokenizer_token_type(tok, cu) == KN_TOKEN_USER_DEFINED, "non-special added token");
    int32_t ids[16]; int n = 0;
    /* specials need parse_special; user-defined ones always match */
    CHECK(kn_tokenize(tok, "<|eot_id|>", 10, true, true, ids, 16, &n) == KN_OK && n == 2 && ids[0] == bos &&
          ids[1] == eot, "BOS + <|eot_id|> (n %d)", n);
    CHECK(kn_tokenize(tok, "<|eot_id|>", 10, false, false, ids, 16, &n) == KN_OK && n > 1, "no parse_special: text");
    CHECK(kn_tokenize(tok, "<|custom|>", 10, false, false, ids, 16, &n) == KN_OK && n == 1 && ids[0] == cu, "custom");
    kn_tokenizer_free(tok);
    /* without the config: no BOS */
    REQUIRE(kn_tokenizer_load_hf(DIR "gpt2.json", &tok) == KN_OK, "%s", kn_last_error());
    CHECK(kn_tokenizer_bos(tok) < 0 && !kn_tokenizer_add_bos(tok) && !kn_tokenizer_chat_template(tok), "gpt2 config");
    CHECK(kn_tokenizer_is_eog(tok, kn_tokenizer_find(tok, "<|endoftext|>", 13)), "<|endoftext|> ends generation");
    kn_tokenizer_free(tok);
}

/* ---- errors: a clear status and message, never a crash ---- */

static char *slurp(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END); long l = ftell(f); fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)l + 1);
    *n = fread(b, 1, (size_t)l, f); b[*n] = 0;
    fclose(f);
    return b;
}

/* Load json with `from` replaced by `to` (first occurrence). */
static kn_status load_edited(const char *base, const char *from, const char *to) {
    size_t n; char *s = slurp(base, &n);
    if (!s) return KN_ERR_IO;
    char *hit = strstr(s, from);
    if (!hit) { free(s); return (kn_status)-1; }
    size_t lf = strlen(from), lt = strlen(to), pre = (size_t)(hit - s);
    char *e = malloc(n - lf + lt + 1);
    memcpy(e, s, pre); memcpy(e + pre, to, lt); memcpy(e + pre + lt, hit + lf, n - pre - lf + 1);
    kn_tokenizer *tok = (kn_tokenizer *)1;
    kn_status st = kn_tokenizer_load_hf_memory(e, n - lf + lt, NULL, 0, &tok);
    if (st == KN_OK) kn_tokenizer_free(tok);
    else if (tok != NULL) st = (kn_status)-2;        /* *out must be NULL on failure */
    free(s); free(e);
    return st;
}

#define EXPECT(st_, want, needle) do { kn_status s_ = (st_); \
    CHECK(s_ == (want) && strstr(kn_last_error(), needle), "status %d (want %d), message \"%s\" should name \"%s\"", \
          (int)s_, (int)(want), kn_last_error(), needle); } while (0)

TEST(errors) {
    kn_tokenizer *tok = NULL;
    EXPECT(kn_tokenizer_load_hf(DIR "no_such_dir", &tok), KN_ERR_IO, "no_such_dir");
    EXPECT(kn_tokenizer_load_hf_memory("{", 1, NULL, 0, &tok), KN_ERR_FORMAT, "tokenizer.json");
    EXPECT(kn_tokenizer_load_hf_memory("[]", 2, NULL, 0, &tok), KN_ERR_FORMAT, "not an object");
    EXPECT(kn_tokenizer_load_hf_memory("{}", 2, NULL, 0, &tok), KN_ERR_FORMAT, "model");
    EXPECT(load_edited(DIR "gpt2.json", "\"type\":\"BPE\"", "\"type\":\"WordLevel\""), KN_ERR_UNSUPPORTED, "WordLevel");
    EXPECT(load_edited(DIR "llama2.json", "\"type\":\"Prepend\"", "\"type\":\"Precompiled\""), KN_ERR_UNSUPPORTED, "Precompiled");
    EXPECT(load_edited(DIR "llama3/tokenizer.json", "\\\\p{N}{1,3}", "\\\\p{N}{1,4}"), KN_ERR_UNSUPPORTED, "\\p{N}{1,4}");
    EXPECT(load_edited(DIR "gpt2.json", "\"type\":\"ByteLevel\"", "\"type\":\"UnicodeScripts\""), KN_ERR_UNSUPPORTED, "UnicodeScripts");
    EXPECT(load_edited(DIR "bert.json", "\"type\":\"BertNormalizer\"", "\"type\":\"NFD\""), KN_ERR_UNSUPPORTED, "NFD");
    EXPECT(load_edited(DIR "gpt2.json", "\"<|endoftext|>\":0", "\"<|endoftext|>\":99999999999"), KN_ERR_FORMAT, "out of range");
    EXPECT(load_edited(DIR "gpt2.json", "\"<|endoftext|>\":0", "\"<|endoftext|>\":1e400"), KN_ERR_FORMAT, "");
    EXPECT(load_edited(DIR "gpt2.json", "\"<|endoftext|>\":0", "\"<|endoftext|>\":-1"), KN_ERR_FORMAT, "out of range");
    EXPECT(load_edited(DIR "gpt2.json", "\"<|endoftext|>\":0", "\"<|endoftext|>\":\"zero\""), KN_ERR_FORMAT, "integer");
    EXPECT(load_edited(DIR "gpt2.json", "\"dropout\":null", "\"dropout\":0.1"), KN_ERR_UNSUPPORTED, "dropout");
    EXPECT(load_edited(DIR "gpt2.json", "\"merges\":[\"", "\"merges\":[\"zzzzq "), KN_ERR_FORMAT, "not in the vocabulary");
    EXPECT(load_edited(DIR "gpt2.json", "\"merges\":[", "\"merges\":[7,"), KN_ERR_FORMAT, "merge 0");
    EXPECT(load_edited(DIR "bert.json", "\"unk_token\":\"[UNK]\"", "\"unk_token\":\"[NOPE]\""), KN_ERR_FORMAT, "[NOPE]");
    EXPECT(load_edited(DIR "unigram.json", "\"unk_id\":0", "\"unk_id\":100000"), KN_ERR_FORMAT, "unk_id");
    EXPECT(load_edited(DIR "unigram.json", "[\"<unk>\",0.0]", "[\"<unk>\"]"), KN_ERR_FORMAT, "[piece, score]");
    /* NFC: exact where it changes nothing, refused (at encode) where it might */
    size_t n; char *s = slurp(DIR "gpt2.json", &n);
    REQUIRE(s, "gpt2.json");
    char *hit = strstr(s, "\"normalizer\":null");
    REQUIRE(hit, "gpt2.json has no null normalizer");
    const char *nfc = "\"normalizer\":{\"type\":\"NFC\"}";
    char *e = malloc(n + 64);
    size_t pre = (size_t)(hit - s);
    memcpy(e, s, pre); strcpy(e + pre, nfc); strcpy(e + pre + strlen(nfc), hit + strlen("\"normalizer\":null"));
    kn_tokenizer *plain = NULL;
    REQUIRE(kn_tokenizer_load_hf_memory(e, strlen(e), NULL, 0, &tok) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_tokenizer_load_hf_memory(s, n, NULL, 0, &plain) == KN_OK, "%s", kn_last_error());
    int32_t a[64], b[64]; int na = 0, nb = 0;
    const char *txt = "Caf\xc3\xa9 au lait, 12 \xe4\xbd\xa0\xe5\xa5\xbd";
    CHECK(kn_tokenize(tok, txt, strlen(txt), false, true, a, 64, &na) == KN_OK &&
          kn_tokenize(plain, txt, strlen(txt), false, true, b, 64, &nb) == KN_OK && na == nb &&
          !memcmp(a, b, (size_t)na * sizeof *a), "NFC of NFC text is the identity");
    EXPECT(kn_tokenize(tok, "e\xcc\x81", 3, false, true, a, 64, &na), KN_ERR_UNSUPPORTED, "U+0301");
    kn_tokenizer_free(tok); kn_tokenizer_free(plain);
    free(s); free(e);
}

KN_TEST_MAIN()
