/* bench_quant.c: quantized matrix-vector product speed vs memory bandwidth.
 *
 * For each weight type: y = W x with W 4096 x 4096 (kn_quant_matvec_rows, the
 * activation already quantized to the vec_dot type, as in decoding; then
 * the same with 16-bit (Q16) activations, the default of the matmuls, and
 * for the packed types (Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K) through the 16-row packed copy decode uses on a CPU
 * with AVX512-VNNI ("x q16 packed", backends/quant/qpack.h)), on 1 and
 * 2 threads (plain pthreads, rows split in halves, a barrier after each
 * product like a decoding step). W is cycled through enough copies to fill
 * KN_BENCH_MB (default 512) MiB, so weights stream from DRAM rather than
 * cache; "hot" re-reads one copy (cache-resident where it fits, so it shows
 * the kernel's compute ceiling). GB/s counts weight bytes read.
 * Reference: a STREAM-like read (16-byte vector sum) over a buffer of the same
 * size on the same thread count, timed interleaved with the matvec runs (best
 * of 5 each), and memcpy. Prints a markdown table.
 * Non-goals: batched products (GEMM), activation quantization time.
 */
#include "kn_bench.h"         /* kn_bench_now, kn_bench_cmp_double */
#include "kiln_base.h"
#include "backends/quant/quant.h"
#include "backends/quant/qpack.h"
#include "core/cpu.h"
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROWS 4096
#define COLS 4096

/* ---- jobs run by every thread between barriers ----------------------------- */

typedef struct {
    int kind;                 /* 0 matvec, 1 read, 2 memcpy */
    kn_dtype t;
    char *W; size_t mat_bytes, row_bytes; int ncopies, iters;
    const void *a; float *y;
    kn_vec_dot_fn dot;     /* Q16 activations: this dot; NULL: the 8-bit partner */
    kn_qpack_gemv_fn pk;   /* packed copy (W holds packed matrices): this kernel */
    char *buf, *dst; size_t buf_bytes;
    int nthreads;
    pthread_barrier_t bar;
    volatile uint64_t sink;
} job;
typedef struct { job *j; int id; double secs; } targ;
typedef uint64_t v2u64 __attribute__((vector_size(16)));

static void *worker(void *p) {
    targ *ta = p; job *j = ta->j;
    int id = ta->id, T = j->nthreads;
    pthread_barrier_wait(&j->bar);
    double t0 = kn_bench_now();
    if (j->kind == 0) {
        int64_t r0 = (int64_t)ROWS * id / T, r1 = (int64_t)ROWS * (id + 1) / T;
        for (int it = 0; it < j->iters; it++) {
            const char *M = j->W + (size_t)(it % j->ncopies) * j->mat_bytes;
            if (j->pk) {
                int64_t g0 = ROWS / 16 * id / T, g1 = ROWS / 16 * (id + 1) / T;
                j->pk(M, g0, g1, COLS, j->a, j->y + 16 * g0);
            } else if (j->dot) for (int64_t r = r0; r < r1; r++) j->y[r] = j->dot(COLS, M + (size_t)r * j->row_bytes, j->a);
            else kn_quant_matvec_rows(j->t, COLS, M, j->row_bytes, j->a, j->y, r0, r1);
            pthread_barrier_wait(&j->bar);
        }
    } else {
        size_t lo = j->buf_bytes / T * id / 64 * 64, hi = id == T - 1 ? j->buf_bytes : j->buf_bytes / T * (id + 1) / 64 * 64;
        for (int it = 0; it < j->iters; it++) {
            if (j->kind == 1) {
                /* 16-byte vector adds (GCC/clang vector extension, SSE2 on x86-64):
                 * no ISA flag needed and far from compute-bound */
                const v2u64 *w = (const v2u64 *)(j->buf + lo);
                size_t nw = (hi - lo) / 16;
                v2u64 s0 = {0, 0}, s1 = s0, s2 = s0, s3 = s0;
                for (size_t i = 0; i + 4 <= nw; i += 4) { s0 += w[i]; s1 += w[i + 1]; s2 += w[i + 2]; s3 += w[i + 3]; }
                s0 += s1 + s2 + s3;
                j->sink += s0[0] + s0[1];
            } else {
                memcpy(j->dst + lo, j->buf + lo, hi - lo);
            }
            pthread_barrier_wait(&j->bar);
        }
    }
    ta->secs = kn_bench_now() - t0;
    return NULL;
}

