/* gemm.c: packed, cache-blocked SGEMM driver, matrix-vector path, batching,
 * threading, and the scalar (generic) kernels. See gemm.h for the contract.
 *
 * Letters: M,N,K as in gemm.h. MR x NR is the micro-tile held in registers;
 * KC, MC, NC the cache blocks: a KC x NR micro-panel of B stays in L1 while
 * MR x KC micro-panels of A stream from an MC x KC block kept in L2; the
 * KC x NC block of B lives in L3 (GotoBLAS/BLIS loop order: jc, pc, ic, jr, ir).
 *
 * Threading: the M x N output is cut into a tm x tn grid (tm * tn = threads,
 * picked to minimize padded work plus packing); each thread runs the whole
 * blocked algorithm on its own rectangle with its own pack buffers, so threads
 * never wait on each other inside a GEMM. That duplicates packing of the
 * shared operand (A for an N split, B for an M split): cheap next to the
 * compute when each rectangle is a few hundred wide, and no barriers.
 *
 * Non-goals: sharing packed panels between threads (would pay on many-core
 * machines; this one has 2), NUMA, fp16 inputs (callers convert first).
 */
#include "kiln_base.h"                 // defines: kn_set_error, KN_ERR_INVALID
#include "core/env.h"
#include "backends/cpu/gemm.h"         // defines: kn_sgemm*, kernel typedefs
#include "backends/cpu/threadpool.h"   // defines: kn_pool_run, kn_pool_nthreads
#include "core/cpu.h"                  // defines: kn_cpu, KN_ISA_*
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== per-ISA parameters ===================================================== */
typedef struct {
    int mr, nr;                 /* micro-tile                                     */
    int kc, mc, nc;             /* cache blocks (mc % mr == 0, nc % nr == 0)      */
    kn_sgemm_ukr_fn  ukr;
    kn_sgemm_ukr_direct_fn ukr_d; /* the micro-kernel reading rows of A in place */
    kn_sgemv_dot_fn  dot;
    kn_sgemv_axpy_fn axpy;
    kn_sgemm_pack_t_fn pack_t;  /* rows of A (not transposed) / of B (transposed) -> panels */
} gemm_isa;

/* Scalar: a 4x8 tile keeps 32 accumulators that compilers map to SSE/NEON registers. */
static const gemm_isa k_generic = {4, 8, 256, 128, 2048,
                                   kn_sgemm_ukr_4x8_generic, kn_sgemm_ukr_4x8_direct_generic, kn_sgemv_dot_generic, kn_sgemv_axpy_generic,
                                   kn_sgemm_pack_t_generic};
#if !defined(KN_NO_X86) && (defined(__x86_64__) || defined(__i386__))
#define KN_HAVE_X86 1
/* AVX2 6x16: 12 ymm accumulators + 2 for the B row + 1 broadcast = 15 of 16 registers.
 * KC=256: the B micro-panel is 16 KiB (half of a 32 KiB L1d), an A micro-panel 6 KiB.
 * MC=192: the packed A block is 192 KiB, under half of a 512 KiB (Zen 3) L2.
 * NC=4080: the packed B block is ~4 MiB of L3. */
static const gemm_isa k_avx2 = {6, 16, 256, 192, 4080,
                                kn_sgemm_ukr_6x16_avx2, kn_sgemm_ukr_6x16_direct_avx2, kn_sgemv_dot_avx2, kn_sgemv_axpy_avx2,
                                kn_sgemm_pack_t_avx2};
#ifndef KN_NO_AVX512
/* AVX-512 14x32: 28 zmm accumulators + 2 for the B row + 1 broadcast = 31 of 32
 * registers; 28 FMAs per 2 loads + 14 broadcasts per k step, the best FMA:load
 * ratio that fits (6x64 would be 24 FMAs per 4 loads + 6 broadcasts and need a
 * 64-float B row). KC=256: the 32 KiB B micro-panel fits a 48 KiB L1d (Sapphire
 * Rapids; measured 2-3% faster there than KC=192, which suits 32 KiB L1d parts);
 * MC=168 -> 168 KiB of A in L2. */
static const gemm_isa k_avx512 = {14, 32, 256, 168, 4096,
                                  kn_sgemm_ukr_14x32_avx512, kn_sgemm_ukr_14x32_direct_avx512, kn_sgemv_dot_avx512, kn_sgemv_axpy_avx512,
                                  kn_sgemm_pack_t_avx2};
#endif
#endif

static atomic_int g_forced_isa = -1;   /* -1: follow kn_cpu()          */
static atomic_int g_max_threads;       /* 0: no cap                    */

static int best_isa(void) {
    int isa = (int)kn_cpu()->isa;
#ifndef KN_HAVE_X86
    isa = KN_ISA_SCALAR;
#elif defined(KN_NO_AVX512)
    if (isa > KN_ISA_AVX2) isa = KN_ISA_AVX2;
#endif
    return isa;
}

