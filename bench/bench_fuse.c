/* bench_fuse.c: fused kernels against the memory they must move.
 *
 * y = gelu(x * w + b) + r over N f32 elements (w, b: one row of 1024,
 * broadcast), planned with fusion (one generated kernel: reads x and r,
 * writes y) and without (four hand kernels, each a full pass), next to a
 * plain copy of N elements (the bandwidth bound: read N + write N). Rounds
 * alternate fused / unfused / copy; medians. Prints GB/s as bytes the
 * kernel must move (fused: 3N x 4 bytes) over time, and the ratio to copy.
 *
 *   build/bench/bench_fuse [N_MILLIONS] [ROUNDS]     env KN_BACKEND=cpu|cuda
 * Defaults: 16M elements on the CPU, 64M on a GPU; 7 rounds.
 *
 * Then the row normalisations with a residual add in front (an LLM block's
 * seam): y = norm(x + r) over rows of 576 and 4096, fused (one generated
 * kernel) against unfused (the add, then the hand norm kernel) and against
 * the hand norm kernel alone on a precomputed input (what the generated
 * normalisation must at least match).
 */
#include "kiln.h"
#include "kiln_backend.h"
#include "kn_bench.h"
#include <stdio.h>
#include <stdlib.h>

#define C 1024

typedef struct { kn_ctx *ctx; kn_plan *plan; kn_tensor *out; } bench_plan;

static kn_tensor *rnd(kn_ctx *ctx, int ndim, const int64_t *shape, int64_t n) {
    float *d = malloc(sizeof(float) * (size_t)n);
    if (!d) return NULL;
    for (int64_t i = 0; i < n; i++) d[i] = (float)((i * 7919) % 2001) / 1000.0f - 1.0f;
    kn_tensor *t = kn_from_data(ctx, KN_F32, ndim, shape, d);
    free(d);
    return t;
}

static bench_plan make(int64_t n, bool fuse, bool copy) {
    bench_plan b = {kn_ctx_new(NULL), NULL, NULL};
    int64_t sh[2] = {n / C, C}, row[1] = {C};
    kn_tensor *x = rnd(b.ctx, 2, sh, n);
    if (copy) b.out = kn_add_scalar(b.ctx, x, 0.0);   /* one pass: read N, write N (a hand kernel) */
    else {
        kn_tensor *w = rnd(b.ctx, 1, row, C), *bb = rnd(b.ctx, 1, row, C), *r = rnd(b.ctx, 2, sh, n);
        b.out = kn_add(b.ctx, kn_unary(b.ctx, KN_OP_GELU, kn_add(b.ctx, kn_mul(b.ctx, x, w), bb)), r);
    }
    b.plan = kn_plan_new(b.ctx, 1, &b.out, &(kn_plan_opts){.no_fuse = !fuse});
    return b;
}

/* norm(x + r) (fused or not), or norm(x) alone; rows x cols f32 */
static bench_plan make_norm(kn_op op, int64_t rows, int64_t cols, bool fuse, bool alone) {
    bench_plan b = {kn_ctx_new(NULL), NULL, NULL};
    int64_t sh[2] = {rows, cols}, row[1] = {cols};
    kn_tensor *x = rnd(b.ctx, 2, sh, rows * cols), *w = rnd(b.ctx, 1, row, cols), *bb = rnd(b.ctx, 1, row, cols);
    if (!alone) x = kn_add(b.ctx, x, rnd(b.ctx, 2, sh, rows * cols));
    b.out = op == KN_OP_RMS_NORM ? kn_rms_norm(b.ctx, x, 1, w, 1e-5)
          : op == KN_OP_LAYER_NORM ? kn_layer_norm(b.ctx, x, 1, w, bb, 1e-5) : kn_softmax(b.ctx, x, -1);
    b.plan = kn_plan_new(b.ctx, 1, &b.out, &(kn_plan_opts){.no_fuse = !fuse});
    return b;
}

static double time_run(bench_plan *b) {
    double t0 = kn_bench_now();
    if (kn_plan_run(b->plan) != KN_OK) { fprintf(stderr, "run: %s\n", kn_last_error()); exit(1); }
    return kn_bench_now() - t0;
}

