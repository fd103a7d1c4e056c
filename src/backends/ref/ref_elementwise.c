/* ref_elementwise.c: creation, copies/casts, unary and binary math. */
#include "backends/ref/ref.h"
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

/* ---- unary ---- */
static double gelu_erf(double x) { return 0.5 * x * (1.0 + erf(x / sqrt(2.0))); }
static double gelu_tanh(double x) { return 0.5 * x * (1.0 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
static double softplus(double x) { return x > 20 ? x : log1p(exp(x)); }   /* torch's threshold 20 */
static double sigmoid(double x) { return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x)); }

double kn_ref_unary_fn(kn_op op, double x, double a, double b) {
    switch (op) {
    case KN_OP_NEG: return -x;
    case KN_OP_ABS: return fabs(x);
    case KN_OP_SIGN: return x > 0 ? 1.0 : x < 0 ? -1.0 : x == 0 ? 0.0 : x;
    case KN_OP_EXP: return exp(x);
    case KN_OP_EXP2: return exp2(x);
    case KN_OP_LOG: return log(x);
    case KN_OP_LOG2: return log2(x);
    case KN_OP_LOG1P: return log1p(x);
    case KN_OP_EXPM1: return expm1(x);
    case KN_OP_SQRT: return sqrt(x);
    case KN_OP_RSQRT: return 1.0 / sqrt(x);
    case KN_OP_RECIPROCAL: return 1.0 / x;
    case KN_OP_SQUARE: return x * x;
    case KN_OP_SIN: return sin(x);
    case KN_OP_COS: return cos(x);
    case KN_OP_TAN: return tan(x);
    case KN_OP_ASIN: return asin(x);
    case KN_OP_ACOS: return acos(x);
    case KN_OP_ATAN: return atan(x);
    case KN_OP_SINH: return sinh(x);
    case KN_OP_COSH: return cosh(x);
    case KN_OP_TANH: return tanh(x);
    case KN_OP_ASINH: return asinh(x);
    case KN_OP_ACOSH: return acosh(x);
    case KN_OP_ATANH: return atanh(x);
    case KN_OP_ERF: return erf(x);
    case KN_OP_FLOOR: return floor(x);
    case KN_OP_CEIL: return ceil(x);
    case KN_OP_ROUND: return nearbyint(x);          /* half to even, like torch.round */
    case KN_OP_TRUNC: return trunc(x);
    case KN_OP_CLAMP: return isnan(x) ? x : x < a ? a : x > b ? b : x;
    case KN_OP_NOT: return x == 0 ? 1.0 : 0.0;
    case KN_OP_RELU: return x > 0 ? x : (isnan(x) ? x : 0.0);
    case KN_OP_LEAKY_RELU: return x > 0 ? x : a * x;
    case KN_OP_ELU: return x > 0 ? x : a * expm1(x);
    case KN_OP_SELU: return 1.0507009873554804934193349852946 *
                            (x > 0 ? x : 1.6732632423543772848170429916717 * expm1(x));
    case KN_OP_GELU: return gelu_erf(x);
    case KN_OP_GELU_TANH: return gelu_tanh(x);
    case KN_OP_GELU_TANH_GRAD: {          /* 0.5 (1 + tanh u) + 0.5 x (1 - tanh^2 u) u', u = c (x + k x^3) */
        double t = tanh(0.7978845608028654 * (x + 0.044715 * x * x * x));
        return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * x * x);
    }
    case KN_OP_SILU: return x * sigmoid(x);
    case KN_OP_SIGMOID: return sigmoid(x);
    case KN_OP_SOFTPLUS: return softplus(x);
    case KN_OP_MISH: return x * tanh(softplus(x));
    case KN_OP_HARDTANH: return x < a ? a : x > b ? b : x;
    case KN_OP_HARDSIGMOID: return x <= -3 ? 0.0 : x >= 3 ? 1.0 : x / 6.0 + 0.5;
    default: return NAN;
    }
}

kn_status kn_ref_unary(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *d = &e->dst, *s = &e->src[0];
    int64_t n = kn_tview_numel(d);
    for (int64_t i = 0; i < n; i++)
        ST(d, kn_ref_off(d, i), kn_ref_unary_fn(t->op, LD(s, kn_ref_off(s, i)), t->p.scalar.a, t->p.scalar.b));
    return KN_OK;
}

/* ---- binary ---- */
double kn_ref_binary_fn(kn_op op, double x, double y) {
    switch (op) {
    case KN_OP_ADD: return x + y;
    case KN_OP_SUB: return x - y;
    case KN_OP_MUL: return x * y;
    case KN_OP_DIV: return x / y;
    case KN_OP_POW: return pow(x, y);
    case KN_OP_MAXIMUM: return (isnan(x) || isnan(y)) ? NAN : x > y ? x : y;   /* NaN propagates, as in torch */
    case KN_OP_MINIMUM: return (isnan(x) || isnan(y)) ? NAN : x < y ? x : y;
    case KN_OP_FMOD: return fmod(x, y);
    case KN_OP_ATAN2: return atan2(x, y);
    case KN_OP_EQ: return x == y;
    case KN_OP_NE: return x != y;
    case KN_OP_LT: return x < y;
    case KN_OP_LE: return x <= y;
    case KN_OP_GT: return x > y;
    case KN_OP_GE: return x >= y;
    case KN_OP_AND: return (x != 0) && (y != 0);
    case KN_OP_OR: return (x != 0) || (y != 0);
    default: return NAN;
    }
}

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
        ST(d, kn_ref_off(d, i), kn_ref_binary_fn(t->op, x, y));
    }
    return KN_OK;
}
