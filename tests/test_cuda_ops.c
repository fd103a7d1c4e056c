/* test_cuda_ops.c: the CUDA backend against the reference backend.
 *
 * One driver (cu_cmp) builds the same graph on ref and on kn_backend_cuda()
 * with fresh random inputs (plain and transposed views), runs both and
 * compares every output element; NaN anywhere fails unless the case says
 * NaN is expected. Tables cover every unary and binary op, reductions and
 * scans, matmul layouts (plain, transposed, broadcast batch, 1-d, big f32 on
 * the SGEMM path, bf16/f16 on the tensor cores), creation ops (Philox
 * streams must match bit for bit), copies/casts, where/tri/assign, the index
 * family and the nn family (forward and, through kn_gradients, the *_BWD
 * ops), the fused Adam update, out-of-memory errors, and moving a module
 * tree between contexts (cpu -> cpu here in every build; cpu -> gpu -> cpu
 * with CUDA).
 * Built without CUDA (no KN_CUDA) or run without a GPU, the GPU tests SKIP.
 */
#include "kn_optest.h"
#include "kn_adamtest.h"      /* kn_adam_steps, kn_adam_many */
#include "kiln_nn.h"
#include <time.h>

/* ---- moving a module tree between contexts (any two backends) ---- */
static kn_module *mv_net(kn_ctx *ctx) {
    kn_nn_manual_seed(5);
    kn_module *net = kn_sequential_new(ctx, NULL);
    kn_sequential_add(net, kn_linear_new(ctx, 6, 16, true));
    kn_sequential_add(net, kn_layer_norm_new(ctx, 16, 1e-5, true, true));
    kn_sequential_add(net, kn_act_new(ctx, KN_ACT_GELU_TANH));
    kn_sequential_add(net, kn_batch_norm1d_new(ctx, 16, 1e-5, 0.1, true));
    kn_sequential_add(net, kn_linear_new(ctx, 16, 3, false));
    return net;
}
/* forward of net (eval mode) on x [5, 6] in the module's context: y [5, 3] */
static kn_status mv_fwd(kn_module *net, const float *x, float *y) {
    kn_ctx *ctx = kn_module_ctx(net);
    kn_tensor *xt = kn_from_data(ctx, KN_F32, 2, (const int64_t[]){5, 6}, x);
    kn_tensor *yt = kn_module_forward(net, xt);
    return yt ? kn_tensor_read(yt, y, KN_F32) : (kn_ctx_status(ctx) ? kn_ctx_status(ctx) : KN_ERR_INVALID);
}
/* moves net from its context to dst and checks names, shapes, flags, values
 * and that the forward still gives y0; returns the number of failed checks */
static int mv_check(kn_module *net, kn_ctx *dst, const float *x, const float *y0, double tol) {
    int bad = 0;
    kn_named_param before[32], after[32];
    int nb = kn_module_named_params(net, true, before, 32);
    float *vals[32];
    bool rg[32];
    for (int i = 0; i < nb; i++) {
        vals[i] = malloc(sizeof(float) * (size_t)kn_numel(before[i].t));
        kn_tensor_read(before[i].t, vals[i], KN_F32);
        rg[i] = kn_requires_grad(before[i].t);
    }
    if (kn_module_to_backend(net, dst) != KN_OK) { fprintf(stderr, "  move: %s\n", kn_last_error()); bad++; }
    int na = kn_module_named_params(net, true, after, 32);
    if (na != nb) { fprintf(stderr, "  %d params before, %d after\n", nb, na); bad++; }
    for (int i = 0; i < nb && i < na; i++) {
        kn_tensor *t = after[i].t;
        if (strcmp(before[i].name, after[i].name) || before[i].buffer != after[i].buffer || t->ctx != dst ||
            t == before[i].t || !kn_same_shape(t, before[i].t) || kn_requires_grad(t) != rg[i] || t != kn_module_find(net, after[i].name)) {
            fprintf(stderr, "  param %s moved wrong\n", after[i].name); bad++;
        }
        int64_t n = kn_numel(t);
        float *v = malloc(sizeof(float) * (size_t)n);
        if (kn_tensor_read(t, v, KN_F32) || memcmp(v, vals[i], sizeof(float) * (size_t)n)) { fprintf(stderr, "  %s values differ\n", after[i].name); bad++; }
        free(v); free(vals[i]);
    }
    for (int i = 0; i < kn_module_n_children(net); i++)
        if (kn_module_ctx(kn_module_child(net, i)) != dst) { fprintf(stderr, "  child %d not moved\n", i); bad++; }
    float y[15];
    if (mv_fwd(net, x, y)) { fprintf(stderr, "  forward after the move: %s\n", kn_last_error()); return bad + 1; }
    for (int i = 0; i < 15; i++)
        if (!(fabs(y[i] - y0[i]) <= tol * (1 + fabs(y0[i])))) { fprintf(stderr, "  y[%d] %g vs %g\n", i, y[i], y0[i]); bad++; break; }
    return bad;
}
TEST(module_moves_between_cpu_contexts) {
    kn_ctx *a = kn_ctx_new(&(kn_ctx_opts){kn_backend_cpu()}), *b = kn_ctx_new(&(kn_ctx_opts){kn_backend_cpu()});
    kn_module *net = mv_net(a);
    REQUIRE(net, "%s", kn_last_error());
    kn_module_train(net, false);
    float x[30], y0[15];
    kn_test_seed(40);
    for (int i = 0; i < 30; i++) x[i] = (float)kn_test_uniform(-2, 2);
    REQUIRE(mv_fwd(net, x, y0) == KN_OK, "%s", kn_last_error());
    CHECK(kn_module_to_backend(kn_module_child(net, 0), b) == KN_ERR_INVALID, "moving a child must be refused");
    CHECK(mv_check(net, b, x, y0, 0) == 0, "cpu -> cpu move");
    kn_ctx_free(a);                       /* nothing may point into the old context */
    float y1[15];
    CHECK(mv_fwd(net, x, y1) == KN_OK && !memcmp(y0, y1, sizeof y0), "forward after freeing the old context: %s", kn_last_error());
    /* a training step in the new context: parameters still require grad */
    kn_module_train(net, true);
    kn_tensor *xt = kn_from_data(b, KN_F32, 2, (const int64_t[]){5, 6}, x);
    kn_tensor *loss = kn_sum_all(b, kn_square(b, kn_module_forward(net, xt)));
    CHECK(loss && kn_backward(b, loss) == KN_OK, "backward: %s", kn_last_error());
    kn_tensor *w0 = kn_module_find(net, "0.weight");
    float gw[96];
    CHECK(kn_grad(w0) && kn_tensor_read(kn_grad(w0), gw, KN_F32) == KN_OK, "weight gradient: %s", kn_last_error());
    kn_module_free(net);
    kn_ctx_free(b);
}

#ifndef KN_CUDA
TEST(cuda_ops) { SKIP("built without CUDA: build with `make CUDA=1` and run on a GPU machine"); }
#else
#include "kiln_cuda.h"

static kn_backend *gpu(void) { return kn_backend_cuda(); }
#define NEED_GPU() do { if (!gpu()) SKIP("no GPU: %s", kn_last_error()); } while (0)

/* ref vs cuda; returns relative error, inf on error, size mismatch or NaN (unless nan_ok) */
static double cu_cmp_x(kn_build_fn build, void *ud, int nin, const kn_opin *ins, bool nan_ok) {
    double *vals[8];
    for (int i = 0; i < nin; i++) {
        int64_t n = kn__numel(&ins[i]);
        vals[i] = malloc(sizeof(double) * (size_t)(n ? n : 1));
        kn__fill_in(&ins[i], vals[i], n);
    }
    double *r = NULL, *c = NULL;
    int64_t nr = 0, nc = 0;
    kn_status s1 = kn__run_on(kn_backend_ref(), build, ud, nin, ins, vals, &r, &nr);
    char e1[256];
    snprintf(e1, sizeof e1, "%s", s1 ? kn_last_error() : "");
    kn_status s2 = kn__run_on(gpu(), build, ud, nin, ins, vals, &c, &nc);
    double err = INFINITY;
    if (s1 == KN_OK && s2 == KN_OK && nr == nc) {
        err = kn_rel_err(c, r, nr);
        if (!nan_ok)
            for (int64_t i = 0; i < nr; i++)
                if (isnan(r[i]) || isnan(c[i])) { err = INFINITY; fprintf(stderr, "  NaN at %lld (ref %g cuda %g)\n", (long long)i, r[i], c[i]); break; }
        if (err > 1e-3)
            for (int64_t i = 0, k = 0; i < nr && k < 4; i++)
                if (!(fabs(r[i] - c[i]) <= 1e-6 * (1 + fabs(r[i])))) { fprintf(stderr, "  [%lld] ref %.9g cuda %.9g\n", (long long)i, r[i], c[i]); k++; }
    } else {
        fprintf(stderr, "  ref %d (%s) cuda %d (%s) sizes %lld %lld\n", s1, e1, s2, s2 ? kn_last_error() : "", (long long)nr, (long long)nc);
    }
    for (int i = 0; i < nin; i++) free(vals[i]);
    free(r); free(c);
    return err;
}
static double cu_cmp(kn_build_fn build, void *ud, int nin, const kn_opin *ins) { return cu_cmp_x(build, ud, nin, ins, false); }

static kn_opin IN(int ndim, const int64_t *shape, double lo, double hi, kn_dtype dt, bool tr) {
    kn_opin o = {.ndim = ndim, .lo = lo, .hi = hi, .dtype = dt, .transposed = tr};
    for (int i = 0; i < ndim; i++) o.shape[i] = shape[i];
    return o;
}
#define SH(...) ((const int64_t[]){__VA_ARGS__})
static double tol_of(kn_dtype dt) { return dt == KN_F64 ? 1e-12 : dt == KN_F16 ? 4e-3 : dt == KN_BF16 ? 2e-2 : 2e-6; }
static const kn_dtype FDT[4] = {KN_F32, KN_F64, KN_F16, KN_BF16};

/* ---- unary ---- */
typedef struct { kn_op op; double lo, hi, a, b; } uspec;
static const uspec UNARY[] = {
    {KN_OP_NEG, -2, 2}, {KN_OP_ABS, -2, 2}, {KN_OP_SIGN, -2, 2}, {KN_OP_EXP, -2, 2}, {KN_OP_EXP2, -2, 2},
    {KN_OP_LOG, 0.3, 3}, {KN_OP_LOG2, 0.3, 3}, {KN_OP_LOG1P, -0.5, 3}, {KN_OP_EXPM1, -2, 2},
    {KN_OP_SQRT, 0.3, 3}, {KN_OP_RSQRT, 0.3, 3}, {KN_OP_RECIPROCAL, 0.5, 3}, {KN_OP_SQUARE, -2, 2},
    {KN_OP_SIN, -3, 3}, {KN_OP_COS, -3, 3}, {KN_OP_TAN, -1.2, 1.2}, {KN_OP_ASIN, -0.8, 0.8},
    {KN_OP_ACOS, -0.8, 0.8}, {KN_OP_ATAN, -3, 3}, {KN_OP_SINH, -2, 2}, {KN_OP_COSH, -2, 2},
    {KN_OP_TANH, -2, 2}, {KN_OP_ASINH, -2, 2}, {KN_OP_ACOSH, 1.2, 3}, {KN_OP_ATANH, -0.8, 0.8},
    {KN_OP_ERF, -2, 2}, {KN_OP_FLOOR, -2, 2}, {KN_OP_CEIL, -2, 2}, {KN_OP_ROUND, -2, 2},
    {KN_OP_TRUNC, -2, 2}, {KN_OP_CLAMP, -2, 2, -0.5, 0.7}, {KN_OP_NOT, -1, 2}, {KN_OP_RELU, -2, 2},
    {KN_OP_LEAKY_RELU, -2, 2, 0.1}, {KN_OP_ELU, -2, 2, 1.3}, {KN_OP_SELU, -2, 2}, {KN_OP_GELU, -3, 3},
    {KN_OP_GELU_TANH, -3, 3}, {KN_OP_SILU, -3, 3}, {KN_OP_SIGMOID, -4, 4}, {KN_OP_SOFTPLUS, -4, 25},
    {KN_OP_MISH, -3, 3}, {KN_OP_HARDTANH, -2, 2, -0.6, 0.9}, {KN_OP_HARDSIGMOID, -5, 5},
    {KN_OP_GELU_TANH_GRAD, -4, 4},
};
static kn_tensor *b_unary(kn_ctx *ctx, kn_tensor **in, void *ud) {
    const uspec *u = ud;
    kn_tensor *x = in[0];
    if (u->op == KN_OP_NOT) x = kn_floor(ctx, x);       /* some exact zeros */
    switch (u->op) {
    case KN_OP_CLAMP: return kn_clamp(ctx, x, u->a, u->b);
    case KN_OP_HARDTANH: return kn_hardtanh(ctx, x, u->a, u->b);
    case KN_OP_LEAKY_RELU: return kn_leaky_relu(ctx, x, u->a);
    case KN_OP_ELU: return kn_elu(ctx, x, u->a);
    default: return kn_unary(ctx, u->op, x);
    }
}
TEST(unary_all_ops_all_float_dtypes) {
    NEED_GPU();
    kn_test_seed(11);
    for (size_t i = 0; i < sizeof UNARY / sizeof UNARY[0]; i++)
        for (int k = 0; k < 4; k++) {
            const uspec *u = &UNARY[i];
            kn_opin in = IN(2, SH(7, 13), u->lo, u->hi, FDT[k], k != 0);
            double e = cu_cmp(b_unary, (void *)u, 1, &in);
            CHECK(e <= tol_of(FDT[k]), "%s %s: rel err %g", kn_op_name(u->op), kn_dtype_name(FDT[k]), e);
        }
    /* big contiguous f32 (fast path) and odd 4-d strided */
    uspec ex = {KN_OP_EXP, -3, 3};
    kn_opin big = IN(2, SH(257, 1031), -3, 3, KN_F32, false);
    CHECK(cu_cmp(b_unary, &ex, 1, &big) <= 1e-6, "exp big");
    kn_opin odd = IN(4, SH(2, 3, 1, 5), -3, 3, KN_F64, true);
    CHECK(cu_cmp(b_unary, &ex, 1, &odd) <= 1e-12, "exp 4-d");
}

