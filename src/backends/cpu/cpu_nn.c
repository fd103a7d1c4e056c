/* cpu_nn.c: fast CPU paths of the nn and index ops (see cpu_nn.h for the
 * list and the layout each one needs).
 *
 * Every fast path checks its layout predicate on the run-time views and
 * returns false (no error) when it does not hold, so the reference kernel
 * runs instead; that includes out-of-range indices, whose message the
 * reference writes. Work is split over rows / heads / images with the
 * thread pool above PAR_MIN elements of work; inner loops use the vector
 * kernels of vec.h and the matrix-vector kernels of gemm.h.
 *
 * Letters: B batch, Hq/Hkv query/key heads, G = Hq/Hkv, Tq/Tk query/key
 * lengths, D/Dv head dims; N images, C/O channels, g groups, H/W input and
 * OH/OW output extents, KH/KW kernel, P = OH*OW, K = Cg*KH*KW (im2col rows).
 *
 * Non-goals: f16/bf16 data (reference), fused attention over blocks of
 * queries (prefill runs one query row at a time), Winograd/direct conv.
 */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/cpu_nn.h"
#include "backends/backend_impl.h"                   // defines: kn_tensor internals, kn_op_get
#include "backends/cpu/gemm.h"         // defines: kn_sgemm, kn_sgemv_*_fn and kernels
#include "backends/cpu/threadpool.h"   // defines: kn_pool_run, kn_pool_nthreads
#include "backends/cpu/vec.h"          // defines: kn_vec_*
#include "core/cpu.h"                  // defines: kn_cpu, KN_ISA_*
#include "backends/quant/quant.h"                 // defines: kn_dequantize_row
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ==== helpers ================================================================ */
#define PAR_MIN KN_CPU_PAR_MIN
#define par_rows kn_cpu_par_rows

static bool f32(const kn_tview *v) { return v->dtype == KN_F32; }
static int64_t prod(const kn_tview *v, int from, int to) {
    int64_t n = 1;
    for (int d = from; d < to; d++) n *= v->ne[d];
    return n;
}
/* dims [from, ndim) form one block of consecutive elements (unit dims ignored) */
static bool tail_contig(const kn_tview *v, int from) {
    int64_t want = 1;
    for (int d = v->ndim - 1; d >= from; d--) {
        if (v->ne[d] == 1) continue;
        if (v->st[d] != want) return false;
        want *= v->ne[d];
    }
    return true;
}
/* offset of linear index lin over the first n dims of v */
static int64_t off_lead(const kn_tview *v, int n, int64_t lin) {
    int64_t o = 0;
    for (int d = n - 1; d >= 0; d--) { o += (lin % v->ne[d]) * v->st[d]; lin /= v->ne[d]; }
    return o;
}
/* Byte span [lo, hi) that view v touches (hi == lo when empty). */
static void span_of(const kn_tview *v, const char **lo, const char **hi) {
    size_t es = kn_dtype_get(v->dtype)->type_size;
    int64_t a = 0, b = 0;
    for (int d = 0; d < v->ndim; d++) {
        if (v->ne[d] == 0) { *lo = *hi = v->data; return; }
        int64_t ext = (v->ne[d] - 1) * v->st[d];
        if (ext < 0) a += ext; else b += ext;
    }
    *lo = (const char *)v->data + a * (int64_t)es;
    *hi = (const char *)v->data + (b + 1) * (int64_t)es;
}
static bool overlap(const kn_tview *x, const kn_tview *y) {
    const char *a0, *a1, *b0, *b1;
    span_of(x, &a0, &a1); span_of(y, &b0, &b1);
    return a0 < b1 && b0 < a1;
}
/* x and y are disjoint, or the very same elements (in place) */
static bool same_or_disjoint(const kn_tview *x, const kn_tview *y) {
    if (!overlap(x, y)) return true;
    if (x->data != y->data || x->ndim != y->ndim) return false;
    for (int d = 0; d < x->ndim; d++) if (x->ne[d] != y->ne[d] || (x->ne[d] > 1 && x->st[d] != y->st[d])) return false;
    return true;
}
/* Read the m entries of 1-d integer view iv into idx (malloc'd), checking each
 * is in [0, n). NULL (no error set) when one is not or memory is short. */
static int64_t *load_indices(const kn_tview *iv, int64_t m, int64_t n) {
    const kn_dtype_info *di = kn_dtype_get(iv->dtype);
    if (di->is_float || di->is_quant || iv->ndim != 1 || iv->ne[0] < m) return NULL;
    int64_t *idx = malloc(sizeof(int64_t) * (size_t)(m ? m : 1));
    if (!idx) return NULL;
    for (int64_t i = 0; i < m; i++) {
        double v = kn_load(iv->dtype, iv->data, i * iv->st[0]);
        if (!(v >= 0 && v < (double)n)) { free(idx); return NULL; }
        idx[i] = (int64_t)v;
    }
    return idx;
}

