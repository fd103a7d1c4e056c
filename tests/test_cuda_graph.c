/* test_cuda_graph.c: plan runs captured into CUDA graphs and replayed
 * (src/runtime/replay.c, src/backends/cuda/cuda_graph.cu).
 *
 * The same plan runs many times with changing symbol values and inputs,
 * once with graphs off (KN_CUDA_GRAPH=0) and once on; the outputs must be
 * bit-identical (a replay launches the same kernels with the same
 * arguments; only the decode attention reads its key count S from the
 * device) and the plan's counters must show the captures and replays:
 *   - decode-like attention over a KV cache sliced to S (S dynamic: one
 *     graph serves every S);
 *   - the same plus a reduction over the S rows (S is then part of the key:
 *     a graph per S value, each captured the second time it runs);
 *   - 8 query rows (the f32 attention path with pooled scratch; S keyed);
 *   - KN_CUDA_SYNC: capture refused, every run plain, same results.
 * Without CUDA or a GPU the tests SKIP.
 */
#include "kn_test.h"
#include "kiln.h"
#include "kiln_backend.h"
#include <stdint.h>

#ifndef KN_CUDA
TEST(cuda_graph) { SKIP("built without CUDA: build with `make CUDA=1` and run on a GPU machine"); }
#else
#include "kiln_cuda.h"
#include "core/env.h"   /* defines: kn_env_reload (re-read KN_* after setenv) */

static kn_backend *gpu(void) {
    static kn_backend *g;
    static bool tried;
    if (!tried) { tried = true; g = kn_backend_cuda(); }
    return g;
}
#define NEED_GPU() do { if (!gpu()) SKIP("no GPU: %s", kn_last_error()); } while (0)

static void graphs(bool on) {
    setenv("KN_CUDA_GRAPH", on ? "1" : "0", 1);
    kn_env_reload();
}

enum { H = 2, D = 16, SMAX = 64, NRUN = 40, TQ_MAX = 8 };

/* a deterministic value for (run, i) */
static float val(int run, int i, int salt) {
    uint32_t x = (uint32_t)(run * 7919 + i * 104729 + salt * 15485863);
    x ^= x >> 13; x *= 0x5bd1e995u; x ^= x >> 15;
    return (float)(x % 2001) / 1000.f - 1.f;
}

/* Builds the plan (with_sum: also a reduction over the S rows of K: 1 the
 * variance, a hand kernel that takes S as a host argument; 2 the sum, a
 * generated kernel that reads S on the device) and runs it NRUN times with
 * S from sval(run); writes every run's outputs to out
 * [NRUN][H*D + (with_sum ? H*D : 0)] and the plan's counters to st. */
static kn_status run_case_tq(int tq, int with_sum, int (*sval)(int), float *out, kn_plan_stats *st) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){.backend = gpu()});
    if (!ctx) return KN_ERR_NOMEM;
    int S = kn_sym_new(ctx, "S", SMAX);
    kn_tensor *q = kn_input(ctx, KN_F32, 4, (int64_t[]){1, H, tq, D});
    kn_tensor *kc = kn_input(ctx, KN_F32, 4, (int64_t[]){1, H, SMAX, D});
    kn_tensor *vc = kn_input(ctx, KN_F32, 4, (int64_t[]){1, H, SMAX, D});
    kn_tensor *K = kn_slice_sym(ctx, kc, 2, 0, S), *V = kn_slice_sym(ctx, vc, 2, 0, S);
    kn_tensor *outs[2];
    outs[0] = kn_mul_scalar(ctx, kn_sdpa(ctx, q, K, V, true, 0.25), 2.0);
    outs[1] = with_sum == 1 ? kn_var(ctx, K, 1, (int[]){2}, 0, false) : with_sum ? kn_sum(ctx, K, 1, (int[]){2}, false) : NULL;
    int nout = with_sum ? 2 : 1;
    kn_plan *p = outs[0] && (!with_sum || outs[1]) ? kn_plan_new(ctx, nout, outs, NULL) : NULL;
    kn_status rc = p ? KN_OK : (kn_ctx_status(ctx) ? kn_ctx_status(ctx) : KN_ERR_STATE);
    static float hq[H * TQ_MAX * D], hk[H * SMAX * D], hv[H * SMAX * D];
    int w = H * tq * D + (with_sum ? H * D : 0);
    for (int r = 0; r < NRUN && !rc; r++) {
        for (int i = 0; i < H * tq * D; i++) hq[i] = val(r, i, 1);
        for (int i = 0; i < H * SMAX * D; i++) { hk[i] = val(r, i, 2); hv[i] = val(r, i, 3); }
        if ((rc = kn_tensor_write(q, hq, KN_F32)) || (rc = kn_tensor_write(kc, hk, KN_F32)) ||
            (rc = kn_tensor_write(vc, hv, KN_F32)) || (rc = kn_sym_set(ctx, S, sval(r))) || (rc = kn_plan_run(p)) ||
            (rc = kn_tensor_read(outs[0], out + (size_t)r * w, KN_F32)))
            break;
        if (with_sum && (rc = kn_tensor_read(outs[1], out + (size_t)r * w + H * tq * D, KN_F32))) break;
    }
    kn_plan_get_stats(p, st);
    kn_plan_free(p);
    kn_ctx_free(ctx);
    return rc;
}

