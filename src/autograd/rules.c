/* rules.c: gradient rules, one per differentiable op, in a single table.
 *
 * A rule gets the node (its sources and params), the gradient of its output
 * `g` and fills gin[k] with the gradient for source k (leave NULL for none).
 * Rules build ordinary lazy ops, so gradients run on any backend. Letters:
 * x = src[0], y = the node's output, g = incoming gradient.
 * Ops of the index and nn families register their rules in rules_index.c and
 * rules_nn.c through kn__grad_rule_index / kn__grad_rule_nn.
 */
#include "autograd/autograd.h"
#include <math.h>

#define X (t->src[0])
#define S(v) kn_scalar(ctx, g->dtype, (v))

/* Broadcast g to x's shape, keeping x's symbolic dims symbolic. */
static kn_tensor *expand_like(kn_ctx *ctx, kn_tensor *g, const kn_tensor *x) {
    kn_tensor *e = kn_expand(ctx, g, x->ndim, x->shape);
    if (e)
        for (int i = 0; i < x->ndim; i++)
            if (x->sym[i] && e->shape[i] == x->shape[i]) e->sym[i] = x->sym[i];
    return e;
}

/* Expand a reduced gradient back over the reduced axes of x. */
static kn_tensor *unreduce(kn_ctx *ctx, kn_tensor *g, const kn_tensor *t) {
    const kn_tensor *x = X;
    if (!t->p.reduce.keepdim) {
        int64_t shape[KN_MAX_DIMS];
        for (int i = 0; i < x->ndim; i++) shape[i] = (t->p.reduce.axes >> i & 1) ? 1 : x->shape[i];
        g = kn_reshape(ctx, g, x->ndim, shape);
    }
    return expand_like(ctx, g, x);
}
static double reduced_count(const kn_tensor *t) {
    double n = 1;
    for (int i = 0; i < X->ndim; i++) if (t->p.reduce.axes >> i & 1) n *= (double)X->shape[i];
    return n;
}
/* The number of elements each output of reduction t sums over, as a lazy
 * keepdim tensor when a reduced dim of its input is symbolic (its extent is
 * known only at run time: the shape holds the maximum); NULL when fixed. */
static kn_tensor *run_time_count(kn_ctx *ctx, const kn_tensor *t) {
    int axes[KN_MAX_DIMS], na = 0;
    bool sym = false;
    for (int i = 0; i < X->ndim; i++)
        if (t->p.reduce.axes >> i & 1) { axes[na++] = i; sym |= X->sym[i] != 0; }
    if (!sym) return NULL;
    kn_dtype dt = kn_dtype_get(X->dtype)->is_float ? X->dtype : KN_F32;
    kn_tensor *ones = kn__node(ctx, KN_OP_FILL, dt, X->ndim, X->shape, X->sym, NULL, 0);   /* X's run-time extents */
    if (!ones) return NULL;
    ones->p.scalar.a = 1;
    return kn_sum(ctx, ones, na, axes, true);
}

/* ---- views and copies ---- */
static void g_reshape(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    gin[0] = kn_reshape(ctx, g, X->ndim, X->shape);
}
static void g_permute(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    int inv[KN_MAX_DIMS];
    for (int i = 0; i < t->ndim; i++) inv[t->p.permute.perm[i]] = i;
    gin[0] = kn_permute(ctx, g, inv);
}
static void g_expand(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) { gin[0] = kn__sum_to(ctx, g, X); }
/* A unit-step slice's gradient is g zero-padded back to X's extent (one
 * write, no zero fill + index_add); other steps scatter with index_add. */
static void g_slice(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    int d = t->p.slice.dim;
    int64_t st = t->p.slice.start, step = t->p.slice.step, len = t->shape[d];
    if (step == 1 && !X->sym[d] && !t->sym[d]) {
        int np = X->ndim - d;                      /* pairs from the last dim back to d */
        int64_t pads[2 * KN_MAX_DIMS] = {0};
        pads[2 * (np - 1)] = st;
        pads[2 * (np - 1) + 1] = X->shape[d] - st - len;
        gin[0] = kn_pad(ctx, g, np, pads, KN_PAD_CONSTANT, 0);
        return;
    }
    kn_tensor *idx = kn_arange(ctx, KN_I64, (double)st, (double)(st + len * step), (double)step);
    gin[0] = kn_index_add(ctx, kn_zeros_like(ctx, X), d, idx, g);
}
static void g_copy(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) { gin[0] = g; }
static void g_cast(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) { gin[0] = kn_cast(ctx, g, X->dtype); }
static void g_tri(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    gin[0] = t->p.tri.upper ? kn_triu(ctx, g, t->p.tri.k) : kn_tril(ctx, g, t->p.tri.k);
}
static void g_where(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *z = S(0);
    gin[1] = kn__sum_to(ctx, kn_where(ctx, X, g, z), t->src[1]);
    gin[2] = kn__sum_to(ctx, kn_where(ctx, X, z, g), t->src[2]);
}

