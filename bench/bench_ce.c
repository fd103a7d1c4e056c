/* bench_ce.c: the fused cross-entropy (CROSS_ENTROPY + CROSS_ENTROPY_BWD)
 * against the composite (KN_CE_COMPOSITE=1: cast to f32, log_softmax,
 * gather, masks and their gradients), forward + backward, on the default
 * backend (KN_BACKEND=cuda for the GPU).
 *
 * Two graphs, each built fused and composite, timed as one plan each
 * (median of ROUNDS runs; a plan run ends with a stream sync):
 *   loss        x bf16 [N,C] (a leaf), mean cross-entropy of cast(x, f32)
 *               and its gradient w.r.t. x (bf16): what the classifier's
 *               loss costs in bf16 training;
 *   classifier  logits = h @ W^T (h [N,D], W [C,D], bf16), then the same
 *               loss, and the gradients w.r.t. h and W: adds the two
 *               gradient matmuls, which take the tensor-core path only when
 *               dlogits' row stride is a multiple of 8 (the fused node's
 *               [N, Cp] storage).
 * The fused and composite results are compared (relative error).
 *
 *   KN_BACKEND=cuda build-cuda/bench/bench_ce [N C D]    (default 8192 50257 768;
 *   on the CPU the default is 64 50257 768)
 *
 * Letters: N rows (tokens), C classes (vocabulary), D model width.
 */
#include "kn_bench.h"
#include "kiln.h"
#include "kiln_nn.h"
#include "core/env.h"          /* kn_env_get, kn_env_reload (KN_CE_COMPOSITE, KN_BACKEND) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ROUNDS 7

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}
static float *rnd(int64_t n, float s) {
    float *v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) v[i] = s * frand();
    return v;
}

typedef struct { double ms, loss; float *g0, *g1; int64_t n0, n1; } result;

/* one graph (classifier: with the matmuls), fused or composite; NULL data: skip */
static int run(bool classifier, bool composite, int64_t N, int64_t C, int64_t D, const float *xd, const float *hd,
               const float *wd, const int64_t *td, result *r) {
    memset(r, 0, sizeof *r);
    if (composite) setenv("KN_CE_COMPOSITE", "1", 1); else unsetenv("KN_CE_COMPOSITE");
    kn_env_reload();
    kn_ctx *ctx = kn_ctx_new(NULL);
    if (!ctx) { fprintf(stderr, "context: %s\n", kn_last_error()); return 1; }
    kn_tensor *a, *b = NULL, *logits;
    if (!classifier) {
        a = kn_empty(ctx, KN_BF16, 2, (int64_t[]){N, C});
        kn_tensor_write(a, xd, KN_F32);
        kn_set_requires_grad(a, true);
        logits = a;
    } else {
        a = kn_empty(ctx, KN_BF16, 2, (int64_t[]){N, D});
        b = kn_empty(ctx, KN_BF16, 2, (int64_t[]){C, D});
        kn_tensor_write(a, hd, KN_F32);
        kn_tensor_write(b, wd, KN_F32);
        kn_set_requires_grad(a, true);
        kn_set_requires_grad(b, true);
        logits = kn_linear(ctx, a, b, NULL);
    }
    kn_tensor *t = kn_from_data(ctx, KN_I64, 1, (int64_t[]){N}, td);
    kn_tensor *loss = kn_cross_entropy(ctx, kn_cast(ctx, logits, KN_F32), t, NULL);
    unsetenv("KN_CE_COMPOSITE");
    kn_env_reload();
    if (!loss || kn_backward(ctx, loss) != KN_OK) { fprintf(stderr, "graph: %s\n", kn_last_error()); kn_ctx_free(ctx); return 1; }
    kn_tensor *outs[3] = {loss, kn_grad(a), b ? kn_grad(b) : NULL};
    int nout = b ? 3 : 2;
    kn_plan *p = kn_plan_new(ctx, nout, outs, NULL);
    if (!p || kn_plan_run(p) != KN_OK) { fprintf(stderr, "plan: %s\n", kn_last_error()); kn_plan_free(p); kn_ctx_free(ctx); return 1; }
    double ts[ROUNDS];
    for (int k = 0; k < ROUNDS; k++) {
        double t0 = kn_bench_now();
        if (kn_plan_run(p) != KN_OK) { fprintf(stderr, "run: %s\n", kn_last_error()); break; }
        ts[k] = kn_bench_now() - t0;
    }
    qsort(ts, ROUNDS, sizeof *ts, kn_bench_cmp_double);
    r->ms = 1e3 * ts[ROUNDS / 2];
    float lv = NAN;
    kn_tensor_read(loss, &lv, KN_F32);
    r->loss = lv;
    r->n0 = kn_numel(outs[1]);
    r->g0 = malloc(sizeof(float) * (size_t)r->n0);
    kn_tensor_read(outs[1], r->g0, KN_F32);
    if (b) {
        r->n1 = kn_numel(outs[2]);
        r->g1 = malloc(sizeof(float) * (size_t)r->n1);
        kn_tensor_read(outs[2], r->g1, KN_F32);
    }
    printf("  %-10s %-9s %9.3f ms  loss %.6f  (%d kernels)\n", classifier ? "classifier" : "loss", composite ? "composite" : "fused",
           r->ms, r->loss, kn_plan_n_kernels(p));
    kn_plan_free(p);
    kn_ctx_free(ctx);
    return 0;
}

static double rel(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) { double d = (double)a[i] - b[i]; num += d * d; den += (double)b[i] * b[i]; }
    return sqrt(num / (den > 0 ? den : 1));
}

int main(int argc, char **argv) {
    const char *be = kn_env_get()->backend;
    bool gpu = be && !strcmp(be, "cuda");
    int64_t N = argc > 1 ? atoll(argv[1]) : gpu ? 8192 : 64, C = argc > 2 ? atoll(argv[2]) : 50257,
            D = argc > 3 ? atoll(argv[3]) : 768;
    if (N < 1 || C < 1 || D < 1) { fprintf(stderr, "usage: bench_ce [N C D]\n"); return 2; }
    printf("bench_ce: backend %s, N %lld, C %lld, D %lld (bf16), median of %d runs\n", be ? be : "cpu", (long long)N,
           (long long)C, (long long)D, ROUNDS);
    float *x = rnd(N * C, 4.f), *h = rnd(N * D, 1.f), *w = rnd(C * D, 0.05f);
    int64_t *t = malloc(sizeof(int64_t) * (size_t)N);
    for (int64_t i = 0; i < N; i++) t[i] = (int64_t)((frand() * 0.5f + 0.5f) * (float)(C - 1));
    int rc = 0;
    for (int cl = 0; cl < 2 && !rc; cl++) {
        result f = {0}, c = {0};
        rc = run(cl, false, N, C, D, x, h, w, t, &f) || run(cl, true, N, C, D, x, h, w, t, &c);
        if (!rc) {
            printf("  %-10s speedup %.2fx; fused vs composite: loss %.3g, grad rel err %.3g", cl ? "classifier" : "loss",
                   c.ms / f.ms, fabs(f.loss - c.loss) / fabs(c.loss), rel(f.g0, c.g0, f.n0));
            if (cl) printf(", dW rel err %.3g", rel(f.g1, c.g1, f.n1));
            printf("\n");
        }
        free(f.g0); free(f.g1); free(c.g0); free(c.g1);
    }
    free(x); free(h); free(w); free(t);
    return rc;
}