int kn_sgemm_force_isa(int isa) {
    int best = best_isa();
    if (isa < 0) { atomic_store(&g_forced_isa, -1); return best; }
    if (isa > best) isa = best;
    atomic_store(&g_forced_isa, isa);
    return isa;
}

static const gemm_isa *isa_table(int isa) {
#ifdef KN_HAVE_X86
#ifndef KN_NO_AVX512
    if (isa >= KN_ISA_AVX512) return &k_avx512;
#endif
    if (isa >= KN_ISA_AVX2) return &k_avx2;
#endif
    (void)isa;
    return &k_generic;
}

/* Tuning knobs, read once, for benchmarking: env KN_GEMM_BLOCK="KC,MC,NC"
 * overrides the cache blocks of every path (MC, NC rounded up to the tile);
 * KN_GEMM_CHUNKS=n caps the chunks per thread of the threaded split (1..4). */
static gemm_isa g_tuned[3];
static int g_max_chunks = 2;   /* 2: measured within noise of 1 on an idle 16-core host, 4 cost ~5% */
static pthread_once_t g_tune_once = PTHREAD_ONCE_INIT;
static void tune_init(void) {
    for (int i = 0; i < 3; i++) g_tuned[i] = *isa_table(i);
    int c = kn_env_get()->gemm_chunks;
    if (c >= 1 && c <= 4) g_max_chunks = c;
    const char *e = kn_env_get()->gemm_block;
    long kc, mc, nc;
    if (!e || sscanf(e, "%ld,%ld,%ld", &kc, &mc, &nc) != 3 || kc < 1 || mc < 1 || nc < 1 ||
        kc > 4096 || mc > 4096 || nc > 65536) return;
    for (int i = 0; i < 3; i++) {
        gemm_isa *t = &g_tuned[i];
        t->kc = (int)kc;
        t->mc = (int)((mc + t->mr - 1) / t->mr * t->mr);
        t->nc = (int)((nc + t->nr - 1) / t->nr * t->nr);
    }
}

static const gemm_isa *cur_isa(void) {
    int isa = atomic_load_explicit(&g_forced_isa, memory_order_relaxed);
    if (isa < 0) isa = best_isa();
    pthread_once(&g_tune_once, tune_init);
    return &g_tuned[isa < 0 ? 0 : isa > 2 ? 2 : isa];
}

void kn_sgemm_set_max_threads(int n) { atomic_store(&g_max_threads, n > 0 ? n : 0); }

static int gemm_threads(void) {
    int n = kn_pool_nthreads();
    int cap = atomic_load_explicit(&g_max_threads, memory_order_relaxed);
    if (cap > 0 && cap < n) n = cap;
    return n < 1 ? 1 : n;
}

/* ==== scalar kernels (the _generic twins) ==================================== */
void kn_sgemm_ukr_4x8_generic(int64_t kc, const float *Ap, const float *Bp,
                              float *C, int64_t ldc, float alpha, float beta) {
    float acc[4][8] = {{0}};
    for (int64_t k = 0; k < kc; k++, Ap += 4, Bp += 8)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 8; j++) acc[i][j] += Ap[i] * Bp[j];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++)
            C[i * ldc + j] = beta == 0.0f ? alpha * acc[i][j] : alpha * acc[i][j] + beta * C[i * ldc + j];
}

void kn_sgemm_ukr_4x8_direct_generic(int64_t kc, const float *A, int64_t lda, const float *Bp,
                                     float *C, int64_t ldc, float alpha, float beta) {
    float acc[4][8] = {{0}};
    for (int64_t k = 0; k < kc; k++, Bp += 8)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 8; j++) acc[i][j] += A[i * lda + k] * Bp[j];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++)
            C[i * ldc + j] = beta == 0.0f ? alpha * acc[i][j] : alpha * acc[i][j] + beta * C[i * ldc + j];
}

void kn_sgemv_dot_generic(int64_t rows, int64_t K, const float *X, int64_t ld,
                          const float *x, float *y) {
    for (int64_t i = 0; i < rows; i++) {
        const float *r = X + i * ld;
        float s[4] = {0, 0, 0, 0};      /* 4 partial sums: shorter dependency chains */
        int64_t k = 0;
        for (; k + 4 <= K; k += 4)
            for (int u = 0; u < 4; u++) s[u] += r[k + u] * x[k + u];
        for (; k < K; k++) s[0] += r[k] * x[k];
        y[i] = (s[0] + s[1]) + (s[2] + s[3]);
    }
}

void kn_sgemv_axpy_generic(int64_t K, int64_t cols, const float *X, int64_t ld,
                           const float *x, float *y) {
    for (int64_t j = 0; j < cols; j++) y[j] = 0.0f;
    for (int64_t k = 0; k < K; k++) {
        const float *r = X + k * ld;
        const float xk = x[k];
        for (int64_t j = 0; j < cols; j++) y[j] += xk * r[j];
    }
}

