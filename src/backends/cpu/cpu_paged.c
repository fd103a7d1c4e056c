/* cpu_paged.c: the CPU backend's paged attention (KN_OP_PAGED_ATTN;
 * include/kiln.h and graph/ops_paged.c state the contract).
 *
 * One job row = one query row i and one key/value head hk with its G query
 * heads (grouped-query: the K/V rows of a block are read, and widened from
 * f16, once for the G heads). The row's visible positions are walked block
 * by block in the order of its sequence's block table; each block's rows
 * are contiguous in the pool ([Hkv, P, D], unit stride along D), so scores
 * are one matrix-vector product per block (gemm.h "dot" form) and the value
 * sum one more ("axpy" form). Online softmax: a running maximum m and sum l
 * per head, the accumulator rescaled by exp(m_old - m_new) when m grows, so
 * one pass over the keys and no score buffer longer than a block.
 *
 * Falls back to the reference (returns false) for layouts it does not take
 * and for out-of-range indices (the reference reports them).
 */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/gemm.h"         // defines: kn_sgemv_*_fn, kn_cpu_pick_gemv
#include "backends/cpu/vec.h"          // defines: kn_vec_f16_to_f32
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef struct {
    const kn_tview *q, *k, *v, *bt, *rs, *rp, *y;
    int64_t H, Hkv, G, D, Dv, P, S, MB, bs, win;
    bool f16; float scale;
    kn_sgemv_dot_fn dot; kn_sgemv_axpy_fn axpy;
    atomic_int failed;                 /* 1: out of memory, 2: an index out of range */
} paged_job;

static inline int32_t i32_at(const kn_tview *v, int64_t off) { return ((const int32_t *)v->data)[off]; }