/* ---- binary ---- */
typedef struct { kn_op op; double lo, hi; } bspec;
static const bspec BINARY[] = {
    {KN_OP_ADD, -2, 2}, {KN_OP_SUB, -2, 2}, {KN_OP_MUL, -2, 2}, {KN_OP_DIV, 0.5, 2}, {KN_OP_POW, 0.5, 2},
    {KN_OP_MAXIMUM, -2, 2}, {KN_OP_MINIMUM, -2, 2}, {KN_OP_FMOD, 0.5, 4}, {KN_OP_ATAN2, -2, 2},
    {KN_OP_EQ, -2, 2}, {KN_OP_NE, -2, 2}, {KN_OP_LT, -2, 2}, {KN_OP_LE, -2, 2}, {KN_OP_GT, -2, 2},
    {KN_OP_GE, -2, 2}, {KN_OP_AND, -1, 2}, {KN_OP_OR, -1, 2},
};
typedef struct { const bspec *b; bool rnd; } bcase;
static kn_tensor *b_binary(kn_ctx *ctx, kn_tensor **in, void *ud) {
    const bcase *c = ud;
    kn_tensor *x = in[0], *y = in[1];
    if (c->rnd || c->b->op == KN_OP_AND || c->b->op == KN_OP_OR || c->b->op == KN_OP_EQ || c->b->op == KN_OP_NE ||
        c->b->op == KN_OP_LE || c->b->op == KN_OP_GE) { x = kn_round(ctx, x); y = kn_round(ctx, y); }   /* ties and zeros */
    return kn_binary(ctx, c->b->op, x, y);
}
TEST(binary_all_ops_broadcast_and_dtypes) {
    NEED_GPU();
    kn_test_seed(12);
    for (size_t i = 0; i < sizeof BINARY / sizeof BINARY[0]; i++) {
        const bspec *b = &BINARY[i];
        bcase c = {b, false};
        for (int k = 0; k < 4; k++) {
            kn_opin s[2] = {IN(2, SH(5, 9), b->lo, b->hi, FDT[k], true), IN(2, SH(5, 9), b->lo, b->hi, FDT[k], false)};
            double e = cu_cmp(b_binary, &c, 2, s);
            CHECK(e <= tol_of(FDT[k]), "%s %s same shape: %g", kn_op_name(b->op), kn_dtype_name(FDT[k]), e);
        }
        kn_opin bc[2] = {IN(3, SH(4, 1, 6), b->lo, b->hi, KN_F32, false), IN(2, SH(3, 1), b->lo, b->hi, KN_F64, false)};
        CHECK(cu_cmp(b_binary, &c, 2, bc) <= 1e-12, "%s broadcast f32 x f64", kn_op_name(b->op));
        kn_opin sc[2] = {IN(3, SH(2, 3, 4), b->lo, b->hi, KN_F32, true), IN(0, SH(1), b->lo, b->hi, KN_F32, false)};
        CHECK(cu_cmp(b_binary, &c, 2, sc) <= 2e-6, "%s with a 0-d operand", kn_op_name(b->op));
        kn_opin b4[2] = {IN(4, SH(2, 3, 5, 7), b->lo, b->hi, KN_F32, true), IN(4, SH(2, 1, 5, 1), b->lo, b->hi, KN_F32, false)};
        CHECK(cu_cmp(b_binary, &c, 2, b4) <= 2e-6, "%s broadcast f32 4-d", kn_op_name(b->op));
        /* float4 path: inner extent % 4 == 0, operands contiguous or broadcast along it */
        kn_opin v1[2] = {IN(4, SH(2, 3, 5, 8), b->lo, b->hi, KN_F32, false), IN(4, SH(1, 3, 1, 8), b->lo, b->hi, KN_F32, false)};
        kn_opin v2[2] = {IN(4, SH(2, 1, 5, 1), b->lo, b->hi, KN_F32, false), IN(4, SH(2, 3, 5, 8), b->lo, b->hi, KN_F32, false)};
        CHECK(cu_cmp(b_binary, &c, 2, v1) <= 2e-6, "%s f32 float4, row broadcast", kn_op_name(b->op));
        CHECK(cu_cmp(b_binary, &c, 2, v2) <= 2e-6, "%s f32 float4, column broadcast", kn_op_name(b->op));
        if (b->op != KN_OP_POW && b->op != KN_OP_ATAN2 && b->op != KN_OP_DIV) {
            bcase ci = {b, true};
            kn_opin it[2] = {IN(2, SH(6, 7), -9, 9, KN_I32, false), IN(2, SH(1, 7), b->op == KN_OP_FMOD ? 1 : -9, 9, KN_I32, false)};
            if (b->op == KN_OP_FMOD) it[1].lo = 1;
            CHECK(cu_cmp(b_binary, &ci, 2, it) <= 0, "%s i32", kn_op_name(b->op));
        }
    }
}

