/* layers.c: basic layers as modules: Linear, Embedding, LayerNorm, RMSNorm,
 * BatchNorm1d/2d, GroupNorm, Dropout, Conv1d/2d, ConvTranspose2d, pools,
 * Flatten, activations, Sequential. Each checks its input shape and names
 * itself in the error; the math is the core op (include/kiln.h).
 * PyTorch's default initialisation per layer is reproduced in distribution
 * (not bit for bit: the generator is Philox, see kn_nn_manual_seed). */
#include "nn-impl.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void *zalloc(size_t n) { return calloc(1, n); }

/* torch's default for Linear/Conv: kaiming_uniform(a=sqrt(5)) = U(+-1/sqrt(fan_in)),
 * bias U(+-1/sqrt(fan_in)) with the weight's fan_in. */
static kn_status init_torch_default(kn_tensor *w, kn_tensor *b) {
    kn_status st = kn_init_kaiming_uniform(w, sqrt(5.0), KN_NONLIN_LEAKY_RELU, false);
    if (!st && b) {
        int64_t fi; kn_init_fans(w, &fi, NULL);
        double bound = fi > 0 ? 1.0 / sqrt((double)fi) : 0;
        st = kn_init_uniform(b, -bound, bound);
    }
    return st;
}

static kn_module *fail_free(kn_module *m) { kn_module_free(m); return NULL; }

/* ---- Linear ------------------------------------------------------------------ */
typedef struct { int64_t in, out; kn_tensor *w, *b; } linear_t;
static kn_tensor *linear_fwd(kn_module *m, kn_tensor *x) {
    linear_t *l = m->impl;
    if (!kn__mod_check(m, x, 1, KN_MAX_DIMS, -1, l->in, "last dim must be in_features")) return NULL;
    return kn__mod_linear(m, x, l->w, l->b);
}
kn_module *kn_linear_new(kn_ctx *ctx, int64_t in, int64_t out, bool bias) {
    if (in <= 0 || out <= 0) { kn__fail(ctx, KN_ERR_INVALID, "Linear: in_features %lld and out_features %lld must be positive", (long long)in, (long long)out); return NULL; }
    linear_t *l = zalloc(sizeof *l);
    kn_module *m = kn_module_new(ctx, "Linear", linear_fwd, l, true);
    if (!m) return NULL;
    l->in = in; l->out = out;
    kn__param_new(m, "weight", 2, (int64_t[]){out, in}, false, &l->w);
    if (bias) kn__param_new(m, "bias", 1, &out, true, &l->b);
    if (!l->w || (bias && !l->b) || init_torch_default(l->w, l->b)) return fail_free(m);
    return m;
}

/* ---- Embedding --------------------------------------------------------------- */
typedef struct { int64_t n, dim; kn_tensor *w; } embedding_t;
static kn_tensor *embedding_fwd(kn_module *m, kn_tensor *ids) {
    embedding_t *e = m->impl;
    const kn_dtype_info *di = kn_dtype_get(ids->dtype);
    if (di->is_float || di->is_quant || ids->dtype == KN_BOOL)
        return kn__mod_fail(m, "ids must be an integer tensor, got %s", kn_dtype_name(ids->dtype));
    return kn_embedding(m->ctx, e->w, ids);
}
kn_module *kn_embedding_new(kn_ctx *ctx, int64_t n, int64_t dim) {
    if (n <= 0 || dim <= 0) { kn__fail(ctx, KN_ERR_INVALID, "Embedding: num_embeddings %lld and dim %lld must be positive", (long long)n, (long long)dim); return NULL; }
    embedding_t *e = zalloc(sizeof *e);
    kn_module *m = kn_module_new(ctx, "Embedding", embedding_fwd, e, true);
    if (!m) return NULL;
    e->n = n; e->dim = dim;
    kn__param_new(m, "weight", 2, (int64_t[]){n, dim}, false, &e->w);
    if (!e->w || kn_init_normal(e->w, 0, 1)) return fail_free(m);
    return m;
}

