/* test_optable.c: the op table (include/kiln_ops.def) and what is made from it.
 *
 *  - every op has a row: a unique name, a kind, an arity;
 *  - every elementwise op has its forward expression, and its gradient
 *    expression(s) when it is differentiable, as text for code generators;
 *  - the gradient expressions, compiled as scalar code (graph/scalar_ops.h),
 *    agree with finite differences of the forward expressions;
 *  - the gradient rules autograd builds (from the expressions, or by hand)
 *    agree with the scalar gradient expressions, in f64 on the reference backend.
 */
#include "kn_test.h"
#include "kiln.h"
#include "graph/graph.h"
#include "graph/scalar_ops.h"

static bool elementwise(kn_op op) {
    kn_op_kind k = kn_op_get(op)->kind;
    return k == KN_KIND_UNARY || k == KN_KIND_BINARY;
}
static bool has_grad_expr(kn_op op) {
    kn_op_grad r = kn_op_get(op)->grad_rule;
    return r == KN_GRAD_EXPR || r == KN_GRAD_HAND;
}
/* the scalar parameters the tests give an op (clamp bounds, leaky slope, elu alpha) */
static void params(kn_op op, double *p0, double *p1) {
    *p0 = 0; *p1 = 0;
    if (op == KN_OP_CLAMP || op == KN_OP_HARDTANH) { *p0 = -0.5; *p1 = 0.7; }
    if (op == KN_OP_LEAKY_RELU) *p0 = 0.1;
    if (op == KN_OP_ELU) *p0 = 1.3;
}

TEST(every_op_has_a_row) {
    for (int i = 0; i < KN_OP_COUNT; i++) {
        const kn_op_info *o = kn_op_get((kn_op)i);
        REQUIRE(o->name && o->name[0] && strcmp(o->name, "?") != 0, "op %d has no name", i);
        CHECK(o->arity >= -1 && o->arity <= KN_MAX_SRC, "%s: arity %d", o->name, o->arity);
        for (int j = 0; j < i; j++) CHECK(strcmp(o->name, kn_op_name((kn_op)j)) != 0, "%s: name used twice", o->name);
        if (o->kind == KN_KIND_UNARY) CHECK(o->arity == 1, "%s: unary with arity %d", o->name, o->arity);
        if (o->kind == KN_KIND_BINARY) CHECK(o->arity == 2, "%s: binary with arity %d", o->name, o->arity);
    }
    CHECK(strcmp(kn_op_name(KN_OP_COUNT), "?") == 0, "out of range op");
    CHECK(strcmp(kn_op_name(KN_OP_GELU_TANH), "gelu_tanh") == 0 && kn_op_get(KN_OP_SDPA_BWD)->kind == KN_KIND_NN,
          "rows in enum order");
}

TEST(elementwise_ops_have_expressions) {
    int n = 0;
    for (int i = 0; i < KN_OP_COUNT; i++) {
        kn_op op = (kn_op)i;
        const kn_op_info *o = kn_op_get(op);
        if (!elementwise(op)) {
            CHECK(!o->expr && !o->grad[0] && o->grad_rule == KN_GRAD_NA, "%s: not elementwise but has an expression", o->name);
            continue;
        }
        n++;
        CHECK(o->expr && o->expr[0], "%s: no forward expression", o->name);
        int nops = o->kind == KN_KIND_BINARY ? 2 : 1;
        for (int k = 0; k < nops; k++) {
            REQUIRE(o->grad[k], "%s: no gradient text slot %d", o->name, k);
            if (has_grad_expr(op)) CHECK(o->grad[k][0], "%s: empty gradient expression for operand %d", o->name, k);
            else CHECK(!o->grad[k][0], "%s: a gradient expression but no gradient", o->name);
        }
        CHECK(o->grad_rule != KN_GRAD_NA, "%s: no gradient kind", o->name);
    }
    CHECK(n >= 62, "%d elementwise ops: rows lost", n);
    /* the text is the table's, unexpanded: what code generators render */
    CHECK(strcmp(kn_op_get(KN_OP_RELU)->expr, "x > 0 ? x : (KN_ISNAN(x) ? x : 0.0)") == 0, "%s", kn_op_get(KN_OP_RELU)->expr);
    CHECK(strcmp(kn_op_get(KN_OP_EXP)->grad[0], "KN_MUL(g, y)") == 0, "%s", kn_op_get(KN_OP_EXP)->grad[0]);
    CHECK(strcmp(kn_op_get(KN_OP_SUB)->grad[1], "KN_NEG(g)") == 0, "%s", kn_op_get(KN_OP_SUB)->grad[1]);
}