/* ---- reductions and scans ---- */
typedef struct { kn_op op; int naxes; int axes[3]; bool keep; int corr; double p; } rspec;
static kn_tensor *b_reduce(kn_ctx *ctx, kn_tensor **in, void *ud) {
    const rspec *r = ud;
    switch (r->op) {
    case KN_OP_ARGMAX: return kn_argmax(ctx, in[0], r->axes[0], r->keep);
    case KN_OP_ARGMIN: return kn_argmin(ctx, in[0], r->axes[0], r->keep);
    case KN_OP_VAR: return kn_var(ctx, in[0], r->naxes, r->axes, r->corr, r->keep);
    case KN_OP_STD: return kn_std(ctx, in[0], r->naxes, r->axes, r->corr, r->keep);
    case KN_OP_NORM: return kn_norm(ctx, in[0], r->p, r->naxes, r->axes, r->keep);
    case KN_OP_ALL: case KN_OP_ANY: return kn_reduce(ctx, r->op, kn_round(ctx, in[0]), r->naxes, r->axes, r->keep);
    case KN_OP_CUMSUM: return kn_cumsum(ctx, in[0], r->axes[0]);
    case KN_OP_CUMPROD: return kn_cumprod(ctx, in[0], r->axes[0]);
    default: return kn_reduce(ctx, r->op, in[0], r->naxes, r->axes, r->keep);
    }
}
TEST(reductions_and_scans) {
    NEED_GPU();
    kn_test_seed(13);
    kn_op ops[] = {KN_OP_SUM, KN_OP_MEAN, KN_OP_PROD, KN_OP_MAX, KN_OP_MIN, KN_OP_VAR, KN_OP_STD,
                   KN_OP_LOGSUMEXP, KN_OP_NORM, KN_OP_ALL, KN_OP_ANY};
    rspec axes[] = {{0, 0, {0}, false}, {0, 1, {2}, false}, {0, 1, {0}, true}, {0, 2, {0, 2}, false}, {0, 1, {1}, true}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        for (size_t a = 0; a < sizeof axes / sizeof axes[0]; a++) {
            rspec r = axes[a];
            r.op = ops[i]; r.corr = (int)(a & 1); r.p = a == 3 ? INFINITY : 1.0 + (double)a * 0.5;
            kn_opin in = IN(3, SH(3, 5, 70), ops[i] == KN_OP_PROD ? 0.7 : -1.5, ops[i] == KN_OP_PROD ? 1.3 : 1.5,
                            a & 1 ? KN_F64 : KN_F32, a != 2);
            double e = cu_cmp(b_reduce, &r, 1, &in);
            CHECK(e <= 2e-6, "%s axes case %zu: %g", kn_op_name(ops[i]), a, e);
        }
    /* sums and means split over many blocks (two passes): few outputs over
     * long rows (a whole-tensor sum, a norm's sum of squares), and columns
     * of adjacent outputs over many rows (a bias gradient), either layout */
    {
        rspec all = {KN_OP_SUM, 0, {0}, false}, mall = {KN_OP_MEAN, 2, {0, 1}, true};
        rspec col = {KN_OP_SUM, 1, {0}, false}, mcol = {KN_OP_MEAN, 2, {0, 1}, false};
        kn_opin big = IN(2, SH(300, 701), -1, 1, KN_F32, false), bigt = IN(2, SH(300, 701), -1, 1, KN_F64, true);
        kn_opin tall = IN(2, SH(20000, 40), -1, 1, KN_F32, false), tall3 = IN(3, SH(64, 130, 36), -1, 1, KN_F32, false);
        CHECK(cu_cmp(b_reduce, &all, 1, &big) <= 2e-6, "sum all, split");
        CHECK(cu_cmp(b_reduce, &mall, 1, &bigt) <= 1e-12, "mean all f64 transposed, split");
        CHECK(cu_cmp(b_reduce, &col, 1, &tall) <= 2e-6, "column sum, split");
        CHECK(cu_cmp(b_reduce, &mcol, 1, &tall3) <= 2e-6, "column mean over two dims");
    }
    /* row sums over a unit-stride dim with many outputs (a warp per row),
     * and the same rows read through a permuted view */
    {
        rspec last = {KN_OP_SUM, 1, {2}, true}, mlast = {KN_OP_MEAN, 1, {2}, false}, mid = {KN_OP_SUM, 1, {1}, false};
        kn_opin rows = IN(3, SH(64, 30, 70), -1, 1, KN_F32, false), rowst = IN(3, SH(64, 70, 30), -1, 1, KN_F32, true);
        CHECK(cu_cmp(b_reduce, &last, 1, &rows) <= 2e-6, "row sums, warp per row");
        CHECK(cu_cmp(b_reduce, &mlast, 1, &rows) <= 2e-6, "row means, warp per row");
        CHECK(cu_cmp(b_reduce, &mid, 1, &rowst) <= 2e-6, "sums over a unit-stride middle dim");
    }
    /* a long reduction (many threads per block) in f16 input, f32 out */
    rspec big = {KN_OP_SUM, 1, {1}, false};
    kn_opin bi = IN(2, SH(3, 100003), -1, 1, KN_F16, false);
    CHECK(cu_cmp(b_reduce, &big, 1, &bi) <= 4e-3, "sum long f16");
    for (int d = 0; d < 3; d++) {
        rspec am = {KN_OP_ARGMAX, 1, {d}, d == 1}, an = {KN_OP_ARGMIN, 1, {d}, false};
        kn_opin in = IN(3, SH(4, 300, 6), -2, 2, KN_F32, true);
        CHECK(cu_cmp(b_reduce, &am, 1, &in) == 0, "argmax dim %d", d);
        CHECK(cu_cmp(b_reduce, &an, 1, &in) == 0, "argmin dim %d", d);
        rspec cs = {KN_OP_CUMSUM, 1, {d}}, cp = {KN_OP_CUMPROD, 1, {d}};
        kn_opin sin_ = IN(3, SH(3, 4, 5), 0.8, 1.2, d == 2 ? KN_F64 : KN_F32, true);
        CHECK(cu_cmp(b_reduce, &cs, 1, &sin_) <= 2e-6, "cumsum dim %d", d);
        CHECK(cu_cmp(b_reduce, &cp, 1, &sin_) <= 2e-6, "cumprod dim %d", d);
    }
}

/* NaN rules: max/argmax take the first NaN, sum propagates, logsumexp of -inf rows */
static kn_tensor *b_nan(kn_ctx *ctx, kn_tensor **in, void *ud) {
    int which = *(int *)ud;
    double v[12] = {1, 5, NAN, 2, 3, 7, 7, 0, -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    kn_tensor *x = kn_from_data(ctx, KN_F64, 2, SH(3, 4), v);
    int ax = 1;
    switch (which) {
    case 0: return kn_max(ctx, x, 1, &ax, false);
    case 1: return kn_cast(ctx, kn_argmax(ctx, x, 1, false), KN_F64);
    case 2: return kn_sum(ctx, x, 1, &ax, false);
    case 3: return kn_logsumexp(ctx, x, 1, &ax, false);
    default: return kn_softmax(ctx, x, 1);
    }
}
TEST(nan_and_inf_rules_match_the_reference) {
    NEED_GPU();
    for (int w = 0; w < 5; w++) {
        double e = cu_cmp_x(b_nan, &w, 0, NULL, true);
        CHECK(e <= 1e-12, "nan case %d: %g", w, e);
    }
}

/* ---- matmul ---- */
typedef struct { int dummy; } mspec;
static kn_tensor *b_matmul(kn_ctx *ctx, kn_tensor **in, void *ud) { return kn_matmul(ctx, in[0], in[1]); }
TEST(matmul_layouts) {
    NEED_GPU();
    kn_test_seed(14);
    struct { kn_opin a, b; double tol; } C[] = {
        {IN(2, SH(5, 7), -1, 1, KN_F32, false), IN(2, SH(7, 3), -1, 1, KN_F32, false), 2e-6},
        {IN(2, SH(5, 7), -1, 1, KN_F32, true), IN(2, SH(7, 3), -1, 1, KN_F32, false), 2e-6},
        {IN(2, SH(5, 7), -1, 1, KN_F32, false), IN(2, SH(7, 3), -1, 1, KN_F32, true), 2e-6},
        {IN(2, SH(5, 7), -1, 1, KN_F32, true), IN(2, SH(7, 3), -1, 1, KN_F32, true), 2e-6},
        {IN(4, SH(2, 1, 4, 6), -1, 1, KN_F32, true), IN(3, SH(3, 6, 5), -1, 1, KN_F32, false), 2e-6},
        {IN(1, SH(6), -1, 1, KN_F32, false), IN(3, SH(2, 6, 5), -1, 1, KN_F32, true), 2e-6},
        {IN(3, SH(2, 4, 6), -1, 1, KN_F32, false), IN(1, SH(6), -1, 1, KN_F32, false), 2e-6},
        {IN(2, SH(130, 70), -1, 1, KN_F32, false), IN(2, SH(70, 190), -1, 1, KN_F32, true), 1e-5},
        {IN(3, SH(3, 129, 65), -1, 1, KN_F32, true), IN(3, SH(3, 65, 257), -1, 1, KN_F32, false), 1e-5},
        /* long K, few output tiles: split-K (slices as a batch, then a sum) */
        {IN(2, SH(128, 4096), -1, 1, KN_F32, true), IN(2, SH(4096, 132), -1, 1, KN_F32, false), 1e-5},
        {IN(2, SH(36, 2048), -1, 1, KN_F32, false), IN(2, SH(2048, 100), -1, 1, KN_F32, true), 1e-5},
        /* batched SGEMM kernel: two batch dims, b shared along the first, either layout */
        {IN(4, SH(2, 3, 132, 64), -1, 1, KN_F32, false), IN(3, SH(3, 64, 136), -1, 1, KN_F32, true), 1e-5},
        {IN(4, SH(2, 3, 132, 64), -1, 1, KN_F32, true), IN(2, SH(64, 136), -1, 1, KN_F32, false), 1e-5},
        {IN(2, SH(5, 7), -1, 1, KN_F64, true), IN(2, SH(7, 3), -1, 1, KN_F64, false), 1e-13},
        {IN(2, SH(9, 17), -1, 1, KN_F16, false), IN(2, SH(17, 5), -1, 1, KN_F16, true), 4e-3},
        {IN(2, SH(9, 17), -1, 1, KN_BF16, false), IN(2, SH(17, 5), -1, 1, KN_F32, false), 2e-2},
        {IN(2, SH(4, 0), -1, 1, KN_F32, false), IN(2, SH(0, 3), -1, 1, KN_F32, false), 0},
        /* decode rows through the GEMV kernels: x [1,K] (or [1,1,K]) @ W^T, W [N,K] f32 or bf16 */
        {IN(2, SH(1, 64), -1, 1, KN_F32, false), IN(2, SH(64, 97), -1, 1, KN_F32, true), 1e-5},
        {IN(3, SH(1, 1, 520), -1, 1, KN_F32, false), IN(2, SH(520, 300), -1, 1, KN_BF16, true), 1e-5},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        kn_opin in[2] = {C[i].a, C[i].b};
        double e = cu_cmp(b_matmul, NULL, 2, in);
        CHECK(e <= C[i].tol, "matmul case %zu: rel err %g", i, e);
    }
}

/* bf16 x bf16 and f16 x f16 products on the tensor cores (gemm_tc.cu, and
 * gemm_bf16_sm90.cu's wgmma kernel for the dense x @ W^T shape with enough
 * tiles). The inputs are exact in both dtypes, so the only differences from
 * the double reference are the f32 accumulation order and the one rounding
 * of the output: tolerance 1e-2 for bf16 out (8 bits of mantissa), 2e-3 for
 * f16 out (11 bits). Mixed operand dtypes (bf16 x f32) stay on the generic
 * double kernel (matmul_layouts case 15) unless they are a decode row (f32 x [1,K] @ bf16 W^T:
 * the GEMV kernel, matmul_layouts case 18). */
typedef struct { kn_opin a, b; } mm_pair;
/* every pair as bf16 x bf16 and as f16 x f16 against the reference */
static void half_matmul_cases(const mm_pair *C, size_t n, const char *what) {
    kn_dtype dts[2] = {KN_BF16, KN_F16};
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < n; i++) {
            kn_opin in[2] = {C[i].a, C[i].b};
            in[0].dtype = in[1].dtype = dts[k];
            double tol = k == 0 ? 1e-2 : 2e-3;
            double e = cu_cmp(b_matmul, NULL, 2, in);
            CHECK(e <= tol, "%s %s case %zu: rel err %g (tol %g)", kn_dtype_name(dts[k]), what, i, e, tol);
        }
}
TEST(matmul_tensor_cores_bf16_f16) {
    NEED_GPU();
    kn_test_seed(19);
    mm_pair C[] = {
        {IN(2, SH(1, 1), -1, 1, 0, false), IN(2, SH(1, 1), -1, 1, 0, false)},                /* 1x1x1 */
        {IN(2, SH(5, 7), -1, 1, 0, false), IN(2, SH(7, 3), -1, 1, 0, false)},                 /* tiny, K < 8 */
        {IN(2, SH(130, 70), -1, 1, 0, true), IN(2, SH(70, 190), -1, 1, 0, false)},            /* A stored K x M */
        {IN(2, SH(129, 33), -1, 1, 0, false), IN(2, SH(33, 257), -1, 1, 0, true)},            /* B stored N x K */
        {IN(2, SH(200, 65), -1, 1, 0, true), IN(2, SH(65, 131), -1, 1, 0, true)},             /* both */
        {IN(4, SH(2, 3, 67, 40), -1, 1, 0, false), IN(3, SH(3, 40, 72), -1, 1, 0, true)},     /* batch, b broadcast along dim 0 */
        {IN(4, SH(2, 1, 33, 48), -1, 1, 0, true), IN(3, SH(3, 48, 17), -1, 1, 0, false)},     /* a broadcast along dim 1 */
        {IN(3, SH(4, 1, 64), -1, 1, 0, false), IN(2, SH(64, 96), -1, 1, 0, true)},            /* M = 1 rows */
        {IN(1, SH(40), -1, 1, 0, false), IN(3, SH(2, 40, 24), -1, 1, 0, false)},              /* 1-d @ batch */
        {IN(2, SH(300, 1000), -1, 1, 0, false), IN(2, SH(1000, 136), -1, 1, 0, false)},       /* long K */
        {IN(2, SH(7, 64), -1, 1, 0, false), IN(2, SH(64, 50257), -1, 1, 0, true)},           /* prompt logits: few rows, a 50257 vocabulary */
        {IN(2, SH(16, 48), -1, 1, 0, false), IN(2, SH(48, 2305), -1, 1, 0, true)},            /* few rows, odd N over a wave */
        /* few output tiles over a long K (weight gradients dY^T X): split-K, each layout
         * (on an sm_90a GPU the wgmma kernel's: slices of unequal length, a K % 64 tail,
         * partial tiles; an odd N takes the mma.sync slices) */
        {IN(2, SH(200, 4096), -1, 1, 0, true), IN(2, SH(4096, 136), -1, 1, 0, false)},
        {IN(2, SH(96, 4160), -1, 1, 0, false), IN(2, SH(4160, 72), -1, 1, 0, true)},
        {IN(2, SH(300, 4504), -1, 1, 0, false), IN(2, SH(4504, 264), -1, 1, 0, false)},
        {IN(2, SH(136, 4504), -1, 1, 0, true), IN(2, SH(4504, 200), -1, 1, 0, true)},
        {IN(2, SH(128, 4096), -1, 1, 0, false), IN(2, SH(4096, 135), -1, 1, 0, true)},
        /* x [2, 512, 72] @ W^T, W [2304, 72]: folds into one 1024 x 2304 GEMM, the wgmma shape for bf16 */
        {IN(3, SH(2, 512, 72), -1, 1, 0, false), IN(2, SH(72, 2304), -1, 1, 0, true)},
    };
    half_matmul_cases(C, sizeof C / sizeof C[0], "matmul");
}

/* Products big enough (>= 66 block tiles of 128 x 256, or 128 x 128 for
 * N <= 128 or where 128 x 256 tiles fill less than a wave), with K > 64, for the wgmma kernel of gemm_bf16_sm90.cu on an sm_90a GPU, in
 * each operand layout: A stored [M,K] or [K,M] ("transposed" a), B stored
 * [K,N] or [N,K] ("transposed" b); partial tiles in M, N and K (K % 64 !=
 * 0); batches with one stride per operand (attention [B,H,T,D]), a shared
 * B that cannot fold into M (A stored [K,M]), and a batch that folds. Other
 * GPUs run the same cases on mma.sync. Tolerances as above. */
TEST(matmul_wgmma_layouts_bf16_f16) {
    NEED_GPU();
    kn_test_seed(23);
    mm_pair C[] = {
        {IN(2, SH(1030, 72), -1, 1, 0, false), IN(2, SH(72, 2000), -1, 1, 0, false)},            /* NN */
        {IN(2, SH(1030, 72), -1, 1, 0, false), IN(2, SH(72, 2000), -1, 1, 0, true)},             /* NT */
        {IN(2, SH(1032, 72), -1, 1, 0, true), IN(2, SH(72, 2000), -1, 1, 0, false)},             /* TN */
        {IN(2, SH(1032, 72), -1, 1, 0, true), IN(2, SH(72, 2000), -1, 1, 0, true)},              /* TT */
        {IN(4, SH(2, 17, 200, 72), -1, 1, 0, false), IN(4, SH(2, 17, 72, 72), -1, 1, 0, false)}, /* P @ V, N <= 128 */
        {IN(4, SH(2, 17, 200, 80), -1, 1, 0, false), IN(4, SH(2, 17, 80, 136), -1, 1, 0, true)}, /* Q @ K^T */
        {IN(3, SH(34, 200, 72), -1, 1, 0, true), IN(3, SH(34, 72, 72), -1, 1, 0, false)},        /* P^T @ dO, narrow */
        {IN(3, SH(12, 264, 88), -1, 1, 0, true), IN(2, SH(88, 520), -1, 1, 0, false)},           /* shared B, no fold */
        {IN(3, SH(3, 400, 72), -1, 1, 0, false), IN(2, SH(72, 2000), -1, 1, 0, false)},          /* folds into M */
        /* an odd N (rows of C not 16-byte aligned: the logits of a 50257 vocabulary) */
        {IN(2, SH(1030, 72), -1, 1, 0, false), IN(2, SH(72, 2001), -1, 1, 0, true)},
        /* under a wave of 128 x 256 tiles but a wave of 128 x 128 (a weight gradient
         * dW [2304, 768] = dY^T X): 128-wide tiles, even and odd N */
        {IN(2, SH(2200, 200), -1, 1, 0, true), IN(2, SH(200, 600), -1, 1, 0, false)},
        {IN(2, SH(2200, 200), -1, 1, 0, true), IN(2, SH(200, 601), -1, 1, 0, false)},
        /* more tiles than the SMs take at once (the persistent kernel walks
         * several; its ring of stages runs on from one tile to the next):
         * 128-wide tiles over an odd count of M tiles (the last pair's second
         * block lies past M), then 256-wide ones (more k-steps
         * than stages: 4 against 3) and both operands transposed */
        {IN(2, SH(2100, 200), -1, 1, 0, false), IN(2, SH(200, 4000), -1, 1, 0, true)},
        {IN(2, SH(2100, 200), -1, 1, 0, true), IN(2, SH(200, 3000), -1, 1, 0, true)},
    };
    half_matmul_cases(C, sizeof C / sizeof C[0], "wgmma-size matmul");
}

/* ---- the fused Adam update: f32 float4 kernel vs the cpu fast path and the reference ----
 * 7 steps with an lr change, Adam (coupled decay) and AdamW; a [n] parameter
 * (contiguous gradient, n = 5 and 10007: the float4 body and the n % 4
 * tail) and a [37, 53] one whose gradient is a transposed view (strided g).
 * Tolerances: vs the cpu backend (same f32 operation sequence, no FMA
 * contraction) 1e-6 relative, and 0 is expected; vs the double reference
 * 1e-4 relative to |ref| + 1e-3, as test_optim.c checks the composite. */
TEST(adam_update_f32_kernel) {
    NEED_GPU();
    kn_test_seed(20);
    struct { int R, C; bool tr; } S[3] = {{1, 5, false}, {1, 10007, false}, {37, 53, true}};
    for (int kind = 0; kind < 2; kind++)
        for (int si = 0; si < 3; si++) {
            int n = S[si].R * S[si].C;
            double *p0 = malloc(sizeof(double) * n), *a = malloc(sizeof(double) * n), *r[3];
            for (int i = 0; i < 3; i++) r[i] = malloc(sizeof(double) * 3 * n);
            for (int i = 0; i < n; i++) { p0[i] = kn_test_uniform(-2, 2); a[i] = kn_test_uniform(0.01, 3); }
            kn_optim_cfg c = kn_optim_defaults(kind ? KN_OPTIM_ADAMW : KN_OPTIM_ADAM);
            c.lr = 0.05; c.weight_decay = kind ? 0.05 : 0.1;
            REQUIRE(kn_adam_steps(kn_backend_ref(), &c, S[si].R, S[si].C, S[si].tr, p0, a, r[0]), "ref: %s", kn_last_error());
            REQUIRE(kn_adam_steps(kn_backend_cpu(), &c, S[si].R, S[si].C, S[si].tr, p0, a, r[1]), "cpu: %s", kn_last_error());
            for (int i = 0; i < 3 * n; i++) r[2][i] = NAN;
            REQUIRE(kn_adam_steps(gpu(), &c, S[si].R, S[si].C, S[si].tr, p0, a, r[2]), "cuda: %s", kn_last_error());
            double wr = 0, wc = 0;
            int64_t ndiff = 0;
            for (int i = 0; i < 3 * n; i++) {
                double dr = fabs(r[2][i] - r[0][i]) / (fabs(r[0][i]) + 1e-3), dc = fabs(r[2][i] - r[1][i]) / (fabs(r[1][i]) + 1e-3);
                if (!(dr <= wr)) wr = dr;       /* NaN sticks */
                if (!(dc <= wc)) wc = dc;
                ndiff += r[2][i] != r[1][i];
            }
            printf("  %s %dx%d%s: cuda vs cpu worst %.3g (%lld of %d values differ), vs ref %.3g\n", kind ? "AdamW" : "Adam",
                   S[si].R, S[si].C, S[si].tr ? " (strided grad)" : "", wc, (long long)ndiff, 3 * n, wr);
            CHECK(wc <= 1e-6, "%s n=%d cuda vs cpu: worst rel diff %.3g", kind ? "AdamW" : "Adam", n, wc);
            CHECK(wr < 1e-4, "%s n=%d cuda vs ref: worst rel diff %.3g", kind ? "AdamW" : "Adam", n, wr);
            free(p0); free(a);
            for (int i = 0; i < 3; i++) free(r[i]);
        }
}

/* The multi-tensor step on the GPU: 70 parameters' updates (kn_adam_many:
 * odd sizes, strided gradients, two groups) as batched launches
 * (k_adam_f32_batch, 32 updates a launch), bit for bit the cpu backend's
 * (which batches its own way) and the GPU's own one-at-a-time kernel. */
uint64_t kn_cu_adam_batches(void);      /* cuda_ops_optim.cu: batched launches so far */
void kn_cu_adam_batch_mode(int on);      /* cuda_ops_optim.cu: batches on (off by default: KN_CUDA_TUNE=adam_batch=1) */
TEST(adam_batched_updates_match_cpu_bits) {
    NEED_GPU();
    int64_t len = kn_am_len();
    double *r[3];
    for (int i = 0; i < 3; i++) r[i] = malloc(sizeof(double) * (size_t)len);
    for (int kind = 0; kind < 2; kind++) {
        kn_optim_cfg c = kn_optim_defaults(kind ? KN_OPTIM_ADAMW : KN_OPTIM_ADAM);
        c.lr = 0.05; c.weight_decay = kind ? 0.05 : 0.1;
        int nb[3];
        uint64_t l0 = kn_cu_adam_batches();
        kn_cu_adam_batch_mode(1);
        bool okb = kn_adam_many(gpu(), &c, r[0], &nb[0]);
        kn_cu_adam_batch_mode(0);
        REQUIRE(okb, "cuda batched: %s", kn_last_error());
        uint64_t launches = kn_cu_adam_batches() - l0;
        bool ok = kn_adam_many_unbatched(gpu(), &c, r[1], &nb[1]);
        REQUIRE(ok, "cuda one at a time: %s", kn_last_error());
        REQUIRE(kn_adam_many(kn_backend_cpu(), &c, r[2], &nb[2]), "cpu: %s", kn_last_error());
        CHECK(nb[0] == KN_AM_NP && nb[1] == 0, "batched nodes: %d (want %d), with KN_BATCH=0 %d", nb[0], KN_AM_NP, nb[1]);
        /* 3 a stepped run (32 + 32 + 6 updates); a CUDA graph's replays launch from the device, uncounted */
        CHECK(launches >= 3 && launches % 3 == 0, "%llu batched launches (want 3 a stepped run)", (unsigned long long)launches);
        int64_t d01 = 0, d02 = 0;
        for (int64_t i = 0; i < len; i++) {
            d01 += memcmp(&r[0][i], &r[1][i], sizeof(double)) != 0;
            d02 += memcmp(&r[0][i], &r[2][i], sizeof(double)) != 0;
        }
        CHECK(d01 == 0 && d02 == 0, "%s: of %lld values, %lld differ from the one-at-a-time kernel, %lld from the cpu",
              kind ? "AdamW" : "Adam", (long long)len, (long long)d01, (long long)d02);
    }
    for (int i = 0; i < 3; i++) free(r[i]);
}

/* Asking for more device memory than the GPU has is KN_ERR_NOMEM with the
 * sizes in the message, for a leaf (allocated at once) and for a plan's
 * node (allocated when planned), and the backend keeps working after. */
TEST(out_of_device_memory_is_an_error) {
    NEED_GPU();
    int64_t huge = (int64_t)1 << 38;                 /* 2^38 f32: 1 TiB */
    kn_ctx *g = kn_ctx_new(&(kn_ctx_opts){gpu()});
    kn_tensor *t = kn_empty(g, KN_F32, 1, &huge);
    CHECK(!t && kn_ctx_status(g) == KN_ERR_NOMEM, "leaf of 1 TiB: %p status %d", (void *)t, kn_ctx_status(g));
    CHECK(strstr(kn_last_error(), "1099511627776"), "message names the size: %s", kn_last_error());
    printf("  leaf: %s\n", kn_last_error());
    kn_ctx_free(g);
    g = kn_ctx_new(&(kn_ctx_opts){gpu()});
    kn_tensor *x = kn_ones(g, KN_F32, 1, SH(1));
    kn_tensor *y = kn_sum_all(g, kn_add_scalar(g, kn_expand(g, x, 1, &huge), 1));
    float v = 0;
    kn_status st = kn_tensor_read(y, &v, KN_F32);
    CHECK(st == KN_ERR_NOMEM, "plan with a 1 TiB node: status %d (%s)", st, kn_last_error());
    printf("  plan: %s\n", kn_last_error());
    kn_ctx_free(g);
    g = kn_ctx_new(&(kn_ctx_opts){gpu()});
    kn_tensor *z = kn_sum_all(g, kn_add_scalar(g, kn_ones(g, KN_F32, 1, SH(1000)), 1));
    CHECK(kn_tensor_read(z, &v, KN_F32) == KN_OK && v == 2000, "after the errors: %g %s", v, kn_last_error());
    kn_ctx_free(g);
}

/* Big transfers go through the pinned staging buffers in chunks: 20 MiB + 3
 * bytes in and out (three chunks, the last partial) must come back intact. */
TEST(staged_copies_round_trip) {
    NEED_GPU();
    int64_t n = (20 << 20) + 3;
    uint8_t *h = malloc((size_t)n), *back = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++) h[i] = (uint8_t)(i * 2654435761u >> 13);
    memset(back, 0xA5, (size_t)n);
    kn_ctx *g = kn_ctx_new(&(kn_ctx_opts){gpu()});
    kn_tensor *t = kn_from_data(g, KN_U8, 1, &n, h);
    CHECK(t && kn_tensor_read(t, back, KN_U8) == KN_OK && !memcmp(h, back, (size_t)n), "round trip: %s", kn_last_error());
    kn_ctx_free(g);
    free(h); free(back);
}

