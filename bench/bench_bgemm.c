/* bench_bgemm.c: bf16 x bf16 -> f32 products on the CPU, the CPU's kernel
 * (kn_bgemm, gemm_bf16.c: AMX, else AVX512_BF16) against the path it replaces (widen both operands
 * to f32, then kn_sgemm), GFLOP/s, the CPU pool's threads.
 *
 *   build/bench/bench_bgemm [reps]     (timed runs per block, default 5; median)
 *
 * Shapes: square 512 and 1024, and a GPT-2-small training step's products on
 * the CPU (x [2048, 768] @ W^T [768, 3072], its weight gradient dY^T X over
 * 2048 rows). Rounds alternate the two paths; the results are compared (f32
 * rounding of the sums). Prints a skip line where the CPU or the OS offers
 * neither.
 */
#include "kn_bench.h"                  /* kn_bench_now */
#include "backends/cpu/gemm.h"
#include "backends/cpu/threadpool.h"
#include "backends/cpu/vec.h"          /* kn_vec_bf16_to_f32 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct { const char *name; int64_t M, N, K; bool ta, tb; } shape;

static uint16_t *rand_bf16(int64_t n, uint32_t seed) {
    uint16_t *p = malloc(sizeof *p * (size_t)n);
    for (int64_t i = 0; p && i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        union { float f; uint32_t u; } x = {(float)(seed >> 8) / (1 << 24) * 2 - 1};
        p[i] = (uint16_t)(x.u >> 16);
    }
    return p;
}
static int cmp(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

int main(int argc, char **argv) {
    int reps = argc > 1 ? atoi(argv[1]) : 5;
    if (reps < 1) reps = 1;
    kn_bgemm_ukr_fn ukr = kn_bgemm_kernel();
    if (!ukr) { printf("bench_bgemm: no AMX or AVX512_BF16 on this CPU (or the OS refused AMX's tile state): skipped\n"); return 0; }
#if !defined(KN_NO_AVX512)
    const char *kname = ukr == kn_bgemm_ukr_32x32_amx ? "AMX" : "AVX512_BF16";
#else
    const char *kname = "?";           /* not reached: such a build has neither kernel */
#endif
    static const shape S[] = {
        {"512^3", 512, 512, 512, false, false},
        {"1024^3", 1024, 1024, 1024, false, false},
        {"x[2048,768] @ W^T[768,3072]", 2048, 3072, 768, false, true},
        {"dW = dY^T[3072,2048] @ X[2048,768]", 3072, 768, 2048, true, false},
    };
    printf("bf16 products, %d threads, median of %d runs x 3 rounds\n\n", kn_pool_nthreads(), reps);
    printf("| shape | %s GFLOP/s | widen + SGEMM GFLOP/s | ratio |\n|---|---:|---:|---:|\n", kname);
    for (size_t si = 0; si < sizeof S / sizeof S[0]; si++) {
        const shape *s = &S[si];
        int64_t na = s->M * s->K, nb = s->K * s->N, lda = s->ta ? s->M : s->K, ldb = s->tb ? s->K : s->N;
        uint16_t *A = rand_bf16(na, 1 + (uint32_t)si), *B = rand_bf16(nb, 100 + (uint32_t)si);
        float *Af = malloc(sizeof(float) * (size_t)na), *Bf = malloc(sizeof(float) * (size_t)nb);
        float *C1 = malloc(sizeof(float) * (size_t)(s->M * s->N)), *C2 = malloc(sizeof(float) * (size_t)(s->M * s->N));
        if (!A || !B || !Af || !Bf || !C1 || !C2) { fprintf(stderr, "out of memory\n"); return 1; }
        double t1[64], t2[64];
        int n1 = 0, n2 = 0;
        for (int round = 0; round < 3; round++) {
            kn_bgemm(s->ta, s->tb, s->M, s->N, s->K, A, lda, B, ldb, C1, s->N, ukr);   /* warm */
            for (int r = 0; r < reps && n1 < 64; r++) {
                double t = kn_bench_now();
                kn_bgemm(s->ta, s->tb, s->M, s->N, s->K, A, lda, B, ldb, C1, s->N, ukr);
                t1[n1++] = kn_bench_now() - t;
            }
            for (int r = 0; r <= reps && n2 < 64; r++) {   /* the first run warms */
                double t = kn_bench_now();
                kn_vec_bf16_to_f32(Af, A, na);
                kn_vec_bf16_to_f32(Bf, B, nb);
                kn_sgemm(s->ta, s->tb, s->M, s->N, s->K, 1.0f, Af, lda, Bf, ldb, 0.0f, C2, s->N);
                if (r) t2[n2++] = kn_bench_now() - t;
            }
        }
        double worst = 0, scale = 0;        /* largest difference against the largest value */
        for (int64_t i = 0; i < s->M * s->N; i++) {
            double e = fabs((double)C1[i] - C2[i]);
            if (!(e <= worst)) worst = e;
            if (fabs((double)C2[i]) > scale) scale = fabs((double)C2[i]);
        }
        worst /= scale > 0 ? scale : 1;
        qsort(t1, (size_t)n1, sizeof *t1, cmp);
        qsort(t2, (size_t)n2, sizeof *t2, cmp);
        double fl = 2.0 * (double)s->M * s->N * s->K, m1 = t1[n1 / 2], m2 = t2[n2 / 2];
        printf("| %s | %.1f | %.1f | %.2f |%s\n", s->name, fl / m1 * 1e-9, fl / m2 * 1e-9, m2 / m1,
               worst < 1e-5 ? "" : "  (results differ)");
        free(A); free(B); free(Af); free(Bf); free(C1); free(C2);
    }
    return 0;
}