static void paged_rows(void *p, int64_t r0, int64_t r1) {
    paged_job *j = p;
    int64_t G = j->G, D = j->D, Dv = j->Dv, bs = j->bs;
    /* per job: q [G, D], acc [G, Dv], s [bs], tmp [Dv], m, l [G]; f16: K block [bs, D], V block [bs, Dv] */
    size_t nf = (size_t)(G * D + G * Dv + bs + Dv + 2 * G + (j->f16 ? bs * (D + Dv) : 0));
    float *buf = malloc(sizeof(float) * nf);
    if (!buf) { atomic_store(&j->failed, 1); return; }
    float *qb = buf, *acc = qb + G * D, *s = acc + G * Dv, *tmp = s + bs, *mx = tmp + Dv, *l = mx + G, *kw = l + G, *vw = kw + bs * D;
    const kn_tview *q = j->q, *k = j->k, *v = j->v, *y = j->y;
    const int64_t es = j->f16 ? 2 : 4;
    for (int64_t r = r0; r < r1 && !atomic_load(&j->failed); r++) {
        int64_t i = r / j->Hkv, hk = r % j->Hkv;
        int64_t seq = i32_at(j->rs, i * j->rs->st[0]), pos = i32_at(j->rp, i * j->rp->st[0]);
        if (seq < 0 || seq >= j->S || pos < 0 || pos >= j->MB * bs) { atomic_store(&j->failed, 2); break; }
        for (int64_t g = 0; g < G; g++) {
            const float *qr = (const float *)q->data + i * q->st[0] + (hk * G + g) * q->st[1];
            for (int64_t d = 0; d < D; d++) qb[g * D + d] = qr[d * q->st[2]];
            mx[g] = -INFINITY; l[g] = 0;
            for (int64_t d = 0; d < Dv; d++) acc[g * Dv + d] = 0;
        }
        int64_t j0 = j->win > 0 && pos + 1 > j->win ? pos + 1 - j->win : 0;
        for (int64_t b = j0 / bs; b <= pos / bs; b++) {
            int64_t blk = i32_at(j->bt, seq * j->bt->st[0] + b * j->bt->st[1]);
            if (blk < 0 || (blk + 1) * bs > j->P) { atomic_store(&j->failed, 2); break; }
            int64_t lo = b * bs > j0 ? b * bs : j0, hi = (b + 1) * bs - 1 < pos ? (b + 1) * bs - 1 : pos, n = hi - lo + 1;
            int64_t row = blk * bs + (lo - b * bs);
            const char *kb = (const char *)k->data + (hk * k->st[0] + row * k->st[1]) * es;
            const char *vb = (const char *)v->data + (hk * v->st[0] + row * v->st[1]) * es;
            const float *kr = (const float *)kb, *vr = (const float *)vb;
            int64_t ldk = k->st[1], ldv = v->st[1];
            if (j->f16) {
                for (int64_t t = 0; t < n; t++) {
                    kn_vec_f16_to_f32(kw + t * D, (const uint16_t *)kb + t * k->st[1], D);
                    kn_vec_f16_to_f32(vw + t * Dv, (const uint16_t *)vb + t * v->st[1], Dv);
                }
                kr = kw; vr = vw; ldk = D; ldv = Dv;
            }
            for (int64_t g = 0; g < G; g++) {
                j->dot(n, D, kr, ldk, qb + g * D, s);
                float bm = -INFINITY;
                for (int64_t t = 0; t < n; t++) { s[t] *= j->scale; if (s[t] > bm) bm = s[t]; }
                float mnew = bm > mx[g] ? bm : mx[g], alpha = expf(mx[g] - mnew), sum = 0;   /* first block: exp(-inf) = 0 */
                for (int64_t t = 0; t < n; t++) { s[t] = expf(s[t] - mnew); sum += s[t]; }
                j->axpy(n, Dv, vr, ldv, s, tmp);
                float *a = acc + g * Dv;
                for (int64_t d = 0; d < Dv; d++) a[d] = a[d] * alpha + tmp[d];
                l[g] = l[g] * alpha + sum;
                mx[g] = mnew;
            }
        }
        for (int64_t g = 0; g < G; g++) {
            float *yr = (float *)y->data + i * y->st[0] + (hk * G + g) * y->st[1], inv = 1.0f / l[g];
            for (int64_t d = 0; d < Dv; d++) yr[d] = acc[g * Dv + d] * inv;
        }
    }
    free(buf);
}

bool kn_cpu_paged_attn(const kn_exec *e) {
    const kn_tensor *t = e->node;
    const kn_tview *q = &e->src[0], *k = &e->src[1], *v = &e->src[2], *y = &e->dst;
    bool f16 = k->dtype == KN_F16 && v->dtype == KN_F16;
    if (!is_f32(q) || (!f16 && (!is_f32(k) || !is_f32(v))) || !is_f32(y)) return false;
    int64_t T = q->ne[0], H = q->ne[1], D = q->ne[2], Hkv = k->ne[0], Dv = v->ne[2];
    if (T == 0 || Hkv < 1 || H % Hkv || Dv == 0) return false;
    if ((D > 1 && k->st[2] != 1) || (Dv > 1 && (v->st[2] != 1 || y->st[2] != 1))) return false;
    if (kn_cpu_overlap(y, q) || kn_cpu_overlap(y, k) || kn_cpu_overlap(y, v)) return false;
    paged_job j = {q, k, v, &e->src[3], &e->src[4], &e->src[5], y, H, Hkv, H / Hkv, D, Dv, k->ne[1], e->src[3].ne[0],
                   e->src[3].ne[1], t->p.paged.block_size, t->p.paged.window, f16, (float)t->p.paged.scale, NULL, NULL, 0};
    kn_cpu_pick_gemv(&j.dot, &j.axpy);
    /* work estimate: the keys of an average row, assumed half the table */
    kn_cpu_par_rows(paged_rows, &j, T * Hkv, T * H * (j.MB * j.bs / 2 + 1) * (D + Dv));
    return !atomic_load(&j.failed);
}
