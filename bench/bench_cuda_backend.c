/* bench_cuda_backend.c: matmul through the CUDA backend (a kn plan) against
 * cuBLAS on the same GPU in the same run.
 *
 * Each case is C[M,N] = A[M,K] @ op(B) in bf16 or f16 (f32 accumulation):
 * "NN" with B stored [K,N], "NT" with B stored [N,K] and used transposed
 * (x @ W^T, a linear layer), optionally batched (attention scores). The kn
 * side is one plan of R matmul nodes over the same inputs, so that one
 * kn_plan_run (which ends with a stream sync) times R products; the time is
 * the median over rounds of (wall time / R). cuBLAS (cublasGemmEx or its
 * strided-batched form, CUBLAS_COMPUTE_32F, output in the operand dtype) is
 * timed with events around R calls, median over rounds. Both read the same
 * random inputs; the outputs are compared (relative Frobenius error).
 * KN_CUDA_NO_WGMMA=1 is set for the rows marked "mma.sync" so that the NT
 * bf16 shapes also show the mma.sync kernel. "TN"/"TT": A stored [K,M] and
 * used transposed (a weight gradient dY^T @ X).
 *
 *   make CUDA=1 && build/bench/bench_cuda_backend [WORD ...]   (needs a GPU; plain builds print a skip line)
 *
 * WORDs pick cases by name: a case runs when its name holds one of the
 * words and none of the words written -WORD ("gpt2 -logits -mma"); no word
 * picks them all.
 *
 * Letters: M, N, K GEMM dims; Z batch entries.
 */
#include "kn_bench.h"         /* kn_bench_now, kn_bench_cmp_double */
#include "kiln.h"
#include "core/env.h"          /* kn_env_reload after toggling KN_CUDA_NO_WGMMA */
#include <stdio.h>

#ifndef KN_CUDA
int main(void) {
    printf("bench_cuda_backend: built without CUDA (make CUDA=1); skipped\n");
    return 0;
}
#else
#include "kiln_cuda.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include <cuda_runtime.h>
#include <cublas_v2.h>
#pragma GCC diagnostic pop

#define R 10           /* products per timed plan run / per cuBLAS timing */
#define ROUNDS 7

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, kn_bench_cmp_double);
    return v[n / 2];
}
static uint64_t rng = 0x9E3779B97F4A7C15ull;
static float frand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return (float)((rng >> 11) * (1.0 / 9007199254740992.0)) * 2.f - 1.f;
}

#define CK(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess) { fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); exit(1); } } while (0)
#define CB(call) do { cublasStatus_t s_ = (call); if (s_ != CUBLAS_STATUS_SUCCESS) { fprintf(stderr, "%s:%d: cublas %d\n", __FILE__, __LINE__, (int)s_); exit(1); } } while (0)

typedef struct { const char *name; kn_dtype dt; int64_t Z, M, N, K; bool nt; bool no_wgmma; bool ta; } bcase;

