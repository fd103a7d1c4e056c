/* safetensors.c: safetensors reader and writer (see safetensors.h). */
#include "formats/safetensors.h"
#include "formats/hfconfig.h"  /* defines: kn_json_parse and accessors */
#include "formats/mapfile.h"   /* defines: kn_mapfile_open, kn_mapfile_close */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct { const char *name; kn_dtype t; } g_st_dtypes[] = {
    {"F32", KN_F32}, {"F16", KN_F16}, {"BF16", KN_BF16}, {"F64", KN_F64}, {"I8", KN_I8},
    {"I32", KN_I32}, {"I64", KN_I64}, {"U8", KN_U8}, {"BOOL", KN_BOOL},
};
#define N_ST_DTYPES (sizeof g_st_dtypes / sizeof g_st_dtypes[0])

const char *kn_safetensors_dtype_str(kn_dtype t) {
    for (size_t i = 0; i < N_ST_DTYPES; i++) if (g_st_dtypes[i].t == t) return g_st_dtypes[i].name;
    return NULL;
}

struct kn_safetensors {
    kn_mapfile *file;
    kn_json *hdr;
    kn_st_tensor *tensors;
    int64_t n_tensors;
    int64_t *by_name;          /* tensor indices sorted by name */
    int64_t meta;              /* json node of __metadata__, or -1 */
};

/* ---- index sorting (heapsort; no recursion, context passed explicitly) ------- */

typedef int (*idx_cmp)(const kn_st_tensor *t, int64_t a, int64_t b);
static int cmp_name(const kn_st_tensor *t, int64_t a, int64_t b) {
    size_t la = t[a].name_len, lb = t[b].name_len, n = la < lb ? la : lb;
    int c = memcmp(t[a].name, t[b].name, n);
    return c ? c : (la < lb ? -1 : la > lb);
}
static int cmp_begin(const kn_st_tensor *t, int64_t a, int64_t b) {
    uintptr_t x = (uintptr_t)t[a].data, y = (uintptr_t)t[b].data;
    if (x != y) return x < y ? -1 : 1;
    return t[a].nbytes < t[b].nbytes ? -1 : t[a].nbytes > t[b].nbytes;
}
static void sift(const kn_st_tensor *t, int64_t *idx, int64_t root, int64_t n, idx_cmp cmp) {
    for (;;) {
        int64_t c = 2 * root + 1;
        if (c >= n) return;
        if (c + 1 < n && cmp(t, idx[c], idx[c + 1]) < 0) c++;
        if (cmp(t, idx[root], idx[c]) >= 0) return;
        int64_t x = idx[root]; idx[root] = idx[c]; idx[c] = x;
        root = c;
    }
}
static void sort_idx(const kn_st_tensor *t, int64_t *idx, int64_t n, idx_cmp cmp) {
    for (int64_t i = 0; i < n; i++) idx[i] = i;
    for (int64_t i = n / 2 - 1; i >= 0; i--) sift(t, idx, i, n, cmp);
    for (int64_t e = n - 1; e > 0; e--) {
        int64_t x = idx[0]; idx[0] = idx[e]; idx[e] = x;
        sift(t, idx, 0, e, cmp);
    }
}

/* ---- reading ------------------------------------------------------------------- */

#define FAIL(...) do { s = kn_set_error(KN_ERR_FORMAT, __VA_ARGS__); goto fail; } while (0)