void kn_sgemm_pack_t_generic(const float *src, int64_t ld, int rows, int64_t kc,
                             float *dst, int64_t dstride) {
    for (int i = 0; i < rows; i++) {
        const float *r = src + i * ld;
        for (int64_t k = 0; k < kc; k++) dst[k * dstride + i] = r[k];
    }
}

/* ==== packing ================================================================= */
/* Element (i, k) of op(A) and (k, j) of op(B). */
#define OPA(i, k) (ta ? A[(k) * lda + (i)] : A[(i) * lda + (k)])
#define OPB(k, j) (tb ? B[(j) * ldb + (k)] : B[(k) * ldb + (j)])

/* Pack op(A)[i0 : i0+mc, k0 : k0+kc] as ceil(mc/mr) panels of mr x kc; panel p
 * stores column k as mr consecutive floats; rows past mc are zero. */
static void pack_a(const gemm_isa *I, bool ta, const float *A, int64_t lda, int64_t i0, int64_t mc,
                   int64_t k0, int64_t kc, float *restrict dst) {
    const int mr = I->mr;
    if (ta) {
        /* rows of A are columns of op(A): walk each stored row once, left to
         * right, dealing its mc floats out to the panels. (Panel by panel, a
         * panel touches kc lines lda apart; with lda a multiple of 512 B they
         * fall into a few L1 sets and every line came from L2 mr/16 times.) */
        const int64_t full = mc / mr * mr, pstride = (int64_t)mr * kc;
        for (int64_t k = 0; k < kc; k++) {
            const float *src = A + (k0 + k) * lda + i0;
            float *d = dst + k * mr;
            int64_t ip = 0;
            if (mr == 6)                   /* fixed sizes: the copies become a few moves */
                for (; ip < full; ip += 6, d += pstride) memcpy(d, src + ip, 6 * sizeof(float));
            else if (mr == 14)
                for (; ip < full; ip += 14, d += pstride) memcpy(d, src + ip, 14 * sizeof(float));
            else
                for (; ip < full; ip += mr, d += pstride) memcpy(d, src + ip, (size_t)mr * sizeof(float));
            if (ip < mc) {
                int64_t i = 0;
                for (; ip + i < mc; i++) d[i] = src[ip + i];
                for (; i < mr; i++) d[i] = 0.0f;
            }
        }
        return;
    }
    for (int64_t ip = 0; ip < mc; ip += mr) {
        const int64_t m = mc - ip < mr ? mc - ip : mr;
        if (ta) {                                         /* rows of A are columns of op(A): contiguous */
            for (int64_t k = 0; k < kc; k++) {
                const float *src = A + (k0 + k) * lda + i0 + ip;
                float *d = dst + k * mr;
                int64_t i = 0;
                for (; i < m; i++) d[i] = src[i];
                for (; i < mr; i++) d[i] = 0.0f;
            }
        } else {
            I->pack_t(A + (i0 + ip) * lda + k0, lda, (int)m, kc, dst, mr);
            for (int64_t i = m; i < mr; i++)
                for (int64_t k = 0; k < kc; k++) dst[k * mr + i] = 0.0f;
        }
        dst += (int64_t)mr * kc;
    }
}

/* Pack op(B)[k0 : k0+kc, j0 : j0+nc] as ceil(nc/nr) panels of kc x nr; panel p
 * stores row k as nr consecutive floats; columns past nc are zero. */
static void pack_b(const gemm_isa *I, bool tb, const float *B, int64_t ldb, int64_t k0, int64_t kc,
                   int64_t j0, int64_t nc, float *restrict dst) {
    const int nr = I->nr;
    for (int64_t jp = 0; jp < nc; jp += nr) {
        const int64_t n = nc - jp < nr ? nc - jp : nr;
        if (!tb) {
            for (int64_t k = 0; k < kc; k++) {
                const float *src = B + (k0 + k) * ldb + j0 + jp;
                float *d = dst + k * nr;
                if (n == nr && nr == 16) memcpy(d, src, 16 * sizeof(float));  /* inlined fixed-size copies */
                else if (n == nr && nr == 32) memcpy(d, src, 32 * sizeof(float));
                else if (n == nr) memcpy(d, src, sizeof(float) * (size_t)nr);
                else {
                    int64_t j = 0;
                    for (; j < n; j++) d[j] = src[j];
                    for (; j < nr; j++) d[j] = 0.0f;
                }
            }
        } else {
            I->pack_t(B + (j0 + jp) * ldb + k0, ldb, (int)n, kc, dst, nr);
            for (int64_t j = n; j < nr; j++)
                for (int64_t k = 0; k < kc; k++) dst[k * nr + j] = 0.0f;
        }
        dst += (int64_t)nr * kc;
    }
}