/* matrix-vector kernels of gemm.h for the current ISA */
static int g_force_isa = -1;
void kn_cpu_nn_force_isa(int isa) { g_force_isa = isa; }
static int nn_isa(void) {
    int isa = (int)kn_cpu()->isa;
    if (g_force_isa >= 0 && g_force_isa < isa) isa = g_force_isa;
    return isa;
}
static void pick_gemv(kn_sgemv_dot_fn *dot, kn_sgemv_axpy_fn *axpy) {
    int isa = nn_isa();
    (void)isa;
#if !defined(KN_NO_X86) && (defined(__x86_64__) || defined(__i386__))
#ifndef KN_NO_AVX512
    if (isa >= KN_ISA_AVX512) { *dot = kn_sgemv_dot_avx512; *axpy = kn_sgemv_axpy_avx512; return; }
#endif
    if (isa >= KN_ISA_AVX2) { *dot = kn_sgemv_dot_avx2; *axpy = kn_sgemv_axpy_avx2; return; }
#endif
    *dot = kn_sgemv_dot_generic; *axpy = kn_sgemv_axpy_generic;
}

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
    return k < e->nsrc && f32(&e->src[k]) && kn_tview_is_contiguous(&e->src[k]);
}
static bool fast_norm(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *y = &e->dst;
    bool layer = t->op == KN_OP_LAYER_NORM;
    int nn = (int)t->p.norm.n_norm, lead = x->ndim - nn;
    if (!f32(x) || !f32(y) || nn < 1 || lead < 0 || !tail_contig(x, lead) || !tail_contig(y, lead)) return false;
    if (!affine_ok(e, 1) || (layer && !affine_ok(e, 2)) || !same_or_disjoint(x, y)) return false;
    int64_t M = prod(x, lead, x->ndim), rows = prod(x, 0, lead);
    if (M == 0 || rows == 0) return false;
    norm_job j = {x, y, lead, t->src[1] ? e->src[1].data : NULL, layer && t->src[2] ? e->src[2].data : NULL,
                  (float)t->p.norm.eps, M, layer};
    par_rows(norm_rows, &j, rows, rows * M);
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
static bool fast_softmax(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *y = &e->dst;
    int d = e->node->p.axis.dim;
    if (!f32(x) || !f32(y) || x->ndim == 0 || d < 0 || d >= x->ndim) return false;
    if (!tail_contig(x, d + 1) || !tail_contig(y, d + 1)) return false;
    int64_t n = x->ne[d], I = prod(x, d + 1, x->ndim), O = prod(x, 0, d);
    if (n == 0 || I == 0 || O == 0) return false;
    if (I == 1 && n > 1 && (x->st[d] != 1 || y->st[d] != 1)) return false;
    if (!same_or_disjoint(x, y)) return false;
    sm_job j = {x, y, d, n, I, I == 1 ? 1 : (I + SM_COLS - 1) / SM_COLS, e->node->op == KN_OP_LOG_SOFTMAX};
    par_rows(sm_rows, &j, O * j.nch, O * n * I);
    return true;
}

/* ==== rope ===================================================================
 * x [..., T, D]: each job takes positions t and computes that position's
 * cos/sin once, then rotates the rows (o, t) of every outer index o. */
typedef struct { const kn_tview *x, *y, *pos, *ff; int64_t T, D, O; int n_rot; bool neox; double theta, fs; atomic_int failed; } rope_job;
static void rope_rows(void *p, int64_t t0, int64_t t1) {
    rope_job *j = p;
    int nd = j->x->ndim, half = j->n_rot / 2;
    /* angles in double exactly as the reference forms them; the trig is the
     * cost here, amortised over the O rows of each position */
    double *inv = malloc(sizeof(double) * (size_t)half + sizeof(float) * (size_t)half * 2);
    if (!inv) { atomic_store(&j->failed, 1); return; }
    float *cs = (float *)(inv + half), *sn = cs + half;
    for (int i = 0; i < half; i++) {
        inv[i] = pow(j->theta, -2.0 * i / j->n_rot);
        if (j->ff) inv[i] /= kn_load(j->ff->dtype, j->ff->data, i * j->ff->st[0]);
    }
    for (int64_t t = t0; t < t1; t++) {
        double pp = kn_load(j->pos->dtype, j->pos->data, t * j->pos->st[0]) * j->fs;
        for (int i = 0; i < half; i++) {
            double ang = pp * inv[i];
            cs[i] = (float)cos(ang); sn[i] = (float)sin(ang);
        }
        for (int64_t o = 0; o < j->O; o++) {
            const float *x = (const float *)j->x->data + off_lead(j->x, nd - 2, o) + t * j->x->st[nd - 2];
            float *y = (float *)j->y->data + off_lead(j->y, nd - 2, o) + t * j->y->st[nd - 2];
            if (j->neox) {
                for (int i = 0; i < half; i++) {
                    float a = x[i], b = x[i + half];
                    y[i] = a * cs[i] - b * sn[i];
                    y[i + half] = a * sn[i] + b * cs[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    float a = x[2 * i], b = x[2 * i + 1];
                    y[2 * i] = a * cs[i] - b * sn[i];
                    y[2 * i + 1] = a * sn[i] + b * cs[i];
                }
            }
            if (x != y) for (int64_t k = j->n_rot; k < j->D; k++) y[k] = x[k];
        }
    }
    free(inv);
}
static bool fast_rope(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *pos = &e->src[1], *y = &e->dst;
    int nd = x->ndim;
    if (!f32(x) || !f32(y) || nd < 2 || pos->ndim != 1) return false;
    const kn_dtype_info *pi = kn_dtype_get(pos->dtype);
    if (pi->is_float || pi->is_quant) return false;
    int64_t T = x->ne[nd - 2], D = x->ne[nd - 1], O = prod(x, 0, nd - 2);
    if (T == 0 || D == 0 || O == 0 || pos->ne[0] < T) return false;
    if (x->st[nd - 1] != 1 || y->st[nd - 1] != 1 || t->p.rope.n_rot > D) return false;
    if (!same_or_disjoint(x, y)) return false;
    rope_job j = {x, y, pos, e->nsrc > 2 ? &e->src[2] : NULL, T, D, O, t->p.rope.n_rot, t->p.rope.neox, t->p.rope.theta,
                  t->p.rope.freq_scale, 0};
    par_rows(rope_rows, &j, T, O * T * D);
    return !atomic_load(&j.failed);             /* out of memory: the reference redoes it */
}

/* ==== scaled dot-product attention ============================================
 * One job row = one query row (b, h, i): scores s = scale * K q over the
 * unmasked keys (gemv "dot" form), softmax, y = s V (gemv "axpy" form).
 * K and V may be f16 (an f16 KV cache): blocks of SDPA_KB rows are widened
 * to f32 in a scratch buffer and go through the same kernels. */
#define SDPA_KB 64
typedef struct {
    const kn_tview *q, *k, *v, *y;
    int64_t Hq, Tq, Tk, D, Dv, G;
    bool causal, f16kv; float scale;
    kn_sgemv_dot_fn dot; kn_sgemv_axpy_fn axpy;
    atomic_int failed;
} sdpa_job;
static void sdpa_rows(void *p, int64_t r0, int64_t r1) {
    sdpa_job *j = p;
    const kn_tview *q = j->q, *k = j->k, *v = j->v, *y = j->y;
    float *s = malloc(sizeof(float) * (size_t)(j->Tk > 0 ? j->Tk : 1));
    int64_t wmax = j->D > j->Dv ? j->D : j->Dv;
    float *wb = j->f16kv ? malloc(sizeof(float) * (size_t)(SDPA_KB * wmax + j->Dv)) : NULL;
    if (!s || (j->f16kv && !wb)) { free(s); free(wb); atomic_store(&j->failed, 1); return; }
    const int64_t es = j->f16kv ? 2 : 4;         /* bytes per K/V element */
    for (int64_t r = r0; r < r1; r++) {
        int64_t i = r % j->Tq, h = (r / j->Tq) % j->Hq, b = r / (j->Tq * j->Hq), hk = h / j->G;
        const float *qr = (const float *)q->data + b * q->st[0] + h * q->st[1] + i * q->st[2];
        const char *kb = (const char *)k->data + (b * k->st[0] + hk * k->st[1]) * es;
        const char *vb = (const char *)v->data + (b * v->st[0] + hk * v->st[1]) * es;
        float *yr = (float *)y->data + b * y->st[0] + h * y->st[1] + i * y->st[2];
        int64_t n = j->Tk;
        if (j->causal && i + (j->Tk - j->Tq) + 1 < n) n = i + (j->Tk - j->Tq) + 1;
        if (n <= 0) {                            /* no key left: NaN, like the reference */
            for (int64_t d = 0; d < j->Dv; d++) yr[d] = NAN;
            continue;
        }
        /* scores s = K q */
        if (!j->f16kv) j->dot(n, j->D, (const float *)kb, k->st[2], qr, s);
        else
            for (int64_t c0 = 0; c0 < n; c0 += SDPA_KB) {
                int64_t cn = n - c0 < SDPA_KB ? n - c0 : SDPA_KB;
                for (int64_t r2 = 0; r2 < cn; r2++)
                    kn_vec_f16_to_f32(wb + r2 * j->D, (const uint16_t *)kb + (c0 + r2) * k->st[2], j->D);
                j->dot(cn, j->D, wb, j->D, qr, s + c0);
            }
        kn_vec_mul_scalar(s, s, j->scale, n);
        kn_vec_softmax(s, s, n);
        /* y = s V (f16: block by block, accumulated) */
        if (!j->f16kv) { j->axpy(n, j->Dv, (const float *)vb, v->st[2], s, yr); continue; }
        float *acc = wb + SDPA_KB * wmax;
        for (int64_t c0 = 0; c0 < n; c0 += SDPA_KB) {
            int64_t cn = n - c0 < SDPA_KB ? n - c0 : SDPA_KB;
            for (int64_t r2 = 0; r2 < cn; r2++)
                kn_vec_f16_to_f32(wb + r2 * j->Dv, (const uint16_t *)vb + (c0 + r2) * v->st[2], j->Dv);
            j->axpy(cn, j->Dv, wb, j->Dv, s + c0, c0 ? acc : yr);
            if (c0) for (int64_t d = 0; d < j->Dv; d++) yr[d] += acc[d];
        }
    }
    free(s);
    free(wb);
}
static bool fast_sdpa(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2], *y = &e->dst;
    bool f16kv = k->dtype == KN_F16 && v->dtype == KN_F16;
    if (!f32(q) || (!f16kv && (!f32(k) || !f32(v))) || !f32(y) || q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || y->ndim != 4)
        return false;
    int64_t B = q->ne[0], Hq = q->ne[1], Tq = q->ne[2], D = q->ne[3], Hkv = k->ne[1], Tk = k->ne[2], Dv = v->ne[3];
    if (Hkv < 1 || Hq % Hkv || B * Hq * Tq == 0 || Dv == 0) return false;
    if ((D > 1 && (q->st[3] != 1 || k->st[3] != 1)) || (Dv > 1 && (v->st[3] != 1 || y->st[3] != 1))) return false;
    if (overlap(y, q) || overlap(y, k) || overlap(y, v)) return false;
    sdpa_job j = {q, k, v, y, Hq, Tq, Tk, D, Dv, Hq / Hkv, t->p.sdpa.causal, f16kv, (float)t->p.sdpa.scale, NULL, NULL, 0};
    pick_gemv(&j.dot, &j.axpy);
    int64_t rows = B * Hq * Tq;
    par_rows(sdpa_rows, &j, rows, rows * (Tk > 0 ? Tk : 1) * (D + Dv));
    return !atomic_load(&j.failed);
}

/* ==== sdpa backward ============================================================
 * One job row = one key/value head (b, hk) with its G query heads, so the
 * key and value gradients of a head are written by one thread only. Per
 * query head, two passes over matrix-vector kernels (operands stay in L1 for
 * training sizes):
 *   rows i:  s = softmax(scale K q_i), dp = V g_i, ds = scale s (dp - s.dp),
 *            dq_i = K^T ds; s and ds are stored transposed (PT, DST [Tk,Tq])
 *   keys j:  dk_j (+)= Q^T DST_j, dv_j (+)= G^T PT_j over the rows i that see
 *            key j (causal: i >= j - (Tk - Tq), the masked half is skipped).
 * The output packs dq, dk, dv contiguously (graph/ops_nn.c). */
typedef struct {
    const kn_tview *q, *k, *v, *g;
    float *dq, *dk, *dv;
    int64_t Hq, Hkv, Tq, Tk, D, Dv, G;
    bool causal; float scale;
    kn_sgemv_dot_fn dot; kn_sgemv_axpy_fn axpy;
    atomic_int failed;
} sdpab_job;
#define ROW(v, b, h, i) ((const float *)(v)->data + (b) * (v)->st[0] + (h) * (v)->st[1] + (i) * (v)->st[2])
static void sdpab_heads(void *p, int64_t r0, int64_t r1) {
    sdpab_job *j = p;
    int64_t Tq = j->Tq, Tk = j->Tk, D = j->D, Dv = j->Dv, off = Tk - Tq, wmax = D > Dv ? D : Dv;
    float *buf = malloc(sizeof(float) * (size_t)(2 * Tk * Tq + 2 * Tk + wmax + 1));
    if (!buf) { atomic_store(&j->failed, 1); return; }
    float *PT = buf, *DST = PT + Tk * Tq, *s = DST + Tk * Tq, *ds = s + Tk, *tmp = ds + Tk;
    for (int64_t r = r0; r < r1; r++) {
        int64_t b = r / j->Hkv, hk = r % j->Hkv;
        const float *K = ROW(j->k, b, hk, 0), *V = ROW(j->v, b, hk, 0);
        int64_t ldk = j->k->st[2], ldv = j->v->st[2], ldq = j->q->st[2], ldg = j->g->st[2];
        float *dk = j->dk + (b * j->Hkv + hk) * Tk * D, *dv = j->dv + (b * j->Hkv + hk) * Tk * Dv;
        for (int64_t gi = 0; gi < j->G; gi++) {
            int64_t h = hk * j->G + gi;
            for (int64_t i = 0; i < Tq; i++) {
                const float *qi = ROW(j->q, b, h, i), *gr = ROW(j->g, b, h, i);
                float *dqi = j->dq + ((b * j->Hq + h) * Tq + i) * D;
                int64_t n = Tk;
                if (j->causal && i + off + 1 < n) n = i + off + 1;
                if (n <= 0) { for (int64_t d = 0; d < D; d++) dqi[d] = NAN; continue; }
                j->dot(n, D, K, ldk, qi, s);
                kn_vec_mul_scalar(s, s, j->scale, n);
                kn_vec_softmax(s, s, n);
                j->dot(n, Dv, V, ldv, gr, ds);
                float di = kn_vec_dot(s, ds, n);
                kn_vec_add_scalar(ds, ds, -di, n);
                kn_vec_mul(ds, ds, s, n);
                kn_vec_mul_scalar(ds, ds, j->scale, n);
                j->axpy(n, D, K, ldk, ds, dqi);
                for (int64_t c = 0; c < n; c++) { PT[c * Tq + i] = s[c]; DST[c * Tq + i] = ds[c]; }
            }
            const float *Q = ROW(j->q, b, h, 0), *Gm = ROW(j->g, b, h, 0);
            for (int64_t c = 0; c < Tk; c++) {
                int64_t i0 = j->causal && c - off > 0 ? c - off : 0;
                if (i0 < 0) i0 = 0;
                int64_t m = Tq - i0;
                float *dkc = dk + c * D, *dvc = dv + c * Dv;
                if (m <= 0) {                    /* no query row sees key c */
                    if (gi == 0) { for (int64_t d = 0; d < D; d++) dkc[d] = 0; for (int64_t d = 0; d < Dv; d++) dvc[d] = 0; }
                    continue;
                }
                if (gi == 0) {
                    j->axpy(m, D, Q + i0 * ldq, ldq, DST + c * Tq + i0, dkc);
                    j->axpy(m, Dv, Gm + i0 * ldg, ldg, PT + c * Tq + i0, dvc);
                } else {
                    j->axpy(m, D, Q + i0 * ldq, ldq, DST + c * Tq + i0, tmp);
                    kn_vec_add(dkc, dkc, tmp, D);
                    j->axpy(m, Dv, Gm + i0 * ldg, ldg, PT + c * Tq + i0, tmp);
                    kn_vec_add(dvc, dvc, tmp, Dv);
                }
            }
        }
    }
    free(buf);
}
#undef ROW
static bool fast_sdpa_bwd(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2], *g = &e->src[3], *y = &e->dst;
    if (!f32(q) || !f32(k) || !f32(v) || !f32(g) || !f32(y) || q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || g->ndim != 4)
        return false;
    int64_t B = q->ne[0], Hq = q->ne[1], Tq = q->ne[2], D = q->ne[3], Hkv = k->ne[1], Tk = k->ne[2], Dv = v->ne[3];
    if (Hkv < 1 || Hq % Hkv || D == 0 || Dv == 0 || Tq == 0 || Tk == 0 || y->st[0] != 1) return false;
    if ((D > 1 && (q->st[3] != 1 || k->st[3] != 1)) || (Dv > 1 && (v->st[3] != 1 || g->st[3] != 1))) return false;
    if (overlap(y, q) || overlap(y, k) || overlap(y, v) || overlap(y, g)) return false;
    float *dq = y->data;
    int64_t nq = B * Hq * Tq * D, nk = B * Hkv * Tk * D;
    sdpab_job j = {q, k, v, g, dq, dq + nq, dq + nq + nk, Hq, Hkv, Tq, Tk, D, Dv, Hq / Hkv, t->p.sdpa.causal,
                   (float)t->p.sdpa.scale, NULL, NULL, 0};
    pick_gemv(&j.dot, &j.axpy);
    par_rows(sdpab_heads, &j, B * Hkv, B * Hq * Tq * Tk * (2 * D + 2 * Dv));
    return !atomic_load(&j.failed);
}

