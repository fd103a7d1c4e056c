/* test_qpack.c: the 16-row packed Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K weights for decode
 * (backends/quant/qpack.h): the packed scalar kernel against the row-at-a-time
 * Q16 dots, the SIMD kernel against the scalar one, dequantizing a packed
 * group against the file's rows, and the CPU matmul through a constant
 * buffer (kn_set_constant) against the reference backend, including row
 * ranges of a stacked matrix and the fallbacks. */
#include "kn_test.h"
#include "kiln.h"
#include "backends/quant/qpack.h"
#include "core/core.h"
#include "core/cpu.h"
#include "core/env.h"
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

static const kn_dtype TYPES[] = {KN_Q4_0, KN_Q4_1, KN_Q5_0, KN_Q5_1, KN_Q8_0, KN_Q4_K, KN_Q5_K, KN_Q6_K};
#define NTYPES 8

/* random bytes with sane f16 scales: every quant value occurs */
static void fill_raw(kn_dtype t, void *dst, int64_t rows, int64_t K) {
    int64_t bs = kn_dtype_get(t)->block_size;
    size_t bytes = kn_dtype_nbytes(t, rows * K), bb = kn_dtype_nbytes(t, bs);
    uint8_t *p = dst;
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)kn_test_u64();
    for (size_t off = 0; off < bytes; off += bb) {
        uint16_t h[2];
        for (int i = 0; i < 2; i++) {
            float v = (float)kn_test_uniform(1e-3, 0.1) * (i == 1 ? -1.0f : 1.0f);
            uint32_t u; memcpy(&u, &v, 4);
            h[i] = (uint16_t)(((u >> 16) & 0x8000) | ((((u >> 23) & 0xff) - 112) << 10) | ((u >> 13) & 0x3ff));
        }
        if (t == KN_Q6_K) memcpy(p + off + bb - 2, h, 2);                         /* Q6_K: d last */
        else memcpy(p + off, h, t == KN_Q4_1 || t == KN_Q5_1 || t == KN_Q4_K || t == KN_Q5_K ? 4 : 2);   /* d (and m / dmin) first */
    }
}

static void quantize_x(float *x, kn_block_q16 *xq, int64_t K) {
    kn_test_fill_f32(x, K, -2, 2);
    REQUIRE(kn_quantize_q16(x, xq, K) == KN_OK, "%s", kn_last_error());
}

/* packed scalar kernel == the row dots (the same integer sums; float steps in
 * another order), the SIMD kernel == the scalar one, the dequantized group ==
 * the file's rows bit for bit; N not a multiple of 16 (padding rows) */
