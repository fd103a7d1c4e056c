/* bench_attn.c: kiln's sdpa on the GPU, forward and forward+backward, on
 * three training shapes (all causal):
 *   gpt2   B=8,  H=12, Hkv=12, T=1024, D=64
 *   llama  B=4,  H=32, Hkv=8,  T=2048, D=128
 *   char   B=64, H=6,  Hkv=6,  T=256,  D=64
 *   prefill B=1, H=32, Hkv=8,  T=512,  D=128  (a Llama-3-8B prompt)
 *   short128 B=16, H=16, Hkv=16, T=256, D=128
 * in bf16 (the flash kernels, backends/cuda/flash_attn.cu) and, for
 * comparison, f32 (the batched-SGEMM path). A plan holds R copies of the
 * op (each with a slightly different scale, so that no rewrite can merge
 * them); kn_plan_run ends with a stream sync, so one run / R is the time of
 * one op. Prints one line per shape and dtype:
 *   attn NAME DTYPE fwd_ms FWDBWD_ms      (medians of N runs)
 * scripts/bench_attn_torch.py runs this next to PyTorch's flash attention.
 * Usage: bench_attn [runs=7] [shape name or "all"] [bf16|f32|all]
 */
#include "kiln.h"
#include "kn_bench.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

#ifndef KN_CUDA
int main(void) { printf("bench_attn: built without CUDA (make CUDA=1)\n"); return 0; }
#else
#include "kiln_cuda.h"

typedef struct { const char *name; int B, H, Hkv, T, D; } shape;
static const shape SH[] = {{"gpt2", 8, 12, 12, 1024, 64}, {"llama", 4, 32, 8, 2048, 128}, {"char", 64, 6, 6, 256, 64},
                           {"prefill", 1, 32, 8, 512, 128}, {"short128", 16, 16, 16, 256, 128}};
enum { R = 4 };

static kn_tensor *rand_t(kn_ctx *ctx, kn_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d, unsigned seed) {
    int64_t n = a * b * c * d;
    float *h = malloc(sizeof(float) * (size_t)n);
    srand(seed);
    for (int64_t i = 0; i < n; i++) h[i] = (float)rand() / (float)RAND_MAX * 2.f - 1.f;
    kn_tensor *t = kn_empty(ctx, dt, 4, (int64_t[]){a, b, c, d});
    kn_tensor_write(t, h, KN_F32);
    free(h);
    return t;
}

/* median ms of one op over runs plan runs; NAN on failure */
static double time_plan(kn_ctx *ctx, int nout, kn_tensor **outs, int runs) {
    kn_plan *p = kn_plan_new(ctx, nout, outs, NULL);
    if (!p || kn_plan_run(p) != KN_OK || kn_plan_run(p) != KN_OK) {
        fprintf(stderr, "bench_attn: plan failed: %s\n", kn_last_error());
        kn_plan_free(p);
        return NAN;
    }
    double *t = malloc(sizeof(double) * (size_t)runs);
    for (int k = 0; k < runs; k++) {
        double t0 = kn_bench_now();
        if (kn_plan_run(p) != KN_OK) { free(t); kn_plan_free(p); return NAN; }
        t[k] = (kn_bench_now() - t0) / R * 1e3;
    }
    qsort(t, (size_t)runs, sizeof(double), kn_bench_cmp_double);
    double m = t[runs / 2];
    free(t);
    kn_plan_free(p);
    return m;
}

static void bench_one(kn_backend *be, const shape *s, kn_dtype dt, int runs) {
    double scale = 1.0 / sqrt((double)s->D), fwd, fb;
    {
        kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
        kn_tensor *q = rand_t(ctx, dt, s->B, s->H, s->T, s->D, 1), *k = rand_t(ctx, dt, s->B, s->Hkv, s->T, s->D, 2);
        kn_tensor *v = rand_t(ctx, dt, s->B, s->Hkv, s->T, s->D, 3), *outs[R];
        for (int r = 0; r < R; r++) outs[r] = kn_sdpa(ctx, q, k, v, true, scale * (1 + 1e-6 * r));
        fwd = time_plan(ctx, R, outs, runs);
        kn_ctx_free(ctx);
    }
    {
        kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
        kn_tensor *q = rand_t(ctx, dt, s->B, s->H, s->T, s->D, 1), *k = rand_t(ctx, dt, s->B, s->Hkv, s->T, s->D, 2);
        kn_tensor *v = rand_t(ctx, dt, s->B, s->Hkv, s->T, s->D, 3), *g = rand_t(ctx, dt, s->B, s->H, s->T, s->D, 4);
        kn_tensor *leaf[3] = {q, k, v}, *outs[4 * R];
        for (int i = 0; i < 3; i++) kn_set_requires_grad(leaf[i], true);
        int n = 0;
        for (int r = 0; r < R; r++) {
            kn_tensor *y = kn_sdpa(ctx, q, k, v, true, scale * (1 + 1e-6 * r)), *gr[3] = {0};
            if (!y || kn_gradients(ctx, 1, &y, &g, 3, leaf, gr) != KN_OK) { fprintf(stderr, "bench_attn: %s\n", kn_last_error()); break; }
            outs[n++] = y;
            for (int i = 0; i < 3; i++) outs[n++] = gr[i];
        }
        fb = n == 4 * R ? time_plan(ctx, n, outs, runs) : NAN;
        kn_ctx_free(ctx);
    }
    printf("attn %s %s %.4f %.4f\n", s->name, kn_dtype_name(dt), fwd, fb);
    fflush(stdout);
}

int main(int argc, char **argv) {
    int runs = argc > 1 ? atoi(argv[1]) : 7;
    const char *which = argc > 2 ? argv[2] : "all", *dts = argc > 3 ? argv[3] : "bf16";
    if (runs < 1) runs = 1;
    kn_backend *be = kn_backend_cuda();
    if (!be) { printf("bench_attn: no GPU (%s)\n", kn_last_error()); return 0; }
    for (size_t i = 0; i < sizeof SH / sizeof SH[0]; i++) {
        if (strcmp(which, "all") && strcmp(which, SH[i].name)) continue;
        if (!strcmp(dts, "bf16") || !strcmp(dts, "all")) bench_one(be, &SH[i], KN_BF16, runs);
        if (!strcmp(dts, "f32") || !strcmp(dts, "all")) bench_one(be, &SH[i], KN_F32, runs);
    }
    return 0;
}
#endif
