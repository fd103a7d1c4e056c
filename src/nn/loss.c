/* loss.c: losses as composites of core ops, so autograd differentiates
 * them. Cross-entropy is one fused node per row (CROSS_ENTROPY, its gradient
 * CROSS_ENTROPY_BWD: src/graph/ops_loss.c) plus the [N]-sized masks and
 * reductions; KN_CE_COMPOSITE=1 builds the older composite on log_softmax
 * instead (the same values; kept for comparison). nll_loss is the
 * composite's tail. N rows, C classes; targets are integer class ids. */
#include "nn-impl.h"
#include "core/env.h"          // defines: kn_env_get (KN_CE_COMPOSITE)
#include <math.h>
#include <string.h>

kn_ce_opts kn_ce_defaults(void) { return (kn_ce_opts){KN_REDUCE_MEAN, -100, 0.0}; }

static kn_tensor *reduce(kn_ctx *ctx, kn_tensor *l, kn_reduction r) {
    switch (r) {
    case KN_REDUCE_MEAN: return kn_mean_all(ctx, l);
    case KN_REDUCE_SUM: return kn_sum_all(ctx, l);
    default: return l;
    }
}

static bool same_shape(kn_ctx *ctx, const char *op, kn_tensor *x, kn_tensor *y) {
    if (kn_same_shape(x, y)) return true;
    char a[160], b[160];
    kn__fail(ctx, KN_ERR_INVALID, "%s: input %s and target %s must have the same shape", op,
             kn__shape_str(x, a, sizeof a), kn__shape_str(y, b, sizeof b));
    return false;
}

static bool is_int(const kn_tensor *t) {
    const kn_dtype_info *d = kn_dtype_get(t->dtype);
    return !d->is_float && !d->is_quant && t->dtype != KN_BOOL;
}

/* shared by cross-entropy and NLL: logp [..., C] log-probabilities */
/* the checks both paths share: integer targets of the logits' shape without the class dim */
static bool ce_args_ok(kn_ctx *ctx, const char *op, kn_tensor *logp, kn_tensor *targets, const kn_ce_opts *d, bool smoothing_ok) {
    char a[160], b[160];
    if (!is_int(targets)) {
        kn__fail(ctx, KN_ERR_INVALID, "%s: targets must be integer class ids, got %s", op, kn_dtype_name(targets->dtype));
        return false;
    }
    bool ok = logp->ndim == targets->ndim + 1;
    for (int i = 0; ok && i < targets->ndim; i++) ok = logp->shape[i] == targets->shape[i];
    if (!ok) {
        kn__fail(ctx, KN_ERR_INVALID, "%s: logits %s (classes last) and targets %s do not match: targets must be the logits' shape without the class dim",
                 op, kn__shape_str(logp, a, sizeof a), kn__shape_str(targets, b, sizeof b));
        return false;
    }
    if (!(d->label_smoothing >= 0 && d->label_smoothing < 1) || (!smoothing_ok && d->label_smoothing != 0)) {
        kn__fail(ctx, KN_ERR_INVALID, "%s: label_smoothing %g must be in [0, 1) (and 0 for nll_loss)", op, d->label_smoothing);
        return false;
    }
    return true;
}

static kn_tensor *nll_core(kn_ctx *ctx, const char *op, kn_tensor *logp, kn_tensor *targets, const kn_ce_opts *o, bool smoothing_ok) {
    kn_ce_opts d = o ? *o : kn_ce_defaults();
    if (!ce_args_ok(ctx, op, logp, targets, &d, smoothing_ok)) return NULL;
    int64_t C = logp->shape[logp->ndim - 1], N = kn_numel(targets);
    kn_tensor *lp = kn_reshape(ctx, logp, 2, (int64_t[]){N, C});
    kn_tensor *t = kn_reshape(ctx, targets, 1, &N);
    kn_tensor *valid = kn_ne(ctx, t, kn_scalar(ctx, t->dtype, (double)d.ignore_index));
    kn_tensor *safe = kn_where(ctx, valid, t, kn_scalar(ctx, t->dtype, 0));
    kn_tensor *idx = kn_reshape(ctx, kn_cast(ctx, safe, KN_I64), 2, (int64_t[]){N, 1});
    kn_tensor *picked = kn_reshape(ctx, kn_gather(ctx, lp, 1, idx), 1, &N);     /* [N] */
    kn_tensor *vf = kn_cast(ctx, valid, logp->dtype);
    kn_tensor *loss = kn_mul(ctx, kn_neg(ctx, picked), vf);
    if (d.label_smoothing > 0) {
        int ax = 1;
        kn_tensor *smooth = kn_mul(ctx, kn_neg(ctx, kn_mean(ctx, lp, 1, &ax, false)), vf);
        loss = kn_add(ctx, kn_mul_scalar(ctx, loss, 1 - d.label_smoothing), kn_mul_scalar(ctx, smooth, d.label_smoothing));
    }
    switch (d.reduction) {
    case KN_REDUCE_MEAN: return kn_div(ctx, kn_sum_all(ctx, loss), kn_sum_all(ctx, vf));   /* NaN if all ignored, like torch */
    case KN_REDUCE_SUM: return kn_sum_all(ctx, loss);
    default: return kn_reshape(ctx, loss, targets->ndim, targets->shape);
    }
}