/* Runs the job on T threads; returns the slowest thread's seconds. */
static double run(job *j, int T) {
    pthread_t th[2]; targ ta[2];
    j->nthreads = T;
    pthread_barrier_init(&j->bar, NULL, (unsigned)T);
    for (int i = 1; i < T; i++) { ta[i] = (targ){j, i, 0}; pthread_create(&th[i], NULL, worker, &ta[i]); }
    ta[0] = (targ){j, 0, 0};
    worker(&ta[0]);
    double s = ta[0].secs;
    for (int i = 1; i < T; i++) { pthread_join(th[i], NULL); if (ta[i].secs > s) s = ta[i].secs; }
    pthread_barrier_destroy(&j->bar);
    return s;
}
static double best_of(job *j, int T, int reps) {
    double b = 1e30;
    for (int r = 0; r < reps; r++) { double s = run(j, T); if (s < b) b = s; }
    return b;
}

/* Best-of-reps of a matvec job and of the read job, interleaved so both see
 * the same machine load (the 2-core test machine is shared). */
static void paired(job *mv, job *rd, int T, int reps, double *mv_s, double *rd_gbs) {
    double bm = 1e30, br = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = run(rd, T); if (t < br) br = t;
        t = run(mv, T); if (t < bm) bm = t;
    }
    *mv_s = bm / mv->iters;
    *rd_gbs = (double)rd->buf_bytes * rd->iters / br / 1e9;
}