TEST(packed_kernels_match_row_dots) {
    kn_test_seed(71);
    const int64_t Ns[] = {1, 15, 16, 17, 50}, Ks[] = {256, 768, 1536};   /* multiples of every block size */
    int simd = 0;
    for (size_t ti = 0; ti < NTYPES; ti++)
        for (size_t ni = 0; ni < 5; ni++)
            for (size_t ki = 0; ki < 3; ki++) {
                kn_dtype t = TYPES[ti];
                int64_t N = Ns[ni], K = Ks[ki], G = (N + 15) / 16;
                size_t rb = kn_dtype_nbytes(t, K);
                void *w = malloc(rb * (size_t)N), *pk = malloc(kn_qpack_nbytes(t, N, K));
                float *x = malloc(sizeof(float) * (size_t)K), *ys = malloc(sizeof(float) * (size_t)(16 * G));
                float *yv = malloc(sizeof(float) * (size_t)(16 * G));
                float *row = malloc(sizeof(float) * (size_t)K);
                kn_block_q16 *xq = malloc(kn_quant_q16_nbytes(K));
                fill_raw(t, w, N, K);
                quantize_x(x, xq, K);
                size_t want_bytes = (size_t)G * 16 * rb + (t == KN_Q4_K || t == KN_Q5_K ? (size_t)G * (size_t)(K / 256) * 64 : 0);
                CHECK(kn_qpack_nbytes(t, N, K) == want_bytes, "%s: packed size is 16 file rows a group (Q4_K, Q5_K: + 64 B a record)",
                      kn_dtype_name(t));
                kn_qpack_pack(t, w, rb, N, K, 0, G, pk);
                kn_qpack_gemv_scalar(t)(pk, 0, G, K, xq, ys);
                kn_vec_dot_fn dot = kn_quant_q16_dot_scalar(t);
                /* float sums in another order: within 1e-6 of the sum of |products| */
                double *tol = malloc(sizeof(double) * (size_t)(16 * G));
                for (int64_t n = 0; n < 16 * G; n++) tol[n] = 1e-30;
                for (int64_t n = 0; n < N; n++) {
                    kn_dequantize_row(t, (char *)w + n * rb, row, K);
                    for (int64_t k = 0; k < K; k++) tol[n] += 1e-6 * fabs((double)row[k] * xq[k / 32].d * xq[k / 32].qs[k % 32]);
                    float want = dot(K, (char *)w + n * rb, xq);
                    CHECK(fabs(ys[n] - want) <= tol[n], "%s N=%lld K=%lld row %lld: %.9g vs %.9g (tol %.3g)",
                          kn_dtype_name(t), (long long)N, (long long)K, (long long)n, ys[n], want, tol[n]);
                }
                for (int64_t n = N; n < 16 * G; n++) CHECK(ys[n] == 0, "padding row %lld gives %g", (long long)n, ys[n]);
                kn_qpack_gemv_fn f = kn_qpack_gemv_simd(t);
                if (f) {
                    simd++;
                    f(pk, 0, G, K, xq, yv);
                    for (int64_t n = 0; n < 16 * G; n++)
                        CHECK(fabs(yv[n] - ys[n]) <= 2 * tol[n], "%s simd row %lld: %.9g vs %.9g",
                              kn_dtype_name(t), (long long)n, yv[n], ys[n]);
                    if (G > 1) {                     /* a range that does not start at group 0 */
                        f(pk, 1, G, K, xq, yv);
                        CHECK(fabs(yv[0] - ys[16]) <= 2 * tol[16], "%s groups [1, G)", kn_dtype_name(t));
                    }
                }
                kn_qpack_gemm4_fn f4 = kn_qpack_gemm4_simd(t);
                if (f4) {                            /* four activation rows: the one-row kernel's bits */
                    kn_block_q16 *x4 = malloc(4 * kn_quant_q16_nbytes(K));
                    for (int i = 0; i < 4; i++) quantize_x(x, x4 + i * (K / 32), K);
                    float y4[4][16], y1[16];
                    for (int64_t g = 0; g < G; g++) {
                        f4(pk, g, K, x4, K / 32, y4[0], 16);
                        for (int i = 0; i < 4; i++) {
                            f(pk, g, g + 1, K, x4 + i * (K / 32), y1);
                            CHECK(!memcmp(y1, y4[i], sizeof y1), "%s gemm4 group %lld row %d differs from gemv",
                                  kn_dtype_name(t), (long long)g, i);
                        }
                    }
                    free(x4);
                }
                /* W^T panels: every group's 16 columns, against the file's rows bit for bit
                 * (scalar and, where the CPU has it, SIMD) */
                float *wt = malloc(sizeof(float) * (size_t)(K * 16 * G)), *wt2 = malloc(sizeof(float) * (size_t)(K * 16 * G));
                for (int64_t g = 0; g < G; g++) {
                    kn_qpack_dequant_scalar(t)(pk, g, K, wt + 16 * g, 16 * G);
                    kn_qpack_dequant(t)(pk, g, K, wt2 + 16 * g, 16 * G);
                }
                CHECK(!memcmp(wt, wt2, sizeof(float) * (size_t)(K * 16 * G)), "%s: SIMD and scalar W^T panels differ", kn_dtype_name(t));
                for (int64_t n = 0; n < N; n++) {
                    kn_dequantize_row(t, (char *)w + n * rb, row, K);
                    int bad = 0;
                    for (int64_t k = 0; k < K; k++) bad += row[k] != wt[k * 16 * G + n];
                    CHECK(!bad, "%s: row %lld dequantizes differently in %d places", kn_dtype_name(t), (long long)n, bad);
                }
                free(wt); free(wt2);
                free(w); free(pk); free(x); free(ys); free(yv); free(row); free(xq); free(tol);
            }
    bool want_simd = kn_cpu()->isa >= KN_ISA_AVX512 && kn_cpu()->avx512vnni;
#ifdef KN_NO_AVX512
    want_simd = false;
#endif
    CHECK(simd == (want_simd ? 15 * NTYPES : 0), "SIMD packed kernels ran %d times (want %d on this CPU)", simd,
          want_simd ? 15 * NTYPES : 0);
}

