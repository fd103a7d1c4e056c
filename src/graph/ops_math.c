/* ops_math.c: elementwise (unary, binary with broadcasting), reductions,
 * scans and matmul constructors. */
#include "graph/graph.h"
#include <math.h>
#include <string.h>

/* ---- unary ----------------------------------------------------------------
 * Which ops exist, their output dtype rule and their math are rows of
 * include/kiln_ops.def; the constructors only check and record. */
static kn_tensor *unary_p(kn_ctx *ctx, kn_op op, kn_tensor *x, double a, double b) {
    if (!x) return NULL;
    if (kn_op_get(op)->kind != KN_KIND_UNARY)
        return kn__fail(ctx, KN_ERR_INVALID, "kn_unary: %s is not a unary op", kn_op_name(op));
    const kn_dtype_info *di = kn_dtype_get(x->dtype);
    if (di->is_quant)
        return kn__fail(ctx, KN_ERR_INVALID, "%s: %s tensors must be dequantized (kn_cast) first", kn_op_name(op), di->name);
    kn_dtype out = x->dtype;
    switch (kn_op_get(op)->out) {
    case KN_OUT_BOOL: out = KN_BOOL; break;
    case KN_OUT_FLOAT: if (di->is_int) out = KN_F32; break;   /* exp(int) is float, as in torch */
    case KN_OUT_SAME: break;
    }
    kn_tensor *t = kn__node(ctx, op, out, x->ndim, x->shape, x->sym, &x, 1);
    if (t) { t->p.scalar.a = a; t->p.scalar.b = b; }
    return t;
}
kn_tensor *kn_unary(kn_ctx *ctx, kn_op op, kn_tensor *x) { return unary_p(ctx, op, x, 0, 0); }

#define UNARY(fn, OP) kn_tensor *kn_##fn(kn_ctx *ctx, kn_tensor *x) { return unary_p(ctx, OP, x, 0, 0); }
UNARY(neg, KN_OP_NEG) UNARY(abs, KN_OP_ABS) UNARY(sign, KN_OP_SIGN) UNARY(exp, KN_OP_EXP)
UNARY(exp2, KN_OP_EXP2) UNARY(log, KN_OP_LOG) UNARY(log2, KN_OP_LOG2) UNARY(log1p, KN_OP_LOG1P)
UNARY(expm1, KN_OP_EXPM1) UNARY(sqrt, KN_OP_SQRT) UNARY(rsqrt, KN_OP_RSQRT)
UNARY(reciprocal, KN_OP_RECIPROCAL) UNARY(square, KN_OP_SQUARE) UNARY(sin, KN_OP_SIN)
UNARY(cos, KN_OP_COS) UNARY(tan, KN_OP_TAN) UNARY(asin, KN_OP_ASIN) UNARY(acos, KN_OP_ACOS)
UNARY(atan, KN_OP_ATAN) UNARY(sinh, KN_OP_SINH) UNARY(cosh, KN_OP_COSH) UNARY(tanh, KN_OP_TANH)
UNARY(asinh, KN_OP_ASINH) UNARY(acosh, KN_OP_ACOSH) UNARY(atanh, KN_OP_ATANH) UNARY(erf, KN_OP_ERF)
UNARY(floor, KN_OP_FLOOR) UNARY(ceil, KN_OP_CEIL) UNARY(round, KN_OP_ROUND) UNARY(trunc, KN_OP_TRUNC)
UNARY(logical_not, KN_OP_NOT) UNARY(relu, KN_OP_RELU) UNARY(selu, KN_OP_SELU) UNARY(gelu, KN_OP_GELU)
UNARY(gelu_tanh, KN_OP_GELU_TANH) UNARY(silu, KN_OP_SILU) UNARY(sigmoid, KN_OP_SIGMOID)
UNARY(softplus, KN_OP_SOFTPLUS) UNARY(mish, KN_OP_MISH) UNARY(hardsigmoid, KN_OP_HARDSIGMOID)
#undef UNARY