static kn_status parse(kn_safetensors *st, const uint8_t *base, size_t size) {
    kn_status s = KN_OK;
    int64_t *by_begin = NULL;
    if (size < 8) FAIL("safetensors: file has %zu bytes, too short for the 8-byte header length", size);
    uint64_t hn = 0;
    for (int i = 0; i < 8; i++) hn |= (uint64_t)base[i] << (8 * i);
    if (hn > size - 8)
        FAIL("safetensors: header length %llu runs past the end of the file (%zu bytes); the file is "
             "truncated or not a safetensors file", (unsigned long long)hn, size);
    if (hn > KN_ST_MAX_HEADER)
        FAIL("safetensors: header length %llu exceeds the %u-byte limit", (unsigned long long)hn, KN_ST_MAX_HEADER);
    if (hn < 2 || base[8] != '{')
        FAIL("safetensors: the header at byte 8 does not start with '{'; not a safetensors file");
    const uint8_t *data = base + 8 + hn;
    uint64_t data_size = size - 8 - hn;
    if ((s = kn_json_parse((const char *)base + 8, (size_t)hn, &st->hdr)) != KN_OK) {
        char msg[900];
        snprintf(msg, sizeof msg, "%s", kn_last_error());
        return kn_set_error(s, "safetensors header (starts at byte 8): %s", msg);
    }
    const kn_json *j = st->hdr;
    if (kn_json_kind(j, 0) != KN_JSON_OBJECT) FAIL("safetensors: header is not a JSON object");
    int64_t n = kn_json_count(j, 0);
    st->tensors = calloc(n ? (size_t)n : 1, sizeof *st->tensors);
    st->by_name = malloc((n ? (size_t)n : 1) * sizeof *st->by_name);
    by_begin = malloc((n ? (size_t)n : 1) * sizeof *by_begin);
    if (!st->tensors || !st->by_name || !by_begin) {
        s = kn_set_error(KN_ERR_NOMEM, "out of memory reading a safetensors header with %lld entries", (long long)n);
        goto fail;
    }
    st->meta = -1;
    for (int64_t v = kn_json_first(j, 0); v >= 0; v = kn_json_next(j, v)) {
        size_t kl;
        const char *key = kn_json_key(j, v, &kl);
        if (kl == 12 && memcmp(key, "__metadata__", 12) == 0) {
            if (st->meta >= 0) FAIL("safetensors: header has two __metadata__ entries");
            if (kn_json_kind(j, v) != KN_JSON_OBJECT) FAIL("safetensors: __metadata__ is not an object");
            for (int64_t m = kn_json_first(j, v); m >= 0; m = kn_json_next(j, m))
                if (kn_json_kind(j, m) != KN_JSON_STRING)
                    FAIL("safetensors: __metadata__ value for '%.100s' is not a string", kn_json_key(j, m, NULL));
            st->meta = v;
            continue;
        }
        kn_st_tensor *t = &st->tensors[st->n_tensors];
        t->name = key; t->name_len = kl;
        if (kn_json_kind(j, v) != KN_JSON_OBJECT) FAIL("safetensors: tensor '%.100s': entry is not an object", key);
        const char *dt = kn_json_get_str(j, v, "dtype");
        if (!dt) FAIL("safetensors: tensor '%.100s' has no \"dtype\" string", key);
        size_t di = 0;
        while (di < N_ST_DTYPES && strcmp(g_st_dtypes[di].name, dt) != 0) di++;
        if (di == N_ST_DTYPES)
            FAIL("safetensors: tensor '%.100s' has dtype '%.20s', which kiln does not support "
                 "(supported: F32 F16 BF16 F64 I8 I32 I64 U8 BOOL); convert the file", key, dt);
        t->dtype = g_st_dtypes[di].t;
        int64_t shp = kn_json_get(j, v, "shape");
        if (kn_json_kind(j, shp) != KN_JSON_ARRAY) FAIL("safetensors: tensor '%.100s' has no \"shape\" array", key);
        int64_t nd = kn_json_count(j, shp);
        if (nd > KN_ST_MAX_DIMS) {
            s = kn_set_error(KN_ERR_LIMIT, "safetensors: tensor '%.100s' has %lld dimensions; kiln supports at most %d",
                             key, (long long)nd, KN_ST_MAX_DIMS);
            goto fail;
        }
        t->ndim = (int)nd;
        uint64_t nel = 1;
        bool zero = false;
        int d = 0;
        for (int64_t e = kn_json_first(j, shp); e >= 0; e = kn_json_next(j, e), d++) {
            int64_t x;
            if (!kn_json_int(j, e, &x) || x < 0)
                FAIL("safetensors: tensor '%.100s': shape[%d] is not a non-negative integer", key, d);
            t->shape[d] = x;
            if (x == 0) zero = true;
            else if (!zero) {
                if (nel > (uint64_t)INT64_MAX / (uint64_t)x)
                    FAIL("safetensors: tensor '%.100s': element count overflows", key);
                nel *= (uint64_t)x;
            }
        }
        if (zero) nel = 0;
        size_t es = kn_dtype_get(t->dtype)->type_size;
        if (nel > SIZE_MAX / es) FAIL("safetensors: tensor '%.100s': byte size overflows", key);
        t->nbytes = (size_t)nel * es;
        int64_t offs = kn_json_get(j, v, "data_offsets");
        int64_t b, e;
        if (kn_json_kind(j, offs) != KN_JSON_ARRAY || kn_json_count(j, offs) != 2 ||
            !kn_json_int(j, kn_json_at(j, offs, 0), &b) || !kn_json_int(j, kn_json_at(j, offs, 1), &e))
            FAIL("safetensors: tensor '%.100s' needs \"data_offsets\": [begin, end] (integers)", key);
        if (b < 0 || e < b || (uint64_t)e > data_size)
            FAIL("safetensors: tensor '%.100s': data_offsets [%lld, %lld] are not inside the %llu-byte data area "
                 "(file byte %llu on); the file is truncated or corrupt", key, (long long)b, (long long)e,
                 (unsigned long long)data_size, (unsigned long long)(8 + hn));
        if ((uint64_t)(e - b) != t->nbytes)
            FAIL("safetensors: tensor '%.100s': data_offsets [%lld, %lld] span %lld bytes but dtype %s and the "
                 "shape need %zu", key, (long long)b, (long long)e, (long long)(e - b), dt, t->nbytes);
        t->data = data + b;
        st->n_tensors++;
    }
    sort_idx(st->tensors, st->by_name, st->n_tensors, cmp_name);
    for (int64_t i = 1; i < st->n_tensors; i++)
        if (cmp_name(st->tensors, st->by_name[i - 1], st->by_name[i]) == 0)
            FAIL("safetensors: duplicate tensor name '%.100s'", st->tensors[st->by_name[i]].name);
    sort_idx(st->tensors, by_begin, st->n_tensors, cmp_begin);
    for (int64_t i = 1; i < st->n_tensors; i++) {
        const kn_st_tensor *a = &st->tensors[by_begin[i - 1]], *b = &st->tensors[by_begin[i]];
        if ((const uint8_t *)b->data < (const uint8_t *)a->data + a->nbytes)
            FAIL("safetensors: tensors '%.100s' and '%.100s' overlap in the data area", a->name, b->name);
    }
    free(by_begin);
    return KN_OK;
fail:
    free(by_begin);
    return s;
}