/* y = relu(x W^T + bias) for T activation rows on the CPU backend (W rows
 * [row0, row0 + N) of a stacked [rows, K] matrix, marked constant or not)
 * and on the reference: the bias and relu become the matmul's epilogue,
 * which each block of a prefill's columns must apply at its own columns */
static void matmul(kn_backend *be, kn_dtype t, const void *w, int64_t rows, int64_t row0, int64_t N, int64_t K,
                   bool constant, const float *x, int64_t T, float *y, bool *packed) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){be});
    kn_tensor *W = kn_from_ptr(ctx, t, 2, (int64_t[]){rows, K}, (void *)w);
    if (constant) REQUIRE(kn_set_constant(W) == KN_OK, "%s", kn_last_error());
    kn_tensor *Wr = kn_slice(ctx, W, 0, row0, row0 + N, 1);
    kn_tensor *X = kn_from_data(ctx, KN_F32, 2, (int64_t[]){T, K}, x);
    float bias[80];
    for (int i = 0; i < 80; i++) bias[i] = (float)(i % 7) - 2.5f;
    kn_tensor *Bv = kn_from_data(ctx, KN_F32, 1, (int64_t[]){N}, bias);
    kn_tensor *Y = kn_relu(ctx, kn_add(ctx, kn_matmul(ctx, X, kn_transpose(ctx, Wr, 0, 1)), Bv));
    REQUIRE(Y, "%s", kn_last_error());
    kn_plan *pl = kn_plan_new(ctx, 1, &Y, NULL);     /* a plan: the epilogue is fused (kn_tensor_read fuses none) */
    REQUIRE(pl && kn_plan_run(pl) == KN_OK && kn_tensor_read(Y, y, KN_F32) == KN_OK, "%s", kn_last_error());
    kn_plan_stats st;
    kn_plan_get_stats(pl, &st);
    if (be == kn_backend_cpu() && !kn_env_get()->nofuse && kn_env_get()->epilogue == 1)
        CHECK(st.epilogues == 1, "%s: the bias and relu did not become the matmul's epilogue", kn_dtype_name(t));
    kn_plan_free(pl);
    if (packed) *packed = __atomic_load_n(&W->buf->derived, __ATOMIC_ACQUIRE) != NULL;
    kn_ctx_free(ctx);
}

