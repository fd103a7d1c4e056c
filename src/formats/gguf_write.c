/* gguf_write.c: the GGUF v3 writer of gguf_write.h.
 *
 * Layout (little-endian): "GGUF", u32 version 3, u64 tensor count, u64 kv
 * count; the key/values (string = u64 length + bytes; value type u32, then
 * the value; arrays: u32 element type, u64 count, elements); the tensor
 * infos (name, u32 n_dims, u64 ne[n_dims], u32 ggml type, u64 offset into
 * the data section); zero padding to the alignment; the tensor data, each
 * tensor starting at a multiple of the alignment.
 *
 * Key/values are serialised into a byte buffer as they are added; tensors
 * are a list of references, written at the end. One sink (a FILE or a
 * growing buffer) takes every byte so that the file and memory outputs are
 * the same bytes. Tensors: f32, f16, bf16 and the GGUF block types kiln reads
 * (the caller quantizes: kn_quantize_row). Non-goals: in-place editing.
 */
#include "formats/gguf_write.h"
#include "formats/gguf.h"          /* defines: kn_gguf_type */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ALIGN = 32 };

typedef struct { char *p; size_t n, cap; } bytes;

typedef struct wtensor {
    char *name;
    int n_dims;
    int64_t ne[4];
    const void *data;
    uint32_t ggml_type;
    uint64_t nbytes, offset;
} wtensor;

struct kn_gguf_writer {
    bytes kv;                 /* serialised key/values */
    uint64_t n_kv;
    char **keys;              /* for the duplicate check */
    wtensor *ts;
    int64_t n_ts, cap_ts;
    kn_status st;             /* first error of the adds */
};

static bool grow(bytes *b, size_t need) {
    if (b->n + need <= b->cap) return true;
    size_t c = b->cap ? b->cap : 1024;
    while (c < b->n + need) {
        if (c > SIZE_MAX / 2) return false;
        c *= 2;
    }
    char *np = realloc(b->p, c);
    if (!np) return false;
    b->p = np; b->cap = c;
    return true;
}

static void put(kn_gguf_writer *w, const void *src, size_t n) {
    if (w->st) return;
    if (!grow(&w->kv, n)) { w->st = kn_set_error(KN_ERR_NOMEM, "GGUF writer: out of memory"); return; }
    memcpy(w->kv.p + w->kv.n, src, n);
    w->kv.n += n;
}
/* v as n little-endian bytes (GGUF's byte order on any host) */
static void le_bytes(uint8_t *b, uint64_t v, int n) {
    for (int i = 0; i < n; i++) b[i] = (uint8_t)(v >> (8 * i));
}
static void put_u32(kn_gguf_writer *w, uint32_t v) { uint8_t b[4]; le_bytes(b, v, 4); put(w, b, 4); }
static void put_u64(kn_gguf_writer *w, uint64_t v) { uint8_t b[8]; le_bytes(b, v, 8); put(w, b, 8); }
static void put_str(kn_gguf_writer *w, const char *s, size_t n) { put_u64(w, n); put(w, s, n); }

/* Starts a key/value: checks the key is new, writes it and the type. */
static bool begin_kv(kn_gguf_writer *w, const char *key, kn_gguf_type type) {
    if (w->st) return false;
    if (!key || !*key) { w->st = kn_set_error(KN_ERR_INVALID, "GGUF writer: empty key"); return false; }
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (!strcmp(w->keys[i], key)) {
            w->st = kn_set_error(KN_ERR_INVALID, "GGUF writer: key '%.100s' added twice", key);
            return false;
        }
    char **nk = realloc(w->keys, sizeof *nk * (size_t)(w->n_kv + 1));
    char *dup = nk ? strdup(key) : NULL;
    if (nk) w->keys = nk;
    if (!dup) { w->st = kn_set_error(KN_ERR_NOMEM, "GGUF writer: out of memory"); return false; }
    w->keys[w->n_kv++] = dup;
    put_str(w, key, strlen(key));
    put_u32(w, (uint32_t)type);
    return !w->st;
}

kn_status kn_gguf_writer_new(kn_gguf_writer **out) {
    *out = calloc(1, sizeof **out);
    return *out ? KN_OK : kn_set_error(KN_ERR_NOMEM, "GGUF writer: out of memory");
}

void kn_gguf_writer_free(kn_gguf_writer *w) {
    if (!w) return;
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    for (int64_t i = 0; i < w->n_ts; i++) free(w->ts[i].name);
    free(w->keys); free(w->ts); free(w->kv.p);
    free(w);
}

