/* ops_create.c: leaves (data, inputs, parameters) and creation ops
 * (fill, arange, eye, random). Creation ops are lazy nodes so they run on
 * whatever backend executes the graph. */
#include "graph/graph.h"
#include <math.h>
#include <string.h>

static kn_tensor *materialise(kn_ctx *ctx, kn_tensor *t) {
    size_t bytes = kn_dtype_nbytes(t->dtype, kn_numel(t));
    t->buf = kn_buffer_new(ctx->be, bytes ? bytes : 1);
    if (!t->buf) { ctx->status = KN_ERR_NOMEM; return NULL; }
    return t;
}

kn_tensor *kn_empty(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape) {
    kn_tensor *t = kn__node(ctx, KN_OP_NONE, dt, ndim, shape, NULL, NULL, 0);
    return t ? materialise(ctx, t) : NULL;
}

kn_tensor *kn_from_data(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape, const void *data) {
    kn_tensor *t = kn_empty(ctx, dt, ndim, shape);
    if (!t) return NULL;
    if (data) ctx->be->copy_in(ctx->be, t->buf->data, data, kn_dtype_nbytes(dt, kn_numel(t)));
    return t;
}

kn_tensor *kn_from_ptr(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape, void *data) {
    if (ctx->be->device != KN_DEVICE_HOST)
        return kn__fail(ctx, KN_ERR_UNSUPPORTED, "kn_from_ptr: wrapping host memory needs a host backend, this context uses %s", ctx->be->name);
    kn_tensor *t = kn__node(ctx, KN_OP_NONE, dt, ndim, shape, NULL, NULL, 0);
    if (!t) return NULL;
    t->buf = kn_buffer_wrap(ctx->be, data, kn_dtype_nbytes(dt, kn_numel(t)));
    return t->buf ? t : NULL;
}

kn_tensor *kn_input(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape) {
    kn_tensor *t = kn_empty(ctx, dt, ndim, shape);
    if (t) t->flags |= KN_FLAG_INPUT;
    return t;
}

kn_tensor *kn_param(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape) {
    kn_tensor *t = kn_empty(ctx, dt, ndim, shape);
    if (t) t->flags |= KN_FLAG_PARAM | KN_FLAG_REQUIRES_GRAD;
    return t;
}

kn_tensor *kn_full(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape, double v) {
    kn_tensor *t = kn__node(ctx, KN_OP_FILL, dt, ndim, shape, NULL, NULL, 0);
    if (t) t->p.scalar.a = v;
    return t;
}
kn_tensor *kn_scalar(kn_ctx *ctx, kn_dtype dt, double v) { return kn_full(ctx, dt, 0, NULL, v); }
kn_tensor *kn_zeros(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape) { return kn_full(ctx, dt, ndim, shape, 0); }
kn_tensor *kn_ones(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape) { return kn_full(ctx, dt, ndim, shape, 1); }

static kn_tensor *full_like(kn_ctx *ctx, const kn_tensor *x, double v) {
    if (!x) return NULL;
    kn_tensor *t = kn__node(ctx, KN_OP_FILL, x->dtype, x->ndim, x->shape, x->sym, NULL, 0);
    if (t) t->p.scalar.a = v;
    return t;
}
kn_tensor *kn_zeros_like(kn_ctx *ctx, const kn_tensor *x) { return full_like(ctx, x, 0); }
kn_tensor *kn_ones_like(kn_ctx *ctx, const kn_tensor *x) { return full_like(ctx, x, 1); }

kn_tensor *kn_arange(kn_ctx *ctx, kn_dtype dt, double start, double stop, double step) {
    if (step == 0 || !isfinite(start) || !isfinite(stop) || !isfinite(step))
        return kn__fail(ctx, KN_ERR_INVALID, "arange(%g, %g, %g): step must be non-zero and all values finite", start, stop, step);
    double n = ceil((stop - start) / step);
    int64_t len = n > 0 ? (int64_t)n : 0;
    kn_tensor *t = kn__node(ctx, KN_OP_ARANGE, dt, 1, &len, NULL, NULL, 0);
    if (t) { t->p.scalar.a = start; t->p.scalar.b = step; }
    return t;
}

