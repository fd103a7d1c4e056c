/* rewrite_fold.c: the graph rewrites that need a node the graph does not
 * have (docs/COMPILER.md, "Graph rewrites"); rewrite.c runs them in its
 * passes after its own rules, on the nodes it may remove.
 *
 *   int zero      x*0, 0*x, x-x whose result is an integer or bool: a zero
 *                 fill of the result's dtype and shape. Never floats:
 *                 NaN*0, inf*0 and inf-inf are NaN.
 *   idempotent    max(x,x), min(x,x) on integers read x; logical_and(x,x),
 *                 logical_or(x,x) read x when x is the (0/1) result of a
 *                 comparison or logical op. Not floats: maximum returns its
 *                 canonical NaN for a NaN operand (the op table's
 *                 expression), while x may hold a NaN of another sign or
 *                 payload (x86's 0/0 is negative).
 *   const fold    an elementwise op all of whose operands are constants
 *                 (fills, or views of fills: broadcast constants) is a fill
 *                 of the value the backends compute, only for ops and
 *                 dtypes where every backend's rounding gives the same bits
 *                 (see fold_value).
 *   sum expand    sum over axes along which its operand repeats (stride 0,
 *                 as expand makes them) is operand * n, for 8/32-bit
 *                 integer operands only (see sum_expand).
 *
 * Made nodes: kn__node in the graph's context, no sources from the user's
 * graph other than ones the replaced node read (so the graph only gains
 * nodes none of its own nodes reference), no requires_grad flag. A made node
 * goes into the schedule right before the node it replaces (rewrite.c,
 * insert_made), so it runs when that node ran and before all its readers. */
#include "compile/rewrite_impl.h"
#include "graph/scalar_ops.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- making nodes ---- */

/* rep and fl cover every id of the context again; false when out of memory */
static bool grow(rw *w) {
    int32_t n = w->ctx->n_all;
    if (n <= w->n_ids) return true;
    kn_tensor **r = realloc(*w->rep, sizeof *r * (size_t)n);
    if (!r) return false;
    *w->rep = r;
    uint8_t *f = realloc(w->fl, (size_t)n);
    if (!f) return false;
    w->fl = f;
    memset(r + w->n_ids, 0, sizeof *r * (size_t)(n - w->n_ids));
    memset(f + w->n_ids, 0, (size_t)(n - w->n_ids));
    w->n_ids = n;
    return true;
}

/* records t as made at schedule position pos */
static kn_tensor *made(rw *w, kn_tensor *t, int pos, bool *oom) {
    if (!t || !grow(w)) { *oom = true; return NULL; }
    t->flags &= ~(uint32_t)KN_FLAG_REQUIRES_GRAD;
    if (w->nmade == w->capmade) {
        int cap = w->capmade ? 2 * w->capmade : 16;
        kn_tensor **m = realloc(w->made, sizeof *m * (size_t)cap);
        if (m) w->made = m;
        int *a = realloc(w->made_at, sizeof *a * (size_t)cap);
        if (a) w->made_at = a;
        if (!m || !a) { *oom = true; return NULL; }
        w->capmade = cap;
    }
    if (t->view_src) w->fl[t->view_src->id] |= F_ALIASED;
    w->made[w->nmade] = t;
    w->made_at[w->nmade++] = pos;
    return t;
}

/* A fill of dtype dt and t's shape (0-d when t is NULL) holding v (already
 * rounded to dt). A fill made earlier at or before pos with the same dtype,
 * shape and value bits is reused (it runs before anything at pos). */
static kn_tensor *make_fill(rw *w, kn_dtype dt, const kn_tensor *t, double v, int pos, bool *oom) {
    kn_tensor s0 = {0};
    if (!t) t = &s0;
    for (int k = 0; k < w->nmade; k++) {
        kn_tensor *f = w->made[k];
        if (f->op == KN_OP_FILL && w->made_at[k] <= pos && f->dtype == dt && kn__rw_same_shape(f, t) &&
            memcmp(&f->p.scalar.a, &v, sizeof v) == 0)
            return f;
    }
    kn_tensor *f = kn__node(w->ctx, KN_OP_FILL, dt, t->ndim, t->shape, t->sym, NULL, 0);
    if (f) f->p.scalar.a = v;
    return made(w, f, pos, oom);
}

/* ---- constants ---- */

/* v as dtype dt stores it (kn_store: round to nearest even, integers
 * truncated and saturated), read back as a double */
static double stored(kn_dtype dt, double v) {
    unsigned char b[16];
    kn_store(dt, b, 0, v);
    return kn_load(dt, b, 0);
}

/* c holds one value everywhere: a fill, or a view of a fill (broadcast
 * constants are expand(fill)), whose storage no effect of the plan writes.
 * *v is the value as c's dtype stores it. */
