/* cpu_matmul.c: the CPU backend's MATMUL: f32 operands through the packed
 * SGEMM (gemm.h), and a quantized, f16 or bf16 right operand (a weight)
 * through the dot products of backends/quant/quant.h or, for many activation rows, a
 * dequantized copy and the SGEMM. Both operands bf16 (or both f16), as mixed
 * precision training makes them: bf16 on a CPU with AMX through its tiles
 * (gemm_bf16.c, 2-3.5x the widening path on this machine: docs/PERF.md);
 * otherwise widened to f32 and run through the same SGEMM (exact products of
 * the rounded inputs, f32 sums), the result rounded back.
 * kn_cpu_matmul_ep also runs a matmul
 * epilogue's pieces (cpu_epilogue.c) as the SGEMM, GEMV or quantized rows finish them.
 */
#include "backends/cpu/cpu_impl.h"
#include "backends/cpu/gemm.h"         // defines: kn_sgemm, kn_sgemm_batched
#include "backends/cpu/threadpool.h"   // defines: kn_pool_nthreads
#include "backends/cpu/vec.h"          // defines: kn_vec_bf16_to_f32 and the other 16-bit conversions
#include "backends/quant/quant.h"                 // defines: kn_vec_dot_fn, kn_quantize_*, kn_dequantize_row
#include "backends/quant/qpack.h"                 // defines: kn_qpack_*, the 16-row packed layout
#include "core/core.h"                            // defines: struct kn_buffer (constant, derived)
#include "core/env.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* ==== operand layouts =======================================================
 * Each operand's last two dims must have a unit stride in one of them (row-
 * or column-major, i.e. a plain or transposed matrix); batch dims may be any
 * strides (including 0 for broadcast). C must be row-major. */
static bool mat_layout(const kn_tview *v, bool *trans, int64_t *ld) {
    int r = v->ndim - 2, c = v->ndim - 1;
    if (v->st[c] == 1 || v->ne[c] == 1) {          /* row-major: (i,k) at i*ld + k */
        *trans = false; *ld = v->ne[r] == 1 ? v->ne[c] : v->st[r];
        return *ld >= v->ne[c] || v->ne[r] == 1;
    }
    if (v->st[r] == 1 || v->ne[r] == 1) {          /* stored transposed: (i,k) at k*ld + i */
        *trans = true; *ld = v->ne[c] == 1 ? v->ne[r] : v->st[c];
        return *ld >= v->ne[r] || v->ne[c] == 1;
    }
    return false;
}

/* Quantized right operand: y[t, n] = dot(W row n, x row t). W is stored as
 * rows of K elements (the view is W^T: unit stride along K). The activation
 * rows are quantized once (to Q16, or to the weight type's 8-bit partner:
 * backends/quant/quant.h), then threads split the weight rows, so each weight row is
 * read once per call. */
typedef struct {
    kn_vec_dot_fn dot; kn_vec_dot4_fn dot4;   /* dot4: four tokens per weight row (Q16), or NULL */
    const char *W; size_t row_bytes; int64_t K, N, T;
    const char *xq; size_t xq_bytes; float *C; int64_t ldc;
    const kn_sgemm_post *post;    /* NULL, or run on each token's finished block of outputs */
} qmm_job;
static void qmm_rows(void *p, int64_t r0, int64_t r1) {
    qmm_job *j = p;
    /* blocks of 16 weight rows stay in cache while every token visits them */
    for (int64_t n0 = r0; n0 < r1; n0 += 16) {
        int64_t n1 = n0 + 16 < r1 ? n0 + 16 : r1;
        int64_t t = 0;
        /* tokens four at a time: each weight row decoded once for the four
         * (several sequences' decode rows in one step) */
        for (; j->dot4 && t + 4 <= j->T; t += 4) {
            const char *x = j->xq + t * j->xq_bytes;
            float *y = j->C + t * j->ldc, r[4];
            for (int64_t n = n0; n < n1; n++) {
                j->dot4(j->K, j->W + (size_t)n * j->row_bytes, x, j->xq_bytes, r);
                y[n] = r[0]; y[j->ldc + n] = r[1]; y[2 * j->ldc + n] = r[2]; y[3 * j->ldc + n] = r[3];
            }
            if (j->post) j->post->fn(j->post->ctx, j->C, j->ldc, t, t + 4, n0, n1);
        }
        for (; t < j->T; t++) {
            const char *x = j->xq + t * j->xq_bytes;
            float *y = j->C + t * j->ldc;
            /* the row's bytes KN_QUANT_PREFETCH ahead (quant.h; measured on this
             * Xeon: an earlier note on an AMD EPYC found a software prefetch
             * slower, at a distance it did not give) */
            for (int64_t n = n0; n < n1; n++) {
                const char *w = j->W + (size_t)n * j->row_bytes;
                kn_quant_prefetch(w, j->row_bytes);
                y[n] = j->dot(j->K, w, x);
            }
            if (j->post) j->post->fn(j->post->ctx, j->C, j->ldc, t, t + 1, n0, n1);
        }
    }
}
typedef struct { bool q16; kn_dtype at; const float *x; int64_t lda, K; char *xq; size_t xq_bytes; atomic_int bad; } qx_job;
static void qx_rows(void *p, int64_t r0, int64_t r1) {
    qx_job *j = p;
    for (int64_t t = r0; t < r1; t++) {
        char *y = j->xq + t * j->xq_bytes;
        kn_status st = KN_OK;
        if (j->q16) st = kn_quantize_q16(j->x + t * j->lda, (kn_block_q16 *)y, j->K);
        else if (j->at == KN_F32) memcpy(y, j->x + t * j->lda, (size_t)j->K * 4);
        else st = kn_quantize_row(j->at, j->x + t * j->lda, y, j->K);
        if (st) atomic_store(&j->bad, 1);   /* a NaN or infinity: blocks cannot hold it */
    }
}
/* Many activation rows (prefill): dequantizing each weight row once and
 * running the packed SGEMM beats T separate integer dot products per row,
 * and keeps the activations in f32. The scratch buffer is reused across
 * calls (plans run one node at a time). */
