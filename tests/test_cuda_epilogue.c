/* test_cuda_epilogue.c: matmul epilogues on the CUDA backend
 * (src/backends/cuda/cuda_ops_epilogue.cu; the pass: src/compile/epilogue.c).
 *
 * Every case of tests/kn_epitest.h whose weight the GPU takes (no block
 * types): fused and unfused plans on the GPU give the same bits where only
 * the epilogue is fused (k_epilogue rounds like the unfused nodes' kernels,
 * the GEMV adds its bias with one float add), and agree with the reference.
 * Then the decode shapes that take the GEMV's in-kernel bias (alone, and with
 * an activation and residual after it), a large product (SGEMM / split-K /
 * tensor cores), and a plan replayed from a CUDA graph (a pool scratch for
 * the cast inside a capture).
 * Without CUDA or a GPU the tests SKIP.
 *   build-cuda/tests/test_cuda_epilogue
 */
#include "kn_test.h"
#include "kiln_backend.h"
#include "core/env.h"

#ifndef KN_CUDA
TEST(cuda_epilogue) { SKIP("built without CUDA: build with `make CUDA=1` and run on a GPU machine"); }
#else
#include "kn_epitest.h"   // defines: the cases, build, run_case
#include "kiln_cuda.h"

static kn_backend *gpu(void) {
    static kn_backend *g;
    static bool tried;
    if (!tried) { tried = true; g = kn_backend_cuda(); }
    return g;
}
#define NEED_GPU() do { if (!gpu()) SKIP("no GPU: %s", kn_last_error()); } while (0)

TEST(cuda_epilogue_forms) {
    NEED_GPU();
    for (size_t i = 0; i < sizeof g_cases / sizeof g_cases[0]; i++)
        if (!quant_weight(&g_cases[i])) run_case(&g_cases[i], gpu(), true, true);
}

/* Prologues in the GEMV kernels (gemv.cu, gemv_quant.cu): taken on decode
 * rows (M = 1) for every weight type, left to fusion on other shapes */
TEST(cuda_prologues) {
    NEED_GPU();
    for (size_t i = 0; i < sizeof g_pcases / sizeof g_pcases[0]; i++) run_pcase(&g_pcases[i], gpu(), g_pcases[i].M == 1);
}

/* Past N * K = 2^22 (KN_CUDA_TUNE pro_norm, pro_silu) the GEMV is bound by
 * its weights' bytes and the prologue's own kernel runs instead: not taken
 * on the GPU (the reference backend takes it), the same results */
