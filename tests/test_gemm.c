/* test_gemm.c: kn_sgemm / kn_sgemm_batched against a double-precision triple
 * loop, on every SIMD path this machine can run (kn_sgemm_force_isa) and with
 * 1 and 2 threads; plus the thread pool's contract (threadpool.h).
 *
 * Check per element: |c - ref| <= tol * (|alpha| * sum_k |a_ik b_kj| + |beta c0|)
 * with tol = 1e-5 * sqrt(K) (float rounding grows ~sqrt(K) on random data), so a
 * single wrong element fails even in a large matrix. C is surrounded by
 * sentinels (the ldc gap) that must come back untouched; beta == 0 cases start
 * from C full of NaN, which must not leak.
 */
#include "kn_test.h"
#include "backends/cpu/gemm.h"
#include "backends/cpu/threadpool.h"
#include "core/cpu.h"
#include "kiln_base.h"
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

/* ---- helpers ------------------------------------------------------------------ */
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static float frand(void) {              /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13; g_rng ^= g_rng >> 7; g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) * (1.0 / 8388608.0) - 1.0);
}
static float *rand_mat(int64_t rows, int64_t ld) {
    float *p = malloc(sizeof(float) * (size_t)(rows * ld + 1));
    for (int64_t i = 0; i < rows * ld + 1; i++) p[i] = frand();
    return p;
}

static const float SENTINEL = -12345.0f;

typedef struct {
    bool ta, tb;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B, *C0;             /* C0: initial C (ldc stride), NULL if beta == 0 */
    double *ref, *bound;                 /* [M*N] */
} gcase;

/* Fill ref and the per-element error bound. */
static void reference(gcase *g) {
    const double tol = 1e-5 * sqrt((double)(g->K > 1 ? g->K : 1));
    for (int64_t i = 0; i < g->M; i++)
        for (int64_t j = 0; j < g->N; j++) {
            double s = 0, sa = 0;
            for (int64_t k = 0; k < g->K; k++) {
                const double a = g->ta ? g->A[k * g->lda + i] : g->A[i * g->lda + k];
                const double b = g->tb ? g->B[j * g->ldb + k] : g->B[k * g->ldb + j];
                s += a * b; sa += fabs(a * b);
            }
            double r = (double)g->alpha * s, bnd = fabs((double)g->alpha) * sa;
            if (g->beta != 0.0f) {
                r += (double)g->beta * g->C0[i * g->ldc + j];
                bnd += fabs((double)g->beta * g->C0[i * g->ldc + j]);
            }
            g->ref[i * g->N + j] = r;
            g->bound[i * g->N + j] = tol * bnd + 1e-30;
        }
}

/* Fresh C for a run: C0 (or NaN when beta == 0) inside, sentinels in the gap. */
static float *make_c(const gcase *g) {
    float *C = malloc(sizeof(float) * (size_t)(g->M * g->ldc + 1));
    for (int64_t i = 0; i < g->M * g->ldc + 1; i++) C[i] = SENTINEL;
    for (int64_t i = 0; i < g->M; i++)
        for (int64_t j = 0; j < g->N; j++)
            C[i * g->ldc + j] = g->beta == 0.0f ? NAN : g->C0[i * g->ldc + j];
    return C;
}

/* Compare; returns the number of bad elements and prints the first. */
static int64_t compare(const gcase *g, const float *C, const char *what) {
    int64_t bad = 0;
    for (int64_t i = 0; i < g->M; i++)
        for (int64_t j = 0; j < g->ldc; j++) {
            const float c = C[i * g->ldc + j];
            bool ok;
            double ref = SENTINEL;
            if (j >= g->N) ok = c == SENTINEL;
            else {
                ref = g->ref[i * g->N + j];
                ok = !isnan(c) && fabs(c - ref) <= g->bound[i * g->N + j];
            }
            if (!ok && bad++ == 0)
                fprintf(stderr, "  %s: ta=%d tb=%d M=%lld N=%lld K=%lld lda=%lld ldb=%lld ldc=%lld "
                        "alpha=%g beta=%g: C[%lld,%lld]=%.9g ref=%.9g\n", what, g->ta, g->tb,
                        (long long)g->M, (long long)g->N, (long long)g->K, (long long)g->lda,
                        (long long)g->ldb, (long long)g->ldc, g->alpha, g->beta,
                        (long long)i, (long long)j, c, ref);
        }
    if (C[g->M * g->ldc] != SENTINEL && bad++ == 0) fprintf(stderr, "  %s: wrote past the end of C\n", what);
    return bad;
}