/* ---- LayerNorm, RMSNorm --------------------------------------------------------- */
typedef struct { int64_t dim; double eps; kn_tensor *w, *b; bool rms; } norm_t;
static kn_tensor *norm_fwd(kn_module *m, kn_tensor *x) {
    norm_t *n = m->impl;
    if (!kn__mod_check(m, x, 1, KN_MAX_DIMS, -1, n->dim, "last dim must be the normalised size")) return NULL;
    return n->rms ? kn_rms_norm(m->ctx, x, 1, n->w, n->eps) : kn_layer_norm(m->ctx, x, 1, n->w, n->b, n->eps);
}
static kn_module *norm_new(kn_ctx *ctx, const char *kind, int64_t dim, double eps, bool affine, bool bias, bool rms) {
    if (dim <= 0 || !(eps >= 0)) { kn__fail(ctx, KN_ERR_INVALID, "%s: dim %lld must be positive and eps %g >= 0", kind, (long long)dim, eps); return NULL; }
    norm_t *n = zalloc(sizeof *n);
    kn_module *m = kn_module_new(ctx, kind, norm_fwd, n, true);
    if (!m) return NULL;
    n->dim = dim; n->eps = eps; n->rms = rms;
    if (affine) {
        kn__param_new(m, "weight", 1, &dim, true, &n->w);
        if (!n->w || kn_init_ones(n->w)) return fail_free(m);
        if (bias) {
            kn__param_new(m, "bias", 1, &dim, true, &n->b);
            if (!n->b || kn_init_zeros(n->b)) return fail_free(m);
        }
    }
    return m;
}
kn_module *kn_layer_norm_new(kn_ctx *ctx, int64_t dim, double eps, bool affine, bool bias) {
    return norm_new(ctx, "LayerNorm", dim, eps, affine, bias, false);
}
kn_module *kn_rms_norm_new(kn_ctx *ctx, int64_t dim, double eps) { return norm_new(ctx, "RMSNorm", dim, eps, true, false, true); }

/* ---- BatchNorm1d/2d ----------------------------------------------------------------- */
typedef struct { int64_t c; double eps, momentum; int lo, hi; kn_tensor *w, *b, *rm, *rv; } bn_t;
static kn_tensor *bn_fwd(kn_module *m, kn_tensor *x) {
    bn_t *n = m->impl;
    kn_ctx *ctx = m->ctx;
    if (!kn__mod_check(m, x, n->lo, n->hi, 1, n->c, "dim 1 must be the channel count")) return NULL;
    if (!m->training) return kn_batch_norm(ctx, x, n->rm, n->rv, n->w, n->b, false, n->eps);
    int64_t cnt = kn_numel(x) / n->c;
    if (cnt <= 1) return kn__mod_fail(m, "training needs more than 1 value per channel, got %lld", (long long)cnt);
    kn_tensor *y = kn_batch_norm(ctx, x, NULL, NULL, n->w, n->b, true, n->eps);
    /* running stats (torch: unbiased batch variance, momentum-weighted) */
    int axes[KN_MAX_DIMS], na = 0;
    for (int i = 0; i < x->ndim; i++) if (i != 1) axes[na++] = i;
    kn_no_grad_begin(ctx);
    kn_tensor *xd = kn_detach(ctx, x);
    if (xd && xd->dtype != KN_F32) xd = kn_cast(ctx, xd, KN_F32);
    kn_tensor *mean = kn_mean(ctx, xd, na, axes, false);
    kn_tensor *var = kn_var(ctx, xd, na, axes, 1, false);
    kn_tensor *rm = kn_add(ctx, kn_mul_scalar(ctx, n->rm, 1 - n->momentum), kn_mul_scalar(ctx, mean, n->momentum));
    kn_tensor *rv = kn_add(ctx, kn_mul_scalar(ctx, n->rv, 1 - n->momentum), kn_mul_scalar(ctx, var, n->momentum));
    kn_tensor *e1 = kn_assign(ctx, n->rm, rm), *e2 = kn_assign(ctx, n->rv, rv);
    kn_no_grad_end(ctx);
    if (!e1 || !e2 || kn__mod_push_effect(m, e1) || kn__mod_push_effect(m, e2)) return NULL;
    return y;
}
static kn_module *bn_new(kn_ctx *ctx, const char *kind, int lo, int hi, int64_t c, double eps, double momentum, bool affine) {
    if (c <= 0 || !(eps >= 0) || !(momentum >= 0 && momentum <= 1)) {
        kn__fail(ctx, KN_ERR_INVALID, "%s: channels %lld must be positive, eps %g >= 0, momentum %g in [0,1]", kind, (long long)c, eps, momentum);
        return NULL;
    }
    bn_t *n = zalloc(sizeof *n);
    kn_module *m = kn_module_new(ctx, kind, bn_fwd, n, true);
    if (!m) return NULL;
    n->c = c; n->eps = eps; n->momentum = momentum; n->lo = lo; n->hi = hi;
    if (affine) {
        kn__param_new(m, "weight", 1, &c, true, &n->w);
        kn__param_new(m, "bias", 1, &c, true, &n->b);
        if (!n->w || !n->b || kn_init_ones(n->w) || kn_init_zeros(n->b)) return fail_free(m);
    }
    kn__buffer_new(m, "running_mean", 1, &c, &n->rm);
    kn__buffer_new(m, "running_var", 1, &c, &n->rv);
    if (!n->rm || !n->rv || kn_init_zeros(n->rm) || kn_init_ones(n->rv)) return fail_free(m);
    return m;
}
kn_module *kn_batch_norm1d_new(kn_ctx *ctx, int64_t c, double eps, double momentum, bool affine) {
    return bn_new(ctx, "BatchNorm1d", 2, 3, c, eps, momentum, affine);
}
kn_module *kn_batch_norm2d_new(kn_ctx *ctx, int64_t c, double eps, double momentum, bool affine) {
    return bn_new(ctx, "BatchNorm2d", 4, 4, c, eps, momentum, affine);
}