kn_tensor *kn_clamp(kn_ctx *ctx, kn_tensor *x, double lo, double hi) {
    if (lo > hi) return kn__fail(ctx, KN_ERR_INVALID, "clamp: min %g > max %g", lo, hi);
    return unary_p(ctx, KN_OP_CLAMP, x, lo, hi);
}
kn_tensor *kn_leaky_relu(kn_ctx *ctx, kn_tensor *x, double slope) { return unary_p(ctx, KN_OP_LEAKY_RELU, x, slope, 0); }
kn_tensor *kn_elu(kn_ctx *ctx, kn_tensor *x, double alpha) { return unary_p(ctx, KN_OP_ELU, x, alpha, 0); }
kn_tensor *kn_hardtanh(kn_ctx *ctx, kn_tensor *x, double lo, double hi) {
    if (lo > hi) return kn__fail(ctx, KN_ERR_INVALID, "hardtanh: min %g > max %g", lo, hi);
    return unary_p(ctx, KN_OP_HARDTANH, x, lo, hi);
}

/* ---- binary ---------------------------------------------------------------- */
kn_tensor *kn_binary(kn_ctx *ctx, kn_op op, kn_tensor *a, kn_tensor *b) {
    if (!a || !b) return NULL;
    if (kn_op_get(op)->kind != KN_KIND_BINARY)
        return kn__fail(ctx, KN_ERR_INVALID, "kn_binary: %s is not a binary op", kn_op_name(op));
    if (kn_dtype_get(a->dtype)->is_quant || kn_dtype_get(b->dtype)->is_quant)
        return kn__fail(ctx, KN_ERR_INVALID, "%s: quantized (%s, %s) operands must be dequantized first",
                        kn_op_name(op), kn_dtype_name(a->dtype), kn_dtype_name(b->dtype));
    int ndim; int64_t shape[KN_MAX_DIMS]; int8_t sym[KN_MAX_DIMS];
    if (!kn__broadcast_shape(ctx, kn_op_name(op), a, b, &ndim, shape, sym)) return NULL;
    kn_dtype dt = kn__promote(a->dtype, b->dtype);
    /* a 0-d float constant does not widen a lower-precision tensor (torch's rule for scalars) */
    if (b->ndim == 0 && b->op == KN_OP_FILL && kn_dtype_get(a->dtype)->is_float) dt = a->dtype;
    if (a->ndim == 0 && a->op == KN_OP_FILL && kn_dtype_get(b->dtype)->is_float) dt = b->dtype;
    switch (kn_op_get(op)->out) {
    case KN_OUT_FLOAT: if (kn_dtype_get(dt)->is_int) dt = KN_F32; break;  /* true division */
    case KN_OUT_BOOL: dt = KN_BOOL; break;                                /* comparisons, logic */
    case KN_OUT_SAME: break;
    }
    kn_tensor *src[2] = {a, b};
    return kn__node(ctx, op, dt, ndim, shape, sym, src, 2);
}

#define BINARY(fn, OP) kn_tensor *kn_##fn(kn_ctx *ctx, kn_tensor *a, kn_tensor *b) { return kn_binary(ctx, OP, a, b); }
BINARY(add, KN_OP_ADD) BINARY(sub, KN_OP_SUB) BINARY(mul, KN_OP_MUL) BINARY(div, KN_OP_DIV)
BINARY(pow, KN_OP_POW) BINARY(maximum, KN_OP_MAXIMUM) BINARY(minimum, KN_OP_MINIMUM)
BINARY(fmod, KN_OP_FMOD) BINARY(atan2, KN_OP_ATAN2) BINARY(eq, KN_OP_EQ) BINARY(ne, KN_OP_NE)
BINARY(lt, KN_OP_LT) BINARY(le, KN_OP_LE) BINARY(gt, KN_OP_GT) BINARY(ge, KN_OP_GE)
BINARY(logical_and, KN_OP_AND) BINARY(logical_or, KN_OP_OR)
#undef BINARY

