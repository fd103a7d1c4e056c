/* gguf.c: GGUF v2/v3 reader (see gguf.h for the contract).
 *
 * File layout (little-endian):
 *   "GGUF" u32 version u64 n_tensors u64 n_kv
 *   n_kv x   { string key; u32 type; value }
 *   n_tensors x { string name; u32 n_dims; u64 ne[n_dims]; u32 ggml_type; u64 offset }
 *   padding to general.alignment (default 32), then the tensor data section.
 * A string is u64 length + bytes (no NUL). An array value is u32 elem_type,
 * u64 n, then n elements (which may themselves be arrays).
 *
 * Everything is validated once at open, with every count checked against the
 * bytes that remain before anything is allocated, so a hostile file cannot
 * make us allocate more than a small multiple of its own size. Non-goals:
 * writing GGUF, big-endian files, GGUF v1.
 */
#include "formats/gguf.h"
#include "formats/mapfile.h"   /* defines: kn_mapfile_open, kn_mapfile_close */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
#define GGUF_MAX_NESTING 8          /* arrays of arrays deeper than this are rejected */

/* ---- GGML type ids ---------------------------------------------------------- */

static const char *ggml_type_name(uint32_t t) {
    static const char *names[] = {
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2 (removed)", "Q4_3 (removed)", "Q5_0", "Q5_1",
        "Q8_0", "Q8_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS",
        "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64",
        "F64", "IQ1_M", "BF16", "Q4_0_4_4 (removed)", "Q4_0_4_8 (removed)",
        "Q4_0_8_8 (removed)", "TQ1_0", "TQ2_0", "IQ4_NL_4_4 (removed)",
        "IQ4_NL_4_8 (removed)", "IQ4_NL_8_8 (removed)", "MXFP4",
    };
    return t < sizeof names / sizeof names[0] ? names[t] : "unknown";
}

/* GGML type id -> kn_dtype; false for types kiln cannot use. */
static bool ggml_to_dtype(uint32_t t, kn_dtype *d) {
    switch (t) {
    case 0:  *d = KN_F32;  return true;
    case 1:  *d = KN_F16;  return true;
    case 2:  *d = KN_Q4_0; return true;
    case 3:  *d = KN_Q4_1; return true;
    case 6:  *d = KN_Q5_0; return true;
    case 7:  *d = KN_Q5_1; return true;
    case 8:  *d = KN_Q8_0; return true;
    case 9:  *d = KN_Q8_1; return true;
    case 12: *d = KN_Q4_K; return true;
    case 13: *d = KN_Q5_K; return true;
    case 14: *d = KN_Q6_K; return true;
    case 15: *d = KN_Q8_K; return true;
    case 24: *d = KN_I8;   return true;
    case 26: *d = KN_I32;  return true;
    case 27: *d = KN_I64;  return true;
    case 28: *d = KN_F64;  return true;
    case 30: *d = KN_BF16; return true;
    default: return false;
    }
}

static const char *gguf_type_name(uint32_t t) {
    static const char *names[] = {"u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool",
                                  "string", "array", "u64", "i64", "f64"};
    return t <= KN_GGUF_F64 ? names[t] : "?";
}

/* Size of a fixed-size value type; 0 for string/array/unknown. */
static size_t gguf_scalar_size(uint32_t t) {
    switch (t) {
    case KN_GGUF_U8: case KN_GGUF_I8: case KN_GGUF_BOOL: return 1;
    case KN_GGUF_U16: case KN_GGUF_I16: return 2;
    case KN_GGUF_U32: case KN_GGUF_I32: case KN_GGUF_F32: return 4;
    case KN_GGUF_U64: case KN_GGUF_I64: case KN_GGUF_F64: return 8;
    default: return 0;
    }
}

/* ---- the handle ---------------------------------------------------------------- */

typedef struct gguf_kv {
    kn_gguf_str key;
    uint32_t type;
    uint64_t off;                /* file offset of the value                         */
    /* scalars: the raw bytes, widened; strings: s                                     */
    union { uint64_t u; int64_t i; double f; } v;
    kn_gguf_str s;
    /* arrays                                                                          */
    uint32_t arr_type;
    uint64_t arr_n;
    const uint8_t *arr_data;     /* first element                                      */
    uint64_t *str_off;           /* string arrays: file offset of each element's length */
} gguf_kv;

struct kn_gguf {
    kn_mapfile *file;            /* NULL for open_memory                             */
    const uint8_t *base;
    size_t size;
    uint32_t version;
    size_t alignment;
    int64_t n_kv, n_tensors;
    gguf_kv *kv;
    int64_t *kv_sorted;          /* kv indices sorted by key                         */
    kn_gguf_tensor *tensors;
    int64_t *t_sorted;           /* tensor indices sorted by name                    */
    uint64_t data_start;         /* file offset of the tensor data section           */
};

