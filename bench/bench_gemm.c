/* bench_gemm.c: kiln SGEMM vs OpenBLAS, GFLOP/s, 1 and 2 threads, one markdown table.
 *
 *   build/bench/bench_gemm [reps]    (reps: timed runs per cell and library, default 9;
 *                                     at least 60 ms of runs per block; median)
 *
 * Shapes: square 256..2048; the LLM shapes A[768,2304] @ B[2304,64] and the
 * decode matrix-vector W[4096,4096] @ x[4096] (kiln through kn_sgemm with N=1,
 * OpenBLAS through cblas_sgemv, its best entry point for that shape).
 * Each cell runs 3 rounds of (kiln block, OpenBLAS block); each block starts
 * after a 0.2 s pause (idle pool threads of the other library fall asleep) and
 * one warm-up run. The result of each library is checked against the other.
 *
 * Debian's OpenBLAS can mis-detect recent CPUs, so unless OPENBLAS_CORETYPE is
 * set the program re-executes itself with it set ("SkylakeX" when the CPU has
 * AVX-512, else "Haswell") before OpenBLAS reads it at load time; it also sets
 * OPENBLAS_NUM_THREADS=2 if unset (see main).
 */
#include "kn_bench.h"         /* kn_bench_now, kn_bench_cmp_double */
#include "backends/cpu/gemm.h"
#include "backends/cpu/threadpool.h"
#include "core/cpu.h"
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void openblas_set_num_threads(int);   /* also in OpenBLAS's cblas.h; repeated for other cblas.h */
char *openblas_get_corename(void);

typedef struct { const char *name; int64_t M, N, K; bool gemv; } shape;

static float *randm(int64_t n) {
    float *p = aligned_alloc(64, (size_t)((n * 4 + 63) & ~63));
    uint32_t s = 12345u + (uint32_t)n;
    for (int64_t i = 0; i < n; i++) { s = s * 1664525u + 1013904223u; p[i] = (float)(s >> 8) / 16777216.0f - 0.5f; }
    return p;
}

static void run_kiln(const shape *s, const float *A, const float *B, float *C) {
    kn_sgemm(false, false, s->M, s->N, s->K, 1.0f, A, s->K, B, s->N, 0.0f, C, s->N);
}
static void run_blas(const shape *s, const float *A, const float *B, float *C) {
    if (s->gemv) cblas_sgemv(CblasRowMajor, CblasNoTrans, (int)s->M, (int)s->K, 1.0f, A, (int)s->K, B, 1, 0.0f, C, 1);
    else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)s->M, (int)s->N, (int)s->K, 1.0f,
                     A, (int)s->K, B, (int)s->N, 0.0f, C, (int)s->N);
}

enum { ROUNDS = 3, MAXT = 256 };

/* One block of timed runs of fn: at least `reps` runs and ~60 ms, appended to t[]. */
static void time_block(void (*fn)(const shape *, const float *, const float *, float *),
                       const shape *s, const float *A, const float *B, float *C, int reps,
                       double *t, int *nt) {
    /* Let the other library's idle workers go to sleep first: OpenBLAS's spin
     * (sched_yield) for ~2^28 cycles after a job, kiln's for well under 1 ms;
     * on a 2-core machine a spinning idle thread halves the other's 2-thread speed. */
    usleep(200 * 1000);
    fn(s, A, B, C);                                   /* warm-up */
    const double start = kn_bench_now();
    for (int r = 0; (r < reps || kn_bench_now() - start < 0.06) && *nt < MAXT; r++) {
        const double t0 = kn_bench_now();
        fn(s, A, B, C);
        t[(*nt)++] = kn_bench_now() - t0;
    }
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof t[0], kn_bench_cmp_double);
    return t[n / 2];
}