kn_tensor *kn_binary_scalar(kn_ctx *ctx, kn_op op, kn_tensor *x, double s) {
    if (!x) return NULL;
    kn_dtype dt = kn_dtype_get(x->dtype)->is_float ? x->dtype : (s == floor(s) ? x->dtype : KN_F32);
    return kn_binary(ctx, op, x, kn_scalar(ctx, dt == KN_BOOL ? KN_F32 : dt, s));
}
kn_tensor *kn_add_scalar(kn_ctx *ctx, kn_tensor *x, double s) { return kn_binary_scalar(ctx, KN_OP_ADD, x, s); }
kn_tensor *kn_mul_scalar(kn_ctx *ctx, kn_tensor *x, double s) { return kn_binary_scalar(ctx, KN_OP_MUL, x, s); }
kn_tensor *kn_pow_scalar(kn_ctx *ctx, kn_tensor *x, double s) { return kn_binary_scalar(ctx, KN_OP_POW, x, s); }

/* ---- reductions -------------------------------------------------------------- */
static kn_tensor *reduce_p(kn_ctx *ctx, kn_op op, kn_tensor *x, int naxes, const int *axes, bool keepdim,
                           int correction, double p) {
    if (!x) return NULL;
    if (kn_op_get(op)->kind != KN_KIND_REDUCE)
        return kn__fail(ctx, KN_ERR_INVALID, "kn_reduce: %s is not a reduction", kn_op_name(op));
    if (kn_dtype_get(x->dtype)->is_quant)
        return kn__fail(ctx, KN_ERR_INVALID, "%s: dequantize %s first", kn_op_name(op), kn_dtype_name(x->dtype));
    uint32_t mask = 0;
    if (naxes == 0) mask = x->ndim ? (1u << x->ndim) - 1 : 0;
    for (int i = 0; i < naxes; i++) {
        bool ok = true;
        int d = kn__norm_dim(ctx, kn_op_name(op), axes[i], x->ndim, &ok);
        if (!ok) return NULL;
        if (x->ndim == 0) continue;
        if (mask & (1u << d)) return kn__fail(ctx, KN_ERR_INVALID, "%s: axis %d given twice", kn_op_name(op), d);
        mask |= 1u << d;
    }
    if ((op == KN_OP_ARGMAX || op == KN_OP_ARGMIN || op == KN_OP_MAX || op == KN_OP_MIN) && x->ndim) {
        for (int i = 0; i < x->ndim; i++)
            if ((mask >> i & 1) && x->shape[i] == 0)
                return kn__fail(ctx, KN_ERR_INVALID, "%s: cannot reduce over empty dim %d (no identity)", kn_op_name(op), i);
    }
    int64_t shape[KN_MAX_DIMS]; int8_t sym[KN_MAX_DIMS]; int n = 0;
    for (int i = 0; i < x->ndim; i++) {
        if (mask >> i & 1) { if (keepdim) { shape[n] = 1; sym[n++] = 0; } }
        else { shape[n] = x->shape[i]; sym[n++] = x->sym[i]; }
    }
    kn_dtype dt = x->dtype;
    if (op == KN_OP_ARGMAX || op == KN_OP_ARGMIN) dt = KN_I64;
    else if (op == KN_OP_ALL || op == KN_OP_ANY) dt = KN_BOOL;
    else if (!kn_dtype_get(dt)->is_float) {
        if (op == KN_OP_SUM || op == KN_OP_PROD) dt = KN_I64;   /* torch sums ints to int64 */
        else if (op != KN_OP_MAX && op != KN_OP_MIN) dt = KN_F32;
    }
    kn_tensor *t = kn__node(ctx, op, dt, n, shape, sym, &x, 1);
    if (t) { t->p.reduce.axes = mask; t->p.reduce.keepdim = keepdim; t->p.reduce.correction = correction; t->p.reduce.p = p; }
    return t;
}

kn_tensor *kn_reduce(kn_ctx *ctx, kn_op op, kn_tensor *x, int naxes, const int *axes, bool keepdim) {
    return reduce_p(ctx, op, x, naxes, axes, keepdim, 1, 2);
}
#define RED(fn, OP) kn_tensor *kn_##fn(kn_ctx *ctx, kn_tensor *x, int naxes, const int *axes, bool keepdim) { \
        return reduce_p(ctx, OP, x, naxes, axes, keepdim, 0, 2); }