/* ---- bounded reader ------------------------------------------------------------- */

typedef struct rd { const uint8_t *p; size_t size, pos; } rd;

static size_t rd_left(const rd *r) { return r->size - r->pos; }
static bool rd_u32(rd *r, uint32_t *v) {
    if (rd_left(r) < 4) return false;
    const uint8_t *p = r->p + r->pos;
    *v = (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
    r->pos += 4;
    return true;
}
static bool rd_u64(rd *r, uint64_t *v) {
    uint32_t lo, hi;
    if (rd_left(r) < 8) return false;
    rd_u32(r, &lo); rd_u32(r, &hi);
    *v = (uint64_t)hi << 32 | lo;
    return true;
}
static uint64_t load_le(const uint8_t *p, size_t n) {
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* Strict UTF-8 (no overlongs, no surrogates, <= U+10FFFF). */
static bool utf8_valid(const uint8_t *s, uint64_t n) {
    uint64_t i = 0;
    while (i < n) {
        uint8_t c = s[i];
        if (c < 0x80) { i++; continue; }
        int len; uint32_t cp, min;
        if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; min = 0x80; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; min = 0x800; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; min = 0x10000; }
        else return false;
        if (n - i < (uint64_t)len) return false;
        for (int k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += (uint64_t)len;
    }
    return true;
}

/* Printable, bounded copy of a file string for error messages. */
static const char *shown(kn_gguf_str s, char *buf, size_t cap) {
    size_t j = 0;
    for (uint64_t i = 0; i < s.len && j + 5 < cap; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c >= 0x20 && c < 0x7f && c != '\\') buf[j++] = (char)c;
        else j += (size_t)snprintf(buf + j, cap - j, "\\x%02x", c);
    }
    if (s.len > 0 && j + 5 >= cap && j + 4 <= cap) { memcpy(buf + j, "...", 3); j += 3; }
    buf[j < cap ? j : cap - 1] = 0;
    return buf;
}

static bool rd_str(rd *r, kn_gguf_str *s) {
    uint64_t n;
    size_t at = r->pos;
    if (!rd_u64(r, &n)) return false;
    if (n > rd_left(r)) { r->pos = at; return false; }
    s->ptr = (const char *)(r->p + r->pos);
    s->len = n;
    r->pos += (size_t)n;
    return true;
}

/* ---- parsing -------------------------------------------------------------------- */

#define FAIL(...) do { st = kn_set_error(KN_ERR_FORMAT, __VA_ARGS__); goto fail; } while (0)

/* Skip one value of type t (validating it), non-recursively for nested arrays:
 * each nesting level keeps (elem_type, remaining) on a small explicit stack. */
static kn_status skip_value(rd *r, uint32_t t, int max_depth, const char *what, char *kb) {
    struct { uint32_t type; uint64_t left; } stk[GGUF_MAX_NESTING];
    int depth = 0;
    kn_status st = KN_OK;
    for (;;) {
        uint32_t cur;
        if (depth == 0) cur = t;
        else {
            while (depth > 0 && stk[depth - 1].left == 0) depth--;
            if (depth == 0) return KN_OK;
            stk[depth - 1].left--;
            cur = stk[depth - 1].type;
            /* fast path: a run of fixed-size elements */
            size_t es = gguf_scalar_size(cur);
            if (es) {
                uint64_t n = stk[depth - 1].left + 1;
                if (n > rd_left(r) / es)
                    FAIL("%s '%s': array of %llu %s elements at byte %zu runs past the end of the "
                         "file (%zu bytes); the file is truncated or corrupt",
                         what, kb, (unsigned long long)n, gguf_type_name(cur), r->pos, r->size);
                r->pos += (size_t)(n * es);
                stk[depth - 1].left = 0;
                continue;
            }
        }
        size_t at = r->pos;
        size_t es = gguf_scalar_size(cur);
        if (es) {
            if (rd_left(r) < es)
                FAIL("%s '%s': value at byte %zu runs past the end of the file", what, kb, at);
            r->pos += es;
        } else if (cur == KN_GGUF_STRING) {
            kn_gguf_str s;
            if (!rd_str(r, &s))
                FAIL("%s '%s': string at byte %zu runs past the end of the file (%zu bytes)",
                     what, kb, at, r->size);
        } else if (cur == KN_GGUF_ARRAY) {
            uint32_t et; uint64_t n;
            if (!rd_u32(r, &et) || !rd_u64(r, &n))
                FAIL("%s '%s': array header at byte %zu runs past the end of the file", what, kb, at);
            if (et > KN_GGUF_F64)
                FAIL("%s '%s': array at byte %zu has unknown element type %u (valid: 0..12)",
                     what, kb, at, et);
            size_t min = gguf_scalar_size(et);
            if (!min) min = et == KN_GGUF_STRING ? 8 : 12;
            if (n > rd_left(r) / min)
                FAIL("%s '%s': array at byte %zu claims %llu elements of type %s, more than the "
                     "%zu bytes left in the file can hold", what, kb, at, (unsigned long long)n,
                     gguf_type_name(et), rd_left(r));
            if (depth >= max_depth)
                FAIL("%s '%s': arrays nested deeper than %d levels at byte %zu", what, kb,
                     GGUF_MAX_NESTING, at);
            stk[depth].type = et; stk[depth].left = n; depth++;
        } else {
            FAIL("%s '%s': unknown value type %u at byte %zu (valid: 0..12)", what, kb, cur, at);
        }
        if (depth == 0) return KN_OK;
    }
fail:
    return st;
}

static int cmp_str(kn_gguf_str a, kn_gguf_str b) {
    size_t n = a.len < b.len ? (size_t)a.len : (size_t)b.len;
    int c = n ? memcmp(a.ptr, b.ptr, n) : 0;
    if (c) return c;
    return a.len < b.len ? -1 : a.len > b.len;
}
typedef int (*idx_cmp)(const kn_gguf *g, int64_t a, int64_t b);
static int cmp_kv_idx(const kn_gguf *g, int64_t a, int64_t b) { return cmp_str(g->kv[a].key, g->kv[b].key); }
static int cmp_t_idx(const kn_gguf *g, int64_t a, int64_t b) {
    return cmp_str(g->tensors[a].name, g->tensors[b].name);
}
static int cmp_t_off(const kn_gguf *g, int64_t a, int64_t b) {
    uint64_t x = g->tensors[a].offset, y = g->tensors[b].offset;
    return x < y ? -1 : x > y;
}

/* In-place heapsort of an index array (qsort has no context argument, and a
 * file-scope context would not be thread-safe). O(n log n), no recursion. */
static void sift_down(const kn_gguf *g, int64_t *idx, int64_t root, int64_t n, idx_cmp cmp) {
    for (;;) {
        int64_t child = 2 * root + 1;
        if (child >= n) return;
        if (child + 1 < n && cmp(g, idx[child], idx[child + 1]) < 0) child++;
        if (cmp(g, idx[root], idx[child]) >= 0) return;
        int64_t t = idx[root]; idx[root] = idx[child]; idx[child] = t;
        root = child;
    }
}
static void sort_idx(const kn_gguf *g, int64_t *idx, int64_t n, idx_cmp cmp) {
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    for (int64_t i = n / 2 - 1; i >= 0; i--) sift_down(g, idx, i, n, cmp);
    for (int64_t end = n - 1; end > 0; end--) {
        int64_t t = idx[0]; idx[0] = idx[end]; idx[end] = t;
        sift_down(g, idx, 0, end, cmp);
    }
}

static kn_status parse(kn_gguf *g) {
    kn_status st = KN_OK;
    rd r = {g->base, g->size, 0};
    char kb[160], kb2[160];
    kb[0] = 0;

    /* header */
    if (g->size < 4 || memcmp(g->base, "GGUF", 4) != 0) {
        if (g->size >= 4 && memcmp(g->base, "FUGG", 4) == 0)
            FAIL("big-endian GGUF files are not supported; convert the model on a little-endian machine");
        FAIL("not a GGUF file: the first 4 bytes are not 'GGUF' (file has %zu bytes)", g->size);
    }
    r.pos = 4;
    uint32_t version;
    if (!rd_u32(&r, &version)) FAIL("GGUF header truncated at byte 4 (file has %zu bytes)", g->size);
    if (version == 1)
        FAIL("GGUF version 1 is not supported (only 2 and 3); re-convert the model with a current llama.cpp");
    if (version != 2 && version != 3)
        FAIL("GGUF version %u is not supported (only 2 and 3)", version);
    g->version = version;
    uint64_t n_tensors, n_kv;
    if (!rd_u64(&r, &n_tensors)) FAIL("GGUF header truncated at byte 8: missing tensor count");
    if (!rd_u64(&r, &n_kv)) FAIL("GGUF header truncated at byte 16: missing key/value count");
    /* smallest key/value: 8-byte length + 0-byte key + 4-byte type + 1-byte value;
     * smallest tensor info: 8 + 0 + 4 + 8 (one dim) + 4 + 8 */
    if (n_kv > rd_left(&r) / 13)
        FAIL("GGUF header claims %llu key/value pairs, more than the %zu remaining bytes can hold; "
             "the file is corrupt", (unsigned long long)n_kv, rd_left(&r));
    if (n_tensors > rd_left(&r) / 32)
        FAIL("GGUF header claims %llu tensors, more than the %zu remaining bytes can hold; the file is corrupt",
             (unsigned long long)n_tensors, rd_left(&r));
    g->n_kv = (int64_t)n_kv;
    g->n_tensors = (int64_t)n_tensors;
    g->kv = calloc(n_kv ? (size_t)n_kv : 1, sizeof *g->kv);
    g->kv_sorted = malloc((n_kv ? (size_t)n_kv : 1) * sizeof *g->kv_sorted);
    g->tensors = calloc(n_tensors ? (size_t)n_tensors : 1, sizeof *g->tensors);
    g->t_sorted = malloc((n_tensors ? (size_t)n_tensors : 1) * sizeof *g->t_sorted);
    if (!g->kv || !g->kv_sorted || !g->tensors || !g->t_sorted)
        return kn_set_error(KN_ERR_NOMEM, "out of memory reading GGUF header (%llu keys, %llu tensors)",
                            (unsigned long long)n_kv, (unsigned long long)n_tensors);

    /* key/value pairs */
    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++) {
        gguf_kv *kv = &g->kv[i];
        size_t at = r.pos;
        if (!rd_str(&r, &kv->key))
            FAIL("key #%llu at byte %zu runs past the end of the file (%zu bytes); the file is truncated",
                 (unsigned long long)i, at, g->size);
        shown(kv->key, kb, sizeof kb);
        if (!utf8_valid((const uint8_t *)kv->key.ptr, kv->key.len))
            FAIL("key #%llu at byte %zu ('%s') is not valid UTF-8", (unsigned long long)i, at, kb);
        if (kv->key.len == 0) FAIL("key #%llu at byte %zu is empty", (unsigned long long)i, at);
        size_t tat = r.pos;
        if (!rd_u32(&r, &kv->type))
            FAIL("key '%s': value type at byte %zu runs past the end of the file", kb, tat);
        if (kv->type > KN_GGUF_F64)
            FAIL("key '%s': unknown value type %u at byte %zu (valid: 0..12)", kb, kv->type, tat);
        kv->off = r.pos;
        size_t es = gguf_scalar_size(kv->type);
        if (es) {
            if (rd_left(&r) < es) FAIL("key '%s': value at byte %zu runs past the end of the file", kb, r.pos);
            uint64_t raw = load_le(r.p + r.pos, es);
            switch (kv->type) {
            case KN_GGUF_I8:  kv->v.i = (int8_t)raw; break;
            case KN_GGUF_I16: kv->v.i = (int16_t)raw; break;
            case KN_GGUF_I32: kv->v.i = (int32_t)raw; break;
            case KN_GGUF_I64: memcpy(&kv->v.i, &raw, 8); break;
            case KN_GGUF_F32: { uint32_t b = (uint32_t)raw; float f; memcpy(&f, &b, 4); kv->v.f = f; break; }
            case KN_GGUF_F64: memcpy(&kv->v.f, &raw, 8); break;
            default: kv->v.u = raw; break;
            }
            r.pos += es;
        } else if (kv->type == KN_GGUF_STRING) {
            if (!rd_str(&r, &kv->s))
                FAIL("key '%s': string value at byte %zu runs past the end of the file (%zu bytes)",
                     kb, kv->off, g->size);
        } else { /* array */
            uint32_t et; uint64_t n;
            if (!rd_u32(&r, &et) || !rd_u64(&r, &n))
                FAIL("key '%s': array header at byte %zu runs past the end of the file", kb, kv->off);
            if (et > KN_GGUF_F64)
                FAIL("key '%s': array at byte %zu has unknown element type %u (valid: 0..12)", kb, kv->off, et);
            kv->arr_type = et; kv->arr_n = n; kv->arr_data = r.p + r.pos;
            size_t ees = gguf_scalar_size(et);
            size_t min = ees ? ees : (et == KN_GGUF_STRING ? 8 : 12);
            if (n > rd_left(&r) / min)
                FAIL("key '%s': array at byte %zu claims %llu elements of type %s, more than the %zu "
                     "bytes left in the file can hold; the file is truncated or corrupt",
                     kb, kv->off, (unsigned long long)n, gguf_type_name(et), rd_left(&r));
            if (ees) {
                r.pos += (size_t)(n * ees);
            } else if (et == KN_GGUF_STRING) {
                kv->str_off = malloc((n ? (size_t)n : 1) * sizeof *kv->str_off);
                if (!kv->str_off)
                    return kn_set_error(KN_ERR_NOMEM, "out of memory indexing the %llu strings of key '%s'",
                                        (unsigned long long)n, kb);
                for (uint64_t j = 0; j < n; j++) {
                    kn_gguf_str s;
                    kv->str_off[j] = r.pos;
                    if (!rd_str(&r, &s))
                        FAIL("key '%s': string #%llu at byte %zu runs past the end of the file (%zu bytes)",
                             kb, (unsigned long long)j, r.pos, g->size);
                }
            } else {
                /* array of arrays: validate and skip; exposed as raw bytes only */
                for (uint64_t j = 0; j < n; j++)
                    if ((st = skip_value(&r, KN_GGUF_ARRAY, GGUF_MAX_NESTING - 1, "key", kb)) != KN_OK) goto fail;
            }
        }
        if (kv->key.len == 17 && memcmp(kv->key.ptr, "general.alignment", 17) == 0) {
            uint64_t a;
            if (kv->type == KN_GGUF_U32 || kv->type == KN_GGUF_U64 || kv->type == KN_GGUF_U16 ||
                kv->type == KN_GGUF_U8) a = kv->v.u;
            else if (kv->type == KN_GGUF_I32 || kv->type == KN_GGUF_I64 || kv->type == KN_GGUF_I16 ||
                     kv->type == KN_GGUF_I8) a = kv->v.i < 0 ? 0 : (uint64_t)kv->v.i;
            else FAIL("key 'general.alignment' at byte %zu has type %s, expected u32", at, gguf_type_name(kv->type));
            if (a == 0 || (a & (a - 1)) != 0 || a > (1u << 30))
                FAIL("key 'general.alignment' at byte %zu is %llu, which is not a power of two "
                     "(between 1 and 2^30)", at, (unsigned long long)a);
            g->alignment = (size_t)a;
        }
    }
    sort_idx(g, g->kv_sorted, g->n_kv, cmp_kv_idx);
    for (int64_t i = 1; i < g->n_kv; i++) {
        const gguf_kv *a = &g->kv[g->kv_sorted[i - 1]], *b = &g->kv[g->kv_sorted[i]];
        if (cmp_str(a->key, b->key) == 0) {
            const gguf_kv *later = a->off > b->off ? a : b;
            FAIL("duplicate key '%s' (second copy's value at byte %llu); the file is corrupt",
                 shown(later->key, kb, sizeof kb), (unsigned long long)later->off);
        }
    }

    /* tensor infos */
    for (uint64_t i = 0; i < n_tensors; i++) {
        kn_gguf_tensor *t = &g->tensors[i];
        size_t at = r.pos;
        if (!rd_str(&r, &t->name))
            FAIL("tensor #%llu: name at byte %zu runs past the end of the file (%zu bytes)",
                 (unsigned long long)i, at, g->size);
        shown(t->name, kb, sizeof kb);
        if (t->name.len == 0) FAIL("tensor #%llu at byte %zu has an empty name", (unsigned long long)i, at);
        if (!utf8_valid((const uint8_t *)t->name.ptr, t->name.len))
            FAIL("tensor #%llu at byte %zu: name '%s' is not valid UTF-8", (unsigned long long)i, at, kb);
        uint32_t nd;
        if (!rd_u32(&r, &nd)) FAIL("tensor '%s' (info at byte %zu): truncated before n_dims", kb, at);
        if (nd < 1 || nd > GGUF_MAX_DIMS)
            FAIL("tensor '%s' (info at byte %zu) has %u dimensions; GGUF allows 1 to %d",
                 kb, at, nd, GGUF_MAX_DIMS);
        t->n_dims = (int)nd;
        uint64_t nel = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < nd; d++) {
            uint64_t ne;
            if (!rd_u64(&r, &ne)) FAIL("tensor '%s' (info at byte %zu): truncated in ne[%u]", kb, at, d);
            if (ne == 0 || ne > (uint64_t)INT64_MAX)
                FAIL("tensor '%s' (info at byte %zu): ne[%u] = %llu is not a positive size",
                     kb, at, d, (unsigned long long)ne);
            if (nel > (uint64_t)INT64_MAX / ne)
                FAIL("tensor '%s' (info at byte %zu): element count overflows 64 bits", kb, at);
            nel *= ne;
            t->ne[d] = (int64_t)ne;
        }
        if (!rd_u32(&r, &t->ggml_type)) FAIL("tensor '%s' (info at byte %zu): truncated before its type", kb, at);
        if (!ggml_to_dtype(t->ggml_type, &t->type))
            FAIL("tensor '%s' has GGML type %u (%s) which kiln does not support yet; "
                 "re-quantize the model to one of F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K",
                 kb, t->ggml_type, ggml_type_name(t->ggml_type));
        const kn_dtype_info *di = kn_dtype_get(t->type);
        if (t->ne[0] % di->block_size != 0)
            FAIL("tensor '%s' (info at byte %zu): ne[0] = %lld is not a multiple of the %s block size %lld",
                 kb, at, (long long)t->ne[0], di->name, (long long)di->block_size);
        uint64_t nblk = nel / (uint64_t)di->block_size;
        if (nblk > SIZE_MAX / di->type_size)
            FAIL("tensor '%s' (info at byte %zu): byte size overflows", kb, at);
        t->nbytes = (size_t)(nblk * di->type_size);
        if (!rd_u64(&r, &t->offset)) FAIL("tensor '%s' (info at byte %zu): truncated before its offset", kb, at);
    }
    /* data section */
    uint64_t ds = r.pos;
    uint64_t pad = (g->alignment - ds % g->alignment) % g->alignment;
    g->data_start = ds + pad;
    if (n_tensors > 0 && g->data_start > g->size)
        FAIL("tensor data section would start at byte %llu, past the end of the file (%zu bytes); "
             "the file is truncated", (unsigned long long)g->data_start, g->size);
    uint64_t data_size = g->size > g->data_start ? g->size - g->data_start : 0;
    for (uint64_t i = 0; i < n_tensors; i++) {
        kn_gguf_tensor *t = &g->tensors[i];
        shown(t->name, kb, sizeof kb);
        if (t->offset % g->alignment != 0)
            FAIL("tensor '%s': data offset %llu is not a multiple of the alignment %zu",
                 kb, (unsigned long long)t->offset, g->alignment);
        if (t->offset > data_size || t->nbytes > data_size - t->offset)
            FAIL("tensor '%s': data [%llu, +%zu) at file byte %llu runs past the end of the file (%zu bytes); "
                 "the file is truncated", kb, (unsigned long long)t->offset, t->nbytes,
                 (unsigned long long)(g->data_start + t->offset), g->size);
        t->data = g->base + g->data_start + t->offset;
    }
    sort_idx(g, g->t_sorted, g->n_tensors, cmp_t_idx);
    for (int64_t i = 1; i < g->n_tensors; i++) {
        const kn_gguf_tensor *a = &g->tensors[g->t_sorted[i - 1]], *b = &g->tensors[g->t_sorted[i]];
        if (cmp_str(a->name, b->name) == 0)
            FAIL("duplicate tensor name '%s'; the file is corrupt", shown(b->name, kb, sizeof kb));
    }
    /* overlap check, by offset (reuse a scratch index array) */
    if (g->n_tensors > 1) {
        int64_t *by_off = malloc((size_t)g->n_tensors * sizeof *by_off);
        if (!by_off) return kn_set_error(KN_ERR_NOMEM, "out of memory checking tensor offsets");
        sort_idx(g, by_off, g->n_tensors, cmp_t_off);
        for (int64_t i = 1; i < g->n_tensors; i++) {
            const kn_gguf_tensor *a = &g->tensors[by_off[i - 1]], *b = &g->tensors[by_off[i]];
            if (a->nbytes > 0 && b->offset < a->offset + a->nbytes) {
                shown(a->name, kb, sizeof kb);
                shown(b->name, kb2, sizeof kb2);
                free(by_off);
                FAIL("tensors '%s' and '%s' overlap in the data section (offsets %llu and %llu)",
                     kb, kb2, (unsigned long long)a->offset, (unsigned long long)b->offset);
            }
        }
        free(by_off);
    }
    return KN_OK;