int main(int argc, char **argv) {
    bool gpu = kn_backend_default()->device != KN_DEVICE_HOST;
    int64_t n = (argc > 1 ? atoll(argv[1]) : gpu ? 64 : 16) * 1000000 / C * C;
    int rounds = argc > 2 ? atoi(argv[2]) : 7;
    bench_plan f = make(n, true, false), u = make(n, false, false), c = make(n, false, true);
    if (!f.plan || !u.plan || !c.plan) { fprintf(stderr, "bench_fuse: %s\n", kn_last_error()); return 1; }
    kn_plan_stats sf, su;
    kn_plan_get_stats(f.plan, &sf);
    kn_plan_get_stats(u.plan, &su);
    time_run(&f); time_run(&u); time_run(&c);   /* warm: first touches, kernel loads */
    double *tf = malloc(sizeof(double) * (size_t)rounds), *tu = malloc(sizeof(double) * (size_t)rounds),
           *tc = malloc(sizeof(double) * (size_t)rounds);
    for (int r = 0; r < rounds; r++) { tf[r] = time_run(&f); tu[r] = time_run(&u); tc[r] = time_run(&c); }
    qsort(tf, (size_t)rounds, sizeof(double), kn_bench_cmp_double);
    qsort(tu, (size_t)rounds, sizeof(double), kn_bench_cmp_double);
    qsort(tc, (size_t)rounds, sizeof(double), kn_bench_cmp_double);
    double mf = tf[rounds / 2], mu = tu[rounds / 2], mc = tc[rounds / 2];
    double bytes = 3.0 * 4 * (double)n, copy_bw = 2.0 * 4 * (double)n / mc;
    printf("gelu(x*w + b) + r, %lld f32 elements, backend %s, %d threads, median of %d rounds\n", (long long)n,
           kn_backend_default()->name, kn_threads(), rounds);
    printf("| plan | kernels | ms | GB/s (3N x 4 B moved) | of copy bandwidth |\n|---|---|---|---|---|\n");
    printf("| fused | %d | %.3f | %.1f | %.2f |\n", sf.kernels, mf * 1e3, bytes / mf / 1e9, bytes / mf / copy_bw);
    printf("| unfused | %d | %.3f | %.1f | %.2f |\n", su.kernels, mu * 1e3, bytes / mu / 1e9, bytes / mu / copy_bw);
    printf("| copy (x + 0) | 1 | %.3f | %.1f (2N x 4 B) | 1.00 |\n", mc * 1e3, copy_bw / 1e9);
    kn_plan_free(f.plan); kn_plan_free(u.plan); kn_plan_free(c.plan);
    kn_ctx_free(f.ctx); kn_ctx_free(u.ctx); kn_ctx_free(c.ctx);

    printf("\nnorm(x + r), f32, median of %d rounds (ms)\n", rounds);
    printf("| op | rows x cols | fused add+norm | add, then hand norm | hand norm alone |\n|---|---|---|---|---|\n");
    static const kn_op ops[] = {KN_OP_RMS_NORM, KN_OP_LAYER_NORM, KN_OP_SOFTMAX};
    static const int64_t cols_[] = {576, 4096};
    for (int oi = 0; oi < 3; oi++)
        for (int ci = 0; ci < 2; ci++) {
            int64_t cols = cols_[ci], rows = n / 4 / cols;
            bench_plan p[3] = {make_norm(ops[oi], rows, cols, true, false), make_norm(ops[oi], rows, cols, false, false),
                               make_norm(ops[oi], rows, cols, false, true)};
            double med[3];
            for (int j = 0; j < 3; j++) {
                if (!p[j].plan) { fprintf(stderr, "bench_fuse: %s\n", kn_last_error()); return 1; }
                time_run(&p[j]);
            }
            for (int r = 0; r < rounds; r++) { tf[r] = time_run(&p[0]); tu[r] = time_run(&p[1]); tc[r] = time_run(&p[2]); }
            qsort(tf, (size_t)rounds, sizeof(double), kn_bench_cmp_double);
            qsort(tu, (size_t)rounds, sizeof(double), kn_bench_cmp_double);
            qsort(tc, (size_t)rounds, sizeof(double), kn_bench_cmp_double);
            med[0] = tf[rounds / 2]; med[1] = tu[rounds / 2]; med[2] = tc[rounds / 2];
            printf("| %s | %lld x %lld | %.3f | %.3f | %.3f |\n", kn_op_name(ops[oi]), (long long)rows, (long long)cols,
                   med[0] * 1e3, med[1] * 1e3, med[2] * 1e3);
            for (int j = 0; j < 3; j++) { kn_plan_free(p[j].plan); kn_ctx_free(p[j].ctx); }
        }
    free(tf); free(tu); free(tc);
    return 0;
}