RED(sum, KN_OP_SUM) RED(mean, KN_OP_MEAN) RED(prod, KN_OP_PROD) RED(max, KN_OP_MAX) RED(min, KN_OP_MIN)
RED(logsumexp, KN_OP_LOGSUMEXP) RED(all, KN_OP_ALL) RED(any, KN_OP_ANY)
#undef RED
kn_tensor *kn_argmax(kn_ctx *ctx, kn_tensor *x, int dim, bool keepdim) { return reduce_p(ctx, KN_OP_ARGMAX, x, 1, &dim, keepdim, 0, 0); }
kn_tensor *kn_argmin(kn_ctx *ctx, kn_tensor *x, int dim, bool keepdim) { return reduce_p(ctx, KN_OP_ARGMIN, x, 1, &dim, keepdim, 0, 0); }
kn_tensor *kn_var(kn_ctx *ctx, kn_tensor *x, int naxes, const int *axes, int correction, bool keepdim) {
    return reduce_p(ctx, KN_OP_VAR, x, naxes, axes, keepdim, correction, 0);
}
kn_tensor *kn_std(kn_ctx *ctx, kn_tensor *x, int naxes, const int *axes, int correction, bool keepdim) {
    return reduce_p(ctx, KN_OP_STD, x, naxes, axes, keepdim, correction, 0);
}
kn_tensor *kn_norm(kn_ctx *ctx, kn_tensor *x, double p, int naxes, const int *axes, bool keepdim) {
    if (!(p > 0)) return kn__fail(ctx, KN_ERR_INVALID, "norm: p = %g must be > 0 (inf allowed)", p);
    return reduce_p(ctx, KN_OP_NORM, x, naxes, axes, keepdim, 0, p);
}
kn_tensor *kn_sum_all(kn_ctx *ctx, kn_tensor *x) { return kn_sum(ctx, x, 0, NULL, false); }
kn_tensor *kn_mean_all(kn_ctx *ctx, kn_tensor *x) { return kn_mean(ctx, x, 0, NULL, false); }

static kn_tensor *scan(kn_ctx *ctx, kn_op op, kn_tensor *x, int dim) {
    if (!x) return NULL;
    bool ok = true;
    int d = kn__norm_dim(ctx, kn_op_name(op), dim, x->ndim, &ok);
    if (!ok) return NULL;
    kn_dtype dt = kn_dtype_get(x->dtype)->is_float ? x->dtype : KN_I64;
    kn_tensor *t = kn__node(ctx, op, dt, x->ndim, x->shape, x->sym, &x, 1);
    if (t) t->p.scan.dim = d;
    return t;
}
kn_tensor *kn_cumsum(kn_ctx *ctx, kn_tensor *x, int dim) { return scan(ctx, KN_OP_CUMSUM, x, dim); }
kn_tensor *kn_cumprod(kn_ctx *ctx, kn_tensor *x, int dim) { return scan(ctx, KN_OP_CUMPROD, x, dim); }

/* ---- matmul --------------------------------------------------------------------
 * MATMUL nodes always have a >= 2-d a [..., M, K] and b [..., K, N] whose
 * batch dims broadcast; 1-d operands are unsqueezed here and the result
 * squeezed, as numpy does. */