/* ---- elementwise: rules made from the op table ------------------------------
 * Rows of include/kiln_ops.def marked E give their gradient as an expression
 * over x (a, b), y = the output, g, p0 and p1. Here the vocabulary builds graph
 * ops, so each expression becomes a rule that records exactly the nodes a
 * hand-written rule would (constants in g's dtype, masks cast to it). */
#define KN_ADD(u, v) kn_add(ctx, u, v)
#define KN_SUB(u, v) kn_sub(ctx, u, v)
#define KN_MUL(u, v) kn_mul(ctx, u, v)
#define KN_DIV(u, v) kn_div(ctx, u, v)
#define KN_POW(u, v) kn_pow(ctx, u, v)
#define KN_NEG(u) kn_neg(ctx, u)
#define KN_C(v) S(v)
#define KN_WHERE(c, u, v) kn_where(ctx, c, u, v)
#define KN_GT(u, v) kn_gt(ctx, u, v)
#define KN_GE(u, v) kn_ge(ctx, u, v)
#define KN_LT(u, v) kn_lt(ctx, u, v)
#define KN_LE(u, v) kn_le(ctx, u, v)
#define KN_EQ(u, v) kn_eq(ctx, u, v)
#define KN_AND(u, v) kn_logical_and(ctx, u, v)
#define KN_MASK(c) kn_cast(ctx, c, g->dtype)
#define KN_ZEROS_LIKE(u) kn_zeros_like(ctx, u)
#define KN_FMOD(u, v) kn_fmod(ctx, u, v)
#define KN_ATAN2(u, v) kn_atan2(ctx, u, v)
/* the one-argument functions of graph/scalar_ops.h, as the ops that compute them */
#define KN_FABS(u) kn_abs(ctx, u)
#define KN_SIGN(u) kn_sign(ctx, u)
#define KN_EXP(u) kn_exp(ctx, u)
#define KN_EXP2(u) kn_exp2(ctx, u)
#define KN_LOG(u) kn_log(ctx, u)
#define KN_LOG2(u) kn_log2(ctx, u)
#define KN_LOG1P(u) kn_log1p(ctx, u)
#define KN_EXPM1(u) kn_expm1(ctx, u)
#define KN_SQRT(u) kn_sqrt(ctx, u)
#define KN_SQUARE(u) kn_square(ctx, u)
#define KN_RSQRT(u) kn_rsqrt(ctx, u)
#define KN_RECIPROCAL(u) kn_reciprocal(ctx, u)
#define KN_SIN(u) kn_sin(ctx, u)
#define KN_COS(u) kn_cos(ctx, u)
#define KN_TAN(u) kn_tan(ctx, u)
#define KN_ASIN(u) kn_asin(ctx, u)
#define KN_ACOS(u) kn_acos(ctx, u)
#define KN_ATAN(u) kn_atan(ctx, u)
#define KN_SINH(u) kn_sinh(ctx, u)
#define KN_COSH(u) kn_cosh(ctx, u)
#define KN_TANH(u) kn_tanh(ctx, u)
#define KN_ASINH(u) kn_asinh(ctx, u)
#define KN_ACOSH(u) kn_acosh(ctx, u)
#define KN_ATANH(u) kn_atanh(ctx, u)
#define KN_ERF(u) kn_erf(ctx, u)
#define KN_FLOOR(u) kn_floor(ctx, u)
#define KN_CEIL(u) kn_ceil(ctx, u)
#define KN_TRUNC(u) kn_trunc(ctx, u)
#define KN_RINT(u) kn_round(ctx, u)
#define KN_SIGMOID(u) kn_sigmoid(ctx, u)
#define KN_SOFTPLUS(u) kn_softplus(ctx, u)
#define KN_GELU_TANH_GRAD(u) kn_unary(ctx, KN_OP_GELU_TANH_GRAD, u)
#define p0 S(t->p.scalar.a)
#define p1 S(t->p.scalar.b)

