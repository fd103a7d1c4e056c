/* ops_nn.c: nn op constructors: softmax, norms, dropout, embedding, conv,
 * pooling, attention, rope.
 *
 * Primitive nodes (one kernel each, fast paths later): softmax, log_softmax,
 * layer/rms/group norm, batch norm in training mode, conv2d,
 * conv_transpose2d, the three 2-d poolings, sdpa and rope. Composites built
 * from other ops: dropout, embedding, conv1d, batch norm in eval mode.
 * Gradient-only nodes (CONV2D_BWD_W, *_POOL2D_BWD) are made by the rules in
 * src/autograd/rules_nn.c, not here.
 *
 * Letters: N batch, C input channels, O output channels, H/W spatial extents,
 * KH/KW kernel extents, g groups; B batch, Hq/Hkv query/key heads, Tq/Tk
 * query/key lengths, D head dim.
 *
 * Non-goals: symbolic (plan-time variable) sizes anywhere but the batch dim
 * of conv/pool inputs and the leading dims of norms/softmax/rope.
 */
#include "graph/graph.h"
#include <math.h>
#include <string.h>

static bool need_float(kn_ctx *ctx, const char *op, const kn_tensor *x, const char *what) {
    if (!kn_dtype_get(x->dtype)->is_float) {
        kn__fail(ctx, KN_ERR_INVALID, "%s: %s must be a float tensor, got %s (cast it first)", op, what, kn_dtype_name(x->dtype));
        return false;
    }
    return true;
}

/* ---- softmax ---------------------------------------------------------------- */
static kn_tensor *softmax_p(kn_ctx *ctx, kn_op op, kn_tensor *x, int dim) {
    if (!x) return NULL;
    const char *name = kn_op_name(op);
    if (!need_float(ctx, name, x, "x")) return NULL;
    bool ok = true;
    int d = kn__norm_dim(ctx, name, dim, x->ndim, &ok);
    if (!ok) return NULL;
    kn_tensor *t = kn__node(ctx, op, x->dtype, x->ndim, x->shape, x->sym, &x, 1);
    if (t) t->p.axis.dim = d;
    return t;
}
kn_tensor *kn_softmax(kn_ctx *ctx, kn_tensor *x, int dim) { return softmax_p(ctx, KN_OP_SOFTMAX, x, dim); }
kn_tensor *kn_log_softmax(kn_ctx *ctx, kn_tensor *x, int dim) { return softmax_p(ctx, KN_OP_LOG_SOFTMAX, x, dim); }

/* ---- normalisation ------------------------------------------------------------ */
/* p must have exactly shape `shape` (n dims) */
static bool check_affine(kn_ctx *ctx, const char *op, const char *what, const kn_tensor *p,
                         int n, const int64_t *shape, const kn_tensor *x) {
    if (!p) return true;
    bool same = p->ndim == n;
    for (int i = 0; same && i < n; i++) same = p->shape[i] == shape[i] && !p->sym[i];
    if (!same) {
        char s1[160], s2[160], exp[160];
        size_t k = 0;
        exp[0] = 0;
        for (int i = 0; i < n && k < sizeof exp; i++) k += (size_t)snprintf(exp + k, sizeof exp - k, "%s%lld", i ? "," : "", (long long)shape[i]);
        kn__fail(ctx, KN_ERR_INVALID, "%s: %s has shape %s but must be [%s] for input %s", op, what,
                 kn__shape_str(p, s1, sizeof s1), exp, kn__shape_str(x, s2, sizeof s2));
        return false;
    }
    return need_float(ctx, op, p, what);
}

kn_tensor *kn_layer_norm(kn_ctx *ctx, kn_tensor *x, int n_norm, kn_tensor *w, kn_tensor *b, double eps) {
    if (!x) return NULL;
    if (!need_float(ctx, "layer_norm", x, "x")) return NULL;
    if (n_norm < 1 || n_norm > x->ndim) {
        char s[160];
        return kn__fail(ctx, KN_ERR_INVALID, "layer_norm: n_norm = %d must be in 1..%d for input %s", n_norm, x->ndim, kn__shape_str(x, s, sizeof s));
    }
    if (!(eps >= 0)) return kn__fail(ctx, KN_ERR_INVALID, "layer_norm: eps = %g must be >= 0", eps);
    const int64_t *tail = x->shape + (x->ndim - n_norm);
    for (int i = x->ndim - n_norm; i < x->ndim; i++)
        if (x->sym[i]) return kn__fail(ctx, KN_ERR_INVALID, "layer_norm: normalised dim %d is symbolic; only leading dims may be", i);
    if (!check_affine(ctx, "layer_norm", "weight", w, n_norm, tail, x)) return NULL;
    if (!check_affine(ctx, "layer_norm", "bias", b, n_norm, tail, x)) return NULL;
    kn_tensor *src[3] = {x, w, b};
    kn_tensor *t = kn__node(ctx, KN_OP_LAYER_NORM, x->dtype, x->ndim, x->shape, x->sym, src, 3);
    if (t) { t->p.norm.eps = eps; t->p.norm.n_norm = n_norm; t->p.norm.groups = 1; }
    return t;
}