/* ==== per-thread pack buffers ================================================ */
/* Grown on demand, kept for the thread's life (pool threads are persistent);
 * freed by a TLS destructor when a thread exits. */
typedef struct { float *a, *b; size_t na, nb; } pack_bufs;
static pthread_key_t g_buf_key;
static pthread_once_t g_buf_once = PTHREAD_ONCE_INIT;
static void free_bufs(void *p) {
    pack_bufs *pb = p;
    free(pb->a); free(pb->b); free(pb);
}
static void buf_key_init(void) { pthread_key_create(&g_buf_key, free_bufs); }

static float *grow(float **p, size_t *have, size_t need) {
    if (*have >= need) return *p;
    size_t bytes = (need * sizeof(float) + 63) & ~(size_t)63;
    float *q = aligned_alloc(64, bytes);
    if (!q) return NULL;
    free(*p);
    *p = q; *have = need;
    return q;
}

static pack_bufs *thread_bufs(size_t na, size_t nb) {
    pthread_once(&g_buf_once, buf_key_init);
    pack_bufs *pb = pthread_getspecific(g_buf_key);
    if (!pb) {
        pb = calloc(1, sizeof *pb);
        if (!pb || pthread_setspecific(g_buf_key, pb) != 0) { free(pb); return NULL; }
    }
    if (!grow(&pb->a, &pb->na, na) || !grow(&pb->b, &pb->nb, nb)) return NULL;
    return pb;
}

/* ==== blocked driver ========================================================= */
typedef struct {
    const gemm_isa *isa;
    bool ta, tb;
    int64_t M, N, K;
    float alpha, beta;
    const float *A; int64_t lda;
    const float *B; int64_t ldb;
    float *C; int64_t ldc;
    const kn_sgemm_post *post;  /* NULL, or run on each finished piece of C (kn_sgemm_ep) */
} gemm_args;

/* A rectangle of at most this many columns of C reads the rows of A in
 * place (ukr_d) instead of packing them: each A panel then serves at most 16
 * B panels, and its transposing copy cost about a sixth of the micro-kernel's
 * time on the training shapes (M = 512, N = 128..512, K = 128..512). */
#define DIRECT_MAX_COLS 512

/* Plain loops for when pack buffers cannot be allocated: slow, correct. */
static void gemm_unpacked(const gemm_args *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const bool ta = g->ta, tb = g->tb;
    const float *A = g->A, *B = g->B;
    const int64_t lda = g->lda, ldb = g->ldb;
    for (int64_t i = m0; i < m1; i++)
        for (int64_t j = n0; j < n1; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < g->K; k++) s += OPA(i, k) * OPB(k, j);
            float *c = g->C + i * g->ldc + j;
            *c = g->beta == 0.0f ? g->alpha * s : g->alpha * s + g->beta * *c;
        }
    if (g->post) g->post->fn(g->post->ctx, g->C, g->ldc, m0, m1, n0, n1);
}

/* An edge tile's m x n corner (alpha applied) into C: separate loops per beta
 * so that each vectorises (these copies are a fifth of a 64 x 64 x 32 product) */
static void edge_store(const float *tile, int nr, float *c, int64_t ldc, int64_t m, int64_t n, float beta) {
    if (beta == 0.0f)
        for (int64_t i = 0; i < m; i++) memcpy(c + i * ldc, tile + i * nr, sizeof(float) * (size_t)n);
    else if (beta == 1.0f)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) c[i * ldc + j] += tile[i * nr + j];
    else
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) c[i * ldc + j] = tile[i * nr + j] + beta * c[i * ldc + j];
}

