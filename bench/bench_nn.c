/* bench_nn.c: the fast CPU nn kernels (src/backends/cpu/: cpu_attention.c,
 * cpu_norm_softmax.c, cpu_conv.c) against the reference kernels, one node at
 * a time.
 *
 * Each case builds a kn_exec by hand (a node with its params and kn_tview
 * operands over malloc'd f32 data) and times kn_cpu_fast() and the
 * reference's kn__ref_compute() on it: median of several runs after a warm-up,
 * the reference run fewer times (it is slow). Cases: attention decode (Tq = 1,
 * Tk = 512 / 2048, 9 query heads over 3 key/value heads, D = 64: SmolLM-135M
 * shapes), RMSNorm over 576, RoPE on [9, T, 64], and MNIST-like conv2d
 * forward. Threads: the CPU pool (KN_THREADS). Prints a markdown table.
 * Non-goals: whole-model timing (kiln bench), the GEMM itself (bench_gemm).
 */
#include "kn_bench.h"         /* kn_bench_now, kn_bench_cmp_double */
#include "backends/backend_impl.h"
#include "backends/cpu/cpu_impl.h"
#include "core/cpu.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* contiguous f32 view of shape s, random values in [-1, 1) */
static kn_tview mk(int nd, const int64_t *s) {
    kn_tview v;
    memset(&v, 0, sizeof v);
    v.dtype = KN_F32; v.ndim = nd;
    int64_t n = 1;
    for (int d = nd - 1; d >= 0; d--) { v.ne[d] = s[d]; v.st[d] = n; n *= s[d]; }
    float *p = malloc(sizeof(float) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) p[i] = (float)rand() / (float)RAND_MAX * 2.0f - 1.0f;
    v.data = p;
    return v;
}

/* median seconds of `reps` runs of one backend on e (after one warm-up) */
static double time_it(const kn_exec *e, bool fast, int reps) {
    double t[64];
    if (reps > 64) reps = 64;
    for (int r = -1; r < reps; r++) {
        double t0 = kn_bench_now();
        if (fast) { if (!kn_cpu_fast(e)) return -1; }
        else kn__ref_compute(kn_backend_ref(), e);
        if (r >= 0) t[r] = kn_bench_now() - t0;
    }
    qsort(t, (size_t)reps, sizeof(double), kn_bench_cmp_double);
    return t[reps / 2];
}

static void row(const char *name, const kn_exec *e, int fast_reps, int ref_reps) {
    double tf = time_it(e, true, fast_reps), tr = time_it(e, false, ref_reps);
    if (tf < 0) { printf("| %-36s | (no fast path) | %10.1f | |\n", name, tr * 1e6); return; }
    printf("| %-36s | %10.1f | %10.1f | %7.1fx |\n", name, tf * 1e6, tr * 1e6, tr / tf);
}
static void free_views(kn_exec *e) {
    free(e->dst.data);
    for (int i = 0; i < e->nsrc; i++) free(e->src[i].data);
}

