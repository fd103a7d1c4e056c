/* test_cuda_quant.c: matmul with a GGUF-quantized right operand on the CUDA
 * backend (a weight kept as stored, KN_WEIGHTS_FILE) against the reference
 * backend, which dequantizes W and multiplies in double.
 *
 * y = x @ W^T, W [N, K] of each type the GPU decodes, x [M, K] f32:
 *   M in {1, 3}: the quantized GEMV (gemv_quant.cu): f32 activations, f32
 *     accumulation, so only the summation order differs: rel L2 < 1e-5;
 *   M in {17, 64}: W expanded to bf16 scratch and the tensor-core GEMM
 *     (A rounded to bf16 too): rel L2 < 1e-2;
 *   a batch of two x [2, 3, K]: the generic route (the weight's span expanded
 *     to f32, the f32 kernels): 1e-5.
 * N is odd (37 and 301: the two-row blocks end on a missing row; run it
 * with KN_CUDA_TUNE=qgemv_r=1 too for the one-row kernels), K a multiple of
 * the block with a partial last step of 512 columns (352 = 11 blocks of 32;
 * 1280 = 5 super-blocks of 256), so rows start off 16-byte boundaries.
 * A NaN anywhere fails.
 *
 * KN_QBENCH=1 also times the GEMV on large shapes (4096x4096, 14336x4096
 * and 4096x14336 as Q4_0, Q8_0, Q4_K, Q6_K, and the bf16 GEMV) against a
 * device-to-device copy, printing GB/s of weight bytes (docs/PERF.md).
 * Built without CUDA or run without a GPU: SKIP.
 */
#include "kn_test.h"
#include "kiln.h"
#include "backends/quant/quant.h"   /* defines: kn_quantize_row */
#include <math.h>

#ifndef KN_CUDA
TEST(cuda_quant) { SKIP("built without CUDA: build with `make CUDA=1` and run on a GPU machine"); }
#else
#include "kiln_cuda.h"
#include "backends/cuda/kn_cuda.h"
#include <cuda_runtime.h>
#include <stdlib.h>

static kn_backend *gpu(void) {
    static kn_backend *g;
    static bool tried;
    if (!tried) { tried = true; g = kn_backend_cuda(); }
    return g;
}
#define NEED_GPU() do { if (!gpu()) SKIP("no GPU: %s", kn_last_error()); } while (0)

static const kn_dtype QT[] = {KN_Q4_0, KN_Q4_1, KN_Q5_0, KN_Q5_1, KN_Q8_0, KN_Q4_K, KN_Q5_K, KN_Q6_K};

/* y [B*M, N] = x [B, M, K] @ W^T (B = 0: x is 2-d [M, K]) on be */
static kn_status qmm(kn_backend *be, kn_dtype wt, int64_t B, int64_t M, int64_t N, int64_t K, const float *x, const void *wq,
                     float *y) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    if (!ctx) return KN_ERR_NOMEM;
    kn_tensor *X = B ? kn_from_data(ctx, KN_F32, 3, (int64_t[]){B, M, K}, x) : kn_from_data(ctx, KN_F32, 2, (int64_t[]){M, K}, x);
    kn_tensor *W = kn_from_data(ctx, wt, 2, (int64_t[]){N, K}, wq);
    kn_tensor *Y = kn_matmul(ctx, X, kn_transpose(ctx, W, 0, 1));
    kn_status st = Y ? kn_tensor_read(Y, y, KN_F32) : (kn_ctx_status(ctx) ? kn_ctx_status(ctx) : KN_ERR_INVALID);
    kn_ctx_free(ctx);
    return st;
}