fail:
    return st;
}

static void free_handle(kn_gguf *g) {
    if (!g) return;
    if (g->kv)
        for (int64_t i = 0; i < g->n_kv; i++) free(g->kv[i].str_off);
    free(g->kv); free(g->kv_sorted); free(g->tensors); free(g->t_sorted);
    kn_mapfile_close(g->file);
    free(g);
}

kn_status kn_gguf_open_memory(const void *data, size_t size, kn_gguf **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_gguf_open_memory: out is NULL");
    *out = NULL;
    if (!data && size) return kn_set_error(KN_ERR_INVALID, "kn_gguf_open_memory: data is NULL");
    kn_gguf *g = calloc(1, sizeof *g);
    if (!g) return kn_set_error(KN_ERR_NOMEM, "out of memory opening a GGUF file");
    g->base = data ? data : (const uint8_t *)"";
    g->size = size;
    kn_status s = parse(g);
    if (s != KN_OK) { free_handle(g); return s; }
    *out = g;
    return KN_OK;
}

kn_status kn_gguf_open(const char *path, kn_gguf **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_gguf_open: out is NULL");
    *out = NULL;
    kn_mapfile *m;
    kn_status s = kn_mapfile_open(path, &m);
    if (s != KN_OK) return s;
    kn_gguf *g = NULL;
    s = kn_gguf_open_memory(m->data, m->size, &g);
    if (s != KN_OK) return kn_mapfile_fail(m, path, s);
    g->file = m;
    *out = g;
    return KN_OK;
}

