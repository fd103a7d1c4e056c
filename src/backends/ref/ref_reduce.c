/* ref_reduce.c: reductions over an axis set, scans, and matmul. */
#include "backends/ref/ref.h"
#include <math.h>
#include <stdlib.h>

/* Split x's dims into kept (K) and reduced (R) index spaces. */
typedef struct {
    int nk, nr;
    int64_t kne[KN_MAX_DIMS], kst[KN_MAX_DIMS], rne[KN_MAX_DIMS], rst[KN_MAX_DIMS];
} red_split;

static int64_t sub_off(int n, const int64_t *ne, const int64_t *st, int64_t lin) {
    int64_t o = 0;
    for (int d = n - 1; d >= 0; d--) { o += (lin % ne[d]) * st[d]; lin /= ne[d]; }
    return o;
}

kn_status kn_ref_reduce(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *d = &e->dst;
    uint32_t mask = t->p.reduce.axes;
    red_split s = {0};
    for (int i = 0; i < x->ndim; i++) {
        if (mask >> i & 1) { s.rne[s.nr] = x->ne[i]; s.rst[s.nr++] = x->st[i]; }
        else { s.kne[s.nk] = x->ne[i]; s.kst[s.nk++] = x->st[i]; }
    }
    int64_t nout = 1, nred = 1;
    for (int i = 0; i < s.nk; i++) nout *= s.kne[i];
    for (int i = 0; i < s.nr; i++) nred *= s.rne[i];
    for (int64_t o = 0; o < nout; o++) {
        int64_t xo = sub_off(s.nk, s.kne, s.kst, o);
        int64_t doff = kn_ref_off(d, o);   /* dst extents multiply to nout in the same order */
        double acc = 0, m = -INFINITY, r = 0;
        int64_t arg = 0;
        switch (t->op) {
        case KN_OP_SUM: case KN_OP_MEAN:
            for (int64_t j = 0; j < nred; j++) acc += LD(x, xo + sub_off(s.nr, s.rne, s.rst, j));
            r = t->op == KN_OP_MEAN ? acc / (double)nred : acc;
            break;
        case KN_OP_PROD:
            acc = 1;
            for (int64_t j = 0; j < nred; j++) acc *= LD(x, xo + sub_off(s.nr, s.rne, s.rst, j));
            r = acc;
            break;
        case KN_OP_MAX: case KN_OP_MIN: case KN_OP_ARGMAX: case KN_OP_ARGMIN: {
            bool mx = t->op == KN_OP_MAX || t->op == KN_OP_ARGMAX;
            m = NAN;
            /* the first NaN wins (NaN propagates, as in torch) */
            for (int64_t j = 0; j < nred; j++) {
                double v = LD(x, xo + sub_off(s.nr, s.rne, s.rst, j));
                if (j == 0) { m = v; arg = 0; }
                else if (isnan(m)) continue;
                else if (isnan(v) || (mx ? v > m : v < m)) { m = v; arg = j; }
            }
            r = (t->op == KN_OP_ARGMAX || t->op == KN_OP_ARGMIN) ? (double)arg : m;
            break;
        }
        case KN_OP_VAR: case KN_OP_STD: {
            for (int64_t j = 0; j < nred; j++) acc += LD(x, xo + sub_off(s.nr, s.rne, s.rst, j));
            double mean = acc / (double)nred, ss = 0;
            for (int64_t j = 0; j < nred; j++) {
                double v = LD(x, xo + sub_off(s.nr, s.rne, s.rst, j)) - mean;
                ss += v * v;
            }
            double den = (double)nred - t->p.reduce.correction;
            r = den > 0 ? ss / den : NAN;
            if (t->op == KN_OP_STD) r = sqrt(r);
            break;
        }
        case KN_OP_LOGSUMEXP:
            for (int64_t j = 0; j < nred; j++) { double v = LD(x, xo + sub_off(s.nr, s.rne, s.rst, j)); if (v > m) m = v; }
            if (isinf(m)) { r = m; break; }
            for (int64_t j = 0; j < nred; j++) acc += exp(LD(x, xo + sub_off(s.nr, s.rne, s.rst, j)) - m);
            r = m + log(acc);
            break;
        case KN_OP_NORM: {
            double p = t->p.reduce.p;
            if (isinf(p)) {
                m = 0;
                for (int64_t j = 0; j < nred; j++) { double v = fabs(LD(x, xo + sub_off(s.nr, s.rne, s.rst, j))); if (v > m || isnan(v)) m = v; }
                r = m;
            } else {
                for (int64_t j = 0; j < nred; j++) acc += pow(fabs(LD(x, xo + sub_off(s.nr, s.rne, s.rst, j))), p);
                r = pow(acc, 1.0 / p);
            }
            break;
        }
        case KN_OP_ALL:
            r = 1;
            for (int64_t j = 0; j < nred; j++) if (LD(x, xo + sub_off(s.nr, s.rne, s.rst, j)) == 0) { r = 0; break; }
            break;
        case KN_OP_ANY:
            r = 0;
            for (int64_t j = 0; j < nred; j++) if (LD(x, xo + sub_off(s.nr, s.rne, s.rst, j)) != 0) { r = 1; break; }
            break;
        default:
            return kn_set_error(KN_ERR_UNSUPPORTED, "reference: no reduction kernel for %s", kn_op_name(t->op));
        }
        ST(d, doff, r);
    }
    return KN_OK;
}

