/* dev/cpu/matmul_layout.c: does storing a weight in the layout its matmul
 * reads help on the CPU backend? (docs/COMPILER.md, "Parameters read
 * transposed": the measurement behind not doing it.)
 *
 * y[M,N] = x[M,K] @ W^T with W a [N,K] parameter (kn_linear's layout: the
 * right operand is a transposed view, unit stride along K) against the same
 * product with a contiguous [K,N] copy of W^T (what a plan-held transposed
 * copy would give). f32 and f16 weights, M = 1 (decode), 16, 128 (prefill).
 * Median of 7 blocks of runs of >= 50 ms each, blocks of the two layouts
 * alternating.
 *
 *   cc -O2 -Iinclude -Isrc dev/cpu/matmul_layout.c build/libkiln.a -lm -lpthread -lz -o /tmp/ml && /tmp/ml
 */
#include "kiln.h"
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmpd(const void *a, const void *b) { double x = *(const double *)a, y = *(const double *)b; return (x > y) - (x < y); }

/* seconds per run of plan p: median of 7 blocks */
static double block(kn_plan *p) {
    int reps = 0;
    double t0 = now();
    do { kn_plan_run(p); reps++; } while (now() - t0 < 0.05);
    return (now() - t0) / reps;
}

/* a leaf holding t's value */
static kn_tensor *leaf(kn_ctx *ctx, kn_tensor *t) {
    size_t n = (size_t)kn_numel(t) * 4;
    void *b = malloc(n);
    kn_tensor_read(t, b, t->dtype);
    kn_tensor *l = kn_from_data(ctx, t->dtype, t->ndim, t->shape, b);
    free(b);
    return l;
}

int main(void) {
    int64_t Ms[3] = {1, 16, 128}, NK[2][2] = {{576, 576}, {1536, 576}};
    kn_dtype wts[2] = {KN_F32, KN_F16};
    printf("| weight | M | N | K | W^T view (us) | [K,N] copy (us) | copy/view |\n|---|---|---|---|---|---|---|\n");
    for (int wi = 0; wi < 2; wi++)
    for (int s = 0; s < 2; s++)
    for (int mi = 0; mi < 3; mi++) {
        int64_t M = Ms[mi], N = NK[s][0], K = NK[s][1];
        kn_ctx *ctx = kn_ctx_new(NULL);
        /* leaves (plans recompute op nodes): host copies of random values */
        kn_tensor *x = leaf(ctx, kn_randn(ctx, KN_F32, 2, (int64_t[2]){M, K}, 1));
        kn_tensor *w = leaf(ctx, kn_cast(ctx, kn_randn(ctx, KN_F32, 2, (int64_t[2]){N, K}, 2), wts[wi]));
        kn_tensor *wt = leaf(ctx, kn_contiguous(ctx, kn_transpose(ctx, w, 0, 1)));    /* [K,N] */
        kn_tensor *ya = kn_matmul(ctx, x, kn_transpose(ctx, w, 0, 1));
        kn_tensor *yb = kn_matmul(ctx, x, wt);
        kn_plan *pa = kn_plan_new(ctx, 1, &ya, NULL), *pb = kn_plan_new(ctx, 1, &yb, NULL);
        if (!pa || !pb) { fprintf(stderr, "plan: %s\n", kn_last_error()); return 1; }
        double ta[7], tb[7];
        block(pa); block(pb);
        for (int r = 0; r < 7; r++) { ta[r] = block(pa); tb[r] = block(pb); }
        qsort(ta, 7, sizeof *ta, cmpd); qsort(tb, 7, sizeof *tb, cmpd);
        printf("| %s | %lld | %lld | %lld | %.1f | %.1f | %.2f |\n", wi ? "f16" : "f32", (long long)M, (long long)N, (long long)K,
               ta[3] * 1e6, tb[3] * 1e6, tb[3] / ta[3]);
        fflush(stdout);
        kn_plan_free(pa); kn_plan_free(pb);
        kn_ctx_free(ctx);
    }
    return 0;
}