static double rel_l2(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        if (isnan(a[i]) || isnan(b[i])) return INFINITY;
        double d = (double)a[i] - b[i];
        num += d * d; den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* random W [N, K] quantized to wt (host) */
static void *quant_w(kn_dtype wt, int64_t N, int64_t K) {
    float *w = malloc(sizeof(float) * (size_t)(N * K));
    size_t rb = kn_dtype_nbytes(wt, K);
    char *q = malloc(rb * (size_t)N);
    kn_test_fill_f32(w, N * K, -1, 1);
    for (int64_t r = 0; r < N; r++) kn_quantize_row(wt, w + r * K, q + rb * (size_t)r, K);
    free(w);
    return q;
}

static int one_case(kn_dtype wt, int64_t B, int64_t M, int64_t N, int64_t K, double tol) {
    int64_t rows = (B ? B : 1) * M;
    float *x = malloc(sizeof(float) * (size_t)(rows * K)), *r = malloc(sizeof(float) * (size_t)(rows * N)),
          *g = malloc(sizeof(float) * (size_t)(rows * N));
    kn_test_fill_f32(x, rows * K, -1, 1);
    void *wq = quant_w(wt, N, K);
    int bad = 0;
    kn_status s1 = qmm(kn_backend_ref(), wt, B, M, N, K, x, wq, r);
    char e1[256];
    snprintf(e1, sizeof e1, "%s", s1 ? kn_last_error() : "");
    kn_status s2 = qmm(gpu(), wt, B, M, N, K, x, wq, g);
    if (s1 || s2) {
        fprintf(stderr, "  %s B=%lld M=%lld N=%lld K=%lld: ref %d (%s) cuda %d (%s)\n", kn_dtype_name(wt), (long long)B, (long long)M,
                (long long)N, (long long)K, s1, e1, s2, s2 ? kn_last_error() : "");
        bad = 1;
    } else {
        double e = rel_l2(g, r, rows * N);
        if (!(e < tol)) {
            fprintf(stderr, "  %s B=%lld M=%lld N=%lld K=%lld: rel L2 %.3g (tol %.0e); y[0] ref %g cuda %g\n", kn_dtype_name(wt),
                    (long long)B, (long long)M, (long long)N, (long long)K, e, tol, r[0], g[0]);
            bad = 1;
        }
    }
    free(x); free(r); free(g); free(wq);
    return bad;
}

TEST(quantized_matmul_every_type_vs_reference) {
    NEED_GPU();
    kn_test_seed(31);
    static const int64_t Ms[] = {1, 3, 17, 64};
    int n = 0, bad = 0;
    for (size_t t = 0; t < sizeof QT / sizeof QT[0]; t++) {
        kn_dtype wt = QT[t];
        int64_t K = kn_dtype_get(wt)->block_size == 256 ? 1280 : 352;
        for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
            double tol = Ms[i] <= 8 ? 1e-5 : 1e-2;
            bad += one_case(wt, 0, Ms[i], 37, K, tol); n++;
            bad += one_case(wt, 0, Ms[i], 301, K, tol); n++;
        }
        bad += one_case(wt, 2, 3, 37, K, 1e-5); n++;        /* batched: the generic route */
    }
    CHECK(bad == 0, "%d of %d quantized matmul cases differ from the reference", bad, n);
}

/* the C API refuses what it cannot run, with the status its header promises */
TEST(quantized_gemv_direct_call_checks_arguments) {
    NEED_GPU();
    CHECK(kn_cuda_quant_supported(KN_Q4_0) && kn_cuda_quant_supported(KN_Q6_K) && !kn_cuda_quant_supported(KN_Q8_K) &&
          !kn_cuda_quant_supported(KN_F32), "kn_cuda_quant_supported");
    void *w = NULL, *x = NULL, *y = NULL;
    REQUIRE(cudaMalloc(&w, 4096) == cudaSuccess && cudaMalloc(&x, 4096) == cudaSuccess && cudaMalloc(&y, 4096) == cudaSuccess, "cudaMalloc");
    CHECK(kn_cuda_gemv_quant(KN_Q4_0, y, 4, w, x, 48, 1, 4, 48, NULL, NULL, NULL, NULL) == KN_ERR_INVALID, "K = 48 is not whole blocks");
    CHECK(kn_cuda_gemv_quant(KN_Q8_K, y, 4, w, x, 256, 1, 4, 256, NULL, NULL, NULL, NULL) == KN_ERR_UNSUPPORTED, "Q8_K");
    CHECK(kn_cuda_gemv_quant(KN_Q4_0, y, 4, w, x, 64, 9, 4, 64, NULL, NULL, NULL, NULL) == KN_ERR_UNSUPPORTED, "M = 9");
    CHECK(kn_cuda_dequant(KN_Q4_0, y, KN_F16, w, 64, NULL) == KN_ERR_INVALID, "f16 out");
    cudaFree(w); cudaFree(x); cudaFree(y);
}

