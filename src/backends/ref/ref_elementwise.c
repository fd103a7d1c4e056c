/* ref_elementwise.c: creation, copies/casts, unary and binary math (the
 * op table's scalar functions applied over strided views). */
#include "backends/ref/ref.h"
#include "graph/scalar_ops.h"   // defines: kn_scalar_unary, kn_scalar_binary (from kiln_ops.def)
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- creation ---- */
typedef struct { uint64_t key; int64_t i; } rp_kv;
static int cmp_key(const void *x, const void *y) {
    const rp_kv *a = x, *b = y;
    if (a->key != b->key) return a->key < b->key ? -1 : 1;
    return a->i < b->i ? -1 : 1;
}

kn_status kn_ref_create(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *d = &e->dst;
    int64_t n = kn_tview_numel(d);
    switch (t->op) {
    case KN_OP_FILL:
        for (int64_t i = 0; i < n; i++) ST(d, kn_ref_off(d, i), t->p.scalar.a);
        return KN_OK;
    case KN_OP_ARANGE:
        for (int64_t i = 0; i < n; i++) ST(d, kn_ref_off(d, i), t->p.scalar.a + (double)i * t->p.scalar.b);
        return KN_OK;
    case KN_OP_EYE:
        for (int64_t i = 0; i < n; i++) ST(d, kn_ref_off(d, i), (i / d->ne[1]) == (i % d->ne[1]) ? 1.0 : 0.0);
        return KN_OK;
    case KN_OP_RAND: {
        uint64_t seed = t->p.rand.seed;
        if (e->nsrc > 0) seed += (uint64_t)LD(&e->src[0], 0) * 0x9E3779B97F4A7C15ull;
        for (int64_t i = 0; i < n; i++)
            ST(d, kn_ref_off(d, i), kn_rand_at(t->p.rand.kind, t->p.rand.a, t->p.rand.b, seed, (uint64_t)i));
        return KN_OK;
    }
    case KN_OP_RANDPERM: {
        /* sort indices by a random 64-bit key per index: a permutation that
         * depends only on (seed, n) */
        uint64_t seed = t->p.rand.seed;
        if (e->nsrc > 0) seed += (uint64_t)LD(&e->src[0], 0) * 0x9E3779B97F4A7C15ull;
        rp_kv *a = malloc(sizeof *a * (size_t)(n ? n : 1));
        if (!a) return kn_set_error(KN_ERR_NOMEM, "randperm: out of memory for %lld elements", (long long)n);
        for (int64_t i = 0; i < n; i++) {
            uint32_t r[4]; kn_philox4x32((uint64_t)i, seed, r);
            a[i].key = ((uint64_t)r[0] << 32) | r[1]; a[i].i = i;
        }
        qsort(a, (size_t)n, sizeof *a, cmp_key);
        for (int64_t i = 0; i < n; i++) ST(d, kn_ref_off(d, i), (double)a[i].i);
        free(a);
        return KN_OK;
    }
    default: break;
    }
    return kn_set_error(KN_ERR_UNSUPPORTED, "reference: no creation kernel for %s", kn_op_name(t->op));
}


/* ---- copy, cast, assign, tri, where ---- */
kn_status kn_ref_copy(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *d = &e->dst;
    int64_t n = kn_tview_numel(d);
    switch (t->op) {
    case KN_OP_COPY: case KN_OP_CAST: {
        if (kn_dtype_get(d->dtype)->is_quant)
            return kn_set_error(KN_ERR_UNSUPPORTED, "reference: casting to %s is not supported; quantize with the model tools",
                                kn_dtype_name(d->dtype));
        kn_tview sv; float *tmp = NULL;       /* quantized sources are dequantized first */
        kn_status st = kn_ref_dequant_view(&e->src[0], &sv, &tmp);
        if (st) return st;
        for (int64_t i = 0; i < n; i++) ST(d, kn_ref_off(d, i), LD(&sv, kn_ref_off(&sv, i)));
        free(tmp);
        return KN_OK;
    }
    case KN_OP_ASSIGN: {
        kn_tview s = kn_tview_broadcast(&e->src[1], d->ndim, d->ne);
        /* read everything first: src may overlap dst (x = x.T) */
        double *tmp = malloc(sizeof(double) * (size_t)(n ? n : 1));
        if (!tmp) return kn_set_error(KN_ERR_NOMEM, "assign: out of memory");
        for (int64_t i = 0; i < n; i++) tmp[i] = LD(&s, kn_ref_off(&s, i));
        for (int64_t i = 0; i < n; i++) ST(d, kn_ref_off(d, i), tmp[i]);
        free(tmp);
        return KN_OK;
    }
    case KN_OP_TRI: {
        const kn_tview *s = &e->src[0];
        int64_t R = d->ne[d->ndim - 2], C = d->ne[d->ndim - 1];
        for (int64_t i = 0; i < n; i++) {
            int64_t c = i % C, r = (i / C) % R;
            bool keep = t->p.tri.upper ? (c - r >= t->p.tri.k) : (c - r <= t->p.tri.k);
            ST(d, kn_ref_off(d, i), keep ? LD(s, kn_ref_off(s, i)) : 0.0);
        }
        return KN_OK;
    }
    case KN_OP_WHERE: {
        kn_tview c = kn_tview_broadcast(&e->src[0], d->ndim, d->ne);
        kn_tview a = kn_tview_broadcast(&e->src[1], d->ndim, d->ne);
        kn_tview b = kn_tview_broadcast(&e->src[2], d->ndim, d->ne);
        for (int64_t i = 0; i < n; i++)
            ST(d, kn_ref_off(d, i), LD(&c, kn_ref_off(&c, i)) != 0 ? LD(&a, kn_ref_off(&a, i)) : LD(&b, kn_ref_off(&b, i)));
        return KN_OK;
    }
    default: break;
    }
    return kn_set_error(KN_ERR_UNSUPPORTED, "reference: no kernel for %s", kn_op_name(t->op));
}

/* ---- unary ----
 * The math of every elementwise op is its row in include/kiln_ops.def,
 * compiled here (and for the CUDA generic kernels) by graph/scalar_ops.h. */
kn_status kn_ref_unary(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *d = &e->dst, *s = &e->src[0];
    int64_t n = kn_tview_numel(d);
    for (int64_t i = 0; i < n; i++)
        ST(d, kn_ref_off(d, i), kn_scalar_unary(t->op, LD(s, kn_ref_off(s, i)), t->p.scalar.a, t->p.scalar.b));
    return KN_OK;
}

/* ---- binary ---- */
kn_status kn_ref_binary(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *d = &e->dst;
    kn_tview a = kn_tview_broadcast(&e->src[0], d->ndim, d->ne);
    kn_tview b = kn_tview_broadcast(&e->src[1], d->ndim, d->ne);
    int64_t n = kn_tview_numel(d);
    bool intdiv = t->op == KN_OP_FMOD && kn_dtype_get(d->dtype)->is_int;
    for (int64_t i = 0; i < n; i++) {
        double x = LD(&a, kn_ref_off(&a, i)), y = LD(&b, kn_ref_off(&b, i));
        if (intdiv && y == 0) return kn_set_error(KN_ERR_INVALID, "fmod: integer division by zero");
        ST(d, kn_ref_off(d, i), kn_scalar_binary(t->op, x, y));
    }
    return KN_OK;
}