void kn_safetensors_close(kn_safetensors *st) {
    if (!st) return;
    kn_json_free(st->hdr);
    free(st->tensors);
    free(st->by_name);
    kn_mapfile_close(st->file);
    free(st);
}

kn_status kn_safetensors_open_memory(const void *data, size_t size, kn_safetensors **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_safetensors_open_memory: out is NULL");
    *out = NULL;
    if (!data && size) return kn_set_error(KN_ERR_INVALID, "kn_safetensors_open_memory: data is NULL");
    kn_safetensors *st = calloc(1, sizeof *st);
    if (!st) return kn_set_error(KN_ERR_NOMEM, "out of memory opening a safetensors file");
    kn_status s = parse(st, data ? data : (const void *)"", size);
    if (s != KN_OK) { kn_safetensors_close(st); return s; }
    *out = st;
    return KN_OK;
}

kn_status kn_safetensors_open(const char *path, kn_safetensors **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_safetensors_open: out is NULL");
    *out = NULL;
    kn_mapfile *m;
    kn_status s = kn_mapfile_open(path, &m);
    if (s != KN_OK) return s;
    kn_safetensors *st = NULL;
    s = kn_safetensors_open_memory(m->data, m->size, &st);
    if (s != KN_OK) return kn_mapfile_fail(m, path, s);
    st->file = m;
    *out = st;
    return KN_OK;
}