TEST(module_moves_cpu_gpu_cpu) {
    NEED_GPU();
    kn_ctx *a = kn_ctx_new(&(kn_ctx_opts){kn_backend_cpu()}), *g = kn_ctx_new(&(kn_ctx_opts){gpu()});
    kn_ctx *b = kn_ctx_new(&(kn_ctx_opts){kn_backend_cpu()});
    kn_module *net = mv_net(a);
    REQUIRE(net, "%s", kn_last_error());
    kn_module_train(net, false);
    float x[30], y0[15];
    kn_test_seed(41);
    for (int i = 0; i < 30; i++) x[i] = (float)kn_test_uniform(-2, 2);
    REQUIRE(mv_fwd(net, x, y0) == KN_OK, "%s", kn_last_error());
    CHECK(mv_check(net, g, x, y0, 1e-5) == 0, "cpu -> gpu move");
    CHECK(mv_check(net, b, x, y0, 0) == 0, "gpu -> cpu move");
    kn_module_free(net);
    kn_ctx_free(a); kn_ctx_free(g); kn_ctx_free(b);
}

/* ---- creation, copies, where/tri/assign ---- */
static kn_tensor *b_misc(kn_ctx *ctx, kn_tensor **in, void *ud) {
    int w = *(int *)ud;
    int64_t s[2] = {37, 29};
    switch (w) {
    case 0: return kn_full(ctx, KN_F16, 2, s, 1.7);
    case 1: return kn_arange(ctx, KN_F32, -3, 50, 0.7);
    case 2: return kn_eye(ctx, KN_F64, 5, 7);
    case 3: return kn_rand(ctx, KN_F32, 2, s, 42);
    case 4: return kn_randn(ctx, KN_F64, 2, s, 7);
    case 5: return kn_bernoulli(ctx, KN_F32, 2, s, 0.3, 9);
    case 6: return kn_randint(ctx, KN_I64, 2, s, -5, 1000000007, 3);
    case 7: return kn_randperm(ctx, KN_I32, 100, 5);
    case 8: return kn_rand_offset(ctx, kn_randn(ctx, KN_F32, 2, s, 1), kn_scalar(ctx, KN_I64, 12));
    case 9: return kn_cast(ctx, kn_cast(ctx, in[0], KN_F16), KN_F32);
    case 10: return kn_cast(ctx, in[0], KN_BF16);
    case 11: return kn_cast(ctx, kn_mul_scalar(ctx, in[0], 100), KN_I8);
    case 12: return kn_cast(ctx, kn_mul_scalar(ctx, in[0], 100), KN_U8);
    case 13: return kn_cast(ctx, kn_round(ctx, in[0]), KN_BOOL);
    case 14: return kn_cast(ctx, kn_mul_scalar(ctx, in[0], 1e6), KN_I32);
    case 15: return kn_copy(ctx, in[0]);
    case 16: return kn_where(ctx, kn_gt(ctx, in[0], kn_scalar(ctx, KN_F32, 0)), in[0], kn_neg(ctx, in[1]));
    case 17: return kn_triu(ctx, in[0], 1);
    case 18: return kn_tril(ctx, in[0], -1);
    case 19: return kn_assign(ctx, in[1], kn_mul_scalar(ctx, in[0], 2));
    case 20: return kn_assign(ctx, in[1], kn_transpose(ctx, in[1], 0, 1));   /* overlapping */
    case 21: return kn_cast(ctx, kn_cast(ctx, in[0], KN_F64), KN_F16);
    }
    return NULL;
}
/* same-dtype copies of 2/4-byte elements through the 32-bit gather: a head
 * permute [B,T,H,D] -> [B,H,T,D] in f32, bf16 and i32, and a constant pad
 * of a 3-d f32 tensor (the gradient of a slice) */