#define KN__IF_GRAD_E(...) __VA_ARGS__
#define KN__IF_GRAD_H(...)
#define KN__IF_GRAD_Z(...)
#define KN__IF_GRAD_N(...)
#define KN_OP(ID, name, KIND, arity, inplace)
#define KN_OP_UNARY(ID, name, inplace, OUT, GRAD, fwd, grad)                              \
    KN__IF_GRAD_##GRAD(static void gx_##ID(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) { \
        kn_tensor *x = X, *y = t; (void)x; (void)y;                                         \
        gin[0] = grad; })
#define KN_OP_BINARY(ID, name, inplace, OUT, GRAD, fwd, grad_a, grad_b)                   \
    KN__IF_GRAD_##GRAD(static void gx_##ID(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) { \
        kn_tensor *a = t->src[0], *b = t->src[1], *y = t; (void)y;                          \
        kn_tensor *ga = grad_a, *gb = grad_b;                                               \
        gin[0] = kn__sum_to(ctx, ga, a);                                                    \
        gin[1] = kn__sum_to(ctx, gb, b); })
#include "kiln_ops.def"

/* the table's rules by op (NULL: not an E row) */
#define KN_OP(ID, name, KIND, arity, inplace)
#define KN_OP_UNARY(ID, name, inplace, OUT, GRAD, fwd, grad) KN__IF_GRAD_##GRAD([KN_OP_##ID] = gx_##ID,)
#define KN_OP_BINARY(ID, name, inplace, OUT, GRAD, fwd, grad_a, grad_b) KN__IF_GRAD_##GRAD([KN_OP_##ID] = gx_##ID,)
static const kn_grad_rule g_expr_rules[KN_OP_COUNT] = {
#include "kiln_ops.def"
};
#undef KN__IF_GRAD_E
#undef KN__IF_GRAD_H
#undef KN__IF_GRAD_Z
#undef KN__IF_GRAD_N
#undef p0
#undef p1

/* ---- elementwise: hand-written rules (H rows), each sharing a subexpression
 * between terms or operands, which an expression cannot say ---- */
static void g_unary(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *x = X, *d = NULL;
    switch (t->op) {
    case KN_OP_SILU: {
        kn_tensor *s = kn_sigmoid(ctx, x);
        d = kn_mul(ctx, s, kn_add(ctx, kn_mul(ctx, x, kn_sub(ctx, S(1), s)), S(1)));
        break;
    }
    case KN_OP_MISH: {
        kn_tensor *th = kn_tanh(ctx, kn_softplus(ctx, x));
        d = kn_add(ctx, th, kn_mul(ctx, kn_mul(ctx, x, kn_sigmoid(ctx, x)), kn_sub(ctx, S(1), kn_square(ctx, th))));
        break;
    }
    default: return;
    }
    gin[0] = kn_mul(ctx, g, d);
}

static void g_binary(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *a = t->src[0], *b = t->src[1], *ga = NULL, *gb = NULL;
    switch (t->op) {
    case KN_OP_MAXIMUM: case KN_OP_MINIMUM: {
        /* ties split the gradient evenly, as torch does */
        kn_tensor *win = t->op == KN_OP_MAXIMUM ? kn_gt(ctx, a, b) : kn_lt(ctx, a, b);
        kn_tensor *tie = kn_eq(ctx, a, b);
        kn_tensor *wa = kn_add(ctx, kn_cast(ctx, win, g->dtype), kn_mul(ctx, kn_cast(ctx, tie, g->dtype), S(0.5)));
        ga = kn_mul(ctx, g, wa);
        gb = kn_mul(ctx, g, kn_sub(ctx, S(1), wa));
        break;
    }
    case KN_OP_ATAN2: {
        kn_tensor *den = kn_add(ctx, kn_square(ctx, a), kn_square(ctx, b));
        ga = kn_div(ctx, kn_mul(ctx, g, b), den);
        gb = kn_neg(ctx, kn_div(ctx, kn_mul(ctx, g, a), den));
        break;
    }
    default: return;
    }
    gin[0] = kn__sum_to(ctx, ga, a);
    gin[1] = kn__sum_to(ctx, gb, b);
}