#define QMM_GEMM_MIN_ROWS 48
static _Thread_local float *g_wscratch;      /* per thread: two plans may run at once */
static _Thread_local size_t g_wscratch_n;
static pthread_key_t g_wscratch_key;          /* frees a thread's scratch when it exits */
static pthread_once_t g_wscratch_once = PTHREAD_ONCE_INIT;
static void wscratch_key_make(void) { pthread_key_create(&g_wscratch_key, free); }
static float *wscratch(size_t need) {
    if (need > g_wscratch_n) {
        float *w = realloc(g_wscratch, need * sizeof(float));
        if (!w) return NULL;
        g_wscratch = w; g_wscratch_n = need;
        pthread_once(&g_wscratch_once, wscratch_key_make);
        pthread_setspecific(g_wscratch_key, w);   /* a server's request threads come and go */
    }
    return g_wscratch;
}
/* Prefill: W is dequantized a block of CW output columns at a time into the
 * thread's scratch (a few MB of f32, which stays in cache) and that block is
 * multiplied right away by the SGEMM, single-threaded on the thread that
 * dequantized it; blocks are spread over the pool. Dequantizing all of W
 * first wrote and read N x K floats through DRAM, which cost more than the
 * products at short prompts (Llama-3.2-1B-shaped Q4_K_M, pp32 on 2 threads:
 * docs/PERF.md). The weights come from the packed copy (deq: W^T panels of
 * 16 columns a group) or from the file's rows (W rows, the SGEMM's B^T). */
typedef struct { const kn_sgemm_post *inner; float *C; int64_t col0; } post_shift;
static void post_shifted(void *ctx, float *C, int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const post_shift *s = ctx;                    /* the block's columns are C's from col0 */
    (void)C;
    s->inner->fn(s->inner->ctx, s->C, ldc, m0, m1, n0 + s->col0, n1 + s->col0);
}
typedef struct {
    const float *A; int64_t lda; float *C; int64_t ldc, T, N, K, cw;
    const kn_sgemm_post *post;
    kn_qpack_dequant_fn deq; const void *P; int64_t g_first;        /* packed copy, or ...  */
    kn_dtype wt; const char *W; size_t row_bytes;                   /* ... the file's rows   */
    atomic_int failed;
} qblk_job;
static void qblk_cols(void *p, int64_t c0, int64_t c1) {
    qblk_job *j = p;
    float *w = wscratch((size_t)(j->cw * j->K));
    if (!w) { atomic_store(&j->failed, 1); return; }
    for (int64_t c = c0; c < c1; c++) {
        int64_t n0 = c * j->cw, nc = j->N - n0 < j->cw ? j->N - n0 : j->cw;
        post_shift ps = {j->post, j->C, n0};
        kn_sgemm_post sp = {post_shifted, &ps};
        if (j->deq) {
            for (int64_t g = 0; g < (nc + KN_QPACK_ROWS - 1) / KN_QPACK_ROWS; g++)
                j->deq(j->P, j->g_first + n0 / KN_QPACK_ROWS + g, j->K, w + g * KN_QPACK_ROWS, j->cw);
            kn_sgemm_ep(false, false, j->T, nc, j->K, 1.0f, j->A, j->lda, w, j->cw, 0.0f, j->C + n0, j->ldc,
                        j->post ? &sp : NULL);
        } else {
            for (int64_t r = 0; r < nc; r++)
                kn_dequantize_row(j->wt, j->W + (size_t)(n0 + r) * j->row_bytes, w + r * j->K, j->K);
            kn_sgemm_ep(false, true, j->T, nc, j->K, 1.0f, j->A, j->lda, w, j->K, 0.0f, j->C + n0, j->ldc,
                        j->post ? &sp : NULL);
        }
    }
}
/* columns a block: 256 (the SGEMM's A packing is repeated per block), fewer
 * so that every thread gets two blocks, a multiple of the 16-row groups */
