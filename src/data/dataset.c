/* dataset.c: datasets as n samples of typed fields, backed by flat arrays
 * (owned or borrowed) or by a callback; LM token windows (see kiln_data.h).
 * Non-goals: lazy file-backed arrays (memory-map a shard and borrow it). */
#include "kiln_data.h"
#include <stdlib.h>
#include <string.h>

struct kn_dataset {
    int64_t n;
    int n_fields;
    kn_data_field fields[KN_DATA_MAX_FIELDS];
    char names[KN_DATA_MAX_FIELDS][32];
    size_t sample_bytes[KN_DATA_MAX_FIELDS];
    kn_dataset_get_fn get;
    void *ud;
    void (*free_ud)(void *);
};

/* ---- construction ---------------------------------------------------------- */

static kn_status check_fields(int n_fields, const kn_data_field fields[], size_t sample_bytes[]) {
    if (n_fields < 1 || n_fields > KN_DATA_MAX_FIELDS || !fields)
        return kn_set_error(KN_ERR_INVALID, "dataset: %d fields (1..%d)", n_fields, KN_DATA_MAX_FIELDS);
    for (int f = 0; f < n_fields; f++) {
        const kn_data_field *fd = &fields[f];
        const kn_dtype_info *di = kn_dtype_get(fd->dtype);
        if (!di || di->is_quant)
            return kn_set_error(KN_ERR_INVALID, "dataset: field %d has dtype %s; use a plain dtype (f32, i32, u8, ...)",
                                f, kn_dtype_name(fd->dtype));
        if (fd->ndim < 0 || fd->ndim > KN_DATA_MAX_DIMS)
            return kn_set_error(KN_ERR_INVALID, "dataset: field %d has ndim %d (0..%d)", f, fd->ndim, KN_DATA_MAX_DIMS);
        uint64_t nel = 1;
        for (int d = 0; d < fd->ndim; d++) {
            if (fd->shape[d] < 0)
                return kn_set_error(KN_ERR_INVALID, "dataset: field %d: negative dim %lld", f, (long long)fd->shape[d]);
            if (fd->shape[d] > ((int64_t)1 << 40)) { nel = ((uint64_t)1 << 40) + 1; break; }
            nel *= (uint64_t)fd->shape[d];
            if (nel > ((uint64_t)1 << 40)) break;
        }
        if (nel > ((uint64_t)1 << 40))
            return kn_set_error(KN_ERR_LIMIT, "dataset: field %d: sample of %llu elements is too large", f,
                                (unsigned long long)nel);
        sample_bytes[f] = (size_t)nel * di->type_size;
    }
    return KN_OK;
}

kn_status kn_dataset_new(int64_t n, int n_fields, const kn_data_field fields[], kn_dataset_get_fn get,
                         void *ud, void (*free_ud)(void *), kn_dataset **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_dataset_new: out is NULL");
    *out = NULL;
    if (n < 0 || !get) return kn_set_error(KN_ERR_INVALID, "kn_dataset_new: n = %lld (must be >= 0) or get is NULL", (long long)n);
    kn_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return kn_set_error(KN_ERR_NOMEM, "kn_dataset_new: out of memory");
    kn_status st = check_fields(n_fields, fields, ds->sample_bytes);
    if (st) { free(ds); return st; }
    ds->n = n; ds->n_fields = n_fields; ds->get = get; ds->ud = ud; ds->free_ud = free_ud;
    for (int f = 0; f < n_fields; f++) {
        ds->fields[f] = fields[f];
        const char *nm = fields[f].name ? fields[f].name : "";
        size_t k = strlen(nm);
        if (k > sizeof ds->names[f] - 1) k = sizeof ds->names[f] - 1;   /* names are short labels */
        memcpy(ds->names[f], nm, k);
        ds->names[f][k] = 0;
        ds->fields[f].name = ds->names[f];
    }
    *out = ds;
    return KN_OK;
}

void kn_dataset_free(kn_dataset *ds) {
    if (!ds) return;
    if (ds->free_ud) ds->free_ud(ds->ud);
    free(ds);
}

int64_t kn_dataset_len(const kn_dataset *ds) { return ds ? ds->n : 0; }
int kn_dataset_n_fields(const kn_dataset *ds) { return ds ? ds->n_fields : 0; }
const kn_data_field *kn_dataset_field(const kn_dataset *ds, int f) {
    return (ds && f >= 0 && f < ds->n_fields) ? &ds->fields[f] : NULL;
}
size_t kn_dataset_sample_bytes(const kn_dataset *ds, int f) {
    return (ds && f >= 0 && f < ds->n_fields) ? ds->sample_bytes[f] : 0;
}

kn_status kn_dataset_get(const kn_dataset *ds, int64_t index, void *const dst[]) {
    if (!ds || !dst) return kn_set_error(KN_ERR_INVALID, "kn_dataset_get: NULL dataset or dst");
    if (index < 0 || index >= ds->n)
        return kn_set_error(KN_ERR_INVALID, "kn_dataset_get: index %lld out of range [0, %lld)", (long long)index,
                            (long long)ds->n);
    return ds->get(ds->ud, index, dst);
}

/* ---- array datasets ---------------------------------------------------------- */

