/* test_ops_math.c: every unary, binary, reduction, scan and matmul op:
 * values against libm/hand loops, the fast CPU backend against the
 * reference, and gradients against finite differences. */
#include "kn_optest.h"
#include <math.h>

typedef struct { kn_op op; double lo, hi, a, b; } uspec;
static const uspec UNARY[] = {
    {KN_OP_NEG, -2, 2}, {KN_OP_ABS, -2, 2}, {KN_OP_SIGN, -2, 2}, {KN_OP_EXP, -2, 2}, {KN_OP_EXP2, -2, 2},
    {KN_OP_LOG, 0.3, 3}, {KN_OP_LOG2, 0.3, 3}, {KN_OP_LOG1P, -0.5, 3}, {KN_OP_EXPM1, -2, 2},
    {KN_OP_SQRT, 0.3, 3}, {KN_OP_RSQRT, 0.3, 3}, {KN_OP_RECIPROCAL, 0.5, 3}, {KN_OP_SQUARE, -2, 2},
    {KN_OP_SIN, -3, 3}, {KN_OP_COS, -3, 3}, {KN_OP_TAN, -1.2, 1.2}, {KN_OP_ASIN, -0.8, 0.8},
    {KN_OP_ACOS, -0.8, 0.8}, {KN_OP_ATAN, -3, 3}, {KN_OP_SINH, -2, 2}, {KN_OP_COSH, -2, 2},
    {KN_OP_TANH, -2, 2}, {KN_OP_ASINH, -2, 2}, {KN_OP_ACOSH, 1.2, 3}, {KN_OP_ATANH, -0.8, 0.8},
    {KN_OP_ERF, -2, 2}, {KN_OP_FLOOR, -2, 2}, {KN_OP_CEIL, -2, 2}, {KN_OP_ROUND, -2, 2},
    {KN_OP_TRUNC, -2, 2}, {KN_OP_CLAMP, -2, 2, -0.5, 0.7}, {KN_OP_RELU, -2, 2},
    {KN_OP_LEAKY_RELU, -2, 2, 0.1}, {KN_OP_ELU, -2, 2, 1.3}, {KN_OP_SELU, -2, 2}, {KN_OP_GELU, -3, 3},
    {KN_OP_GELU_TANH, -3, 3}, {KN_OP_SILU, -3, 3}, {KN_OP_SIGMOID, -4, 4}, {KN_OP_SOFTPLUS, -4, 4},
    {KN_OP_MISH, -3, 3}, {KN_OP_HARDTANH, -2, 2, -0.6, 0.9}, {KN_OP_HARDSIGMOID, -5, 5},
    {KN_OP_GELU_TANH_GRAD, -4, 4},   /* gelu_tanh's gradient op: no gradient of its own */
};
#define NU (int)(sizeof UNARY / sizeof UNARY[0])

static kn_tensor *apply_unary(kn_ctx *ctx, const uspec *u, kn_tensor *x) {
    switch (u->op) {
    case KN_OP_CLAMP: return kn_clamp(ctx, x, u->a, u->b);
    case KN_OP_HARDTANH: return kn_hardtanh(ctx, x, u->a, u->b);
    case KN_OP_LEAKY_RELU: return kn_leaky_relu(ctx, x, u->a);
    case KN_OP_ELU: return kn_elu(ctx, x, u->a);
    default: return kn_unary(ctx, u->op, x);
    }
}
static kn_tensor *b_unary(kn_ctx *ctx, kn_tensor **in, void *ud) { return apply_unary(ctx, ud, in[0]); }