kn_status kn_ref_scan(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *d = &e->dst;
    int dim = t->p.scan.dim;
    int64_t len = x->ne[dim];
    /* iterate over all lines: index space of every dim except `dim` */
    int64_t ne[KN_MAX_DIMS], xs[KN_MAX_DIMS], ds[KN_MAX_DIMS];
    int n = 0; int64_t lines = 1;
    for (int i = 0; i < x->ndim; i++) if (i != dim) { ne[n] = x->ne[i]; xs[n] = x->st[i]; ds[n] = d->st[i]; lines *= ne[n]; n++; }
    for (int64_t l = 0; l < lines; l++) {
        int64_t xo = sub_off(n, ne, xs, l), dof = sub_off(n, ne, ds, l);
        double acc = t->op == KN_OP_CUMPROD ? 1 : 0;
        for (int64_t j = 0; j < len; j++) {
            double v = LD(x, xo + j * x->st[dim]);
            acc = t->op == KN_OP_CUMPROD ? acc * v : acc + v;
            ST(d, dof + j * d->st[dim], acc);
        }
    }
    return KN_OK;
}

/* dst [..., M, N] = a [..., M, K] @ b [..., K, N]; batch dims broadcast; e->epi: then its epilogue. */
kn_status kn_ref_matmul(const kn_exec *e) {
    if (e->epi) return kn_ref_matmul_epilogue(e, kn_ref_matmul);   /* ref_epilogue.c: product, then the epilogue */
    const kn_tview *d = &e->dst;
    int nb = d->ndim - 2;
    kn_tview a, b;
    float *ta = NULL, *tb = NULL;
    kn_status st = kn_ref_dequant_view(&e->src[0], &a, &ta);
    if (!st) st = kn_ref_dequant_view(&e->src[1], &b, &tb);
    if (st) { free(ta); return st; }
    int64_t M = d->ne[nb], N = d->ne[nb + 1], K = a.ne[a.ndim - 1];
    /* batch views: align each operand's batch dims to the output's */
    kn_tview ab = a, bb = b;
    ab.ndim = a.ndim - 2; bb.ndim = b.ndim - 2;
    ab = kn_tview_broadcast(&ab, nb, d->ne);
    bb = kn_tview_broadcast(&bb, nb, d->ne);
    kn_tview db = *d; db.ndim = nb;
    int64_t batch = 1;
    for (int i = 0; i < nb; i++) batch *= d->ne[i];
    int64_t sam = a.st[a.ndim - 2], sak = a.st[a.ndim - 1], sbk = b.st[b.ndim - 2], sbn = b.st[b.ndim - 1];
    int64_t sdm = d->st[nb], sdn = d->st[nb + 1];
    for (int64_t z = 0; z < batch; z++) {
        int64_t ao = kn_ref_off(&ab, z), bo = kn_ref_off(&bb, z), dof = kn_ref_off(&db, z);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++)
                    acc += LD(&a, ao + i * sam + k * sak) * LD(&b, bo + k * sbk + j * sbn);
                ST(d, dof + i * sdm + j * sdn, acc);
            }
    }
    free(ta); free(tb);
    return KN_OK;
}