kn_tensor *kn_linspace(kn_ctx *ctx, kn_dtype dt, double start, double stop, int64_t n) {
    if (n < 0) return kn__fail(ctx, KN_ERR_INVALID, "linspace: n must be >= 0, got %lld", (long long)n);
    kn_tensor *t = kn__node(ctx, KN_OP_ARANGE, dt, 1, &n, NULL, NULL, 0);
    if (t) { t->p.scalar.a = start; t->p.scalar.b = n > 1 ? (stop - start) / (double)(n - 1) : 0; }
    return t;
}

kn_tensor *kn_eye(kn_ctx *ctx, kn_dtype dt, int64_t n, int64_t m) {
    int64_t shape[2] = {n, m};
    return kn__node(ctx, KN_OP_EYE, dt, 2, shape, NULL, NULL, 0);
}

static kn_tensor *rand_node(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape,
                            kn_rand_kind kind, double a, double b, uint64_t seed) {
    kn_tensor *t = kn__node(ctx, KN_OP_RAND, dt, ndim, shape, NULL, NULL, 0);
    if (t) { t->p.rand.kind = kind; t->p.rand.a = a; t->p.rand.b = b; t->p.rand.seed = seed; }
    return t;
}
kn_tensor *kn_rand(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape, uint64_t seed) {
    return rand_node(ctx, dt, ndim, shape, KN_RAND_UNIFORM, 0, 1, seed);
}
kn_tensor *kn_randn(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape, uint64_t seed) {
    return rand_node(ctx, dt, ndim, shape, KN_RAND_NORMAL, 0, 1, seed);
}
kn_tensor *kn_rand_uniform(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape, double lo, double hi, uint64_t seed) {
    return rand_node(ctx, dt, ndim, shape, KN_RAND_UNIFORM, lo, hi, seed);
}
kn_tensor *kn_rand_normal(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape, double mean, double std, uint64_t seed) {
    return rand_node(ctx, dt, ndim, shape, KN_RAND_NORMAL, mean, std, seed);
}
kn_tensor *kn_bernoulli(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape, double p, uint64_t seed) {
    if (!(p >= 0 && p <= 1)) return kn__fail(ctx, KN_ERR_INVALID, "bernoulli: p = %g must be in [0, 1]", p);
    return rand_node(ctx, dt, ndim, shape, KN_RAND_BERNOULLI, p, 0, seed);
}
kn_tensor *kn_randint(kn_ctx *ctx, kn_dtype dt, int ndim, const int64_t *shape, int64_t lo, int64_t hi, uint64_t seed) {
    if (hi <= lo) return kn__fail(ctx, KN_ERR_INVALID, "randint: empty range [%lld, %lld)", (long long)lo, (long long)hi);
    return rand_node(ctx, dt, ndim, shape, KN_RAND_INT, (double)lo, (double)hi, seed);
}
kn_tensor *kn_randperm(kn_ctx *ctx, kn_dtype dt, int64_t n, uint64_t seed) {
    if (n < 0) return kn__fail(ctx, KN_ERR_INVALID, "randperm: n must be >= 0, got %lld", (long long)n);
    kn_tensor *t = kn__node(ctx, KN_OP_RANDPERM, dt, 1, &n, NULL, NULL, 0);
    if (t) t->p.rand.seed = seed;
    return t;
}
kn_tensor *kn_rand_offset(kn_ctx *ctx, kn_tensor *r, kn_tensor *offset) {
    if (!r || !offset) return NULL;
    if ((r->op != KN_OP_RAND && r->op != KN_OP_RANDPERM) || r->src[0])
        return kn__fail(ctx, KN_ERR_INVALID, "kn_rand_offset: the first argument must be a fresh random node (got %s)", kn_op_name(r->op));
    if (offset->ndim != 0 || offset->dtype != KN_I64)
        return kn__fail(ctx, KN_ERR_INVALID, "kn_rand_offset: the offset must be a 0-d i64 tensor");
    r->src[0] = offset;
    return r;
}