/* The ISA levels this machine runs; returns their count. */
static int isa_list(int out[3]) {
    int n = 0;
    for (int isa = KN_ISA_SCALAR; isa <= KN_ISA_AVX512; isa++)
        if (kn_sgemm_force_isa(isa) == isa) out[n++] = isa;
    kn_sgemm_force_isa(-1);
    return n;
}
static const char *isa_name(int isa) { return isa == 0 ? "scalar" : isa == 1 ? "avx2" : "avx512"; }

/* Build a case with random operands, run it on every ISA x {1,2} threads.
 * Returns the number of failed runs. */
static int run_case(bool ta, bool tb, int64_t M, int64_t N, int64_t K, int64_t pad,
                    float alpha, float beta) {
    gcase g = {ta, tb, M, N, K, 0, 0, 0, alpha, beta, NULL, NULL, NULL, NULL, NULL};
    g.lda = (ta ? M : K) + pad;  if (g.lda < 1) g.lda = 1;
    g.ldb = (tb ? K : N) + pad * 2; if (g.ldb < 1) g.ldb = 1;
    g.ldc = N + pad * 3;
    float *A = rand_mat(ta ? K : M, g.lda), *B = rand_mat(tb ? N : K, g.ldb);
    float *C0 = beta != 0.0f ? rand_mat(M, g.ldc) : NULL;
    g.A = A; g.B = B; g.C0 = C0;
    g.ref = malloc(sizeof(double) * (size_t)(M * N + 1));
    g.bound = malloc(sizeof(double) * (size_t)(M * N + 1));
    reference(&g);
    int isas[3], nisa = isa_list(isas), fails = 0;
    for (int ii = 0; ii < nisa; ii++)
        for (int nt = 1; nt <= 2; nt++) {
            kn_sgemm_force_isa(isas[ii]);
            kn_sgemm_set_max_threads(nt);
            float *C = make_c(&g);
            kn_sgemm(ta, tb, M, N, K, alpha, A, g.lda, B, g.ldb, beta, C, g.ldc);
            char what[64];
            snprintf(what, sizeof what, "%s/%dt", isa_name(isas[ii]), nt);
            if (compare(&g, C, what)) fails++;
            free(C);
        }
    kn_sgemm_force_isa(-1);
    kn_sgemm_set_max_threads(0);
    free(A); free(B); free(C0); free(g.ref); free(g.bound);
    return fails;
}

static void setup_pool(void) { kn_pool_set_threads(2); }

/* ---- GEMM tests ---------------------------------------------------------------- */
TEST(isa_paths_available) {
    int isas[3], n = isa_list(isas);
    fprintf(stderr, "  gemm paths tested here:");
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", isa_name(isas[i]));
    fprintf(stderr, " (cpu best: %s)\n", isa_name(kn_cpu()->isa));
    CHECK(n >= 1 && isas[0] == KN_ISA_SCALAR, "scalar path must always be available");
    CHECK(isas[n - 1] == (int)kn_cpu()->isa || (kn_cpu()->isa == KN_ISA_AVX512 && n == 2),
          "best path %d not reachable", (int)kn_cpu()->isa);
    CHECK(kn_sgemm_force_isa(99) <= KN_ISA_AVX512, "force must clamp");
    kn_sgemm_force_isa(-1);
}

