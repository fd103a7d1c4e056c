/* cpu_attention.c: the CPU backend's ROPE, SDPA and SDPA_BWD.
 *
 * Layouts: rope needs unit stride along D in x and y (outer dims any);
 * sdpa unit stride along D in q, k, v, y (GQA, causal; K and V f32 or an
 * f16 KV cache). Letters: B batch, Hq/Hkv query/key heads, G = Hq/Hkv,
 * Tq/Tk query/key lengths, D/Dv head dims.
 *
 * One query row (decode) runs through the matrix-vector kernels of gemm.h;
 * a block of query rows (prefill, training) through small GEMMs (kn_sgemm,
 * single-threaded inside a job): S = Q_blk K^T over the block's key range,
 * masked row softmax, Y_blk = P V. Non-goal: online (flash) softmax over key
 * blocks; a block keeps its whole score rows, at most SDPA_SCORES floats.
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
 * to f32 in a scratch buffer and go through the same kernels. A sliding
 * window starts the key range later (sdpa_range); a softcap c maps each scaled
 * score to c tanh(s / c) (tanhf, in f32). */
#define SDPA_KB 64
/* the keys [*lo, *hi) query row i sees (graph/ops_nn.c: kn_sdpa_ex) */
static void sdpa_range(bool causal, int64_t window, int64_t i, int64_t Tq, int64_t Tk, int64_t *lo, int64_t *hi) {
    int64_t p = i + (Tk - Tq);            /* the query's position among the keys */
    *hi = causal && p + 1 < Tk ? p + 1 : Tk;
    *lo = window > 0 && p + 1 - window > 0 ? p + 1 - window : 0;
}
static void softcap_rows(float *s, float cap, int64_t n) {
    for (int64_t j = 0; j < n; j++) s[j] = cap * tanhf(s[j] / cap);
}
typedef struct {
    const kn_tview *q, *k, *v, *y;
    int64_t Hq, Tq, Tk, D, Dv, G;
    bool causal, f16kv; float scale;
    kn_sgemv_dot_fn dot; kn_sgemv_axpy_fn axpy;
    atomic_int failed;
    int64_t window; float softcap;
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
        int64_t lo, n;
        sdpa_range(j->causal, j->window, i, j->Tq, j->Tk, &lo, &n);
        const char *kb = (const char *)k->data + (b * k->st[0] + hk * k->st[1] + lo * k->st[2]) * es;
        const char *vb = (const char *)v->data + (b * v->st[0] + hk * v->st[1] + lo * v->st[2]) * es;
        float *yr = (float *)y->data + b * y->st[0] + h * y->st[1] + i * y->st[2];
        n -= lo;                                 /* keys lo .. lo + n - 1 */
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
        if (j->softcap > 0) softcap_rows(s, j->softcap, n);
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
/* ---- blocks of query rows -------------------------------------------------
 * Rows [i0, i1) of one (b, h) see keys [lo(i0), hi(i1 - 1)) between them
 * (both ends only grow with i); the GEMMs run over that whole range and each
 * row's softmax over its own part, the rest of its scores set to 0. */
#define SDPA_MIN_ROWS 8                /* fewer query rows: matrix-vector path   */
#define SDPA_BQ 64                     /* query rows in a block, at most          */
#define SDPA_SCORES (64 * 1024)        /* score floats a block keeps, at most     */
/* Rows a block: whole micro-kernel tiles, at most half the keys (a causal
 * block computes scores up to its last row's key: smaller blocks waste less
 * of the masked triangle; measured on [8,4,64,32]: 28 rows 0.90x the time of
 * 56, on [1,9,512,64]: 56 rows 0.88x of 28), SDPA_BQ and SDPA_SCORES. */
static int64_t sdpa_block_rows(int64_t Tq, int64_t Tk) {
    int64_t bq = SDPA_SCORES / (Tk > 0 ? Tk : 1), mr = kn_sgemm_tile_rows();
    if (bq > SDPA_BQ) bq = SDPA_BQ;
    if (bq > Tk / 2) bq = Tk / 2;
    if (bq > mr) bq = bq / mr * mr;
    if (bq > Tq) bq = Tq;
    return bq < 1 ? 1 : bq;
}
/* Block blk of rows bq: its first row *i0, its rows *m and the keys [*lo,
 * *lo + *n) its rows see between them */
static void sdpa_block_keys(bool causal, int64_t window, int64_t blk, int64_t bq, int64_t Tq, int64_t Tk, int64_t *i0,
                            int64_t *m, int64_t *lo, int64_t *n) {
    int64_t i1 = (blk + 1) * bq < Tq ? (blk + 1) * bq : Tq, hi, x;
    *i0 = blk * bq; *m = i1 - *i0;
    sdpa_range(causal, window, *i0, Tq, Tk, lo, &x);
    sdpa_range(causal, window, i1 - 1, Tq, Tk, &x, &hi);
    *n = hi > *lo ? hi - *lo : 0;
}
/* f16 K or V rows [lo, lo + n) widened into w [n, D] (row stride D) */
static const float *sdpa_widen(const kn_tview *t, const char *base, int64_t n, int64_t D, float *w) {
    for (int64_t r = 0; r < n; r++) kn_vec_f16_to_f32(w + r * D, (const uint16_t *)base + r * t->st[2], D);
    return w;
}
/* Row rr of a block (query row i) over the block's keys [lo, lo + n): its
 * scores S[rr] become softmax probabilities on its own keys [*a, *b) (block
 * offsets) and 0 elsewhere; dcap (when not NULL) gets the softcap's
 * derivative. Returns false when the row sees no key. */
static bool sdpa_row_probs(bool causal, int64_t window, float cap, int64_t i, int64_t Tq, int64_t Tk, int64_t lo,
                           int64_t n, float *s, float *dcap, int64_t *ra, int64_t *rb) {
    int64_t a, b;
    sdpa_range(causal, window, i, Tq, Tk, &a, &b);
    a -= lo; b -= lo;
    *ra = a; *rb = b;
    if (b <= a) { for (int64_t c = 0; c < n; c++) s[c] = 0; return false; }
    for (int64_t c = 0; c < a; c++) s[c] = 0;
    for (int64_t c = b; c < n; c++) s[c] = 0;
    if (cap > 0)
        for (int64_t c = a; c < b; c++) {
            float th = tanhf(s[c] / cap);
            s[c] = cap * th;
            if (dcap) dcap[c] = 1 - th * th;
        }
    kn_vec_softmax(s + a, s + a, b - a);
    return true;
}
static void sdpa_blocks(void *p, int64_t r0, int64_t r1) {
    sdpa_job *j = p;
    const kn_tview *q = j->q, *k = j->k, *v = j->v, *y = j->y;
    int64_t Tq = j->Tq, Tk = j->Tk, D = j->D, Dv = j->Dv, bq = sdpa_block_rows(Tq, Tk), nb = (Tq + bq - 1) / bq;
    size_t ns = (size_t)(bq * Tk), nw = j->f16kv ? (size_t)(Tk * (D + Dv)) : 0;
    float *S = malloc(sizeof(float) * (ns + nw));
    if (!S) { atomic_store(&j->failed, 1); return; }
    const int64_t es = j->f16kv ? 2 : 4;
    for (int64_t r = r0; r < r1; r++) {
        int64_t blk = r % nb, h = (r / nb) % j->Hq, b = r / (nb * j->Hq), hk = h / j->G, i0, m, lo, n, ra, rb;
        sdpa_block_keys(j->causal, j->window, blk, bq, Tq, Tk, &i0, &m, &lo, &n);
        const float *Q = (const float *)q->data + b * q->st[0] + h * q->st[1] + i0 * q->st[2];
        float *Y = (float *)y->data + b * y->st[0] + h * y->st[1] + i0 * y->st[2];
        const char *kb = (const char *)k->data + (b * k->st[0] + hk * k->st[1] + lo * k->st[2]) * es;
        const char *vb = (const char *)v->data + (b * v->st[0] + hk * v->st[1] + lo * v->st[2]) * es;
        const float *K = (const float *)kb, *V = (const float *)vb;
        int64_t ldk = k->st[2], ldv = v->st[2];
        if (n > 0 && j->f16kv) {
            K = sdpa_widen(k, kb, n, D, S + ns); V = sdpa_widen(v, vb, n, Dv, S + ns + n * D);
            ldk = D; ldv = Dv;
        }
        if (n > 0) kn_sgemm(false, true, m, n, D, j->scale, Q, q->st[2], K, ldk, 0.0f, S, n);
        uint64_t none = 0;                       /* rows (of the first 64) without a key */
        for (int64_t rr = 0; rr < m; rr++)
            if (!sdpa_row_probs(j->causal, j->window, j->softcap, i0 + rr, Tq, Tk, lo, n, S + rr * n, NULL, &ra, &rb))
                none |= 1ull << rr;
        if (n > 0) kn_sgemm(false, false, m, Dv, n, 1.0f, S, n, V, ldv, 0.0f, Y, y->st[2]);
        for (int64_t rr = 0; rr < m; rr++)       /* no key: NaN, like the reference */
            if (n == 0 || (none >> rr & 1))
                for (int64_t d = 0; d < Dv; d++) Y[rr * y->st[2] + d] = NAN;
    }
    free(S);
}

/* the GEMMs take rows along dim 2 at a stride of at least their length */
static bool sdpa_rows_apart(const kn_tview *t, int64_t len) { return t->st[2] >= len && t->st[2] > 0; }

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
    sdpa_job j = {q, k, v, y, Hq, Tq, Tk, D, Dv, Hq / Hkv, t->p.sdpa.causal, f16kv, (float)t->p.sdpa.scale, NULL, NULL, 0,
                  t->p.sdpa.window, (float)t->p.sdpa.softcap};
    kn_cpu_pick_gemv(&j.dot, &j.axpy);
    int64_t rows = B * Hq * Tq, work = rows * (Tk > 0 ? Tk : 1) * (D + Dv);
    if (Tq >= SDPA_MIN_ROWS && Tk > 0 && sdpa_rows_apart(q, D) && sdpa_rows_apart(y, Dv) &&
        (f16kv || (sdpa_rows_apart(k, D) && sdpa_rows_apart(v, Dv)))) {
        int64_t bq = sdpa_block_rows(Tq, Tk);
        kn_cpu_par_rows(sdpa_blocks, &j, B * Hq * ((Tq + bq - 1) / bq), work);
    } else
        kn_cpu_par_rows(sdpa_rows, &j, rows, work);
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
    int64_t window; float softcap;
} sdpab_job;
#define ROW(v, b, h, i) ((const float *)(v)->data + (b) * (v)->st[0] + (h) * (v)->st[1] + (i) * (v)->st[2])
static void sdpab_heads(void *p, int64_t r0, int64_t r1) {
    sdpab_job *j = p;
    int64_t Tq = j->Tq, Tk = j->Tk, D = j->D, Dv = j->Dv, off = Tk - Tq, wmax = D > Dv ? D : Dv;
    float *buf = malloc(sizeof(float) * (size_t)(2 * Tk * Tq + 3 * Tk + wmax + 1));
    if (!buf) { atomic_store(&j->failed, 1); return; }
    float *PT = buf, *DST = PT + Tk * Tq, *s = DST + Tk * Tq, *ds = s + Tk, *dcap = ds + Tk, *tmp = dcap + Tk;
    float cap = j->softcap;
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
                int64_t lo, hi;
                sdpa_range(j->causal, j->window, i, Tq, Tk, &lo, &hi);
                int64_t n = hi - lo;                 /* keys lo .. hi - 1 */
                if (n <= 0) { for (int64_t d = 0; d < D; d++) dqi[d] = NAN; continue; }
                j->dot(n, D, K + lo * ldk, ldk, qi, s);
                kn_vec_mul_scalar(s, s, j->scale, n);
                if (cap > 0)
                    for (int64_t c = 0; c < n; c++) {
                        float th = tanhf(s[c] / cap);
                        s[c] = cap * th;
                        dcap[c] = 1 - th * th;       /* d(capped) / d(score) */
                    }
                kn_vec_softmax(s, s, n);
                j->dot(n, Dv, V + lo * ldv, ldv, gr, ds);
                kn_vec_softmax_bwd(ds, s, ds, cap > 0 ? dcap : NULL, j->scale, n);
                j->axpy(n, D, K + lo * ldk, ldk, ds, dqi);
                for (int64_t c = 0; c < n; c++) { PT[(lo + c) * Tq + i] = s[c]; DST[(lo + c) * Tq + i] = ds[c]; }
            }
            const float *Q = ROW(j->q, b, h, 0), *Gm = ROW(j->g, b, h, 0);
            for (int64_t c = 0; c < Tk; c++) {
                int64_t i0 = j->causal && c - off > 0 ? c - off : 0;
                if (i0 < 0) i0 = 0;
                int64_t i1 = Tq;                     /* a window: rows i < c - off + W see key c */
                if (j->window > 0 && c - off + j->window < i1) i1 = c - off + j->window;
                int64_t m = i1 - i0;
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
/* Blocks of query rows (the forward's blocks, same key ranges), per query
 * head of the group, with dk and dv of the head zeroed first:
 *   P = softmax(scale Q_blk K^T) (masked entries 0), dP = G_blk V^T,
 *   dS = scale P (dP - rowsum(P dP)) (times the softcap's derivative),
 *   dQ_blk = dS K,  dK += dS^T Q_blk,  dV += P^T G_blk. */
static void sdpab_blocks(void *p, int64_t r0, int64_t r1) {
    sdpab_job *j = p;
    int64_t Tq = j->Tq, Tk = j->Tk, D = j->D, Dv = j->Dv, bq = sdpa_block_rows(Tq, Tk), nb = (Tq + bq - 1) / bq;
    float cap = j->softcap;
    size_t ns = (size_t)(bq * Tk);
    float *P = malloc(sizeof(float) * ns * (cap > 0 ? 3 : 2));
    if (!P) { atomic_store(&j->failed, 1); return; }
    float *dP = P + ns, *dcap = cap > 0 ? dP + ns : NULL;
    int64_t ldk = j->k->st[2], ldv = j->v->st[2], ldq = j->q->st[2], ldg = j->g->st[2];
    for (int64_t r = r0; r < r1; r++) {
        int64_t b = r / j->Hkv, hk = r % j->Hkv;
        const float *K = ROW(j->k, b, hk, 0), *V = ROW(j->v, b, hk, 0);
        float *dk = j->dk + (b * j->Hkv + hk) * Tk * D, *dv = j->dv + (b * j->Hkv + hk) * Tk * Dv;
        for (int64_t c = 0; c < Tk * D; c++) dk[c] = 0;
        for (int64_t c = 0; c < Tk * Dv; c++) dv[c] = 0;
        for (int64_t gi = 0; gi < j->G; gi++) {
            int64_t h = hk * j->G + gi;
            const float *Q = ROW(j->q, b, h, 0), *Gm = ROW(j->g, b, h, 0);
            float *dq = j->dq + (b * j->Hq + h) * Tq * D;
            for (int64_t blk = 0; blk < nb; blk++) {
                int64_t i0, m, lo, n;
                sdpa_block_keys(j->causal, j->window, blk, bq, Tq, Tk, &i0, &m, &lo, &n);
                if (n == 0) { for (int64_t c = 0; c < m * D; c++) dq[i0 * D + c] = NAN; continue; }
                kn_sgemm(false, true, m, n, D, j->scale, Q + i0 * ldq, ldq, K + lo * ldk, ldk, 0.0f, P, n);
                kn_sgemm(false, true, m, n, Dv, 1.0f, Gm + i0 * ldg, ldg, V + lo * ldv, ldv, 0.0f, dP, n);
                uint64_t none = 0;
                for (int64_t rr = 0; rr < m; rr++) {
                    float *pr = P + rr * n, *dpr = dP + rr * n, *dc = dcap ? dcap + rr * n : NULL;
                    int64_t a, e;
                    if (!sdpa_row_probs(j->causal, j->window, cap, i0 + rr, Tq, Tk, lo, n, pr, dc, &a, &e)) {
                        none |= 1ull << rr;
                        for (int64_t c = 0; c < n; c++) dpr[c] = 0;
                        continue;
                    }
                    for (int64_t c = 0; c < a; c++) dpr[c] = 0;
                    for (int64_t c = e; c < n; c++) dpr[c] = 0;
                    kn_vec_softmax_bwd(dpr + a, pr + a, dpr + a, dc ? dc + a : NULL, j->scale, e - a);
                }
                kn_sgemm(false, false, m, D, n, 1.0f, dP, n, K + lo * ldk, ldk, 0.0f, dq + i0 * D, D);
                for (int64_t rr = 0; rr < m; rr++)
                    if (none >> rr & 1) for (int64_t d = 0; d < D; d++) dq[(i0 + rr) * D + d] = NAN;
                kn_sgemm(true, false, n, D, m, 1.0f, dP, n, Q + i0 * ldq, ldq, 1.0f, dk + lo * D, D);
                kn_sgemm(true, false, n, Dv, m, 1.0f, P, n, Gm + i0 * ldg, ldg, 1.0f, dv + lo * Dv, Dv);
            }
        }
    }
    free(P);
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
                   (float)t->p.sdpa.scale, NULL, NULL, 0, t->p.sdpa.window, (float)t->p.sdpa.softcap};
    kn_cpu_pick_gemv(&j.dot, &j.axpy);
    bool blocks = Tq >= SDPA_MIN_ROWS && sdpa_rows_apart(q, D) && sdpa_rows_apart(k, D) && sdpa_rows_apart(v, Dv) &&
                  sdpa_rows_apart(g, Dv);
    kn_cpu_par_rows(blocks ? sdpab_blocks : sdpab_heads, &j, B * Hkv, B * Hq * Tq * Tk * (2 * D + 2 * Dv));
    return !atomic_load(&j.failed);
}