TEST(cpu_matmul_through_packed_copy) {
    kn_test_seed(72);
    const char *keep = getenv("KN_EPILOGUE");          /* epilogues on (off by default): the blocks' post pieces */
    char *kept = keep ? strdup(keep) : NULL;
    setenv("KN_EPILOGUE", "1", 1); kn_env_reload();
    const int64_t rows = 80, K = 256;
    struct { int64_t row0, N, T; bool expect, f32; } cases[] = {
        {0, 80, 1, true, false}, {0, 80, 3, true, false}, {16, 37, 1, true, false}, {32, 48, 5, true, false},
        {16, 53, 40, true, false},          /* a short prompt: the four-row kernel */
        {16, 53, 60, true, false},          /* a prompt: the four-row kernel too (where it exists, else the SGEMM) */
        {16, 53, 60, true, true},           /* KN_QMM_ACT=f32: the copy dequantized into W^T blocks, then the SGEMM */
        {8, 40, 64, false, false},          /* not on a group boundary: the file's rows, by blocks */
        {8, 40, 1, false, false},           /* not on a group boundary: the row dots */
    };
    bool can = kn_cpu()->isa >= KN_ISA_AVX512 && kn_cpu()->avx512vnni;
#ifdef KN_NO_AVX512
    can = false;
#endif
    for (size_t ti = 0; ti < NTYPES; ti++) {
        kn_dtype t = TYPES[ti];
        void *w = malloc(kn_dtype_nbytes(t, rows * K));
        fill_raw(t, w, rows, K);
        static float x[64 * 256], ref[64 * 80], got[64 * 80], plain[64 * 80];
        kn_test_fill_f32(x, 64 * K, -1, 1);
        for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
            int64_t N = cases[c].N, T = cases[c].T;
            bool packed = false, packed_plain = true;
            if (cases[c].f32) kn_quant_force_act_mode(KN_QACT_F32);
            matmul(kn_backend_ref(), t, w, rows, cases[c].row0, N, K, false, x, T, ref, NULL);
            matmul(kn_backend_cpu(), t, w, rows, cases[c].row0, N, K, true, x, T, got, &packed);
            matmul(kn_backend_cpu(), t, w, rows, cases[c].row0, N, K, false, x, T, plain, &packed_plain);
            kn_quant_force_act_mode(-1);
            double num = 0, den = 0, dp = 0;
            for (int64_t i = 0; i < T * N; i++) {
                num += (got[i] - ref[i]) * (got[i] - ref[i]); den += ref[i] * ref[i];
                dp += (got[i] - plain[i]) * (got[i] - plain[i]);
            }
            /* the row dots: Q16 as well (auto), except the K types' 8-bit partner;
             * a prompt without the four-row kernel (or KN_QMM_ACT=f32) dequantizes
             * to the same floats in both (QMM_GEMM_MIN_ROWS); with it, the packed
             * copy's Q16 rows meet the plain buffer's f32 SGEMM */
            bool f32_got = cases[c].f32 || (T >= 48 && !(can && cases[c].expect)), f32_plain = cases[c].f32 || T >= 48;
            double dtol = f32_got && f32_plain ? 1e-5 : f32_plain || kn_quant_act_q16_dot(t) ? 1e-4 : 3e-2,
                   rtol = f32_got ? 1e-5 : packed || kn_quant_act_q16_dot(t) ? 1e-4 : 3e-2;
            CHECK(sqrt(num / den) < rtol, "%s case %zu: rel err %.3g vs reference", kn_dtype_name(t), c, sqrt(num / den));
            CHECK(sqrt(dp / den) < dtol, "%s case %zu: packed vs row dots differ by %.3g", kn_dtype_name(t), c, sqrt(dp / den));
            /* the copy is made for a constant buffer only, viewed from a group boundary */
            CHECK(!packed_plain, "%s: a non-constant buffer got a packed copy", kn_dtype_name(t));
            CHECK(packed == (can && cases[c].expect), "%s case %zu: packed copy %d (CPU can: %d)",
                  kn_dtype_name(t), c, packed, can);
        }
        free(w);
    }
    if (kept) setenv("KN_EPILOGUE", kept, 1); else unsetenv("KN_EPILOGUE");
    free(kept);
    kn_env_reload();
}

/* A prompt with a NaN and an infinity among its activations: the packed
 * path cannot quantize those rows and hands the matmul on; every row must
 * still match the reference (NaN where it has NaN, the rest within bound) */