static kn_status run_case(int with_sum, int (*sval)(int), float *out, kn_plan_stats *st) {
    return run_case_tq(1, with_sum, sval, out, st);
}

static int s_grow(int r) { return r + 1; }                    /* decode: 1, 2, ..., NRUN */
static int s_cycle(int r) { static const int v[3] = {5, 9, 13}; return v[r % 3]; }

static int n_diff(const float *a, const float *b, size_t n) {
    int d = 0;
    for (size_t i = 0; i < n; i++) d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    return d;
}

TEST(graph_decode_attention_one_graph_for_every_s) {
    NEED_GPU();
    size_t n = (size_t)NRUN * H * D;
    float *off = malloc(sizeof(float) * n), *on = malloc(sizeof(float) * n);
    kn_plan_stats s0, s1;
    graphs(false);
    CHECK(run_case(0, s_grow, off, &s0) == KN_OK, "graphs off: %s", kn_last_error());
    graphs(true);
    CHECK(run_case(0, s_grow, on, &s1) == KN_OK, "graphs on: %s", kn_last_error());
    CHECK(s0.replays == 0 && s0.captures == 0 && s0.runs == NRUN, "off: %llu runs, %llu replays", (unsigned long long)s0.runs,
          (unsigned long long)s0.replays);
    /* run 1 plain (key seen), run 2 captured and launched, then replays */
    CHECK(s1.captures == 1 && s1.replays == NRUN - 1 && s1.runs == NRUN, "on: %llu captures, %llu replays of %llu runs",
          (unsigned long long)s1.captures, (unsigned long long)s1.replays, (unsigned long long)s1.runs);
    int d = n_diff(on, off, n);
    CHECK(d == 0, "%d of %zu outputs differ with graphs on", d, n);
    fprintf(stderr, "  decode attention, S = 1..%d: %llu capture, %llu replays, outputs bit-identical: %s\n", NRUN,
            (unsigned long long)s1.captures, (unsigned long long)s1.replays, d ? "no" : "yes");
    free(off); free(on);
}

TEST(graph_keyed_by_fixed_symbols) {
    NEED_GPU();
    size_t n = (size_t)NRUN * H * D * 2;
    float *off = malloc(sizeof(float) * n), *on = malloc(sizeof(float) * n);
    kn_plan_stats s0, s1;
    graphs(false);
    CHECK(run_case(1, s_cycle, off, &s0) == KN_OK, "graphs off: %s", kn_last_error());
    graphs(true);
    CHECK(run_case(1, s_cycle, on, &s1) == KN_OK, "graphs on: %s", kn_last_error());
    /* the variance reads S as a host argument: a graph per S, each captured at its second run */
    CHECK(s1.captures == 3 && s1.replays == NRUN - 3 && s1.graphs == 3, "on: %llu captures, %llu replays, %d graphs held",
          (unsigned long long)s1.captures, (unsigned long long)s1.replays, s1.graphs);
    int d = n_diff(on, off, n);
    CHECK(d == 0, "%d of %zu outputs differ with graphs on", d, n);
    fprintf(stderr, "  S in {5, 9, 13} read by a reduction: %llu captures, %llu replays, outputs bit-identical: %s\n",
            (unsigned long long)s1.captures, (unsigned long long)s1.replays, d ? "no" : "yes");
    free(off); free(on);
}