void kn_gguf_close(kn_gguf *g) { free_handle(g); }

/* ---- accessors ------------------------------------------------------------------- */

uint32_t kn_gguf_version(const kn_gguf *g) { return g ? g->version : 0; }
size_t kn_gguf_alignment(const kn_gguf *g) { return g ? g->alignment : 0; }
int64_t kn_gguf_n_kv(const kn_gguf *g) { return g ? g->n_kv : 0; }
int64_t kn_gguf_n_tensors(const kn_gguf *g) { return g ? g->n_tensors : 0; }
uint64_t kn_gguf_data_offset(const kn_gguf *g) { return g ? g->data_start : 0; }

int64_t kn_gguf_find_key(const kn_gguf *g, const char *key) {
    if (!g || !key) return -1;
    kn_gguf_str k = {key, strlen(key)};
    int64_t lo = 0, hi = g->n_kv - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = cmp_str(g->kv[g->kv_sorted[mid]].key, k);
        if (c == 0) return g->kv_sorted[mid];
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
}

kn_gguf_str kn_gguf_key(const kn_gguf *g, int64_t i) {
    kn_gguf_str none = {NULL, 0};
    if (!g || i < 0 || i >= g->n_kv) return none;
    return g->kv[i].key;
}

kn_gguf_type kn_gguf_kv_type(const kn_gguf *g, int64_t i) {
    if (!g || i < 0 || i >= g->n_kv) return (kn_gguf_type)-1;
    return (kn_gguf_type)g->kv[i].type;
}

