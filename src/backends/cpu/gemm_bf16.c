/* gemm_bf16.c: C[M,N] (f32) = op(A)[M,K] @ op(B)[K,N] for bf16 A and B on
 * CPUs with AMX or AVX512_BF16 (the CPU side of bf16 mixed-precision training; issue 17:
 * "bf16 matrix products use AVX512_BF16 or AMX where the CPU has them").
 *
 * One AMX TDPBF16PS multiplies a 16 x 32 bf16 tile of A by a 32 x 16 tile of
 * B into a 16 x 16 f32 tile of C: 8192 multiply-adds an instruction. B's tile
 * stores k-pairs: row p holds (b[2p][j], b[2p+1][j]) for its 16 columns. The
 * micro-kernel (gemm_bf16_avx512.c) keeps a 32 x 32 block of C in four tiles
 * and walks K 32 at a time: two A tiles (rows 0-15, 16-31) from a row-major
 * panel, two B tiles (columns 0-15, 16-31) from a pair-major panel.
 * Panels: A as 32 rows of KP bf16 values, B as KP/2 pair rows of 32
 * columns, KP = K rounded up to 32 with zeros (rows and columns past the
 * matrix are zero too).
 *
 * Without AMX but with AVX512_BF16 (AMD Zen 4 / 5) the same blocks run on
 * VDPBF16PS (gemm_bf16_avx512.c: 32 multiply-adds an instruction where an
 * FMA does 16): 1.5-2.3x the widening path on a 2-core Zen 4 (bench_bgemm,
 * docs/PERF.md, session 18). A first AVX512_BF16 kernel (14 x 32, on an
 * Intel core that also had AMX) had run at 0.6x; no Intel CPU without AMX
 * was at hand to time this one. Neither: kn_bgemm_kernel returns NULL and
 * the caller widens to f32.
 *
 * Numerics: each product of two bf16 values is exact in f32 and each add
 * rounds to f32 (the instruction flushes denormals); kn_bgemm_ukr_generic
 * mirrors the order (even k, then odd) for tests. The widening path gives the
 * same products with another add order: results agree to f32 rounding.
 * Blocking: KC = 512 k, MC = 160 rows, NC = 2048 columns; threads take
 * rectangles of C from a counter. The OS must grant AMX state per process
 * (arch_prctl ARCH_REQ_XCOMP_PERM); refused, the widening path runs.
 * Non-goals: alpha/beta, a bf16 output (the caller rounds).
 */
#include "backends/cpu/gemm.h"         // defines: kn_bgemm, kn_bgemm_ukr_fn
#include "backends/cpu/threadpool.h"   // defines: kn_pool_run, kn_pool_nthreads
#include "core/cpu.h"                  // defines: kn_cpu (amx_bf16)
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__))
#include <sys/syscall.h>
#include <unistd.h>
#endif

/* BMR x BNR: the micro-kernel's block of C; BKC: k per block (a multiple of 32) */
enum { BMR = 32, BNR = 32, BKC = 512, BMC = 160, BNC = 2048 };

static void *aalloc(size_t n) { return aligned_alloc(64, (n + 63) / 64 * 64); }

static inline float bf(uint16_t h) {
    union { uint32_t u; float f; } x = {(uint32_t)h << 16};
    return x.f;
}

/* The scalar twin of the AMX kernel: Ap row-major [32][kp * 2], Bp [kp][32]
 * pair words; per pair, the even product then the odd one, each added with
 * one rounding (no denormal flushing). */
void kn_bgemm_ukr_generic(int64_t kp, const uint32_t *Ap, const uint32_t *Bp, float *C, int64_t ldc, bool acc) {
    const uint16_t *a = (const uint16_t *)Ap;
    for (int i = 0; i < BMR; i++)
        for (int j = 0; j < BNR; j++) {
            float c = acc ? C[i * ldc + j] : 0.0f;
            for (int64_t p = 0; p < kp; p++) {
                const uint32_t w = Bp[p * BNR + j];
                c += bf(a[i * 2 * kp + 2 * p]) * bf((uint16_t)w);
                c += bf(a[i * 2 * kp + 2 * p + 1]) * bf((uint16_t)(w >> 16));
            }
            C[i * ldc + j] = c;
        }
}

typedef struct {
    bool ta, tb;
    int64_t M, N, K;
    const uint16_t *A; int64_t lda;
    const uint16_t *B; int64_t ldb;
    float *C; int64_t ldc;
    kn_bgemm_ukr_fn ukr;
    int64_t mstep, nstep;
    int tm, tn;
    atomic_int next;
} bjob;

#define OPA(i, k) (g->ta ? g->A[(k) * g->lda + (i)] : g->A[(i) * g->lda + (k)])
#define OPB(k, j) (g->tb ? g->B[(j) * g->ldb + (k)] : g->B[(k) * g->ldb + (j)])   /* the out-of-memory loops */