/* The whole blocked algorithm on the rectangle [m0,m1) x [n0,n1) of C. */
static void gemm_block(const gemm_args *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    if (m0 >= m1 || n0 >= n1) return;
    const gemm_isa *I = g->isa;
    const int mr = I->mr, nr = I->nr;
    const int64_t K = g->K, ldc = g->ldc;
    const int64_t kcmax = K < I->kc ? K : I->kc;
    int64_t mcmax = m1 - m0 < I->mc ? m1 - m0 : I->mc;
    int64_t ncmax = n1 - n0 < I->nc ? n1 - n0 : I->nc;
    mcmax = (mcmax + mr - 1) / mr * mr;
    ncmax = (ncmax + nr - 1) / nr * nr;
    pack_bufs *pb = thread_bufs((size_t)(mcmax * kcmax), (size_t)(ncmax * kcmax));
    if (!pb) { gemm_unpacked(g, m0, m1, n0, n1); return; }
    float *Ap = pb->a, *Bp = pb->b;
    float tile[16 * 64] __attribute__((aligned(64)));   /* edge tiles: mr*nr <= 1024 */

    /* rows of A in place; not A stored transposed, whose k steps lda apart
     * fall into a few L1 sets (lda a multiple of 512 B: the panel is evicted
     * before the next B panel reads it; measured 10-17 % slower than packing
     * on the weight gradients) */
    const bool direct = I->ukr_d && !g->ta && n1 - n0 <= DIRECT_MAX_COLS;
    for (int64_t jc = n0; jc < n1; jc += I->nc) {
        const int64_t nc = n1 - jc < I->nc ? n1 - jc : I->nc;
        for (int64_t pc = 0; pc < K; pc += I->kc) {
            const int64_t kc = K - pc < I->kc ? K - pc : I->kc;
            const float beta = pc == 0 ? g->beta : 1.0f;
            pack_b(I, g->tb, g->B, g->ldb, pc, kc, jc, nc, Bp);
            for (int64_t ic = m0; ic < m1; ic += I->mc) {
                const int64_t mc = m1 - ic < I->mc ? m1 - ic : I->mc, full = mc / mr * mr;
                /* direct: only a last tile of fewer than mr rows is packed
                 * (the kernel reads mr rows), at Ap's start */
                if (!direct) pack_a(I, g->ta, g->A, g->lda, ic, mc, pc, kc, Ap);
                else if (full < mc) pack_a(I, g->ta, g->A, g->lda, ic + full, mc - full, pc, kc, Ap);
                for (int64_t jr = 0; jr < nc; jr += nr) {
                    const int64_t n = nc - jr < nr ? nc - jr : nr;
                    const float *bp = Bp + jr * kc;
                    for (int64_t ir = 0; ir < mc; ir += mr) {
                        const int64_t m = mc - ir < mr ? mc - ir : mr;
                        const float *ap = direct ? Ap : Ap + ir * kc;
                        const float *ad = g->A + (ic + ir) * g->lda + pc;   /* direct: row ic + ir, column pc */
                        float *c = g->C + (ic + ir) * ldc + jc + jr;
                        if (direct && m == mr) {
                            if (n == nr) I->ukr_d(kc, ad, g->lda, bp, c, ldc, g->alpha, beta);
                            else {
                                I->ukr_d(kc, ad, g->lda, bp, tile, nr, g->alpha, 0.0f);
                                edge_store(tile, nr, c, ldc, m, n, beta);
                            }
                        } else if (m == mr && n == nr) {
                            I->ukr(kc, ap, bp, c, ldc, g->alpha, beta);
                        } else {
                            I->ukr(kc, ap, bp, tile, nr, g->alpha, 0.0f);
                            edge_store(tile, nr, c, ldc, m, n, beta);
                        }
                    }
                }
                /* the last K block of this mc x nc piece: it is final and still in cache */
                if (g->post && pc + kc >= K) g->post->fn(g->post->ctx, g->C, ldc, ic, ic + mc, jc, jc + nc);
            }
        }
    }
}

/* Chunk grid: tm x tn rectangles over C, claimed by the threads from a shared
 * counter, so a thread slowed down by other load on its core takes fewer. */
typedef struct {
    const gemm_args *g;
    int tm, tn;
    int64_t mstep, nstep;
    atomic_int next;            /* next unclaimed chunk */
} grid_job;

static void grid_worker(void *ctx, int ith, int nth) {
    (void)ith; (void)nth;       /* chunks are claimed, not assigned */
    grid_job *j = ctx;
    const int nchunks = j->tm * j->tn;
    for (int c = atomic_fetch_add(&j->next, 1); c < nchunks; c = atomic_fetch_add(&j->next, 1)) {
        const int64_t bi = c / j->tn, bj = c % j->tn;
        int64_t m0 = bi * j->mstep, m1 = m0 + j->mstep, n0 = bj * j->nstep, n1 = n0 + j->nstep;
        if (m1 > j->g->M) m1 = j->g->M;
        if (n1 > j->g->N) n1 = j->g->N;
        gemm_block(j->g, m0, m1, n0, n1);
    }
}