/* ---- KN_QBENCH=1: GB/s of the GEMV on large weights --------------------------------- */
static double time_us(int reps, cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    cudaEventSynchronize(b);
    cudaEventElapsedTime(&ms, a, b);
    return 1e3 * ms / reps;
}
TEST(quantized_gemv_bandwidth) {
    if (!getenv("KN_QBENCH")) SKIP("set KN_QBENCH=1 to time the quantized GEMV");
    NEED_GPU();
    static const int64_t shapes[][2] = {{4096, 4096}, {14336, 4096}, {4096, 14336}};
    const kn_dtype types[] = {KN_Q4_0, KN_Q4_1, KN_Q8_0, KN_Q4_K, KN_Q5_K, KN_Q6_K, KN_BF16};
    enum { REPS = 50 };
    cudaEvent_t a, b;
    cudaEventCreate(&a); cudaEventCreate(&b);
    size_t big = 14336 * 4096 * 2;
    void *src, *dst, *x, *y;
    REQUIRE(cudaMalloc(&src, big) == cudaSuccess && cudaMalloc(&dst, big) == cudaSuccess && cudaMalloc(&x, 4 * 14336 * 8) == cudaSuccess &&
            cudaMalloc(&y, 4 * 14336 * 8) == cudaSuccess, "cudaMalloc");
    cudaMemset(src, 0, big);
    cudaMemset(x, 0, 4 * 14336 * 8);
    cudaMemcpy(dst, src, big, cudaMemcpyDeviceToDevice);
    cudaEventRecord(a, NULL);
    for (int i = 0; i < REPS; i++) cudaMemcpy(dst, src, big, cudaMemcpyDeviceToDevice);
    cudaEventRecord(b, NULL);
    double us = time_us(REPS, a, b);
    fprintf(stderr, "  copy d2d %zu MB: %.1f us, %.0f GB/s (read + write)\n", big >> 20, us, 2.0 * big / us / 1e3);
    for (size_t s = 0; s < 3; s++)
        for (size_t t = 0; t < sizeof types / sizeof types[0]; t++) {
            kn_dtype wt = types[t];
            int64_t N = shapes[s][0], K = shapes[s][1];
            size_t wb = kn_dtype_nbytes(wt, N * K);
            void *wq = wt == KN_BF16 ? NULL : quant_w(wt, N, K);   /* real blocks: scales must be finite */
            if (wq) cudaMemcpy(src, wq, wb, cudaMemcpyHostToDevice);
            free(wq);
            for (int Mi = 0; Mi < 2; Mi++) {
                int64_t M = Mi ? 4 : 1;
                if (wt == KN_BF16 && M > 1) continue;
                kn_status st = KN_OK;
                for (int i = 0; i < 3; i++)
                    st = wt == KN_BF16 ? kn_cuda_gemv_bf16(y, src, x, NULL, N, K, NULL)
                                       : kn_cuda_gemv_quant(wt, y, N, src, x, K, M, N, K, NULL, NULL, NULL, NULL);
                cudaEventRecord(a, NULL);
                for (int i = 0; i < REPS && !st; i++)
                    st = wt == KN_BF16 ? kn_cuda_gemv_bf16(y, src, x, NULL, N, K, NULL)
                                       : kn_cuda_gemv_quant(wt, y, N, src, x, K, M, N, K, NULL, NULL, NULL, NULL);
                cudaEventRecord(b, NULL);
                CHECK(st == KN_OK, "%s", kn_last_error());
                us = time_us(REPS, a, b);
                fprintf(stderr, "  gemv %-5s M=%lld %5lld x %5lld: %7.1f us  %6.0f GB/s of weights (%.1f MB)\n", kn_dtype_name(wt),
                        (long long)M, (long long)N, (long long)K, us, wb / us / 1e3, wb / 1e6);
            }
        }
    CHECK(cudaDeviceSynchronize() == cudaSuccess, "%s", cudaGetErrorString(cudaGetLastError()));
    cudaFree(src); cudaFree(dst); cudaFree(x); cudaFree(y);
    cudaEventDestroy(a); cudaEventDestroy(b);
}
#endif

KN_TEST_MAIN()
