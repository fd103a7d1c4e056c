/* kn_optest.h: helpers for op tests, on top of kn_test.h.
 *
 *  - kn_optest_backends(): build the same graph on the reference and the fast
 *    CPU backend (fresh random inputs, both plain and non-contiguous), run
 *    both and compare every output element. NaN never passes.
 *  - kn_gradcheck(): analytic gradients (kn_gradients) of sum(f(x) * w) with a
 *    random weight w, against central finite differences in f64.
 *
 * A test describes its graph with a builder: given a context and input
 * tensors, return the output. Inputs are described by shape and value range.
 */
#ifndef KN_OPTEST_H
#define KN_OPTEST_H
#include "kn_test.h"
#include "kiln.h"

typedef kn_tensor *(*kn_build_fn)(kn_ctx *ctx, kn_tensor **in, void *ud);

typedef struct kn_opin {
    int ndim;
    int64_t shape[KN_MAX_DIMS];
    double lo, hi;          /* uniform range of the random values         */
    kn_dtype dtype;         /* 0 (f32) unless set                          */
    bool transposed;        /* present the input as a transposed view (last two dims) */
    bool integer;           /* draw integers in [lo, hi)                  */
} kn_opin;

static inline void kn__fill_in(const kn_opin *d, double *v, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        v[i] = d->integer ? floor(kn_test_uniform(d->lo, d->hi)) : kn_test_uniform(d->lo, d->hi);
}
static inline int64_t kn__numel(const kn_opin *d) {
    int64_t n = 1;
    for (int i = 0; i < d->ndim; i++) n *= d->shape[i];
    return n;
}

/* Make input tensor from f64 values: if transposed, store the data with the
 * last two dims swapped and return a transposed view (non-contiguous). */
static inline kn_tensor *kn__make_in(kn_ctx *ctx, const kn_opin *d, const double *v, bool grad) {
    kn_dtype dt = d->dtype ? d->dtype : KN_F32;
    kn_tensor *t;
    if (d->transposed && d->ndim >= 2) {
        int64_t s[KN_MAX_DIMS];
        for (int i = 0; i < d->ndim; i++) s[i] = d->shape[i];
        s[d->ndim - 1] = d->shape[d->ndim - 2]; s[d->ndim - 2] = d->shape[d->ndim - 1];
        t = kn_empty(ctx, dt, d->ndim, s);
        kn_tensor *tv = kn_transpose(ctx, t, -1, -2);
        kn_tensor_write(tv, v, KN_F64);
        if (grad) { kn_set_requires_grad(t, true); tv = kn_transpose(ctx, t, -1, -2); }
        return tv;
    }
    t = kn_empty(ctx, dt, d->ndim, d->shape);
    kn_tensor_write(t, v, KN_F64);
    if (grad) kn_set_requires_grad(t, true);
    return t;
}

/* Run `build` on backend be with the given input values; out values in *out (malloc'd). */
static inline kn_status kn__run_on(kn_backend *be, kn_build_fn build, void *ud, int nin, const kn_opin *ins,
                                   double **vals, double **out, int64_t *nout) {
    kn_ctx_opts o = {be};
    kn_ctx *ctx = kn_ctx_new(&o);
    kn_tensor *t[8];
    for (int i = 0; i < nin; i++) t[i] = kn__make_in(ctx, &ins[i], vals[i], false);
    kn_tensor *y = build(ctx, t, ud);
    if (!y) { kn_ctx_free(ctx); return KN_ERR_INVALID; }
    *nout = kn_numel(y);
    *out = malloc(sizeof(double) * (size_t)(*nout ? *nout : 1));
    kn_status st = kn_tensor_read(y, *out, KN_F64);
    kn_ctx_free(ctx);
    return st;
}

/* Compare ref vs cpu backend; returns relative error (inf on mismatch/NaN). */
static inline double kn_optest_backends(kn_build_fn build, void *ud, int nin, const kn_opin *ins) {
    double *vals[8];
    for (int i = 0; i < nin; i++) {
        int64_t n = kn__numel(&ins[i]);
        vals[i] = malloc(sizeof(double) * (size_t)(n ? n : 1));
        kn__fill_in(&ins[i], vals[i], n);
    }
    double *r = NULL, *c = NULL; int64_t nr = 0, nc = 0;
    kn_status s1 = kn__run_on(kn_backend_ref(), build, ud, nin, ins, vals, &r, &nr);
    kn_status s2 = kn__run_on(kn_backend_cpu(), build, ud, nin, ins, vals, &c, &nc);
    double err = INFINITY;
    if (s1 == KN_OK && s2 == KN_OK && nr == nc) err = kn_rel_err(c, r, nr);
    else fprintf(stderr, "  backends: ref %d cpu %d (%s)\n", s1, s2, kn_last_error());
    for (int i = 0; i < nin; i++) free(vals[i]);
    free(r); free(c);
    return err;
}