int64_t kn_safetensors_n_tensors(const kn_safetensors *st) { return st ? st->n_tensors : 0; }

const kn_st_tensor *kn_safetensors_tensor_at(const kn_safetensors *st, int64_t i) {
    return (st && i >= 0 && i < st->n_tensors) ? &st->tensors[i] : NULL;
}

const kn_st_tensor *kn_safetensors_find(const kn_safetensors *st, const char *name) {
    if (!st || !name) return NULL;
    size_t kl = strlen(name);
    int64_t lo = 0, hi = st->n_tensors - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        const kn_st_tensor *t = &st->tensors[st->by_name[mid]];
        size_t n = t->name_len < kl ? t->name_len : kl;
        int c = memcmp(t->name, name, n);
        if (!c) c = t->name_len < kl ? -1 : t->name_len > kl;
        if (c == 0) return t;
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return NULL;
}

const char *kn_safetensors_metadata(const kn_safetensors *st, const char *key) {
    if (!st || st->meta < 0) return NULL;
    return kn_json_get_str(st->hdr, st->meta, key);
}
int64_t kn_safetensors_n_metadata(const kn_safetensors *st) {
    return (st && st->meta >= 0) ? kn_json_count(st->hdr, st->meta) : 0;
}
bool kn_safetensors_metadata_at(const kn_safetensors *st, int64_t i, const char **key, const char **value) {
    if (!st || st->meta < 0) return false;
    int64_t v = kn_json_at(st->hdr, st->meta, i);
    if (v < 0) return false;
    if (key) *key = kn_json_key(st->hdr, v, NULL);
    if (value) *value = kn_json_str(st->hdr, v, NULL);
    return true;
}

/* ---- writing -------------------------------------------------------------------- */

typedef struct sbuf { char *p; size_t n, cap; bool oom; } sbuf;

static void sb_put(sbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 256;
        while (nc < b->n + n + 1) nc *= 2;
        char *np = realloc(b->p, nc);
        if (!np) { b->oom = true; return; }
        b->p = np; b->cap = nc;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}
static void sb_str(sbuf *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_json_str(sbuf *b, const char *s) {
    sb_put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        char esc[8];
        if (*c == '"' || *c == '\\') { esc[0] = '\\'; esc[1] = (char)*c; sb_put(b, esc, 2); }
        else if (*c == '\n') sb_put(b, "\\n", 2);
        else if (*c == '\t') sb_put(b, "\\t", 2);
        else if (*c == '\r') sb_put(b, "\\r", 2);
        else if (*c < 0x20) { snprintf(esc, sizeof esc, "\\u%04x", *c); sb_put(b, esc, 6); }
        else sb_put(b, (const char *)c, 1);
    }
    sb_put(b, "\"", 1);
}