kn_tensor *kn_rms_norm(kn_ctx *ctx, kn_tensor *x, int n_norm, kn_tensor *w, double eps) {
    if (!x) return NULL;
    if (!need_float(ctx, "rms_norm", x, "x")) return NULL;
    if (n_norm < 1 || n_norm > x->ndim) {
        char s[160];
        return kn__fail(ctx, KN_ERR_INVALID, "rms_norm: n_norm = %d must be in 1..%d for input %s", n_norm, x->ndim, kn__shape_str(x, s, sizeof s));
    }
    if (!(eps >= 0)) return kn__fail(ctx, KN_ERR_INVALID, "rms_norm: eps = %g must be >= 0", eps);
    for (int i = x->ndim - n_norm; i < x->ndim; i++)
        if (x->sym[i]) return kn__fail(ctx, KN_ERR_INVALID, "rms_norm: normalised dim %d is symbolic; only leading dims may be", i);
    if (!check_affine(ctx, "rms_norm", "weight", w, n_norm, x->shape + (x->ndim - n_norm), x)) return NULL;
    kn_tensor *src[2] = {x, w};
    kn_tensor *t = kn__node(ctx, KN_OP_RMS_NORM, x->dtype, x->ndim, x->shape, x->sym, src, 2);
    if (t) { t->p.norm.eps = eps; t->p.norm.n_norm = n_norm; t->p.norm.groups = 1; }
    return t;
}

/* layer_norm's or rms_norm's gradient as one node (made by the norm rules in
 * autograd/rules_nn.c). t is the norm node over the trailing n_norm dims of
 * x (M elements a row, rows = numel / M), g = dL/dy (x's shape). Per row,
 * with the statistics recomputed from x (two passes, as the forward does):
 *   xhat = (x - mean) * rstd     (rms: x * rstd, no mean)
 *   dxhat = g * w                (g without a weight)
 *   dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))   (rms: no mean(dxhat) term)
 * and over all rows dw = sum g * xhat, db = sum g (layer norm only). The
 * node's output packs dx [rows*M] and then, when want_wb, dw [M] and (layer
 * norm) db [M], one after the other in x's dtype: one pass over x and g.
 * The number of packed parameter gradients is the output's size less
 * rows*M, over M. *dx, *dw, *db are views of it (dw, db NULL unless
 * want_wb). Fixed sizes only; x, g (and w) of one dtype: the rules check. */
kn_status kn__norm_bwd(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, bool want_wb, kn_tensor **dx, kn_tensor **dw,
                       kn_tensor **db) {
    *dx = *dw = *db = NULL;
    kn_tensor *x = t->src[0], *w = t->src[1];
    bool rms = t->op == KN_OP_RMS_NORM;
    int nn = (int)t->p.norm.n_norm, lead = x->ndim - nn;
    int64_t M = 1;
    for (int i = lead; i < x->ndim; i++) M *= x->shape[i];
    int64_t nx = kn_numel(x), parts = want_wb ? (rms ? 1 : 2) : 0, n = nx + parts * M;
    kn_tensor *src[3] = {x, w, g};
    kn_tensor *d = kn__node(ctx, KN_OP_NORM_BWD, x->dtype, 1, &n, NULL, src, 3);
    if (!d) return kn_ctx_status(ctx);
    d->p.norm = t->p.norm;
    d->p.norm.rms = rms;
    *dx = kn_reshape(ctx, kn_narrow(ctx, d, 0, 0, nx), x->ndim, x->shape);
    if (!*dx) return kn_ctx_status(ctx);
    if (parts >= 1 && !(*dw = kn_reshape(ctx, kn_narrow(ctx, d, 0, nx, M), nn, x->shape + lead))) return kn_ctx_status(ctx);
    if (parts >= 2 && !(*db = kn_reshape(ctx, kn_narrow(ctx, d, 0, nx + M, M), nn, x->shape + lead))) return kn_ctx_status(ctx);
    return KN_OK;
}

/* x [N,C,...]: shared checks of group and batch norm */
static bool check_nc(kn_ctx *ctx, const char *op, const kn_tensor *x, kn_tensor *w, kn_tensor *b, double eps) {
    char s[160];
    if (!need_float(ctx, op, x, "x")) return false;
    if (x->ndim < 2) { kn__fail(ctx, KN_ERR_INVALID, "%s: input must be [N,C,...], got %s", op, kn__shape_str(x, s, sizeof s)); return false; }
    for (int i = 1; i < x->ndim; i++)
        if (x->sym[i]) { kn__fail(ctx, KN_ERR_INVALID, "%s: dim %d of %s is symbolic; only N may be", op, i, kn__shape_str(x, s, sizeof s)); return false; }
    if (!(eps >= 0)) { kn__fail(ctx, KN_ERR_INVALID, "%s: eps = %g must be >= 0", op, eps); return false; }
    return check_affine(ctx, op, "weight", w, 1, &x->shape[1], x) && check_affine(ctx, op, "bias", b, 1, &x->shape[1], x);
}

