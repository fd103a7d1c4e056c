/* shards.c: llm.c token shards (.bin: 256 int32 header {20240520, 1,
 * n_tokens}, then n_tokens little-endian uint16) and GPT-2 tokenization of
 * text files into them, documents separated by <|endoftext|> as llm.c's
 * dev/data scripts write them.
 * Non-goals: llm.c's uint32 Llama 3 shards (magic 20240801), big-endian hosts. */
#include "kiln_data.h"
#include "kiln_tokenizer.h"   /* defines: kn_tokenize */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HDR_INTS 256
#define HDR_BYTES (HDR_INTS * 4)

/* ---- reading ----------------------------------------------------------------- */

static kn_status check_header(const int32_t *h, uint64_t data_bytes, const char *what) {
    if (h[0] != KN_SHARD_MAGIC)
        return kn_set_error(KN_ERR_FORMAT, "shard %s: magic %d, expected %d (llm.c GPT-2 token shard)%s", what, h[0],
                            KN_SHARD_MAGIC, h[0] == 20240801 ? "; uint32 Llama 3 shards are not supported" : "");
    if (h[1] != KN_SHARD_VERSION)
        return kn_set_error(KN_ERR_FORMAT, "shard %s: version %d, expected %d (uint16 tokens)", what, h[1], KN_SHARD_VERSION);
    if (h[2] < 0)
        return kn_set_error(KN_ERR_FORMAT, "shard %s: negative token count %d", what, h[2]);
    if ((uint64_t)h[2] * 2 != data_bytes)
        return kn_set_error(KN_ERR_FORMAT, "shard %s: header says %d tokens (%llu bytes) but %llu data bytes follow "
                            "the header; the file is truncated or corrupt", what, h[2],
                            (unsigned long long)h[2] * 2, (unsigned long long)data_bytes);
    return KN_OK;
}

kn_status kn_shard_read_memory(const void *data, size_t size, uint16_t **tokens, int64_t *n) {
    if (!tokens || !n || (!data && size)) return kn_set_error(KN_ERR_INVALID, "kn_shard_read_memory: NULL argument");
    *tokens = NULL; *n = 0;
    if (size < HDR_BYTES)
        return kn_set_error(KN_ERR_FORMAT, "shard (memory): %zu bytes, shorter than the %d-byte header", size, HDR_BYTES);
    int32_t h[HDR_INTS];
    memcpy(h, data, HDR_BYTES);
    kn_status st = check_header(h, size - HDR_BYTES, "(memory)");
    if (st) return st;
    uint16_t *t = malloc(h[2] ? (size_t)h[2] * 2 : 1);
    if (!t) return kn_set_error(KN_ERR_NOMEM, "shard: out of memory for %d tokens", h[2]);
    memcpy(t, (const char *)data + HDR_BYTES, (size_t)h[2] * 2);
    *tokens = t; *n = h[2];
    return KN_OK;
}

kn_status kn_shard_read(const char *path, uint16_t **tokens, int64_t *n) {
    if (!path || !tokens || !n) return kn_set_error(KN_ERR_INVALID, "kn_shard_read: NULL argument");
    *tokens = NULL; *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return kn_set_error(KN_ERR_IO, "shard: cannot open '%s'", path);
    kn_status st = KN_OK;
    uint16_t *t = NULL;
    int32_t h[HDR_INTS];
    long end = -1;
    if (fseek(f, 0, SEEK_END) == 0) end = ftell(f);
    if (end < 0 || fseek(f, 0, SEEK_SET) != 0) { st = kn_set_error(KN_ERR_IO, "shard: cannot seek in '%s'", path); goto done; }
    if (end < HDR_BYTES || fread(h, 1, HDR_BYTES, f) != HDR_BYTES) {
        st = kn_set_error(KN_ERR_FORMAT, "shard '%s': %ld bytes, shorter than the %d-byte header", path, end, HDR_BYTES);
        goto done;
    }
    st = check_header(h, (uint64_t)end - HDR_BYTES, path);
    if (st) goto done;
    t = malloc(h[2] ? (size_t)h[2] * 2 : 1);
    if (!t) { st = kn_set_error(KN_ERR_NOMEM, "shard '%s': out of memory for %d tokens", path, h[2]); goto done; }
    if (fread(t, 2, (size_t)h[2], f) != (size_t)h[2]) { st = kn_set_error(KN_ERR_IO, "shard '%s': short read", path); goto done; }
    *tokens = t; *n = h[2]; t = NULL;
done:
    free(t);
    fclose(f);
    return st;
}

/* ---- writing ----------------------------------------------------------------------- */

kn_status kn_shard_write(const char *path, const int32_t *tokens, int64_t n) {
    if (!path || n < 0 || (n && !tokens)) return kn_set_error(KN_ERR_INVALID, "kn_shard_write: NULL argument or n < 0");
    if (n > INT32_MAX)
        return kn_set_error(KN_ERR_LIMIT, "kn_shard_write: %lld tokens; the int32 header holds at most %d per shard",
                            (long long)n, INT32_MAX);
    for (int64_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] > 65535)
            return kn_set_error(KN_ERR_INVALID, "kn_shard_write: token %d at %lld does not fit uint16 (0..65535)",
                                tokens[i], (long long)i);
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    uint16_t *chunk = malloc(65536 * sizeof *chunk);
    if (!tmp || !chunk) { free(tmp); free(chunk); return kn_set_error(KN_ERR_NOMEM, "kn_shard_write: out of memory"); }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    kn_status st = KN_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) { st = kn_set_error(KN_ERR_IO, "kn_shard_write: cannot create '%s'", tmp); goto done; }
    int32_t h[HDR_INTS] = {KN_SHARD_MAGIC, KN_SHARD_VERSION, (int32_t)n};
    bool ok = fwrite(h, 1, HDR_BYTES, f) == HDR_BYTES;
    for (int64_t i = 0; i < n && ok; i += 65536) {
        size_t m = (size_t)(n - i < 65536 ? n - i : 65536);
        for (size_t k = 0; k < m; k++) chunk[k] = (uint16_t)tokens[i + (int64_t)k];
        ok = fwrite(chunk, 2, m, f) == m;
    }
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) {
        remove(tmp);
        st = kn_set_error(KN_ERR_IO, "kn_shard_write: cannot write '%s' (disk full or no permission?)", path);
    }
done:
    free(tmp); free(chunk);
    return st;
}

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