/* independent scalar definitions (not the reference backend's code) */
static double expect_unary(const uspec *u, double x) {
    switch (u->op) {
    case KN_OP_NEG: return -x; case KN_OP_ABS: return fabs(x); case KN_OP_SIGN: return (x > 0) - (x < 0);
    case KN_OP_EXP: return exp(x); case KN_OP_EXP2: return pow(2, x); case KN_OP_LOG: return log(x);
    case KN_OP_LOG2: return log(x) / log(2); case KN_OP_LOG1P: return log(1 + x); case KN_OP_EXPM1: return exp(x) - 1;
    case KN_OP_SQRT: return sqrt(x); case KN_OP_RSQRT: return 1 / sqrt(x); case KN_OP_RECIPROCAL: return 1 / x;
    case KN_OP_SQUARE: return x * x; case KN_OP_SIN: return sin(x); case KN_OP_COS: return cos(x);
    case KN_OP_TAN: return tan(x); case KN_OP_ASIN: return asin(x); case KN_OP_ACOS: return acos(x);
    case KN_OP_ATAN: return atan(x); case KN_OP_SINH: return (exp(x) - exp(-x)) / 2; case KN_OP_COSH: return (exp(x) + exp(-x)) / 2;
    case KN_OP_TANH: return (exp(2 * x) - 1) / (exp(2 * x) + 1); case KN_OP_ASINH: return log(x + sqrt(x * x + 1));
    case KN_OP_ACOSH: return log(x + sqrt(x * x - 1)); case KN_OP_ATANH: return 0.5 * log((1 + x) / (1 - x));
    case KN_OP_ERF: return erf(x); case KN_OP_FLOOR: return floor(x); case KN_OP_CEIL: return ceil(x);
    case KN_OP_ROUND: return rint(x); case KN_OP_TRUNC: return trunc(x);
    case KN_OP_CLAMP: case KN_OP_HARDTANH: return fmin(fmax(x, u->a), u->b);
    case KN_OP_RELU: return x > 0 ? x : 0; case KN_OP_LEAKY_RELU: return x > 0 ? x : u->a * x;
    case KN_OP_ELU: return x > 0 ? x : u->a * (exp(x) - 1);
    case KN_OP_SELU: return 1.0507009873554805 * (x > 0 ? x : 1.6732632423543772 * (exp(x) - 1));
    case KN_OP_GELU: return x * 0.5 * (1 + erf(x / sqrt(2)));
    case KN_OP_GELU_TANH: return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
    case KN_OP_SILU: return x / (1 + exp(-x)); case KN_OP_SIGMOID: return 1 / (1 + exp(-x));
    case KN_OP_SOFTPLUS: return log(1 + exp(x)); case KN_OP_MISH: return x * tanh(log(1 + exp(x)));
    case KN_OP_HARDSIGMOID: return fmin(fmax(x / 6 + 0.5, 0), 1);
    case KN_OP_GELU_TANH_GRAD: {   /* derivative of the sigmoid form x * s(2u) */
        double u2 = 2 * sqrt(2 / M_PI) * (x + 0.044715 * x * x * x), s = 1 / (1 + exp(-u2));
        return s + x * s * (1 - s) * 2 * sqrt(2 / M_PI) * (1 + 3 * 0.044715 * x * x);
    }
    default: return NAN;
    }
}

TEST(unary_values_backends_and_grads) {
    kn_test_seed(1);
    for (int i = 0; i < NU; i++) {
        const uspec *u = &UNARY[i];
        const char *nm = kn_op_name(u->op);
        /* values against independent formulas */
        kn_ctx_opts o = {kn_backend_ref()};
        kn_ctx *ctx = kn_ctx_new(&o);
        double xv[37];
        for (int k = 0; k < 37; k++) xv[k] = kn_test_uniform(u->lo, u->hi);
        kn_tensor *x = kn_from_data(ctx, KN_F64, 1, (int64_t[]){37}, xv);
        double yv[37];
        REQUIRE(kn_tensor_read(apply_unary(ctx, u, x), yv, KN_F64) == KN_OK, "%s: %s", nm, kn_last_error());
        for (int k = 0; k < 37; k++) {
            double e = expect_unary(u, xv[k]);
            CHECK(fabs(yv[k] - e) <= 1e-12 * (1 + fabs(e)), "%s(%g) = %.17g, expected %.17g", nm, xv[k], yv[k], e);
        }
        kn_ctx_free(ctx);
        /* fast backend vs reference, odd sizes and a non-contiguous view */
        kn_opin in1 = {2, {7, 13}, u->lo, u->hi};
        double e1 = kn_optest_backends(b_unary, (void *)u, 1, &in1);
        CHECK(e1 < 1e-6, "%s backends [7,13]: %g", nm, e1);
        kn_opin in2 = {3, {2, 5, 3}, u->lo, u->hi, .transposed = true};
        double e2 = kn_optest_backends(b_unary, (void *)u, 1, &in2);
        CHECK(e2 < 1e-6, "%s backends transposed: %g", nm, e2);
        kn_opin in3 = {2, {0, 4}, u->lo, u->hi};
        CHECK(kn_optest_backends(b_unary, (void *)u, 1, &in3) == 0, "%s empty", nm);
        /* gradient */
        if (u->op == KN_OP_GELU_TANH_GRAD) continue;
        kn_opin gi = {2, {3, 4}, u->lo, u->hi, .transposed = true};
        bool req = true;
        double ge = kn_gradcheck(b_unary, (void *)u, 1, &gi, &req);
        CHECK(ge < 1e-5, "%s gradcheck: %g", nm, ge);
    }
}

