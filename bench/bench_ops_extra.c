/* bench_ops_extra.c: CPU wall time of conv3d (forward, and forward +
 * backward), sort and bilinear interpolate through plans, median of N runs
 * (scripts/bench_ops_extra_torch.py times the same in PyTorch; run the two
 * in alternating rounds, docs/PERF.md "conv3d, sort, interpolate").
 *
 * usage: bench_ops_extra [RUNS]   (KN_THREADS sets the threads)
 */
#include "kiln.h"
#include "kn_bench.h"
#include <stdio.h>
#include <stdlib.h>

static double median_ms(kn_plan *p, int runs) {
    double *t = malloc(sizeof(double) * (size_t)runs);
    kn_plan_run(p);                                   /* warm-up */
    for (int i = 0; i < runs; i++) {
        double t0 = kn_bench_now();
        kn_plan_run(p);
        t[i] = (kn_bench_now() - t0) * 1e3;
    }
    qsort(t, (size_t)runs, sizeof(double), kn_bench_cmp_double);
    double m = t[runs / 2];
    free(t);
    return m;
}
static kn_tensor *rnd(kn_ctx *ctx, int nd, const int64_t *sh, bool grad) {
    kn_tensor *x = kn_empty(ctx, KN_F32, nd, sh);
    int64_t n = kn_numel(x);
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = (float)(rand() / (double)RAND_MAX * 2 - 1);
    kn_tensor_write(x, v, KN_F32);
    free(v);
    if (grad) kn_set_requires_grad(x, true);
    return x;
}

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : 9;
    if (runs < 1) runs = 1;
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_cpu()});
    const int s1[3] = {1, 1, 1};
    /* conv3d x [2,16,16,32,32], w [32,16,3,3,3], padding 1 */
    kn_tensor *x = rnd(ctx, 5, (int64_t[]){2, 16, 16, 32, 32}, true), *w = rnd(ctx, 5, (int64_t[]){32, 16, 3, 3, 3}, true);
    kn_tensor *y = kn_conv3d(ctx, x, w, NULL, s1, s1, s1, 1);
    kn_plan *p = kn_plan_new(ctx, 1, &y, NULL);
    if (!p) { fprintf(stderr, "%s\n", kn_last_error()); return 1; }
    printf("conv3d fwd [2,16,16,32,32] * [32,16,3,3,3] p1: %.2f ms\n", median_ms(p, runs));
    kn_plan_free(p);
    kn_tensor *g[2];
    kn_tensor *loss = kn_sum_all(ctx, y);
    if (kn_gradients(ctx, 1, &loss, NULL, 2, (kn_tensor *[]){x, w}, g)) { fprintf(stderr, "%s\n", kn_last_error()); return 1; }
    kn_tensor *outs[3] = {loss, g[0], g[1]};
    p = kn_plan_new(ctx, 3, outs, NULL);
    printf("conv3d fwd+bwd (dx, dw): %.2f ms\n", median_ms(p, runs));
    kn_plan_free(p);
    /* sort [256, 4096] along the last dim, values and indices */
    kn_tensor *s = rnd(ctx, 2, (int64_t[]){256, 4096}, false), *ix;
    kn_tensor *sv = kn_sort(ctx, s, -1, false, &ix);
    p = kn_plan_new(ctx, 2, (kn_tensor *[]){sv, ix}, NULL);
    printf("sort [256,4096] dim -1: %.2f ms\n", median_ms(p, runs));
    kn_plan_free(p);
    /* bilinear [8,32,64,64] -> [128,128] */
    kn_tensor *im = rnd(ctx, 4, (int64_t[]){8, 32, 64, 64}, false);
    kn_tensor *up = kn_interpolate(ctx, im, (int64_t[]){128, 128}, NULL, KN_INTERP_LINEAR, false);
    p = kn_plan_new(ctx, 1, &up, NULL);
    printf("bilinear [8,32,64,64] -> 128x128: %.2f ms\n", median_ms(p, runs));
    kn_plan_free(p);
    kn_ctx_free(ctx);
    return 0;
}