kn_tensor *kn_group_norm(kn_ctx *ctx, kn_tensor *x, int groups, kn_tensor *w, kn_tensor *b, double eps) {
    if (!x) return NULL;
    if (!check_nc(ctx, "group_norm", x, w, b, eps)) return NULL;
    if (groups < 1 || x->shape[1] % groups) {
        char s[160];
        return kn__fail(ctx, KN_ERR_INVALID, "group_norm: groups = %d must be >= 1 and divide the %lld channels of %s",
                        groups, (long long)x->shape[1], kn__shape_str(x, s, sizeof s));
    }
    kn_tensor *src[3] = {x, w, b};
    kn_tensor *t = kn__node(ctx, KN_OP_GROUP_NORM, x->dtype, x->ndim, x->shape, x->sym, src, 3);
    if (t) { t->p.norm.eps = eps; t->p.norm.groups = groups; t->p.norm.n_norm = 0; }
    return t;
}

/* Training: a BATCH_NORM node (src {x, w, b}) normalises with the batch
 * statistics over every dim but 1 (biased variance), like torch. The running
 * statistics are NOT updated here: the caller (the nn module) emits assign
 * nodes for running_mean/var itself (torch uses the unbiased batch variance
 * for that update). Eval: a composite of lazy ops with the running stats. */
kn_tensor *kn_batch_norm(kn_ctx *ctx, kn_tensor *x, kn_tensor *running_mean, kn_tensor *running_var,
                         kn_tensor *w, kn_tensor *b, bool training, double eps) {
    if (!x) return NULL;
    if (!check_nc(ctx, "batch_norm", x, w, b, eps)) return NULL;
    if (training) {
        kn_tensor *src[3] = {x, w, b};
        kn_tensor *t = kn__node(ctx, KN_OP_BATCH_NORM, x->dtype, x->ndim, x->shape, x->sym, src, 3);
        if (t) { t->p.norm.eps = eps; t->p.norm.groups = 1; t->p.norm.n_norm = 0; }
        return t;
    }
    if (!running_mean || !running_var)
        return kn__fail(ctx, KN_ERR_INVALID, "batch_norm: eval mode needs running_mean and running_var (pass training=true to use batch statistics)");
    if (!check_affine(ctx, "batch_norm", "running_mean", running_mean, 1, &x->shape[1], x)) return NULL;
    if (!check_affine(ctx, "batch_norm", "running_var", running_var, 1, &x->shape[1], x)) return NULL;
    int64_t cs[KN_MAX_DIMS];
    for (int i = 0; i < x->ndim - 1; i++) cs[i] = 1;
    cs[0] = x->shape[1];             /* [C,1,...,1]: broadcasts against [N,C,...] */
    int nd = x->ndim - 1;
    kn_tensor *scale = kn_rsqrt(ctx, kn_add_scalar(ctx, kn_reshape(ctx, running_var, nd, cs), eps));
    if (w) scale = kn_mul(ctx, scale, kn_reshape(ctx, w, nd, cs));
    kn_tensor *y = kn_mul(ctx, kn_sub(ctx, x, kn_reshape(ctx, running_mean, nd, cs)), scale);
    if (b) y = kn_add(ctx, y, kn_reshape(ctx, b, nd, cs));
    if (y && y->dtype != x->dtype) y = kn_cast(ctx, y, x->dtype);
    return y;
}

/* ---- dropout, embedding (composites) ------------------------------------------- */
kn_tensor *kn_dropout(kn_ctx *ctx, kn_tensor *x, double p, bool training, uint64_t seed) {
    if (!x) return NULL;
    if (!(p >= 0 && p <= 1)) return kn__fail(ctx, KN_ERR_INVALID, "dropout: p = %g must be in [0, 1]", p);
    if (!need_float(ctx, "dropout", x, "x")) return NULL;
    if (!training || p == 0) return x;
    if (p == 1) return kn_mul_scalar(ctx, x, 0.0);   /* x * 0, as torch (keeps the graph, NaN stays NaN) */
    kn_tensor *mask = kn_bernoulli(ctx, x->dtype, x->ndim, x->shape, 1.0 - p, seed);
    return kn_mul(ctx, x, kn_mul_scalar(ctx, mask, 1.0 / (1.0 - p)));
}

kn_tensor *kn_embedding(kn_ctx *ctx, kn_tensor *weight, kn_tensor *ids) {
    if (!weight || !ids) return NULL;
    char s1[160], s2[160];
    if (weight->ndim != 2)
        return kn__fail(ctx, KN_ERR_INVALID, "embedding: weight must be [V,C], got %s", kn__shape_str(weight, s1, sizeof s1));
    const kn_dtype_info *di = kn_dtype_get(ids->dtype);
    if (di->is_float || di->is_quant || ids->dtype == KN_BOOL)
        return kn__fail(ctx, KN_ERR_INVALID, "embedding: ids must be an integer tensor, got %s %s",
                        kn_dtype_name(ids->dtype), kn__shape_str(ids, s2, sizeof s2));
    if (ids->ndim + 1 > KN_MAX_DIMS)
        return kn__fail(ctx, KN_ERR_LIMIT, "embedding: ids %s has too many dims", kn__shape_str(ids, s2, sizeof s2));
    int64_t n = kn_numel(ids);
    kn_tensor *flat = kn_reshape(ctx, ids, 1, &n);
    kn_tensor *rows = kn_index_select(ctx, weight, 0, flat);    /* [n, C] */
    int64_t shape[KN_MAX_DIMS];
    for (int i = 0; i < ids->ndim; i++) shape[i] = ids->shape[i];
    shape[ids->ndim] = weight->shape[1];
    return kn_reshape(ctx, rows, ids->ndim + 1, shape);
}

