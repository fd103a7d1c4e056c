/* ops_copy.c: contiguous/copy/cast, where/masked_fill, triu/tril, and the
 * side-effect ops assign and index_copy. (cat, pad, gather, scatter and the
 * index ops are in ops_index.c.) */
#include "graph/graph.h"
#include <string.h>

kn_tensor *kn_copy(kn_ctx *ctx, kn_tensor *x) {
    if (!x) return NULL;
    return kn__node(ctx, KN_OP_COPY, x->dtype, x->ndim, x->shape, x->sym, &x, 1);
}
kn_tensor *kn_contiguous(kn_ctx *ctx, kn_tensor *x) {
    if (!x) return NULL;
    bool padded = false;       /* a symbolic dim below an inner one leaves gaps */
    for (int i = 1; i < x->ndim; i++) if (x->sym[i]) padded = true;
    return (kn_is_contiguous(x) && !padded) ? x : kn_copy(ctx, x);
}
/* Does dtype w hold every value of dtype n exactly? */
static bool widens_exactly(kn_dtype n, kn_dtype w) {
    if (w == KN_F64) return n == KN_F32 || n == KN_F16 || n == KN_BF16;
    if (w == KN_F32) return n == KN_F16 || n == KN_BF16;
    return false;
}

kn_tensor *kn_cast(kn_ctx *ctx, kn_tensor *x, kn_dtype dt) {
    if (!x) return NULL;
    if (!kn_dtype_get(dt)) return kn__fail(ctx, KN_ERR_INVALID, "cast: unknown dtype %d", (int)dt);
    if (dt == x->dtype) return x;
    /* cast(cast(y, w), dtype of y) with w exact for y's values is y, forward
     * and backward (both casts' gradients are casts of the same pair).
     * Mixed precision makes these at every module seam: a bf16 attention
     * output widened to f32 for the graph and narrowed again by the next
     * Linear, and the same pair in reverse in the backward. Folded here, at
     * construction, because the plan's rewrites may not remove the outer
     * cast once other nodes view it (a weight gradient reads it reshaped). */
    if (x->op == KN_OP_CAST && !(x->flags & KN_FLAG_VIEW) && x->src[0] && x->src[0]->dtype == dt &&
        widens_exactly(dt, x->dtype))
        return x->src[0];
    return kn__node(ctx, KN_OP_CAST, dt, x->ndim, x->shape, x->sym, &x, 1);
}

kn_tensor *kn_where(kn_ctx *ctx, kn_tensor *c, kn_tensor *a, kn_tensor *b) {
    if (!c || !a || !b) return NULL;
    int n1, n2; int64_t s1[KN_MAX_DIMS], s2[KN_MAX_DIMS]; int8_t y1[KN_MAX_DIMS], y2[KN_MAX_DIMS];
    if (!kn__broadcast_shape(ctx, "where", a, b, &n1, s1, y1)) return NULL;
    /* broadcast cond against the a/b result through a scratch descriptor */
    kn_tensor tmp; memset(&tmp, 0, sizeof tmp);
    tmp.ctx = ctx; tmp.ndim = n1; memcpy(tmp.shape, s1, sizeof s1); memcpy(tmp.sym, y1, sizeof y1);
    if (!kn__broadcast_shape(ctx, "where", c, &tmp, &n2, s2, y2)) return NULL;
    kn_tensor *src[3] = {c, a, b};
    return kn__node(ctx, KN_OP_WHERE, kn__promote(a->dtype, b->dtype), n2, s2, y2, src, 3);
}

kn_tensor *kn_masked_fill(kn_ctx *ctx, kn_tensor *x, kn_tensor *mask, double value) {
    if (!x || !mask) return NULL;
    return kn_where(ctx, mask, kn_scalar(ctx, x->dtype, value), x);
}

static kn_tensor *tri(kn_ctx *ctx, kn_tensor *x, int64_t k, bool upper) {
    if (!x) return NULL;
    if (x->ndim < 2) return kn__fail(ctx, KN_ERR_INVALID, "%s: needs at least 2 dims, got %d", upper ? "triu" : "tril", x->ndim);
    kn_tensor *t = kn__node(ctx, KN_OP_TRI, x->dtype, x->ndim, x->shape, x->sym, &x, 1);
    if (t) { t->p.tri.k = k; t->p.tri.upper = upper; }
    return t;
}
kn_tensor *kn_triu(kn_ctx *ctx, kn_tensor *x, int64_t k) { return tri(ctx, x, k, true); }
kn_tensor *kn_tril(kn_ctx *ctx, kn_tensor *x, int64_t k) { return tri(ctx, x, k, false); }

/* dst must have storage of its own (a leaf: data, input, parameter) or be a
 * view of one: effects write into memory that outlives the plan. */
static bool writable(kn_ctx *ctx, const char *op, kn_tensor *dst) {
    kn_tensor *own = kn__storage_owner(dst);
    if (own->op != KN_OP_NONE) {
        kn__fail(ctx, KN_ERR_INVALID, "%s: the destination must be a materialised tensor (data, input or parameter) or a view of one; got a %s node",
                 op, kn_op_name(own->op));
        return false;
    }
    return true;
}

kn_tensor *kn_assign(kn_ctx *ctx, kn_tensor *dst, kn_tensor *src) {
    if (!dst || !src) return NULL;
    if (!writable(ctx, "assign", dst)) return NULL;
    int n; int64_t s[KN_MAX_DIMS]; int8_t y[KN_MAX_DIMS];
    if (!kn__broadcast_shape(ctx, "assign", dst, src, &n, s, y)) return NULL;
    if (n != dst->ndim || memcmp(s, dst->shape, sizeof(int64_t) * (size_t)n)) {
        char a[160], b[160];
        return kn__fail(ctx, KN_ERR_INVALID, "assign: value %s does not broadcast to the destination %s",
                        kn__shape_str(src, b, sizeof b), kn__shape_str(dst, a, sizeof a));
    }
    kn_tensor *t = kn__view_node(ctx, KN_OP_ASSIGN, dst, dst->ndim, dst->shape, dst->stride, dst->offset, dst->sym);
    if (!t) return NULL;
    t->src[1] = src;
    t->flags &= ~(uint32_t)KN_FLAG_REQUIRES_GRAD;
    return t;
}