TEST(odd_sizes_all_transposes) {
    setup_pool();
    static const int64_t sz[] = {1, 2, 3, 7, 17, 31, 33, 65, 127, 129};
    static const float ab[][2] = {{1.0f, 0.0f}, {0.5f, 0.0f}, {-1.5f, 0.75f}, {1.0f, 1.0f}};
    int fails = 0, runs = 0;
    for (int t = 0; t < 4; t++)
        for (int im = 0; im < 10; im++)
            for (int in = 0; in < 10; in++) {
                const int64_t K = sz[(im + 3 * in + t) % 10];
                const int v = (im + in + t) & 3;
                const int64_t pad = (im * 7 + in) % 3 == 0 ? 5 : 0;     /* strides > row length */
                fails += run_case(t & 1, (t >> 1) & 1, sz[im], sz[in], K, pad, ab[v][0], ab[v][1]);
                runs++;
            }
    CHECK(fails == 0, "%d failing runs out of %d cases x paths x threads", fails, runs);
}

TEST(k_sizes_independent) {
    setup_pool();
    static const int64_t sz[] = {1, 2, 3, 7, 17, 31, 33, 65, 127, 129};
    int fails = 0;
    for (int ik = 0; ik < 10; ik++)          /* every K against a few M,N shapes */
        for (int t = 0; t < 4; t++) {
            fails += run_case(t & 1, t >> 1, 13, 19, sz[ik], 1, 1.0f, 0.0f);
            fails += run_case(t & 1, t >> 1, 6, 16, sz[ik], 0, 2.0f, -1.0f);
        }
    CHECK(fails == 0, "%d failing runs", fails);
}

TEST(threaded_splits_and_blocks) {
    setup_pool();
    int fails = 0;
    /* big enough to use 2 threads: an M split, an N split, and both with trans */
    fails += run_case(false, false, 401, 45, 301, 3, 1.0f, 0.0f);
    fails += run_case(true, true, 45, 401, 301, 0, 0.75f, 0.5f);
    fails += run_case(false, true, 130, 131, 257, 2, 1.0f, 1.0f);
    fails += run_case(true, false, 255, 97, 129, 0, -1.0f, 0.0f);
    /* crosses every KC/MC/NC boundary of every path (NC up to 4096, KC >= 192, MC <= 192) */
    fails += run_case(false, false, 203, 4133, 300, 1, 1.0f, 0.5f);
    /* over 512 columns a thread packs op(A); at or under, the micro-kernel
     * reads it in place (gemm.c, DIRECT_MAX_COLS): both, transposed or not */
    fails += run_case(true, false, 150, 1100, 300, 2, 1.0f, 0.5f);
    fails += run_case(true, true, 31, 600, 270, 0, 1.0f, 0.0f);
    fails += run_case(false, true, 43, 512, 260, 1, -0.5f, 1.0f);
    CHECK(fails == 0, "%d failing runs", fails);
}

TEST(matrix_vector_paths) {
    setup_pool();
    int fails = 0;
    for (int t = 0; t < 4; t++) {
        const bool ta = t & 1, tb = t >> 1;
        fails += run_case(ta, tb, 2100, 1, 777, 0, 1.0f, 0.0f);    /* N == 1: >1 chunk, threads */
        fails += run_case(ta, tb, 1, 2100, 777, 0, 1.0f, 0.5f);    /* M == 1 */
        fails += run_case(ta, tb, 37, 1, 1030, 3, -2.0f, 0.0f);   /* strided vector / output */
        fails += run_case(ta, tb, 1, 37, 1030, 3, 0.5f, 1.0f);
        fails += run_case(ta, tb, 1, 1, 5, 2, 1.0f, 0.0f);
        fails += run_case(ta, tb, 2, 1500, 300, 1, 1.0f, 0.5f);   /* 2-3 rows: one pass per row */
        fails += run_case(ta, tb, 1500, 3, 300, 2, -1.0f, 0.0f);  /* 2-3 columns */
        /* rows of 8 floats, unpadded (attention heads of dimension 8): the
         * AVX-512 two-rows-a-register kernels, full and partial 16-row tiles */
        for (int n = 1; n <= 35; n += 17 - (n == 1) * 13) {
            fails += run_case(ta, tb, 1, n, 8, 0, 1.0f, 0.0f);
            fails += run_case(ta, tb, n, 1, 8, 0, 1.0f, 0.5f);
            fails += run_case(ta, tb, 1, 8, n, 0, -1.0f, 0.0f);
            fails += run_case(ta, tb, 8, 1, n, 0, 1.0f, 0.0f);
        }
        fails += run_case(ta, tb, 1, 8, 1027, 0, 1.0f, 0.0f);
        fails += run_case(ta, tb, 1027, 1, 8, 0, 1.0f, 0.0f);
    }
    CHECK(fails == 0, "%d failing runs", fails);
}

