/* rules_nn.c: gradient rules of the nn ops (softmax, norms, conv, pool, sdpa, rope).
 *
 * Same contract as rules.c: fill gin[k] for src k from the node t and its
 * output gradient g, with ordinary lazy ops. Norm rules recompute the
 * statistics from x and use the closed forms, in one NORM_BWD node (lazy
 * ops where it does not apply); conv uses
 * conv_transpose2d / conv2d for the input and a CONV2D_BWD_W node for the
 * weight; poolings use their *_BWD nodes; sdpa makes one SDPA_BWD node
 * (or, over a symbolic batch, rebuilds the probabilities and applies the
 * matmul chain rule with the key/value heads expanded over each query
 * group); cross_entropy makes one CROSS_ENTROPY_BWD node for the logits
 * (the targets are class ids: no gradient). Gradient-only nodes
 * (CONV2D_BWD_W, *_POOL2D_BWD, SDPA_BWD, CROSS_ENTROPY_BWD, NORM_BWD) have no rule:
 * no second derivatives yet.
 */
#include "autograd/autograd.h"
#include "core/env.h"
#include <math.h>

#define X (t->src[0])

static bool rg(const kn_tensor *s) { return s && (s->flags & KN_FLAG_REQUIRES_GRAD); }

/* ---- softmax ---- */
static void g_softmax(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    int d = t->p.axis.dim;
    if (t->op == KN_OP_SOFTMAX) {        /* dx = y*g - y * sum(y*g) */
        kn_tensor *gy = kn_mul(ctx, g, t);
        gin[0] = kn_sub(ctx, gy, kn_mul(ctx, t, kn_sum(ctx, gy, 1, &d, true)));
    } else {                             /* dx = g - exp(y) * sum(g) */
        gin[0] = kn_sub(ctx, g, kn_mul(ctx, kn_exp(ctx, t), kn_sum(ctx, g, 1, &d, true)));
    }
}

/* ---- norms ----
 * xhat = (x - mean) * rstd over axes A (M elements each); with dxhat = g * w:
 * dx = rstd * (dxhat - mean_A(dxhat) - xhat * mean_A(dxhat * xhat)). */
typedef struct { kn_tensor *xhat, *rstd; } norm_stats;

/* var as mean((x - mean)^2), the two-pass form var computes: an elementwise
 * chain ending in a mean, which the compiler fuses into one row kernel (var
 * itself is a hand kernel) */
static norm_stats stats(kn_ctx *ctx, kn_tensor *x, int na, const int *axes, double eps) {
    norm_stats s;
    kn_tensor *xc = kn_sub(ctx, x, kn_mean(ctx, x, na, axes, true));
    s.rstd = kn_rsqrt(ctx, kn_add_scalar(ctx, kn_mean(ctx, kn_square(ctx, xc), na, axes, true), eps));
    s.xhat = kn_mul(ctx, xc, s.rstd);
    return s;
}
static kn_tensor *norm_dx(kn_ctx *ctx, norm_stats s, kn_tensor *dxhat, int na, const int *axes) {
    kn_tensor *m1 = kn_mean(ctx, dxhat, na, axes, true);
    kn_tensor *m2 = kn_mean(ctx, kn_mul(ctx, dxhat, s.xhat), na, axes, true);
    return kn_mul(ctx, s.rstd, kn_sub(ctx, kn_sub(ctx, dxhat, m1), kn_mul(ctx, s.xhat, m2)));
}

/* The fused NORM_BWD node (ops_nn.c) serves fixed sizes with x, w and g of
 * one dtype; anything else (a symbolic batch, mixed dtypes) and
 * KN_NORM_COMPOSITE=1 get the lazy-op forms below. Returns whether it built. */
static bool fused_norm(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *x = X, *w = t->src[1], *b = t->op == KN_OP_LAYER_NORM ? t->src[2] : NULL;
    if (kn_env_get()->norm_composite || g->dtype != x->dtype || (w && w->dtype != x->dtype) ||
        (b && b->dtype != x->dtype))
        return false;
    for (int i = 0; i < x->ndim; i++)
        if (x->sym[i] || g->sym[i]) return false;
    kn_tensor *dx, *dw, *db;
    if (kn__norm_bwd(ctx, t, g, rg(w) || rg(b), &dx, &dw, &db) != KN_OK) return true;   /* error set */
    if (rg(x)) gin[0] = dx;
    if (rg(w)) gin[1] = dw;
    if (rg(b)) gin[2] = db;
    return true;
}