/* Evaluate L = sum(f(x) * w) in f64 on the reference backend. */
static inline double kn__loss(kn_build_fn build, void *ud, int nin, const kn_opin *ins, double **vals, const double *w, int64_t nw) {
    kn_ctx_opts o = {kn_backend_ref()};
    kn_ctx *ctx = kn_ctx_new(&o);
    kn_tensor *t[8];
    for (int i = 0; i < nin; i++) { kn_opin d = ins[i]; d.dtype = KN_F64; t[i] = kn__make_in(ctx, &d, vals[i], false); }
    kn_tensor *y = build(ctx, t, ud);
    double L = NAN;
    if (y && kn_numel(y) == nw) {
        double *v = malloc(sizeof(double) * (size_t)(nw ? nw : 1));
        if (kn_tensor_read(y, v, KN_F64) == KN_OK) { L = 0; for (int64_t i = 0; i < nw; i++) L += v[i] * w[i]; }
        free(v);
    }
    kn_ctx_free(ctx);
    return L;
}

/* Finite-difference check of the gradients of every input with requires[i].
 * Returns the worst relative error over inputs (inf on failure). */
static inline double kn_gradcheck(kn_build_fn build, void *ud, int nin, const kn_opin *ins, const bool *requires) {
    double *vals[8];
    for (int i = 0; i < nin; i++) {
        int64_t n = kn__numel(&ins[i]);
        vals[i] = malloc(sizeof(double) * (size_t)(n ? n : 1));
        kn__fill_in(&ins[i], vals[i], n);
    }
    /* analytic */
    kn_ctx_opts o = {kn_backend_ref()};
    kn_ctx *ctx = kn_ctx_new(&o);
    kn_tensor *t[8];
    for (int i = 0; i < nin; i++) { kn_opin d = ins[i]; d.dtype = KN_F64; t[i] = kn__make_in(ctx, &d, vals[i], requires[i]); }
    kn_tensor *y = build(ctx, t, ud);
    double worst = INFINITY;
    if (!y) { fprintf(stderr, "  gradcheck: build failed: %s\n", kn_last_error()); goto out0; }
    int64_t nw = kn_numel(y);
    double *w = malloc(sizeof(double) * (size_t)(nw ? nw : 1));
    for (int64_t i = 0; i < nw; i++) w[i] = kn_test_uniform(-1, 1);
    kn_tensor *wt = kn_from_data(ctx, KN_F64, y->ndim, y->shape, w);
    kn_tensor *gr[8] = {0};
    kn_tensor *yy = kn_cast(ctx, y, KN_F64);
    kn_status st = kn_gradients(ctx, 1, &yy, &wt, nin, t, gr);
    if (st) { fprintf(stderr, "  gradcheck: backward failed: %s\n", kn_last_error()); free(w); goto out0; }
    worst = 0;
    for (int i = 0; i < nin && worst < INFINITY; i++) {
        if (!requires[i]) continue;
        int64_t n = kn__numel(&ins[i]);
        double *ga = malloc(sizeof(double) * (size_t)(n ? n : 1)), *gn = malloc(sizeof(double) * (size_t)(n ? n : 1));
        if (!gr[i]) { for (int64_t k = 0; k < n; k++) ga[k] = 0; }
        else if (kn_tensor_read(gr[i], ga, KN_F64)) { fprintf(stderr, "  gradcheck: reading grad %d: %s\n", i, kn_last_error()); worst = INFINITY; free(ga); free(gn); break; }
        for (int64_t k = 0; k < n; k++) {
            double v0 = vals[i][k], h = 1e-6 * (fabs(v0) > 1 ? fabs(v0) : 1);
            vals[i][k] = v0 + h; double lp = kn__loss(build, ud, nin, ins, vals, w, nw);
            vals[i][k] = v0 - h; double lm = kn__loss(build, ud, nin, ins, vals, w, nw);
            vals[i][k] = v0;
            gn[k] = (lp - lm) / (2 * h);
        }
        double e = kn_rel_err(ga, gn, n);
        if (e > 1e-5) {
            fprintf(stderr, "  gradcheck input %d: rel err %.3g\n", i, e);
            for (int64_t k = 0; k < n && k < 6; k++) fprintf(stderr, "    [%lld] analytic %.8g numeric %.8g\n", (long long)k, ga[k], gn[k]);
        }
        if (e > worst) worst = e;
        free(ga); free(gn);
    }
    free(w);
out0:
    kn_ctx_free(ctx);
    for (int i = 0; i < nin; i++) free(vals[i]);
    return worst;
}
#endif