static const kn_op BINARY[] = {KN_OP_ADD, KN_OP_SUB, KN_OP_MUL, KN_OP_DIV, KN_OP_POW, KN_OP_MAXIMUM,
                               KN_OP_MINIMUM, KN_OP_FMOD, KN_OP_ATAN2};
static kn_tensor *b_binary(kn_ctx *ctx, kn_tensor **in, void *ud) { return kn_binary(ctx, *(kn_op *)ud, in[0], in[1]); }

static double expect_binary(kn_op op, double a, double b) {
    switch (op) {
    case KN_OP_ADD: return a + b; case KN_OP_SUB: return a - b; case KN_OP_MUL: return a * b;
    case KN_OP_DIV: return a / b; case KN_OP_POW: return exp(b * log(a)); case KN_OP_MAXIMUM: return a > b ? a : b;
    case KN_OP_MINIMUM: return a < b ? a : b; case KN_OP_FMOD: return a - trunc(a / b) * b; case KN_OP_ATAN2: return atan2(a, b);
    default: return NAN;
    }
}

TEST(binary_broadcast_backends_and_grads) {
    kn_test_seed(2);
    for (size_t i = 0; i < sizeof BINARY / sizeof BINARY[0]; i++) {
        kn_op op = BINARY[i];
        const char *nm = kn_op_name(op);
        double lo = (op == KN_OP_POW || op == KN_OP_DIV || op == KN_OP_FMOD) ? 0.5 : -2, hi = 2.5;
        kn_ctx_opts o = {kn_backend_ref()};
        kn_ctx *ctx = kn_ctx_new(&o);
        double av[12], bv[4], yv[12];
        for (int k = 0; k < 12; k++) av[k] = kn_test_uniform(lo, hi);
        for (int k = 0; k < 4; k++) bv[k] = kn_test_uniform(lo, hi);
        kn_tensor *a = kn_from_data(ctx, KN_F64, 2, (int64_t[]){3, 4}, av);
        kn_tensor *b = kn_from_data(ctx, KN_F64, 1, (int64_t[]){4}, bv);
        REQUIRE(kn_tensor_read(kn_binary(ctx, op, a, b), yv, KN_F64) == KN_OK, "%s: %s", nm, kn_last_error());
        for (int k = 0; k < 12; k++) {
            double e = expect_binary(op, av[k], bv[k % 4]);
            CHECK(fabs(yv[k] - e) <= 1e-12 * (1 + fabs(e)), "%s(%g,%g) = %g expected %g", nm, av[k], bv[k % 4], yv[k], e);
        }
        kn_ctx_free(ctx);
        kn_opin p1[2] = {{2, {5, 17}, lo, hi}, {1, {17}, lo, hi}};
        CHECK(kn_optest_backends(b_binary, &op, 2, p1) < 1e-6, "%s backends row broadcast", nm);
        kn_opin p2[2] = {{3, {2, 1, 3}, lo, hi}, {2, {4, 1}, lo, hi}};
        CHECK(kn_optest_backends(b_binary, &op, 2, p2) < 1e-6, "%s backends 2-way broadcast", nm);
        kn_opin p3[2] = {{2, {6, 5}, lo, hi, .transposed = true}, {2, {6, 5}, lo, hi}};
        CHECK(kn_optest_backends(b_binary, &op, 2, p3) < 1e-6, "%s backends transposed", nm);
        bool req[2] = {true, true};
        kn_opin g1[2] = {{3, {2, 1, 3}, lo, hi}, {2, {4, 1}, lo, hi}};
        double ge = kn_gradcheck(b_binary, &op, 2, g1, req);
        CHECK(ge < 1e-5, "%s gradcheck broadcast: %g", nm, ge);
    }
}