static const gguf_kv *find_kv(const kn_gguf *g, const char *key) {
    int64_t i = kn_gguf_find_key(g, key);
    return i < 0 ? NULL : &g->kv[i];
}

static bool is_unsigned(uint32_t t) {
    return t == KN_GGUF_U8 || t == KN_GGUF_U16 || t == KN_GGUF_U32 || t == KN_GGUF_U64 || t == KN_GGUF_BOOL;
}
static bool is_signed(uint32_t t) {
    return t == KN_GGUF_I8 || t == KN_GGUF_I16 || t == KN_GGUF_I32 || t == KN_GGUF_I64;
}

bool kn_gguf_get_i64(const kn_gguf *g, const char *key, int64_t *v) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv) return false;
    if (is_signed(kv->type)) { *v = kv->v.i; return true; }
    if (is_unsigned(kv->type)) {
        uint64_t u = kv->type == KN_GGUF_BOOL ? (kv->v.u != 0) : kv->v.u;
        if (u > (uint64_t)INT64_MAX) return false;
        *v = (int64_t)u;
        return true;
    }
    return false;
}

bool kn_gguf_get_u64(const kn_gguf *g, const char *key, uint64_t *v) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv) return false;
    if (is_unsigned(kv->type)) { *v = kv->type == KN_GGUF_BOOL ? (kv->v.u != 0) : kv->v.u; return true; }
    if (is_signed(kv->type)) {
        if (kv->v.i < 0) return false;
        *v = (uint64_t)kv->v.i;
        return true;
    }
    return false;
}