static int64_t qblk_width(int64_t N) {
    int64_t nt = kn_pool_nthreads(), cw = 256, share = (N + 2 * nt - 1) / (2 * nt);
    if (share < cw) cw = share;
    cw = (cw + KN_QPACK_ROWS - 1) / KN_QPACK_ROWS * KN_QPACK_ROWS;
    return cw < 2 * KN_QPACK_ROWS ? 2 * KN_QPACK_ROWS : cw;
}
static bool qblk_run(qblk_job *j) {
    int64_t blocks = (j->N + j->cw - 1) / j->cw;
    atomic_init(&j->failed, 0);
    kn_cpu_par_rows(qblk_cols, j, blocks, j->T * j->N * j->K);
    return !atomic_load(&j->failed);             /* out of memory: the row dots redo it all */
}
static bool matmul_dequant_sgemm(const kn_tview *d, const kn_tview *a, const kn_tview *b, const kn_sgemm_post *post) {
    int64_t T = d->ne[0], N = d->ne[1], K = a->ne[1];
    qblk_job j = {a->data, a->st[0], d->data, d->st[0], T, N, K, qblk_width(N), post, NULL, NULL, 0,
                  b->dtype, b->data, kn_dtype_nbytes(b->dtype, b->st[1]), 0};
    return qblk_run(&j);
}

/* ==== decode against 16-row packed weights (backends/quant/qpack.h) ==========
 * A constant buffer (a model's weights: core.h) of rows of a packed type (qpack.h) is
 * packed once, at the first matmul with few activation rows, into a copy
 * the buffer owns (buf->derived, freed with it); later matmuls of that
 * buffer, and of row ranges of it that start on a 16-row boundary (a
 * stacked expert), read the copy, four activation rows at a time where
 * there are four. Prefill (>= QMM_GEMM_MIN_ROWS rows) dequantizes the copy
 * into W^T blocks and runs the f32 SGEMM on each (qblk_cols), so after
 * packing the file's rows are never read again. The threshold is measured
 * (2 threads, this VM): at 32 rows the four-row kernel was 1.26x the SGEMM
 * on a Llama-3.2-1B-shaped Q4_K_M and even on SmolLM2, at 48 the SGEMM
 * 1.02x / 1.27x, at 64 1.23x / 1.48x. Where the four-row kernel exists
 * (AVX512-VNNI) it takes every row count: with its accumulators in
 * registers it beat the SGEMM at 64 to 1024 rows (1B-shaped Q4_K_M pp64 141
 * against 79 tok/s, pp512 149 / 131, pp1024 141 / 135; SmolLM2 Q4_0, Q4_1,
 * Q8_0 pp128 1.5x, pp512 1.25x). */
typedef struct { kn_dtype t; int64_t K, rows; size_t row_bytes; void *data; } cpu_qpack;
/* The fewest activation rows that go to the SGEMM: none where the packed
 * four-row kernel takes W's type with Q16 activations */