TEST(compare_and_logic) {
    kn_ctx_opts o = {kn_backend_ref()};
    kn_ctx *ctx = kn_ctx_new(&o);
    kn_tensor *a = kn_from_data(ctx, KN_F32, 1, (int64_t[]){4}, (float[]){1, 2, 3, 4});
    kn_tensor *b = kn_from_data(ctx, KN_F32, 1, (int64_t[]){4}, (float[]){4, 2, 1, 4});
    kn_op ops[6] = {KN_OP_EQ, KN_OP_NE, KN_OP_LT, KN_OP_LE, KN_OP_GT, KN_OP_GE};
    uint8_t expect[6][4] = {{0, 1, 0, 1}, {1, 0, 1, 0}, {1, 0, 0, 0}, {1, 1, 0, 1}, {0, 0, 1, 0}, {0, 1, 1, 1}};
    for (int i = 0; i < 6; i++) {
        uint8_t v[4];
        kn_tensor *c = kn_binary(ctx, ops[i], a, b);
        REQUIRE(c && c->dtype == KN_BOOL && kn_tensor_read(c, v, KN_BOOL) == KN_OK, "%s", kn_last_error());
        for (int k = 0; k < 4; k++) CHECK(v[k] == expect[i][k], "%s[%d]", kn_op_name(ops[i]), k);
    }
    uint8_t v[4];
    kn_tensor *x = kn_logical_and(ctx, kn_gt(ctx, a, kn_scalar(ctx, KN_F32, 1)), kn_lt(ctx, a, kn_scalar(ctx, KN_F32, 4)));
    kn_tensor_read(kn_logical_or(ctx, x, kn_eq(ctx, a, b)), v, KN_BOOL);
    CHECK(v[0] == 0 && v[1] == 1 && v[2] == 1 && v[3] == 1, "and/or");
    kn_tensor_read(kn_logical_not(ctx, x), v, KN_BOOL);
    CHECK(v[0] == 1 && v[1] == 0, "not");
    kn_ctx_free(ctx);
}

typedef struct { kn_op op; int naxes; int axes[3]; bool keepdim; double p; } rspec;
static kn_tensor *b_reduce(kn_ctx *ctx, kn_tensor **in, void *ud) {
    const rspec *r = ud;
    switch (r->op) {
    case KN_OP_VAR: return kn_var(ctx, in[0], r->naxes, r->axes, 1, r->keepdim);
    case KN_OP_STD: return kn_std(ctx, in[0], r->naxes, r->axes, 0, r->keepdim);
    case KN_OP_NORM: return kn_norm(ctx, in[0], r->p, r->naxes, r->axes, r->keepdim);
    default: return kn_reduce(ctx, r->op, in[0], r->naxes, r->axes, r->keepdim);
    }
}

TEST(reductions_backends_and_grads) {
    kn_test_seed(3);
    kn_op ops[] = {KN_OP_SUM, KN_OP_MEAN, KN_OP_PROD, KN_OP_MAX, KN_OP_MIN, KN_OP_VAR, KN_OP_STD, KN_OP_LOGSUMEXP, KN_OP_NORM};
    rspec shapes[] = {{0, 0, {0}, false, 2}, {0, 1, {1}, true, 2}, {0, 2, {0, 2}, false, 3}, {0, 1, {-1}, false, 1}, {0, 1, {0}, true, INFINITY}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            rspec r = shapes[s]; r.op = ops[i];
            if (ops[i] != KN_OP_NORM) r.p = 2;
            const char *nm = kn_op_name(r.op);
            kn_opin in = {3, {3, 4, 5}, 0.5, 1.5};
            CHECK(kn_optest_backends(b_reduce, &r, 1, &in) < 1e-6, "%s backends case %zu", nm, s);
            kn_opin tin = {3, {2, 3, 4}, 0.5, 1.5, .transposed = true};
            bool req = true;
            double ge = kn_gradcheck(b_reduce, &r, 1, &tin, &req);
            CHECK(ge < 1e-5, "%s gradcheck case %zu: %g", nm, s, ge);
        }
    /* argmax / argmin / all / any values */
    kn_ctx_opts o = {kn_backend_ref()};
    kn_ctx *ctx = kn_ctx_new(&o);
    kn_tensor *x = kn_from_data(ctx, KN_F32, 2, (int64_t[]){2, 3}, (float[]){1, 5, 5, -1, -7, 0});
    int64_t v[2];
    kn_tensor_read(kn_argmax(ctx, x, 1, false), v, KN_I64);
    CHECK(v[0] == 1 && v[1] == 2, "argmax first max: %lld %lld", (long long)v[0], (long long)v[1]);
    kn_tensor_read(kn_argmin(ctx, x, -1, false), v, KN_I64);
    CHECK(v[0] == 0 && v[1] == 1, "argmin");
    uint8_t b[3];
    kn_tensor_read(kn_all(ctx, x, 1, (int[]){0}, false), b, KN_BOOL);
    CHECK(b[0] == 1 && b[1] == 1 && b[2] == 0, "all");
    kn_tensor_read(kn_any(ctx, kn_gt(ctx, x, kn_scalar(ctx, KN_F32, 4)), 1, (int[]){1}, false), b, KN_BOOL);
    CHECK(b[0] == 1 && b[1] == 0, "any");
    CHECK(kn_max(ctx, kn_zeros(ctx, KN_F32, 2, (int64_t[]){0, 3}), 1, (int[]){0}, false) == NULL, "max over empty dim is an error");
    kn_ctx_free(ctx);
}

