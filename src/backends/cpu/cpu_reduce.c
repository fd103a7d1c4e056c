/* cpu_reduce.c: the CPU backend's reductions: SUM, MEAN, MAX, VAR, STD
 * over the last dim (one row per output element), and SUM, MEAN over the
 * leading dims ([R, C] -> [C]: the bias gradients), of contiguous f32.
 */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/threadpool.h"   // defines: kn_pool_nthreads
#include "backends/cpu/vec.h"          // defines: kn_vec_*
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* one output element per row of len consecutive inputs */
typedef struct { kn_op op; float *y; const float *x; int64_t len; int correction; } row_job;
static void row_rows(void *p, int64_t r0, int64_t r1) {
    row_job *j = p;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = j->x + r * j->len;
        switch (j->op) {
        case KN_OP_SUM: j->y[r] = kn_vec_sum(x, j->len); break;
        case KN_OP_MEAN: j->y[r] = kn_vec_sum(x, j->len) / (float)j->len; break;
        case KN_OP_MAX: j->y[r] = kn_vec_max(x, j->len); break;
        case KN_OP_VAR: case KN_OP_STD: {   /* two passes, as the reference: mean, then squared deviations */
            float mean = kn_vec_sum(x, j->len) / (float)j->len, ss = 0;
            for (int64_t i = 0; i < j->len; i++) ss += (x[i] - mean) * (x[i] - mean);
            double den = (double)j->len - j->correction;
            float v = den > 0 ? (float)(ss / den) : NAN;
            j->y[r] = j->op == KN_OP_STD ? sqrtf(v) : v;
            break;
        }
        default: break;
        }
    }
}

bool kn_cpu_reduce_last(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *d = &e->dst;
    if (t->op != KN_OP_SUM && t->op != KN_OP_MEAN && t->op != KN_OP_MAX && t->op != KN_OP_VAR && t->op != KN_OP_STD) return false;
    if (!is_f32(x) || !is_f32(d) || !contig(x) || !contig(d) || x->ndim == 0) return false;
    if (t->p.reduce.axes != (1u << (x->ndim - 1))) return false;   /* last dim only */
    int64_t len = x->ne[x->ndim - 1];
    if (len == 0) return false;
    row_job j = {t->op, d->data, x->data, len, t->p.reduce.correction};
    int64_t rows = kn_tview_numel(x) / len;
    kn_cpu_par_rows(row_rows, &j, rows, rows * len);
    return true;
}

/* SUM/MEAN over the leading dims of a contiguous tensor ([R, C] -> [C]):
 * rows are added into the output with vector adds, threads split columns */
typedef struct { float *y; const float *x; int64_t R, C; float scale; } colsum_job;
static void colsum_rows(void *p, int64_t c0, int64_t c1) {
    colsum_job *j = p;
    int64_t w = c1 - c0;
    float *y = j->y + c0;
    memcpy(y, j->x + c0, sizeof(float) * (size_t)w);
    for (int64_t r = 1; r < j->R; r++) kn_vec_add(y, y, j->x + r * j->C + c0, w);
    if (j->scale != 1.0f) kn_vec_mul_scalar(y, y, j->scale, w);
}
typedef struct { colsum_job *j; int64_t nparts, rstep; } colsum_split;
/* part q of nparts: columns [q*C/nparts, (q+1)*C/nparts) */
static void colsum_cols(void *p, int64_t q0, int64_t q1) {
    colsum_split *s = p;
    int64_t C = s->j->C, c0 = q0 * C / s->nparts, c1 = q1 * C / s->nparts;
    if (c1 > c0) colsum_rows(s->j, c0, c1);
}
/* part q sums rows [q*rstep, (q+1)*rstep) into y + q*C */
static void colsum_part(void *p, int64_t q0, int64_t q1) {
    colsum_split *s = p;
    for (int64_t q = q0; q < q1; q++) {
        int64_t r0 = q * s->rstep, r1 = r0 + s->rstep < s->j->R ? r0 + s->rstep : s->j->R;
        if (r0 >= r1) continue;
        colsum_job sub = {s->j->y + q * s->j->C, s->j->x + r0 * s->j->C, r1 - r0, s->j->C, 1.0f};
        colsum_rows(&sub, 0, sub.C);
    }
}
bool kn_cpu_reduce_leading(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *d = &e->dst;
    if ((t->op != KN_OP_SUM && t->op != KN_OP_MEAN) || !is_f32(x) || !is_f32(d) || !contig(x) || !contig(d)) return false;
    uint32_t m = t->p.reduce.axes;
    int k = 0;
    while (k < x->ndim && (m >> k & 1)) k++;
    if (k == 0 || k == x->ndim || (m >> k) != 0) return false;      /* exactly dims 0..k-1 */
    int64_t R = 1, C = 1;
    for (int i = 0; i < k; i++) R *= x->ne[i];
    for (int i = k; i < x->ndim; i++) C *= x->ne[i];
    if (R == 0 || C < 16) return false;
    float scale = t->op == KN_OP_MEAN ? 1.0f / (float)R : 1.0f;
    int nt = kn_pool_nthreads();
    if (C >= 256 * (int64_t)nt || R < 64 || nt < 2 || R * C < KN_CPU_PAR_MIN) {
        /* wide rows (or little work): threads split the columns, each part
         * >= 256 floats wide; par_rows runs it on this thread when small */
        colsum_job j = {d->data, x->data, R, C, scale};
        int64_t parts = C / 256 > 1 ? C / 256 : 1;
        kn_cpu_par_rows(colsum_cols, &(colsum_split){&j, parts, 0}, parts, R * C);
        return true;
    }
    /* narrow rows (bias gradients [B*T, C]): threads split the rows into
     * partial sums, added at the end (a column split would hand each thread
     * slivers of a few floats per row) */
    int64_t np = nt, rstep = (R + np - 1) / np;
    float *part = malloc(sizeof(float) * (size_t)(np * C));
    if (!part) return false;
    colsum_job j = {part, x->data, R, C, 1.0f};
    kn_cpu_par_rows(colsum_part, &(colsum_split){&j, 0, rstep}, np, R * C);
    float *y = d->data;
    memcpy(y, part, sizeof(float) * (size_t)C);
    for (int64_t p = 1; p < np && p * rstep < R; p++) kn_vec_add(y, y, part + p * C, C);
    if (scale != 1.0f) kn_vec_mul_scalar(y, y, scale, C);
    free(part);
    return true;
}