static int64_t ceil_to(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* The cost of packing one element of A or B, in multiply-adds of the
 * micro-kernel (which does 32 a cycle with AVX-512). Measured, not derived:
 * the transposing packs run at ~2 floats a cycle, and 16 picks the split of
 * the training shapes that runs fastest (M = 512, N = 128, K = 128..512 on 2
 * threads: rows apart instead of columns apart, 200 -> 250 GFLOP/s; 4 gave
 * the columns split, which packs the larger A twice). */
#define PACK_COST 16.0

/* Pick tm x tn = nt minimizing per-chunk padded compute plus packing volume. */
static void pick_grid(const gemm_isa *I, int64_t M, int64_t N, int64_t K, int nt,
                      int *tm_out, int *tn_out, int64_t *ms, int64_t *ns) {
    double best = -1;
    for (int tm = 1; tm <= nt; tm++) {
        if (nt % tm) continue;
        const int tn = nt / tm;
        const int64_t mstep = ceil_to((M + tm - 1) / tm, I->mr);
        const int64_t nstep = ceil_to((N + tn - 1) / tn, I->nr);
        if ((tm > 1 && mstep * (tm - 1) >= M) || (tn > 1 && nstep * (tn - 1) >= N)) continue;
        /* compute ~ mstep*nstep*K; packing ~ K*(mstep*ceil(nstep/NC) + nstep), PACK_COST per element */
        const double nblk = (double)((nstep + I->nc - 1) / I->nc);
        const double cost = (double)mstep * nstep * K + PACK_COST * K * (mstep * nblk + nstep);
        if (best < 0 || cost < best) { best = cost; *tm_out = tm; *tn_out = tn; *ms = mstep; *ns = nstep; }
    }
}

/* Split for nt threads: up to g_max_chunks chunks per thread (load balance) as long as the
 * extra packing that more chunks cost stays under ~4% of the multiply-adds
 * (each extra column of chunks packs op(A) again, each extra row op(B)). With
 * more chunks than threads, a caller whose worker is not scheduled (busy
 * machine) does the work itself instead of waiting for a time slice. */
static void plan_grid(const gemm_isa *I, int64_t M, int64_t N, int64_t K, int nt, grid_job *j) {
    j->tm = 1; j->tn = 1; j->mstep = M; j->nstep = N;
    pick_grid(I, M, N, K, nt, &j->tm, &j->tn, &j->mstep, &j->nstep);
    for (int over = g_max_chunks; over >= 2; over--) {
        int tm = 0, tn = 0;
        int64_t ms = 0, ns = 0;
        pick_grid(I, M, N, K, nt * over, &tm, &tn, &ms, &ns);
        if (tm == 0) continue;
        /* extra copies K*(M*(tn-1) + N*(tm-1)), PACK_COST each, against M*N*K multiply-adds */
        const double extra = PACK_COST * ((double)(tn - 1) / N + (double)(tm - 1) / M);
        if (extra <= 0.04) { j->tm = tm; j->tn = tn; j->mstep = ms; j->nstep = ns; return; }
    }
}

/* ==== matrix-vector path ===================================================== */
/* y = X-form(...) written to C through alpha/beta with stride `incy`. */
typedef struct {
    const gemm_isa *isa;
    bool dot;                    /* dot form: rows of X; else axpy form: columns of X */
    int64_t len, K;              /* outputs, reduction length                        */
    const float *X; int64_t ld;  /* matrix                                            */
    const float *x;              /* contiguous vector [K]                             */
    float *y; int64_t incy;      /* output, stride incy                               */
    float alpha, beta;
    int64_t grain;               /* outputs per piece, multiple of 16                 */
    int64_t pieces;              /* ceil(len / grain)                                 */
    atomic_llong next;           /* next unclaimed piece                              */
    const kn_sgemm_post *post;   /* NULL, or run on each finished chunk of outputs    */
    bool col;                    /* the outputs are C's column 0 (N == 1), else row 0 (M == 1) */
} gemv_job;

enum { GEMV_CHUNK = 1024 };      /* outputs per inner call: the axpy form keeps them in L1 */

/* Outputs [o0, o1) of a matrix-vector job, GEMV_CHUNK at a time. */
static void gemv_piece(const gemv_job *j, int64_t o0, int64_t o1) {
    float buf[GEMV_CHUNK] __attribute__((aligned(64)));
    /* y = X x straight into a contiguous y (no scaling pass: decode's tiny
     * products are dominated by per-output work) */
    const bool direct = j->alpha == 1.0f && j->beta == 0.0f && j->incy == 1 &&
                        (j->y + j->len <= j->x || j->x + j->K <= j->y);   /* y may not be the vector itself */
    for (int64_t c0 = o0; c0 < o1; c0 += GEMV_CHUNK) {
        const int64_t n = o1 - c0 < GEMV_CHUNK ? o1 - c0 : GEMV_CHUNK;
        float *y = j->y + c0 * j->incy, *out = direct ? y : buf;
        if (j->dot) j->isa->dot(n, j->K, j->X + c0 * j->ld, j->ld, j->x, out);
        else        j->isa->axpy(j->K, n, j->X + c0, j->ld, j->x, out);
        for (int64_t i = 0; !direct && i < n; i++) {
            const float v = j->alpha * buf[i];
            y[i * j->incy] = j->beta == 0.0f ? v : v + j->beta * y[i * j->incy];
        }
        if (j->post && j->col) j->post->fn(j->post->ctx, j->y, j->incy, c0, c0 + n, 0, 1);
        else if (j->post) j->post->fn(j->post->ctx, j->y, 0, 0, 1, c0, c0 + n);
    }
}

/* Pieces are claimed from a counter, like GEMM chunks: a thread slowed by
 * other load on its core takes fewer. */
static void gemv_worker(void *ctx, int ith, int nth) {
    (void)ith; (void)nth;
    gemv_job *j = ctx;
    for (int64_t p = atomic_fetch_add(&j->next, 1); p < j->pieces; p = atomic_fetch_add(&j->next, 1)) {
        const int64_t o0 = p * j->grain;
        gemv_piece(j, o0, o0 + j->grain < j->len ? o0 + j->grain : j->len);
    }
}

static void gemv(const gemm_isa *I, bool dot, int64_t len, int64_t K, const float *X, int64_t ld,
                 const float *x, int64_t incx, float alpha, float beta, float *y, int64_t incy, int nt,
                 const kn_sgemm_post *post, bool col) {
    float *xc = NULL;
    if (incx != 1) {
        xc = malloc(sizeof(float) * (size_t)K);
        if (!xc) {  /* degrade: scalar loop straight from the strided vector */
            for (int64_t i = 0; i < len; i++) {
                float s = 0.0f;
                for (int64_t k = 0; k < K; k++) s += (dot ? X[i * ld + k] : X[k * ld + i]) * x[k * incx];
                y[i * incy] = beta == 0.0f ? alpha * s : alpha * s + beta * y[i * incy];
            }
            if (post && col) post->fn(post->ctx, y, incy, 0, len, 0, 1);
            else if (post) post->fn(post->ctx, y, 0, 0, 1, 0, len);
            return;
        }
        for (int64_t k = 0; k < K; k++) xc[k] = x[k * incx];
        x = xc;
    }
    /* pieces of >= ~32K multiply-adds (else threads cost more than they give),
     * up to 4 per thread for load balance */
    int64_t pieces = (len * K) / 32768;
    if (pieces > 4 * (int64_t)nt) pieces = 4 * (int64_t)nt;
    if (pieces < 1) pieces = 1;
    gemv_job j = {I, dot, len, K, X, ld, x, y, incy, alpha, beta, 0, 0, 0, post, col};
    j.grain = ceil_to((len + pieces - 1) / pieces, 16);
    j.pieces = (len + j.grain - 1) / j.grain;
    atomic_init(&j.next, 0);
    kn_pool_run(gemv_worker, &j, j.pieces < nt ? (int)j.pieces : nt);
    free(xc);
}

/* ==== entry points =========================================================== */
static void scale_c(int64_t M, int64_t N, float beta, float *C, int64_t ldc) {
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
}

static void sgemm_nt(int nt, bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                     const float *A, int64_t lda, const float *B, int64_t ldb,
                     float beta, float *C, int64_t ldc, const kn_sgemm_post *post) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0 || alpha == 0.0f) {
        scale_c(M, N, beta, C, ldc);
        if (post) post->fn(post->ctx, C, ldc, 0, M, 0, N);
        return;
    }
    const gemm_isa *I = cur_isa();
    if (N == 1) {         /* C[:,0] = op(A) @ x,  x[k] = op(B)(k,0) */
        const int64_t incx = transB ? 1 : ldb;
        if (!transA) gemv(I, true, M, K, A, lda, B, incx, alpha, beta, C, ldc, nt, post, true);
        else         gemv(I, false, M, K, A, lda, B, incx, alpha, beta, C, ldc, nt, post, true);
        return;
    }
    if (M == 1) {         /* C[0,:] = x @ op(B),  x[k] = op(A)(0,k) */
        const int64_t incx = transA ? lda : 1;
        if (transB) gemv(I, true, N, K, B, ldb, A, incx, alpha, beta, C, 1, nt, post, false);
        else        gemv(I, false, N, K, B, ldb, A, incx, alpha, beta, C, 1, nt, post, false);
        return;
    }
    /* 2-3 rows (or columns): one streaming matrix-vector pass each beats packing
     * the big operand (measured 2x at M=2, 1.2-1.4x at M=3 for 4096x4096 weights) */
    if (M <= 3 && N > 3) {
        for (int64_t m = 0; m < M; m++)
            sgemm_nt(nt, transA, transB, 1, N, K, alpha, A + m * (transA ? 1 : lda), lda, B, ldb,
                     beta, C + m * ldc, ldc, NULL);
        if (post) post->fn(post->ctx, C, ldc, 0, M, 0, N);
        return;
    }
    if (N <= 3 && M > 3) {
        for (int64_t n = 0; n < N; n++)
            sgemm_nt(nt, transA, transB, M, 1, K, alpha, A, lda, B + n * (transB ? ldb : 1), ldb,
                     beta, C + n, ldc, NULL);
        if (post) post->fn(post->ctx, C, ldc, 0, M, 0, N);
        return;
    }
    gemm_args g = {I, transA, transB, M, N, K, alpha, beta, A, lda, B, ldb, C, ldc, post};
    /* below ~2 MFLOP per thread, spreading out costs more than it saves */
    const double flops = 2.0 * M * N * K;
    int64_t maxnt = (int64_t)(flops / 2e6);
    if (maxnt < nt) nt = maxnt < 1 ? 1 : (int)maxnt;
    if (nt <= 1) { gemm_block(&g, 0, M, 0, N); return; }
    grid_job j;
    j.g = &g;
    atomic_init(&j.next, 0);
    plan_grid(I, M, N, K, nt, &j);
    const int chunks = j.tm * j.tn;
    kn_pool_run(grid_worker, &j, chunks < nt ? chunks : nt);
}