static int64_t qmm_gemm_min_rows(kn_dtype t, kn_qact mode) {
    bool int_rows = kn_qpack_gemm4_simd(t) && (mode == KN_QACT_AUTO || mode == KN_QACT_Q16) && !kn_env_get()->qpack_off;
    return int_rows ? INT64_MAX : QMM_GEMM_MIN_ROWS;
}
static void qpack_free(void *p) {
    cpu_qpack *q = p;
    free(q->data);
    free(q);
}
typedef struct { const cpu_qpack *q; const void *src; } qpack_job;
static void qpack_groups(void *p, int64_t g0, int64_t g1) {
    const qpack_job *j = p;
    kn_qpack_pack(j->q->t, j->src, j->q->row_bytes, j->q->rows, j->q->K, g0, g1, j->q->data);
}
/* the packed copy of b's buffer, made on first use; NULL where b cannot have one */
static const cpu_qpack *qpack_of(const kn_tview *b, int64_t K, size_t row_bytes) {
    kn_buffer *buf = b->buf;
    if (!buf || !buf->constant || kn_env_get()->qpack_off || !kn_qpack_type_ok(b->dtype) || !kn_qpack_gemv_simd(b->dtype))
        return NULL;
    cpu_qpack *q = __atomic_load_n(&buf->derived, __ATOMIC_ACQUIRE);
    if (!q) {
        if (buf->size % row_bytes) return NULL;
        cpu_qpack *n = calloc(1, sizeof *n);
        if (!n) return NULL;
        *n = (cpu_qpack){b->dtype, K, (int64_t)(buf->size / row_bytes), row_bytes, NULL};
        size_t bytes = kn_qpack_nbytes(n->t, n->rows, K);
        if (posix_memalign(&n->data, 64, bytes ? bytes : 64)) { free(n); return NULL; }
        qpack_job j = {n, buf->data};
        int64_t groups = (n->rows + KN_QPACK_ROWS - 1) / KN_QPACK_ROWS;
        kn_cpu_par_rows(qpack_groups, &j, groups, groups * KN_QPACK_ROWS * K);
        void *none = NULL;
        if (__atomic_compare_exchange_n(&buf->derived, &none, n, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            buf->derived_free = qpack_free;                                                         /* read only at release */
        else qpack_free(n);                                                                         /* another plan won */
        q = __atomic_load_n(&buf->derived, __ATOMIC_ACQUIRE);
    }
    return q->t == b->dtype && q->K == K && q->row_bytes == row_bytes ? q : NULL;
}

/* Activation rows [r0, r1) (Q16, row r at xq + r * xb) against packed group
 * G: four rows at a time where there are four (the weights widened once),
 * then one; row r's 16 outputs go to out + r * ldo, their first `cols`
 * (a matrix's last group may be partial). */
static void packed_group_rows(kn_qpack_gemv_fn gemv, kn_qpack_gemm4_fn gemm4, const void *P, int64_t G, int64_t K,
                              const kn_block_q16 *xq, int64_t xb, int64_t r0, int64_t r1, float *out, int64_t ldo,
                              int64_t cols) {
    float y[4][KN_QPACK_ROWS];
    int64_t r = r0;
    for (; gemm4 && r + 4 <= r1; r += 4) {
        gemm4(P, G, K, xq + r * xb, xb, y[0], KN_QPACK_ROWS);
        for (int i = 0; i < 4; i++) memcpy(out + (r + i) * ldo, y[i], sizeof(float) * (size_t)cols);
    }
    for (; r < r1; r++) {
        gemv(P, G, G + 1, K, xq + r * xb, y[0]);
        memcpy(out + r * ldo, y[0], sizeof(float) * (size_t)cols);
    }
}

/* T activation rows (row t at x + t * ld, K floats) as Q16 blocks, with
 * `extra` bytes after them for the caller, quantized across the pool
 * (serially they were ~4 % of a SmolLM2 pp512 with the other thread idle);
 * NULL when out of memory or when an activation is not finite (the caller's
 * other paths then take the matmul: matmul_quant sends such rows to the f32
 * product) */
static kn_block_q16 *q16_rows(const float *x, int64_t ld, int64_t T, int64_t K, size_t extra) {
    size_t bytes = kn_quant_q16_nbytes(K);
    char *xq = malloc(bytes * (size_t)(T ? T : 1) + extra);
    if (!xq) return NULL;
    qx_job j = {true, KN_F32, x, ld, K, xq, bytes, 0};
    kn_cpu_par_rows(qx_rows, &j, T, T * K);
    if (atomic_load(&j.bad)) { free(xq); return NULL; }
    return (kn_block_q16 *)xq;
}

typedef struct {
    kn_qpack_gemv_fn gemv; kn_qpack_gemm4_fn gemm4; const char *P; int64_t g_first, K, N, T;
    const kn_block_q16 *xq; float *C; int64_t ldc;
    const kn_sgemm_post *post;
} qpk_job;
/* groups [r0, r1) of the matmul's rows (16 each): every activation row
 * against one group at a time while the group is in cache */
static void qpk_rows(void *p, int64_t r0, int64_t r1) {
    const qpk_job *j = p;
    for (int64_t g = r0; g < r1; g++) {
        int64_t n0 = g * KN_QPACK_ROWS, n1 = n0 + KN_QPACK_ROWS < j->N ? n0 + KN_QPACK_ROWS : j->N;
        packed_group_rows(j->gemv, j->gemm4, j->P, j->g_first + g, j->K, j->xq, j->K / KN_QK, 0, j->T, j->C + n0, j->ldc,
                          n1 - n0);
        if (j->post) j->post->fn(j->post->ctx, j->C, j->ldc, 0, j->T, n0, n1);
    }
}
/* the packed copy holding W's N rows (made on first use), *row0 its first
 * row there; NULL where W has none */
static const cpu_qpack *packed_view(const kn_tview *b, int64_t N, int64_t K, int64_t *row0) {
    size_t row_bytes = kn_dtype_nbytes(b->dtype, b->st[1]);
    if (b->st[1] != K || !b->buf) return NULL;
    size_t off = (size_t)((const char *)b->data - (const char *)b->buf->data);
    *row0 = (int64_t)(off / row_bytes);
    if (off % row_bytes || *row0 % KN_QPACK_ROWS) return NULL;     /* rows must start a group */
    const cpu_qpack *q = qpack_of(b, K, row_bytes);
    return q && *row0 + N <= q->rows ? q : NULL;
}

/* prefill through the packed copy: blocks of its groups dequantized into
 * W^T panels (the same floats as the file's rows give), each multiplied by
 * the SGEMM (qblk_cols above); the file's rows are not read again */
static bool matmul_qpacked_sgemm(const kn_tview *d, const kn_tview *a, const kn_tview *b, int64_t T, int64_t N,
                                 int64_t K, const kn_sgemm_post *post) {
    int64_t row0;
    const cpu_qpack *q = packed_view(b, N, K, &row0);
    if (!q) return false;
    qblk_job j = {a->data, a->st[0], d->data, d->st[0], T, N, K, qblk_width(N), post, kn_qpack_dequant(b->dtype), q->data,
                  row0 / KN_QPACK_ROWS, KN_F32, NULL, 0, 0};
    return qblk_run(&j);
}

/* y = x W^T through the packed copy of W; false where there is none */
static bool matmul_qpacked(const kn_tview *d, const kn_tview *a, const kn_tview *b, int64_t T, int64_t N, int64_t K,
                           const kn_sgemm_post *post) {
    int64_t row0;
    const cpu_qpack *q = packed_view(b, N, K, &row0);
    if (!q) return false;
    kn_block_q16 *xq = q16_rows(a->data, a->st[0], T, K, 0);
    if (!xq) return false;
    qpk_job j = {kn_qpack_gemv_simd(b->dtype), kn_qpack_gemm4_simd(b->dtype), q->data, row0 / KN_QPACK_ROWS, K, N, T, xq,
                 d->data, d->st[0], post};
    int64_t groups = (N + KN_QPACK_ROWS - 1) / KN_QPACK_ROWS;
    kn_cpu_par_rows(qpk_rows, &j, groups, N * K * (T ? T : 1));
    free(xq);
    return true;
}

/* MUL_MAT_ID's experts in one pool job (cpu_moe.c): the R gathered rows of
 * x [R, C] (expert ex's rows are [start[ex], start[ex + 1])) against their
 * experts' packed rows, yg [R, N]. One job over (expert, group) pairs
 * instead of one per expert: decode meets k experts a layer, each a few
 * small matrices, and a job each costs a dispatch and a join. False where
 * W [E, N, C] has no packed copy, or an expert has prefill-many rows. */
typedef struct {
    kn_qpack_gemv_fn gemv; kn_qpack_gemm4_fn gemm4; const char *P; int64_t K, N, gpe;
    const int64_t *start, *act; const kn_block_q16 *xq; int64_t xb; float *y;
} qexp_job;
static void qexp_tasks(void *p, int64_t t0, int64_t t1) {
    const qexp_job *j = p;
    for (int64_t t = t0; t < t1; t++) {
        int64_t ex = j->act[t / j->gpe], g = t % j->gpe;
        packed_group_rows(j->gemv, j->gemm4, j->P, ex * j->gpe + g, j->K, j->xq, j->xb, j->start[ex], j->start[ex + 1],
                          j->y + g * KN_QPACK_ROWS, j->N, KN_QPACK_ROWS);
    }
}
bool kn_cpu_qpacked_experts(const kn_tview *w, const int64_t *start, const float *xg, float *yg) {
    int64_t E = w->ne[0], N = w->ne[1], C = w->ne[2], R = start[E];
    if (N % KN_QPACK_ROWS || w->st[2] != 1 || w->st[1] != C || w->st[0] != N * C || !w->buf || w->data != w->buf->data)
        return false;
    kn_qact mode = kn_quant_act_mode();
    if (mode != KN_QACT_AUTO && mode != KN_QACT_Q16) return false;
    for (int64_t ex = 0; ex < E; ex++)      /* prefill without the four-row kernel: the per-expert SGEMM */
        if (start[ex + 1] - start[ex] >= qmm_gemm_min_rows(w->dtype, mode)) return false;
    kn_tview all = {w->data, w->dtype, 2, {C, E * N}, {1, C}, w->buf};   /* every expert's rows, W^T */
    int64_t row0;
    const cpu_qpack *q = packed_view(&all, E * N, C, &row0);
    if (!q) return false;
    int64_t nb = C / KN_QK, gpe = N / KN_QPACK_ROWS, n_act = 0;
    kn_block_q16 *xq = q16_rows(xg, C, R, C, sizeof(int64_t) * (size_t)E);   /* NULL: the per-expert path */
    if (!xq) return false;
    int64_t *act = (int64_t *)((char *)xq + kn_quant_q16_nbytes(C) * (size_t)(R ? R : 1));
    for (int64_t ex = 0; ex < E; ex++) if (start[ex + 1] > start[ex]) act[n_act++] = ex;
    qexp_job j = {kn_qpack_gemv_simd(w->dtype), kn_qpack_gemm4_simd(w->dtype), q->data, C, N, gpe, start, act, xq, nb, yg};
    kn_cpu_par_rows(qexp_tasks, &j, n_act * gpe, R * N * C);
    free(xq);
    return true;
}

static bool matmul_quant(const kn_exec *e, const kn_sgemm_post *post) {
    const kn_tview *d = &e->dst, *a = &e->src[0], *b = &e->src[1];
    if (d->ndim != 2 || a->ndim != 2 || b->ndim != 2 || !is_f32(a) || !is_f32(d)) return false;
    int64_t T = d->ne[0], N = d->ne[1], K = a->ne[1];
    if (a->st[1] != 1 || b->st[0] != 1 || d->st[1] != 1 || K % kn_dtype_get(b->dtype)->block_size) return false;
    /* KN_QMM_ACT=f32 (or KN_QMM_EXACT=1) keeps activations in f32 at every
     * row count (slow decode; checks the pipeline against float references) */
    kn_qact mode = kn_quant_act_mode();
    bool sgemm = T >= qmm_gemm_min_rows(b->dtype, mode) || mode == KN_QACT_F32;
    if (sgemm && (matmul_qpacked_sgemm(d, a, b, T, N, K, post) || matmul_dequant_sgemm(d, a, b, post))) return true;
    kn_vec_dot_fn dot = kn_quant_act_q16_dot(b->dtype);
    bool q16 = dot != NULL;
    /* a packed copy takes Q16 activations for every type it has (auto or q16
     * mode; q8 keeps the row dots) */
    if ((q16 || mode == KN_QACT_AUTO) && matmul_qpacked(d, a, b, T, N, K, post)) return true;
    /* no packed copy of these rows (not on a group boundary, not a
     * constant buffer): a prompt's rows take the SGEMM after all */
    if (!sgemm && T >= QMM_GEMM_MIN_ROWS && matmul_dequant_sgemm(d, a, b, post)) return true;
    kn_dtype at = kn_quant_vec_dot_type(b->dtype);
    if (!dot) dot = kn_quant_dot_fn(b->dtype);
    if (!dot) return false;
    size_t xq_bytes = q16 ? kn_quant_q16_nbytes(K) : kn_dtype_nbytes(at, K);
    char *xq = malloc(xq_bytes * (size_t)(T ? T : 1));
    if (!xq) return false;
    qx_job qj = {q16, at, a->data, a->st[0], K, xq, xq_bytes, 0};
    kn_cpu_par_rows(qx_rows, &qj, T, T * K);
    if (atomic_load(&qj.bad)) {   /* non-finite activations: the f32 product gives the NaN and infinities */
        free(xq);
        return matmul_dequant_sgemm(d, a, b, post);
    }
    qmm_job j = {dot, q16 ? kn_quant_q16_dot4(b->dtype) : NULL, b->data, kn_dtype_nbytes(b->dtype, b->st[1]), K, N, T, xq, xq_bytes, d->data, d->st[0], post};
    kn_cpu_par_rows(qmm_rows, &j, N, N * K * (T ? T : 1));
    free(xq);
    return true;
}

/* ==== both operands bf16 or f16 ==============================================
 * Each operand's whole storage span (offsets 0 .. sum (ne-1)*st) is widened
 * in its own layout, so a transposed weight stays a transposed view of the
 * f32 copy and the SGEMM reads it as before; C goes to a contiguous f32
 * block [..., M, N] and is rounded into dst. */
typedef struct { kn_dtype dt; const uint16_t *x; float *y; void *out16; int64_t n; } widen_job;
static void widen_chunks(void *p, int64_t r0, int64_t r1) {
    widen_job *j = p;
    int64_t a = r0 * KN_CPU_CHUNK, b = kn_cpu_chunk_end(r1, j->n);
    if (j->out16) {                             /* narrow: f32 y -> 16-bit out16 */
        if (j->dt == KN_BF16) kn_vec_f32_to_bf16((uint16_t *)j->out16 + a, j->y + a, b - a);
        else kn_vec_f32_to_f16((uint16_t *)j->out16 + a, j->y + a, b - a);
    } else if (j->dt == KN_BF16) kn_vec_bf16_to_f32(j->y + a, j->x + a, b - a);
    else kn_vec_f16_to_f32(j->y + a, j->x + a, b - a);
}
static int64_t span_of(const kn_tview *v) {
    int64_t s = 1;
    for (int d = 0; d < v->ndim; d++) {
        if (v->ne[d] == 0) return 0;
        if (v->st[d] < 0) return -1;
        s += (v->ne[d] - 1) * v->st[d];
    }
    return s;
}
static float *widen(const kn_tview *v, kn_tview *out) {
    int64_t n = span_of(v);
    if (n < 0) return NULL;
    float *y = malloc((size_t)(n ? n : 1) * sizeof *y);
    if (!y) return NULL;
    widen_job j = {v->dtype, v->data, y, NULL, n};
    kn_cpu_par_rows(widen_chunks, &j, kn_cpu_chunks(n), n);
    *out = *v; out->data = y; out->dtype = KN_F32;
    return y;
}
/* Both operands bf16 on a CPU with AMX: the products on its tiles
 * (gemm_bf16.c: the operands are packed as stored, no f32 copies) into c, f32
 * [batch, M, N] contiguous. false: no such CPU, or a layout it does not take
 * (a stride-0 matrix dim): the widening path runs. */
static bool matmul_bf16_native(const kn_exec *e, float *c) {
    kn_bgemm_ukr_fn ukr = kn_bgemm_kernel();
    const kn_tview *d = &e->dst;
    kn_tview a = e->src[0], b = e->src[1];
    if (!ukr || a.dtype != KN_BF16 || b.dtype != KN_BF16 || d->ndim < 2) return false;
    int nb = d->ndim - 2;
    int64_t M = d->ne[nb], N = d->ne[nb + 1], K = a.ne[a.ndim - 1];
    bool ta, tb;
    int64_t lda, ldb;
    if (a.st[a.ndim - 1] == 0 || a.st[a.ndim - 2] == 0 || b.st[b.ndim - 1] == 0 || b.st[b.ndim - 2] == 0) return false;
    if (!mat_layout(&a, &ta, &lda) || !mat_layout(&b, &tb, &ldb)) return false;
    kn_tview ab = a, bb = b;
    ab.ndim = a.ndim - 2; bb.ndim = b.ndim - 2;
    ab = kn_tview_broadcast(&ab, nb, d->ne);
    bb = kn_tview_broadcast(&bb, nb, d->ne);
    int64_t batch = 1;
    for (int i = 0; i < nb; i++) batch *= d->ne[i];
    const uint16_t *A = a.data, *B = b.data;
    /* a shared right operand and a row-major a (x [B,T,K] @ W^T): one product of batch * M rows */
    bool shared_b = batch > 1 && !ta && contig(&a);
    for (int i = 0; i < nb && shared_b; i++) if (bb.st[i] != 0 && d->ne[i] != 1) shared_b = false;
    if (shared_b) { kn_bgemm(false, tb, batch * M, N, K, A, lda, B, ldb, c, N, ukr); return true; }
    for (int64_t z = 0; z < batch; z++) {
        int64_t ao = 0, bo = 0, lin = z;
        for (int i = nb - 1; i >= 0; i--) {
            int64_t q = lin % d->ne[i]; lin /= d->ne[i];
            ao += q * ab.st[i]; bo += q * bb.st[i];
        }
        kn_bgemm(ta, tb, M, N, K, A + ao, lda, B + bo, ldb, c + z * M * N, N, ukr);
    }
    return true;
}

static bool matmul_half(const kn_exec *e) {
    const kn_tview *d = &e->dst;
    if (!contig(d)) return false;
    if (d->dtype == KN_BF16 && kn_bgemm_kernel()) {          /* f32 products, rounded into dst */
        int64_t n = kn_tview_numel(d);
        float *c = malloc((size_t)(n ? n : 1) * sizeof *c);
        if (c && matmul_bf16_native(e, c)) {
            widen_job j = {KN_BF16, NULL, c, d->data, n};
            kn_cpu_par_rows(widen_chunks, &j, kn_cpu_chunks(n), n);
            free(c);
            return true;
        }
        free(c);
    }
    kn_exec f = *e;
    float *a = widen(&e->src[0], &f.src[0]), *b = a ? widen(&e->src[1], &f.src[1]) : NULL;
    int64_t n = kn_tview_numel(d);
    float *c = b ? malloc((size_t)(n ? n : 1) * sizeof *c) : NULL;
    bool ok = c != NULL;
    if (ok) {
        f.dst.data = c; f.dst.dtype = KN_F32;
        ok = kn_cpu_matmul(&f);
    }
    if (ok) {
        widen_job j = {d->dtype, NULL, c, d->data, n};
        kn_cpu_par_rows(widen_chunks, &j, kn_cpu_chunks(n), n);
    }
    free(a); free(b); free(c);
    return ok;
}
static bool is_half(kn_dtype t) { return t == KN_BF16 || t == KN_F16; }

bool kn_cpu_matmul(const kn_exec *e) {
    kn_dtype ht = e->src[0].dtype;
    if (is_half(ht) && e->src[1].dtype == ht && e->dst.dtype == ht) return matmul_half(e);
    return kn_cpu_matmul_ep(e, NULL);
}

bool kn_cpu_matmul_ep(const kn_exec *e, const kn_sgemm_post *post) {
    if (kn_dtype_get(e->src[1].dtype)->is_quant || e->src[1].dtype == KN_F16 || e->src[1].dtype == KN_BF16)
        return matmul_quant(e, post);
    const kn_tview *d = &e->dst;
    if (!is_f32(d) || !is_f32(&e->src[0]) || !is_f32(&e->src[1])) return false;
    int nb = d->ndim - 2;
    kn_tview a = e->src[0], b = e->src[1];
    int64_t M = d->ne[nb], N = d->ne[nb + 1], K = a.ne[a.ndim - 1];
    if (d->st[nb + 1] != 1 && N > 1) return false;
    int64_t ldc = d->st[nb] > N ? d->st[nb] : N;
    bool ta, tb; int64_t lda, ldb;
    /* a view with stride 0 in a matrix dim (expanded) is not a plain matrix */
    if (a.st[a.ndim - 1] == 0 || a.st[a.ndim - 2] == 0 || b.st[b.ndim - 1] == 0 || b.st[b.ndim - 2] == 0) return false;
    if (!mat_layout(&a, &ta, &lda) || !mat_layout(&b, &tb, &ldb)) return false;
    kn_tview ab = a, bb = b, db = *d;
    ab.ndim = a.ndim - 2; bb.ndim = b.ndim - 2; db.ndim = nb;
    ab = kn_tview_broadcast(&ab, nb, d->ne);
    bb = kn_tview_broadcast(&bb, nb, d->ne);
    int64_t batch = 1;
    for (int i = 0; i < nb; i++) batch *= d->ne[i];
    const float *A = a.data, *B = b.data;
    float *C = d->data;
    /* a shared right operand (stride 0 over every batch dim: x [B,T,K] @ W^T)
     * and a, C contiguous: one GEMM of batch * M rows, not batch small ones */
    bool shared_b = batch > 1 && !ta && contig(&a) && contig(d);
    for (int i = 0; i < nb && shared_b; i++) if (bb.st[i] != 0 && d->ne[i] != 1) shared_b = false;
    if (shared_b) {
        kn_sgemm_ep(false, tb, batch * M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc, post);
        return true;
    }
    if (batch == 1) {
        kn_sgemm_ep(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, ldc, post);
        return true;
    }
    /* one uniform batch dim (after collapsing) goes to the batched entry point */
    if (nb == 1 || batch == 1) {
        int64_t sa = nb ? ab.st[0] : 0, sb = nb ? bb.st[0] : 0, sc = nb ? db.st[0] : 0;
        kn_sgemm_batched(batch, ta, tb, M, N, K, 1.0f, A, lda, sa, B, ldb, sb, 0.0f, C, ldc, sc);
        if (post) kn_cpu_post_whole(post, C, batch * M, N);   /* dst is contiguous when there is a post */
        return true;
    }
    for (int64_t z = 0; z < batch; z++) {
        int64_t ao = 0, bo = 0, co = 0, lin = z;
        for (int i = nb - 1; i >= 0; i--) {
            int64_t q = lin % d->ne[i]; lin /= d->ne[i];
            ao += q * ab.st[i]; bo += q * bb.st[i]; co += q * db.st[i];
        }
        kn_sgemm(ta, tb, M, N, K, 1.0f, A + ao, lda, B + bo, ldb, 0.0f, C + co, ldc);
    }
    if (post) kn_cpu_post_whole(post, C, batch * M, N);
    return true;
}