static void g_layer_norm(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    if (fused_norm(ctx, t, g, gin)) return;
    kn_tensor *x = X, *w = t->src[1], *b = t->src[2];
    int axes[KN_MAX_DIMS], na = 0;
    for (int i = x->ndim - (int)t->p.norm.n_norm; i < x->ndim; i++) axes[na++] = i;
    norm_stats s = stats(ctx, x, na, axes, t->p.norm.eps);
    if (rg(x)) gin[0] = norm_dx(ctx, s, w ? kn_mul(ctx, g, w) : g, na, axes);
    if (rg(w)) gin[1] = kn__sum_to(ctx, kn_mul(ctx, g, s.xhat), w);
    if (rg(b)) gin[2] = kn__sum_to(ctx, g, b);
}

/* y = x * r * w, r = rsqrt(mean(x^2) + eps): dx = r * (gw - x r^2 mean(gw x)) */
static void g_rms_norm(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    if (fused_norm(ctx, t, g, gin)) return;
    kn_tensor *x = X, *w = t->src[1];
    int axes[KN_MAX_DIMS], na = 0;
    for (int i = x->ndim - (int)t->p.norm.n_norm; i < x->ndim; i++) axes[na++] = i;
    kn_tensor *r = kn_rsqrt(ctx, kn_add_scalar(ctx, kn_mean(ctx, kn_square(ctx, x), na, axes, true), t->p.norm.eps));
    if (rg(x)) {
        kn_tensor *gw = w ? kn_mul(ctx, g, w) : g;
        kn_tensor *m = kn_mean(ctx, kn_mul(ctx, gw, x), na, axes, true);
        gin[0] = kn_mul(ctx, r, kn_sub(ctx, gw, kn_mul(ctx, x, kn_mul(ctx, kn_square(ctx, r), m))));
    }
    if (rg(w)) gin[1] = kn__sum_to(ctx, kn_mul(ctx, g, kn_mul(ctx, x, r)), w);
}

/* [C] -> [C,1,...,1] with nd dims: broadcasts along dim 1 of an (nd+1)-d [N,C,...] */
static kn_tensor *per_channel(kn_ctx *ctx, kn_tensor *p, int nd) {
    int64_t s[KN_MAX_DIMS];
    for (int i = 0; i < nd; i++) s[i] = 1;
    s[0] = p->shape[0];
    return kn_reshape(ctx, p, nd, s);
}

/* group norm (groups G) and training batch norm, x [N,C,...] */
static void g_group_batch_norm(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *x = X, *w = t->src[1], *b = t->src[2];
    int nd = x->ndim;
    int caxes[KN_MAX_DIMS], nc = 0;          /* every axis but the channel one */
    for (int i = 0; i < nd; i++) if (i != 1) caxes[nc++] = i;
    kn_tensor *dxhat = w ? kn_mul(ctx, g, per_channel(ctx, w, nd - 1)) : g;
    kn_tensor *xhat;
    if (t->op == KN_OP_BATCH_NORM) {
        norm_stats s = stats(ctx, x, nc, caxes, t->p.norm.eps);
        xhat = s.xhat;
        if (rg(x)) gin[0] = norm_dx(ctx, s, dxhat, nc, caxes);
    } else {
        int64_t G = t->p.norm.groups, s3[3] = {x->shape[0], G, x->shape[0] ? kn_numel(x) / (x->shape[0] * G) : 0};
        int ax = 2;
        norm_stats s = stats(ctx, kn_reshape(ctx, x, 3, s3), 1, &ax, t->p.norm.eps);
        xhat = kn_reshape(ctx, s.xhat, nd, x->shape);
        if (rg(x)) gin[0] = kn_reshape(ctx, norm_dx(ctx, s, kn_reshape(ctx, dxhat, 3, s3), 1, &ax), nd, x->shape);
    }
    if (rg(w)) gin[1] = kn_sum(ctx, kn_mul(ctx, g, xhat), nc, caxes, false);
    if (rg(b)) gin[2] = kn_sum(ctx, g, nc, caxes, false);
}