/* ---- convolution ------------------------------------------------------------- */
static bool check_conv_args(kn_ctx *ctx, const char *op, const int stride[2], const int padding[2],
                            const int dilation[2], int groups) {
    for (int i = 0; i < 2; i++) {
        if (stride[i] < 1 || padding[i] < 0 || dilation[i] < 1) {
            kn__fail(ctx, KN_ERR_INVALID, "%s: stride (%d,%d) and dilation (%d,%d) must be >= 1 and padding (%d,%d) >= 0",
                     op, stride[0], stride[1], dilation[0], dilation[1], padding[0], padding[1]);
            return false;
        }
    }
    if (groups < 1) { kn__fail(ctx, KN_ERR_INVALID, "%s: groups = %d must be >= 1", op, groups); return false; }
    return true;
}

static bool check_4d(kn_ctx *ctx, const char *op, const char *what, const kn_tensor *t, bool allow_sym0) {
    char s[160];
    if (t->ndim != 4) {
        kn__fail(ctx, KN_ERR_INVALID, "%s: %s must be 4-d, got %s", op, what, kn__shape_str(t, s, sizeof s));
        return false;
    }
    for (int i = allow_sym0 ? 1 : 0; i < 4; i++)
        if (t->sym[i]) { kn__fail(ctx, KN_ERR_INVALID, "%s: dim %d of %s %s is symbolic; only the batch dim may be", op, i, what, kn__shape_str(t, s, sizeof s)); return false; }
    return need_float(ctx, op, t, what);
}

static bool check_bias(kn_ctx *ctx, const char *op, const kn_tensor *b, int64_t O) {
    if (!b) return true;
    if (b->ndim != 1 || b->shape[0] != O || b->sym[0]) {
        char s[160];
        kn__fail(ctx, KN_ERR_INVALID, "%s: bias must be [%lld] (one per output channel), got %s", op, (long long)O, kn__shape_str(b, s, sizeof s));
        return false;
    }
    return need_float(ctx, op, b, "bias");
}

kn_tensor *kn_conv2d(kn_ctx *ctx, kn_tensor *x, kn_tensor *w, kn_tensor *b, const int stride[2], const int padding[2],
                     const int dilation[2], int groups) {
    if (!x || !w) return NULL;
    const char *op = "conv2d";
    char s1[160], s2[160];
    if (!check_4d(ctx, op, "input", x, true) || !check_4d(ctx, op, "weight", w, false)) return NULL;
    if (!check_conv_args(ctx, op, stride, padding, dilation, groups)) return NULL;
    int64_t C = x->shape[1], O = w->shape[0];
    if (C % groups || O % groups)
        return kn__fail(ctx, KN_ERR_INVALID, "conv2d: groups = %d must divide the input channels (%lld) and output channels (%lld); input %s, weight %s",
                        groups, (long long)C, (long long)O, kn__shape_str(x, s1, sizeof s1), kn__shape_str(w, s2, sizeof s2));
    if (w->shape[1] * groups != C)
        return kn__fail(ctx, KN_ERR_INVALID, "conv2d: channel mismatch: input %s has %lld channels but weight %s expects %lld (= %lld x %d groups)",
                        kn__shape_str(x, s1, sizeof s1), (long long)C, kn__shape_str(w, s2, sizeof s2),
                        (long long)(w->shape[1] * groups), (long long)w->shape[1], groups);
    if (!check_bias(ctx, op, b, O)) return NULL;
    int64_t out[2];
    for (int i = 0; i < 2; i++) {
        int64_t in = x->shape[2 + i] + 2 * (int64_t)padding[i], k = (int64_t)dilation[i] * (w->shape[2 + i] - 1) + 1;
        if (w->shape[2 + i] < 1 || k > in)
            return kn__fail(ctx, KN_ERR_INVALID, "conv2d: the (dilated) kernel %s is larger than the padded input %s (padding %d,%d, dilation %d,%d)",
                            kn__shape_str(w, s2, sizeof s2), kn__shape_str(x, s1, sizeof s1), padding[0], padding[1], dilation[0], dilation[1]);
        out[i] = (in - k) / stride[i] + 1;
    }
    int64_t shape[4] = {x->shape[0], O, out[0], out[1]};
    int8_t sym[4] = {x->sym[0], 0, 0, 0};
    kn_tensor *src[3] = {x, w, b};
    kn_dtype dt = kn__promote(x->dtype, w->dtype);
    kn_tensor *t = kn__node(ctx, KN_OP_CONV2D, dt, 4, shape, sym, src, 3);
    if (!t) return NULL;
    for (int i = 0; i < 2; i++) {
        t->p.conv.stride[i] = stride[i]; t->p.conv.padding[i] = padding[i];
        t->p.conv.dilation[i] = dilation[i]; t->p.conv.output_padding[i] = 0;
    }
    t->p.conv.groups = groups;
    return t;
}