/* ---- GroupNorm ---------------------------------------------------------------------- */
typedef struct { int groups; int64_t c; double eps; kn_tensor *w, *b; } gn_t;
static kn_tensor *gn_fwd(kn_module *m, kn_tensor *x) {
    gn_t *n = m->impl;
    if (!kn__mod_check(m, x, 2, KN_MAX_DIMS, 1, n->c, "dim 1 must be the channel count")) return NULL;
    return kn_group_norm(m->ctx, x, n->groups, n->w, n->b, n->eps);
}
kn_module *kn_group_norm_new(kn_ctx *ctx, int groups, int64_t c, double eps, bool affine) {
    if (groups <= 0 || c <= 0 || c % groups) {
        kn__fail(ctx, KN_ERR_INVALID, "GroupNorm: groups %d must be positive and divide channels %lld", groups, (long long)c);
        return NULL;
    }
    gn_t *n = zalloc(sizeof *n);
    kn_module *m = kn_module_new(ctx, "GroupNorm", gn_fwd, n, true);
    if (!m) return NULL;
    n->groups = groups; n->c = c; n->eps = eps;
    if (affine) {
        kn__param_new(m, "weight", 1, &c, true, &n->w);
        kn__param_new(m, "bias", 1, &c, true, &n->b);
        if (!n->w || !n->b || kn_init_ones(n->w) || kn_init_zeros(n->b)) return fail_free(m);
    }
    return m;
}

/* ---- Dropout ---------------------------------------------------------------------------- */
typedef struct { double p; uint64_t seed; } dropout_t;
static kn_tensor *dropout_fwd(kn_module *m, kn_tensor *x) {
    dropout_t *d = m->impl;
    return kn__mod_dropout(m, x, d->p, d->seed);
}
kn_module *kn_dropout_new(kn_ctx *ctx, double p) {
    if (!(p >= 0 && p <= 1)) { kn__fail(ctx, KN_ERR_INVALID, "Dropout: p = %g must be in [0, 1]", p); return NULL; }
    dropout_t *d = zalloc(sizeof *d);
    kn_module *m = kn_module_new(ctx, "Dropout", dropout_fwd, d, true);
    if (!m) return NULL;
    d->p = p; d->seed = kn_nn_next_seed();
    return m;
}

