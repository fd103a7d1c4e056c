/* test_quant_matmul.c: matmul with a quantized right operand (the LLM's
 * linear layers: y = x @ W^T with W in GGUF blocks), on the fast CPU backend
 * against the reference (which dequantizes W and multiplies in double).
 * Few rows take an activation-quantizing dot path: Q16 (error ~1e-5) or the
 * 8-bit partner (~1e-2), per KN_QMM_ACT, forced here through every mode; many
 * rows (and mode f32) the dequantize + SGEMM path (f32-exact). */
#include "kn_test.h"
#include "kiln.h"
#include "backends/quant/quant.h"
#include <math.h>

static double run(kn_backend *be, kn_dtype wt, int64_t T, int64_t N, int64_t K, const float *x, const void *wq, float *out) {
    kn_ctx_opts o = {be};
    kn_ctx *ctx = kn_ctx_new(&o);
    kn_tensor *X = kn_from_data(ctx, KN_F32, 2, (int64_t[]){T, K}, x);
    kn_tensor *W = kn_from_ptr(ctx, wt, 2, (int64_t[]){N, K}, (void *)wq);
    kn_tensor *Y = kn_matmul(ctx, X, kn_transpose(ctx, W, 0, 1));
    kn_status st = Y ? kn_tensor_read(Y, out, KN_F32) : KN_ERR_INVALID;
    kn_ctx_free(ctx);
    return st;
}

TEST(quantized_matmul_both_paths_vs_reference) {
    kn_test_seed(11);
    kn_dtype types[] = {KN_Q4_0, KN_Q4_1, KN_Q5_0, KN_Q5_1, KN_Q8_0, KN_Q4_K, KN_Q5_K, KN_Q6_K, KN_F16, KN_BF16};
    int64_t rows[] = {1, 3, 9, 40, 64};   /* 9: two groups of four rows and one more (the four-row dots); 40:
                                             the four-row dots still; 64: prefill (cpu_matmul.c's 48 rows) */
    const int64_t N = 37, K = 512;
    float *w = malloc(sizeof(float) * N * K), *x = malloc(sizeof(float) * 64 * K);
    float *ref = malloc(sizeof(float) * 64 * N), *got = malloc(sizeof(float) * 64 * N);
    kn_test_fill_f32(w, N * K, -1, 1);
    kn_test_fill_f32(x, 64 * K, -1, 1);
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        kn_dtype t = types[ti];
        void *wq = malloc(kn_dtype_nbytes(t, N * K));
        for (int64_t r = 0; r < N; r++)
            REQUIRE(kn_quantize_row(t, w + r * K, (char *)wq + kn_dtype_nbytes(t, K) * r, K) == KN_OK, "%s", kn_last_error());
        for (int mode = KN_QACT_AUTO; mode <= KN_QACT_F32; mode++)
        for (size_t ri = 0; ri < sizeof rows / sizeof rows[0]; ri++) {
            int64_t T = rows[ri];
            kn_quant_force_act_mode(mode);
            REQUIRE(run(kn_backend_ref(), t, T, N, K, x, wq, ref) == KN_OK, "ref %s: %s", kn_dtype_name(t), kn_last_error());
            REQUIRE(run(kn_backend_cpu(), t, T, N, K, x, wq, got) == KN_OK, "cpu %s: %s", kn_dtype_name(t), kn_last_error());
            double num = 0, den = 0;
            for (int64_t i = 0; i < T * N; i++) { num += (got[i] - ref[i]) * (got[i] - ref[i]); den += ref[i] * ref[i]; }
            double e = sqrt(num / den);
            bool exact = T >= 48 || t == KN_F16 || t == KN_BF16 || mode == KN_QACT_F32;   /* float activations */
            bool q16 = kn_quant_act_q16_dot(t) != NULL;
            double tol = exact ? 1e-5 : q16 ? 1e-4 : 2e-2;
            CHECK(e < tol, "%s T=%lld mode %d: rel err %.3g (tol %.3g)", kn_dtype_name(t), (long long)T, mode, e, tol);
            kn_quant_force_act_mode(-1);
        }
        free(wq);
    }
    free(w); free(x); free(ref); free(got);
}

/* the vectorized activation quantizers must give the scalar bytes exactly */
TEST(activation_quantizers_bit_exact) {
    kn_test_seed(12);
    const int64_t n = 32 * 64;
    float *x = malloc(sizeof(float) * n);
    for (int rep = 0; rep < 20; rep++) {
        double scale = pow(10, kn_test_uniform(-6, 4));
        kn_test_fill_f32(x, n, -scale, scale);
        for (int64_t i = 0; i < n; i += 97) x[i] = 0;               /* zeros and an all-zero block */
        for (int64_t i = 32; i < 64; i++) x[i] = 0;
        x[100] = (float)(127 * scale);                                /* exact extremum */
        kn_dtype ts[2] = {KN_Q8_0, KN_Q8_1};
        for (int k = 0; k < 2; k++) {
            size_t nb = kn_dtype_nbytes(ts[k], n);
            char *a = malloc(nb), *b = malloc(nb);
            kn_quant_force_isa(0);
            REQUIRE(kn_quantize_row(ts[k], x, a, n) == KN_OK, "%s", kn_last_error());
            kn_quant_force_isa(-1);
            REQUIRE(kn_quantize_row(ts[k], x, b, n) == KN_OK, "%s", kn_last_error());
            CHECK(memcmp(a, b, nb) == 0, "%s rep %d: vector and scalar quantization differ", kn_dtype_name(ts[k]), rep);
            free(a); free(b);
        }
    }
    free(x);
}

KN_TEST_MAIN()