int main(int argc, char **argv) {
    if (!getenv("OPENBLAS_CORETYPE")) {
        const char *core = kn_cpu()->avx512f && kn_cpu()->avx512bw && kn_cpu()->avx512vl && kn_cpu()->avx512dq
                           ? "SkylakeX" : "Haswell";
        setenv("OPENBLAS_CORETYPE", core, 1);
        /* OpenBLAS starts one thread per core at load, and idle ones spin-yield for
         * a while; size its pool to what the table uses, like kiln's. */
        if (!getenv("OPENBLAS_NUM_THREADS")) setenv("OPENBLAS_NUM_THREADS", "2", 1);
        execv("/proc/self/exe", argv);
        perror("bench_gemm: re-exec with OPENBLAS_CORETYPE failed, run it with OPENBLAS_CORETYPE set");
        return 1;
    }
    int reps = argc > 1 ? atoi(argv[1]) : 9;
    if (reps < 1) reps = 1;
    if (reps > 120) reps = 120;
    static const shape shapes[] = {
        {"256^3", 256, 256, 256, false},      {"512^3", 512, 512, 512, false},
        {"1024^3", 1024, 1024, 1024, false},  {"2048^3", 2048, 2048, 2048, false},
        {"[768,2304]@[2304,64]", 768, 64, 2304, false},
        {"[4096,4096]@x (matvec)", 4096, 1, 4096, true},
    };
    const int ncpu = (int)sysconf(_SC_NPROCESSORS_ONLN);
    double load[3] = {0, 0, 0};
    FILE *lf = fopen("/proc/loadavg", "r");     /* other work on the machine skews the 2-thread rows */
    if (lf) { if (fscanf(lf, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1; fclose(lf); }
    printf("kiln isa: %s, OpenBLAS core: %s (OPENBLAS_CORETYPE=%s), %d online cpus, median of >= %d runs, "
           "load average before: %.2f\n\n",
           kn_cpu()->isa == KN_ISA_AVX512 ? "avx512" : kn_cpu()->isa == KN_ISA_AVX2 ? "avx2" : "scalar",
           openblas_get_corename(), getenv("OPENBLAS_CORETYPE"), ncpu, reps, load[0]);
    printf("| shape | threads | kiln GFLOP/s | OpenBLAS GFLOP/s | kiln/OpenBLAS |\n");
    printf("|---|---:|---:|---:|---:|\n");
    fflush(stdout);
    int worst = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const shape *s = &shapes[si];
        float *A = randm(s->M * s->K), *B = randm(s->K * s->N);
        float *C1 = randm(s->M * s->N), *C2 = randm(s->M * s->N);
        const double flops = 2.0 * s->M * s->N * s->K;
        int r = (reps + ROUNDS - 1) / ROUNDS;     /* per round */
        for (int nt = 1; nt <= 2; nt++) {
            kn_pool_set_threads(nt);
            kn_sgemm_set_max_threads(nt);
            openblas_set_num_threads(nt);
            /* rounds alternate the libraries so that load from other processes,
             * which comes and goes, hits both alike */
            double tkv[MAXT], tbv[MAXT];
            int nk = 0, nb = 0;
            for (int round = 0; round < ROUNDS; round++) {
                time_block(run_kiln, s, A, B, C1, r, tkv, &nk);
                time_block(run_blas, s, A, B, C2, r, tbv, &nb);
            }
            const double tk = median(tkv, nk), tb = median(tbv, nb);
            double num = 0, den = 0;
            for (int64_t i = 0; i < s->M * s->N; i++) {
                num += (double)(C1[i] - C2[i]) * (C1[i] - C2[i]);
                den += (double)C2[i] * C2[i];
            }
            const double rel = sqrt(num / (den > 0 ? den : 1));
            if (!(rel < 1e-4)) { worst = 1; fprintf(stderr, "bench_gemm: %s: kiln and OpenBLAS differ (rel %g)\n", s->name, rel); }
            printf("| %s | %d | %.1f | %.1f | %.2f |\n", s->name, nt, flops / tk * 1e-9, flops / tb * 1e-9, tb / tk);
            fflush(stdout);
        }
        free(A); free(B); free(C1); free(C2);
    }
    if (ncpu < 2) printf("\n(only %d cpu online: the 2-thread rows share one core)\n", ncpu);
    return worst;
}