void kn_gguf_w_str(kn_gguf_writer *w, const char *key, const char *value) {
    if (begin_kv(w, key, KN_GGUF_STRING)) put_str(w, value, strlen(value));
}
void kn_gguf_w_u32(kn_gguf_writer *w, const char *key, uint32_t value) {
    if (begin_kv(w, key, KN_GGUF_U32)) put_u32(w, value);
}
void kn_gguf_w_f32(kn_gguf_writer *w, const char *key, float value) {
    uint32_t u;
    memcpy(&u, &value, 4);
    if (begin_kv(w, key, KN_GGUF_F32)) put_u32(w, u);
}
void kn_gguf_w_bool(kn_gguf_writer *w, const char *key, bool value) {
    uint8_t b = value ? 1 : 0;
    if (begin_kv(w, key, KN_GGUF_BOOL)) put(w, &b, 1);
}
void kn_gguf_w_arr_str(kn_gguf_writer *w, const char *key, uint64_t n, const char *const strs[], const size_t lens[]) {
    if (!begin_kv(w, key, KN_GGUF_ARRAY)) return;
    put_u32(w, KN_GGUF_STRING);
    put_u64(w, n);
    for (uint64_t i = 0; i < n; i++) put_str(w, strs[i], lens[i]);
}
void kn_gguf_w_arr_i32(kn_gguf_writer *w, const char *key, uint64_t n, const int32_t *values) {
    if (!begin_kv(w, key, KN_GGUF_ARRAY)) return;
    put_u32(w, KN_GGUF_I32);
    put_u64(w, n);
    for (uint64_t i = 0; i < n; i++) put_u32(w, (uint32_t)values[i]);
}

static int numeric_size(int t) {
    switch (t) {
    case KN_GGUF_U8: case KN_GGUF_I8: case KN_GGUF_BOOL: return 1;
    case KN_GGUF_U16: case KN_GGUF_I16: return 2;
    case KN_GGUF_U32: case KN_GGUF_I32: case KN_GGUF_F32: return 4;
    case KN_GGUF_U64: case KN_GGUF_I64: case KN_GGUF_F64: return 8;
    default: return 0;
    }
}
void kn_gguf_w_arr(kn_gguf_writer *w, const char *key, int elem_type, uint64_t n, const void *data) {
    int es = numeric_size(elem_type);
    if (!es || (n && !data) || n > SIZE_MAX / 8) {
        if (!w->st) w->st = kn_set_error(KN_ERR_INVALID, "GGUF writer: array '%.100s' needs a numeric element type", key);
        return;
    }
    if (!begin_kv(w, key, KN_GGUF_ARRAY)) return;
    put_u32(w, (uint32_t)elem_type);
    put_u64(w, n);
    put(w, data, (size_t)n * (size_t)es);
}
void kn_gguf_w_copy_kv(kn_gguf_writer *w, const kn_gguf *g, int64_t i) {
    if (w->st) return;
    kn_gguf_str k = kn_gguf_key(g, i);
    char key[512];
    if (k.len >= sizeof key) { w->st = kn_set_error(KN_ERR_LIMIT, "GGUF writer: key of %llu bytes", (unsigned long long)k.len); return; }
    memcpy(key, k.ptr, (size_t)k.len);
    key[k.len] = 0;
    kn_gguf_type t = kn_gguf_kv_type(g, i);
    if (t == KN_GGUF_ARRAY) {
        kn_gguf_type et;
        uint64_t n;
        const void *data;
        if (!kn_gguf_get_arr(g, key, &et, &n, &data)) { w->st = kn_set_error(KN_ERR_FORMAT, "GGUF: key '%s' unreadable", key); return; }
        if (et == KN_GGUF_STRING) {
            if (!begin_kv(w, key, KN_GGUF_ARRAY)) return;
            put_u32(w, KN_GGUF_STRING);
            put_u64(w, n);
            for (uint64_t j = 0; j < n && !w->st; j++) {
                kn_gguf_str s = kn_gguf_arr_str(g, key, j);
                put_str(w, s.ptr, (size_t)s.len);
            }
        } else if (numeric_size(et)) {
            kn_gguf_w_arr(w, key, et, n, data);
        } else {
            w->st = kn_set_error(KN_ERR_UNSUPPORTED, "GGUF writer: key '%s' is an array of arrays, which kiln does not copy", key);
        }
        return;
    }
    if (t == KN_GGUF_STRING) {
        kn_gguf_str s;
        kn_gguf_get_str(g, key, &s);
        if (begin_kv(w, key, KN_GGUF_STRING)) put_str(w, s.ptr, (size_t)s.len);
        return;
    }
    int es = numeric_size(t);
    if (!es) { w->st = kn_set_error(KN_ERR_FORMAT, "GGUF: key '%s' has value type %d", key, (int)t); return; }
    uint8_t b[8];
    if (t == KN_GGUF_F32 || t == KN_GGUF_F64) {
        double v = 0;
        kn_gguf_get_f64(g, key, &v);
        if (t == KN_GGUF_F32) { float f = (float)v; memcpy(b, &f, 4); }
        else memcpy(b, &v, 8);
    } else if (t == KN_GGUF_I8 || t == KN_GGUF_I16 || t == KN_GGUF_I32 || t == KN_GGUF_I64) {
        int64_t v = 0;
        kn_gguf_get_i64(g, key, &v);
        le_bytes(b, (uint64_t)v, es);
    } else {
        uint64_t v = 0;
        kn_gguf_get_u64(g, key, &v);
        le_bytes(b, v, es);
    }
    if (begin_kv(w, key, t)) put(w, b, (size_t)es);
}