/* points inside every op's domain, away from kinks (0, clamp bounds, +-3, integers and halves) */
static const double xs[] = {-2.3, -0.8, -0.3, 0.15, 0.4, 0.6, 0.93, 1.7, 2.6, 3.4};
#define NX (int)(sizeof xs / sizeof xs[0])
static const double abs_[][2] = {{1.3, 0.7}, {-0.8, 2.1}, {2.5, -1.4}, {0.35, 1.9}, {1.6, 1.15}, {-1.2, -0.45}};
#define NAB (int)(sizeof abs_ / sizeof abs_[0])

static double fwd(kn_op op, double u, double v, double p0, double p1) {
    return kn_op_get(op)->kind == KN_KIND_UNARY ? kn_scalar_unary(op, u, p0, p1) : kn_scalar_binary(op, u, v);
}

TEST(gradient_expressions_match_finite_differences) {
    const double h = 1e-6;
    for (int i = 0; i < KN_OP_COUNT; i++) {
        kn_op op = (kn_op)i;
        if (!elementwise(op) || !has_grad_expr(op)) continue;
        bool bin = kn_op_get(op)->kind == KN_KIND_BINARY;
        double p0, p1;
        params(op, &p0, &p1);
        int npts = bin ? NAB : NX, checked = 0;
        for (int j = 0; j < npts; j++) {
            for (int k = 0; k < (bin ? 2 : 1); k++) {
                double u = bin ? abs_[j][0] : xs[j], v = bin ? abs_[j][1] : 0;
                double y = fwd(op, u, v, p0, p1), g = 0.75, an;
                double up = k ? fwd(op, u, v + h, p0, p1) : fwd(op, u + h, v, p0, p1);
                double dn = k ? fwd(op, u, v - h, p0, p1) : fwd(op, u - h, v, p0, p1);
                if (!isfinite(y) || !isfinite(up) || !isfinite(dn)) continue;   /* outside the domain */
                REQUIRE(kn_scalar_grad(op, k, u, v, y, g, p0, p1, &an), "%s: no scalar gradient", kn_op_name(op));
                double fd = g * (up - dn) / (2 * h);
                CHECK(fabs(an - fd) <= 1e-6 * (1 + fabs(fd)), "%s d/d%s at (%g, %g): expression %.12g, finite difference %.12g",
                      kn_op_name(op), bin ? (k ? "b" : "a") : "x", u, v, an, fd);
                checked++;
            }
        }
        CHECK(checked >= 3, "%s: only %d points in its domain", kn_op_name(op), checked);
    }
}

/* y = op(x) (or op(a, b)) on the reference backend in f64, its gradient for a
 * seed gradient g through kn_gradients, against the scalar gradient expression */