int kn_sgemm_tile_rows(void) { return cur_isa()->mr; }

/* Argument check shared by both entry points: records KN_ERR_INVALID and
 * returns false (C untouched) on negative sizes, short strides or NULL data. */
static bool args_ok(const char *fn, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                    float alpha, const float *A, int64_t lda, const float *B, int64_t ldb,
                    const float *C, int64_t ldc) {
    if (M < 0 || N < 0 || K < 0) {
        kn_set_error(KN_ERR_INVALID, "%s: negative size M=%lld N=%lld K=%lld; pass sizes >= 0", fn,
                     (long long)M, (long long)N, (long long)K);
        return false;
    }
    if (M == 0 || N == 0) return true;
    if (!C || ldc < N) {
        kn_set_error(KN_ERR_INVALID, "%s: C is %s, ldc=%lld < N=%lld; ldc is the row stride of C in elements",
                     fn, C ? "set" : "NULL", (long long)ldc, (long long)N);
        return false;
    }
    if (K == 0 || alpha == 0.0f) return true;           /* A and B are not read */
    const int64_t arow = transA ? M : K, brow = transB ? K : N;
    if (!A || !B || lda < arow || ldb < brow) {
        kn_set_error(KN_ERR_INVALID, "%s: A %s lda=%lld (needs >= %lld), B %s ldb=%lld (needs >= %lld); "
                     "strides are stored row lengths in elements (transX: X is stored transposed)", fn,
                     A ? "set" : "NULL", (long long)lda, (long long)arow,
                     B ? "set" : "NULL", (long long)ldb, (long long)brow);
        return false;
    }
    return true;
}

