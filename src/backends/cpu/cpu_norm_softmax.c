/* cpu_norm_softmax.c: the CPU backend's RMS_NORM, LAYER_NORM, their
 * gradient NORM_BWD, and SOFTMAX, LOG_SOFTMAX.
 *
 * Layouts: norms need the trailing n_norm dims contiguous in x and y (any
 * strides outside) and a contiguous f32 weight/bias; NORM_BWD contiguous
 * x, g and weight; softmax along any dim
 * needs the dims after `dim` contiguous in x and y.
 */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/vec.h"          // defines: kn_vec_*
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ==== norms ==================================================================
 * One row = the trailing n_norm dims, consecutive in x and y. */
typedef struct { const kn_tview *x, *y; int lead; const float *w, *b; float eps; int64_t M; bool layer; } norm_job;
static void norm_rows(void *p, int64_t r0, int64_t r1) {
    norm_job *j = p;
    for (int64_t r = r0; r < r1; r++) {
        const float *x = (const float *)j->x->data + off_lead(j->x, j->lead, r);
        float *y = (float *)j->y->data + off_lead(j->y, j->lead, r);
        if (j->layer) kn_vec_layer_norm(y, x, j->w, j->b, j->eps, j->M, NULL, NULL);
        else kn_vec_rms_norm(y, x, j->w, j->eps, j->M, NULL);
    }
}
static bool affine_ok(const kn_exec *e, int k) {
    if (!e->node->src[k]) return true;
    return k < e->nsrc && is_f32(&e->src[k]) && kn_tview_is_contiguous(&e->src[k]);
}
bool kn_cpu_norm(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *y = &e->dst;
    bool layer = t->op == KN_OP_LAYER_NORM;
    int nn = (int)t->p.norm.n_norm, lead = x->ndim - nn;
    if (!is_f32(x) || !is_f32(y) || nn < 1 || lead < 0 || !tail_contig(x, lead) || !tail_contig(y, lead)) return false;
    if (!affine_ok(e, 1) || (layer && !affine_ok(e, 2)) || !kn_cpu_same_or_disjoint(x, y)) return false;
    int64_t M = prod(x, lead, x->ndim), rows = prod(x, 0, lead);
    if (M == 0 || rows == 0) return false;
    norm_job j = {x, y, lead, t->src[1] ? e->src[1].data : NULL, layer && t->src[2] ? e->src[2].data : NULL,
                  (float)t->p.norm.eps, M, layer};
    kn_cpu_par_rows(norm_rows, &j, rows, rows * M);
    return true;
}

/* ==== NORM_BWD: layer/rms norm's gradient ([dx | dw | db], ops_nn.c) =========
 * Rows go in fixed chunks of R rows (R from the row count only, at most
 * NB_CHUNKS chunks): each chunk keeps its own dw/db partial sums, added up in
 * chunk order at the end, so the result does not depend on the thread count.
 * A row is one kn_vec_norm_bwd (three vector passes over L1-resident data). */
#define NB_CHUNKS 64
typedef struct {
    const float *x, *g, *w; float *dx, *part;
    int64_t rows, M, R; int parts; float eps; bool rms;
} nb_job;
static void nb_chunks(void *p, int64_t c0, int64_t c1) {
    nb_job *j = p;
    const int64_t M = j->M;
    for (int64_t ch = c0; ch < c1; ch++) {
        float *pw = j->parts ? j->part + ch * j->parts * M : NULL, *pb = j->parts > 1 ? pw + M : NULL;
        if (pw) memset(pw, 0, sizeof(float) * (size_t)(j->parts * M));
        int64_t r1 = (ch + 1) * j->R < j->rows ? (ch + 1) * j->R : j->rows;
        for (int64_t r = ch * j->R; r < r1; r++)
            kn_vec_norm_bwd(j->dx + r * M, pw, pb, j->x + r * M, j->g + r * M, j->w, j->eps, j->rms, M);
    }
}
bool kn_cpu_norm_bwd(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *g = &e->src[2], *d = &e->dst;
    int nn = (int)t->p.norm.n_norm;
    if (!is_f32(x) || !is_f32(g) || !is_f32(d) || !kn_tview_is_contiguous(x) || !kn_tview_is_contiguous(g) ||
        !kn_tview_is_contiguous(d) || !affine_ok(e, 1) || nn < 1 || nn > x->ndim)
        return false;
    int64_t M = prod(x, x->ndim - nn, x->ndim), nx = kn_tview_numel(x), rows = M ? nx / M : 0;
    if (M == 0 || rows == 0) return false;
    int parts = (int)((kn_tview_numel(d) - nx) / M);
    int64_t R = (rows + NB_CHUNKS - 1) / NB_CHUNKS, nch = (rows + R - 1) / R;
    float *part = parts ? malloc(sizeof(float) * (size_t)(nch * parts * M)) : NULL;
    if (parts && !part) return false;                  /* the reference reports the shortage */
    nb_job j = {(const float *)x->data, (const float *)g->data, t->src[1] ? (const float *)e->src[1].data : NULL,
                (float *)d->data, part, rows, M, R, parts, (float)t->p.norm.eps, t->p.norm.rms};
    kn_cpu_par_rows(nb_chunks, &j, nch, nx * 4);
    if (parts) {
        float *sum = (float *)d->data + nx;               /* [dw | db], chunk 0 first */
        kn_vec_copy(sum, part, parts * M);
        for (int64_t ch = 1; ch < nch; ch++) kn_vec_add(sum, sum, part + ch * parts * M, parts * M);
    }
    free(part);
    return true;
}