kn_tensor *kn_conv1d(kn_ctx *ctx, kn_tensor *x, kn_tensor *w, kn_tensor *b, int stride, int padding, int dilation, int groups) {
    if (!x || !w) return NULL;
    char s1[160], s2[160];
    if (x->ndim != 3 || w->ndim != 3)
        return kn__fail(ctx, KN_ERR_INVALID, "conv1d: input must be [N,C,L] and weight [O,C/g,K], got %s and %s",
                        kn__shape_str(x, s1, sizeof s1), kn__shape_str(w, s2, sizeof s2));
    int st[2] = {1, stride}, pd[2] = {0, padding}, dl[2] = {1, dilation};
    kn_tensor *y = kn_conv2d(ctx, kn_unsqueeze(ctx, x, 2), kn_unsqueeze(ctx, w, 2), b, st, pd, dl, groups);
    if (!y) {
        char msg[1024];
        snprintf(msg, sizeof msg, "%s", kn_last_error());
        return kn__fail(ctx, KN_ERR_INVALID, "conv1d (as conv2d with H=1): %s", msg);
    }
    return kn_squeeze(ctx, y, 2);
}

kn_tensor *kn_conv_transpose2d(kn_ctx *ctx, kn_tensor *x, kn_tensor *w, kn_tensor *b, const int stride[2], const int padding[2],
                               const int output_padding[2], const int dilation[2], int groups) {
    if (!x || !w) return NULL;
    const char *op = "conv_transpose2d";
    char s1[160], s2[160];
    if (!check_4d(ctx, op, "input", x, true) || !check_4d(ctx, op, "weight", w, false)) return NULL;
    if (!check_conv_args(ctx, op, stride, padding, dilation, groups)) return NULL;
    int64_t C = x->shape[1];
    if (w->shape[0] != C)
        return kn__fail(ctx, KN_ERR_INVALID, "conv_transpose2d: channel mismatch: input %s has %lld channels but weight %s (layout [C,O/g,KH,KW]) has %lld",
                        kn__shape_str(x, s1, sizeof s1), (long long)C, kn__shape_str(w, s2, sizeof s2), (long long)w->shape[0]);
    if (C % groups)
        return kn__fail(ctx, KN_ERR_INVALID, "conv_transpose2d: groups = %d must divide the %lld input channels of %s",
                        groups, (long long)C, kn__shape_str(x, s1, sizeof s1));
    int64_t O = w->shape[1] * groups;
    if (!check_bias(ctx, op, b, O)) return NULL;
    int64_t out[2];
    for (int i = 0; i < 2; i++) {
        if (output_padding[i] < 0 || (output_padding[i] >= stride[i] && output_padding[i] >= dilation[i]))
            return kn__fail(ctx, KN_ERR_INVALID, "conv_transpose2d: output_padding (%d,%d) must be >= 0 and smaller than stride (%d,%d) or dilation (%d,%d)",
                            output_padding[0], output_padding[1], stride[0], stride[1], dilation[0], dilation[1]);
        out[i] = (x->shape[2 + i] - 1) * stride[i] - 2 * (int64_t)padding[i] + (int64_t)dilation[i] * (w->shape[2 + i] - 1)
                 + output_padding[i] + 1;
        if (w->shape[2 + i] < 1 || out[i] < 1)
            return kn__fail(ctx, KN_ERR_INVALID, "conv_transpose2d: output size %lld in spatial dim %d is not positive for input %s, weight %s, padding (%d,%d)",
                            (long long)out[i], i, kn__shape_str(x, s1, sizeof s1), kn__shape_str(w, s2, sizeof s2), padding[0], padding[1]);
    }
    int64_t shape[4] = {x->shape[0], O, out[0], out[1]};
    int8_t sym[4] = {x->sym[0], 0, 0, 0};
    kn_tensor *src[3] = {x, w, b};
    kn_tensor *t = kn__node(ctx, KN_OP_CONV_TRANSPOSE2D, kn__promote(x->dtype, w->dtype), 4, shape, sym, src, 3);
    if (!t) return NULL;
    for (int i = 0; i < 2; i++) {
        t->p.conv.stride[i] = stride[i]; t->p.conv.padding[i] = padding[i];
        t->p.conv.dilation[i] = dilation[i]; t->p.conv.output_padding[i] = output_padding[i];
    }
    t->p.conv.groups = groups;
    return t;
}

/* ---- pooling ------------------------------------------------------------------
 * x [N,C,H,W] or [C,H,W]: the last two dims are pooled, leading dims are batch. */
static bool check_pool_input(kn_ctx *ctx, const char *op, const kn_tensor *x) {
    char s[160];
    if (x->ndim != 3 && x->ndim != 4) {
        kn__fail(ctx, KN_ERR_INVALID, "%s: input must be [N,C,H,W] or [C,H,W], got %s", op, kn__shape_str(x, s, sizeof s));
        return false;
    }
    for (int i = 1; i < x->ndim; i++)
        if (x->sym[i]) { kn__fail(ctx, KN_ERR_INVALID, "%s: dim %d of %s is symbolic; only the first may be", op, i, kn__shape_str(x, s, sizeof s)); return false; }
    return need_float(ctx, op, x, "input");
}

/* torch's pooling_output_shape */
static int64_t pool_out(int64_t in, int k, int s, int p, int d, bool ceil_mode) {
    int64_t num = in + 2 * (int64_t)p - (int64_t)d * (k - 1) - 1 + (ceil_mode ? s - 1 : 0);
    int64_t o = (num >= 0 ? num / s : -((-num + s - 1) / s)) + 1;
    if (ceil_mode && (o - 1) * s >= in + p) o--;
    return o;
}