static bool const_value(const rw *w, kn_tensor *c, double *v) {
    if (!c) return false;
    kn_tensor *o = kn__rw_kind(c) == KN_KIND_VIEW ? kn__storage_owner(c) : c;
    if (o->op != KN_OP_FILL || o->dtype != c->dtype || kn__rw_written(w, o)) return false;
    const kn_dtype_info *d = kn_dtype_get(o->dtype);
    if (!d || d->is_quant) return false;
    *v = stored(o->dtype, o->p.scalar.a);
    return true;
}

static bool is_intlike(kn_dtype dt) { const kn_dtype_info *d = kn_dtype_get(dt); return d->is_int || dt == KN_BOOL; }

/* ---- int zero ---- */
static kn_tensor *int_zero(rw *w, kn_tensor *t, int pos, bool *oom) {
    if (!is_intlike(t->dtype)) return NULL;
    kn_tensor *a = kn__rw_srcof(w, t, 0), *b = kn__rw_srcof(w, t, 1);
    if (!a || !b) return NULL;
    double v;
    bool zero = false;
    if (t->op == KN_OP_MUL) zero = (const_value(w, a, &v) && v == 0) || (const_value(w, b, &v) && v == 0);
    else if (t->op == KN_OP_SUB) zero = a == b && is_intlike(a->dtype);
    return zero ? make_fill(w, t->dtype, t, 0.0, pos, oom) : NULL;
}

/* ---- idempotent ---- */
static kn_tensor *idempotent(const rw *w, const kn_tensor *t) {
    kn_tensor *a = kn__rw_srcof(w, t, 0), *b = kn__rw_srcof(w, t, 1);
    if (!a || a != b) return NULL;
    if (t->op == KN_OP_MAXIMUM || t->op == KN_OP_MINIMUM) {
        if (!kn_dtype_get(t->dtype)->is_int) return NULL;
    } else if (t->op == KN_OP_AND || t->op == KN_OP_OR) {
        /* x must hold 0/1 only: the bool result of a comparison or logical op
         * (a bool leaf may hold any byte, which and/or would make 1) */
        kn_op_kind k = kn__rw_kind(a);
        if (a->dtype != KN_BOOL || (k != KN_KIND_UNARY && k != KN_KIND_BINARY) || kn_op_get(a->op)->out != KN_OUT_BOOL) return NULL;
    } else {
        return NULL;
    }
    return kn__rw_can_replace(w, t, a) ? a : NULL;
}

/* ---- constant folding ---- */

/* The value op(operands) that every backend stores, or false.
 * Ops: neg, abs, square, add, sub, mul, div, maximum, minimum, cast.
 * Floats: every operand must be exactly representable in the result's
 * dtype. Then the result of one of these ops computed in double and rounded
 * to the dtype equals the result computed in the dtype itself or in f32 (the
 * CPU and CUDA float kernels) then rounded: for + - * / the exact result
 * rounded to 53 or 24 bits and then to a format of at most p bits, with
 * 53, 24 >= 2p + 2, is the exact result rounded once (double rounding is
 * innocuous for these ops); neg, abs, maximum and minimum are exact. Other
 * ops (exp, sqrt, pow, ...) are computed by other algorithms in the float
 * kernels: never folded. Integers: the result must be an integer that the
 * dtype holds exactly (no saturation or wrap-around: backends differ there)
 * with every value within 2^53 (exact in double). Casts: only when the value
 * converts exactly (conversions of inexact values differ between paths, e.g.
 * f64 -> f16 directly or through f32). Bool results are not folded. */
static bool fold_value(const kn_tensor *t, const double *v, int nv, double *out) {
    kn_dtype od = t->dtype;
    const kn_dtype_info *d = kn_dtype_get(od);
    if (!d || d->is_quant || od == KN_BOOL) return false;
    for (int k = 0; k < nv; k++) {
        if (d->is_float) {
            if (!isnan(v[k]) && stored(od, v[k]) != v[k]) return false;
        } else if (v[k] != floor(v[k]) || fabs(v[k]) > 9007199254740992.0) {
            return false;
        }
    }
    double r;
    switch (t->op) {
    case KN_OP_NEG: case KN_OP_ABS: case KN_OP_SQUARE:
        r = kn_scalar_unary(t->op, v[0], t->p.scalar.a, t->p.scalar.b);
        break;
    case KN_OP_ADD: case KN_OP_SUB: case KN_OP_MUL: case KN_OP_DIV: case KN_OP_MAXIMUM: case KN_OP_MINIMUM:
        r = kn_scalar_binary(t->op, v[0], v[1]);
        break;
    case KN_OP_CAST:
        r = v[0];
        if (isnan(r) ? !d->is_float : stored(od, r) != r) return false;
        break;
    default:
        return false;
    }
    if (!d->is_float && (isnan(r) || r != floor(r) || fabs(r) > 9007199254740992.0 || stored(od, r) != r)) return false;
    *out = stored(od, r);
    return true;
}

