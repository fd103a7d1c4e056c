/* shards.c: llm.c token shards (.bin: 256 int32 header {20240520, 1,
 * n_tokens}, then n_tokens little-endian uint16). Tokenizing text files
 * into shards needs a tokenizer (llm/, above data/): src/llm/tokenize_docs.c.
 * Non-goals: llm.c's uint32 Llama 3 shards (magic 20240801), big-endian hosts. */
#include "kiln_data.h"
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