TEST(alpha_zero_and_k_zero) {
    const int64_t M = 5, N = 7, ldc = 9;
    float A[5 * 3], B[3 * 7], C[5 * 9];
    for (int i = 0; i < 15; i++) A[i] = NAN;
    for (int i = 0; i < 21; i++) B[i] = NAN;
    for (int i = 0; i < 45; i++) C[i] = (float)i;
    kn_sgemm(false, false, M, N, 3, 0.0f, A, 3, B, 7, 2.0f, C, ldc);    /* alpha 0: A, B unread */
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < ldc; j++)
            bad += C[i * ldc + j] != (j < N ? 2.0f : 1.0f) * (float)(i * ldc + j);
    CHECK(bad == 0, "alpha=0 must give beta*C and leave the gap alone (%d bad)", bad);
    for (int i = 0; i < 45; i++) C[i] = NAN;
    kn_sgemm(true, true, M, N, 0, 1.0f, A, 5, B, 0, 0.0f, C, ldc);       /* K 0, beta 0: zeros */
    bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) bad += C[i * ldc + j] != 0.0f;
    CHECK(bad == 0, "K=0 beta=0 must zero C (%d bad)", bad);
    kn_sgemm(false, false, 0, N, 3, 1.0f, A, 3, B, 7, 0.0f, C, ldc);     /* M 0: nothing */
}

TEST(bad_arguments_rejected) {
    float A[6] = {1, 2, 3, 4, 5, 6}, B[6] = {1, 1, 1, 1, 1, 1}, C[4] = {7, 7, 7, 7};
    kn_clear_error();
    kn_sgemm(false, false, 2, 2, 3, 1.0f, A, 2, B, 2, 0.0f, C, 2);      /* lda 2 < K 3 */
    CHECK(C[0] == 7 && strstr(kn_last_error(), "lda=2"), "short lda must be refused: '%s'", kn_last_error());
    kn_clear_error();
    kn_sgemm(false, false, 2, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 1);      /* ldc 1 < N 2 */
    CHECK(C[0] == 7 && strstr(kn_last_error(), "ldc"), "short ldc must be refused: '%s'", kn_last_error());
    kn_clear_error();
    kn_sgemm(false, false, -1, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 2);
    CHECK(strstr(kn_last_error(), "negative"), "negative M must be refused: '%s'", kn_last_error());
    kn_clear_error();
    kn_sgemm_batched(2, false, false, 2, 2, 3, 1.0f, NULL, 3, 0, B, 2, 0, 0.0f, C, 2, 0);
    CHECK(C[0] == 7 && strstr(kn_last_error(), "NULL"), "NULL A must be refused: '%s'", kn_last_error());
    kn_clear_error();
    kn_sgemm(false, false, 2, 2, 3, 1.0f, A, 3, B, 2, 0.0f, C, 2);      /* valid: no error */
    CHECK(kn_last_error()[0] == 0 && C[0] == 1 + 2 + 3, "valid call: err '%s' C[0]=%g", kn_last_error(), C[0]);
}