static kn_tensor *const_fold(rw *w, kn_tensor *t, int pos, bool *oom) {
    kn_op_kind k = kn__rw_kind(t);
    if (k != KN_KIND_UNARY && k != KN_KIND_BINARY && t->op != KN_OP_CAST) return NULL;
    int nv = k == KN_KIND_BINARY ? 2 : 1;
    double v[2], r;
    for (int i = 0; i < nv; i++)
        if (!const_value(w, kn__rw_srcof(w, t, i), &v[i])) return NULL;
    if (!fold_value(t, v, nv, &r)) return NULL;
    return make_fill(w, t->dtype, t, r, pos, oom);
}

/* ---- sum over repeated axes ----
 * sum(y, axes) where y has stride 0 (or extent 1) along every summed axis,
 * and n = the product of their extents >= 2: y's values repeat n times, so
 * the sum is the view of y without those axes (extent 1, stride 0 where
 * keepdim keeps them) times n: one read of each value instead of n. When y
 * is a constant (a fill, or a view of one: any layout) the sum is the fill
 * v*n.
 * Integers only: the sum of n equal floats, accumulated in the backend's
 * order (a running f32 sum, vector lanes, a tree; an accumulator starting at
 * +0.0 turns -0.0 into +0.0) is not x*n rounded once in general, so floats
 * are never rewritten. For 8- and 32-bit integer y (and bool) with
 * n <= 2^21 every partial sum is below 2^53: exact whether a backend adds in
 * double or int64, and x*n (int64 out, as sum's) is exact too. 64-bit
 * integers are left alone (their values are not exact in double). A summed
 * axis of symbolic extent is never rewritten (n would change with the
 * symbol). */
static kn_tensor *sum_expand(rw *w, kn_tensor *t, int pos, bool *oom) {
    if (t->op != KN_OP_SUM) return NULL;
    kn_tensor *y = kn__rw_srcof(w, t, 0);
    if (!y || kn__rw_written(w, y)) return NULL;
    kn_dtype yd = y->dtype;
    if (yd != KN_I8 && yd != KN_U8 && yd != KN_I32 && yd != KN_BOOL) return NULL;
    if (t->dtype != KN_I64) return NULL;
    double v;
    bool cst = const_value(w, y, &v);   /* a fill or a broadcast one: the sum is a constant too */
    if (!cst && kn__rw_kind(y) != KN_KIND_VIEW) return NULL;
    uint32_t axes = t->p.reduce.axes;
    bool keep = t->p.reduce.keepdim;
    int64_t n = 1, shape[KN_MAX_DIMS], stride[KN_MAX_DIMS];
    int8_t sym[KN_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < y->ndim; i++) {
        if (axes >> i & 1) {
            if (y->sym[i] || (!cst && y->stride[i] != 0 && y->shape[i] != 1)) return NULL;
            n *= y->shape[i];
            if (n > (1 << 21)) return NULL;
            if (keep) { shape[nd] = 1; stride[nd] = 0; sym[nd++] = 0; }
        } else {
            shape[nd] = y->shape[i]; stride[nd] = y->stride[i]; sym[nd++] = y->sym[i];
        }
    }
    if (n < 2 || nd != t->ndim) return NULL;
    if (cst)
        return fabs(v * (double)n) <= 9007199254740992.0 ? make_fill(w, t->dtype, t, v * (double)n, pos, oom) : NULL;
    kn_tensor *x = made(w, kn__view_node(w->ctx, KN_OP_AS_STRIDED, y, nd, shape, stride, y->offset, sym), pos, oom);
    if (!x) return NULL;
    kn_tensor *c = make_fill(w, KN_I64, NULL, (double)n, pos, oom);
    if (!c) return NULL;
    kn_tensor *src[2] = {x, c};
    return made(w, kn__node(w->ctx, KN_OP_MUL, KN_I64, t->ndim, t->shape, t->sym, src, 2), pos, oom);
}

kn_tensor *kn__rw_fold(rw *w, kn_tensor *t, int pos, kn_rw_rule *rule, bool *oom) {
    kn_tensor *to;
    if ((to = int_zero(w, t, pos, oom))) *rule = KN_RW_INT_ZERO;
    else if (*oom) return NULL;
    else if ((to = idempotent(w, t))) *rule = KN_RW_IDEMPOTENT;
    else if ((to = const_fold(w, t, pos, oom))) *rule = KN_RW_CONST_FOLD;
    else if (*oom) return NULL;
    else if ((to = sum_expand(w, t, pos, oom))) *rule = KN_RW_SUM_EXPAND;
    return to;
}