/* returns cuBLAS time / kn time (above 1: kn faster), or -1 when kn failed */
static double run_case(cublasHandle_t h, kn_backend *gpu, const bcase *c) {
    double ratio = -1;
    int64_t Z = c->Z, M = c->M, N = c->N, K = c->K;
    size_t na = (size_t)(Z * M * K), nb = (size_t)(Z * K * N), nc = (size_t)(Z * M * N);
    float *ha = malloc(na * 4), *hb = malloc(nb * 4), *hk = malloc(nc * 4), *hcb = malloc(nc * 4);
    uint16_t *h16 = malloc((na > nb ? (na > nc ? na : nc) : (nb > nc ? nb : nc)) * 2);
    for (size_t i = 0; i < na; i++) ha[i] = frand();
    for (size_t i = 0; i < nb; i++) hb[i] = frand();

    /* ---- kn plan: R products of the same operands ---- */
    kn_ctx *g = kn_ctx_new(&(kn_ctx_opts){gpu});
    int64_t sa[3] = {Z, c->ta ? K : M, c->ta ? M : K}, sb[3] = {Z, c->nt ? N : K, c->nt ? K : N};
    kn_tensor *a = Z > 1 ? kn_empty(g, c->dt, 3, sa) : kn_empty(g, c->dt, 2, sa + 1);
    kn_tensor *b = Z > 1 ? kn_empty(g, c->dt, 3, sb) : kn_empty(g, c->dt, 2, sb + 1);
    kn_tensor_write(a, ha, KN_F32);            /* rounds to the operand dtype */
    kn_tensor_write(b, hb, KN_F32);
    kn_tensor *bo = c->nt ? kn_transpose(g, b, -1, -2) : b;
    kn_tensor *ao = c->ta ? kn_transpose(g, a, -1, -2) : a;
    kn_tensor *outs[R];
    for (int r = 0; r < R; r++) outs[r] = kn_matmul(g, ao, bo);
    if (c->no_wgmma) { setenv("KN_CUDA_NO_WGMMA", "1", 1); kn_env_reload(); }
    kn_plan *p = kn_plan_new(g, R, outs, NULL);
    double tk[ROUNDS];
    int ok = p && kn_plan_run(p) == KN_OK;      /* warm-up */
    for (int k = 0; ok && k < ROUNDS; k++) {
        double t0 = kn_bench_now();
        ok = kn_plan_run(p) == KN_OK;
        tk[k] = (kn_bench_now() - t0) / R;
    }
    unsetenv("KN_CUDA_NO_WGMMA");
    kn_env_reload();
    if (!ok) { printf("%-30s kn plan failed: %s\n", c->name, kn_last_error()); goto done; }
    kn_tensor_read(outs[0], hk, KN_F32);

    /* ---- cuBLAS on the same (rounded) values ---- */
    cudaDataType_t ct = c->dt == KN_BF16 ? CUDA_R_16BF : CUDA_R_16F;
    void *da, *db, *dc;
    CK(cudaMalloc(&da, na * 2)); CK(cudaMalloc(&db, nb * 2)); CK(cudaMalloc(&dc, nc * 2));
    kn_tensor_read(a, h16, c->dt); CK(cudaMemcpy(da, h16, na * 2, cudaMemcpyHostToDevice));
    kn_tensor_read(b, h16, c->dt); CK(cudaMemcpy(db, h16, nb * 2, cudaMemcpyHostToDevice));
    float one = 1.f, zero = 0.f;
    /* row-major C = A op(B)  <=>  column-major C^T = op(B)^T A^T */
    cublasOperation_t ob = c->nt ? CUBLAS_OP_T : CUBLAS_OP_N;
    int64_t ldb = c->nt ? K : N;
    /* A stored [K,M] ("TN"): column-major M x K, used transposed, lda = M */
    cublasOperation_t oa = c->ta ? CUBLAS_OP_T : CUBLAS_OP_N;
    int64_t lda = c->ta ? M : K;
#define GEMM() (Z > 1 ? cublasGemmStridedBatchedEx(h, ob, oa, (int)N, (int)M, (int)K, &one, db, ct, (int)ldb, K * N, \
                                                   da, ct, (int)lda, M * K, &zero, dc, ct, (int)N, M * N, (int)Z, CUBLAS_COMPUTE_32F, \
                                                   CUBLAS_GEMM_DEFAULT) \
                      : cublasGemmEx(h, ob, oa, (int)N, (int)M, (int)K, &one, db, ct, (int)ldb, da, ct, (int)lda, &zero, \
                                     dc, ct, (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT))
    CB(GEMM());
    CK(cudaDeviceSynchronize());
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0)); CK(cudaEventCreate(&e1));
    double tb[ROUNDS];
    for (int k = 0; k < ROUNDS; k++) {
        CK(cudaEventRecord(e0, 0));
        for (int r = 0; r < R; r++) CB(GEMM());
        CK(cudaEventRecord(e1, 0));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        tb[k] = 1e-3 * ms / R;
    }
    CK(cudaMemcpy(h16, dc, nc * 2, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < nc; i++) hcb[i] = (float)kn_load(c->dt, h16, (int64_t)i);
    double num = 0, den = 0;
    for (size_t i = 0; i < nc; i++) { double d = (double)hk[i] - hcb[i]; num += d * d; den += (double)hcb[i] * hcb[i]; }
    double rel = sqrt(num / (den > 0 ? den : 1));
    double fl = 2.0 * (double)Z * M * N * K, mk = median(tk, ROUNDS), mb = median(tb, ROUNDS);
    printf("%-30s %-5s %5lld %6lld %6lld %6lld %9.1f %9.1f %8.1f %8.1f %6.3f %9.2e %s\n", c->name, kn_dtype_name(c->dt),
           (long long)Z, (long long)M, (long long)N, (long long)K, mk * 1e6, mb * 1e6, fl / mk * 1e-12, fl / mb * 1e-12, mb / mk,
           rel, rel < 1e-2 && !isnan(rel) ? "ok" : "FAIL");
    ratio = rel < 1e-2 && !isnan(rel) ? mb / mk : -1;
    CK(cudaEventDestroy(e0)); CK(cudaEventDestroy(e1));
    CK(cudaFree(da)); CK(cudaFree(db)); CK(cudaFree(dc));
done:
    kn_plan_free(p);
    kn_ctx_free(g);
    free(ha); free(hb); free(hk); free(hcb); free(h16);
    return ratio;
}

