/* cpu_attention.c: the CPU backend's ROPE, SDPA and SDPA_BWD.
 *
 * Layouts: rope needs unit stride along D in x and y (outer dims any);
 * sdpa unit stride along D in q, k, v, y (GQA, causal; K and V f32 or an
 * f16 KV cache). Letters: B batch, Hq/Hkv query/key heads, G = Hq/Hkv,
 * Tq/Tk query/key lengths, D/Dv head dims.
 *
 * Non-goal: fused attention over blocks of queries (prefill runs one query
 * row at a time through the matrix-vector kernels of gemm.h).
 */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/gemm.h"         // defines: kn_sgemv_*_fn and kernels
#include "backends/cpu/vec.h"          // defines: kn_vec_*
#include "core/cpu.h"                  // defines: kn_cpu, KN_ISA_*
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

/* matrix-vector kernels of gemm.h for the current ISA */
static int g_force_isa = -1;
void kn_cpu_attention_force_isa(int isa) { g_force_isa = isa; }
static int attention_isa(void) {
    int isa = (int)kn_cpu()->isa;
    if (g_force_isa >= 0 && g_force_isa < isa) isa = g_force_isa;
    return isa;
}
void kn_cpu_pick_gemv(kn_sgemv_dot_fn *dot, kn_sgemv_axpy_fn *axpy) {
    int isa = attention_isa();
    (void)isa;
#if !defined(KN_NO_X86) && (defined(__x86_64__) || defined(__i386__))
#ifndef KN_NO_AVX512
    if (isa >= KN_ISA_AVX512) { *dot = kn_sgemv_dot_avx512; *axpy = kn_sgemv_axpy_avx512; return; }
#endif
    if (isa >= KN_ISA_AVX2) { *dot = kn_sgemv_dot_avx2; *axpy = kn_sgemv_axpy_avx2; return; }
#endif
    *dot = kn_sgemv_dot_generic; *axpy = kn_sgemv_axpy_generic;
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
bool kn_cpu_rope(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *x = &e->src[0], *pos = &e->src[1], *y = &e->dst;
    int nd = x->ndim;
    if (!is_f32(x) || !is_f32(y) || nd < 2 || pos->ndim != 1) return false;
    const kn_dtype_info *pi = kn_dtype_get(pos->dtype);
    if (pi->is_float || pi->is_quant) return false;
    int64_t T = x->ne[nd - 2], D = x->ne[nd - 1], O = prod(x, 0, nd - 2);
    if (T == 0 || D == 0 || O == 0 || pos->ne[0] < T) return false;
    if (x->st[nd - 1] != 1 || y->st[nd - 1] != 1 || t->p.rope.n_rot > D) return false;
    if (!kn_cpu_same_or_disjoint(x, y)) return false;
    rope_job j = {x, y, pos, e->nsrc > 2 ? &e->src[2] : NULL, T, D, O, t->p.rope.n_rot, t->p.rope.neox, t->p.rope.theta,
                  t->p.rope.freq_scale, 0};
    kn_cpu_par_rows(rope_rows, &j, T, O * T * D);
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
bool kn_cpu_sdpa(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2], *y = &e->dst;
    bool f16kv = k->dtype == KN_F16 && v->dtype == KN_F16;
    if (!is_f32(q) || (!f16kv && (!is_f32(k) || !is_f32(v))) || !is_f32(y) || q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || y->ndim != 4)
        return false;
    int64_t B = q->ne[0], Hq = q->ne[1], Tq = q->ne[2], D = q->ne[3], Hkv = k->ne[1], Tk = k->ne[2], Dv = v->ne[3];
    if (Hkv < 1 || Hq % Hkv || B * Hq * Tq == 0 || Dv == 0) return false;
    if ((D > 1 && (q->st[3] != 1 || k->st[3] != 1)) || (Dv > 1 && (v->st[3] != 1 || y->st[3] != 1))) return false;
    if (kn_cpu_overlap(y, q) || kn_cpu_overlap(y, k) || kn_cpu_overlap(y, v)) return false;
    sdpa_job j = {q, k, v, y, Hq, Tq, Tk, D, Dv, Hq / Hkv, t->p.sdpa.causal, f16kv, (float)t->p.sdpa.scale, NULL, NULL, 0};
    kn_cpu_pick_gemv(&j.dot, &j.axpy);
    int64_t rows = B * Hq * Tq;
    kn_cpu_par_rows(sdpa_rows, &j, rows, rows * (Tk > 0 ? Tk : 1) * (D + Dv));
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
bool kn_cpu_sdpa_bwd(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2], *g = &e->src[3], *y = &e->dst;
    if (!is_f32(q) || !is_f32(k) || !is_f32(v) || !is_f32(g) || !is_f32(y) || q->ndim != 4 || k->ndim != 4 || v->ndim != 4 || g->ndim != 4)
        return false;
    int64_t B = q->ne[0], Hq = q->ne[1], Tq = q->ne[2], D = q->ne[3], Hkv = k->ne[1], Tk = k->ne[2], Dv = v->ne[3];
    if (Hkv < 1 || Hq % Hkv || D == 0 || Dv == 0 || Tq == 0 || Tk == 0 || y->st[0] != 1) return false;
    if ((D > 1 && (q->st[3] != 1 || k->st[3] != 1)) || (Dv > 1 && (v->st[3] != 1 || g->st[3] != 1))) return false;
    if (kn_cpu_overlap(y, q) || kn_cpu_overlap(y, k) || kn_cpu_overlap(y, v) || kn_cpu_overlap(y, g)) return false;
    float *dq = y->data;
    int64_t nq = B * Hq * Tq * D, nk = B * Hkv * Tk * D;
    sdpab_job j = {q, k, v, g, dq, dq + nq, dq + nq + nk, Hq, Hkv, Tq, Tk, D, Dv, Hq / Hkv, t->p.sdpa.causal,
                   (float)t->p.sdpa.scale, NULL, NULL, 0};
    kn_cpu_pick_gemv(&j.dot, &j.axpy);
    kn_cpu_par_rows(sdpab_heads, &j, B * Hkv, B * Hq * Tq * Tk * (2 * D + 2 * Dv));
    return !atomic_load(&j.failed);
}