/* op(A)[i0 .. i0+mc) x [k0, k0 + 2 kp): ceil(mc/32) panels of 32 rows of
 * 2 kp values; past the matrix, zeros. Row-major A: row copies; transposed:
 * each stored row (a k) is dealt out to the panels' rows. */
static void pack_a(const bjob *g, int64_t i0, int64_t mc, int64_t k0, int64_t kp, uint16_t *restrict dst) {
    const int64_t kw = 2 * kp, kn = g->K - k0 < kw ? g->K - k0 : kw;   /* real k in this block */
    const int64_t panels = (mc + BMR - 1) / BMR;
    memset(dst, 0, sizeof *dst * (size_t)(panels * BMR * kw));
    if (!g->ta) {
        for (int64_t i = 0; i < mc; i++)
            memcpy(dst + (i / BMR) * BMR * kw + (i % BMR) * kw, g->A + (i0 + i) * g->lda + k0, sizeof *dst * (size_t)kn);
        return;
    }
    for (int64_t k = 0; k < kn; k++) {
        const uint16_t *src = g->A + (k0 + k) * g->lda + i0;
        for (int64_t i = 0; i < mc; i++) dst[(i / BMR) * BMR * kw + (i % BMR) * kw + k] = src[i];
    }
}
/* op(B) [k0, k0 + 2 kp) x columns [j0, j0+nc): ceil(nc/32) panels of kp pair
 * rows of 32 words; past the matrix, zeros. Row-major B: two stored rows
 * interleave; transposed: a k-pair is the 32-bit word at B + j*ldb + k. */
static inline uint32_t pw(uint16_t lo, uint16_t hi) { return lo | (uint32_t)hi << 16; }
static void pack_b(const bjob *g, int64_t k0, int64_t kp, int64_t j0, int64_t nc, uint32_t *restrict dst) {
    const int64_t K = g->K, ldb = g->ldb;
    for (int64_t jp = 0; jp < nc; jp += BNR, dst += BNR * kp) {
        const int n = nc - jp < BNR ? (int)(nc - jp) : BNR;
        for (int64_t p = 0; p < kp; p++) {
            const int64_t k = k0 + 2 * p;
            uint32_t *d = dst + p * BNR;
            int j = 0;
            if (k + 1 < K) {
                if (!g->tb) {
                    const uint16_t *r0 = g->B + k * ldb + j0 + jp, *r1 = r0 + ldb;
                    for (; j < n; j++) d[j] = pw(r0[j], r1[j]);
                } else {
                    for (; j < n; j++) memcpy(&d[j], g->B + (j0 + jp + j) * ldb + k, 4);
                }
            } else if (k < K) {
                for (; j < n; j++) d[j] = g->tb ? g->B[(j0 + jp + j) * ldb + k] : g->B[k * ldb + j0 + jp + j];
            }
            for (; j < BNR; j++) d[j] = 0;
        }
    }
}

/* Per-thread panel buffers, grown on demand and kept (pool threads live as
 * long as the process; a thread that exits leaves its buffers) */
static _Thread_local void *t_buf[2];
static _Thread_local size_t t_cap[2];
static void *tbuf(int w, size_t bytes) {
    if (t_cap[w] >= bytes) return t_buf[w];
    void *q = aalloc(bytes);
    if (!q) return NULL;
    free(t_buf[w]);
    t_buf[w] = q; t_cap[w] = bytes;
    return q;
}

/* The blocked loops on the rectangle [m0,m1) x [n0,n1) of C; false: out of memory */
static bool block(const bjob *g, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
    const int64_t KR = (g->K + 31) / 32 * 32, kcmax = KR < BKC ? KR : BKC;
    int64_t ncmax = n1 - n0 < BNC ? n1 - n0 : BNC;
    ncmax = (ncmax + BNR - 1) / BNR * BNR;
    uint16_t *Ap = tbuf(0, sizeof(uint16_t) * (size_t)(BMC * kcmax));
    uint32_t *Bp = tbuf(1, sizeof(uint32_t) * (size_t)(ncmax * kcmax / 2));
    if (!Ap || !Bp) return false;
    float tile[BMR * BNR] __attribute__((aligned(64)));
    for (int64_t jc = n0; jc < n1; jc += BNC) {
        const int64_t nc = n1 - jc < BNC ? n1 - jc : BNC;
        for (int64_t pc = 0; pc < KR; pc += BKC) {
            const int64_t kp = (KR - pc < BKC ? KR - pc : BKC) / 2;   /* pairs, a multiple of 16 */
            pack_b(g, pc, kp, jc, nc, Bp);
            for (int64_t ic = m0; ic < m1; ic += BMC) {
                const int64_t mc = m1 - ic < BMC ? m1 - ic : BMC;
                pack_a(g, ic, mc, pc, kp, Ap);
                for (int64_t jr = 0; jr < nc; jr += BNR) {
                    const int64_t n = nc - jr < BNR ? nc - jr : BNR;
                    for (int64_t ir = 0; ir < mc; ir += BMR) {
                        const int64_t m = mc - ir < BMR ? mc - ir : BMR;
                        float *c = g->C + (ic + ir) * g->ldc + jc + jr;
                        const uint32_t *ap = (const uint32_t *)(Ap + ir * 2 * kp), *bp = Bp + jr * kp;
                        if (m == BMR && n == BNR) { g->ukr(kp, ap, bp, c, g->ldc, pc > 0); continue; }
                        g->ukr(kp, ap, bp, tile, BNR, false);     /* an edge block through a buffer */
                        for (int64_t i = 0; i < m; i++)
                            for (int64_t j = 0; j < n; j++)
                                c[i * g->ldc + j] = pc > 0 ? c[i * g->ldc + j] + tile[i * BNR + j] : tile[i * BNR + j];
                    }
                }
            }
        }
    }
    return true;
}