static kn_tensor *b_cumsum(kn_ctx *ctx, kn_tensor **in, void *ud) { return kn_cumsum(ctx, in[0], *(int *)ud); }
static kn_tensor *b_cumprod(kn_ctx *ctx, kn_tensor **in, void *ud) { return kn_cumprod(ctx, in[0], *(int *)ud); }
TEST(scans) {
    kn_test_seed(4);
    for (int d = -2; d < 2; d++) {
        kn_opin in = {2, {4, 5}, 0.5, 1.5, .transposed = true};
        bool req = true;
        CHECK(kn_optest_backends(b_cumsum, &d, 1, &in) < 1e-6, "cumsum backends");
        CHECK(kn_gradcheck(b_cumsum, &d, 1, &in, &req) < 1e-5, "cumsum grad dim %d", d);
        CHECK(kn_gradcheck(b_cumprod, &d, 1, &in, &req) < 1e-5, "cumprod grad dim %d", d);
    }
    kn_ctx_opts o = {kn_backend_ref()};
    kn_ctx *ctx = kn_ctx_new(&o);
    double v[4];
    kn_tensor_read(kn_cumprod(ctx, kn_arange(ctx, KN_F64, 1, 5, 1), 0), v, KN_F64);
    CHECK(v[0] == 1 && v[1] == 2 && v[2] == 6 && v[3] == 24, "cumprod values");
    kn_ctx_free(ctx);
}