/* ==== index_select / index_copy / index_add ==================================
 * Operands viewed as [O, n, I] around dim d: O outer positions (any strides),
 * the indexed dim (any stride), I consecutive inner elements. */
typedef struct {
    const kn_tview *x, *y, *s;   /* source, destination, added/copied slices */
    int d; int64_t m, I, nch; size_t es; const int64_t *idx;
} idx_job;

/* index_select: rows (o, i) */
static void isel_rows(void *p, int64_t r0, int64_t r1) {
    idx_job *j = p;
    const kn_tview *x = j->x, *y = j->y;
    for (int64_t r = r0; r < r1; r++) {
        int64_t o = r / j->m, i = r % j->m;
        const char *src = (const char *)x->data + (off_lead(x, j->d, o) + j->idx[i] * x->st[j->d]) * (int64_t)j->es;
        char *dst = (char *)y->data + (off_lead(y, j->d, o) + i * y->st[j->d]) * (int64_t)j->es;
        memcpy(dst, src, (size_t)j->I * j->es);
    }
}
/* quantized x [V, C] (dim 0): rows dequantized to f32 or copied as blocks */
typedef struct { const kn_tview *x, *y; const int64_t *idx; int64_t C; size_t row_bytes; bool deq; } qsel_job;
static void qsel_rows(void *p, int64_t r0, int64_t r1) {
    qsel_job *j = p;
    kn_dtype qt = j->x->dtype;
    for (int64_t r = r0; r < r1; r++) {
        const char *src = (const char *)j->x->data + kn_dtype_nbytes(qt, j->idx[r] * j->x->st[0]);
        if (j->deq) kn_dequantize_row(qt, src, (float *)j->y->data + r * j->y->st[0], j->C);
        else memcpy((char *)j->y->data + kn_dtype_nbytes(qt, r * j->y->st[0]), src, j->row_bytes);
    }
}
static bool fast_index_select_quant(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *iv = &e->src[1], *y = &e->dst;
    const kn_dtype_info *qi = kn_dtype_get(x->dtype);
    int64_t bs = qi->block_size, C = x->ne[1], m = y->ne[0];
    if (e->node->p.axis.dim != 0 || x->ndim != 2 || y->ndim != 2 || y->ne[1] != C || C % bs) return false;
    if ((x->ne[0] > 1 && x->st[0] % bs) || (C > 1 && x->st[1] != 1) || (C > 1 && y->st[1] != 1)) return false;
    bool deq = f32(y);
    if (!deq && (y->dtype != x->dtype || (m > 1 && y->st[0] % bs))) return false;
    if (overlap(x, y)) return false;
    int64_t *idx = load_indices(iv, m, x->ne[0]);
    if (!idx) return false;
    /* a dtype kn_dequantize_row does not know: leave it to the reference */
    if (deq && m > 0 && kn_dequantize_row(x->dtype, (const char *)x->data + kn_dtype_nbytes(x->dtype, idx[0] * x->st[0]),
                                          y->data, C) != KN_OK) { free(idx); return false; }
    qsel_job j = {x, y, idx, C, kn_dtype_nbytes(x->dtype, C), deq};
    par_rows(qsel_rows, &j, m, m * C * (deq ? 4 : 1));
    free(idx);
    return true;
}
static bool fast_index_select(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *iv = &e->src[1], *y = &e->dst;
    if (kn_dtype_get(x->dtype)->is_quant) return fast_index_select_quant(e);
    int d = e->node->p.axis.dim;
    if (x->dtype != y->dtype || d < 0 || d >= x->ndim || x->ndim != y->ndim) return false;
    if (!tail_contig(x, d + 1) || !tail_contig(y, d + 1)) return false;
    int64_t m = y->ne[d], I = prod(y, d + 1, y->ndim), O = prod(y, 0, d);
    if (m == 0 || I == 0 || O == 0 || overlap(x, y)) return false;
    int64_t *idx = load_indices(iv, m, x->ne[d]);
    if (!idx) return false;
    idx_job j = {x, y, NULL, d, m, I, 1, kn_dtype_get(x->dtype)->type_size, idx};
    par_rows(isel_rows, &j, O * m, O * m * I);
    free(idx);
    return true;
}