TEST(cuda_prologue_bound) {
    NEED_GPU();
    static const pcase big[] = {
        /* name          M  K     N     pre             w  wk res bad */
        {"norm_big_bf16", 1, 4096, 1100, KN_OP_RMS_NORM, 1, 2, 1, 0},
        {"silu_big_f32",  1, 4096, 1100, KN_OP_SILU,     0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) run_pcase(&big[i], gpu(), false);
}

/* The fallback (the product off the GEMV kernels: KN_CUDA_NO_GEMV=1): A
 * from k_prologue first, the same results */
TEST(cuda_prologue_fallback) {
    NEED_GPU();
    setenv("KN_CUDA_NO_GEMV", "1", 1);
    kn_env_reload();
    for (size_t i = 0; i < sizeof g_pcases / sizeof g_pcases[0]; i++)
        if (g_pcases[i].M == 1) run_pcase(&g_pcases[i], gpu(), true);
    unsetenv("KN_CUDA_NO_GEMV");
    kn_env_reload();
}

static const ecase g_gpu_cases[] = {
    /* name               dt      B  M    K    N     ta tb bias act           res cast    bad expect wk */
    {"gemv_bias_f32w",    F32,    0, 1,   256, 300,  0, 1, 1, N_,             0, NONE_DT, 0, 1, 0},
    {"gemv_bias_bf16w",   F32,    0, 1,   256, 300,  0, 1, 1, N_,             0, NONE_DT, 0, 1, 2},
    {"gemv_bias_gelu_res",F32,    0, 1,   256, 300,  0, 1, 1, KN_OP_GELU,     1, NONE_DT, 0, 3, 1},
    {"gemv_bias_cast",    F32,    0, 1,   256, 300,  0, 1, 1, KN_OP_SILU,     0, KN_BF16, 0, 3, 2},
    {"mixed_f32a_bf16w",  F32,    0, 33,  256, 300,  0, 1, 1, KN_OP_GELU_TANH,1, NONE_DT, 0, 3, 2},
    {"sgemm_big",         F32,    0, 512, 384, 640,  0, 1, 1, KN_OP_GELU,     1, KN_BF16, 0, 4, 0},
    {"splitk",            F32,    0, 128, 4096, 128, 1, 0, 1, KN_OP_RELU,     1, NONE_DT, 0, 3, 0},
    {"wgmma_bf16",        KN_BF16,0, 256, 512, 384,  0, 1, 1, KN_OP_GELU_TANH,1, NONE_DT, 0, 3, 0},
    {"tc_f16_batched",    KN_F16, 4, 64,  128, 96,   0, 0, 1, KN_OP_SILU,     2, KN_F32,  0, 4, 0},
};

TEST(cuda_epilogue_kernel_paths) {
    NEED_GPU();
    for (size_t i = 0; i < sizeof g_gpu_cases / sizeof g_gpu_cases[0]; i++) run_case(&g_gpu_cases[i], gpu(), true, true);
}

/* One plan run 5 times: the second run is captured, later ones replay the
 * graph; every run gives the first run's bits and the unfused plan's. */
TEST(cuda_epilogue_replay) {
    NEED_GPU();
    const ecase *c = &g_gpu_cases[5];
    kn_ctx *cf = kn_ctx_new(&(kn_ctx_opts){.backend = gpu()}), *cp = kn_ctx_new(&(kn_ctx_opts){.backend = gpu()});
    kn_tensor *of[3], *op[3];
    build(cf, c, of);
    build(cp, c, op);
    kn_plan *pf = kn_plan_new(cf, 1, of, NULL), *pp = kn_plan_new(cp, 1, op, &(kn_plan_opts){.no_fuse = true});
    REQUIRE(pf && pp && !kn_plan_run(pp), "plan: %s", kn_last_error());
    int64_t n, n2, at;
    float *want = read_f32(op[0], &n);
    REQUIRE(want, "read");
    for (int r = 0; r < 5; r++) {
        REQUIRE(!kn_plan_run(pf), "run %d: %s", r, kn_last_error());
        float *got = read_f32(of[0], &n2);
        REQUIRE(got && n2 == n, "read");
        int64_t bad = differ(got, want, n, -1, &at);
        CHECK(!bad, "run %d: %lld of %lld differ from the unfused plan", r, (long long)bad, (long long)n);
        free(got);
    }
    kn_plan_stats st;
    kn_plan_get_stats(pf, &st);
    CHECK(st.epilogues == 1 && st.epilogue_nodes == 4, "epilogues %d nodes %d", st.epilogues, st.epilogue_nodes);
    if (getenv("KN_TEST_VERBOSE")) fprintf(stderr, "  runs %llu replays %llu captures %llu\n", (unsigned long long)st.runs,
                                           (unsigned long long)st.replays, (unsigned long long)st.captures);
    free(want);
    kn_plan_free(pf); kn_plan_free(pp);
    kn_ctx_free(cf); kn_ctx_free(cp);
}
#endif

int main(void) {
    setenv("KN_EPILOGUE", "1", 1);   /* epilogues are opt-in (docs/COMPILER.md, "Matmul epilogues") */
    unsetenv("KN_NOFUSE");           /* a test of the compiler itself: it compares fused and no_fuse plans even in a KN_NOFUSE=1 suite run */
    kn_env_reload();
    return kn_test_main();
}