/* the case list's filter (see the top): argc/argv of main */
static int g_argc;
static char **g_argv;
static bool picked(const char *name) {
    bool any = false, hit = false;
    for (int i = 1; i < g_argc; i++) {
        if (g_argv[i][0] == '-') {
            if (strstr(name, g_argv[i] + 1)) return false;
        } else {
            any = true;
            hit = hit || strstr(name, g_argv[i]) != NULL;
        }
    }
    return hit || !any;
}

int main(int argc, char **argv) {
    g_argc = argc;
    g_argv = argv;
    kn_backend *gpu = kn_backend_cuda();
    if (!gpu) { printf("bench_cuda_backend: %s; skipped\n", kn_last_error()); return 0; }
    struct cudaDeviceProp pr;
    CK(cudaGetDeviceProperties(&pr, 0));
    cublasHandle_t h;
    CB(cublasCreate(&h));
    printf("bench_cuda_backend: %s (%d SMs); kn = median over %d plan runs of %d matmul nodes; cuBLAS = cublasGemmEx, "
           "CUBLAS_COMPUTE_32F, median over %d x %d calls\n", pr.name, pr.multiProcessorCount, ROUNDS, R, ROUNDS, R);
    const bcase C[] = {
        {"square NT (wgmma)", KN_BF16, 1, 4096, 4096, 4096, true, false},
        {"square NT (mma.sync)", KN_BF16, 1, 4096, 4096, 4096, true, true},
        {"square NN (wgmma)", KN_BF16, 1, 4096, 4096, 4096, false, false},
        {"square NN (mma.sync)", KN_BF16, 1, 4096, 4096, 4096, false, true},
        {"square TN (wgmma)", KN_BF16, 1, 4096, 4096, 4096, false, false, true},
        {"square TN (mma.sync)", KN_BF16, 1, 4096, 4096, 4096, false, true, true},
        {"square TT (wgmma)", KN_BF16, 1, 4096, 4096, 4096, true, false, true},
        {"square TT (mma.sync)", KN_BF16, 1, 4096, 4096, 4096, true, true, true},
        {"square NN (wgmma)", KN_F16, 1, 4096, 4096, 4096, false, false},
        {"square NN (mma.sync)", KN_F16, 1, 4096, 4096, 4096, false, true},
        {"square NT (wgmma)", KN_F16, 1, 4096, 4096, 4096, true, false},
        {"square NT (mma.sync)", KN_F16, 1, 4096, 4096, 4096, true, true},
        {"gpt2 qkv x@W^T (wgmma)", KN_BF16, 1, 8192, 2304, 768, true, false},
        {"gpt2 qkv x@W^T (mma.sync)", KN_BF16, 1, 8192, 2304, 768, true, true},
        {"gpt2 mlp down (wgmma)", KN_BF16, 1, 8192, 768, 3072, true, false},
        {"gpt2 mlp down (mma.sync)", KN_BF16, 1, 8192, 768, 3072, true, true},
        {"char 6x384 qkv x@W^T", KN_BF16, 1, 16384, 1152, 384, true, false},
        {"char 6x384 qkv (mma.sync)", KN_BF16, 1, 16384, 1152, 384, true, true},
        {"llama7b mlp up x@W^T", KN_BF16, 1, 2048, 11008, 4096, true, false},
        {"attn scores q@k^T (wgmma)", KN_BF16, 96, 1024, 1024, 64, true, false},
        {"attn scores q@k^T (mma.sync)", KN_BF16, 96, 1024, 1024, 64, true, true},
        {"attn out p@v (wgmma)", KN_BF16, 96, 1024, 64, 1024, false, false},
        {"attn out p@v (mma.sync)", KN_BF16, 96, 1024, 64, 1024, false, true},
        {"attn out p@v (wgmma)", KN_F16, 96, 1024, 64, 1024, false, false},
        {"attn out p@v (mma.sync)", KN_F16, 96, 1024, 64, 1024, false, true},
        {"attn dV = P^T dO TN (wgmma)", KN_BF16, 96, 1024, 64, 1024, false, false, true},
        {"attn dV = P^T dO (mma.sync)", KN_BF16, 96, 1024, 64, 1024, false, true, true},
        {"gpt2 dW qkv TN (wgmma)", KN_BF16, 1, 2304, 768, 8192, false, false, true},
        {"gpt2 dW qkv TN (mma.sync)", KN_BF16, 1, 2304, 768, 8192, false, true, true},
        {"gpt2 dx = dy@W NN (wgmma)", KN_BF16, 1, 8192, 768, 2304, false, false},
        {"gpt2 dx = dy@W NN (mma.sync)", KN_BF16, 1, 8192, 768, 2304, false, true},
        {"odd 1000x999x257 NN", KN_BF16, 1, 1000, 999, 257, false, false},
    };
    printf("%-30s %-5s %5s %6s %6s %6s %9s %9s %8s %8s %6s %9s\n", "case", "dtype", "Z", "M", "N", "K", "kn_us", "cublas_us",
           "kn_TF/s", "cub_TF/s", "kn/cub", "relerr");
    for (size_t i = 0; i < sizeof C / sizeof C[0]; i++)
        if (picked(C[i].name)) run_case(h, gpu, &C[i]);
    /* The sweep (issue 12): every product of GPT-2 124M training (B=8, T=1024:
     * M = 8192 token rows; forward x@W^T "NT", input gradient dy@W "NN",
     * weight gradient dy^T@x "TN"), with the vocabulary of 50257 (odd N or
     * K), and Llama 2 7B / Llama 3 8B / Qwen2 projections at prefill (512
     * rows) and decode (1 row), with their vocabularies (32000, 128256,
     * 151936) and an odd one (32001). Target: kn/cub >= 0.85 everywhere. */
    const bcase S[] = {
        {"gpt2 qkv fwd NT", KN_BF16, 1, 8192, 2304, 768, true, false},
        {"gpt2 qkv dx NN", KN_BF16, 1, 8192, 768, 2304, false, false},
        {"gpt2 qkv dW TN", KN_BF16, 1, 2304, 768, 8192, false, false, true},
        {"gpt2 proj fwd NT", KN_BF16, 1, 8192, 768, 768, true, false},
        {"gpt2 proj dx NN", KN_BF16, 1, 8192, 768, 768, false, false},
        {"gpt2 proj dW TN", KN_BF16, 1, 768, 768, 8192, false, false, true},
        {"gpt2 fc fwd NT", KN_BF16, 1, 8192, 3072, 768, true, false},
        {"gpt2 fc dx NN", KN_BF16, 1, 8192, 768, 3072, false, false},
        {"gpt2 fc dW TN", KN_BF16, 1, 3072, 768, 8192, false, false, true},
        {"gpt2 fc2 fwd NT", KN_BF16, 1, 8192, 768, 3072, true, false},
        {"gpt2 fc2 dx NN", KN_BF16, 1, 8192, 3072, 768, false, false},
        {"gpt2 fc2 dW TN", KN_BF16, 1, 768, 3072, 8192, false, false, true},
        {"gpt2 logits fwd NT V=50257", KN_BF16, 1, 8192, 50257, 768, true, false},
        {"gpt2 logits dx NN", KN_BF16, 1, 8192, 768, 50257, false, false},
        {"gpt2 logits dW TN", KN_BF16, 1, 50257, 768, 8192, false, false, true},
        {"llama7b qkv prefill NT", KN_BF16, 1, 512, 12288, 4096, true, false},
        {"llama7b o prefill NT", KN_BF16, 1, 512, 4096, 4096, true, false},
        {"llama7b gate|up prefill NT", KN_BF16, 1, 512, 22016, 4096, true, false},
        {"llama7b down prefill NT", KN_BF16, 1, 512, 4096, 11008, true, false},
        {"llama7b logits V=32000", KN_BF16, 1, 512, 32000, 4096, true, false},
        {"llama odd logits V=32001", KN_BF16, 1, 512, 32001, 4096, true, false},
        {"llama3-8b qkv prefill NT", KN_BF16, 1, 512, 6144, 4096, true, false},
        {"llama3-8b gate|up prefill NT", KN_BF16, 1, 512, 28672, 4096, true, false},
        {"llama3-8b down prefill NT", KN_BF16, 1, 512, 4096, 14336, true, false},
        {"llama3-8b logits V=128256", KN_BF16, 1, 512, 128256, 4096, true, false},
        {"qwen2 logits V=151936", KN_BF16, 1, 512, 151936, 896, true, false},
        {"llama3-8b qkv decode NT", KN_BF16, 1, 1, 6144, 4096, true, false},
        {"llama3-8b down decode NT", KN_BF16, 1, 1, 4096, 14336, true, false},
        {"llama3-8b logits decode", KN_BF16, 1, 1, 128256, 4096, true, false},
    };
    printf("\nsweep (target kn/cub >= 0.85):\n");
    int below = 0, n = 0;
    double worst = 1e9;
    const char *wname = "";
    for (size_t i = 0; i < sizeof S / sizeof S[0]; i++) {
        if (!picked(S[i].name)) continue;
        n++;
        double r = run_case(h, gpu, &S[i]);
        if (r < 0.85) below++;
        if (r < worst) { worst = r; wname = S[i].name; }
    }
    printf("sweep: %d of %d products below 0.85x cuBLAS (or failed); lowest %.3f (%s)\n", below, n, worst, wname);
    cublasDestroy(h);
    return 0;
}
#endif
