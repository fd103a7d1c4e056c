/* kn_fixture.h: reader for "KNFX" test fixtures (named tensors written by a
 * reference script such as tests/torch_refs.py), for any test to reuse.
 *
 * Format (little endian):
 *   char magic[4] = "KNFX"; u32 version = 1; u32 n_tensors;
 *   per tensor: u32 name_len (1..63), name bytes (no NUL), u32 dtype
 *   (0 f64, 1 f32, 2 i64, 3 i32), u32 ndim (0..8), i64 shape[ndim],
 *   numel * sizeof(dtype) bytes of row-major data.
 *   The file must end right after the last tensor.
 *
 *   kn_fx fx;
 *   if (kn_fx_load("tests/fixtures/golden_mlp.bin", &fx)) { ...kn_fx_error()... }
 *   const kn_fx_tensor *x = kn_fx_get(&fx, "in.x");      // NULL if absent
 *   kn_tensor *t = kn_fx_tensor_new(ctx, x, KN_F32);    // kiln copy, any dtype
 *   kn_fx_free(&fx);
 *
 * Every element is also kept converted to double (v[]) so tests compare in
 * one type; integers are exact up to 2^53. Not a general format: no
 * endianness conversion (x86/ARM little-endian hosts only), no mmap.
 */
#ifndef KN_FIXTURE_H
#define KN_FIXTURE_H
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "kiln.h"

enum { KN_FX_F64 = 0, KN_FX_F32 = 1, KN_FX_I64 = 2, KN_FX_I32 = 3 };
#define KN_FX_VERSION 1
#define KN_FX_MAX_DIMS 8
#define KN_FX_MAX_TENSORS 4096
#define KN_FX_MAX_NUMEL ((int64_t)1 << 28)

typedef struct kn_fx_tensor {
    char name[64];
    int dtype;                        /* KN_FX_*: the dtype stored in the file */
    int ndim;
    int64_t shape[KN_FX_MAX_DIMS];
    int64_t numel;
    double *v;                        /* numel elements, converted to double   */
} kn_fx_tensor;

typedef struct kn_fx {
    uint32_t version;
    int n;
    kn_fx_tensor *t;                  /* n tensors in file order               */
} kn_fx;

static char kn__fx_err[512];
/* Why the last kn_fx_load failed. */
static inline const char *kn_fx_error(void) { return kn__fx_err; }

static inline void kn_fx_free(kn_fx *fx) {
    if (!fx) return;
    for (int i = 0; i < fx->n; i++) free(fx->t[i].v);
    free(fx->t);
    fx->t = NULL; fx->n = 0;
}

static inline int kn__fx_rd(FILE *f, void *p, size_t n) { return n == 0 || fread(p, 1, n, f) == n; }

/* Load a whole fixture. Returns 0 on success; else -1, fx left empty, and
 * kn_fx_error() says what is wrong (missing file, bad magic, version,
 * truncation, absurd sizes, trailing bytes). */
static inline int kn_fx_load(const char *path, kn_fx *fx) {
    memset(fx, 0, sizeof *fx);
    FILE *f = fopen(path, "rb");
    if (!f) { snprintf(kn__fx_err, sizeof kn__fx_err, "%s: cannot open (regenerate with tests/torch_refs.py)", path); return -1; }
    char magic[4]; uint32_t h[2];
    const char *why = NULL;
    int at = 0;
    if (!kn__fx_rd(f, magic, 4) || memcmp(magic, "KNFX", 4)) { why = "bad magic (not a KNFX fixture)"; goto fail; }
    if (!kn__fx_rd(f, h, sizeof h)) { why = "truncated header"; goto fail; }
    if (h[0] != KN_FX_VERSION) { why = "unsupported version (this reader knows version 1)"; goto fail; }
    if (h[1] > KN_FX_MAX_TENSORS) { why = "too many tensors"; goto fail; }
    fx->version = h[0];
    fx->t = calloc(h[1] ? h[1] : 1, sizeof *fx->t);
    if (!fx->t) { why = "out of memory"; goto fail; }
    for (uint32_t i = 0; i < h[1]; i++) {
        kn_fx_tensor *t = &fx->t[i];
        at = (int)i;
        uint32_t nl, dt, nd;
        if (!kn__fx_rd(f, &nl, 4) || nl == 0 || nl >= sizeof t->name) { why = "bad tensor name length"; goto fail; }
        if (!kn__fx_rd(f, t->name, nl)) { why = "truncated tensor name"; goto fail; }
        t->name[nl] = 0;
        fx->n = (int)i + 1;   /* so kn_fx_free frees this entry too */
        if (!kn__fx_rd(f, &dt, 4) || dt > KN_FX_I32) { why = "bad dtype code"; goto fail; }
        if (!kn__fx_rd(f, &nd, 4) || nd > KN_FX_MAX_DIMS) { why = "bad ndim"; goto fail; }
        t->dtype = (int)dt; t->ndim = (int)nd; t->numel = 1;
        for (uint32_t d = 0; d < nd; d++) {
            if (!kn__fx_rd(f, &t->shape[d], 8) || t->shape[d] < 0 || t->shape[d] > KN_FX_MAX_NUMEL) { why = "bad shape"; goto fail; }
            t->numel *= t->shape[d];
            if (t->numel > KN_FX_MAX_NUMEL) { why = "tensor too large"; goto fail; }
        }
        size_t es = (dt == KN_FX_F64 || dt == KN_FX_I64) ? 8 : 4, n = (size_t)t->numel;
        void *raw = malloc(n * es + 1);
        t->v = malloc(n * sizeof(double) + 1);
        if (!raw || !t->v) { free(raw); why = "out of memory"; goto fail; }
        if (!kn__fx_rd(f, raw, n * es)) { free(raw); why = "truncated tensor data"; goto fail; }
        for (size_t k = 0; k < n; k++) {
            switch (dt) {
            case KN_FX_F64: t->v[k] = ((const double *)raw)[k]; break;
            case KN_FX_F32: t->v[k] = ((const float *)raw)[k]; break;
            case KN_FX_I64: t->v[k] = (double)((const int64_t *)raw)[k]; break;
            default:        t->v[k] = ((const int32_t *)raw)[k]; break;
            }
        }
        free(raw);
    }
    if (fgetc(f) != EOF) { why = "trailing bytes after the last tensor"; goto fail; }
    fclose(f);
    return 0;
fail:
    snprintf(kn__fx_err, sizeof kn__fx_err, "%s: %s (at tensor %d)", path, why, at);
    fclose(f);
    kn_fx_free(fx);
    return -1;
}

/* The tensor called name, or NULL. */
static inline const kn_fx_tensor *kn_fx_get(const kn_fx *fx, const char *name) {
    for (int i = 0; i < fx->n; i++)
        if (!strcmp(fx->t[i].name, name)) return &fx->t[i];
    return NULL;
}

/* A materialised kiln tensor of dtype dt holding t's values (NULL if t is NULL
 * or kiln refuses). Integer fixtures go to integer kiln dtypes exactly. */
static inline kn_tensor *kn_fx_tensor_new(kn_ctx *ctx, const kn_fx_tensor *t, kn_dtype dt) {
    if (!t) return NULL;
    kn_tensor *k = kn_empty(ctx, dt, t->ndim, t->shape);
    if (!k || kn_tensor_write(k, t->v, KN_F64) != KN_OK) return NULL;
    return k;
}
#endif