/* kn_dtype -> GGML type id (gguf.c's table turned around); false: not written */
static bool dtype_to_ggml(kn_dtype d, uint32_t *t) {
    static const struct { kn_dtype d; uint32_t t; } map[] = {
        {KN_F32, 0}, {KN_F16, 1}, {KN_Q4_0, 2}, {KN_Q4_1, 3}, {KN_Q5_0, 6}, {KN_Q5_1, 7}, {KN_Q8_0, 8},
        {KN_Q4_K, 12}, {KN_Q5_K, 13}, {KN_Q6_K, 14}, {KN_BF16, 30}};
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (map[i].d == d) { *t = map[i].t; return true; }
    return false;
}

void kn_gguf_w_tensor_f32(kn_gguf_writer *w, const char *name, int n_dims, const int64_t ne[], const float *data) {
    kn_gguf_w_tensor(w, name, KN_F32, n_dims, ne, data);
}

void kn_gguf_w_tensor(kn_gguf_writer *w, const char *name, kn_dtype type, int n_dims, const int64_t ne[], const void *data) {
    if (w->st) return;
    uint32_t gt = 0;
    if (!name || !*name || n_dims < 1 || n_dims > 4 || !data || !dtype_to_ggml(type, &gt)) {
        w->st = kn_set_error(KN_ERR_INVALID, "GGUF writer: tensor '%.100s' needs a name, 1..4 dims, data and a type of "
                             "F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K", name ? name : "(null)");
        return;
    }
    int64_t bs = kn_dtype_get(type)->block_size;
    if (ne[0] % bs) {
        w->st = kn_set_error(KN_ERR_INVALID, "GGUF writer: %s tensor '%.100s' has rows of %lld, not whole blocks of %lld",
                             kn_dtype_name(type), name, (long long)ne[0], (long long)bs);
        return;
    }
    uint64_t nel = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] <= 0 || nel > UINT64_MAX / 4 / (uint64_t)ne[d]) {
            w->st = kn_set_error(KN_ERR_INVALID, "GGUF writer: tensor '%.100s' has a bad size", name);
            return;
        }
        nel *= (uint64_t)ne[d];
    }
    for (int64_t i = 0; i < w->n_ts; i++)
        if (!strcmp(w->ts[i].name, name)) {
            w->st = kn_set_error(KN_ERR_INVALID, "GGUF writer: tensor '%.100s' added twice", name);
            return;
        }
    if (w->n_ts == w->cap_ts) {
        int64_t nc = w->cap_ts ? 2 * w->cap_ts : 32;
        wtensor *nt = realloc(w->ts, sizeof *nt * (size_t)nc);
        if (!nt) { w->st = kn_set_error(KN_ERR_NOMEM, "GGUF writer: out of memory"); return; }
        w->ts = nt; w->cap_ts = nc;
    }
    wtensor *t = &w->ts[w->n_ts];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) { w->st = kn_set_error(KN_ERR_NOMEM, "GGUF writer: out of memory"); return; }
    t->n_dims = n_dims;
    for (int d = 0; d < n_dims; d++) t->ne[d] = ne[d];
    t->data = data;
    t->ggml_type = gt;
    t->nbytes = kn_dtype_nbytes(type, (int64_t)nel);
    w->n_ts++;
}

kn_status kn_gguf_writer_status(const kn_gguf_writer *w) { return w->st; }