bool kn_gguf_get_f64(const kn_gguf *g, const char *key, double *v) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv) return false;
    if (kv->type == KN_GGUF_F32 || kv->type == KN_GGUF_F64) { *v = kv->v.f; return true; }
    if (is_signed(kv->type)) { *v = (double)kv->v.i; return true; }
    if (kv->type == KN_GGUF_BOOL) { *v = kv->v.u != 0; return true; }
    if (is_unsigned(kv->type)) { *v = (double)kv->v.u; return true; }
    return false;
}

bool kn_gguf_get_bool(const kn_gguf *g, const char *key, bool *v) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != KN_GGUF_BOOL) return false;
    *v = kv->v.u != 0;
    return true;
}

bool kn_gguf_get_str(const kn_gguf *g, const char *key, kn_gguf_str *v) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != KN_GGUF_STRING) return false;
    *v = kv->s;
    return true;
}

bool kn_gguf_get_arr(const kn_gguf *g, const char *key, kn_gguf_type *elem_type,
                     uint64_t *n, const void **data) {
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != KN_GGUF_ARRAY) return false;
    if (elem_type) *elem_type = (kn_gguf_type)kv->arr_type;
    if (n) *n = kv->arr_n;
    if (data) *data = gguf_scalar_size(kv->arr_type) ? (const void *)kv->arr_data : NULL;
    return true;
}

