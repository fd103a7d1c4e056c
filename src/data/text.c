/* text.c: raw text files and character-level vocabularies (char-RNN /
 * nanoGPT "shakespeare_char" style): ids are the distinct characters of the
 * text sorted by value. Byte level treats every byte as a character; char
 * level decodes UTF-8 code points.
 * Non-goals: Unicode normalization, unknown-character fallback ids. */
#include "kiln_data.h"
#include "kiln_tokenizer.h"   /* defines: kn_utf8_valid_prefix */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

kn_status kn_text_read(const char *path, char **text, size_t *len) {
    if (!path || !text || !len) return kn_set_error(KN_ERR_INVALID, "kn_text_read: NULL argument");
    *text = NULL; *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return kn_set_error(KN_ERR_IO, "text: cannot open '%s'; check the path (KN_ASSETS for test assets)", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (n < cap) break;
        char *nb = cap > ((size_t)1 << 40) ? NULL : realloc(buf, cap * 2 + 1);
        if (!nb) { free(buf); buf = NULL; break; }
        buf = nb; cap *= 2;
    }
    bool err = ferror(f);
    fclose(f);
    if (!buf) return kn_set_error(KN_ERR_NOMEM, "text: out of memory reading '%s'", path);
    if (err) { free(buf); return kn_set_error(KN_ERR_IO, "text: read error on '%s'", path); }
    buf[n] = 0;
    *text = buf; *len = n;
    return KN_OK;
}

/* ---- character vocabulary ------------------------------------------------------ */

struct kn_char_vocab {
    bool byte_level;
    int32_t size;
    uint32_t *chars;          /* [size] sorted                                 */
    int32_t ascii[128];       /* id of a byte / ASCII code point, -1 if absent */
    int32_t hi_bytes[128];    /* byte level: bytes 128..255                    */
};

/* Code point at s (valid UTF-8 assumed); *adv gets its length. */
static uint32_t utf8_next(const unsigned char *s, size_t *adv) {
    if (s[0] < 0x80) { *adv = 1; return s[0]; }
    if (s[0] < 0xE0) { *adv = 2; return ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F); }
    if (s[0] < 0xF0) { *adv = 3; return ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F); }
    *adv = 4;
    return ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}