TEST(gradient_rules_match_expressions) {
    enum { N = NX > NAB ? NX : NAB };
    for (int i = 0; i < KN_OP_COUNT; i++) {
        kn_op op = (kn_op)i;
        if (!elementwise(op) || !has_grad_expr(op)) continue;
        bool bin = kn_op_get(op)->kind == KN_KIND_BINARY;
        double p0, p1, av[N], bv[N], gv[N], ga[N], gb[N], yv[N];
        params(op, &p0, &p1);
        int64_t n = bin ? NAB : NX;
        for (int j = 0; j < n; j++) {
            av[j] = bin ? abs_[j][0] : xs[j];
            bv[j] = bin ? abs_[j][1] : 0;
            gv[j] = 0.5 + 0.25 * j;
        }
        kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_ref()});
        kn_tensor *a = kn_from_data(ctx, KN_F64, 1, &n, av), *b = kn_from_data(ctx, KN_F64, 1, &n, bv);
        kn_tensor *g = kn_from_data(ctx, KN_F64, 1, &n, gv);
        kn_set_requires_grad(a, true);
        kn_set_requires_grad(b, true);
        kn_tensor *y;
        switch (op) {
        case KN_OP_CLAMP: y = kn_clamp(ctx, a, p0, p1); break;
        case KN_OP_HARDTANH: y = kn_hardtanh(ctx, a, p0, p1); break;
        case KN_OP_LEAKY_RELU: y = kn_leaky_relu(ctx, a, p0); break;
        case KN_OP_ELU: y = kn_elu(ctx, a, p0); break;
        default: y = bin ? kn_binary(ctx, op, a, b) : kn_unary(ctx, op, a);
        }
        kn_tensor *ins[2] = {a, b}, *grads[2] = {NULL, NULL};
        REQUIRE(kn_gradients(ctx, 1, &y, &g, bin ? 2 : 1, ins, grads) == KN_OK, "%s: %s", kn_op_name(op), kn_last_error());
        REQUIRE(kn_tensor_read(y, yv, KN_F64) == KN_OK && kn_tensor_read(grads[0], ga, KN_F64) == KN_OK, "%s", kn_last_error());
        if (bin) REQUIRE(kn_tensor_read(grads[1], gb, KN_F64) == KN_OK, "%s", kn_last_error());
        for (int j = 0; j < n; j++)
            for (int k = 0; k < (bin ? 2 : 1); k++) {
                double want, got = k ? gb[j] : ga[j];
                REQUIRE(kn_scalar_grad(op, k, av[j], bv[j], yv[j], gv[j], p0, p1, &want), "%s", kn_op_name(op));
                if (isnan(want)) { CHECK(isnan(got), "%s at %g: %g, expression NaN", kn_op_name(op), av[j], got); continue; }
                CHECK(fabs(got - want) <= 1e-12 * (1 + fabs(want)), "%s d/d%s at (%g, %g): rule %.17g, expression %.17g",
                      kn_op_name(op), bin ? (k ? "b" : "a") : "x", av[j], bv[j], got, want);
            }
        kn_ctx_free(ctx);
    }
}

/* the kernels are the table's: the reference backend computes exactly the
 * scalar functions (integer dtypes included, through the same double math) */
TEST(reference_kernels_are_the_scalar_functions) {
    double xv[NX], out[NX];
    int64_t n = NX;
    for (int j = 0; j < NX; j++) xv[j] = xs[j];
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_ref()});
    kn_tensor *x = kn_from_data(ctx, KN_F64, 1, &n, xv);
    for (int i = 0; i < KN_OP_COUNT; i++) {
        kn_op op = (kn_op)i;
        if (kn_op_get(op)->kind != KN_KIND_UNARY) continue;
        kn_tensor *y = kn_cast(ctx, kn_unary(ctx, op, x), KN_F64);
        REQUIRE(kn_tensor_read(y, out, KN_F64) == KN_OK, "%s: %s", kn_op_name(op), kn_last_error());
        for (int j = 0; j < NX; j++) {
            double want = kn_scalar_unary(op, xv[j], 0, 0);
            if (kn_op_get(op)->out == KN_OUT_BOOL) want = want != 0;
            CHECK(memcmp(&out[j], &want, sizeof want) == 0 || (isnan(out[j]) && isnan(want)), "%s(%g): %.17g vs %.17g",
                  kn_op_name(op), xv[j], out[j], want);
        }
    }
    kn_ctx_free(ctx);
}

KN_TEST_MAIN()
