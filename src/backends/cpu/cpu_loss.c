/* cpu_loss.c: the CPU backend's CROSS_ENTROPY and CROSS_ENTROPY_BWD (the
 * formulas of src/graph/ops_loss.c; f32 arithmetic, the row sums in double).
 *
 * Layouts: logits rows of f32, f16 or bf16 with unit class stride (any row
 * stride); the forward writes f32, the gradient writes the logits' dtype
 * with unit class stride. Targets of any integer dtype and stride, the
 * output gradient g of any float dtype and stride. Anything else, f64
 * logits, or a target out of range goes back to the reference kernel
 * (which writes the message; nothing is written here first).
 *
 * A row is read in chunks of CH classes converted to f32 in a stack buffer:
 * one online pass keeps the running max m and sum s of exp(x - m) (s is
 * rescaled when a chunk raises m), then the gradient recomputes
 * exp(x - m) / s chunk by chunk and stores it converted back. Rows are split
 * over the thread pool. Letters: N rows, C classes, Cp the gradient's row
 * width (C rounded up to 8, pad columns 0).
 */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/vec.h"          // defines: kn_vec_*
#include <math.h>
#include <string.h>

#define CH 1024

typedef struct {
    const kn_tview *x, *tg, *g, *y;
    int64_t C, ign;
    float ls;
} ce_job;

/* classes [j0, j0 + n) of row r as f32 into buf (or a pointer into x for f32 rows) */
static const float *load_chunk(const kn_tview *x, int64_t r, int64_t j0, int64_t n, float *buf) {
    const char *row = (const char *)x->data + (size_t)(r * x->st[0] + j0) * (x->dtype == KN_F32 ? 4 : 2);
    if (x->dtype == KN_F32) return (const float *)row;
    if (x->dtype == KN_BF16) kn_vec_bf16_to_f32(buf, (const uint16_t *)row, n);
    else kn_vec_f16_to_f32(buf, (const uint16_t *)row, n);
    return buf;
}

/* one online pass: max m, log of sum(exp(x - m)) as m + log(s), sum of x */
static void row_stats(const ce_job *j, int64_t r, float *buf, float *m_out, double *lse, double *sx) {
    float m = -INFINITY;
    double s = 0, t = 0;
    for (int64_t j0 = 0; j0 < j->C; j0 += CH) {
        int64_t n = j->C - j0 < CH ? j->C - j0 : CH;
        const float *v = load_chunk(j->x, r, j0, n, buf);
        float mc = kn_vec_max(v, n);
        if (j->ls > 0) t += kn_vec_sum(v, n);
        if (mc > m) { if (s > 0) s *= exp((double)m - (double)mc); m = mc; }
        /* a row of -inf keeps m = -inf: exp(NaN) below makes the loss NaN, like log_softmax */
        if (v != buf) memcpy(buf, v, (size_t)n * sizeof *buf);
        kn_vec_add_scalar(buf, buf, -m, n);
        kn_vec_unary(KN_VU_EXP, buf, buf, n);
        s += kn_vec_sum(buf, n);
    }
    *m_out = m; *lse = (double)m + log(s); *sx = t;
}

static float ld_f(const kn_tview *x, int64_t off) {
    switch (x->dtype) {
    case KN_F32: return ((const float *)x->data)[off];
    default: return (float)kn_load(x->dtype, x->data, off);
    }
}

static void fwd_rows(void *p, int64_t r0, int64_t r1) {
    const ce_job *j = p;
    float buf[CH], m;
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = kn__load_id(j->tg, r * j->tg->st[0]);
        float *y = (float *)j->y->data + r * j->y->st[0];
        if (t == j->ign) { *y = 0; continue; }
        double lse, sx;
        row_stats(j, r, buf, &m, &lse, &sx);
        double xt = ld_f(j->x, r * j->x->st[0] + t);
        *y = (float)(lse - (1 - (double)j->ls) * xt - (j->ls > 0 ? (double)j->ls / (double)j->C * sx : 0));
    }
}

static void bwd_rows(void *p, int64_t r0, int64_t r1) {
    const ce_job *j = p;
    const kn_tview *d = j->y;
    int64_t C = j->C, Cp = d->ne[1];
    size_t esz = d->dtype == KN_F32 ? 4 : 2;
    float buf[CH], m;
    for (int64_t r = r0; r < r1; r++) {
        int64_t t = kn__load_id(j->tg, r * j->tg->st[0]);
        char *row = (char *)d->data + (size_t)(r * d->st[0]) * esz;
        if (t == j->ign) { memset(row, 0, (size_t)Cp * esz); continue; }
        double lse, sx;
        row_stats(j, r, buf, &m, &lse, &sx);
        float gi = (float)kn_load(j->g->dtype, j->g->data, r * j->g->st[0]);
        float sub = (float)lse, off = -gi * j->ls / (float)C;
        for (int64_t j0 = 0; j0 < C; j0 += CH) {
            int64_t n = C - j0 < CH ? C - j0 : CH;
            const float *v = load_chunk(j->x, r, j0, n, buf);
            /* g * exp(x - lse) - g ls / C, then - g (1 - ls) at the target */
            kn_vec_add_scalar(buf, v, -sub, n);
            kn_vec_unary(KN_VU_EXP, buf, buf, n);
            kn_vec_mul_scalar(buf, buf, gi, n);
            if (off != 0) kn_vec_add_scalar(buf, buf, off, n);
            if (t >= j0 && t < j0 + n) buf[t - j0] -= gi * (1 - j->ls);
            if (d->dtype == KN_F32) memcpy(row + (size_t)j0 * 4, buf, (size_t)n * 4);
            else if (d->dtype == KN_BF16) kn_vec_f32_to_bf16((uint16_t *)row + j0, buf, n);
            else kn_vec_f32_to_f16((uint16_t *)row + j0, buf, n);
        }
        memset(row + (size_t)C * esz, 0, (size_t)(Cp - C) * esz);
    }
}

static bool rows_ok(const kn_tview *v) { return v->ndim == 2 && (v->st[1] == 1 || v->ne[1] == 1); }

bool kn_cpu_cross_entropy(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *tg = &e->src[1], *y = &e->dst;
    bool bwd = t->op == KN_OP_CROSS_ENTROPY_BWD;
    if (x->dtype != KN_F32 && x->dtype != KN_BF16 && x->dtype != KN_F16) return false;
    if (!rows_ok(x) || tg->ndim != 1 || (bwd ? !rows_ok(y) || y->dtype != x->dtype || y->ne[1] < x->ne[1] : y->dtype != KN_F32))
        return false;
    if (bwd && (e->nsrc < 3 || e->src[2].ndim != 1)) return false;
    int64_t N = x->ne[0], C = x->ne[1], ign = t->p.ce.ignore_index;
    for (int64_t i = 0; i < N; i++) {      /* a bad target: the reference kernel reports it */
        int64_t v = kn__load_id(tg, i * tg->st[0]);
        if (v != ign && (v < 0 || v >= C)) return false;
    }
    ce_job j = {x, tg, bwd ? &e->src[2] : NULL, y, C, ign, (float)t->p.ce.smoothing};
    kn_cpu_par_rows(bwd ? bwd_rows : fwd_rows, &j, N, N * C * (bwd ? 2 : 1));
    return true;
}