/* index_copy: job rows are outer positions o, each copying its slices in index
 * order (a repeated index keeps the last slice, like the reference). */
static void icopy_rows(void *p, int64_t r0, int64_t r1) {
    idx_job *j = p;
    const kn_tview *y = j->y, *s = j->s;
    for (int64_t o = r0; o < r1; o++)
        for (int64_t i = 0; i < j->m; i++) {
            const char *src = (const char *)s->data + (off_lead(s, j->d, o) + i * s->st[j->d]) * (int64_t)j->es;
            char *dst = (char *)y->data + (off_lead(y, j->d, o) + j->idx[i] * y->st[j->d]) * (int64_t)j->es;
            memcpy(dst, src, (size_t)j->I * j->es);
        }
}
/* src must match y except along d, where it has at most the index's length */
static bool slices_ok(const kn_tview *s, const kn_tview *y, const kn_tview *iv, int d) {
    if (s->ndim != y->ndim || iv->ndim != 1) return false;
    for (int k = 0; k < y->ndim; k++)
        if (k == d ? s->ne[k] > iv->ne[0] : s->ne[k] != y->ne[k]) return false;
    return true;
}
static bool fast_index_copy(const kn_exec *e) {
    const kn_tview *y = &e->dst, *iv = &e->src[1], *s = &e->src[2];
    int d = e->node->p.axis.dim;
    if (s->dtype != y->dtype || kn_dtype_get(y->dtype)->is_quant || d < 0 || d >= y->ndim) return false;
    if (!slices_ok(s, y, iv, d) || !tail_contig(y, d + 1) || !tail_contig(s, d + 1)) return false;
    int64_t m = s->ne[d], I = prod(y, d + 1, y->ndim), O = prod(y, 0, d);
    if (I == 0 || O == 0 || overlap(s, y)) return false;
    /* the reference checks every index of the index tensor, not only the first m */
    int64_t *idx = load_indices(iv, iv->ne[0], y->ne[d]);
    if (!idx) return false;
    idx_job j = {NULL, y, s, d, m, I, 1, kn_dtype_get(y->dtype)->type_size, idx};
    par_rows(icopy_rows, &j, O, O * m * I);
    free(idx);
    return true;
}

/* index_add (f32): job rows are (outer position, column chunk); each copies
 * its part of x into y, then adds every slice in index order. */
#define IADD_COLS 1024
static void iadd_rows(void *p, int64_t r0, int64_t r1) {
    idx_job *j = p;
    const kn_tview *x = j->x, *y = j->y, *s = j->s;
    int d = j->d;
    int64_t n = y->ne[d];
    for (int64_t r = r0; r < r1; r++) {
        int64_t o = r / j->nch, c0 = (r % j->nch) * IADD_COLS;
        int64_t L = j->I - c0 < IADD_COLS ? j->I - c0 : IADD_COLS;
        const float *xb = (const float *)x->data + off_lead(x, d, o) + c0;
        const float *sb = (const float *)s->data + off_lead(s, d, o) + c0;
        float *yb = (float *)y->data + off_lead(y, d, o) + c0;
        if (L < 16) {       /* short slices (index_add along the last dim: L = 1): plain loops, no calls */
            if (x->data != y->data)
                for (int64_t k = 0; k < n; k++)
                    for (int64_t c = 0; c < L; c++) yb[k * y->st[d] + c] = xb[k * x->st[d] + c];
            for (int64_t i = 0; i < j->m; i++) {
                float *yr = yb + j->idx[i] * y->st[d];
                const float *sr = sb + i * s->st[d];
                for (int64_t c = 0; c < L; c++) yr[c] += sr[c];
            }
            continue;
        }
        if (x->data != y->data)
            for (int64_t k = 0; k < n; k++) memcpy(yb + k * y->st[d], xb + k * x->st[d], sizeof(float) * (size_t)L);
        for (int64_t i = 0; i < j->m; i++) {
            float *yr = yb + j->idx[i] * y->st[d];
            kn_vec_add(yr, yr, sb + i * s->st[d], L);
        }
    }
}
static bool fast_index_add(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *iv = &e->src[1], *s = &e->src[2], *y = &e->dst;
    int d = e->node->p.axis.dim;
    if (!f32(x) || !f32(y) || !f32(s) || d < 0 || d >= y->ndim || x->ndim != y->ndim) return false;
    if (!slices_ok(s, y, iv, d) || !tail_contig(y, d + 1) || !tail_contig(s, d + 1) || !tail_contig(x, d + 1)) return false;
    for (int k = 0; k < y->ndim; k++) if (x->ne[k] != y->ne[k]) return false;
    if (!same_or_disjoint(x, y) || overlap(s, y)) return false;
    int64_t m = s->ne[d], I = prod(y, d + 1, y->ndim), O = prod(y, 0, d);
    if (I == 0 || O == 0 || y->ne[d] == 0) return false;
    int64_t *idx = load_indices(iv, m, y->ne[d]);
    if (!idx) return false;
    idx_job j = {x, y, s, d, m, I, (I + IADD_COLS - 1) / IADD_COLS, 4, idx};
    par_rows(iadd_rows, &j, O * j.nch, O * (m + y->ne[d]) * I);
    free(idx);
    return true;
}