int main(void) {
    const char *e = getenv("KN_BENCH_MB");
    size_t ws = (size_t)(e ? atol(e) : 512) << 20;
    const int reps = 5;
    static const char *isa_names[] = {"scalar", "avx2", "avx512"};
    printf("# bench_quant: %dx%d matvec, working set %zu MiB, dot path %s%s, best of %d\n",
           ROWS, COLS, ws >> 20, isa_names[kn_quant_isa()],
           kn_quant_isa() == KN_ISA_AVX512 && kn_cpu()->avx512vnni ? "+vnni" : "", reps);
    FILE *la = fopen("/proc/loadavg", "r");
    char lbuf[64] = "?";
    if (la) { if (!fgets(lbuf, sizeof lbuf, la)) lbuf[0] = 0; fclose(la); lbuf[strcspn(lbuf, "\n")] = 0; }
    printf("# load average at start: %s\n\n", lbuf);

    /* bandwidth references */
    job bj; memset(&bj, 0, sizeof bj);
    bj.buf_bytes = ws;
    bj.buf = malloc(ws); bj.dst = malloc(ws);
    if (!bj.buf || !bj.dst) { fprintf(stderr, "bench_quant: cannot allocate 2 x %zu MiB; set KN_BENCH_MB lower\n", ws >> 20); return 1; }
    memset(bj.buf, 1, ws); memset(bj.dst, 2, ws);
    double cp[3];
    for (int T = 1; T <= 2; T++) { bj.kind = 2; bj.iters = 2; cp[T] = 2.0 * (double)ws / best_of(&bj, T, 3) / 1e9; }
    free(bj.dst);
    bj.kind = 1; bj.iters = 2;
    printf("memcpy (bytes copied): 1T %.1f GB/s, 2T %.1f GB/s. \"read\" columns: the STREAM-like read\n"
           "bandwidth measured interleaved with each row's matvec runs; %% = matvec GB/s / read GB/s.\n\n", cp[1], cp[2]);

    printf("| type | weight MiB | hot 1T GB/s | 1T ms | 1T GB/s | 1T read GB/s | 1T %% | 2T ms | 2T GB/s | 2T read GB/s | 2T %% |\n");
    printf("|------|-----------:|------------:|------:|--------:|-------------:|-----:|------:|--------:|-------------:|-----:|\n");
    const kn_dtype types[] = {KN_Q4_0, KN_Q8_0, KN_Q4_1, KN_Q5_0, KN_Q5_1, KN_Q4_K, KN_Q5_K, KN_Q6_K, KN_F16};
    float *x = malloc(sizeof(float) * COLS), *y = malloc(sizeof(float) * ROWS);
    float *src = malloc(sizeof(float) * COLS);
    for (int i = 0; i < COLS; i++) x[i] = (float)((i * 7919) % 2001 - 1000) / 1000.0f;
    for (size_t k = 0; k < 3 * sizeof types / sizeof types[0]; k++) {
        kn_dtype t = types[k / 3];
        int var = (int)(k % 3);                 /* each type with 8-bit, 16-bit, 16-bit packed activations */
        bool q16 = var > 0;
        kn_vec_dot_fn dot = q16 ? kn_quant_q16_dot(t) : NULL;
        kn_qpack_gemv_fn pk = var == 2 ? kn_qpack_gemv_simd(t) : NULL;
        if ((q16 && !dot) || (var == 2 && !pk)) continue;
        kn_dtype at = kn_quant_vec_dot_type(t);
        job j; memset(&j, 0, sizeof j);
        j.t = t; j.dot = dot; j.row_bytes = kn_dtype_nbytes(t, COLS); j.mat_bytes = j.row_bytes * ROWS;
        size_t file_bytes = j.mat_bytes;
        if (pk) j.mat_bytes = kn_qpack_nbytes(t, ROWS, COLS);   /* Q4_K packs 3 % larger */
        j.ncopies = (int)(ws / j.mat_bytes); if (j.ncopies < 1) j.ncopies = 1;
        j.W = malloc(j.mat_bytes * (size_t)j.ncopies);
        void *a = malloc(q16 ? kn_quant_q16_nbytes(COLS) : kn_dtype_nbytes(at, COLS));
        if (!j.W || !a) { fprintf(stderr, "bench_quant: out of memory; set KN_BENCH_MB lower\n"); return 1; }
        for (int r = 0; r < ROWS; r++) {   /* deterministic pseudo-random weights */
            for (int i = 0; i < COLS; i++) src[i] = (float)(((unsigned)(r * 2654435761u + i * 40503u) >> 8) % 2001) / 1000.0f - 1.0f;
            if (kn_quantize_row(t, src, j.W + (size_t)r * j.row_bytes, COLS) != KN_OK) { fprintf(stderr, "%s\n", kn_last_error()); return 1; }
        }
        if (pk) {                               /* pack copy 0 in place of the rows */
            char *tmp = malloc(j.mat_bytes);
            if (!tmp) { fprintf(stderr, "bench_quant: out of memory\n"); return 1; }
            kn_qpack_pack(t, j.W, j.row_bytes, ROWS, COLS, 0, ROWS / 16, tmp);
            memcpy(j.W, tmp, j.mat_bytes);
            free(tmp);
            j.pk = pk;
        }
        for (int c = 1; c < j.ncopies; c++) memcpy(j.W + (size_t)c * j.mat_bytes, j.W, j.mat_bytes);
        if (q16) kn_quantize_q16(x, a, COLS);
        else kn_quantize_row(at, x, a, COLS);
        j.a = a; j.y = y;
        j.kind = 0;
        /* hot: one copy, re-read */
        int nc = j.ncopies; j.ncopies = 1; j.iters = 20;
        double hot = (double)file_bytes * j.iters / best_of(&j, 1, reps) / 1e9;   /* GB/s of the file's bytes: the same work */
        j.ncopies = nc; j.iters = nc;
        double s1, s2, r1, r2;
        paired(&j, &bj, 1, reps, &s1, &r1);
        paired(&j, &bj, 2, reps, &s2, &r2);
        double g1 = (double)file_bytes / s1 / 1e9, g2 = (double)file_bytes / s2 / 1e9;
        printf("| %s%s | %.1f | %.1f | %.2f | %.1f | %.1f | %.0f%% | %.2f | %.1f | %.1f | %.0f%% |\n", kn_dtype_name(t),
               var == 2 ? " x q16 packed" : q16 ? " x q16" : kn_dtype_get(t)->is_quant ? " x q8" : "",
               (double)file_bytes / (1 << 20), hot, s1 * 1e3, g1, r1, 100 * g1 / r1, s2 * 1e3, g2, r2, 100 * g2 / r2);
        fflush(stdout);
        free(j.W); free(a);
    }
    free(bj.buf); free(x); free(y); free(src);
    return 0;
}