int main(void) {
    srand(1);
    printf("# nn kernels: fast CPU path vs reference (%d threads, ISA level %d)\n\n",
           kn_threads(), (int)kn_cpu()->isa);
    printf("| %-36s | %10s | %10s | %8s |\n", "case", "fast us", "ref us", "speedup");
    printf("|%s|%s|%s|%s|\n", "--------------------------------------", "------------", "------------", "----------");

    /* attention decode */
    int64_t Tks[2] = {512, 2048};
    for (int i = 0; i < 2; i++) {
        kn_tensor node; memset(&node, 0, sizeof node);
        node.op = KN_OP_SDPA; node.p.sdpa.causal = true; node.p.sdpa.scale = 0.125;
        int64_t q[4] = {1, 9, 1, 64}, kv[4] = {1, 3, Tks[i], 64};
        kn_exec e; memset(&e, 0, sizeof e);
        e.node = &node; e.nsrc = 3;
        e.src[0] = mk(4, q); e.src[1] = mk(4, kv); e.src[2] = mk(4, kv); e.dst = mk(4, q);
        char name[64];
        snprintf(name, sizeof name, "sdpa decode H9/3 D64 Tk=%lld", (long long)Tks[i]);
        row(name, &e, 50, 3);
        free_views(&e);
    }
    /* attention over blocks of query rows: the tiny GPT's training shape
     * (forward and backward) and a SmolLM-135M prefill of 512 tokens */
    struct { int64_t B, Hq, Hkv, T, D; bool bwd; } at[] = {
        {8, 4, 4, 64, 32, false}, {8, 4, 4, 64, 32, true}, {1, 9, 3, 512, 64, false}, {1, 9, 3, 512, 64, true}};
    for (size_t i = 0; i < sizeof at / sizeof at[0]; i++) {
        kn_tensor node; memset(&node, 0, sizeof node);
        node.op = at[i].bwd ? KN_OP_SDPA_BWD : KN_OP_SDPA; node.p.sdpa.causal = true;
        node.p.sdpa.scale = 1 / sqrt((double)at[i].D);
        int64_t q[4] = {at[i].B, at[i].Hq, at[i].T, at[i].D}, kv[4] = {at[i].B, at[i].Hkv, at[i].T, at[i].D};
        int64_t grads[1] = {(at[i].B * at[i].Hq + 2 * at[i].B * at[i].Hkv) * at[i].T * at[i].D};
        kn_exec e; memset(&e, 0, sizeof e);
        e.node = &node; e.nsrc = at[i].bwd ? 4 : 3;
        e.src[0] = mk(4, q); e.src[1] = mk(4, kv); e.src[2] = mk(4, kv);
        if (at[i].bwd) { e.src[3] = mk(4, q); e.dst = mk(1, grads); } else e.dst = mk(4, q);
        char name[64];
        snprintf(name, sizeof name, "sdpa%s B%lld H%lld/%lld T%lld D%lld", at[i].bwd ? "_bwd" : "", (long long)at[i].B,
                 (long long)at[i].Hq, (long long)at[i].Hkv, (long long)at[i].T, (long long)at[i].D);
        row(name, &e, 30, 2);
        free_views(&e);
    }
    /* rms_norm over 576 (decode: 1 row; prefill: 512 rows) */
    int64_t rs[2] = {1, 512};
    for (int i = 0; i < 2; i++) {
        kn_tensor node, w; memset(&node, 0, sizeof node); memset(&w, 0, sizeof w);
        node.op = KN_OP_RMS_NORM; node.p.norm.eps = 1e-5; node.p.norm.n_norm = 1;
        node.src[1] = &w;                 /* the weight slot is present */
        int64_t xs[2] = {rs[i], 576}, ws[1] = {576};
        kn_exec e; memset(&e, 0, sizeof e);
        e.node = &node; e.nsrc = 2;
        e.src[0] = mk(2, xs); e.src[1] = mk(1, ws); e.dst = mk(2, xs);
        char name[64];
        snprintf(name, sizeof name, "rms_norm [%lld, 576]", (long long)rs[i]);
        row(name, &e, 50, 5);
        free_views(&e);
    }
    /* rope on [9, T, 64] */
    int64_t ts[2] = {1, 512};
    for (int i = 0; i < 2; i++) {
        kn_tensor node; memset(&node, 0, sizeof node);
        node.op = KN_OP_ROPE; node.p.rope.theta = 10000; node.p.rope.n_rot = 64; node.p.rope.neox = true;
        node.p.rope.freq_scale = 1;
        int64_t xs[3] = {9, ts[i], 64};
        kn_exec e; memset(&e, 0, sizeof e);
        e.node = &node; e.nsrc = 2;
        e.src[0] = mk(3, xs); e.dst = mk(3, xs);
        int32_t *pos = malloc(sizeof(int32_t) * (size_t)ts[i]);
        for (int64_t t = 0; t < ts[i]; t++) pos[t] = (int32_t)(t + 100);
        e.src[1] = (kn_tview){pos, KN_I32, 1, {ts[i]}, {1}};
        char name[64];
        snprintf(name, sizeof name, "rope neox [9, %lld, 64]", (long long)ts[i]);
        row(name, &e, 50, 5);
        free_views(&e);
    }
    /* MNIST-like conv2d forward: batch 64, 1->32 channels 28x28 k3 p1; 32->64 on 14x14 */
    struct { int64_t x[4], w[4]; } cv[2] = {{{64, 1, 28, 28}, {32, 1, 3, 3}}, {{64, 32, 14, 14}, {64, 32, 3, 3}}};
    for (int i = 0; i < 2; i++) {
        kn_tensor node, b; memset(&node, 0, sizeof node); memset(&b, 0, sizeof b);
        node.op = KN_OP_CONV2D; node.p.conv.groups = 1; node.src[2] = &b;
        for (int k = 0; k < 2; k++) { node.p.conv.stride[k] = 1; node.p.conv.padding[k] = 1; node.p.conv.dilation[k] = 1; }
        int64_t ys[4] = {cv[i].x[0], cv[i].w[0], cv[i].x[2], cv[i].x[3]}, bs[1] = {cv[i].w[0]};
        kn_exec e; memset(&e, 0, sizeof e);
        e.node = &node; e.nsrc = 3;
        e.src[0] = mk(4, cv[i].x); e.src[1] = mk(4, cv[i].w); e.src[2] = mk(1, bs); e.dst = mk(4, ys);
        char name[64];
        snprintf(name, sizeof name, "conv2d [64,%lld,%lld,%lld] -> %lld k3",
                 (long long)cv[i].x[1], (long long)cv[i].x[2], (long long)cv[i].x[3], (long long)cv[i].w[0]);
        row(name, &e, 10, 1);
        free_views(&e);
    }
    return 0;
}