static kn_tensor *b_matmul(kn_ctx *ctx, kn_tensor **in, void *ud) { return kn_matmul(ctx, in[0], in[1]); }
static kn_tensor *b_linear(kn_ctx *ctx, kn_tensor **in, void *ud) { return kn_linear(ctx, in[0], in[1], in[2]); }
TEST(matmul_backends_and_grads) {
    kn_test_seed(5);
    struct { int na, nb; int64_t a[4], b[4]; bool ta, tb; } cases[] = {
        {2, 2, {7, 9}, {9, 5}, false, false}, {2, 2, {1, 33}, {33, 17}, false, true},
        {3, 2, {2, 3, 4}, {4, 5}, true, false}, {3, 4, {2, 3, 4}, {3, 2, 4, 6}, false, false},
        {1, 2, {5}, {5, 3}, false, false}, {2, 1, {4, 5}, {5}, false, false}, {2, 2, {65, 70}, {70, 67}, false, false},
        {2, 2, {3, 0}, {0, 4}, false, false},
        /* a shared 2-d right operand: one GEMM over all batch rows (fast path), gradient a2^T g2 / (g2^T a2)^T */
        {3, 2, {4, 9, 6}, {6, 7}, false, false}, {4, 2, {2, 3, 5, 6}, {6, 7}, false, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kn_opin in[2] = {{cases[i].na, {0}, -1, 1, .transposed = cases[i].ta}, {cases[i].nb, {0}, -1, 1, .transposed = cases[i].tb}};
        for (int k = 0; k < 4; k++) { in[0].shape[k] = cases[i].a[k]; in[1].shape[k] = cases[i].b[k]; }
        CHECK(kn_optest_backends(b_matmul, NULL, 2, in) < 1e-5, "matmul backends case %zu", i);
        if (kn__numel(&in[0]) * kn__numel(&in[1]) < 20000) {
            bool req[2] = {true, true};
            double ge = kn_gradcheck(b_matmul, NULL, 2, in, req);
            CHECK(ge < 1e-5, "matmul gradcheck case %zu: %g", i, ge);
        }
    }
    kn_opin li[3] = {{3, {2, 3, 4}, -1, 1}, {2, {5, 4}, -1, 1}, {1, {5}, -1, 1}};
    bool req[3] = {true, true, true};
    CHECK(kn_gradcheck(b_linear, NULL, 3, li, req) < 1e-5, "linear gradcheck");
}

TEST(dtype_casts_round_to_nearest_even) {
    kn_ctx_opts o = {kn_backend_ref()};
    kn_ctx *ctx = kn_ctx_new(&o);
    /* 1 + 2^-11 is a tie between two f16 values: RNE goes to 1.0; 1 + 3*2^-11 goes up */
    float in[4] = {1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 65520.0f, -0.0f};
    kn_tensor *x = kn_from_data(ctx, KN_F32, 1, (int64_t[]){4}, in);
    float out[4];
    REQUIRE(kn_tensor_read(kn_cast(ctx, kn_cast(ctx, x, KN_F16), KN_F32), out, KN_F32) == KN_OK, "%s", kn_last_error());
    CHECK(out[0] == 1.0f && out[1] == 1.0f + 4.0f / 2048 && isinf(out[2]) && signbit(out[3]), "f16 RNE: %g %g %g", out[0], out[1], out[2]);
    float bi[2] = {1.0f + 1.0f / 256, 1.0f + 3.0f / 256};
    kn_tensor *y = kn_from_data(ctx, KN_F32, 1, (int64_t[]){2}, bi);
    kn_tensor_read(kn_cast(ctx, kn_cast(ctx, y, KN_BF16), KN_F32), out, KN_F32);
    CHECK(out[0] == 1.0f && out[1] == 1.0f + 4.0f / 256, "bf16 RNE: %g %g", out[0], out[1]);
    /* every pair of plain dtypes round-trips small integers */
    kn_dtype dts[] = {KN_F32, KN_F16, KN_BF16, KN_F64, KN_I8, KN_I32, KN_I64, KN_U8};
    for (size_t a = 0; a < 8; a++)
        for (size_t b = 0; b < 8; b++) {
            kn_tensor *s = kn_cast(ctx, kn_arange(ctx, dts[a], 0, 100, 7), dts[b]);
            double v[15];
            REQUIRE(kn_tensor_read(s, v, KN_F64) == KN_OK, "%s", kn_last_error());
            for (int i = 0; i < 15; i++) CHECK(v[i] == i * 7, "cast %s->%s", kn_dtype_name(dts[a]), kn_dtype_name(dts[b]));
        }
    /* float -> int truncates toward zero and saturates */
    kn_tensor *z = kn_from_data(ctx, KN_F32, 1, (int64_t[]){3}, (float[]){-1.7f, 300.0f, 2.9f});
    int8_t iv[3];
    kn_tensor_read(kn_cast(ctx, z, KN_I8), iv, KN_I8);
    CHECK(iv[0] == -1 && iv[1] == 127 && iv[2] == 2, "f32->i8 %d %d %d", iv[0], iv[1], iv[2]);
    kn_ctx_free(ctx);
}

/* kn_cast folds a widening round trip: bf16 -> f32 -> bf16 is the bf16 tensor
 * itself (forward and gradient); a narrowing one rounds and stays */
TEST(cast_round_trip_folds) {
    kn_ctx_opts o = {kn_backend_ref()};
    kn_ctx *ctx = kn_ctx_new(&o);
    float in[3] = {1.0f + 1.0f / 256, -3.5f, 1e-3f};
    kn_tensor *x = kn_from_data(ctx, KN_F32, 1, (int64_t[]){3}, in);
    kn_set_requires_grad(x, true);
    kn_tensor *b = kn_cast(ctx, x, KN_BF16), *h = kn_cast(ctx, x, KN_F16);
    CHECK(kn_cast(ctx, kn_cast(ctx, b, KN_F32), KN_BF16) == b, "bf16 -> f32 -> bf16 is not folded");
    CHECK(kn_cast(ctx, kn_cast(ctx, b, KN_F64), KN_BF16) == b, "bf16 -> f64 -> bf16 is not folded");
    CHECK(kn_cast(ctx, kn_cast(ctx, h, KN_F32), KN_F16) == h, "f16 -> f32 -> f16 is not folded");
    kn_tensor *r = kn_cast(ctx, kn_cast(ctx, x, KN_BF16), KN_F32);             /* rounds */
    kn_tensor *r2 = kn_cast(ctx, kn_cast(ctx, b, KN_F16), KN_BF16);            /* f16 lacks bf16's range */
    CHECK(r != x && r->op == KN_OP_CAST && r2 != b && r2->op == KN_OP_CAST, "a rounding round trip was folded");
    float v[3];
    REQUIRE(kn_tensor_read(r, v, KN_F32) == KN_OK, "%s", kn_last_error());
    CHECK(v[0] == 1.0f && v[1] == -3.5f, "f32 -> bf16 -> f32 must round: %g", v[0]);
    /* the gradient through a folded pair: d/dx sum(cast(cast(cast(x, bf16), f32), bf16) * 2) = 2 */
    kn_tensor *f = kn_cast(ctx, kn_cast(ctx, b, KN_F32), KN_BF16);
    kn_tensor *loss = kn_sum(ctx, kn_cast(ctx, kn_mul(ctx, f, kn_scalar(ctx, KN_BF16, 2)), KN_F32), 0, NULL, false);
    REQUIRE(loss && kn_backward(ctx, loss) == KN_OK, "%s", kn_last_error());
    REQUIRE(kn_tensor_read(kn_grad(x), v, KN_F32) == KN_OK, "%s", kn_last_error());
    CHECK(v[0] == 2 && v[1] == 2 && v[2] == 2, "grad %g %g %g", v[0], v[1], v[2]);
    kn_ctx_free(ctx);
}

TEST(where_tri_assign) {
    kn_ctx_opts o = {kn_backend_ref()};
    kn_ctx *ctx = kn_ctx_new(&o);
    kn_tensor *x = kn_reshape(ctx, kn_arange(ctx, KN_F32, 1, 10, 1), 2, (int64_t[]){3, 3});
    float v[9];
    kn_tensor_read(kn_triu(ctx, x, 0), v, KN_F32);
    CHECK(v[3] == 0 && v[4] == 5 && v[1] == 2, "triu");
    kn_tensor_read(kn_tril(ctx, x, -1), v, KN_F32);
    CHECK(v[0] == 0 && v[3] == 4 && v[4] == 0, "tril -1");
    kn_tensor *m = kn_gt(ctx, x, kn_scalar(ctx, KN_F32, 4));
    kn_tensor_read(kn_masked_fill(ctx, x, m, -1), v, KN_F32);
    CHECK(v[3] == 4 && v[4] == -1, "masked_fill");
    kn_tensor *buf = kn_zeros(ctx, KN_F32, 2, (int64_t[]){3, 3});
    CHECK(kn_assign(ctx, buf, x) == NULL, "assign to a lazy node is refused");
    kn_ctx_clear_status(ctx);
    kn_tensor *p = kn_empty(ctx, KN_F32, 2, (int64_t[]){3, 3});
    kn_tensor *a = kn_assign(ctx, kn_transpose(ctx, p, 0, 1), x);   /* p = x^T */
    REQUIRE(kn_realize(a) == KN_OK, "%s", kn_last_error());
    kn_tensor_read(p, v, KN_F32);
    CHECK(v[1] == 4 && v[3] == 2, "assign through a transposed view");
    kn_ctx_free(ctx);
}

/* sizes above the threading threshold, so the fast CPU paths split work over threads */
static kn_tensor *b_big(kn_ctx *ctx, kn_tensor **in, void *ud) {
    int which = *(int *)ud;
    switch (which) {
    case 0: return kn_silu(ctx, in[0]);
    case 1: return kn_mul(ctx, in[0], in[1]);
    case 2: return kn_sub(ctx, in[0], in[2]);
    case 3: return kn_sum(ctx, in[0], 1, (int[]){-1}, false);
    case 4: return kn_max(ctx, in[0], 1, (int[]){1}, true);
    case 5: return kn_cast(ctx, kn_cast(ctx, in[0], KN_BF16), KN_F32);
    case 6: return kn_add(ctx, in[0], kn_scalar(ctx, KN_F32, 3.5));
    case 7: return kn_matmul(ctx, in[0], kn_transpose(ctx, in[1], 0, 1));
    case 8: return kn_square(ctx, in[0]);
    case 9: return kn_sub(ctx, in[0], kn_sum(ctx, in[1], 1, (int[]){1}, true));      /* [N,1] column broadcast */
    case 10: return kn_div(ctx, in[0], kn_add_scalar(ctx, kn_abs(ctx, kn_slice(ctx, in[1], 1, 0, 1, 1)), 1));
    case 11: return kn_sum(ctx, in[0], 1, (int[]){0}, false);                     /* leading-axis reduction */
    case 12: return kn_mean(ctx, kn_reshape(ctx, in[0], 3, (int64_t[]){3, 100, 257}), 2, (int[]){0, 1}, true);
    case 13: return kn_add(ctx, kn_zeros_like(ctx, in[0]), in[0]);                 /* fill */
    case 14: return kn_sub(ctx, kn_scalar(ctx, KN_F32, 1.5), in[0]);                /* scalar - tensor */
    case 15: return kn_sub(ctx, in[2], in[0]);                                       /* row - tensor */
    case 16: return kn_div(ctx, kn_slice(ctx, in[1], 1, 0, 1, 1), kn_add_scalar(ctx, kn_abs(ctx, in[0]), 1)); /* column / tensor */
    case 17: return kn_mul(ctx, kn_transpose(ctx, kn_slice(ctx, in[1], 0, 0, 257, 1), 0, 1), kn_slice(ctx, in[0], 0, 0, 257, 1));
    case 18: return kn_sub(ctx, kn_slice(ctx, in[0], 0, 0, 257, 1), kn_transpose(ctx, kn_slice(ctx, in[1], 0, 0, 257, 1), 0, 1));
    /* where: bool condition broadcast from a row / a column, scalar branch (a causal-mask fill) */
    case 19: return kn_where(ctx, kn_gt(ctx, in[2], kn_scalar(ctx, KN_F32, 0)), in[0], in[1]);
    case 20: return kn_masked_fill(ctx, in[0], kn_gt(ctx, kn_slice(ctx, in[1], 1, 0, 1, 1), kn_scalar(ctx, KN_F32, 0)), -7.5);
    case 21: return kn_var(ctx, in[0], 1, (int[]){-1}, 1, true);                  /* unbiased, keepdim */
    case 22: return kn_std(ctx, in[0], 1, (int[]){1}, 0, false);                   /* population */
    case 23: return kn_sum(ctx, kn_reshape(ctx, in[0], 2, (int64_t[]){150, 514}), 1, (int[]){0}, true); /* wide rows: column split */
    /* relu's backward: a same-shape bool condition, a scalar branch (the branch-free row kernel) */
    case 24: return kn_where(ctx, kn_gt(ctx, in[0], kn_scalar(ctx, KN_F32, 0)), in[1], kn_scalar(ctx, KN_F32, 0));
    /* an f32 condition (nonzero = true), a transposed branch */
    default: return kn_where(ctx, kn_floor(ctx, kn_slice(ctx, in[0], 0, 0, 257, 1)),
                             kn_transpose(ctx, kn_slice(ctx, in[1], 0, 0, 257, 1), 0, 1), in[2]);
    }
}
TEST(fast_paths_large_threaded) {
    kn_test_seed(6);
    kn_opin in[3] = {{2, {300, 257}, -2, 2}, {2, {300, 257}, -2, 2}, {1, {257}, -2, 2}};
    for (int w = 0; w < 26; w++) {
        double e = kn_optest_backends(b_big, &w, 3, in);
        CHECK(e < 1e-5, "case %d: rel err %g", w, e);
    }
}

/* assign of a same-shape contiguous value (the optimizer's update) on the fast path */
TEST(assign_fast_path) {
    kn_ctx_opts o = {kn_backend_cpu()};
    kn_ctx *ctx = kn_ctx_new(&o);
    int64_t n = 300000;
    kn_tensor *p = kn_empty(ctx, KN_F32, 1, &n);
    float *v = malloc(sizeof(float) * n);
    for (int64_t i = 0; i < n; i++) v[i] = (float)(i % 13);
    kn_tensor_write(p, v, KN_F32);
    kn_tensor *upd = kn_assign(ctx, p, kn_mul_scalar(ctx, p, 0.5));
    kn_plan *pl = kn_plan_new(ctx, 1, &upd, NULL);
    REQUIRE(pl && kn_plan_run(pl) == KN_OK && kn_plan_run(pl) == KN_OK, "%s", kn_last_error());
    kn_tensor_read(p, v, KN_F32);
    for (int64_t i = 0; i < n; i += 997) CHECK(v[i] == (float)(i % 13) * 0.25f, "p[%lld] = %g", (long long)i, v[i]);
    kn_plan_free(pl);
    free(v);
    kn_ctx_free(ctx);
}

KN_TEST_MAIN()