TEST(non_finite_activations_through_packed_copy) {
    kn_test_seed(74);
    const int64_t rows = 48, K = 256, T = 40;
    for (size_t ti = 0; ti < NTYPES; ti++) {
        kn_dtype t = TYPES[ti];
        void *w = malloc(kn_dtype_nbytes(t, rows * K));
        fill_raw(t, w, rows, K);
        static float x[40 * 256], ref[40 * 48], got[40 * 48];
        kn_test_fill_f32(x, T * K, -1, 1);
        x[5 * K + 3] = NAN;
        x[17 * K + 200] = INFINITY;
        for (int one = 0; one < 2; one++) {   /* the prompt, then a decode step of its NaN row */
        const float *xs = one ? x + 5 * K : x;
        int64_t nt = one ? 1 : T;
        matmul(kn_backend_ref(), t, w, rows, 0, rows, K, false, xs, nt, ref, NULL);
        matmul(kn_backend_cpu(), t, w, rows, 0, rows, K, true, xs, nt, got, NULL);
        int64_t bad = 0, first = -1;
        double num = 0, den = 0;
        for (int64_t i = 0; i < nt * rows; i++) {
            if (isnan(ref[i]) || isinf(ref[i])) {
                if (!(isnan(got[i]) == isnan(ref[i]) && (isnan(ref[i]) || got[i] == ref[i]))) { bad++; if (first < 0) first = i; }
            } else if (!isfinite(got[i])) {
                bad++; if (first < 0) first = i;
            } else { num += (got[i] - ref[i]) * (got[i] - ref[i]); den += ref[i] * ref[i]; }
        }
        CHECK(!bad, "%s, %lld rows: %lld outputs differ in NaN / inf from the reference, first [%lld] %g vs %g",
              kn_dtype_name(t), (long long)nt, (long long)bad, (long long)first, first >= 0 ? got[first] : 0,
              first >= 0 ? ref[first] : 0);
        CHECK(den == 0 || sqrt(num / den) < 3e-2, "%s: finite outputs rel err %.3g", kn_dtype_name(t), sqrt(num / den));
        }
        free(w);
    }
}

/* KN_QPACK=0: a constant buffer gets no packed copy, the row dots answer */
TEST(qpack_off_by_environment) {
    bool can = kn_cpu()->isa >= KN_ISA_AVX512 && kn_cpu()->avx512vnni;
#ifdef KN_NO_AVX512
    can = false;
#endif
    if (!can) SKIP("no AVX512-VNNI: nothing is packed on this CPU either way");
    kn_test_seed(73);
    const int64_t rows = 32, K = 64;
    void *w = malloc(kn_dtype_nbytes(KN_Q8_0, rows * K));
    fill_raw(KN_Q8_0, w, rows, K);
    float x[64], on[32], off[32];
    kn_test_fill_f32(x, K, -1, 1);
    char *keep = getenv("KN_QPACK") ? strdup(getenv("KN_QPACK")) : NULL;
    bool packed_on = false, packed_off = true;
    setenv("KN_QPACK", "1", 1); kn_env_reload();
    matmul(kn_backend_cpu(), KN_Q8_0, w, rows, 0, rows, K, true, x, 1, on, &packed_on);
    setenv("KN_QPACK", "0", 1); kn_env_reload();
    matmul(kn_backend_cpu(), KN_Q8_0, w, rows, 0, rows, K, true, x, 1, off, &packed_off);
    if (keep) setenv("KN_QPACK", keep, 1); else unsetenv("KN_QPACK");
    kn_env_reload();
    free(keep);
    CHECK(packed_on && !packed_off, "packed copy with KN_QPACK=1: %d, with KN_QPACK=0: %d", packed_on, packed_off);
    double num = 0, den = 0;
    for (int i = 0; i < rows; i++) { num += (on[i] - off[i]) * (on[i] - off[i]); den += off[i] * off[i]; }
    CHECK(sqrt(num / den) < 1e-5, "packed and row dots differ by %.3g", sqrt(num / den));
    free(w);
}

TEST(constant_tensors_refuse_writes) {
    kn_ctx *ctx = kn_ctx_new(&(kn_ctx_opts){kn_backend_cpu()});
    float v[4] = {1, 2, 3, 4};
    kn_tensor *a = kn_from_data(ctx, KN_F32, 1, (int64_t[]){4}, v);
    CHECK(kn_tensor_write(a, v, KN_F32) == KN_OK, "writable before");
    CHECK(kn_set_constant(a) == KN_OK, "%s", kn_last_error());
    CHECK(kn_tensor_write(a, v, KN_F32) == KN_ERR_STATE && strstr(kn_last_error(), "constant"), "refused: %s", kn_last_error());
    kn_tensor *lazy = kn_add(ctx, a, a);
    CHECK(kn_set_constant(lazy) == KN_ERR_INVALID && strstr(kn_last_error(), "materialised"), "lazy refused: %s", kn_last_error());
    CHECK(kn_set_constant(NULL) == KN_ERR_INVALID, "NULL refused");
    kn_ctx_free(ctx);
}

KN_TEST_MAIN()