/* ==== softmax / log_softmax along any dim ====================================
 * x viewed as [O, n, I]: O outer positions (any strides), n along `dim`
 * (any stride), I consecutive inner elements. I == 1: one vec row per outer
 * position (needs unit stride along dim). I > 1: columns of up to SM_COLS
 * inner elements are processed together with running max/sum vectors. */
#define SM_COLS 256
typedef struct { const kn_tview *x, *y; int d; int64_t n, I, nch; bool logsm; } sm_job;
static void sm_rows(void *p, int64_t r0, int64_t r1) {
    sm_job *j = p;
    const kn_tview *x = j->x, *y = j->y;
    int64_t sx = x->st[j->d], sy = y->st[j->d];
    float m[SM_COLS], s[SM_COLS], t[SM_COLS];
    for (int64_t r = r0; r < r1; r++) {
        int64_t o = r / j->nch, c0 = (r % j->nch) * SM_COLS;
        const float *xb = (const float *)x->data + off_lead(x, j->d, o);
        float *yb = (float *)y->data + off_lead(y, j->d, o);
        if (j->I == 1) {
            if (j->logsm) kn_vec_log_softmax(yb, xb, j->n);
            else kn_vec_softmax(yb, xb, j->n);
            continue;
        }
        int64_t L = j->I - c0 < SM_COLS ? j->I - c0 : SM_COLS;
        xb += c0; yb += c0;
        for (int64_t c = 0; c < L; c++) { m[c] = -INFINITY; s[c] = 0; }
        for (int64_t k = 0; k < j->n; k++) {
            const float *xk = xb + k * sx;
            for (int64_t c = 0; c < L; c++) if (xk[c] > m[c]) m[c] = xk[c];
        }
        for (int64_t k = 0; k < j->n; k++) {
            kn_vec_sub(t, xb + k * sx, m, L);
            if (j->logsm) { kn_vec_unary(KN_VU_EXP, t, t, L); kn_vec_add(s, s, t, L); }
            else { float *yk = yb + k * sy; kn_vec_unary(KN_VU_EXP, yk, t, L); kn_vec_add(s, s, yk, L); }
        }
        if (j->logsm) {
            kn_vec_unary(KN_VU_LOG, s, s, L);
            kn_vec_add(m, m, s, L);                 /* m + log(sum) */
            for (int64_t k = 0; k < j->n; k++) kn_vec_sub(yb + k * sy, xb + k * sx, m, L);
        } else {
            for (int64_t k = 0; k < j->n; k++) kn_vec_div(yb + k * sy, yb + k * sy, s, L);
        }
    }
}
bool kn_cpu_softmax(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *y = &e->dst;
    int d = e->node->p.axis.dim;
    if (!is_f32(x) || !is_f32(y) || x->ndim == 0 || d < 0 || d >= x->ndim) return false;
    if (!tail_contig(x, d + 1) || !tail_contig(y, d + 1)) return false;
    int64_t n = x->ne[d], I = prod(x, d + 1, x->ndim), O = prod(x, 0, d);
    if (n == 0 || I == 0 || O == 0) return false;
    if (I == 1 && n > 1 && (x->st[d] != 1 || y->st[d] != 1)) return false;
    if (!kn_cpu_same_or_disjoint(x, y)) return false;
    sm_job j = {x, y, d, n, I, I == 1 ? 1 : (I + SM_COLS - 1) / SM_COLS, e->node->op == KN_OP_LOG_SOFTMAX};
    kn_cpu_par_rows(sm_rows, &j, O * j.nch, O * n * I);
    return true;
}