/* the same S cycle with a generated column sum over the S rows: the kernel
 * reads S on the device (and splits the rows over blocks), so one graph
 * serves every S, and the outputs equal the plain runs' */
TEST(graph_generated_reduction_one_graph) {
    NEED_GPU();
    size_t n = (size_t)NRUN * H * D * 2;
    float *off = malloc(sizeof(float) * n), *on = malloc(sizeof(float) * n);
    kn_plan_stats s0, s1;
    graphs(false);
    CHECK(run_case(2, s_cycle, off, &s0) == KN_OK, "graphs off: %s", kn_last_error());
    graphs(true);
    CHECK(run_case(2, s_cycle, on, &s1) == KN_OK, "graphs on: %s", kn_last_error());
    CHECK(s1.captures == 1 && s1.replays == NRUN - 1, "on: %llu captures, %llu replays", (unsigned long long)s1.captures,
          (unsigned long long)s1.replays);
    int d = n_diff(on, off, n);
    CHECK(d == 0, "%d of %zu outputs differ with graphs on", d, n);
    free(off); free(on);
}

/* 8 query rows (causal, S >= 8): the f32 attention path (batched SGEMMs
 * around a row softmax, pooled score scratch) reads S as a host argument,
 * so S is keyed; replays must still match, their scratch owned by the graph */
static int s_cycle_big(int r) { static const int v[3] = {8, 33, 64}; return v[r % 3]; }
TEST(graph_prefill_attention_keyed) {
    NEED_GPU();
    size_t n = (size_t)NRUN * H * TQ_MAX * D;
    float *off = malloc(sizeof(float) * n), *on = malloc(sizeof(float) * n);
    kn_plan_stats s0, s1;
    graphs(false);
    CHECK(run_case_tq(TQ_MAX, 0, s_cycle_big, off, &s0) == KN_OK, "graphs off: %s", kn_last_error());
    graphs(true);
    CHECK(run_case_tq(TQ_MAX, 0, s_cycle_big, on, &s1) == KN_OK, "graphs on: %s", kn_last_error());
    CHECK(s1.captures == 3 && s1.replays == NRUN - 3, "on: %llu captures, %llu replays", (unsigned long long)s1.captures,
          (unsigned long long)s1.replays);
    int d = n_diff(on, off, n);
    CHECK(d == 0, "%d of %zu outputs differ with graphs on", d, n);
    fprintf(stderr, "  8 query rows, S in {8, 33, 64}: %llu captures, %llu replays, outputs bit-identical: %s\n",
            (unsigned long long)s1.captures, (unsigned long long)s1.replays, d ? "no" : "yes");
    free(off); free(on);
}

TEST(graph_refused_runs_plainly) {
    NEED_GPU();
    size_t n = (size_t)NRUN * H * D;
    float *off = malloc(sizeof(float) * n), *on = malloc(sizeof(float) * n);
    kn_plan_stats s0, s1;
    graphs(false);
    CHECK(run_case(0, s_grow, off, &s0) == KN_OK, "graphs off: %s", kn_last_error());
    graphs(true);
    setenv("KN_CUDA_SYNC", "1", 1);   /* a wait after every node: the backend refuses to capture */
    kn_env_reload();
    CHECK(run_case(0, s_grow, on, &s1) == KN_OK, "graphs on, KN_CUDA_SYNC: %s", kn_last_error());
    unsetenv("KN_CUDA_SYNC");
    kn_env_reload();
    CHECK(s1.captures == 0 && s1.replays == 0, "%llu captures", (unsigned long long)s1.captures);
    CHECK(n_diff(on, off, n) == 0, "outputs differ after a refused capture");
    free(off); free(on);
}
#endif

KN_TEST_MAIN()