/* ---- convolutions -------------------------------------------------------------------------- */
typedef struct {
    int nd; bool transposed; int64_t in, out;
    int stride[2], padding[2], dilation[2], output_padding[2], groups;
    kn_tensor *w, *b;
} conv_t;
static kn_tensor *conv_fwd(kn_module *m, kn_tensor *x) {
    conv_t *c = m->impl;
    if (!kn__mod_check(m, x, c->nd + 2, c->nd + 2, 1, c->in, c->nd == 1 ? "[B,C,L] with C = in_channels" : "[B,C,H,W] with C = in_channels")) return NULL;
    if (c->nd == 1) return kn_conv1d(m->ctx, x, c->w, c->b, c->stride[0], c->padding[0], c->dilation[0], c->groups);
    if (c->transposed) return kn_conv_transpose2d(m->ctx, x, c->w, c->b, c->stride, c->padding, c->output_padding, c->dilation, c->groups);
    return kn_conv2d(m->ctx, x, c->w, c->b, c->stride, c->padding, c->dilation, c->groups);
}
static kn_module *conv_new(kn_ctx *ctx, const char *kind, int nd, bool transposed, int64_t in, int64_t out, const int k[2],
                           const int s[2], const int p[2], const int d[2], const int op[2], int groups, bool bias) {
    if (in <= 0 || out <= 0 || groups <= 0 || in % groups || out % groups) {
        kn__fail(ctx, KN_ERR_INVALID, "%s: in_channels %lld and out_channels %lld must be positive multiples of groups %d", kind, (long long)in, (long long)out, groups);
        return NULL;
    }
    for (int i = 0; i < nd; i++)
        if (k[i] <= 0 || s[i] <= 0 || p[i] < 0 || d[i] <= 0) {
            kn__fail(ctx, KN_ERR_INVALID, "%s: kernel %d, stride %d, dilation %d must be positive and padding %d >= 0", kind, k[i], s[i], d[i], p[i]);
            return NULL;
        }
    conv_t *c = zalloc(sizeof *c);
    kn_module *m = kn_module_new(ctx, kind, conv_fwd, c, true);
    if (!m) return NULL;
    c->nd = nd; c->transposed = transposed; c->in = in; c->out = out; c->groups = groups;
    for (int i = 0; i < 2; i++) {
        c->stride[i] = i < nd ? s[i] : 1; c->padding[i] = i < nd ? p[i] : 0;
        c->dilation[i] = i < nd ? d[i] : 1; c->output_padding[i] = (op && i < nd) ? op[i] : 0;
    }
    int64_t ws[4] = {transposed ? in : out, transposed ? out / groups : in / groups, k[0], nd == 2 ? k[1] : 0};
    kn__param_new(m, "weight", nd + 2, ws, false, &c->w);
    if (bias) kn__param_new(m, "bias", 1, &out, true, &c->b);
    if (!c->w || (bias && !c->b) || init_torch_default(c->w, c->b)) return fail_free(m);
    return m;
}
kn_module *kn_conv1d_new(kn_ctx *ctx, int64_t in, int64_t out, int kernel, int stride, int padding, int dilation, int groups, bool bias) {
    int k[2] = {kernel, 1}, s[2] = {stride, 1}, p[2] = {padding, 0}, d[2] = {dilation, 1};
    return conv_new(ctx, "Conv1d", 1, false, in, out, k, s, p, d, NULL, groups, bias);
}
kn_module *kn_conv2d_new(kn_ctx *ctx, int64_t in, int64_t out, const int kernel[2], const int stride[2],
                         const int padding[2], const int dilation[2], int groups, bool bias) {
    static const int one[2] = {1, 1}, zero[2] = {0, 0};
    return conv_new(ctx, "Conv2d", 2, false, in, out, kernel, stride ? stride : one, padding ? padding : zero,
                    dilation ? dilation : one, NULL, groups, bias);
}
kn_module *kn_conv_transpose2d_new(kn_ctx *ctx, int64_t in, int64_t out, const int kernel[2], const int stride[2],
                                   const int padding[2], const int output_padding[2], int groups, bool bias) {
    static const int one[2] = {1, 1}, zero[2] = {0, 0};
    return conv_new(ctx, "ConvTranspose2d", 2, true, in, out, kernel, stride ? stride : one, padding ? padding : zero, one,
                    output_padding ? output_padding : zero, groups, bias);
}

