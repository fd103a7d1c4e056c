/* tokenize_docs.c: GPT-2 tokenization of text files into llm.c token shards
 * (kn_tokenize_documents, kn_tokenize_file_to_shards; declared in
 * kiln_data.h), documents separated by <|endoftext|> as llm.c's dev/data
 * scripts write them. It lives in llm/ because it runs the tokenizer; the
 * shard format itself is in src/data/shards.c. */
#include "kiln_data.h"
#include "kiln_tokenizer.h"   /* defines: kn_tokenize */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- tokenizing documents -------------------------------------------------------- */

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\v' || c == '\f'; }

typedef struct ivec { int32_t *p; int64_t n, cap; } ivec;
static bool ivec_reserve(ivec *v, int64_t extra) {
    if (v->n + extra <= v->cap) return true;
    int64_t c = v->cap ? v->cap : 1024;
    while (c < v->n + extra) c *= 2;
    int32_t *np = realloc(v->p, (size_t)c * sizeof *np);
    if (!np) return false;
    v->p = np; v->cap = c;
    return true;
}

kn_status kn_tokenize_documents(const struct kn_tokenizer *tok, const char *text, size_t len,
                                const char *separator, int32_t eot, int32_t **ids, int64_t *n) {
    if (!tok || !ids || !n || (len && !text)) return kn_set_error(KN_ERR_INVALID, "kn_tokenize_documents: NULL argument");
    *ids = NULL; *n = 0;
    if (eot < 0 || eot >= kn_tokenizer_n_vocab(tok))
        return kn_set_error(KN_ERR_INVALID, "kn_tokenize_documents: eot id %d is not in the vocabulary (%d tokens)", eot,
                            kn_tokenizer_n_vocab(tok));
    size_t sl = separator ? strlen(separator) : 0;
    ivec v = {0};
    size_t pos = 0;
    while (pos <= len) {
        /* document: [pos, end) up to the next separator */
        size_t end = len;
        if (sl)
            for (size_t i = pos; i + sl <= len; i++)
                if (text[i] == separator[0] && memcmp(text + i, separator, sl) == 0) { end = i; break; }
        size_t a = pos, b = end;
        while (a < b && is_space(text[a])) a++;
        while (b > a && is_space(text[b - 1])) b--;
        if (b > a) {
            if (b - a > (size_t)INT32_MAX - 2) { free(v.p); return kn_set_error(KN_ERR_LIMIT, "kn_tokenize_documents: a document of %zu bytes is too long", b - a); }
            /* GPT-2 byte-level BPE gives at most one token per byte */
            if (!ivec_reserve(&v, (int64_t)(b - a) + 1)) { free(v.p); return kn_set_error(KN_ERR_NOMEM, "kn_tokenize_documents: out of memory"); }
            v.p[v.n++] = eot;
            int got = 0;
            kn_status st = kn_tokenize(tok, text + a, b - a, false, false, v.p + v.n, (int)(b - a), &got);
            if (st == KN_ERR_LIMIT) {                       /* a vocabulary that can exceed one token per byte */
                if (!ivec_reserve(&v, got)) { free(v.p); return kn_set_error(KN_ERR_NOMEM, "kn_tokenize_documents: out of memory"); }
                st = kn_tokenize(tok, text + a, b - a, false, false, v.p + v.n, got, &got);
            }
            if (st) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", kn_last_error());
                free(v.p);
                return kn_set_error(st, "kn_tokenize_documents: document at byte %zu: %s", a, msg);
            }
            v.n += got;
        }
        if (end == len) break;
        pos = end + sl;
    }
    *ids = v.p; *n = v.n;
    return KN_OK;
}

kn_status kn_tokenize_file_to_shards(const struct kn_tokenizer *tok, const char *text_path,
                                     const char *separator, int32_t eot, const char *out_prefix,
                                     int64_t shard_tokens, int *n_shards, int64_t *n_tokens) {
    if (!out_prefix || shard_tokens < 1 || shard_tokens > INT32_MAX)
        return kn_set_error(KN_ERR_INVALID, "kn_tokenize_file_to_shards: out_prefix NULL or shard_tokens %lld not in 1..2^31-1",
                            (long long)shard_tokens);
    char *text;
    size_t len;
    kn_status st = kn_text_read(text_path, &text, &len);
    if (st) return st;
    int32_t *ids;
    int64_t n;
    st = kn_tokenize_documents(tok, text, len, separator, eot, &ids, &n);
    free(text);
    if (st) return st;
    size_t pl = strlen(out_prefix) + 32;
    char *path = malloc(pl);
    if (!path) { free(ids); return kn_set_error(KN_ERR_NOMEM, "kn_tokenize_file_to_shards: out of memory"); }
    int k = 0;
    for (int64_t i = 0; i < n && !st; i += shard_tokens, k++) {
        snprintf(path, pl, "%s_%06d.bin", out_prefix, k);
        st = kn_shard_write(path, ids + i, n - i < shard_tokens ? n - i : shard_tokens);
    }
    free(path); free(ids);
    if (st) return st;
    if (n_shards) *n_shards = k;
    if (n_tokens) *n_tokens = n;
    return KN_OK;
}