/* constant pad (4-byte elements) into a contiguous y: fill, then copy x's
 * rows (unit stride along the last dim) into the interior. The gradient of
 * a slice (the qkv split). */
typedef struct { const kn_tview *x, *y; int64_t n, lo[KN_MAX_DIMS]; uint32_t v; } pad_job;
static void pad_fill_rows(void *p, int64_t r0, int64_t r1) {
    pad_job *j = p;
    uint32_t *y = j->y->data;
    int64_t e = r1 * 4096 < j->n ? r1 * 4096 : j->n;
    for (int64_t i = r0 * 4096; i < e; i++) y[i] = j->v;
}
static void pad_copy_rows(void *p, int64_t r0, int64_t r1) {
    pad_job *j = p;
    const kn_tview *x = j->x, *y = j->y;
    int nd = x->ndim;
    int64_t L = x->ne[nd - 1];
    for (int64_t r = r0; r < r1; r++) {
        int64_t xo = 0, yo = 0, ys = y->ne[nd - 1], q = r;
        yo += j->lo[nd - 1];
        for (int k = nd - 2; k >= 0; k--) {
            int64_t c = q % x->ne[k]; q /= x->ne[k];
            xo += c * x->st[k];
            yo += (c + j->lo[k]) * ys;
            ys *= y->ne[k];
        }
        memcpy((uint32_t *)y->data + yo, (const uint32_t *)x->data + xo, sizeof(uint32_t) * (size_t)L);
    }
}
static bool fast_pad(const kn_exec *e) {
    const kn_tview *x = &e->src[0], *y = &e->dst;
    const kn_tensor *t = e->node;
    int nd = y->ndim;
    if (t->p.pad.mode != KN_PAD_CONSTANT || x->dtype != y->dtype || kn_dtype_get(y->dtype)->type_size != 4 ||
        kn_dtype_get(y->dtype)->is_quant || nd == 0 || x->ndim != nd || !kn_tview_is_contiguous(y) || overlap(x, y))
        return false;
    if (x->ne[nd - 1] > 1 && x->st[nd - 1] != 1) return false;
    pad_job j = {x, y, kn_tview_numel(y), {0}, 0};
    for (int d = 0; d < nd; d++) {
        j.lo[d] = t->p.pad.pad[2 * (nd - 1 - d)];
        if (j.lo[d] < 0 || y->ne[d] < x->ne[d] + j.lo[d]) return false;   /* negative pads (crops): reference */
    }
    float fv = (float)t->p.pad.value;
    if (y->dtype == KN_F32) memcpy(&j.v, &fv, 4);
    else if (y->dtype == KN_I32) { int32_t iv = (int32_t)t->p.pad.value; memcpy(&j.v, &iv, 4); }
    else return false;
    int64_t n = j.n, nx = kn_tview_numel(x);
    if (n == 0) return true;
    par_rows(pad_fill_rows, &j, (n + 4095) / 4096, n);
    if (nx) par_rows(pad_copy_rows, &j, nx / x->ne[nd - 1], nx);
    return true;
}

/* scatter_add (f32) into a contiguous y: the gradient of gather (the
 * cross-entropy's pick of the target log-probability). x is copied (or, a
 * broadcast zero, filled), then each index element adds its src value; one
 * thread: there are as many adds as index elements, few next to y's size. */
/* The index element at coordinate c (an int32 or int64 view); the next
 * coordinate in row-major order over ne (false, and c back at 0, after the
 * last). */
static int64_t index_at(const kn_tview *iv, const int64_t *c) {
    int64_t o = 0;
    for (int k = 0; k < iv->ndim; k++) o += c[k] * iv->st[k];
    return iv->dtype == KN_I32 ? ((const int32_t *)iv->data)[o] : ((const int64_t *)iv->data)[o];
}
static bool next_coord(int64_t *c, const int64_t *ne, int nd) {
    for (int k = nd - 1; k >= 0; k--) {
        if (++c[k] < ne[k]) return true;
        c[k] = 0;
    }
    return false;
}
static bool fast_scatter_add(const kn_exec *e) {
    const kn_tview *y = &e->dst, *x = &e->src[0], *iv = &e->src[1], *s = &e->src[2];
    int d = e->node->p.axis.dim, nd = y->ndim;
    if (!f32(x) || !f32(y) || !f32(s) || !kn_tview_is_contiguous(y) || d < 0 || d >= nd) return false;
    if ((iv->dtype != KN_I32 && iv->dtype != KN_I64) || x->ndim != nd || iv->ndim != nd || s->ndim != nd) return false;
    for (int k = 0; k < nd; k++)
        if (x->ne[k] != y->ne[k] || iv->ne[k] > s->ne[k] || (k != d && iv->ne[k] > y->ne[k])) return false;
    bool xzero = true;
    for (int k = 0; k < nd; k++) if (x->st[k] != 0 && x->ne[k] > 1) xzero = false;
    if (overlap(s, y) || (!xzero && !same_or_disjoint(x, y)) || (!xzero && x->data != y->data && !kn_tview_is_contiguous(x)))
        return false;
    int64_t m = kn_tview_numel(iv), n = kn_tview_numel(y), c[KN_MAX_DIMS] = {0};
    /* indices first: an out-of-range one goes to the reference, which reports it */
    for (bool more = m > 0; more; more = next_coord(c, iv->ne, nd)) {
        int64_t j = index_at(iv, c);
        if (j < 0 || j >= y->ne[d]) return false;
    }
    float *yd = y->data;
    if (xzero) { float v = n ? *(const float *)x->data : 0; for (int64_t i = 0; i < n; i++) yd[i] = v; }
    else if (x->data != y->data) memcpy(yd, x->data, sizeof(float) * (size_t)n);
    for (bool more = m > 0; more; more = next_coord(c, iv->ne, nd)) {
        int64_t so = 0, yo = 0, ys = 1;
        for (int k = nd - 1; k >= 0; k--) {
            so += c[k] * s->st[k];
            yo += (k == d ? index_at(iv, c) : c[k]) * ys;
            ys *= y->ne[k];
        }
        yd[yo] += ((const float *)s->data)[so];
    }
    return true;
}

/* ==== strided copy (4-byte elements) ==========================================
 * Dims are merged where both layouts allow and unit dims dropped. With q the
 * destination's fastest dim and p the source's: if they are the same dim,
 * rows along it are copied; otherwise (p, q) tiles of TILE x TILE go
 * through the cache together (a blocked transpose). */