kn_tensor *kn_matmul(kn_ctx *ctx, kn_tensor *a, kn_tensor *b) {
    if (!a || !b) return NULL;
    char s1[160], s2[160];
    if (a->ndim == 0 || b->ndim == 0)
        return kn__fail(ctx, KN_ERR_INVALID, "matmul: operands must be at least 1-d, got %s and %s",
                        kn__shape_str(a, s1, sizeof s1), kn__shape_str(b, s2, sizeof s2));
    /* b may be a quantized weight (GGUF blocks used in place); a must be float */
    bool bq = kn_dtype_get(b->dtype)->is_quant;
    if (!kn_dtype_get(a->dtype)->is_float || !(kn_dtype_get(b->dtype)->is_float || bq))
        return kn__fail(ctx, KN_ERR_INVALID, "matmul: needs float operands (or a quantized right operand), got %s and %s",
                        kn_dtype_name(a->dtype), kn_dtype_name(b->dtype));
    kn_tensor *A = a->ndim == 1 ? kn_unsqueeze(ctx, a, 0) : a;
    kn_tensor *B = b->ndim == 1 ? kn_unsqueeze(ctx, b, 1) : b;
    if (!A || !B) return NULL;
    int64_t K = A->shape[A->ndim - 1];
    if (K != B->shape[B->ndim - 2] || A->sym[A->ndim - 1] != B->sym[B->ndim - 2])
        return kn__fail(ctx, KN_ERR_INVALID, "matmul: inner dims differ: %s @ %s (%lld vs %lld)",
                        kn__shape_str(a, s1, sizeof s1), kn__shape_str(b, s2, sizeof s2),
                        (long long)K, (long long)B->shape[B->ndim - 2]);
    /* broadcast batch dims */
    int na = A->ndim - 2, nb = B->ndim - 2, n = na > nb ? na : nb;
    int64_t shape[KN_MAX_DIMS]; int8_t sym[KN_MAX_DIMS];
    for (int i = 0; i < n; i++) {
        int ia = i - (n - na), ib = i - (n - nb);
        int64_t da = ia >= 0 ? A->shape[ia] : 1, db = ib >= 0 ? B->shape[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return kn__fail(ctx, KN_ERR_INVALID, "matmul: batch dims of %s and %s do not broadcast",
                            kn__shape_str(a, s1, sizeof s1), kn__shape_str(b, s2, sizeof s2));
        shape[i] = da == 1 ? db : da; sym[i] = 0;
    }
    shape[n] = A->shape[A->ndim - 2]; sym[n] = A->sym[A->ndim - 2];
    shape[n + 1] = B->shape[B->ndim - 1]; sym[n + 1] = B->sym[B->ndim - 1];
    kn_tensor *src[2] = {A, B};
    kn_tensor *t = kn__node(ctx, KN_OP_MATMUL, bq ? a->dtype : kn__promote(a->dtype, b->dtype), n + 2, shape, sym, src, 2);
    if (!t) return NULL;
    if (a->ndim == 1) t = kn_squeeze(ctx, t, -2);
    if (b->ndim == 1) t = kn_squeeze(ctx, t, -1);
    return t;
}

kn_tensor *kn_bmm(kn_ctx *ctx, kn_tensor *a, kn_tensor *b) {
    if (!a || !b) return NULL;
    if (a->ndim != 3 || b->ndim != 3 || a->shape[0] != b->shape[0]) {
        char s1[160], s2[160];
        return kn__fail(ctx, KN_ERR_INVALID, "bmm: expects [B,M,K] @ [B,K,N], got %s and %s",
                        kn__shape_str(a, s1, sizeof s1), kn__shape_str(b, s2, sizeof s2));
    }
    return kn_matmul(ctx, a, b);
}

kn_tensor *kn_outer(kn_ctx *ctx, kn_tensor *a, kn_tensor *b) {
    if (!a || !b) return NULL;
    if (a->ndim != 1 || b->ndim != 1) return kn__fail(ctx, KN_ERR_INVALID, "outer: expects two 1-d tensors");
    return kn_mul(ctx, kn_unsqueeze(ctx, a, 1), kn_unsqueeze(ctx, b, 0));
}

kn_tensor *kn_linear(kn_ctx *ctx, kn_tensor *x, kn_tensor *w, kn_tensor *b) {
    if (!x || !w) return NULL;
    if (w->ndim != 2) return kn__fail(ctx, KN_ERR_INVALID, "linear: weight must be [out, in], got %d-d", w->ndim);
    kn_tensor *y = kn_matmul(ctx, x, kn_transpose(ctx, w, 0, 1));
    return b ? kn_add(ctx, y, b) : y;
}