/* ---- pools, flatten ------------------------------------------------------------------------ */
typedef struct { int kind; int k[2], s[2], p[2]; int64_t oh, ow; int start, end; } shape_op_t;
enum { POOL_MAX, POOL_AVG, POOL_ADAPTIVE, FLATTEN };
static kn_tensor *shape_op_fwd(kn_module *m, kn_tensor *x) {
    shape_op_t *o = m->impl;
    static const int one[2] = {1, 1};
    if (o->kind == FLATTEN) return kn_flatten(m->ctx, x, o->start, o->end);
    if (!kn__mod_check(m, x, 4, 4, -1, -1, "[B,C,H,W]")) return NULL;
    switch (o->kind) {
    case POOL_MAX: return kn_max_pool2d(m->ctx, x, o->k, o->s, o->p, one, false);
    case POOL_AVG: return kn_avg_pool2d(m->ctx, x, o->k, o->s, o->p, false, true);
    default: return kn_adaptive_avg_pool2d(m->ctx, x, o->oh, o->ow);
    }
}
static kn_module *pool_new(kn_ctx *ctx, const char *kind, int k, const int kernel[2], const int stride[2], const int padding[2]) {
    for (int i = 0; i < 2; i++)
        if (kernel[i] <= 0 || (stride && stride[i] <= 0) || (padding && (padding[i] < 0 || 2 * padding[i] > kernel[i]))) {
            kn__fail(ctx, KN_ERR_INVALID, "%s: kernel (%d,%d) and stride must be positive, padding at most half the kernel", kind, kernel[0], kernel[1]);
            return NULL;
        }
    shape_op_t *o = zalloc(sizeof *o);
    kn_module *m = kn_module_new(ctx, kind, shape_op_fwd, o, true);
    if (!m) return NULL;
    o->kind = k;
    for (int i = 0; i < 2; i++) {
        o->k[i] = kernel[i]; o->s[i] = stride ? stride[i] : kernel[i]; o->p[i] = padding ? padding[i] : 0;
    }
    return m;
}
kn_module *kn_max_pool2d_new(kn_ctx *ctx, const int kernel[2], const int stride[2], const int padding[2]) {
    return pool_new(ctx, "MaxPool2d", POOL_MAX, kernel, stride, padding);
}
kn_module *kn_avg_pool2d_new(kn_ctx *ctx, const int kernel[2], const int stride[2], const int padding[2]) {
    return pool_new(ctx, "AvgPool2d", POOL_AVG, kernel, stride, padding);
}
kn_module *kn_adaptive_avg_pool2d_new(kn_ctx *ctx, int64_t oh, int64_t ow) {
    if (oh <= 0 || ow <= 0) { kn__fail(ctx, KN_ERR_INVALID, "AdaptiveAvgPool2d: output size (%lld,%lld) must be positive", (long long)oh, (long long)ow); return NULL; }
    shape_op_t *o = zalloc(sizeof *o);
    kn_module *m = kn_module_new(ctx, "AdaptiveAvgPool2d", shape_op_fwd, o, true);
    if (m) { o->kind = POOL_ADAPTIVE; o->oh = oh; o->ow = ow; }
    return m;
}
kn_module *kn_flatten_new(kn_ctx *ctx, int start_dim, int end_dim) {
    shape_op_t *o = zalloc(sizeof *o);
    kn_module *m = kn_module_new(ctx, "Flatten", shape_op_fwd, o, true);
    if (m) { o->kind = FLATTEN; o->start = start_dim; o->end = end_dim; }
    return m;
}

/* ---- activations ------------------------------------------------------------------------ */
kn_tensor *kn_act_apply(kn_ctx *ctx, kn_act act, kn_tensor *x) {
    switch (act) {
    case KN_ACT_RELU: return kn_relu(ctx, x);
    case KN_ACT_GELU: return kn_gelu(ctx, x);
    case KN_ACT_GELU_TANH: return kn_gelu_tanh(ctx, x);
    case KN_ACT_SILU: return kn_silu(ctx, x);
    case KN_ACT_TANH: return kn_tanh(ctx, x);
    case KN_ACT_SIGMOID: return kn_sigmoid(ctx, x);
    case KN_ACT_LEAKY_RELU: return kn_leaky_relu(ctx, x, 0.01);
    case KN_ACT_ELU: return kn_elu(ctx, x, 1.0);
    case KN_ACT_SOFTPLUS: return kn_softplus(ctx, x);
    case KN_ACT_MISH: return kn_mish(ctx, x);
    case KN_ACT_IDENTITY: return x;
    case KN_ACT_SOFTMAX: return kn_softmax(ctx, x, -1);
    }
    return kn__fail(ctx, KN_ERR_INVALID, "activation: unknown kind %d", (int)act);
}
static const char *act_names[] = {"ReLU", "GELU", "GELUTanh", "SiLU", "Tanh", "Sigmoid", "LeakyReLU", "ELU",
                                  "Softplus", "Mish", "Identity", "Softmax"};
typedef struct { kn_act act; } act_t;
static kn_tensor *act_fwd(kn_module *m, kn_tensor *x) { return kn_act_apply(m->ctx, ((act_t *)m->impl)->act, x); }
kn_module *kn_act_new(kn_ctx *ctx, kn_act act) {
    if ((int)act < 0 || act > KN_ACT_SOFTMAX) { kn__fail(ctx, KN_ERR_INVALID, "activation: unknown kind %d", (int)act); return NULL; }
    act_t *a = zalloc(sizeof *a);
    kn_module *m = kn_module_new(ctx, act_names[act], act_fwd, a, true);
    if (m) a->act = act;
    return m;
}

/* ---- Sequential ------------------------------------------------------------------------- */
static kn_tensor *seq_fwd(kn_module *m, kn_tensor *x) {
    for (int i = 0; i < m->n_children && x; i++) x = kn_module_forward(m->children[i], x);
    return x;
}
kn_module *kn_sequential_new(kn_ctx *ctx, const char *kind) {
    return kn_module_new(ctx, kind ? kind : "Sequential", seq_fwd, NULL, false);
}
kn_status kn_sequential_add(kn_module *seq, kn_module *child) {
    char name[16];
    snprintf(name, sizeof name, "%d", seq ? seq->n_children : 0);
    return kn_module_add_child(seq, name, child);
}