static size_t utf8_put(uint32_t c, char *out) {
    if (c < 0x80) { out[0] = (char)c; return 1; }
    if (c < 0x800) { out[0] = (char)(0xC0 | (c >> 6)); out[1] = (char)(0x80 | (c & 0x3F)); return 2; }
    if (c < 0x10000) {
        out[0] = (char)(0xE0 | (c >> 12)); out[1] = (char)(0x80 | ((c >> 6) & 0x3F)); out[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (c >> 18)); out[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((c >> 6) & 0x3F)); out[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

static int cmp_u32(const void *a, const void *b) {
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

static int32_t vocab_id(const kn_char_vocab *v, uint32_t c) {
    if (c < 128) return v->ascii[c];
    if (v->byte_level) return c < 256 ? v->hi_bytes[c - 128] : -1;
    int32_t lo = 0, hi = v->size - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        if (v->chars[mid] == c) return mid;
        if (v->chars[mid] < c) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
}

kn_status kn_char_vocab_build(const char *text, size_t len, bool byte_level, kn_char_vocab **out) {
    if (!out || (!text && len)) return kn_set_error(KN_ERR_INVALID, "kn_char_vocab_build: NULL argument");
    *out = NULL;
    const unsigned char *s = (const unsigned char *)text;
    if (!byte_level) {
        size_t ok = kn_utf8_valid_prefix(text, len);
        if (ok != len)
            return kn_set_error(KN_ERR_INVALID, "char vocab: invalid UTF-8 at byte %zu; use byte_level for binary text", ok);
    }
    /* distinct characters: a bitmap for the BMP, a sorted list for the rest */
    uint8_t *seen = calloc(0x10000 / 8, 1);
    uint32_t *astral = NULL;
    size_t n_astral = 0, cap_astral = 0;
    kn_char_vocab *v = calloc(1, sizeof *v);
    if (!seen || !v) goto oom;
    for (size_t i = 0; i < len;) {
        size_t adv = 1;
        uint32_t c = byte_level ? s[i] : utf8_next(s + i, &adv);
        i += adv;
        if (c < 0x10000) { seen[c >> 3] |= (uint8_t)(1u << (c & 7)); continue; }
        if (n_astral == cap_astral) {
            cap_astral = cap_astral ? 2 * cap_astral : 16;
            uint32_t *na = realloc(astral, cap_astral * sizeof *na);
            if (!na) goto oom;
            astral = na;
        }
        astral[n_astral++] = c;
    }
    if (n_astral) qsort(astral, n_astral, sizeof *astral, cmp_u32);
    size_t n_unique_astral = 0;
    for (size_t i = 0; i < n_astral; i++)
        if (i == 0 || astral[i] != astral[i - 1]) astral[n_unique_astral++] = astral[i];
    size_t count = n_unique_astral;
    for (uint32_t c = 0; c < 0x10000; c++) count += (seen[c >> 3] >> (c & 7)) & 1;
    v->chars = malloc((count ? count : 1) * sizeof *v->chars);
    if (!v->chars) goto oom;
    v->byte_level = byte_level;
    v->size = 0;
    for (uint32_t c = 0; c < 0x10000; c++)
        if ((seen[c >> 3] >> (c & 7)) & 1) v->chars[v->size++] = c;
    for (size_t i = 0; i < n_unique_astral; i++) v->chars[v->size++] = astral[i];
    for (int k = 0; k < 128; k++) v->ascii[k] = v->hi_bytes[k] = -1;
    for (int32_t id = 0; id < v->size; id++) {
        uint32_t c = v->chars[id];
        if (c < 128) v->ascii[c] = id;
        else if (byte_level) v->hi_bytes[c - 128] = id;
    }
    free(seen); free(astral);
    *out = v;
    return KN_OK;
oom:
    free(seen); free(astral);
    kn_char_vocab_free(v);
    return kn_set_error(KN_ERR_NOMEM, "char vocab: out of memory");
}

void kn_char_vocab_free(kn_char_vocab *v) {
    if (!v) return;
    free(v->chars);
    free(v);
}
int32_t kn_char_vocab_size(const kn_char_vocab *v) { return v ? v->size : 0; }
uint32_t kn_char_vocab_char(const kn_char_vocab *v, int32_t id) {
    return (v && id >= 0 && id < v->size) ? v->chars[id] : 0;
}

kn_status kn_char_encode(const kn_char_vocab *v, const char *text, size_t len, int32_t *ids, int64_t *n) {
    if (!v || !n || (len && (!text || !ids))) return kn_set_error(KN_ERR_INVALID, "kn_char_encode: NULL argument");
    *n = 0;
    const unsigned char *s = (const unsigned char *)text;
    if (!v->byte_level) {
        size_t ok = kn_utf8_valid_prefix(text, len);
        if (ok != len) return kn_set_error(KN_ERR_INVALID, "kn_char_encode: invalid UTF-8 at byte %zu", ok);
    }
    int64_t k = 0;
    for (size_t i = 0; i < len;) {
        size_t adv = 1;
        uint32_t c = v->byte_level ? s[i] : utf8_next(s + i, &adv);
        int32_t id = vocab_id(v, c);
        if (id < 0)
            return kn_set_error(KN_ERR_INVALID, "kn_char_encode: character U+%04X at byte %zu is not in the vocabulary "
                                "(built from another text?)", (unsigned)c, i);
        ids[k++] = id;
        i += adv;
    }
    *n = k;
    return KN_OK;
}

kn_status kn_char_decode(const kn_char_vocab *v, const int32_t *ids, int64_t n, char *buf, size_t cap,
                         size_t *len) {
    if (!v || !len || (n > 0 && !ids) || n < 0) return kn_set_error(KN_ERR_INVALID, "kn_char_decode: NULL argument");
    size_t need = 0;
    char tmp[4];
    for (int64_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= v->size)
            return kn_set_error(KN_ERR_INVALID, "kn_char_decode: id %d at %lld out of range [0, %d)", ids[i], (long long)i, v->size);
        need += v->byte_level ? 1 : utf8_put(v->chars[ids[i]], tmp);
    }
    *len = need;
    if (need > cap || (need && !buf))
        return kn_set_error(KN_ERR_LIMIT, "kn_char_decode: needs %zu bytes, buffer has %zu", need, cap);
    size_t o = 0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t c = v->chars[ids[i]];
        if (v->byte_level) buf[o++] = (char)c;
        else o += utf8_put(c, buf + o);
    }
    return KN_OK;
}