/* Z rows (comparisons): no gradient flows, and that is not an error */
static void g_none(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {}

static void g_gelu_tanh_grad(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn__fail(ctx, KN_ERR_UNSUPPORTED, "gelu_tanh_grad has no gradient (second derivatives of gelu_tanh are not supported)");
}

/* the rule of an elementwise op, from its row's gradient kind */
static kn_grad_rule elementwise_rule(kn_op op) {
    switch (kn_op_get(op)->grad_rule) {
    case KN_GRAD_EXPR: return g_expr_rules[op];
    case KN_GRAD_HAND: return kn_op_get(op)->kind == KN_KIND_UNARY ? g_unary : g_binary;
    case KN_GRAD_ZERO: return g_none;
    case KN_GRAD_NONE: return op == KN_OP_GELU_TANH_GRAD ? g_gelu_tanh_grad : NULL;
    case KN_GRAD_NA: break;
    }
    return NULL;
}

/* ---- reductions ---- */
static void g_reduce(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *x = X, *ge = unreduce(ctx, g, t), *ye = NULL;
    double n = reduced_count(t);
    switch (t->op) {
    case KN_OP_SUM: gin[0] = ge; return;
    case KN_OP_MEAN: {
        kn_tensor *cnt = run_time_count(ctx, t);
        gin[0] = cnt ? kn_div(ctx, ge, cnt) : kn_mul(ctx, ge, S(1.0 / n));
        return;
    }
    case KN_OP_PROD: gin[0] = kn_div(ctx, kn_mul(ctx, ge, unreduce(ctx, t, t)), x); return;
    case KN_OP_MAX: case KN_OP_MIN: {   /* split evenly among the extreme elements */
        ye = unreduce(ctx, t, t);
        kn_tensor *m = kn_cast(ctx, kn_eq(ctx, x, ye), g->dtype);
        int axes[KN_MAX_DIMS], na = 0;
        for (int i = 0; i < x->ndim; i++) if (t->p.reduce.axes >> i & 1) axes[na++] = i;
        kn_tensor *cnt = expand_like(ctx, kn_sum(ctx, m, na, axes, true), x);
        gin[0] = kn_div(ctx, kn_mul(ctx, ge, m), cnt);
        return;
    }
    case KN_OP_VAR: case KN_OP_STD: {
        int axes[KN_MAX_DIMS], na = 0;
        for (int i = 0; i < x->ndim; i++) if (t->p.reduce.axes >> i & 1) axes[na++] = i;
        kn_tensor *mean = expand_like(ctx, kn_mean(ctx, x, na, axes, true), x);
        double den = n - t->p.reduce.correction;
        kn_tensor *cnt = run_time_count(ctx, t);
        kn_tensor *dx = cnt ? kn_div(ctx, kn_mul(ctx, kn_sub(ctx, x, mean), S(2.0)), kn_add_scalar(ctx, cnt, -t->p.reduce.correction))
                            : kn_mul(ctx, kn_sub(ctx, x, mean), S(2.0 / den));
        if (t->op == KN_OP_STD) dx = kn_div(ctx, dx, kn_mul(ctx, unreduce(ctx, t, t), S(2)));
        gin[0] = kn_mul(ctx, ge, dx);
        return;
    }
    case KN_OP_LOGSUMEXP: gin[0] = kn_mul(ctx, ge, kn_exp(ctx, kn_sub(ctx, x, unreduce(ctx, t, t)))); return;
    case KN_OP_NORM: {
        double p = t->p.reduce.p;
        ye = unreduce(ctx, t, t);
        if (p == 2) { gin[0] = kn_mul(ctx, ge, kn_div(ctx, x, ye)); return; }
        if (p == 1) { gin[0] = kn_mul(ctx, ge, kn_sign(ctx, x)); return; }
        if (isinf(p)) {
            kn_tensor *m = kn_cast(ctx, kn_eq(ctx, kn_abs(ctx, x), ye), g->dtype);
            int axes[KN_MAX_DIMS], na = 0;
            for (int i = 0; i < x->ndim; i++) if (t->p.reduce.axes >> i & 1) axes[na++] = i;
            kn_tensor *cnt = expand_like(ctx, kn_sum(ctx, m, na, axes, true), x);
            gin[0] = kn_div(ctx, kn_mul(ctx, kn_mul(ctx, ge, m), kn_sign(ctx, x)), cnt);
            return;
        }
        kn_tensor *num = kn_mul(ctx, kn_sign(ctx, x), kn_pow(ctx, kn_abs(ctx, x), S(p - 1)));
        gin[0] = kn_mul(ctx, ge, kn_div(ctx, num, kn_pow(ctx, ye, S(p - 1))));
        return;
    }
    default: return;
    }
}

/* reverse cumulative sum along d: sum_{j >= i} v_j = total - cumsum + v */
static kn_tensor *rev_cumsum(kn_ctx *ctx, kn_tensor *v, int d) {
    kn_tensor *tot = expand_like(ctx, kn_sum(ctx, v, 1, &d, true), v);
    return kn_add(ctx, kn_sub(ctx, tot, kn_cumsum(ctx, v, d)), v);
}
static void g_scan(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    int d = t->p.scan.dim;
    if (t->op == KN_OP_CUMSUM) gin[0] = rev_cumsum(ctx, g, d);
    else gin[0] = kn_div(ctx, rev_cumsum(ctx, kn_mul(ctx, g, t), d), X);   /* assumes no zeros in x */
}

/* A 2-d right operand shared by every batch of a ([..., M, K] @ [K, N], a
 * Linear layer) gets its gradient from one GEMM over all batch rows,
 * a2^T g2 with a2 [rows, K], g2 [rows, N], instead of one per batch and a
 * sum. When b is a transposed view (x @ W^T), the product is formed as
 * (g2^T a2)^T so the gradient reaching W is contiguous. */
static void g_matmul(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *a = t->src[0], *b = t->src[1];
    if (a->flags & KN_FLAG_REQUIRES_GRAD)
        gin[0] = kn__sum_to(ctx, kn_matmul(ctx, g, kn_transpose(ctx, b, -1, -2)), a);
    if (!(b->flags & KN_FLAG_REQUIRES_GRAD)) return;
    bool sym = false;
    for (int i = 0; i < a->ndim; i++) sym |= a->sym[i] != 0;
    if (b->ndim == 2 && a->ndim >= 2 && !sym) {
        int64_t K = a->shape[a->ndim - 1], N = g->shape[g->ndim - 1], rows = 1;
        for (int i = 0; i < a->ndim - 1; i++) rows *= a->shape[i];
        kn_tensor *a2 = kn_reshape(ctx, a, 2, (int64_t[]){rows, K}), *g2 = kn_reshape(ctx, g, 2, (int64_t[]){rows, N});
        bool col_major = b->stride[0] == 1 && b->stride[1] != 1;
        gin[1] = col_major ? kn_transpose(ctx, kn_matmul(ctx, kn_transpose(ctx, g2, 0, 1), a2), 0, 1)
                           : kn_matmul(ctx, kn_transpose(ctx, a2, 0, 1), g2);
        return;
    }
    gin[1] = kn__sum_to(ctx, kn_matmul(ctx, kn_transpose(ctx, a, -1, -2), g), b);
}


kn_grad_rule kn__grad_rule(kn_op op) {
    switch (op) {
    case KN_OP_RESHAPE: return g_reshape;
    case KN_OP_PERMUTE: return g_permute;
    case KN_OP_EXPAND: return g_expand;
    case KN_OP_SLICE: return g_slice;
    case KN_OP_COPY: return g_copy;
    case KN_OP_CAST: return g_cast;
    case KN_OP_TRI: return g_tri;
    case KN_OP_WHERE: return g_where;
    case KN_OP_MATMUL: return g_matmul;
    case KN_OP_CUMSUM: case KN_OP_CUMPROD: return g_scan;
    default: break;
    }
    switch (kn_op_get(op)->kind) {
    case KN_KIND_UNARY: case KN_KIND_BINARY: return elementwise_rule(op);
    case KN_KIND_REDUCE:
        return (op == KN_OP_ARGMAX || op == KN_OP_ARGMIN || op == KN_OP_ALL || op == KN_OP_ANY) ? NULL : g_reduce;
    case KN_KIND_COPY: return kn__grad_rule_index(op);
    case KN_KIND_NN: return kn__grad_rule_nn(op);
    default: return NULL;
    }
}