void kn_sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
              const float *A, int64_t lda, const float *B, int64_t ldb,
              float beta, float *C, int64_t ldc) {
    if (!args_ok("kn_sgemm", transA, transB, M, N, K, alpha, A, lda, B, ldb, C, ldc)) return;
    sgemm_nt(gemm_threads(), transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, NULL);
}

void kn_sgemm_ep(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                 const float *A, int64_t lda, const float *B, int64_t ldb,
                 float beta, float *C, int64_t ldc, const kn_sgemm_post *post) {
    if (!args_ok("kn_sgemm", transA, transB, M, N, K, alpha, A, lda, B, ldb, C, ldc)) return;
    sgemm_nt(gemm_threads(), transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, post);
}

/* Batches in parallel (each single-threaded) when each is small. */
typedef struct {
    int64_t batch; bool ta, tb; int64_t M, N, K; float alpha, beta;
    const float *A; int64_t lda, sA; const float *B; int64_t ldb, sB; float *C; int64_t ldc, sC;
} batch_job;

static void batch_worker(void *ctx, int ith, int nth) {
    const batch_job *j = ctx;
    const int64_t b0 = j->batch * ith / nth, b1 = j->batch * (ith + 1) / nth;
    for (int64_t b = b0; b < b1; b++)
        sgemm_nt(1, j->ta, j->tb, j->M, j->N, j->K, j->alpha, j->A + b * j->sA, j->lda,
                 j->B + b * j->sB, j->ldb, j->beta, j->C + b * j->sC, j->ldc, NULL);
}

void kn_sgemm_batched(int64_t batch, bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                      float alpha, const float *A, int64_t lda, int64_t strideA,
                      const float *B, int64_t ldb, int64_t strideB, float beta,
                      float *C, int64_t ldc, int64_t strideC) {
    if (batch <= 0) return;
    if (!args_ok("kn_sgemm_batched", transA, transB, M, N, K, alpha, A, lda, B, ldb, C, ldc)) return;
    const int nt = gemm_threads();
    const double flops = 2.0 * M * N * K;
    if (batch > 1 && nt > 1 && strideC != 0 && flops < 8e6) {
        batch_job j = {batch, transA, transB, M, N, K, alpha, beta,
                       A, lda, strideA, B, ldb, strideB, C, ldc, strideC};
        kn_pool_run(batch_worker, &j, batch < nt ? (int)batch : nt);
        return;
    }
    for (int64_t b = 0; b < batch; b++)
        sgemm_nt(nt, transA, transB, M, N, K, alpha, A + b * strideA, lda,
                 B + b * strideB, ldb, beta, C + b * strideC, ldc, NULL);
}
