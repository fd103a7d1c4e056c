/* ref_loss.c: the reference CROSS_ENTROPY and CROSS_ENTROPY_BWD (the
 * formulas of src/graph/ops_loss.c in double, any strides: the oracle).
 *
 * Letters: N rows, C classes; the gradient node's dst is [N, Cp] (Cp >= C,
 * the pad columns get 0). Every target is checked before anything is
 * written: a bad one gives the message and leaves dst as it was.
 */
#include "backends/ref/ref.h"
#include <math.h>

/* every target in [0, C) or the ignore_index */
static kn_status check_targets(const kn_exec *e, int64_t N, int64_t C) {
    const kn_tview *tg = &e->src[1];
    int64_t ign = e->node->p.ce.ignore_index;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = kn__load_id(tg, i * tg->st[0]);
        if (t != ign && (t < 0 || t >= C)) return kn__target_error(kn_op_name(e->node->op), (double)t, C, ign);
    }
    return KN_OK;
}

/* the row's max, sum of exp(x - max) and sum of x */
typedef struct { double m, s, sx; } row_stats;
static row_stats stats(const kn_tview *x, int64_t i, int64_t C) {
    row_stats r = {-INFINITY, 0, 0};
    for (int64_t j = 0; j < C; j++) {
        double v = LD(x, i * x->st[0] + j * x->st[1]);
        if (v > r.m) r.m = v;
        r.sx += v;
    }
    /* a row of -inf (or a NaN) gives NaN below, like log_softmax */
    for (int64_t j = 0; j < C; j++) r.s += exp(LD(x, i * x->st[0] + j * x->st[1]) - r.m);
    return r;
}

static kn_status ce_fwd(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *tg = &e->src[1], *y = &e->dst;
    int64_t N = x->ne[0], C = x->ne[1], ign = e->node->p.ce.ignore_index;
    double ls = e->node->p.ce.smoothing;
    kn_status st = check_targets(e, N, C);
    if (st) return st;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = kn__load_id(tg, i * tg->st[0]);
        double l = 0;
        if (t != ign) {
            row_stats r = stats(x, i, C);
            double xt = LD(x, i * x->st[0] + t * x->st[1]);
            l = r.m + log(r.s) - (1 - ls) * xt - (ls > 0 ? ls / (double)C * r.sx : 0);
        }
        ST(y, i * y->st[0], l);
    }
    return KN_OK;
}

static kn_status ce_bwd(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *tg = &e->src[1], *g = &e->src[2], *d = &e->dst;
    int64_t N = x->ne[0], C = x->ne[1], Cp = d->ne[1], ign = e->node->p.ce.ignore_index;
    double ls = e->node->p.ce.smoothing;
    kn_status st = check_targets(e, N, C);
    if (st) return st;
    for (int64_t i = 0; i < N; i++) {
        int64_t t = kn__load_id(tg, i * tg->st[0]), o = i * d->st[0];
        if (t == ign) {
            for (int64_t j = 0; j < Cp; j++) ST(d, o + j * d->st[1], 0.0);
            continue;
        }
        row_stats r = stats(x, i, C);
        double gi = LD(g, i * g->st[0]);
        for (int64_t j = 0; j < Cp; j++) {
            double v = 0;
            if (j < C) {
                double p = exp(LD(x, i * x->st[0] + j * x->st[1]) - r.m) / r.s;
                v = gi * (p - (j == t ? 1 - ls : 0) - ls / (double)C);
            }
            ST(d, o + j * d->st[1], v);
        }
    }
    return KN_OK;
}

kn_status kn_ref_cross_entropy(const kn_exec *e) {
    return e->node->op == KN_OP_CROSS_ENTROPY ? ce_fwd(e) : ce_bwd(e);
}