/* ---- convolution ---- */
/* dw of shape wshape from a [N,Ca,H,W] and b [N,Cb,OH,OW] (see ref_nn.c) */
static kn_tensor *bwd_w(kn_ctx *ctx, kn_tensor *t, kn_tensor *a, kn_tensor *b, const int64_t *wshape) {
    kn_tensor *src[2] = {a, b};
    kn_tensor *dw = kn__node(ctx, KN_OP_CONV2D_BWD_W, kn__promote(a->dtype, b->dtype), 4, wshape, NULL, src, 2);
    if (dw) dw->p.conv = t->p.conv;
    return dw;
}
static int bias_axes[3] = {0, 2, 3};

static void g_conv2d(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *x = X, *w = t->src[1], *b = t->src[2];
    const int *st = t->p.conv.stride, *pd = t->p.conv.padding, *dl = t->p.conv.dilation;
    if (rg(x)) {
        /* conv_transpose2d maps OH back to (OH-1)s - 2p + d(K-1) + 1 + op: pick
         * op (< stride) so that it is H again */
        int op[2];
        for (int i = 0; i < 2; i++)
            op[i] = (int)(x->shape[2 + i] + 2 * pd[i] - (int64_t)dl[i] * (w->shape[2 + i] - 1) - 1 - (t->shape[2 + i] - 1) * st[i]);
        gin[0] = kn_conv_transpose2d(ctx, g, w, NULL, st, pd, op, dl, t->p.conv.groups);
    }
    if (rg(w)) gin[1] = bwd_w(ctx, t, x, g, w->shape);
    if (rg(b)) gin[2] = kn_sum(ctx, g, 3, bias_axes, false);
}

static void g_conv_transpose2d(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *x = X, *w = t->src[1], *b = t->src[2];
    const int *st = t->p.conv.stride, *pd = t->p.conv.padding, *dl = t->p.conv.dilation;
    if (rg(x)) {
        kn_tensor *dx = kn_conv2d(ctx, g, w, NULL, st, pd, dl, t->p.conv.groups);
        /* output_padding >= stride (allowed when < dilation) leaves extra rows */
        for (int i = 0; dx && i < 2; i++)
            if (dx->shape[2 + i] != x->shape[2 + i]) dx = kn_narrow(ctx, dx, 2 + i, 0, x->shape[2 + i]);
        gin[0] = dx;
    }
    if (rg(w)) gin[1] = bwd_w(ctx, t, g, x, w->shape);
    if (rg(b)) gin[2] = kn_sum(ctx, g, 3, bias_axes, false);
}

/* ---- pooling ---- */
static void g_pool(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *x = X, *dx;
    if (t->op == KN_OP_MAX_POOL2D) {
        kn_tensor *src[2] = {x, g};
        dx = kn__node(ctx, KN_OP_MAX_POOL2D_BWD, g->dtype, x->ndim, x->shape, x->sym, src, 2);
    } else {
        kn_op op = t->op == KN_OP_AVG_POOL2D ? KN_OP_AVG_POOL2D_BWD : KN_OP_ADAPTIVE_AVG_POOL2D_BWD;
        dx = kn__node(ctx, op, g->dtype, x->ndim, x->shape, x->sym, &g, 1);
    }
    if (dx) dx->p = t->p;
    gin[0] = dx;
}

/* ---- attention ---- */
/* [B,Hkv*G,T,D] -> [B,Hkv,T,D], summing each group */
static kn_tensor *sum_heads(kn_ctx *ctx, kn_tensor *x, int64_t G) {
    if (G == 1) return x;
    int64_t s5[5] = {x->shape[0], x->shape[1] / G, G, x->shape[2], x->shape[3]};
    int ax = 2;
    return kn_sum(ctx, kn_reshape(ctx, x, 5, s5), 1, &ax, false);
}