static kn_tensor *pool_node(kn_ctx *ctx, kn_op op, kn_tensor *x, const int kernel[2], const int stride_in[2],
                            const int padding[2], const int dilation[2], bool ceil_mode, bool count_include_pad) {
    const char *name = kn_op_name(op);
    char s[160];
    if (!check_pool_input(ctx, name, x)) return NULL;
    int stride[2];
    for (int i = 0; i < 2; i++) stride[i] = (stride_in && stride_in[i]) ? stride_in[i] : kernel[i];
    for (int i = 0; i < 2; i++) {      /* both strides set first: the messages print both */
        if (kernel[i] < 1 || stride[i] < 1 || dilation[i] < 1 || padding[i] < 0)
            return kn__fail(ctx, KN_ERR_INVALID, "%s: kernel (%d,%d), stride (%d,%d) and dilation (%d,%d) must be >= 1, padding (%d,%d) >= 0",
                            name, kernel[0], kernel[1], stride[0], stride[1], dilation[0], dilation[1], padding[0], padding[1]);
        if (padding[i] > kernel[i] / 2)
            return kn__fail(ctx, KN_ERR_INVALID, "%s: padding (%d,%d) must be at most half the kernel (%d,%d)",
                            name, padding[0], padding[1], kernel[0], kernel[1]);
    }
    int64_t shape[KN_MAX_DIMS];
    int nd = x->ndim;
    for (int i = 0; i < nd; i++) shape[i] = x->shape[i];
    for (int i = 0; i < 2; i++) {
        int64_t in = x->shape[nd - 2 + i];
        int64_t o = pool_out(in, kernel[i], stride[i], padding[i], dilation[i], ceil_mode);
        if (o < 1)
            return kn__fail(ctx, KN_ERR_INVALID, "%s: the (dilated) kernel (%d,%d) is larger than the padded input %s (padding %d,%d)",
                            name, kernel[0], kernel[1], kn__shape_str(x, s, sizeof s), padding[0], padding[1]);
        shape[nd - 2 + i] = o;
    }
    kn_tensor *t = kn__node(ctx, op, x->dtype, nd, shape, x->sym, &x, 1);
    if (!t) return NULL;
    for (int i = 0; i < 2; i++) {
        t->p.pool.kernel[i] = kernel[i]; t->p.pool.stride[i] = stride[i];
        t->p.pool.padding[i] = padding[i]; t->p.pool.dilation[i] = dilation[i];
    }
    t->p.pool.ceil_mode = ceil_mode;
    t->p.pool.count_include_pad = count_include_pad;
    return t;
}

kn_tensor *kn_max_pool2d(kn_ctx *ctx, kn_tensor *x, const int kernel[2], const int stride[2], const int padding[2],
                         const int dilation[2], bool ceil_mode) {
    if (!x) return NULL;
    static const int one[2] = {1, 1};
    return pool_node(ctx, KN_OP_MAX_POOL2D, x, kernel, stride, padding, dilation ? dilation : one, ceil_mode, false);
}

kn_tensor *kn_avg_pool2d(kn_ctx *ctx, kn_tensor *x, const int kernel[2], const int stride[2], const int padding[2],
                         bool ceil_mode, bool count_include_pad) {
    if (!x) return NULL;
    static const int one[2] = {1, 1};
    return pool_node(ctx, KN_OP_AVG_POOL2D, x, kernel, stride, padding, one, ceil_mode, count_include_pad);
}

kn_tensor *kn_adaptive_avg_pool2d(kn_ctx *ctx, kn_tensor *x, int64_t out_h, int64_t out_w) {
    if (!x) return NULL;
    if (!check_pool_input(ctx, "adaptive_avg_pool2d", x)) return NULL;
    int nd = x->ndim;
    if (out_h < 1 || out_w < 1 || x->shape[nd - 2] < 1 || x->shape[nd - 1] < 1) {
        char s[160];
        return kn__fail(ctx, KN_ERR_INVALID, "adaptive_avg_pool2d: output size (%lld,%lld) must be >= 1 and the input %s non-empty",
                        (long long)out_h, (long long)out_w, kn__shape_str(x, s, sizeof s));
    }
    int64_t shape[KN_MAX_DIMS];
    for (int i = 0; i < nd; i++) shape[i] = x->shape[i];
    shape[nd - 2] = out_h; shape[nd - 1] = out_w;
    return kn__node(ctx, KN_OP_ADAPTIVE_AVG_POOL2D, x->dtype, nd, shape, x->sym, &x, 1);
}