static kn_tensor *b_gather(kn_ctx *ctx, kn_tensor **in, void *ud) {
    int w = *(int *)ud;
    if (w == 1) return kn_pad(ctx, in[0], 3, SH(0, 5, 2, 0, 1, 1), KN_PAD_CONSTANT, -0.25);
    kn_tensor *x = w == 2 ? kn_cast(ctx, kn_mul_scalar(ctx, in[0], 1000), KN_I32) : in[0];
    return kn_contiguous(ctx, kn_permute(ctx, x, (const int[]){0, 2, 1, 3}));
}
TEST(strided_copies_and_pads_through_the_gather) {
    NEED_GPU();
    kn_test_seed(21);
    int w0 = 0, w1 = 1, w2 = 2;
    kn_opin p32 = IN(4, SH(3, 17, 5, 12), -2, 2, KN_F32, false), p16 = IN(4, SH(3, 17, 5, 12), -2, 2, KN_BF16, true);
    kn_opin pd = IN(3, SH(4, 9, 6), -2, 2, KN_F32, true);
    CHECK(cu_cmp(b_gather, &w0, 1, &p32) == 0, "f32 permute copy");
    CHECK(cu_cmp(b_gather, &w0, 1, &p16) == 0, "bf16 permute copy of a transposed view");
    CHECK(cu_cmp(b_gather, &w2, 1, &p32) == 0, "i32 permute copy");
    CHECK(cu_cmp(b_gather, &w1, 1, &pd) == 0, "f32 constant pad");
}

/* casts out of views with unit-stride rows (k_cast_rows): column blocks of a
 * [7, 37] product (q of q|k|v) and a 3-d view cut along its last dim */
static kn_tensor *b_cast_rows(kn_ctx *ctx, kn_tensor **in, void *ud) {
    switch (*(int *)ud) {
    case 0: return kn_cast(ctx, kn_narrow(ctx, in[0], 1, 5, 20), KN_BF16);
    case 1: return kn_cast(ctx, kn_narrow(ctx, kn_cast(ctx, in[0], KN_BF16), 1, 3, 30), KN_F32);
    case 2: return kn_cast(ctx, kn_narrow(ctx, kn_cast(ctx, in[0], KN_F16), 1, 0, 17), KN_F32);
    default: return kn_cast(ctx, kn_narrow(ctx, kn_reshape(ctx, kn_narrow(ctx, in[0], 1, 0, 36), 3, SH(7, 3, 12)), 2, 1, 7), KN_F16);
    }
}
TEST(casts_of_row_strided_views) {
    NEED_GPU();
    kn_test_seed(23);
    for (int w = 0; w < 4; w++) {
        kn_opin in = IN(2, SH(7, 37), -3, 3, KN_F32, false);
        double e = cu_cmp(b_cast_rows, &w, 1, &in);
        CHECK(e == 0, "case %d: rel err %g", w, e);
    }
}

/* Copies that move 16-byte words (kn_cu_words16): a permute copy of rows
 * of 16 f32 and of 24 bf16 (whole words), one whose rows start 4 bytes
 * off 16 (elements, not words), rows of 6 f32 (not whole words); an
 * index_copy of [4, 4, 8] rows into [4, 12, 8], f32 and bf16, with a
 * repeated index (the later row wins) */
static kn_tensor *b_words(kn_ctx *ctx, kn_tensor **in, void *ud) {
    int perm[3] = {1, 0, 2};
    switch (*(int *)ud) {
    case 0: return kn_copy(ctx, kn_permute(ctx, kn_reshape(ctx, in[0], 3, SH(4, 6, 16)), perm));
    case 1: return kn_copy(ctx, kn_permute(ctx, kn_reshape(ctx, kn_cast(ctx, kn_narrow(ctx, in[0], 1, 0, 72), KN_BF16), 3, SH(4, 3, 24)), perm));
    case 2: return kn_copy(ctx, kn_permute(ctx, kn_reshape(ctx, kn_narrow(ctx, kn_reshape(ctx, in[0], 3, SH(4, 6, 16)), 2, 1, 8), 3, SH(4, 6, 8)), perm));
    case 3: return kn_copy(ctx, kn_permute(ctx, kn_reshape(ctx, kn_narrow(ctx, in[0], 1, 0, 90), 3, SH(4, 15, 6)), perm));
    default: {   /* in[0] the destination [4, 96] (f32 or bf16), in[1] the rows [4, 32] */
        kn_tensor *iv = kn_from_data(ctx, KN_I64, 1, SH(4), (const int64_t[]){5, 1, 11, 1});
        return kn_index_copy(ctx, kn_reshape(ctx, in[0], 3, SH(4, 12, 8)), 1, iv, kn_reshape(ctx, in[1], 3, SH(4, 4, 8)));
    }
    }
}
TEST(copies_in_words) {
    NEED_GPU();
    kn_test_seed(31);
    for (int w = 0; w < 6; w++) {
        kn_dtype dt = w == 5 ? KN_BF16 : KN_F32;
        kn_opin in[2] = {IN(2, SH(4, 96), -3, 3, dt, false), IN(2, SH(4, 32), -3, 3, dt, false)};
        double e = cu_cmp(b_words, &w, w >= 4 ? 2 : 1, in);
        CHECK(e == 0, "case %d: rel err %g", w, e);
    }
}

TEST(creation_copy_where_tri_assign) {
    NEED_GPU();
    kn_test_seed(15);
    for (int w = 0; w <= 21; w++) {
        kn_opin in[2] = {IN(2, SH(9, 9), -3, 3, KN_F32, true), IN(2, SH(9, 9), -3, 3, KN_F32, false)};
        double tol = (w == 4 || w == 8) ? 1e-12 : (w == 9 || w == 21) ? 1e-3 : w == 10 ? 4e-3 : 0;
        double e = cu_cmp(b_misc, &w, 2, in);
        CHECK(e <= tol, "case %d: rel err %g", w, e);
    }
}

/* ---- index family ---- */
typedef struct { int w; int64_t idx[64]; int64_t ni; } ispec;
static kn_tensor *idx_t(kn_ctx *ctx, const ispec *s, int ndim, const int64_t *shape, kn_dtype dt) {
    double v[64];
    for (int64_t i = 0; i < s->ni; i++) v[i] = (double)s->idx[i];
    kn_tensor *t = kn_empty(ctx, dt, ndim, shape);
    kn_tensor_write(t, v, KN_F64);
    return t;
}
static kn_tensor *b_index(kn_ctx *ctx, kn_tensor **in, void *ud) {
    const ispec *s = ud;
    switch (s->w) {
    case 0: { kn_tensor *xs[3] = {in[0], in[1], kn_mul_scalar(ctx, in[0], 3)}; return kn_cat(ctx, xs, 3, 1); }
    case 1: return kn_pad(ctx, in[0], 2, SH(2, 1, 0, 3), KN_PAD_CONSTANT, 0.5);
    case 2: return kn_pad(ctx, in[0], 2, SH(2, 1, 1, 3), KN_PAD_REFLECT, 0);
    case 3: return kn_pad(ctx, in[0], 2, SH(2, 1, 0, 3), KN_PAD_REPLICATE, 0);
    case 4: return kn_gather(ctx, in[0], 1, idx_t(ctx, s, 2, SH(5, 3), KN_I64));
    case 5: return kn_scatter(ctx, in[0], 1, idx_t(ctx, s, 2, SH(5, 3), KN_I32), in[1]);
    case 6: return kn_scatter_add(ctx, in[0], 1, idx_t(ctx, s, 2, SH(5, 3), KN_I64), in[1]);
    case 7: return kn_index_select(ctx, in[0], 0, idx_t(ctx, s, 1, SH(7), KN_I64));
    case 8: return kn_index_add(ctx, in[0], 1, idx_t(ctx, s, 1, SH(3), KN_I64), kn_narrow(ctx, in[1], 1, 0, 3));
    case 9: return kn_index_copy(ctx, in[0], 1, idx_t(ctx, s, 1, SH(3), KN_I64), kn_narrow(ctx, in[1], 1, 0, 3));
    case 10: return kn_embedding(ctx, in[0], idx_t(ctx, s, 2, SH(2, 3), KN_I32));
    /* whole rows of a contiguous x (the row-copy kernel): 16-byte f32 rows,
     * 6-byte bf16 rows (2-byte copies), a 3-d x */
    case 11: return kn_index_select(ctx, in[0], 0, idx_t(ctx, s, 1, SH(7), KN_I32));
    case 12: return kn_cast(ctx, kn_index_select(ctx, kn_cast(ctx, kn_narrow(ctx, in[0], 1, 0, 3), KN_BF16), 0,
                                                 idx_t(ctx, s, 1, SH(9), KN_I64)), KN_F32);
    case 13: return kn_index_select(ctx, kn_reshape(ctx, in[0], 3, SH(5, 2, 2)), 0, idx_t(ctx, s, 1, SH(4), KN_I64));
    }
    return NULL;
}
TEST(index_family) {
    NEED_GPU();
    kn_test_seed(16);
    for (int w = 0; w <= 13; w++) {
        ispec s = {w, {0}, 15};
        for (int i = 0; i < 15; i++) s.idx[i] = (int64_t)(kn_test_u64() % 4);
        kn_opin in[2] = {IN(2, SH(5, 4), -2, 2, KN_F32, w < 11), IN(2, SH(5, 4), -2, 2, w == 6 ? KN_F64 : KN_F32, false)};
        if (w == 8 || w == 9) { in[0].transposed = false; s.idx[0] = 2; s.idx[1] = 0; s.idx[2] = 2; }  /* a repeat */
        double e = cu_cmp(b_index, &s, 2, in);
        CHECK(e <= (w == 6 || w == 8 ? 1e-12 : 0), "index case %d: %g", w, e);
    }
}
/* index_copy with a long index list and a repeat: 100 and 4096 indices
 * (the one-launch path of bit copies, a prompt's cache write; 4096 fills
 * its 32 KB of shared index values) and 4500 (past its 4096, the generic
 * path); decode's one-index lists: index_family */
