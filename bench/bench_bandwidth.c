/* bench_bandwidth.c: memory bandwidth of the f32 row kernels (src/backends/cpu/vec.h)
 * against copy bandwidth measured in the same run.
 *
 *   build/bench/bench_bandwidth [MiB per tensor, default 64] [reps, default 7]
 *
 * For each kernel and 1 and 2 threads (plain pthreads, rows split evenly) it
 * prints the median over reps of GB/s = (bytes read + bytes written) / time,
 * counting each tensor once (x read, y written; add also reads b; the norm
 * weights are one row and not counted), and the ratio to memcpy at the same
 * thread count. Target for large tensors: >= 0.8x copy. The cpu column is the
 * process CPU time over (wall time x threads) across the reps: well below 1
 * means other processes took the cores and the row is not a clean figure.
 * Env KN_CPU=scalar|avx2 picks the SIMD path as everywhere else.
 *
 * Non-goals: cache-resident sizes (see the GEMM bench for compute-bound work).
 */
#include "kn_bench.h"         /* kn_bench_now, kn_bench_cmp_double */
#include "backends/cpu/vec.h"   // defines: kn_vec_*
#include "core/cpu.h"           // defines: kn_cpu
#include <pthread.h>
#include <sys/resource.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef enum { OP_MEMCPY, OP_COPY, OP_ADD, OP_SOFTMAX, OP_LAYERNORM, OP_SILU } op_kind;

typedef struct {
    op_kind op;
    const char *name;
    int64_t row;        /* row length in floats                                  */
    int ntensors;       /* tensors of N floats touched (read + written)          */
} bench_case;

typedef struct {
    const bench_case *c;
    float *x, *b, *y;   /* [rows * row]                                          */
    const float *w, *bias; /* [row] layer norm weight and bias                   */
    int64_t rows;
    int ith, nth;
} job;

static void *run_part(void *arg) {
    job *j = arg;
    int64_t r0 = j->rows * j->ith / j->nth, r1 = j->rows * (j->ith + 1) / j->nth, L = j->c->row;
    float *x = j->x + r0 * L, *b = j->b + r0 * L, *y = j->y + r0 * L;
    int64_t n = (r1 - r0) * L;
    switch (j->c->op) {
    case OP_MEMCPY: memcpy(y, x, (size_t)n * sizeof(float)); break;
    case OP_COPY: kn_vec_copy(y, x, n); break;
    case OP_ADD: kn_vec_add(y, x, b, n); break;
    case OP_SILU: kn_vec_unary(KN_VU_SILU, y, x, n); break;
    case OP_SOFTMAX:
        for (int64_t r = r0; r < r1; r++, x += L, y += L) kn_vec_softmax(y, x, L);
        break;
    case OP_LAYERNORM:
        for (int64_t r = r0; r < r1; r++, x += L, y += L)
            kn_vec_layer_norm(y, x, j->w, j->bias, 1e-5f, L, NULL, NULL);
        break;
    }
    return NULL;
}

/* One timed run of case c on nth threads (the caller is thread 0). */
static double run_once(const bench_case *c, float *x, float *b, float *y, const float *w,
                       const float *bias, int64_t rows, int nth) {
    job jobs[8];
    pthread_t th[8];
    for (int i = 0; i < nth; i++) jobs[i] = (job){c, x, b, y, w, bias, rows, i, nth};
    double t0 = kn_bench_now();
    for (int i = 1; i < nth; i++) pthread_create(&th[i], NULL, run_part, &jobs[i]);
    run_part(&jobs[0]);
    for (int i = 1; i < nth; i++) pthread_join(th[i], NULL);
    return kn_bench_now() - t0;
}

/* Process CPU time (user + system), to see whether the threads had their cores. */
static double cpu_s(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec +
           (double)ru.ru_stime.tv_sec + 1e-6 * (double)ru.ru_stime.tv_usec;
}

int main(int argc, char **argv) {
    int64_t mib = argc > 1 ? atoll(argv[1]) : 64;
    int reps = argc > 2 ? atoi(argv[2]) : 7;
    if (mib < 1 || reps < 1 || reps > 99) {
        fprintf(stderr, "usage: %s [MiB per tensor >= 1] [reps 1..99]\n", argv[0]);
        return 2;
    }
    const int64_t N = mib * 1024 * 1024 / 4;
    const bench_case cases[] = {
        {OP_MEMCPY, "memcpy", 65536, 2},
        {OP_COPY, "kn_vec_copy", 65536, 2},
        {OP_ADD, "add", 65536, 3},
        {OP_SOFTMAX, "softmax", 4096, 2},
        {OP_SOFTMAX, "softmax", 32000, 2},
        {OP_LAYERNORM, "layer_norm", 768, 2},
        {OP_LAYERNORM, "layer_norm", 4096, 2},
        {OP_SILU, "silu", 65536, 2},
    };
    const int ncases = (int)(sizeof cases / sizeof cases[0]);
    float *x = aligned_alloc(64, (size_t)N * 4), *b = aligned_alloc(64, (size_t)N * 4);
    float *y = aligned_alloc(64, (size_t)N * 4), *w = malloc(32000 * 4), *bias = malloc(32000 * 4);
    if (!x || !b || !y || !w || !bias) {
        fprintf(stderr, "bench_bandwidth: out of memory for 3 x %lld MiB; pass a smaller size\n", (long long)mib);
        return 1;
    }
    for (int64_t i = 0; i < N; i++) {       /* touch every page before timing */
        x[i] = (float)((i * 7919) % 1000) * 0.01f - 5.0f;
        b[i] = 1.0f; y[i] = 0.0f;
    }
    for (int i = 0; i < 32000; i++) { w[i] = 1.0f + 0.001f * (float)(i % 7); bias[i] = 0.01f * (float)(i % 5); }

    static const char *isa_name[] = {"scalar", "avx2", "avx512"};
    printf("bench_bandwidth: %lld MiB per tensor, %d reps (median), path %s\n\n", (long long)mib, reps,
           isa_name[kn_vec_isa()]);
    printf("| kernel | row | threads | GB/s | x memcpy | cpu |\n|---|---:|---:|---:|---:|---:|\n");
    double copy_gbs[3] = {0, 0, 0};
    for (int nth = 1; nth <= 2; nth++) {
        for (int k = 0; k < ncases; k++) {
            const bench_case *c = &cases[k];
            int64_t rows = N / c->row;
            double bytes = (double)c->ntensors * (double)(rows * c->row) * 4.0, t[99];
            run_once(c, x, b, y, w, bias, rows, nth);                /* warm-up */
            double c0 = cpu_s(), wall = 0;
            for (int r = 0; r < reps; r++) { t[r] = run_once(c, x, b, y, w, bias, rows, nth); wall += t[r]; }
            double cpu = (cpu_s() - c0) / (wall * nth);
            qsort(t, (size_t)reps, sizeof t[0], kn_bench_cmp_double);
            double gbs = bytes / t[reps / 2] * 1e-9;
            if (c->op == OP_MEMCPY) copy_gbs[nth] = gbs;
            printf("| %s | %lld | %d | %.1f | %.2f | %.2f |\n", c->name, (long long)c->row, nth, gbs,
                   gbs / copy_gbs[nth], cpu);
            fflush(stdout);
        }
    }
    free(x); free(b); free(y); free(w); free(bias);
    return 0;
}