/* ---- attention ------------------------------------------------------------------ */
kn_tensor *kn_sdpa(kn_ctx *ctx, kn_tensor *q, kn_tensor *k, kn_tensor *v, bool causal, double scale) {
    return kn_sdpa_ex(ctx, q, k, v, causal, scale, 0, 0);
}
kn_tensor *kn_sdpa_ex(kn_ctx *ctx, kn_tensor *q, kn_tensor *k, kn_tensor *v, bool causal, double scale, int64_t window,
                      double softcap) {
    if (!q || !k || !v) return NULL;
    char s1[160], s2[160], s3[160];
    if (!need_float(ctx, "sdpa", q, "q") || !need_float(ctx, "sdpa", k, "k") || !need_float(ctx, "sdpa", v, "v")) return NULL;
    bool ok = q->ndim == 4 && k->ndim == 4 && v->ndim == 4 && q->shape[0] == k->shape[0] && k->shape[0] == v->shape[0] &&
              k->shape[1] == v->shape[1] && k->shape[2] == v->shape[2] && q->shape[3] == k->shape[3] &&
              k->sym[2] == v->sym[2] && q->sym[0] == k->sym[0] && k->sym[0] == v->sym[0] &&
              !q->sym[1] && !k->sym[1] && !q->sym[3] && !k->sym[3] && !v->sym[3];
    if (!ok)
        return kn__fail(ctx, KN_ERR_INVALID, "sdpa: expects q [B,Hq,Tq,D], k [B,Hkv,Tk,D], v [B,Hkv,Tk,Dv]; got q %s, k %s, v %s",
                        kn__shape_str(q, s1, sizeof s1), kn__shape_str(k, s2, sizeof s2), kn__shape_str(v, s3, sizeof s3));
    if (k->shape[1] < 1 || q->shape[1] % k->shape[1])
        return kn__fail(ctx, KN_ERR_INVALID, "sdpa: the %lld query heads must be a multiple of the %lld key/value heads (grouped-query); q %s, k %s",
                        (long long)q->shape[1], (long long)k->shape[1], kn__shape_str(q, s1, sizeof s1), kn__shape_str(k, s2, sizeof s2));
    if (!(scale >= 0) || isinf(scale)) return kn__fail(ctx, KN_ERR_INVALID, "sdpa: scale = %g must be finite and >= 0 (0 means 1/sqrt(D))", scale);
    if (window < 0 || (window > 0 && !causal))
        return kn__fail(ctx, KN_ERR_INVALID, "sdpa: window = %lld must be 0 (off) or positive with causal attention",
                        (long long)window);
    if (!(softcap >= 0) || isinf(softcap))
        return kn__fail(ctx, KN_ERR_INVALID, "sdpa: softcap = %g must be finite and >= 0 (0 = off)", softcap);
    if (scale == 0) scale = q->shape[3] > 0 ? 1.0 / sqrt((double)q->shape[3]) : 1.0;
    int64_t shape[4] = {q->shape[0], q->shape[1], q->shape[2], v->shape[3]};
    int8_t sym[4] = {q->sym[0], 0, q->sym[2], 0};
    kn_tensor *src[3] = {q, k, v};
    kn_dtype dt = kn__promote(kn__promote(q->dtype, k->dtype), v->dtype);
    kn_tensor *t = kn__node(ctx, KN_OP_SDPA, dt, 4, shape, sym, src, 3);
    if (t) {
        t->p.sdpa.causal = causal; t->p.sdpa.scale = scale;
        t->p.sdpa.window = window; t->p.sdpa.softcap = softcap;
        /* a gradient will want each row's log-sum-exp: a kernel that computes
         * it anyway (the CUDA flash forward) keeps it (kn__aux_bytes), and the
         * gradient's kernel does not recompute Q K^T for it. Only where the
         * flash kernels can run: 16-bit operands, fixed sizes, no window or cap */
        bool half = (dt == KN_BF16 || dt == KN_F16) && q->dtype == dt && k->dtype == dt && v->dtype == dt;
        bool fixed = !sym[0] && !sym[2] && !k->sym[0] && !k->sym[2];
        t->p.sdpa.lse = (t->flags & KN_FLAG_REQUIRES_GRAD) && half && fixed && !window && !softcap;
    }
    return t;
}

/* The bytes of the by-product a node keeps for its gradient: an sdpa node
 * with p.sdpa.lse keeps the log2-domain log-sum-exp of each query row, f32
 * [B, Hq, Tq], written by a backend whose kernel computes it (others leave
 * it unwritten; the flash gradient reads it only where the flash forward
 * ran, which the two kernels' common conditions guarantee: flash_attn.cu).
 * A plan gives it its own arena block, or room from kn__aux_offset (16-byte
 * aligned, after the elements) in a persistent buffer (runtime/memplan.c);
 * backends find it in kn_exec.aux / src_aux. */
size_t kn__aux_offset(const kn_tensor *t) {
    return (kn_dtype_nbytes(t->dtype, kn_numel(t)) + 15) & ~(size_t)15;
}
size_t kn__aux_bytes(const kn_tensor *t) {
    if (t->op != KN_OP_SDPA || !t->p.sdpa.lse) return 0;
    return sizeof(float) * (size_t)(t->shape[0] * t->shape[1] * t->shape[2]);
}

/* sdpa's gradient as one node (made by the sdpa rule in autograd/rules_nn.c).
 * t is the sdpa node, g = dL/dy [B,Hq,Tq,Dv]. The node's output packs
 * dq [B,Hq,Tq,D], dk [B,Hkv,Tk,D] and dv [B,Hkv,Tk,Dv] one after the other,
 * each contiguous: one buffer, one pass over the heads; *dq, *dk, *dv are
 * views of it. Per query row i (p = softmax of the masked scores):
 *   dp_j = g_i . v_j,  ds_j = scale * p_j (dp_j - sum_l p_l dp_l),
 *   dq_i = sum_j ds_j k_j,  dk_j += ds_j q_i,  dv_j += p_j g_i
 * (with a softcap c, ds_j is also multiplied by 1 - tanh^2(scale q_i.k_j / c),
 * the derivative of the cap; a window only narrows the keys j)
 * (the key/value gradients summed over each query group). A query row with
 * no key (causal, Tq > Tk: its output is NaN) gets a NaN dq row and adds
 * nothing to dk, dv. Fixed sizes only (no symbolic dims).
 * Sources q, k, v, g and y = t (the forward's output): the flash kernels
 * take sum_l p_l dp_l = g_i . y_i from it instead of recomputing P V; the
 * other kernels ignore it. */