static kn_tensor *b_ic_long(kn_ctx *ctx, kn_tensor **in, void *ud) {
    int n = *(const int *)ud;
    int64_t *idx = malloc(sizeof *idx * (size_t)n);
    if (!idx) return NULL;
    for (int i = 0; i < n; i++) idx[i] = ((int64_t)i * 7) % (2 * n);
    idx[n - 1] = idx[3];                               /* a repeat: the later slice wins */
    kn_tensor *iv = kn_from_data(ctx, KN_I64, 1, SH(n), idx);
    free(idx);
    kn_tensor *buf = kn_contiguous(ctx, in[0]);
    return kn_index_copy(ctx, buf, 1, iv, in[1]);
}
TEST(index_copy_long_index) {
    NEED_GPU();
    kn_test_seed(19);
    static const int ns[] = {100, 4096, 4500};
    for (int i = 0; i < 3; i++) {
        int n = ns[i];
        kn_opin in[2] = {IN(2, SH(3, 2 * n), -2, 2, KN_F32, false), IN(2, SH(3, n), -2, 2, KN_F32, false)};
        double e = cu_cmp(b_ic_long, (void *)&ns[i], 2, in);
        CHECK(e == 0, "index_copy with %d indices: %g", n, e);
    }
}
/* decode attention (a few query rows: one fused kernel), f32 and half K/V */
typedef struct { int causal; kn_dtype kv; } dec_ud;
static kn_tensor *b_sdpa_dec(kn_ctx *ctx, kn_tensor **in, void *ud) {
    const dec_ud *u = ud;
    kn_tensor *k = in[1], *v = in[2];
    if (u->kv != KN_F32) { k = kn_cast(ctx, k, u->kv); v = kn_cast(ctx, v, u->kv); }
    return kn_sdpa(ctx, in[0], k, v, u->causal, 0);
}
TEST(sdpa_decode) {
    NEED_GPU();
    kn_test_seed(29);
    struct { dec_ud u; kn_opin in[3]; double tol; } C[] = {
        {{0, KN_F32}, {IN(4, SH(2, 9, 1, 64), -1, 1, KN_F32, false), IN(4, SH(2, 3, 37, 64), -1, 1, KN_F32, false),
                      IN(4, SH(2, 3, 37, 64), -1, 1, KN_F32, false)}, 2e-6},
        {{1, KN_F32}, {IN(4, SH(1, 4, 2, 32), -1, 1, KN_F32, false), IN(4, SH(1, 4, 300, 32), -1, 1, KN_F32, false),
                      IN(4, SH(1, 4, 300, 48), -1, 1, KN_F32, false)}, 2e-6},
        {{1, KN_F16}, {IN(4, SH(1, 6, 1, 64), -1, 1, KN_F32, false), IN(4, SH(1, 2, 129, 64), -1, 1, KN_F32, false),
                      IN(4, SH(1, 2, 129, 64), -1, 1, KN_F32, false)}, 2e-6},
        {{1, KN_BF16}, {IN(4, SH(1, 2, 3, 16), -1, 1, KN_F32, false), IN(4, SH(1, 1, 3, 16), -1, 1, KN_F32, false),
                       IN(4, SH(1, 1, 3, 16), -1, 1, KN_F32, false)}, 2e-6},
        /* a long cache (sm_90: the cluster kernel, 8 slices of 125 keys), 4 query heads a kv head */
        {{0, KN_BF16}, {IN(4, SH(1, 8, 1, 128), -1, 1, KN_F32, false), IN(4, SH(1, 2, 1000, 128), -1, 1, KN_F32, false),
                       IN(4, SH(1, 2, 1000, 128), -1, 1, KN_F32, false)}, 2e-6},
        /* 4 causal rows over 131 keys: the last slice of the first rows is empty */
        {{1, KN_F32}, {IN(4, SH(1, 3, 4, 64), -1, 1, KN_F32, false), IN(4, SH(1, 3, 131, 64), -1, 1, KN_F32, false),
                      IN(4, SH(1, 3, 131, 64), -1, 1, KN_F32, false)}, 2e-6},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        double e = cu_cmp(b_sdpa_dec, &C[i].u, 3, C[i].in);
        CHECK(e <= C[i].tol, "decode sdpa case %zu: rel err %g", i, e);
    }
}
TEST(bad_index_reports_the_op) {
    NEED_GPU();
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){gpu()});
    kn_tensor *x = kn_zeros(ctx, KN_F32, 2, SH(3, 4));
    int64_t bad[3] = {0, 7, 1};
    kn_tensor *i = kn_from_data(ctx, KN_I64, 1, SH(3), bad);
    float out[12];
    CHECK(kn_tensor_read(kn_index_select(ctx, x, 1, i), out, KN_F32) == KN_ERR_INVALID, "bad index accepted");
    CHECK(strstr(kn_last_error(), "index_select") && strstr(kn_last_error(), "7"), "message: %s", kn_last_error());
    /* the same along dim 0 of a contiguous x (the row-copy kernel) */
    CHECK(kn_tensor_read(kn_index_select(ctx, x, 0, i), out, KN_F32) == KN_ERR_INVALID, "bad row index accepted");
    CHECK(strstr(kn_last_error(), "index_select") && strstr(kn_last_error(), "7"), "message: %s", kn_last_error());
    /* index_copy (the KV cache write) with one bad index: reported at the
     * plan's end, naming the op, and nothing of the buffer changed */
    float b0[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, src[6] = {-1, -2, -3, -4, -5, -6};
    kn_tensor *buf = kn_from_data(ctx, KN_F32, 2, SH(3, 4), b0);
    int64_t bad2[2] = {1, 9};
    kn_tensor *i2 = kn_from_data(ctx, KN_I64, 1, SH(2), bad2);
    kn_tensor *ic = kn_index_copy(ctx, buf, 1, i2, kn_from_data(ctx, KN_F32, 2, SH(3, 2), src));
    CHECK(ic && kn_realize(ic) == KN_ERR_INVALID && strstr(kn_last_error(), "index_copy") && strstr(kn_last_error(), "9"),
          "index_copy bad index: %s", kn_last_error());
    CHECK(kn_tensor_read(buf, out, KN_F32) == KN_OK && !memcmp(out, b0, sizeof b0), "index_copy wrote with a bad index");
    /* the backend keeps working after a reported error */
    kn_tensor *y = kn_add_scalar(ctx, kn_ones(ctx, KN_F32, 1, SH(3)), 1);
    float v[3] = {0};
    CHECK(kn_tensor_read(y, v, KN_F32) == KN_OK && v[0] == 2 && v[2] == 2, "after error: %s", kn_last_error());
    kn_ctx_free(ctx);
}

/* ---- nn family, forward and the backward ops through kn_gradients ---- */
static kn_tensor *grad_of(kn_ctx *ctx, kn_tensor *y, kn_tensor *x) {
    kn_tensor *g = NULL;
    kn_tensor *seed = kn_sin(ctx, kn_add_scalar(ctx, kn_mul_scalar(ctx, kn_ones_like(ctx, y), 0.7), 0.1));
    if (kn_gradients(ctx, 1, &y, &seed, 1, &x, &g)) return NULL;
    return g;
}
static kn_tensor *b_nn(kn_ctx *ctx, kn_tensor **in, void *ud) {
    int w = *(int *)ud;
    int st1[2] = {1, 1}, st2[2] = {2, 1}, p1[2] = {1, 0}, d1[2] = {1, 1}, d2[2] = {1, 2}, k3[2] = {3, 2}, op0[2] = {0, 0};
    kn_tensor *x = in[0];
    switch (w) {
    case 0: return kn_softmax(ctx, x, -1);
    case 1: return kn_softmax(ctx, x, 0);
    case 2: return kn_log_softmax(ctx, x, -1);
    case 3: return kn_layer_norm(ctx, x, 1, in[1], in[2], 1e-5);
    case 4: return kn_layer_norm(ctx, x, 2, NULL, NULL, 1e-5);
    case 5: return kn_rms_norm(ctx, x, 1, in[1], 1e-6);
    case 6: return kn_batch_norm(ctx, x, NULL, NULL, in[1], in[2], true, 1e-5);
    case 7: return kn_group_norm(ctx, x, 2, in[1], in[2], 1e-5);
    case 8: return kn_conv2d(ctx, x, in[1], in[2], st2, p1, d2, 1);
    case 9: return kn_conv2d(ctx, x, in[1], NULL, st1, p1, d1, 2);
    case 10: return kn_conv_transpose2d(ctx, x, in[1], in[2], st2, p1, op0, d1, 1);
    case 11: return kn_max_pool2d(ctx, x, k3, st2, p1, d1, false);
    case 12: return kn_avg_pool2d(ctx, x, k3, st2, p1, true, false);
    case 13: return kn_adaptive_avg_pool2d(ctx, x, 3, 2);
    case 14: kn_set_requires_grad(x, true); kn_set_requires_grad(in[1], true);
             return grad_of(ctx, kn_conv2d(ctx, x, in[1], in[2], st2, p1, d2, 1), in[1]);
    case 15: kn_set_requires_grad(x, true); return grad_of(ctx, kn_conv2d(ctx, x, in[1], in[2], st2, p1, d2, 1), x);
    case 16: kn_set_requires_grad(x, true); return grad_of(ctx, kn_max_pool2d(ctx, x, k3, st2, p1, d1, false), x);
    case 17: kn_set_requires_grad(x, true); return grad_of(ctx, kn_avg_pool2d(ctx, x, k3, st2, p1, true, true), x);
    case 18: kn_set_requires_grad(x, true); return grad_of(ctx, kn_adaptive_avg_pool2d(ctx, x, 3, 2), x);
    case 19: return kn_sdpa(ctx, x, in[1], in[2], false, 0);
    case 20: return kn_sdpa(ctx, x, in[1], in[2], true, 0.3);
    case 21: case 22: case 23: {
        int32_t pos[5] = {0, 3, 7, 100, 4};
        kn_tensor *p = kn_empty(ctx, KN_I32, 1, SH(5));
        kn_tensor_write(p, pos, KN_I32);
        return kn_rope_ff(ctx, x, p, 6, 10000, w == 22, 0.5, w == 23 ? in[1] : NULL);
    }
    case 24: case 25: case 26: {     /* NORM_BWD: dx, dw, db flattened one after the other */
        kn_tensor *wt = w != 26 ? in[1] : NULL, *bt = w == 24 ? in[2] : NULL, *ps[3] = {x, wt, bt}, *gs[3] = {0};
        int np = w == 24 ? 3 : w == 25 ? 2 : 1;
        for (int k = 0; k < np; k++) kn_set_requires_grad(ps[k], true);
        kn_tensor *y = w == 25 ? kn_rms_norm(ctx, x, 1, wt, 1e-6) : kn_layer_norm(ctx, x, w == 26 ? 2 : 1, wt, bt, 1e-5);
        /* a seed that varies along the row: with a constant one and no weight, dx is 0 up to
         * rounding (mean(xhat) = 0) and a relative error says nothing */
        kn_tensor *seed = kn_sin(ctx, kn_add_scalar(ctx, kn_mul_scalar(ctx, kn_detach(ctx, y), 0.7), 0.1));
        if (!y || kn_gradients(ctx, 1, &y, &seed, np, ps, gs)) return NULL;
        for (int k = 0; k < np; k++) gs[k] = kn_reshape(ctx, gs[k], 1, (int64_t[]){kn_numel(gs[k])});
        return np == 1 ? gs[0] : kn_cat(ctx, gs, np, 0);
    }
    }
    return NULL;
}
TEST(nn_family) {
    NEED_GPU();
    kn_test_seed(17);
    struct { int w; int n; kn_opin in[3]; double tol; } C[] = {
        {0, 1, {IN(2, SH(7, 300), -3, 3, KN_F32, false)}, 2e-6},
        {0, 1, {IN(2, SH(7, 30), -3, 3, KN_F64, true)}, 1e-12},
        {1, 1, {IN(3, SH(5, 3, 4), -3, 3, KN_F32, true)}, 2e-6},
        {2, 1, {IN(2, SH(6, 33), -3, 3, KN_BF16, false)}, 2e-2},
        {3, 3, {IN(3, SH(2, 5, 64), -2, 2, KN_F32, false), IN(1, SH(64), 0.5, 1.5, KN_F32, false), IN(1, SH(64), -1, 1, KN_F32, false)}, 2e-6},
        {3, 3, {IN(2, SH(5, 9), -2, 2, KN_F64, true), IN(1, SH(9), 0.5, 1.5, KN_F64, false), IN(1, SH(9), -1, 1, KN_F64, false)}, 1e-12},
        {4, 1, {IN(3, SH(3, 4, 5), -2, 2, KN_F32, true)}, 2e-6},
        {5, 2, {IN(2, SH(6, 128), -2, 2, KN_F32, false), IN(1, SH(128), 0.5, 1.5, KN_F32, false)}, 2e-6},
        {5, 2, {IN(2, SH(6, 10), -2, 2, KN_F16, true), IN(1, SH(10), 0.5, 1.5, KN_F32, false)}, 4e-3},
        {6, 3, {IN(4, SH(3, 4, 2, 3), -2, 2, KN_F32, true), IN(1, SH(4), 0.5, 1.5, KN_F32, false), IN(1, SH(4), -1, 1, KN_F32, false)}, 2e-6},
        {7, 3, {IN(3, SH(2, 4, 5), -2, 2, KN_F32, false), IN(1, SH(4), 0.5, 1.5, KN_F32, false), IN(1, SH(4), -1, 1, KN_F32, false)}, 2e-6},
        {8, 3, {IN(4, SH(2, 3, 7, 8), -1, 1, KN_F32, true), IN(4, SH(4, 3, 3, 2), -1, 1, KN_F32, false), IN(1, SH(4), -1, 1, KN_F32, false)}, 2e-6},
        {9, 2, {IN(4, SH(2, 4, 6, 5), -1, 1, KN_F64, false), IN(4, SH(6, 2, 3, 3), -1, 1, KN_F64, true)}, 1e-12},
        {10, 3, {IN(4, SH(2, 3, 4, 5), -1, 1, KN_F32, false), IN(4, SH(3, 2, 3, 2), -1, 1, KN_F32, false), IN(1, SH(2), -1, 1, KN_F32, false)}, 2e-6},
        {11, 1, {IN(4, SH(2, 3, 7, 6), -2, 2, KN_F32, true)}, 0},
        {12, 1, {IN(4, SH(2, 3, 7, 6), -2, 2, KN_F32, false)}, 2e-6},
        {13, 1, {IN(3, SH(3, 7, 5), -2, 2, KN_F64, true)}, 1e-12},
        {14, 3, {IN(4, SH(2, 3, 7, 8), -1, 1, KN_F64, false), IN(4, SH(4, 3, 3, 2), -1, 1, KN_F64, false), IN(1, SH(4), -1, 1, KN_F64, false)}, 1e-12},
        {15, 3, {IN(4, SH(2, 3, 7, 8), -1, 1, KN_F64, false), IN(4, SH(4, 3, 3, 2), -1, 1, KN_F64, false), IN(1, SH(4), -1, 1, KN_F64, false)}, 1e-12},
        {16, 1, {IN(4, SH(2, 3, 7, 6), -2, 2, KN_F64, false)}, 1e-12},
        {17, 1, {IN(4, SH(2, 3, 7, 6), -2, 2, KN_F64, false)}, 1e-12},
        {18, 1, {IN(4, SH(2, 3, 7, 5), -2, 2, KN_F64, false)}, 1e-12},
        {19, 3, {IN(4, SH(2, 4, 5, 8), -1, 1, KN_F32, false), IN(4, SH(2, 2, 7, 8), -1, 1, KN_F32, true), IN(4, SH(2, 2, 7, 3), -1, 1, KN_F32, false)}, 2e-6},
        {20, 3, {IN(4, SH(1, 3, 5, 4), -1, 1, KN_F64, false), IN(4, SH(1, 3, 6, 4), -1, 1, KN_F64, false), IN(4, SH(1, 3, 6, 4), -1, 1, KN_F64, true)}, 1e-12},
        /* f32 attention through batched SGEMMs: grouped heads (odd sizes), then causal with Tk > Tq */
        {19, 3, {IN(4, SH(2, 4, 5, 8), -1, 1, KN_F32, false), IN(4, SH(2, 2, 7, 8), -1, 1, KN_F32, false), IN(4, SH(2, 2, 7, 3), -1, 1, KN_F32, false)}, 2e-6},
        {20, 3, {IN(4, SH(3, 2, 16, 16), -1, 1, KN_F32, false), IN(4, SH(3, 2, 20, 16), -1, 1, KN_F32, false), IN(4, SH(3, 2, 20, 8), -1, 1, KN_F32, false)}, 2e-6},
        {21, 1, {IN(3, SH(2, 5, 8), -1, 1, KN_F32, false)}, 2e-6},
        {22, 1, {IN(3, SH(2, 5, 8), -1, 1, KN_F64, true)}, 1e-12},
        {23, 2, {IN(3, SH(2, 5, 8), -1, 1, KN_F32, false), IN(1, SH(3), 1, 8, KN_F32, false)}, 2e-6},
        /* NORM_BWD: the fused f32 kernel at each row width it has (768, 3000, 8192), then the generic one
         * (C % 4 != 0, C > 8192, f64, bf16, a transposed x) */
        {24, 3, {IN(3, SH(2, 37, 768), -2, 3, KN_F32, false), IN(1, SH(768), 0.5, 1.5, KN_F32, false), IN(1, SH(768), -1, 1, KN_F32, false)}, 1e-5},
        {24, 3, {IN(2, SH(300, 3000), -2, 3, KN_F32, false), IN(1, SH(3000), 0.5, 1.5, KN_F32, false), IN(1, SH(3000), -1, 1, KN_F32, false)}, 1e-5},
        {25, 2, {IN(2, SH(70, 8192), -2, 3, KN_F32, false), IN(1, SH(8192), 0.5, 1.5, KN_F32, false)}, 1e-5},
        {25, 2, {IN(2, SH(1000, 64), -2, 3, KN_F32, false), IN(1, SH(64), 0.5, 1.5, KN_F32, false)}, 1e-5},
        {26, 1, {IN(3, SH(9, 4, 32), -2, 3, KN_F32, false)}, 1e-5},
        {24, 3, {IN(2, SH(5, 33), -2, 3, KN_F32, false), IN(1, SH(33), 0.5, 1.5, KN_F32, false), IN(1, SH(33), -1, 1, KN_F32, false)}, 1e-5},
        {25, 2, {IN(2, SH(3, 10000), -2, 3, KN_F32, false), IN(1, SH(10000), 0.5, 1.5, KN_F32, false)}, 1e-5},
        {24, 3, {IN(2, SH(7, 12), -2, 3, KN_F64, true), IN(1, SH(12), 0.5, 1.5, KN_F64, false), IN(1, SH(12), -1, 1, KN_F64, false)}, 1e-12},
        {24, 3, {IN(2, SH(6, 64), -2, 3, KN_BF16, false), IN(1, SH(64), 0.5, 1.5, KN_BF16, false), IN(1, SH(64), -1, 1, KN_BF16, false)}, 2e-2},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        double e = cu_cmp(b_nn, &C[i].w, C[i].n, C[i].in);
        CHECK(e <= C[i].tol, "nn case %zu (op %d): rel err %g", i, C[i].w, e);
    }
}