/* ---- output ------------------------------------------------------------------ */

typedef struct sink {
    FILE *f;                   /* file output, or */
    bytes mem;                 /* memory output   */
    uint64_t off;              /* bytes written so far */
    int err;                   /* errno of the first failed write (-1: out of memory) */
} sink;

static void emit(sink *s, const void *p, size_t n) {
    if (s->err || !n) return;
    if (s->f) {
        errno = 0;
        if (fwrite(p, 1, n, s->f) != n) { s->err = errno ? errno : EIO; return; }
    } else {
        if (!grow(&s->mem, n)) { s->err = -1; return; }
        memcpy(s->mem.p + s->mem.n, p, n);
        s->mem.n += n;
    }
    s->off += n;
}
static void emit_u32(sink *s, uint32_t v) { uint8_t b[4]; le_bytes(b, v, 4); emit(s, b, 4); }
static void emit_u64(sink *s, uint64_t v) { uint8_t b[8]; le_bytes(b, v, 8); emit(s, b, 8); }
static void emit_pad(sink *s) {
    static const char zeros[ALIGN];
    size_t r = (size_t)(s->off % ALIGN);
    if (r) emit(s, zeros, ALIGN - r);
}

/* Little-endian hosts only (as every kiln loader assumes): tensor data is
 * written as it lies in memory. */
static void emit_all(kn_gguf_writer *w, sink *s) {
    uint64_t off = 0;
    for (int64_t i = 0; i < w->n_ts; i++) {
        w->ts[i].offset = off;
        off += (w->ts[i].nbytes + ALIGN - 1) / ALIGN * ALIGN;
    }
    emit(s, "GGUF", 4);
    emit_u32(s, 3);
    emit_u64(s, (uint64_t)w->n_ts);
    emit_u64(s, w->n_kv);
    emit(s, w->kv.p, w->kv.n);
    for (int64_t i = 0; i < w->n_ts; i++) {
        const wtensor *t = &w->ts[i];
        emit_u64(s, strlen(t->name));
        emit(s, t->name, strlen(t->name));
        emit_u32(s, (uint32_t)t->n_dims);
        for (int d = 0; d < t->n_dims; d++) emit_u64(s, (uint64_t)t->ne[d]);
        emit_u32(s, t->ggml_type);
        emit_u64(s, t->offset);
    }
    emit_pad(s);
    for (int64_t i = 0; i < w->n_ts; i++) {
        emit(s, w->ts[i].data, (size_t)w->ts[i].nbytes);
        emit_pad(s);
    }
}

kn_status kn_gguf_write_memory(kn_gguf_writer *w, void **data, size_t *size) {
    *data = NULL; *size = 0;
    if (w->st) return w->st;
    sink s = {0};
    emit_all(w, &s);
    if (s.err) { free(s.mem.p); return kn_set_error(KN_ERR_NOMEM, "GGUF writer: out of memory"); }
    *data = s.mem.p; *size = s.mem.n;
    return KN_OK;
}

kn_status kn_gguf_write_file(kn_gguf_writer *w, const char *path) {
    if (w->st) return w->st;
    if (!path || !*path) return kn_set_error(KN_ERR_INVALID, "GGUF writer: no output path");
    size_t pl = strlen(path);
    char *tmp = malloc(pl + 5);
    if (!tmp) return kn_set_error(KN_ERR_NOMEM, "GGUF writer: out of memory");
    memcpy(tmp, path, pl);
    memcpy(tmp + pl, ".tmp", 5);
    sink s = {0};
    s.f = fopen(tmp, "wb");
    if (!s.f) {
        kn_status st = kn_set_error(KN_ERR_IO, "cannot create '%s': %s; check that the directory exists and is "
                                    "writable", tmp, strerror(errno));
        free(tmp);
        return st;
    }
    emit_all(w, &s);
    if (!s.err && fflush(s.f) != 0) s.err = errno ? errno : EIO;
    if (fclose(s.f) != 0 && !s.err) s.err = errno ? errno : EIO;
    kn_status st = KN_OK;
    if (s.err) {
        remove(tmp);
        st = kn_set_error(KN_ERR_IO, "writing '%s' failed: %s (%llu bytes written); free some space or pick "
                          "another place", tmp, strerror(s.err), (unsigned long long)s.off);
    } else if (rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        st = kn_set_error(KN_ERR_IO, "cannot rename '%s' to '%s': %s", tmp, path, strerror(e));
    }
    free(tmp);
    return st;
}