kn_status kn__sdpa_bwd(kn_ctx *ctx, kn_tensor *t, kn_tensor *g, kn_tensor **dq, kn_tensor **dk, kn_tensor **dv) {
    *dq = *dk = *dv = NULL;
    kn_tensor *q = t->src[0], *k = t->src[1], *v = t->src[2];
    int64_t nq = kn_numel(q), nk = kn_numel(k), nv = kn_numel(v), n = nq + nk + nv;
    kn_tensor *src[5] = {q, k, v, g, t};
    kn_dtype dt = kn__promote(t->dtype, g->dtype);
    kn_tensor *d = kn__node(ctx, KN_OP_SDPA_BWD, dt, 1, &n, NULL, src, 5);
    if (!d) return kn_ctx_status(ctx);
    d->p.sdpa = t->p.sdpa;
    *dq = kn_reshape(ctx, kn_narrow(ctx, d, 0, 0, nq), 4, q->shape);
    *dk = kn_reshape(ctx, kn_narrow(ctx, d, 0, nq, nk), 4, k->shape);
    *dv = kn_reshape(ctx, kn_narrow(ctx, d, 0, nq + nk, nv), 4, v->shape);
    return (*dq && *dk && *dv) ? KN_OK : kn_ctx_status(ctx);
}

/* ---- rope ------------------------------------------------------------------------
 * angle(t, i) = pos[t] * freq_scale * theta^(-2i/n_rot) / ff[i], i < n_rot/2 (ff
 * = 1 without freq factors). A negative freq_scale rotates the other way:
 * rope(rope(x, f), -f) == x (the gradient rule uses exactly that). */
kn_tensor *kn_rope(kn_ctx *ctx, kn_tensor *x, kn_tensor *pos, int n_rot, double theta, bool neox, double freq_scale) {
    return kn_rope_ff(ctx, x, pos, n_rot, theta, neox, freq_scale, NULL);
}
kn_tensor *kn_rope_ff(kn_ctx *ctx, kn_tensor *x, kn_tensor *pos, int n_rot, double theta, bool neox, double freq_scale,
                      kn_tensor *ff) {
    if (!x || !pos) return NULL;
    char s1[160], s2[160];
    if (!need_float(ctx, "rope", x, "x")) return NULL;
    if (x->ndim < 2)
        return kn__fail(ctx, KN_ERR_INVALID, "rope: x must be [..., T, D], got %s", kn__shape_str(x, s1, sizeof s1));
    const kn_dtype_info *pi = kn_dtype_get(pos->dtype);
    int64_t T = x->shape[x->ndim - 2], D = x->shape[x->ndim - 1];
    if (pi->is_float || pi->is_quant || pos->dtype == KN_BOOL || pos->ndim != 1 || pos->shape[0] != T ||
        pos->sym[0] != x->sym[x->ndim - 2])
        return kn__fail(ctx, KN_ERR_INVALID, "rope: pos must be an integer [T] tensor matching x %s (T = %lld), got %s %s",
                        kn__shape_str(x, s1, sizeof s1), (long long)T, kn_dtype_name(pos->dtype), kn__shape_str(pos, s2, sizeof s2));
    if (x->sym[x->ndim - 1])
        return kn__fail(ctx, KN_ERR_INVALID, "rope: the last dim of x %s must not be symbolic", kn__shape_str(x, s1, sizeof s1));
    if (n_rot < 2 || n_rot % 2 || n_rot > D)
        return kn__fail(ctx, KN_ERR_INVALID, "rope: n_rot = %d must be even, >= 2 and <= D = %lld (x %s)",
                        n_rot, (long long)D, kn__shape_str(x, s1, sizeof s1));
    if (!(theta > 0) || isinf(theta) || !isfinite(freq_scale))
        return kn__fail(ctx, KN_ERR_INVALID, "rope: theta = %g must be finite and > 0, freq_scale = %g finite", theta, freq_scale);
    if (ff && (!kn_dtype_get(ff->dtype)->is_float || ff->ndim != 1 || ff->shape[0] != n_rot / 2 || ff->sym[0]))
        return kn__fail(ctx, KN_ERR_INVALID, "rope: freq factors must be a float [n_rot/2 = %d] tensor, got %s %s",
                        n_rot / 2, kn_dtype_name(ff->dtype), kn__shape_str(ff, s2, sizeof s2));
    kn_tensor *src[3] = {x, pos, ff};
    kn_tensor *t = kn__node(ctx, KN_OP_ROPE, x->dtype, x->ndim, x->shape, x->sym, src, ff ? 3 : 2);
    if (t) { t->p.rope.theta = theta; t->p.rope.n_rot = n_rot; t->p.rope.neox = neox; t->p.rope.freq_scale = freq_scale; }
    return t;
}