/* ---- sort, einsum, interpolate, unfold/fold, conv3d (test_ops_extra.c has the torch checks) ---- */
static kn_tensor *b_extra(kn_ctx *ctx, kn_tensor **in, void *ud) {
    int w = *(int *)ud;
    const int k23[2] = {2, 3}, d12[2] = {1, 2}, p10[2] = {1, 0}, s21[2] = {2, 1};
    kn_tensor *x = in[0], *ix = NULL;
    switch (w) {
    case 0: return kn_argsort(ctx, x, 1, true);
    case 1: return kn_sort(ctx, x, 0, false, NULL);
    case 2: case 3: return kn_argsort(ctx, x, -1, false);
    case 4: return kn_unfold(ctx, x, k23, d12, p10, s21);
    case 5: return kn_fold(ctx, x, SH(5, 7), k23, d12, p10, s21);
    case 6: kn_set_requires_grad(x, true); return grad_of(ctx, kn_unfold(ctx, x, k23, d12, p10, s21), x);
    case 7: return kn_einsum(ctx, "bij,bjk->bik", 2, in);
    case 8: return kn_einsum(ctx, "ii->i", 1, in);
    case 9: return kn_interpolate(ctx, x, SH(9, 5), NULL, KN_INTERP_LINEAR, false);
    case 10: kn_set_requires_grad(x, true);
             return grad_of(ctx, kn_interpolate(ctx, x, NULL, (const double[]){1.5, 2.5}, KN_INTERP_NEAREST, false), x);
    case 11: return kn_conv3d(ctx, x, in[1], in[2], (const int[]){1, 2, 1}, (const int[]){1, 0, 1}, (const int[]){2, 1, 1}, 1);
    case 12: kn_set_requires_grad(x, true);
             return grad_of(ctx, kn_conv3d(ctx, x, in[1], NULL, (const int[]){2, 1, 1}, (const int[]){1, 1, 0}, (const int[]){1, 1, 1}, 2), x);
    case 13: kn_set_requires_grad(x, true); return grad_of(ctx, kn_sort(ctx, x, 1, true, &ix), x);
    case 14: return kn_einsum(ctx, "...ij,jk", 2, in);
    }
    return NULL;
}
TEST(sort_einsum_spatial_family) {
    NEED_GPU();
    kn_test_seed(18);
    struct { int w; int n; kn_opin in[3]; double tol; bool ints; } C[] = {
        {0, 1, {IN(3, SH(3, 37, 4), -3, 3, KN_F32, true)}, 0, true},
        {1, 1, {IN(2, SH(300, 5), -1, 1, KN_F64, false)}, 0, false},
        {2, 1, {IN(2, SH(3, 5000), -50, 50, KN_F32, false)}, 0, true},       /* global scratch path */
        {3, 1, {IN(2, SH(4, 3000), -50, 50, KN_BF16, false)}, 0, true},      /* shared memory, P = 4096 */
        {4, 1, {IN(4, SH(2, 3, 5, 7), -1, 1, KN_F32, true)}, 0, false},
        {5, 1, {IN(3, SH(2, 18, 9), -1, 1, KN_F32, true)}, 2e-6, false},
        {6, 1, {IN(4, SH(2, 3, 5, 7), -1, 1, KN_F64, false)}, 1e-12, false},
        {7, 2, {IN(3, SH(2, 3, 4), -1, 1, KN_F32, false), IN(3, SH(2, 4, 5), -1, 1, KN_F32, true)}, 2e-6, false},
        {8, 1, {IN(2, SH(6, 6), -1, 1, KN_F32, false)}, 2e-6, false},
        {9, 1, {IN(4, SH(2, 3, 4, 6), -1, 1, KN_F32, true)}, 2e-6, false},
        {10, 1, {IN(4, SH(2, 3, 4, 3), -1, 1, KN_F64, false)}, 1e-12, false},
        {11, 3, {IN(5, SH(2, 3, 5, 6, 4), -1, 1, KN_F32, false), IN(5, SH(4, 3, 2, 3, 2), -1, 1, KN_F32, false),
                 IN(1, SH(4), -1, 1, KN_F32, false)}, 2e-6, false},
        {12, 2, {IN(5, SH(1, 4, 5, 4, 4), -1, 1, KN_F64, false), IN(5, SH(2, 2, 3, 3, 2), -1, 1, KN_F64, false)}, 1e-12, false},
        {13, 1, {IN(2, SH(4, 33), -1, 1, KN_F64, false)}, 1e-12, false},
        {14, 2, {IN(4, SH(2, 1, 3, 4), -1, 1, KN_F32, false), IN(2, SH(4, 2), -1, 1, KN_F32, false)}, 2e-6, false},
        {0, 1, {IN(3, SH(2, 70, 3), -20, 20, KN_I32, false)}, 0, true},                 /* integers: ties */
        {1, 1, {IN(2, SH(9, 4), -20, 20, KN_I64, true)}, 0, true},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        for (int k = 0; k < C[i].n; k++) C[i].in[k].integer = C[i].ints;
        double e = cu_cmp(b_extra, &C[i].w, C[i].n, C[i].in);
        CHECK(e <= C[i].tol, "extra case %zu (w %d): rel err %g", i, C[i].w, e);
    }
}

TEST(to_backend_and_plan_replay) {
    NEED_GPU();
    kn_ctx *h = kn_ctx_new(&(kn_ctx_opts){kn_backend_cpu()}), *g = kn_ctx_new(&(kn_ctx_opts){gpu()});
    float w[6] = {1, 2, 3, 4, 5, 6};
    kn_tensor *hw = kn_from_data(h, KN_F32, 2, SH(2, 3), w), *gw = NULL;
    REQUIRE(kn_to_backend(g, kn_transpose(h, hw, 0, 1), &gw) == KN_OK, "%s", kn_last_error());
    CHECK(gw->shape[0] == 3 && gw->shape[1] == 2, "shape");
    /* a plan with an input, run several times */
    kn_tensor *x = kn_input(g, KN_F32, 1, SH(3));
    kn_tensor *y = kn_matmul(g, x, gw);                     /* [2] */
    kn_plan *p = kn_plan_new(g, 1, &y, NULL);
    REQUIRE(p, "%s", kn_last_error());
    for (int r = 0; r < 3; r++) {
        float xv[3] = {1.0f + r, 0, 1}, yv[2];
        kn_tensor_write(x, xv, KN_F32);
        REQUIRE(kn_plan_run(p) == KN_OK, "%s", kn_last_error());
        REQUIRE(kn_tensor_read(y, yv, KN_F32) == KN_OK, "%s", kn_last_error());
        CHECK(yv[0] == (1.0f + r) * 1 + 3 && yv[1] == (1.0f + r) * 4 + 6, "run %d: %g %g", r, yv[0], yv[1]);
    }
    kn_plan_free(p);
    size_t used, peak, cached;
    kn_cuda_backend_stats(&used, &peak, &cached);
    CHECK(peak > 0, "pool peak %zu", peak);
    kn_ctx_free(g);
    kn_ctx_free(h);
}