#define CP_MAXD KN_MAX_DIMS
#define TILE 32
typedef struct {
    int nd; int64_t ne[CP_MAXD], sx[CP_MAXD], sy[CP_MAXD];
    int p, q;                      /* source-fast and destination-fast dims */
    int nod; int od[CP_MAXD];      /* the other dims (outer odometer)       */
    int64_t ptiles;
    const uint32_t *x; uint32_t *y;
} cp_job;
static void cp_outer(const cp_job *j, int64_t lin, int64_t *ox, int64_t *oy) {
    int64_t a = 0, b = 0;
    for (int k = j->nod - 1; k >= 0; k--) {
        int d = j->od[k];
        int64_t c = lin % j->ne[d]; lin /= j->ne[d];
        a += c * j->sx[d]; b += c * j->sy[d];
    }
    *ox = a; *oy = b;
}
static void cp_rows(void *p, int64_t r0, int64_t r1) {
    cp_job *j = p;
    int q = j->q, pp = j->p;
    int64_t nq = j->ne[q], sxq = j->sx[q], syq = j->sy[q];
    for (int64_t r = r0; r < r1; r++) {
        int64_t ox, oy;
        if (pp == q) {                              /* rows along q */
            cp_outer(j, r, &ox, &oy);
            const uint32_t *x = j->x + ox;
            uint32_t *y = j->y + oy;
            if (sxq == 1 && syq == 1) memcpy(y, x, sizeof(uint32_t) * (size_t)nq);
            else for (int64_t k = 0; k < nq; k++) y[k * syq] = x[k * sxq];
            continue;
        }
        cp_outer(j, r / j->ptiles, &ox, &oy);
        int64_t a0 = (r % j->ptiles) * TILE, a1 = a0 + TILE < j->ne[pp] ? a0 + TILE : j->ne[pp];
        int64_t sxp = j->sx[pp], syp = j->sy[pp];
        for (int64_t b0 = 0; b0 < nq; b0 += TILE) {
            int64_t b1 = b0 + TILE < nq ? b0 + TILE : nq;
            for (int64_t a = a0; a < a1; a++) {
                const uint32_t *x = j->x + ox + a * sxp;
                uint32_t *y = j->y + oy + a * syp;
                for (int64_t b = b0; b < b1; b++) y[b * syq] = x[b * sxq];
            }
        }
    }
}
static int64_t iabs64(int64_t v) { return v < 0 ? -v : v; }
static bool copy_views(const kn_tview *x, const kn_tview *y) {
    if (x->dtype != y->dtype || kn_dtype_get(x->dtype)->type_size != 4 || kn_dtype_get(x->dtype)->is_quant) return false;
    if (x->ndim != y->ndim) return false;
    cp_job j;
    memset(&j, 0, sizeof j);
    int64_t n = 1;
    for (int d = 0; d < x->ndim; d++) {
        if (x->ne[d] != y->ne[d]) return false;
        n *= x->ne[d];
        if (x->ne[d] == 1) continue;
        if (j.nd > 0 && j.sx[j.nd - 1] == x->st[d] * x->ne[d] && j.sy[j.nd - 1] == y->st[d] * y->ne[d]) {
            j.ne[j.nd - 1] *= x->ne[d];              /* merge into the previous dim */
            j.sx[j.nd - 1] = x->st[d]; j.sy[j.nd - 1] = y->st[d];
            continue;
        }
        j.ne[j.nd] = x->ne[d]; j.sx[j.nd] = x->st[d]; j.sy[j.nd] = y->st[d]; j.nd++;
    }
    if (n == 0 || overlap(x, y)) return false;
    if (j.nd == 0) { j.ne[0] = 1; j.sx[0] = j.sy[0] = 1; j.nd = 1; }
    /* a stride-0 destination dim (several elements to one place) is left to the reference */
    for (int d = 0; d < j.nd; d++) if (j.sy[d] == 0) return false;
    j.p = j.q = 0;
    for (int d = 1; d < j.nd; d++) {
        if (iabs64(j.sy[d]) < iabs64(j.sy[j.q])) j.q = d;
        if (iabs64(j.sx[d]) < iabs64(j.sx[j.p])) j.p = d;
    }
    if (iabs64(j.sx[j.q]) <= 1) j.p = j.q;              /* q is fast in both */
    for (int d = 0; d < j.nd; d++) if (d != j.p && d != j.q) j.od[j.nod++] = d;
    j.x = x->data; j.y = y->data;
    int64_t outer = 1;
    for (int k = 0; k < j.nod; k++) outer *= j.ne[j.od[k]];
    if (j.p == j.q) par_rows(cp_rows, &j, outer, n);
    else { j.ptiles = (j.ne[j.p] + TILE - 1) / TILE; par_rows(cp_rows, &j, outer * j.ptiles, n); }
    return true;
}
static bool fast_copy(const kn_exec *e) { return copy_views(&e->src[0], &e->dst); }

/* cat: each part is a strided copy into its slab of the output. Checked
 * before anything is written: the same 4-byte dtype everywhere, no overlap. */
static bool fast_cat(const kn_exec *e) {
    const kn_tview *y = &e->dst;
    int d = e->node->p.axis.dim;
    size_t es = kn_dtype_get(y->dtype)->type_size;
    for (int k = 0; k < e->nsrc; k++)
        if (e->src[k].dtype != y->dtype || es != 4 || kn_dtype_get(y->dtype)->is_quant || overlap(&e->src[k], y)) return false;
    int64_t at = 0;
    for (int k = 0; k < e->nsrc; k++) {
        const kn_tview *x = &e->src[k];
        kn_tview slab = *y;
        slab.ne[d] = x->ne[d];
        slab.data = (char *)y->data + at * y->st[d] * (int64_t)es;
        at += x->ne[d];
        if (kn_tview_numel(x) == 0) continue;
        if (!copy_views(x, &slab)) return false;   /* the reference then redoes the whole cat */
    }
    return true;
}

/* ==== convolution ==============================================================
 * conv2d: y[n, g] [Og, P] = w_g [Og, K] @ col(x[n, g]) [K, P] (+ bias);
 * conv_transpose2d: col [Og*KH*KW, H*W] = w_g^T @ x[n, g], scattered into y
 * (col2im); conv2d_bwd_w: dw_g [Cgb, K] = sum_n b[n, g] [Cgb, P] @ col(a[n, g])^T. */
typedef struct { int64_t H, W, OH, OW, KH, KW; int sh, sw, ph, pw, dh, dw; } conv_geo;
static conv_geo geo(const kn_tensor *t, int64_t H, int64_t W, int64_t OH, int64_t OW, int64_t KH, int64_t KW) {
    conv_geo g = {H, W, OH, OW, KH, KW, t->p.conv.stride[0], t->p.conv.stride[1], t->p.conv.padding[0],
                  t->p.conv.padding[1], t->p.conv.dilation[0], t->p.conv.dilation[1]};
    return g;
}
/* col [Cg*KH*KW, OH*OW] from channels c0.. of image n of x (any strides) */
static void im2col(const kn_tview *x, int64_t n, int64_t c0, int64_t Cg, const conv_geo *g, float *col) {
    const float *xb = (const float *)x->data + n * x->st[0];
    int64_t P = g->OH * g->OW, sy = x->st[2], sx = x->st[3];
    for (int64_t c = 0; c < Cg; c++) {
        const float *xc = xb + (c0 + c) * x->st[1];
        for (int64_t kh = 0; kh < g->KH; kh++)
            for (int64_t kw = 0; kw < g->KW; kw++) {
                float *row = col + ((c * g->KH + kh) * g->KW + kw) * P;
                int64_t off = kw * g->dw - g->pw;      /* ix = ox*sw + off */
                /* valid ox: 0 <= ox*sw + off < W */
                int64_t lo = off >= 0 ? 0 : (-off + g->sw - 1) / g->sw;
                int64_t hi = g->W - off <= 0 ? 0 : (g->W - off + g->sw - 1) / g->sw;
                if (hi > g->OW) hi = g->OW;
                if (lo > hi) lo = hi;
                for (int64_t oy = 0; oy < g->OH; oy++) {
                    float *r = row + oy * g->OW;
                    int64_t iy = oy * g->sh - g->ph + kh * g->dh;
                    if (iy < 0 || iy >= g->H) { memset(r, 0, sizeof(float) * (size_t)g->OW); continue; }
                    const float *xr = xc + iy * sy;
                    for (int64_t ox = 0; ox < lo; ox++) r[ox] = 0;
                    if (sx == 1 && g->sw == 1) memcpy(r + lo, xr + lo + off, sizeof(float) * (size_t)(hi - lo));
                    else for (int64_t ox = lo; ox < hi; ox++) r[ox] = xr[(ox * g->sw + off) * sx];
                    for (int64_t ox = hi; ox < g->OW; ox++) r[ox] = 0;
                }
            }
    }
}
/* [nc, HW] channels c0.. of image n: a pointer into v when those planes are
 * consecutive, else a packed copy in buf */
static const float *planes(const kn_tview *v, int64_t n, int64_t c0, int64_t nc, float *buf) {
    int64_t H = v->ne[2], W = v->ne[3];
    const float *b = (const float *)v->data + n * v->st[0] + c0 * v->st[1];
    if ((W == 1 || v->st[3] == 1) && (H == 1 || v->st[2] == W) && (nc == 1 || v->st[1] == H * W)) return b;
    for (int64_t c = 0; c < nc; c++)
        for (int64_t i = 0; i < H; i++)
            for (int64_t k = 0; k < W; k++) buf[(c * H + i) * W + k] = b[c * v->st[1] + i * v->st[2] + k * v->st[3]];
    return buf;
}
/* y image n is [O, P] consecutive (any image stride) */
static bool out_planes_ok(const kn_tview *y) {
    return (y->ne[3] == 1 || y->st[3] == 1) && (y->ne[2] == 1 || y->st[2] == y->ne[3]) &&
           (y->ne[1] == 1 || y->st[1] == y->ne[2] * y->ne[3]);
}