typedef struct arrays_ud {
    int n_fields;
    size_t sample_bytes[KN_DATA_MAX_FIELDS];
    const char *data[KN_DATA_MAX_FIELDS];
    void *owned[KN_DATA_MAX_FIELDS];
} arrays_ud;

static kn_status arrays_get(void *ud, int64_t index, void *const dst[]) {
    arrays_ud *a = ud;
    for (int f = 0; f < a->n_fields; f++)
        if (a->sample_bytes[f]) memcpy(dst[f], a->data[f] + (size_t)index * a->sample_bytes[f], a->sample_bytes[f]);
    return KN_OK;
}
static void arrays_free(void *ud) {
    arrays_ud *a = ud;
    for (int f = 0; f < a->n_fields; f++) free(a->owned[f]);
    free(a);
}

kn_status kn_dataset_from_arrays(int64_t n, int n_fields, const kn_data_field fields[],
                                 const void *const data[], bool copy, kn_dataset **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_dataset_from_arrays: out is NULL");
    *out = NULL;
    size_t sb[KN_DATA_MAX_FIELDS];
    kn_status st = check_fields(n_fields, fields, sb);
    if (st) return st;
    if (n < 0 || !data) return kn_set_error(KN_ERR_INVALID, "kn_dataset_from_arrays: n < 0 or data is NULL");
    arrays_ud *a = calloc(1, sizeof *a);
    if (!a) return kn_set_error(KN_ERR_NOMEM, "kn_dataset_from_arrays: out of memory");
    a->n_fields = n_fields;
    for (int f = 0; f < n_fields; f++) {
        a->sample_bytes[f] = sb[f];
        size_t total = sb[f] * (size_t)n;
        if (total && !data[f]) { arrays_free(a); return kn_set_error(KN_ERR_INVALID, "kn_dataset_from_arrays: data[%d] is NULL", f); }
        if (copy && total) {
            a->owned[f] = malloc(total);
            if (!a->owned[f]) { arrays_free(a); return kn_set_error(KN_ERR_NOMEM, "kn_dataset_from_arrays: out of memory copying %zu bytes", total); }
            memcpy(a->owned[f], data[f], total);
            a->data[f] = a->owned[f];
        } else {
            a->data[f] = data[f];
        }
    }
    st = kn_dataset_new(n, n_fields, fields, arrays_get, a, arrays_free, out);
    if (st) arrays_free(a);
    return st;
}

/* ---- token windows -------------------------------------------------------------
 * T: tokens per sample (sequence length). Sample i starts at token i*T. */

typedef struct tokens_ud {
    const void *tokens;
    void *owned;
    int token_bytes;
    int64_t T;
} tokens_ud;

static int32_t tok_at(const tokens_ud *u, int64_t i) {
    if (u->token_bytes == 2) { uint16_t v; memcpy(&v, (const char *)u->tokens + 2 * i, 2); return v; }
    int32_t v; memcpy(&v, (const char *)u->tokens + 4 * i, 4); return v;
}
static kn_status tokens_get(void *ud, int64_t index, void *const dst[]) {
    tokens_ud *u = ud;
    int32_t *x = dst[0], *y = dst[1];
    int64_t s = index * u->T;
    for (int64_t t = 0; t < u->T; t++) { x[t] = tok_at(u, s + t); y[t] = tok_at(u, s + t + 1); }
    return KN_OK;
}
static void tokens_free(void *ud) {
    tokens_ud *u = ud;
    free(u->owned);
    free(u);
}

kn_status kn_dataset_tokens(const void *tokens, int token_bytes, int64_t n_tokens, int64_t T, bool copy,
                            kn_dataset **out) {
    if (!out) return kn_set_error(KN_ERR_INVALID, "kn_dataset_tokens: out is NULL");
    *out = NULL;
    if (token_bytes != 2 && token_bytes != 4)
        return kn_set_error(KN_ERR_INVALID, "kn_dataset_tokens: token_bytes is %d; use 2 (uint16 shards) or 4 (int32)", token_bytes);
    if (T < 1 || n_tokens < T + 1 || !tokens)
        return kn_set_error(KN_ERR_INVALID, "kn_dataset_tokens: %lld tokens cannot make one window of T = %lld "
                            "(needs T + 1 tokens)", (long long)n_tokens, (long long)T);
    tokens_ud *u = calloc(1, sizeof *u);
    if (!u) return kn_set_error(KN_ERR_NOMEM, "kn_dataset_tokens: out of memory");
    u->token_bytes = token_bytes; u->T = T; u->tokens = tokens;
    if (copy) {
        u->owned = malloc((size_t)n_tokens * (size_t)token_bytes);
        if (!u->owned) { free(u); return kn_set_error(KN_ERR_NOMEM, "kn_dataset_tokens: out of memory"); }
        memcpy(u->owned, tokens, (size_t)n_tokens * (size_t)token_bytes);
        u->tokens = u->owned;
    }
    kn_data_field f[2] = {{"x", KN_I32, 1, {T}}, {"y", KN_I32, 1, {T}}};
    kn_status st = kn_dataset_new((n_tokens - 1) / T, 2, f, tokens_get, u, tokens_free, out);
    if (st) tokens_free(u);
    return st;
}