static void g_sdpa(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *q = t->src[0], *k = t->src[1], *v = t->src[2];
    if (q->sym[2] || k->sym[2]) {
        kn__fail(ctx, KN_ERR_UNSUPPORTED, "sdpa backward: symbolic sequence lengths are not supported; build the training graph with fixed sizes");
        return;
    }
    bool sym = false;
    for (int i = 0; i < 4; i++) sym |= q->sym[i] || k->sym[i] || v->sym[i] || g->sym[i];
    if (!sym) {                       /* one fused node (ops_nn.c states its arithmetic) */
        kn_tensor *dq, *dk, *dv;
        if (kn__sdpa_bwd(ctx, t, g, &dq, &dk, &dv) != KN_OK) return;
        if (rg(q)) gin[0] = dq;
        if (rg(k)) gin[1] = dk;
        if (rg(v)) gin[2] = dv;
        return;
    }
    /* a symbolic batch: the same arithmetic as ordinary lazy ops */
    int64_t G = q->shape[1] / k->shape[1], Tq = q->shape[2], Tk = k->shape[2];
    double scale = t->p.sdpa.scale;
    kn_tensor *ke = kn__repeat_heads(ctx, k, G), *ve = kn__repeat_heads(ctx, v, G);
    double cap = t->p.sdpa.softcap;
    kn_tensor *s = kn_mul_scalar(ctx, kn_matmul(ctx, q, kn_transpose(ctx, ke, -1, -2)), scale);  /* [B,Hq,Tq,Tk] */
    kn_tensor *th = cap > 0 ? kn_tanh(ctx, kn_mul_scalar(ctx, s, 1 / cap)) : NULL;            /* softcap */
    if (th) s = kn_mul_scalar(ctx, th, cap);
    if (t->p.sdpa.causal) {
        int64_t r[2] = {Tq, 1}, c[2] = {1, Tk};
        kn_tensor *qi = kn_reshape(ctx, kn_add_scalar(ctx, kn_arange(ctx, KN_I64, 0, (double)Tq, 1), (double)(Tk - Tq)), 2, r);
        kn_tensor *kj = kn_reshape(ctx, kn_arange(ctx, KN_I64, 0, (double)Tk, 1), 2, c);
        s = kn_masked_fill(ctx, s, kn_gt(ctx, kj, qi), -INFINITY);
        if (t->p.sdpa.window > 0)             /* keys j <= i' - W are outside the window */
            s = kn_masked_fill(ctx, s, kn_le(ctx, kj, kn_add_scalar(ctx, qi, -(double)t->p.sdpa.window)), -INFINITY);
    }
    kn_tensor *p = kn_softmax(ctx, s, -1);
    if (rg(v)) gin[2] = sum_heads(ctx, kn_matmul(ctx, kn_transpose(ctx, p, -1, -2), g), G);
    if (rg(q) || rg(k)) {
        kn_tensor *dp = kn_matmul(ctx, g, kn_transpose(ctx, ve, -1, -2));
        int ax = 3;
        kn_tensor *ds = kn_mul(ctx, p, kn_sub(ctx, dp, kn_sum(ctx, kn_mul(ctx, dp, p), 1, &ax, true)));
        if (th) ds = kn_mul(ctx, ds, kn_add_scalar(ctx, kn_mul_scalar(ctx, kn_mul(ctx, th, th), -1), 1));   /* cap' = 1 - tanh^2 */
        ds = kn_mul_scalar(ctx, ds, scale);
        if (rg(q)) gin[0] = kn_matmul(ctx, ds, ke);
        if (rg(k)) gin[1] = sum_heads(ctx, kn_matmul(ctx, kn_transpose(ctx, ds, -1, -2), q), G);
    }
}

/* ---- rope: a rotation, so the gradient rotates back (negated angle) ---- */
static void g_rope(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    gin[0] = kn_rope_ff(ctx, g, t->src[1], t->p.rope.n_rot, t->p.rope.theta, t->p.rope.neox, -t->p.rope.freq_scale,
                        t->src[2]);
}

/* ---- cross_entropy: dlogits = g * (softmax - smoothed one-hot), one node
 * (ops_loss.c states its arithmetic; it recomputes the row statistics) ---- */
static void g_cross_entropy(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    if (rg(t->src[0])) gin[0] = kn__cross_entropy_bwd(ctx, t, g);
}

/* ---- mul_mat_id: y[t, j] = W[ids[t, j]] . x[t, j'] (src/graph/ops_moe.c
 * states the rule and its cost) ---- */