/* one plan replayed with different symbolic lengths, ref vs cuda: a
 * KV-cache style index_copy followed by attention over a symbolic prefix */
static kn_status sym_run(kn_backend *be, const float *kv, int64_t steps, float *out) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    int S = kn_sym_new(ctx, "S", 8);
    kn_tensor *cm = kn_empty(ctx, KN_F32, 3, SH(2, 8, 4));
    kn_tensor_write(cm, (float[64]){0}, KN_F32);
    kn_tensor *pos = kn_input(ctx, KN_I64, 1, SH(1)), *row = kn_input(ctx, KN_F32, 3, SH(2, 1, 4));
    kn_tensor *upd = kn_index_copy(ctx, cm, 1, pos, row);
    kn_tensor *k = kn_slice_sym(ctx, upd, 1, 0, S);                     /* [2, S, 4] */
    kn_tensor *q = kn_unsqueeze(ctx, kn_narrow(ctx, upd, 1, 0, 1), 0); /* [1, 2, 1, 4] */
    kn_tensor *y = kn_sdpa(ctx, q, kn_unsqueeze(ctx, k, 0), kn_unsqueeze(ctx, k, 0), false, 0);
    kn_plan *p = kn_plan_new(ctx, 1, &y, NULL);
    kn_status st = p ? KN_OK : KN_ERR_STATE;
    for (int64_t t = 0; t < steps && !st; t++) {
        kn_sym_set(ctx, S, t + 1);
        kn_tensor_write(pos, &t, KN_I64);
        kn_tensor_write(row, kv + t * 8, KN_F32);
        st = kn_plan_run(p);
        if (!st) st = kn_tensor_read(y, out + t * 8, KN_F32);
    }
    kn_plan_free(p);
    kn_ctx_free(ctx);
    return st;
}
TEST(symbolic_plan_replay_kv_cache) {
    NEED_GPU();
    kn_test_seed(18);
    float kv[64], a[64], b[64];
    for (int i = 0; i < 64; i++) kv[i] = (float)kn_test_uniform(-1, 1);
    REQUIRE(sym_run(kn_backend_ref(), kv, 8, a) == KN_OK, "ref: %s", kn_last_error());
    REQUIRE(sym_run(gpu(), kv, 8, b) == KN_OK, "cuda: %s", kn_last_error());
    for (int i = 0; i < 64; i++) CHECK(fabsf(a[i] - b[i]) <= 1e-6f * (1 + fabsf(a[i])), "[%d] ref %g cuda %g", i, a[i], b[i]);
}

TEST(timing_matmul_and_softmax) {
    NEED_GPU();
    kn_ctx *g = kn_ctx_new(&(kn_ctx_opts){gpu()});
    int64_t n = 2048;
    kn_tensor *a = kn_rand(g, KN_F32, 2, SH(n, n), 1), *b = kn_rand(g, KN_F32, 2, SH(n, n), 2);
    kn_tensor *c = kn_softmax(g, kn_matmul(g, a, b), -1);
    kn_plan *p = kn_plan_new(g, 1, &c, NULL);
    REQUIRE(p && kn_plan_run(p) == KN_OK, "%s", kn_last_error());
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < 5; r++) REQUIRE(kn_plan_run(p) == KN_OK, "%s", kn_last_error());
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = ((double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec)) / 5;
    printf("  rand x2 + matmul %lldx%lld + softmax plan: %.3f ms (%.1f TFLOP/s incl. the rest)\n",
           (long long)n, (long long)n, s * 1e3, 2.0 * (double)n * n * n / s * 1e-12);
    kn_plan_free(p);
    kn_ctx_free(g);
}
/* sdpa's fused gradient (SDPA_BWD): dq, dk, dv of sum(sdpa(q, k, v) * dy),
 * flattened and concatenated; f32 takes the batched-SGEMM path, other dtypes
 * and a strided head dim the generic kernels */
static kn_tensor *b_sdpa_bwd(kn_ctx *ctx, kn_tensor **in, void *ud) {
    const int *causal = ud;
    kn_tensor *leaf[3] = {in[0], in[1], in[2]}, *gr[3] = {0};
    for (int i = 0; i < 3; i++) kn_set_requires_grad(leaf[i], true);
    kn_tensor *y = kn_sdpa(ctx, in[0], in[1], in[2], *causal, 0);
    if (!y || kn_gradients(ctx, 1, &y, &in[3], 3, leaf, gr) != KN_OK) return NULL;
    kn_tensor *parts[3];
    for (int i = 0; i < 3; i++) { int64_t n = kn_numel(gr[i]); parts[i] = kn_reshape(ctx, gr[i], 1, &n); }
    return kn_cat(ctx, parts, 3, 0);
}
TEST(sdpa_backward) {
    NEED_GPU();
    kn_test_seed(23);
    struct { int causal; kn_opin in[4]; double tol; } C[] = {
        /* grouped heads, causal with Tk > Tq (f32 GEMM path) */
        {1, {IN(4, SH(2, 4, 5, 8), -1, 1, KN_F32, false), IN(4, SH(2, 2, 7, 8), -1, 1, KN_F32, false),
             IN(4, SH(2, 2, 7, 3), -1, 1, KN_F32, false), IN(4, SH(2, 4, 5, 3), -1, 1, KN_F32, false)}, 2e-5},
        /* training shape, not causal, a transposed (strided) head dim: generic */
        {0, {IN(4, SH(2, 3, 33, 16), -1, 1, KN_F32, false), IN(4, SH(2, 3, 33, 16), -1, 1, KN_F32, true),
             IN(4, SH(2, 3, 33, 16), -1, 1, KN_F32, false), IN(4, SH(2, 3, 33, 16), -1, 1, KN_F32, false)}, 2e-5},
        {1, {IN(4, SH(3, 4, 64, 32), -1, 1, KN_F32, false), IN(4, SH(3, 4, 64, 32), -1, 1, KN_F32, false),
             IN(4, SH(3, 4, 64, 32), -1, 1, KN_F32, false), IN(4, SH(3, 4, 64, 32), -1, 1, KN_F32, false)}, 2e-5},
        {1, {IN(4, SH(1, 6, 4, 5), -1, 1, KN_F64, false), IN(4, SH(1, 2, 6, 5), -1, 1, KN_F64, false),
             IN(4, SH(1, 2, 6, 7), -1, 1, KN_F64, false), IN(4, SH(1, 6, 4, 7), -1, 1, KN_F64, false)}, 1e-12},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        double e = cu_cmp(b_sdpa_bwd, &C[i].causal, 4, C[i].in);
        CHECK(e <= C[i].tol, "sdpa backward case %zu: rel err %g", i, e);
    }
}
/* kn_sdpa_ex: sliding window and softcap through every forward path (decode
 * kernel with f32/f16 K/V, the f32 GEMM path, bf16 operands: flash refuses,
 * the generic kernel runs, f64) and the gradient (f32 GEMM path with a window,
 * generic kernels with a softcap, f64) */
typedef struct { int64_t window; double cap; kn_dtype kv; int grad; } swc_ud;
static kn_tensor *b_sdpa_swc(kn_ctx *ctx, kn_tensor **in, void *ud) {
    const swc_ud *u = ud;
    if (u->grad) {
        kn_tensor *leaf[3] = {in[0], in[1], in[2]}, *gr[3] = {0};
        for (int i = 0; i < 3; i++) kn_set_requires_grad(leaf[i], true);
        kn_tensor *y = kn_sdpa_ex(ctx, in[0], in[1], in[2], true, 0, u->window, u->cap);
        if (!y || kn_gradients(ctx, 1, &y, &in[3], 3, leaf, gr) != KN_OK) return NULL;
        kn_tensor *parts[3];
        for (int i = 0; i < 3; i++) { int64_t n = kn_numel(gr[i]); parts[i] = kn_reshape(ctx, gr[i], 1, &n); }
        return kn_cat(ctx, parts, 3, 0);
    }
    kn_tensor *q = in[0], *k = in[1], *v = in[2];
    if (u->kv != KN_F32 && u->kv != KN_F64) { k = kn_cast(ctx, k, u->kv); v = kn_cast(ctx, v, u->kv); }
    if (u->kv == KN_BF16) q = kn_cast(ctx, q, KN_BF16);
    kn_tensor *y = kn_sdpa_ex(ctx, q, k, v, true, 0, u->window, u->cap);
    return u->kv == KN_BF16 ? kn_cast(ctx, y, KN_F32) : y;
}
TEST(sdpa_window_softcap) {
    NEED_GPU();
    kn_test_seed(31);
    struct { swc_ud u; kn_opin in[4]; double tol; } C[] = {
        {{17, 0, KN_F32, 0}, {IN(4, SH(1, 4, 1, 64), -1, 1, KN_F32, false), IN(4, SH(1, 2, 90, 64), -1, 1, KN_F32, false),
                              IN(4, SH(1, 2, 90, 64), -1, 1, KN_F32, false)}, 2e-6},               /* decode past the window */
        {{17, 30, KN_F16, 0}, {IN(4, SH(1, 4, 2, 64), -2, 2, KN_F32, false), IN(4, SH(1, 2, 90, 64), -2, 2, KN_F32, false),
                               IN(4, SH(1, 2, 90, 64), -1, 1, KN_F32, false)}, 2e-6},              /* decode, f16 cache, softcap */
        {{8, 0.9, KN_F32, 0}, {IN(4, SH(2, 4, 40, 16), -2, 2, KN_F32, false), IN(4, SH(2, 2, 45, 16), -2, 2, KN_F32, false),
                               IN(4, SH(2, 2, 45, 16), -1, 1, KN_F32, false)}, 2e-5},              /* prefill: GEMM path */
        {{8, 50, KN_BF16, 0}, {IN(4, SH(1, 4, 70, 64), -1, 1, KN_F32, false), IN(4, SH(1, 2, 70, 64), -1, 1, KN_F32, false),
                               IN(4, SH(1, 2, 70, 64), -1, 1, KN_F32, false)}, 2e-2},              /* bf16: not flash */
        {{3, 1.5, KN_F64, 0}, {IN(4, SH(1, 3, 6, 5), -1, 1, KN_F64, false), IN(4, SH(1, 1, 8, 5), -1, 1, KN_F64, false),
                               IN(4, SH(1, 1, 8, 7), -1, 1, KN_F64, false)}, 1e-12},               /* generic, f64 */
        {{4, 0, KN_F32, 1}, {IN(4, SH(2, 4, 9, 8), -1, 1, KN_F32, false), IN(4, SH(2, 2, 12, 8), -1, 1, KN_F32, false),
                             IN(4, SH(2, 2, 12, 3), -1, 1, KN_F32, false), IN(4, SH(2, 4, 9, 3), -1, 1, KN_F32, false)}, 2e-5},
        {{4, 0.8, KN_F32, 1}, {IN(4, SH(1, 4, 9, 8), -2, 2, KN_F32, false), IN(4, SH(1, 2, 9, 8), -2, 2, KN_F32, false),
                               IN(4, SH(1, 2, 9, 8), -1, 1, KN_F32, false), IN(4, SH(1, 4, 9, 8), -1, 1, KN_F32, false)}, 2e-5},
        {{2, 1.2, KN_F64, 1}, {IN(4, SH(1, 2, 5, 4), -2, 2, KN_F64, false), IN(4, SH(1, 1, 6, 4), -2, 2, KN_F64, false),
                               IN(4, SH(1, 1, 6, 3), -1, 1, KN_F64, false), IN(4, SH(1, 2, 5, 3), -1, 1, KN_F64, false)}, 1e-12},
    };
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++) {
        double e = cu_cmp(b_sdpa_swc, &C[i].u, C[i].u.grad ? 4 : 3, C[i].in);
        CHECK(e <= C[i].tol, "sdpa window/softcap case %zu: rel err %g", i, e);
    }
}
#endif

KN_TEST_MAIN()