static void worker(void *ctx, int ith, int nth) {
    (void)ith; (void)nth;
    bjob *g = ctx;
    for (int c = atomic_fetch_add(&g->next, 1); c < g->tm * g->tn; c = atomic_fetch_add(&g->next, 1)) {
        int64_t m0 = c / g->tn * g->mstep, n0 = c % g->tn * g->nstep;
        int64_t m1 = m0 + g->mstep < g->M ? m0 + g->mstep : g->M, n1 = n0 + g->nstep < g->N ? n0 + g->nstep : g->N;
        if (!block(g, m0, m1, n0, n1)) {   /* out of memory for the panels: plain loops, slow and right */
            for (int64_t i = m0; i < m1; i++)
                for (int64_t j = n0; j < n1; j++) {
                    float s = 0.0f;
                    for (int64_t k = 0; k < g->K; k++) s += bf(OPA(i, k)) * bf(OPB(k, j));
                    g->C[i * g->ldc + j] = s;
                }
        }
    }
}

/* AMX needs the OS's permission for the tile state, once per process */
static bool g_amx;
static pthread_once_t g_amx_once = PTHREAD_ONCE_INIT;
static void amx_init(void) {
#if defined(__linux__) && (defined(__x86_64__) || defined(__i386__)) && !defined(KN_NO_AVX512)
    if (kn_cpu()->amx_bf16) g_amx = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
#endif
}
kn_bgemm_ukr_fn kn_bgemm_kernel_dpbf16(void) {
#if !defined(KN_NO_AVX512) && (defined(__x86_64__) || defined(__i386__))
    if (kn_cpu()->avx512bf16 && kn_cpu()->isa >= KN_ISA_AVX512) return kn_bgemm_ukr_32x32_dpbf16;   /* KN_CPU=avx2: not */
#endif
    return NULL;
}
kn_bgemm_ukr_fn kn_bgemm_kernel(void) {
    pthread_once(&g_amx_once, amx_init);
#if !defined(KN_NO_AVX512) && (defined(__x86_64__) || defined(__i386__))
    if (g_amx) return kn_bgemm_ukr_32x32_amx;
    return kn_bgemm_kernel_dpbf16();
#else
    (void)g_amx;                      /* a build without the AMX kernel never sets it */
#endif
    return NULL;
}

void kn_bgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const uint16_t *A, int64_t lda, const uint16_t *B,
              int64_t ldb, float *C, int64_t ldc, kn_bgemm_ukr_fn ukr) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)N);
        return;
    }
    bjob g = {ta, tb, M, N, K, A, lda, B, ldb, C, ldc, ukr ? ukr : kn_bgemm_ukr_generic, M, N, 1, 1, 0};
    /* about two rectangles per thread, shaped to pack least: each column of
     * rectangles packs op(A) once, each row op(B) */
    int nt = kn_pool_nthreads(), want = nt > 1 ? 2 * nt : 1;
    int64_t npan = (N + BNR - 1) / BNR, mpan = (M + BMR - 1) / BMR;
    double best = -1;
    for (int tm = 1; tm <= want; tm++) {
        if (want % tm) continue;
        int tn = want / tm;
        if (tm > mpan || tn > npan) continue;
        double cost = (double)tn * M + (double)tm * N;
        if (best < 0 || cost < best) { best = cost; g.tm = tm; g.tn = tn; }
    }
    g.nstep = (npan + g.tn - 1) / g.tn * BNR;
    g.mstep = (mpan + g.tm - 1) / g.tm * BMR;
    g.tn = (int)((N + g.nstep - 1) / g.nstep);
    g.tm = (int)((M + g.mstep - 1) / g.mstep);
    atomic_init(&g.next, 0);
    if (g.tm * g.tn > 1 && (double)M * N * K > 1e6) kn_pool_run(worker, &g, 0);
    else worker(&g, 0, 1);
}