TEST(batched_broadcast) {
    setup_pool();
    int isas[3], nisa = isa_list(isas);
    /* small (batches spread over threads) and large (each batch threaded) */
    static const int64_t shapes[][3] = {{7, 9, 17}, {33, 31, 65}, {150, 130, 140}};
    int bad_runs = 0;
    for (int s = 0; s < 3; s++)
        for (int bc = 0; bc < 3; bc++) {          /* 0: A broadcast, 1: B broadcast, 2: C accumulate */
            const int64_t M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], batch = 5;
            const bool ta = s == 1, tb = s != 0;
            const int64_t lda = (ta ? M : K) + 1, ldb = tb ? K : N, ldc = N + 2;
            const int64_t sA = bc == 0 ? 0 : (ta ? K : M) * lda + 3;
            const int64_t sB = bc == 1 ? 0 : (tb ? N : K) * ldb;
            const int64_t sC = bc == 2 ? 0 : M * ldc + 1;
            const float beta = bc == 2 ? 1.0f : 0.0f;
            float *A = rand_mat(batch, (ta ? K : M) * lda + 3), *B = rand_mat(batch, (tb ? N : K) * ldb);
            float *C0 = rand_mat(batch, M * ldc + 1);
            float *C = malloc(sizeof(float) * (size_t)(batch * (M * ldc + 1)));
            for (int ii = 0; ii < nisa; ii++)
                for (int nt = 1; nt <= 2; nt++) {
                    kn_sgemm_force_isa(isas[ii]);
                    kn_sgemm_set_max_threads(nt);
                    for (int64_t i = 0; i < batch * (M * ldc + 1); i++) C[i] = beta == 0.0f ? NAN : C0[i];
                    kn_sgemm_batched(batch, ta, tb, M, N, K, 1.0f, A, lda, sA, B, ldb, sB, beta, C, ldc, sC);
                    int64_t bad = 0;
                    const int64_t nb = bc == 2 ? 1 : batch;
                    for (int64_t b = 0; b < nb; b++) {
                        gcase g = {ta, tb, M, N, K, lda, ldb, ldc, 1.0f, beta, NULL, NULL, C0, NULL, NULL};
                        g.ref = calloc((size_t)(M * N), sizeof(double));
                        g.bound = calloc((size_t)(M * N), sizeof(double));
                        const int64_t bs = bc == 2 ? batch : 1;   /* C accumulate: sum all batches */
                        for (int64_t q = 0; q < bs; q++) {
                            const int64_t bb = bc == 2 ? q : b;
                            gcase h = g;
                            h.A = A + bb * sA; h.B = B + bb * sB; h.beta = 0.0f;
                            h.ref = malloc(sizeof(double) * (size_t)(M * N));
                            h.bound = malloc(sizeof(double) * (size_t)(M * N));
                            reference(&h);
                            for (int64_t e = 0; e < M * N; e++) { g.ref[e] += h.ref[e]; g.bound[e] += h.bound[e]; }
                            free(h.ref); free(h.bound);
                        }
                        if (beta != 0.0f)
                            for (int64_t i = 0; i < M; i++)
                                for (int64_t j = 0; j < N; j++) {
                                    g.ref[i * N + j] += C0[i * ldc + j];
                                    g.bound[i * N + j] += 1e-5 * sqrt((double)K) * fabs(C0[i * ldc + j]);
                                }
                        char what[64];
                        snprintf(what, sizeof what, "batched %s/%dt b=%lld bc=%d", isa_name(isas[ii]), nt,
                                 (long long)b, bc);
                        for (int64_t i = 0; i < M; i++)       /* compare() wants sentinel gaps: check inline */
                            for (int64_t j = 0; j < N; j++) {
                                const float c = C[b * sC + i * ldc + j];
                                if (isnan(c) || fabs(c - g.ref[i * N + j]) > g.bound[i * N + j] * (bc == 2 ? 5 : 1))
                                    if (bad++ == 0)
                                        fprintf(stderr, "  %s: C[%lld,%lld]=%.9g ref=%.9g\n", what,
                                                (long long)i, (long long)j, c, g.ref[i * N + j]);
                            }
                        free(g.ref); free(g.bound);
                    }
                    bad_runs += bad != 0;
                }
            free(A); free(B); free(C0); free(C);
        }
    kn_sgemm_force_isa(-1);
    kn_sgemm_set_max_threads(0);
    CHECK(bad_runs == 0, "%d failing batched runs", bad_runs);
}

