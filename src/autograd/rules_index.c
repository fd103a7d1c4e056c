/* rules_index.c: gradient rules of cat, pad, gather, scatter and the index ops.
 *
 * Same contract as rules.c: x = src[0], g = gradient of the node's output,
 * gin[k] = gradient for src[k] (index sources get none). Every rule is built
 * from the family's own lazy ops: what a gather reads, a scatter_add writes
 * back, and the reverse. index_copy is a side effect: not differentiable.
 */
#include "autograd/autograd.h"
#include <stdlib.h>

#define X (t->src[0])

/* cat: source k gets its slice of g along the cat dim. */
static void g_cat(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    int d = t->p.axis.dim;
    int64_t at = 0;
    for (int k = 0; k < KN_MAX_SRC && t->src[k]; k++) {
        int64_t len = t->src[k]->shape[d];
        if (t->src[k]->flags & KN_FLAG_REQUIRES_GRAD) gin[k] = kn_narrow(ctx, g, d, at, len);
        at += len;
    }
}

/* pad: constant mode is undone by padding g with the negated pads (crops what
 * was added, zero-fills what was cropped). Reflect/replicate send each output
 * element back to the source element it copied: one index_add per padded dim
 * (the modes are separable, so the dims can be undone one at a time). */
static void g_pad(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *x = X;
    const int64_t *pad = t->p.pad.pad;
    if (t->p.pad.mode == KN_PAD_CONSTANT) {
        int64_t neg[2 * KN_MAX_DIMS];
        for (int k = 0; k < 2 * x->ndim; k++) neg[k] = -pad[k];
        gin[0] = kn_pad(ctx, g, x->ndim, neg, KN_PAD_CONSTANT, 0);
        return;
    }
    bool reflect = t->p.pad.mode == KN_PAD_REFLECT;
    kn_tensor *cur = g;
    for (int d = 0; d < x->ndim && cur; d++) {
        int k = x->ndim - 1 - d;
        int64_t lo = pad[2 * k], hi = pad[2 * k + 1], m = x->shape[d], nout = m + lo + hi;
        if (!lo && !hi) continue;
        int64_t *map = malloc(sizeof(int64_t) * (size_t)(nout ? nout : 1));
        if (!map) { kn__fail(ctx, KN_ERR_NOMEM, "pad backward: out of memory"); return; }
        for (int64_t i = 0; i < nout; i++) {
            int64_t j = i - lo;
            if (j < 0) j = reflect ? -j : 0;
            else if (j >= m) j = reflect ? 2 * (m - 1) - j : m - 1;
            map[i] = j;
        }
        kn_tensor *idx = kn_from_data(ctx, KN_I64, 1, &nout, map);
        free(map);
        /* zeros of cur's shape with dim d back to m: x's zeros, still padded
         * along the dims after d (built from x so symbolic dims carry over) */
        int64_t rest[2 * KN_MAX_DIMS] = {0};
        bool any = false;
        for (int e = d + 1; e < x->ndim; e++) {
            int q = x->ndim - 1 - e;
            rest[2 * q] = pad[2 * q]; rest[2 * q + 1] = pad[2 * q + 1];
            any = any || pad[2 * q] || pad[2 * q + 1];
        }
        kn_tensor *z = kn_zeros_like(ctx, x);
        if (any) z = kn_pad(ctx, z, x->ndim, rest, KN_PAD_CONSTANT, 0);
        cur = kn_index_add(ctx, z, d, idx, cur);
    }
    gin[0] = cur;
}

/* The gradient of src in scatter(_add): g read back at the index positions,
 * zero-padded where src is larger than index. */
static kn_tensor *scatter_src_grad(kn_ctx *ctx, kn_tensor *t, kn_tensor *g) {
    kn_tensor *idx = t->src[1], *src = t->src[2];
    kn_tensor *gg = kn_gather(ctx, g, t->p.axis.dim, idx);
    if (!gg || kn_same_shape(gg, src)) return gg;
    int64_t pads[2 * KN_MAX_DIMS] = {0};
    for (int k = 0; k < src->ndim; k++) pads[2 * (src->ndim - 1 - k) + 1] = src->shape[k] - idx->shape[k];
    return kn_pad(ctx, gg, src->ndim, pads, KN_PAD_CONSTANT, 0);
}

static void g_gather(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    gin[0] = kn_scatter_add(ctx, kn_zeros_like(ctx, X), t->p.axis.dim, t->src[1], g);
}

/* scatter: the overwritten positions of x get no gradient. With repeated
 * indices every src element gets g at its target (torch does the same). */
static void g_scatter(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *idx = t->src[1];
    if (X->flags & KN_FLAG_REQUIRES_GRAD)
        gin[0] = kn_scatter(ctx, g, t->p.axis.dim, idx, kn_zeros(ctx, g->dtype, idx->ndim, idx->shape));
    if (t->src[2]->flags & KN_FLAG_REQUIRES_GRAD) gin[2] = scatter_src_grad(ctx, t, g);
}

static void g_scatter_add(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    gin[0] = g;
    if (t->src[2]->flags & KN_FLAG_REQUIRES_GRAD) gin[2] = scatter_src_grad(ctx, t, g);
}

static void g_index_select(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    gin[0] = kn_index_add(ctx, kn_zeros_like(ctx, X), t->p.axis.dim, t->src[1], g);
}

static void g_index_add(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    gin[0] = g;
    if (t->src[2]->flags & KN_FLAG_REQUIRES_GRAD) gin[2] = kn_index_select(ctx, g, t->p.axis.dim, t->src[1]);
}

kn_grad_rule kn__grad_rule_index(kn_op op) {
    switch (op) {
    case KN_OP_CAT: return g_cat;
    case KN_OP_PAD: return g_pad;
    case KN_OP_GATHER: return g_gather;
    case KN_OP_SCATTER: return g_scatter;
    case KN_OP_SCATTER_ADD: return g_scatter_add;
    case KN_OP_INDEX_SELECT: return g_index_select;
    case KN_OP_INDEX_ADD: return g_index_add;
    default: return NULL;
    }
}