typedef struct {
    const kn_tview *x, *w, *b, *y;
    int64_t G, Cg, Og, K, P;   /* conv: K = Cg*KH*KW; transpose: K = Og*KH*KW, P = input H*W */
    conv_geo g;
    size_t scratch;            /* floats of scratch per job */
    atomic_int failed;
} conv_job;

static void conv_rows(void *p, int64_t r0, int64_t r1) {
    conv_job *j = p;
    float *col = malloc(sizeof(float) * j->scratch);
    if (!col) { atomic_store(&j->failed, 1); return; }
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / j->G, gi = r % j->G;
        im2col(j->x, n, gi * j->Cg, j->Cg, &j->g, col);
        const float *wg = (const float *)j->w->data + gi * j->Og * j->K;
        float *yg = (float *)j->y->data + n * j->y->st[0] + gi * j->Og * j->P;
        kn_sgemm(false, false, j->Og, j->P, j->K, 1.0f, wg, j->K, col, j->P, 0.0f, yg, j->P);
        if (j->b)
            for (int64_t o = 0; o < j->Og; o++)
                kn_vec_add_scalar(yg + o * j->P, yg + o * j->P, ((const float *)j->b->data)[(gi * j->Og + o) * j->b->st[0]], j->P);
    }
    free(col);
}
/* Images (x groups) in parallel when there are at least as many as threads,
 * each running a serial GEMM (nested pool calls run inline); fewer images
 * run in turn and let each GEMM use the pool. */
static void conv_run(kn_rows_fn fn, conv_job *j, int64_t rows, int64_t work) {
    int nth = kn_pool_nthreads();
    if (nth >= 2 && rows >= nth && work >= PAR_MIN) par_rows(fn, j, rows, work);
    else fn(j, 0, rows);
}

static bool fast_conv2d(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *w = &e->src[1], *y = &e->dst;
    const kn_tview *b = t->src[2] ? &e->src[2] : NULL;
    if (!f32(x) || !f32(w) || !f32(y) || (b && !f32(b)) || x->ndim != 4 || w->ndim != 4 || y->ndim != 4) return false;
    if (!kn_tview_is_contiguous(w) || !out_planes_ok(y) || overlap(x, y)) return false;
    int64_t N = y->ne[0], O = y->ne[1], G = t->p.conv.groups, Cg = w->ne[1], KH = w->ne[2], KW = w->ne[3];
    conv_job j = {x, w, b, y, G, Cg, O / G, Cg * KH * KW, y->ne[2] * y->ne[3],
                  geo(t, x->ne[2], x->ne[3], y->ne[2], y->ne[3], KH, KW), 0, 0};
    if (N == 0 || j.P == 0 || O == 0 || j.K == 0) return false;
    j.scratch = (size_t)(j.K * j.P);
    conv_run(conv_rows, &j, N * G, N * O * j.P * j.K);
    return !atomic_load(&j.failed);
}

static void convt_rows(void *p, int64_t r0, int64_t r1) {
    conv_job *j = p;
    const conv_geo *g = &j->g;
    int64_t HW = g->H * g->W, OP = g->OH * g->OW;
    float *col = malloc(sizeof(float) * j->scratch);
    if (!col) { atomic_store(&j->failed, 1); return; }
    float *xbuf = col + j->K * HW;
    for (int64_t r = r0; r < r1; r++) {
        int64_t n = r / j->G, gi = r % j->G;
        const float *xg = planes(j->x, n, gi * j->Cg, j->Cg, xbuf);
        const float *wg = (const float *)j->w->data + gi * j->Cg * j->K;
        kn_sgemm(true, false, j->K, HW, j->Cg, 1.0f, wg, j->K, xg, HW, 0.0f, col, HW);
        float *yg = (float *)j->y->data + n * j->y->st[0] + gi * j->Og * OP;
        for (int64_t o = 0; o < j->Og; o++) {
            float bv = j->b ? ((const float *)j->b->data)[(gi * j->Og + o) * j->b->st[0]] : 0.0f;
            float *yo = yg + o * OP;
            for (int64_t k = 0; k < OP; k++) yo[k] = bv;
            for (int64_t kh = 0; kh < g->KH; kh++)
                for (int64_t kw = 0; kw < g->KW; kw++) {
                    const float *cr = col + ((o * g->KH + kh) * g->KW + kw) * HW;
                    for (int64_t iy = 0; iy < g->H; iy++) {
                        int64_t oy = iy * g->sh - g->ph + kh * g->dh;
                        if (oy < 0 || oy >= g->OH) continue;
                        float *yr = yo + oy * g->OW;
                        const float *c = cr + iy * g->W;
                        for (int64_t ix = 0; ix < g->W; ix++) {
                            int64_t ox = ix * g->sw - g->pw + kw * g->dw;
                            if (ox >= 0 && ox < g->OW) yr[ox] += c[ix];
                        }
                    }
                }
        }
    }
    free(col);
}
static bool fast_conv_transpose2d(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *w = &e->src[1], *y = &e->dst;
    const kn_tview *b = t->src[2] ? &e->src[2] : NULL;
    if (!f32(x) || !f32(w) || !f32(y) || (b && !f32(b)) || x->ndim != 4 || w->ndim != 4 || y->ndim != 4) return false;
    if (!kn_tview_is_contiguous(w) || !out_planes_ok(y) || overlap(x, y)) return false;
    int64_t N = y->ne[0], O = y->ne[1], C = x->ne[1], G = t->p.conv.groups, Og = w->ne[1], KH = w->ne[2], KW = w->ne[3];
    if (G < 1 || C % G || O != G * Og) return false;
    conv_job j = {x, w, b, y, G, C / G, Og, Og * KH * KW, x->ne[2] * x->ne[3],
                  geo(t, x->ne[2], x->ne[3], y->ne[2], y->ne[3], KH, KW), 0, 0};
    if (N == 0 || j.P == 0 || O == 0 || j.K == 0 || j.Cg == 0) return false;
    j.scratch = (size_t)(j.K * j.P + j.Cg * j.P);
    conv_run(convt_rows, &j, N * G, N * O * j.P * j.K);
    return !atomic_load(&j.failed);
}

/* conv2d_bwd_w: a = src 0 [N, Ca, H, W], b = src 1 [N, Cb, OH, OW], dw [Cb, Cga, KH, KW].
 * nparts jobs each sum their share of the images into a private dw. */