/* The fused path: per-row losses from one CROSS_ENTROPY node, then the
 * reduction over [N]. Logits that are a widening cast of bf16/f16 (the
 * mixed-precision classifier: kn__mod_linear casts its bf16 product to f32)
 * are read before the cast: the values are the same, the [N, C] f32 copy is
 * never made, and the gradient comes back in bf16/f16 directly (where the
 * composite rounded its f32 gradient through the cast's rule). So no
 * gradient is recorded for the cast node itself. */
static kn_tensor *ce_fused(kn_ctx *ctx, kn_tensor *logits, kn_tensor *targets, const kn_ce_opts *o) {
    kn_ce_opts d = o ? *o : kn_ce_defaults();
    if (!ce_args_ok(ctx, "cross_entropy", logits, targets, &d, true)) return NULL;
    kn_tensor *x = logits;
    if (x->op == KN_OP_CAST && x->dtype == KN_F32 && x->src[0] && (x->src[0]->dtype == KN_BF16 || x->src[0]->dtype == KN_F16))
        x = x->src[0];
    int64_t C = x->shape[x->ndim - 1], N = kn_numel(targets);
    kn_tensor *x2 = kn_reshape(ctx, x, 2, (int64_t[]){N, C});
    kn_tensor *t = kn_reshape(ctx, targets, 1, &N);
    kn_tensor *loss = kn_cross_entropy_rows(ctx, x2, t, d.ignore_index, d.label_smoothing);   /* [N], 0 where ignored */
    if (!loss) return NULL;
    switch (d.reduction) {
    case KN_REDUCE_MEAN: {                 /* NaN if all ignored, like torch */
        kn_tensor *vf = kn_cast(ctx, kn_ne(ctx, t, kn_scalar(ctx, t->dtype, (double)d.ignore_index)), loss->dtype);
        return kn_div(ctx, kn_sum_all(ctx, loss), kn_sum_all(ctx, vf));
    }
    case KN_REDUCE_SUM: return kn_sum_all(ctx, loss);
    default: return kn_reshape(ctx, loss, targets->ndim, targets->shape);
    }
}

kn_tensor *kn_cross_entropy(kn_ctx *ctx, kn_tensor *logits, kn_tensor *targets, const kn_ce_opts *o) {
    if (!logits || !targets) return NULL;
    if (logits->ndim < 1) return kn__fail(ctx, KN_ERR_INVALID, "cross_entropy: logits must have a class dim");
    if (!kn_env_get()->ce_composite) return ce_fused(ctx, logits, targets, o);
    return nll_core(ctx, "cross_entropy", kn_log_softmax(ctx, logits, -1), targets, o, true);
}
kn_tensor *kn_nll_loss(kn_ctx *ctx, kn_tensor *logp, kn_tensor *targets, const kn_ce_opts *o) {
    if (!logp || !targets) return NULL;
    if (logp->ndim < 1) return kn__fail(ctx, KN_ERR_INVALID, "nll_loss: log-probabilities must have a class dim");
    return nll_core(ctx, "nll_loss", logp, targets, o, false);
}