kn_gguf_str kn_gguf_arr_str(const kn_gguf *g, const char *key, uint64_t i) {
    kn_gguf_str s = {NULL, 0};
    const gguf_kv *kv = find_kv(g, key);
    if (!kv || kv->type != KN_GGUF_ARRAY || kv->arr_type != KN_GGUF_STRING || i >= kv->arr_n) return s;
    rd r = {g->base, g->size, (size_t)kv->str_off[i]};
    rd_str(&r, &s);   /* validated at open */
    return s;
}

const kn_gguf_tensor *kn_gguf_tensor_at(const kn_gguf *g, int64_t i) {
    if (!g || i < 0 || i >= g->n_tensors) return NULL;
    return &g->tensors[i];
}

const kn_gguf_tensor *kn_gguf_find_tensor(const kn_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    kn_gguf_str k = {name, strlen(name)};
    int64_t lo = 0, hi = g->n_tensors - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int c = cmp_str(g->tensors[g->t_sorted[mid]].name, k);
        if (c == 0) return &g->tensors[g->t_sorted[mid]];
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return NULL;
}

/* ---- printing --------------------------------------------------------------------- */

static void print_str(FILE *f, kn_gguf_str s, size_t max) {
    fputc('"', f);
    for (uint64_t i = 0; i < s.len && i < max; i++) {
        unsigned char c = (unsigned char)s.ptr[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c < 0x20 || c == 0x7f) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
    fputc('"', f);
    if (s.len > max) fprintf(f, "...(%llu bytes)", (unsigned long long)s.len);
}

static void print_scalar(FILE *f, uint32_t t, const uint8_t *p) {
    uint64_t raw = load_le(p, gguf_scalar_size(t));
    switch (t) {
    case KN_GGUF_I8: fprintf(f, "%d", (int)(int8_t)raw); break;
    case KN_GGUF_I16: fprintf(f, "%d", (int)(int16_t)raw); break;
    case KN_GGUF_I32: fprintf(f, "%ld", (long)(int32_t)raw); break;
    case KN_GGUF_I64: { int64_t v; memcpy(&v, &raw, 8); fprintf(f, "%lld", (long long)v); break; }
    case KN_GGUF_F32: { uint32_t b = (uint32_t)raw; float v; memcpy(&v, &b, 4); fprintf(f, "%g", v); break; }
    case KN_GGUF_F64: { double v; memcpy(&v, &raw, 8); fprintf(f, "%g", v); break; }
    case KN_GGUF_BOOL: fputs(raw ? "true" : "false", f); break;
    default: fprintf(f, "%llu", (unsigned long long)raw); break;
    }
}

void kn_gguf_print(const kn_gguf *g, void *FILE_ptr) {
    FILE *f = FILE_ptr ? (FILE *)FILE_ptr : stdout;
    if (!g) { fputs("(no GGUF file)\n", f); return; }
    fprintf(f, "GGUF v%u, %zu bytes, alignment %zu, %lld key/value pairs, %lld tensors, data at byte %llu\n",
            g->version, g->size, g->alignment, (long long)g->n_kv, (long long)g->n_tensors,
            (unsigned long long)g->data_start);
    for (int64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        fputs("  ", f);
        print_str(f, kv->key, 120);
        fprintf(f, " %s = ", gguf_type_name(kv->type));
        if (gguf_scalar_size(kv->type)) print_scalar(f, kv->type, g->base + kv->off);
        else if (kv->type == KN_GGUF_STRING) print_str(f, kv->s, 80);
        else {
            fprintf(f, "%s[%llu] ", gguf_type_name(kv->arr_type), (unsigned long long)kv->arr_n);
            size_t es = gguf_scalar_size(kv->arr_type);
            uint64_t shown_n = kv->arr_n < 8 ? kv->arr_n : 8;
            if (es || kv->arr_type == KN_GGUF_STRING) {
                fputc('[', f);
                for (uint64_t j = 0; j < shown_n; j++) {
                    if (j) fputs(", ", f);
                    if (es) print_scalar(f, kv->arr_type, kv->arr_data + j * es);
                    else {
                        kn_gguf_str s = {NULL, 0};
                        rd r = {g->base, g->size, (size_t)kv->str_off[j]};
                        rd_str(&r, &s);
                        print_str(f, s, 40);
                    }
                }
                fputs(kv->arr_n > shown_n ? ", ...]" : "]", f);
            } else {
                fputs("(nested arrays, not shown)", f);
            }
        }
        fputc('\n', f);
    }
    for (int64_t i = 0; i < g->n_tensors; i++) {
        const kn_gguf_tensor *t = &g->tensors[i];
        fputs("  tensor ", f);
        print_str(f, t->name, 120);
        fprintf(f, " %s [", kn_dtype_name(t->type));
        for (int d = 0; d < t->n_dims; d++) fprintf(f, d ? ", %lld" : "%lld", (long long)t->ne[d]);
        fprintf(f, "] %zu bytes at +%llu\n", t->nbytes, (unsigned long long)t->offset);
    }
}