typedef struct {
    const kn_tview *a, *b; float *part; int nparts;
    int64_t N, G, Cga, Cgb, K, P; conv_geo g;
    atomic_int failed;
} bww_job;
static void bww_part(void *p, int ith, int nth) {
    bww_job *j = p;
    (void)nth;
    int64_t n0 = j->N * ith / j->nparts, n1 = j->N * (ith + 1) / j->nparts;
    float *dw = j->part + (size_t)ith * (size_t)(j->G * j->Cgb * j->K);
    float *col = malloc(sizeof(float) * (size_t)(j->K * j->P + j->Cgb * j->P));
    if (!col) { atomic_store(&j->failed, 1); return; }
    float *bbuf = col + j->K * j->P;
    for (int64_t gi = 0; gi < j->G; gi++) {
        float *dwg = dw + gi * j->Cgb * j->K;
        if (n0 == n1) memset(dwg, 0, sizeof(float) * (size_t)(j->Cgb * j->K));
        for (int64_t n = n0; n < n1; n++) {
            im2col(j->a, n, gi * j->Cga, j->Cga, &j->g, col);
            const float *bg = planes(j->b, n, gi * j->Cgb, j->Cgb, bbuf);
            kn_sgemm(false, true, j->Cgb, j->K, j->P, 1.0f, bg, j->P, col, j->P, n == n0 ? 0.0f : 1.0f, dwg, j->K);
        }
    }
    free(col);
}
static bool fast_conv2d_bwd_w(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *a = &e->src[0], *b = &e->src[1], *dw = &e->dst;
    if (!f32(a) || !f32(b) || !f32(dw) || a->ndim != 4 || b->ndim != 4 || dw->ndim != 4) return false;
    if (!kn_tview_is_contiguous(dw) || overlap(dw, a) || overlap(dw, b)) return false;
    int64_t N = b->ne[0], Cb = dw->ne[0], Cga = dw->ne[1], KH = dw->ne[2], KW = dw->ne[3], G = t->p.conv.groups;
    if (G < 1 || Cb % G || a->ne[1] != G * Cga || b->ne[1] != Cb || a->ne[0] != N) return false;
    bww_job j = {a, b, NULL, 1, N, G, Cga, Cb / G, Cga * KH * KW, b->ne[2] * b->ne[3],
                 geo(t, a->ne[2], a->ne[3], b->ne[2], b->ne[3], KH, KW), 0};
    int64_t total = Cb * j.K;
    if (N == 0 || total == 0 || j.P == 0) return false;
    int64_t work = N * Cb * j.K * j.P;
    int nth = kn_pool_nthreads();
    j.nparts = (work >= PAR_MIN && nth >= 2 && N >= 2) ? (int)(N < nth ? N : nth) : 1;
    if (j.nparts == 1) j.part = dw->data;
    else if (!(j.part = malloc(sizeof(float) * (size_t)(total * j.nparts)))) return false;
    if (j.nparts == 1) bww_part(&j, 0, 1);
    else kn_pool_run(bww_part, &j, j.nparts);
    if (atomic_load(&j.failed)) { if (j.nparts > 1) free(j.part); return false; }   /* the reference redoes it */
    if (j.nparts > 1) {
        float *out = dw->data;
        memcpy(out, j.part, sizeof(float) * (size_t)total);
        for (int k = 1; k < j.nparts; k++) kn_vec_add(out, out, j.part + (size_t)k * (size_t)total, total);
        free(j.part);
    }
    return true;
}

/* ==== max pooling ==============================================================
 * Leading dims are planes, the last two pooled; any strides. The first
 * maximum of a window wins and NaN propagates, like the reference. */
typedef struct { const kn_tview *x, *y, *dy; int64_t H, W, OH, OW; int k[2], s[2], p[2], d[2]; atomic_int failed; } pool_job;
static int64_t win_max(const pool_job *j, const float *x, int64_t sy, int64_t sx, int64_t oy, int64_t ox, float *val) {
    float m = -INFINITY;
    int64_t arg = -1;
    for (int kh = 0; kh < j->k[0]; kh++) {
        int64_t iy = oy * j->s[0] - j->p[0] + (int64_t)kh * j->d[0];
        if (iy < 0 || iy >= j->H) continue;
        for (int kw = 0; kw < j->k[1]; kw++) {
            int64_t ix = ox * j->s[1] - j->p[1] + (int64_t)kw * j->d[1];
            if (ix < 0 || ix >= j->W) continue;
            float v = x[iy * sy + ix * sx];
            if (arg < 0 || v > m || isnan(v)) { m = v; arg = iy * j->W + ix; }
        }
    }
    *val = m;
    return arg;
}
static void mp_rows(void *p, int64_t r0, int64_t r1) {
    pool_job *j = p;
    const kn_tview *x = j->x, *y = j->y;
    int nd = x->ndim;
    for (int64_t r = r0; r < r1; r++) {
        const float *xb = (const float *)x->data + off_lead(x, nd - 2, r);
        float *yb = (float *)y->data + off_lead(y, nd - 2, r);
        for (int64_t oy = 0; oy < j->OH; oy++)
            for (int64_t ox = 0; ox < j->OW; ox++) {
                float m;
                win_max(j, xb, x->st[nd - 2], x->st[nd - 1], oy, ox, &m);
                yb[oy * y->st[nd - 2] + ox * y->st[nd - 1]] = m;
            }
    }
}
static void mpb_rows(void *p, int64_t r0, int64_t r1) {
    pool_job *j = p;
    const kn_tview *x = j->x, *dy = j->dy, *dx = j->y;
    int nd = x->ndim;
    float *acc = malloc(sizeof(float) * (size_t)(j->H * j->W));
    if (!acc) { atomic_store(&j->failed, 1); return; }
    for (int64_t r = r0; r < r1; r++) {
        const float *xb = (const float *)x->data + off_lead(x, nd - 2, r);
        const float *gb = (const float *)dy->data + off_lead(dy, nd - 2, r);
        float *db = (float *)dx->data + off_lead(dx, nd - 2, r);
        memset(acc, 0, sizeof(float) * (size_t)(j->H * j->W));
        for (int64_t oy = 0; oy < j->OH; oy++)
            for (int64_t ox = 0; ox < j->OW; ox++) {
                float m;
                int64_t arg = win_max(j, xb, x->st[nd - 2], x->st[nd - 1], oy, ox, &m);
                if (arg >= 0) acc[arg] += gb[oy * dy->st[nd - 2] + ox * dy->st[nd - 1]];
            }
        for (int64_t iy = 0; iy < j->H; iy++)
            for (int64_t ix = 0; ix < j->W; ix++) db[iy * dx->st[nd - 2] + ix * dx->st[nd - 1]] = acc[iy * j->W + ix];
    }
    free(acc);
}
static bool fast_max_pool(const kn_exec *e) {
    const kn_tensor *t = e->node;
    bool bwd = t->op == KN_OP_MAX_POOL2D_BWD;
    const kn_tview *x = &e->src[0], *y = &e->dst, *out = bwd ? &e->src[1] : &e->dst;
    int nd = x->ndim;
    if (!f32(x) || !f32(y) || (bwd && !f32(out)) || nd < 2 || y->ndim != nd || out->ndim != nd) return false;
    if (overlap(x, y) || (bwd && overlap(out, y))) return false;
    pool_job j = {x, bwd ? y : out, bwd ? out : NULL, x->ne[nd - 2], x->ne[nd - 1], out->ne[nd - 2], out->ne[nd - 1],
                  {0}, {0}, {0}, {0}, 0};
    for (int i = 0; i < 2; i++) {
        j.k[i] = t->p.pool.kernel[i]; j.s[i] = t->p.pool.stride[i];
        j.p[i] = t->p.pool.padding[i]; j.d[i] = t->p.pool.dilation[i];
    }
    int64_t planes = prod(x, 0, nd - 2);
    if (planes == 0 || j.H * j.W == 0) return false;
    par_rows(bwd ? mpb_rows : mp_rows, &j, planes, planes * (j.OH * j.OW * j.k[0] * j.k[1] + (bwd ? j.H * j.W : 0)));
    return !atomic_load(&j.failed);
}

/* ==== dispatch ================================================================== */
bool kn_cpu_nn_fast(const kn_exec *e) {
    switch (e->node->op) {
    case KN_OP_RMS_NORM: case KN_OP_LAYER_NORM: return fast_norm(e);
    case KN_OP_SOFTMAX: case KN_OP_LOG_SOFTMAX: return fast_softmax(e);
    case KN_OP_ROPE: return fast_rope(e);
    case KN_OP_SDPA: return fast_sdpa(e);
    case KN_OP_SDPA_BWD: return fast_sdpa_bwd(e);
    case KN_OP_INDEX_SELECT: return fast_index_select(e);
    case KN_OP_INDEX_COPY: return fast_index_copy(e);
    case KN_OP_INDEX_ADD: return fast_index_add(e);
    case KN_OP_SCATTER_ADD: return fast_scatter_add(e);
    case KN_OP_PAD: return fast_pad(e);
    case KN_OP_COPY: return fast_copy(e);
    case KN_OP_CAT: return fast_cat(e);
    case KN_OP_CONV2D: return fast_conv2d(e);
    case KN_OP_CONV_TRANSPOSE2D: return fast_conv_transpose2d(e);
    case KN_OP_CONV2D_BWD_W: return fast_conv2d_bwd_w(e);
    case KN_OP_MAX_POOL2D: case KN_OP_MAX_POOL2D_BWD: return fast_max_pool(e);
    default: return false;
    }
}