kn_tensor *kn_mse_loss(kn_ctx *ctx, kn_tensor *x, kn_tensor *y, kn_reduction r) {
    if (!x || !y || !same_shape(ctx, "mse_loss", x, y)) return NULL;
    return reduce(ctx, kn_square(ctx, kn_sub(ctx, x, y)), r);
}
kn_tensor *kn_l1_loss(kn_ctx *ctx, kn_tensor *x, kn_tensor *y, kn_reduction r) {
    if (!x || !y || !same_shape(ctx, "l1_loss", x, y)) return NULL;
    return reduce(ctx, kn_abs(ctx, kn_sub(ctx, x, y)), r);
}
/* quadratic below `thr`, linear above: 0.5 d^2 * qs  vs  ls * (|d| - 0.5 thr) */
static kn_tensor *robust(kn_ctx *ctx, const char *op, kn_tensor *x, kn_tensor *y, double thr, double qs, double ls, kn_reduction r) {
    if (!x || !y || !same_shape(ctx, op, x, y)) return NULL;
    if (!(thr > 0)) return kn__fail(ctx, KN_ERR_INVALID, "%s: delta/beta = %g must be > 0", op, thr);
    kn_tensor *d = kn_sub(ctx, x, y), *ad = kn_abs(ctx, d);
    kn_tensor *quad = kn_mul_scalar(ctx, kn_square(ctx, d), 0.5 * qs);
    kn_tensor *lin = kn_mul_scalar(ctx, kn_add_scalar(ctx, ad, -0.5 * thr), ls);
    kn_tensor *small = kn_lt(ctx, ad, kn_scalar(ctx, ad ? ad->dtype : KN_F32, thr));
    return reduce(ctx, kn_where(ctx, small, quad, lin), r);
}
kn_tensor *kn_huber_loss(kn_ctx *ctx, kn_tensor *x, kn_tensor *y, double delta, kn_reduction r) {
    return robust(ctx, "huber_loss", x, y, delta, 1.0, delta, r);
}
kn_tensor *kn_smooth_l1_loss(kn_ctx *ctx, kn_tensor *x, kn_tensor *y, double beta, kn_reduction r) {
    return robust(ctx, "smooth_l1_loss", x, y, beta, 1.0 / beta, 1.0, r);
}

kn_tensor *kn_bce_loss(kn_ctx *ctx, kn_tensor *p, kn_tensor *y, kn_reduction r) {
    if (!p || !y || !same_shape(ctx, "bce_loss", p, y)) return NULL;
    kn_tensor *lp = kn_clamp(ctx, kn_log(ctx, p), -100, INFINITY);
    kn_tensor *lq = kn_clamp(ctx, kn_log(ctx, kn_add_scalar(ctx, kn_neg(ctx, p), 1)), -100, INFINITY);
    kn_tensor *l = kn_add(ctx, kn_mul(ctx, y, lp), kn_mul(ctx, kn_add_scalar(ctx, kn_neg(ctx, y), 1), lq));
    return reduce(ctx, kn_neg(ctx, l), r);
}

kn_tensor *kn_bce_with_logits_loss(kn_ctx *ctx, kn_tensor *x, kn_tensor *y, kn_tensor *pos_weight, kn_reduction r) {
    if (!x || !y || !same_shape(ctx, "bce_with_logits_loss", x, y)) return NULL;
    /* (1-y) x + w (log1p(exp(-|x|)) + relu(-x)), w = 1 + (pos_weight-1) y */
    kn_tensor *sp = kn_add(ctx, kn_log1p(ctx, kn_exp(ctx, kn_neg(ctx, kn_abs(ctx, x)))), kn_relu(ctx, kn_neg(ctx, x)));
    if (pos_weight) sp = kn_mul(ctx, sp, kn_add_scalar(ctx, kn_mul(ctx, kn_add_scalar(ctx, pos_weight, -1), y), 1));
    kn_tensor *l = kn_add(ctx, kn_mul(ctx, kn_add_scalar(ctx, kn_neg(ctx, y), 1), x), sp);
    return reduce(ctx, l, r);
}

kn_tensor *kn_kl_div_loss(kn_ctx *ctx, kn_tensor *logq, kn_tensor *target, bool log_target, kn_kl_reduction r) {
    if (!logq || !target || !same_shape(ctx, "kl_div_loss", logq, target)) return NULL;
    kn_tensor *l;
    if (log_target) l = kn_mul(ctx, kn_exp(ctx, target), kn_sub(ctx, target, logq));
    else {
        /* 0 * log 0 = 0 (xlogy); log of 1 where target is 0 keeps gradients finite */
        kn_tensor *pos = kn_gt(ctx, target, kn_scalar(ctx, target->dtype, 0));
        kn_tensor *lt = kn_log(ctx, kn_where(ctx, pos, target, kn_scalar(ctx, target->dtype, 1)));
        l = kn_mul(ctx, target, kn_sub(ctx, lt, logq));
    }
    switch (r) {
    case KN_KL_MEAN: return kn_mean_all(ctx, l);
    case KN_KL_SUM: return kn_sum_all(ctx, l);
    case KN_KL_BATCHMEAN: return kn_mul_scalar(ctx, kn_sum_all(ctx, l), 1.0 / (double)(logq->ndim ? logq->shape[0] : 1));
    default: return l;
    }
}