/* ---- thread pool ------------------------------------------------------------------ */
typedef struct { atomic_int hits[64]; atomic_int bad_nth; int expect_nth; } count_ctx;
static void count_fn(void *ctx, int ith, int nth) {
    count_ctx *c = ctx;
    if (nth != c->expect_nth || ith < 0 || ith >= nth) atomic_fetch_add(&c->bad_nth, 1);
    else atomic_fetch_add(&c->hits[ith], 1);
}

/* ---- bf16 products (gemm_bf16.c) ----------------------------------------------
 * Random bf16 operands in every layout, odd M, N and K (a zero-padded last
 * k-pair), edge tiles, more than one K block (K > 512), against a double
 * reference: each product of two bf16 values is exact in f32, so the only
 * error is f32 rounding of the sums, bounded by K ulps of sum |a||b|. The
 * CPU's kernel (AMX or AVX512_BF16, when the CPU and OS offer them), the
 * AVX512_BF16 one beside AMX, and the scalar twin. */
static uint16_t to_bf(float f) {
    union { float f; uint32_t u; } x = {f};
    return (uint16_t)((x.u + 0x7fffu + ((x.u >> 16) & 1u)) >> 16);
}
static double from_bf(uint16_t h) {
    union { uint32_t u; float f; } x = {(uint32_t)h << 16};
    return x.f;
}
TEST(bf16_products_all_layouts) {
    static const int64_t shapes[][3] = {{1, 1, 1}, {13, 31, 7}, {14, 32, 512}, {29, 65, 513}, {3, 200, 1031}, {170, 97, 40}, {5, 7, 0}};
    /* the CPU's choice, AVX512_BF16's kernel where the CPU has it (also
     * beside AMX, which the choice prefers), the scalar twin */
    kn_bgemm_ukr_fn ks[3] = {kn_bgemm_kernel(), kn_bgemm_kernel_dpbf16(), kn_bgemm_ukr_generic};
    if (ks[1] == ks[0]) ks[1] = NULL;
    if (!ks[0]) fprintf(stderr, "  (no AMX or AVX512_BF16 here: the scalar kernel only)\n");
    uint32_t seed = 7;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int lay = 0; lay < 4; lay++) {
            const int64_t M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
            const bool ta = lay & 1, tb = lay & 2;
            const int64_t lda = (ta ? M : K) + 3, ldb = (tb ? K : N) + 5, ldc = N + 2;
            uint16_t *A = malloc(sizeof *A * (size_t)((ta ? K : M) * lda + 1)), *B = malloc(sizeof *B * (size_t)((tb ? N : K) * ldb + 1));
            float *C = malloc(sizeof *C * (size_t)(M * ldc));
            REQUIRE(A && B && C, "out of memory");
            for (int64_t i = 0; i < (ta ? K : M) * lda; i++) { seed = seed * 1664525u + 1013904223u; A[i] = to_bf((float)(seed >> 8) / (1 << 24) * 4 - 2); }
            for (int64_t i = 0; i < (tb ? N : K) * ldb; i++) { seed = seed * 1664525u + 1013904223u; B[i] = to_bf((float)(seed >> 8) / (1 << 24) * 4 - 2); }
            for (int k = 0; k < 3; k++) {
                if (!ks[k]) continue;
                for (int64_t i = 0; i < M * ldc; i++) C[i] = NAN;   /* overwritten, never read */
                kn_bgemm(ta, tb, M, N, K, A, lda, B, ldb, C, ldc, ks[k]);
                double worst = 0;
                for (int64_t i = 0; i < M; i++)
                    for (int64_t j = 0; j < N; j++) {
                        double r = 0, mag = 0;
                        for (int64_t q = 0; q < K; q++) {
                            double p = from_bf(ta ? A[q * lda + i] : A[i * lda + q]) * from_bf(tb ? B[j * ldb + q] : B[q * ldb + j]);
                            r += p; mag += fabs(p);
                        }
                        double e = fabs(C[i * ldc + j] - r) / ((double)(K + 1) * 1.2e-7 * mag + 1e-30);
                        if (!(e <= worst)) worst = e;    /* NaN sticks */
                    }
                CHECK(worst <= 1.0, "%s kernel %lldx%lldx%lld ta=%d tb=%d: error %.3g of the bound",
                      k == 2 ? "scalar" : k == 1 ? "avx512_bf16" : "cpu",
                      (long long)M, (long long)N, (long long)K, ta, tb, worst);
            }
            free(A); free(B); free(C);
        }
}