static void g_mul_mat_id(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    kn_tensor *x = t->src[0], *W = t->src[1], *ids = t->src[2];
    int64_t T = g->shape[0], K = g->shape[1], N = g->shape[2], E = W->shape[0], C = W->shape[2];
    if (kn_dtype_get(W->dtype)->is_quant && (rg(x) || rg(W))) {
        kn__fail(ctx, KN_ERR_UNSUPPORTED, "backward: mul_mat_id has no gradient through a quantized (%s) W; use f32 "
                 "weights to train", kn_dtype_name(W->dtype));
        return;
    }
    if (rg(x)) {
        /* W^T [E, C, N] made contiguous: every backend's kernel takes that layout */
        kn_tensor *dx = kn_mul_mat_id(ctx, g, kn_contiguous(ctx, kn_transpose(ctx, W, 1, 2)), ids);   /* [T, K, C] */
        if (x->ndim == 2) dx = kn_sum(ctx, dx, 1, (int[]){1}, false);                 /* x shared by the slots */
        else if (x->shape[1] == 1 && K > 1) dx = kn_sum(ctx, dx, 1, (int[]){1}, true);
        gin[0] = dx;
    }
    if (rg(W)) {
        kn_tensor *xr = x->ndim == 2 ? kn_unsqueeze(ctx, x, 1) : x;                    /* [T, K or 1, C] */
        xr = kn_reshape(ctx, kn_contiguous(ctx, kn_expand(ctx, xr, 3, (int64_t[]){T, K, C})), 2, (int64_t[]){T * K, C});
        kn_tensor *oh = kn_cast(ctx, kn_eq(ctx, kn_unsqueeze(ctx, ids, 2), kn_arange(ctx, ids->dtype, 0, (double)E, 1)),
                                g->dtype);                                              /* [T, K, E] */
        kn_tensor *z = kn_mul(ctx, kn_unsqueeze(ctx, oh, 3), kn_unsqueeze(ctx, g, 2));  /* [T, K, E, N] */
        z = kn_reshape(ctx, kn_contiguous(ctx, z), 2, (int64_t[]){T * K, E * N});
        kn_tensor *dw = kn_matmul(ctx, kn_transpose(ctx, z, 0, 1), xr);                  /* [E*N, C] */
        gin[1] = kn_cast(ctx, kn_reshape(ctx, dw, 3, (int64_t[]){E, N, C}), W->dtype);
    }
}

/* UNFOLD and FOLD are each other's adjoint (src/graph/ops_spatial.c) */
static void g_unfold_fold(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **gin) {
    const int *k = t->p.pool.kernel, *d = t->p.pool.dilation, *p = t->p.pool.padding, *s = t->p.pool.stride;
    if (t->op == KN_OP_UNFOLD) gin[0] = kn_fold(ctx, g, (const int64_t[]){X->shape[2], X->shape[3]}, k, d, p, s);
    else gin[0] = kn_unfold(ctx, g, k, d, p, s);
}

kn_grad_rule kn__grad_rule_nn(kn_op op) {
    switch (op) {
    case KN_OP_SOFTMAX: case KN_OP_LOG_SOFTMAX: return g_softmax;
    case KN_OP_LAYER_NORM: return g_layer_norm;
    case KN_OP_RMS_NORM: return g_rms_norm;
    case KN_OP_GROUP_NORM: case KN_OP_BATCH_NORM: return g_group_batch_norm;
    case KN_OP_CONV2D: return g_conv2d;
    case KN_OP_CONV_TRANSPOSE2D: return g_conv_transpose2d;
    case KN_OP_MAX_POOL2D: case KN_OP_AVG_POOL2D: case KN_OP_ADAPTIVE_AVG_POOL2D: return g_pool;
    case KN_OP_SDPA: return g_sdpa;
    case KN_OP_ROPE: return g_rope;
    case KN_OP_CROSS_ENTROPY: return g_cross_entropy;
    case KN_OP_MUL_MAT_ID: return g_mul_mat_id;
    case KN_OP_UNFOLD: case KN_OP_FOLD: return g_unfold_fold;
    default: return NULL;
    }
}