static int cmp_cstr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Valid UTF-8 check for names and metadata (the reader insists on it). */
static bool utf8_ok(const char *s) {
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        if (*p < 0x80) { p++; continue; }
        int len; uint32_t cp, min;
        if ((*p & 0xE0) == 0xC0) { len = 2; cp = *p & 0x1F; min = 0x80; }
        else if ((*p & 0xF0) == 0xE0) { len = 3; cp = *p & 0x0F; min = 0x800; }
        else if ((*p & 0xF8) == 0xF0) { len = 4; cp = *p & 0x07; min = 0x10000; }
        else return false;
        for (int k = 1; k < len; k++) {
            if ((p[k] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (p[k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        p += len;
    }
    return true;
}

kn_status kn_safetensors_write(const char *path, int64_t n, const char *const names[],
                               const kn_dtype dtypes[], const int ndims[],
                               const int64_t shapes[][KN_ST_MAX_DIMS], const void *const datas[],
                               int64_t n_meta, const char *const meta_kv[]) {
    if (!path) return kn_set_error(KN_ERR_INVALID, "kn_safetensors_write: path is NULL");
    if (n < 0 || n_meta < 0 || (n > 0 && (!names || !dtypes || !ndims || !shapes || !datas)) ||
        (n_meta > 0 && !meta_kv))
        return kn_set_error(KN_ERR_INVALID, "kn_safetensors_write: bad counts or NULL arrays");
    kn_status s = KN_OK;
    sbuf b = {0};
    size_t *sizes = malloc((n ? (size_t)n : 1) * sizeof *sizes);
    uint64_t *offs = malloc((n ? (size_t)n : 1) * sizeof *offs);
    const char **sorted = malloc((n ? (size_t)n : 1) * sizeof *sorted);
    char *tmp = NULL;
    FILE *f = NULL;
    if (!sizes || !sorted || !offs) { s = kn_set_error(KN_ERR_NOMEM, "out of memory writing '%s'", path); goto done; }
    /* validate */
    for (int64_t i = 0; i < n; i++) {
        const char *nm = names[i];
        if (!nm || !*nm || strcmp(nm, "__metadata__") == 0 || !utf8_ok(nm)) {
            s = kn_set_error(KN_ERR_INVALID, "kn_safetensors_write: tensor #%lld has an invalid name "
                             "(must be non-empty UTF-8 and not __metadata__)", (long long)i);
            goto done;
        }
        const char *dn = kn_safetensors_dtype_str(dtypes[i]);
        if (!dn) {
            s = kn_set_error(KN_ERR_UNSUPPORTED, "kn_safetensors_write: tensor '%.100s' has dtype %s, which "
                             "safetensors cannot hold; convert it to f32/f16/bf16 first", nm, kn_dtype_name(dtypes[i]));
            goto done;
        }
        if (ndims[i] < 0 || ndims[i] > KN_ST_MAX_DIMS) {
            s = kn_set_error(KN_ERR_INVALID, "kn_safetensors_write: tensor '%.100s' has ndim %d (0..%d)",
                             nm, ndims[i], KN_ST_MAX_DIMS);
            goto done;
        }
        uint64_t nel = 1;
        for (int d = 0; d < ndims[i]; d++) {
            int64_t x = shapes[i][d];
            if (x < 0) { s = kn_set_error(KN_ERR_INVALID, "kn_safetensors_write: tensor '%.100s': negative dim", nm); goto done; }
            if (x && nel > (uint64_t)INT64_MAX / (uint64_t)x) {
                s = kn_set_error(KN_ERR_INVALID, "kn_safetensors_write: tensor '%.100s': size overflows", nm);
                goto done;
            }
            nel = x ? nel * (uint64_t)x : 0;
            if (!nel) break;
        }
        size_t es = kn_dtype_get(dtypes[i])->type_size;
        if (nel > SIZE_MAX / es) { s = kn_set_error(KN_ERR_INVALID, "tensor '%.100s': size overflows", nm); goto done; }
        sizes[i] = (size_t)nel * es;
        if (sizes[i] && !datas[i]) {
            s = kn_set_error(KN_ERR_INVALID, "kn_safetensors_write: tensor '%.100s' has no data", nm);
            goto done;
        }
        sorted[i] = nm;
    }
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_cstr);
    for (int64_t i = 1; i < n; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0) {
            s = kn_set_error(KN_ERR_INVALID, "kn_safetensors_write: duplicate tensor name '%.100s'", sorted[i]);
            goto done;
        }
    for (int64_t k = 0; k < 2 * n_meta; k++)
        if (!meta_kv[k] || !utf8_ok(meta_kv[k])) {
            s = kn_set_error(KN_ERR_INVALID, "kn_safetensors_write: metadata entry %lld is NULL or not UTF-8",
                             (long long)(k / 2));
            goto done;
        }
    /* header */
    sb_str(&b, "{");
    bool first = true;
    if (n_meta > 0) {
        sb_str(&b, "\"__metadata__\":{");
        for (int64_t k = 0; k < n_meta; k++) {
            if (k) sb_str(&b, ",");
            sb_json_str(&b, meta_kv[2 * k]);
            sb_str(&b, ":");
            sb_json_str(&b, meta_kv[2 * k + 1]);
        }
        sb_str(&b, "}");
        first = false;
    }
    /* data order: 8-byte dtypes first, then 4, 2, 1 (each group in the given
     * order), so with the 8-aligned header every tensor is aligned to its
     * element size, as the reference writer arranges it. */
    uint64_t off = 0;
    for (size_t es = 8; es >= 1; es /= 2)
        for (int64_t i = 0; i < n; i++)
            if (kn_dtype_get(dtypes[i])->type_size == es) { offs[i] = off; off += sizes[i]; }
    for (int64_t i = 0; i < n; i++) {
        char num[64];
        if (!first) sb_str(&b, ",");
        first = false;
        sb_json_str(&b, names[i]);
        sb_str(&b, ":{\"dtype\":\"");
        sb_str(&b, kn_safetensors_dtype_str(dtypes[i]));
        sb_str(&b, "\",\"shape\":[");
        for (int d = 0; d < ndims[i]; d++) {
            snprintf(num, sizeof num, d ? ",%lld" : "%lld", (long long)shapes[i][d]);
            sb_str(&b, num);
        }
        snprintf(num, sizeof num, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offs[i],
                 (unsigned long long)(offs[i] + sizes[i]));
        sb_str(&b, num);
    }
    sb_str(&b, "}");
    while (b.n % 8) sb_str(&b, " ");
    if (b.oom) { s = kn_set_error(KN_ERR_NOMEM, "out of memory building the header of '%s'", path); goto done; }
    /* write to a temporary file, then rename over the target */
    size_t pl = strlen(path);
    tmp = malloc(pl + 5);
    if (!tmp) { s = kn_set_error(KN_ERR_NOMEM, "out of memory writing '%s'", path); goto done; }
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    f = fopen(tmp, "wb");
    if (!f) {
        s = kn_set_error(KN_ERR_IO, "cannot create '%s': %s; check the directory exists and is writable", tmp,
                         strerror(errno));
        goto done;
    }
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)b.n >> (8 * i));
    errno = 0;
    bool ok = fwrite(len8, 1, 8, f) == 8 && fwrite(b.p, 1, b.n, f) == b.n;
    for (size_t es = 8; es >= 1; es /= 2)
        for (int64_t i = 0; ok && i < n; i++)
            if (kn_dtype_get(dtypes[i])->type_size == es && sizes[i])
                ok = fwrite(datas[i], 1, sizes[i], f) == sizes[i];
    int err = ok ? 0 : errno;                  /* the reason of the first failed write */
    if (fclose(f) != 0 && ok) { ok = false; err = errno; }
    f = NULL;
    if (!ok) {
        remove(tmp);
        s = kn_set_error(KN_ERR_IO, "writing '%s' failed: %s; '%s' was not changed",
                         tmp, err ? strerror(err) : "I/O error", path);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        s = kn_set_error(KN_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(e));
        goto done;
    }
done:
    if (f) { fclose(f); remove(tmp); }
    free(tmp);
    free(b.p);
    free(sizes);
    free(offs);
    free(sorted);
    return s;
}