TEST(pool_runs_each_part_once) {
    static const int sizes[] = {1, 2, 3};
    for (int s = 0; s < 3; s++) {
        kn_pool_set_threads(sizes[s]);
        CHECK(kn_pool_nthreads() == sizes[s], "size %d -> %d", sizes[s], kn_pool_nthreads());
        for (int nth = 0; nth <= 9; nth++) {
            count_ctx c = {.expect_nth = nth <= 0 ? sizes[s] : nth};
            kn_pool_run(count_fn, &c, nth);
            int wrong = 0;
            for (int i = 0; i < c.expect_nth; i++) wrong += atomic_load(&c.hits[i]) != 1;
            CHECK(wrong == 0 && atomic_load(&c.bad_nth) == 0, "pool %d nth %d: %d parts wrong", sizes[s], nth, wrong);
        }
    }
    kn_pool_set_threads(0);
    CHECK(kn_pool_nthreads() >= 1, "default size");
    kn_pool_set_threads(2);
}

static atomic_long g_sum;
static void add_fn(void *ctx, int ith, int nth) { atomic_fetch_add(&g_sum, ith + 1); }

TEST(pool_high_rate) {
    kn_pool_set_threads(2);
    atomic_store(&g_sum, 0);
    const int n = 3000;            /* ~1 ms when idle; the machine may be shared */
    for (int r = 0; r < n; r++) kn_pool_run(add_fn, NULL, 2);
    CHECK(atomic_load(&g_sum) == 3L * n, "sum %ld != %ld", atomic_load(&g_sum), 3L * n);
}

typedef struct { atomic_int inner; atomic_int outer; } nest_ctx;
static void inner_fn(void *ctx, int ith, int nth) { atomic_fetch_add(&((nest_ctx *)ctx)->inner, 1); }
static void outer_fn(void *ctx, int ith, int nth) {
    nest_ctx *c = ctx;
    atomic_fetch_add(&c->outer, 1);
    kn_pool_run(inner_fn, ctx, 3);      /* nested: runs serially on this thread */
    /* a GEMM from inside a job also works (serially) */
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, r[4];
    kn_sgemm(false, false, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, r, 2);
    if (r[0] != 1 || r[1] != 2 || r[2] != 3 || r[3] != 4) atomic_fetch_add(&c->inner, 1000);
}

TEST(pool_nested_calls) {
    kn_pool_set_threads(2);
    nest_ctx c = {0};
    kn_pool_run(outer_fn, &c, 4);
    CHECK(atomic_load(&c.outer) == 4 && atomic_load(&c.inner) == 12,
          "outer %d (want 4) inner %d (want 12)", atomic_load(&c.outer), atomic_load(&c.inner));
}

static void *caller_thread(void *p) {
    count_ctx *cs = p;
    for (int r = 0; r < 2000; r++) kn_pool_run(count_fn, &cs[r & 1], 2);
    return NULL;
}

TEST(pool_concurrent_callers) {
    kn_pool_set_threads(2);
    count_ctx a[2] = {{.expect_nth = 2}, {.expect_nth = 2}}, b[2] = {{.expect_nth = 2}, {.expect_nth = 2}};
    pthread_t t1, t2;
    REQUIRE(pthread_create(&t1, NULL, caller_thread, a) == 0, "pthread_create");
    REQUIRE(pthread_create(&t2, NULL, caller_thread, b) == 0, "pthread_create");
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    int wrong = 0;
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < 2; i++) {
            wrong += atomic_load(&a[k].hits[i]) != 1000;
            wrong += atomic_load(&b[k].hits[i]) != 1000;
        }
    CHECK(wrong == 0 && !atomic_load(&a[0].bad_nth) && !atomic_load(&b[0].bad_nth), "%d counters wrong", wrong);
}

KN_TEST_MAIN()
