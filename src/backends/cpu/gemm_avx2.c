/* gemm_avx2.c: AVX2+FMA kernels for gemm.c: the 6x16 micro-kernel and the two
 * matrix-vector forms. Scalar twins: the *_generic functions in gemm.c.
 * Compiled with -mavx2 -mfma -mf16c (Makefile rule for *_avx2.c); only called
 * when kn_cpu() reports AVX2. */
#include "backends/cpu/gemm.h"   // defines: kernel signatures
#include "backends/quant/quant_x86.h"   // defines: dot_f32_avx2 (also the f32 weights' row dot of quant_avx2.c)
#include <immintrin.h>

/* ---- micro-kernel ------------------------------------------------------------
 * Per k step: two 8-wide loads of the packed B row, six broadcasts of the packed
 * A column, twelve FMAs into c[i][0..1]. Ap holds 6 floats per k, Bp 16. */
/* row i of the tile += the float at p times the B row b0, b1 */
#define ROW_FMA(i, p)                                                           \
    do { const __m256 a = _mm256_broadcast_ss(p);                               \
         c##i##0 = _mm256_fmadd_ps(a, b0, c##i##0);                             \
         c##i##1 = _mm256_fmadd_ps(a, b1, c##i##1); } while (0)
#define STEP()                                                                  \
    do { const __m256 b0 = _mm256_load_ps(Bp), b1 = _mm256_load_ps(Bp + 8);     \
         ROW_FMA(0, Ap); ROW_FMA(1, Ap + 1); ROW_FMA(2, Ap + 2);                \
         ROW_FMA(3, Ap + 3); ROW_FMA(4, Ap + 4); ROW_FMA(5, Ap + 5);            \
         Ap += 6; Bp += 16; } while (0)
#define STORE_ROW(i)                                                            \
    do { float *r = C + (i) * ldc;                                              \
         __m256 v0 = _mm256_mul_ps(va, c##i##0), v1 = _mm256_mul_ps(va, c##i##1); \
         if (beta != 0.0f) {                                                    \
             v0 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(r), v0);                  \
             v1 = _mm256_fmadd_ps(vb, _mm256_loadu_ps(r + 8), v1);              \
         }                                                                      \
         _mm256_storeu_ps(r, v0); _mm256_storeu_ps(r + 8, v1); } while (0)
/* The 12 accumulators c<row><half>, zeroed, and the tile's C rows prefetched
 * (64 bytes a row, maybe 2 lines) */
#define TILE_START()                                                            \
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, \
           c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;   \
    for (int i = 0; i < 6; i++) {                                               \
        _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);                 \
        _mm_prefetch((const char *)(C + i * ldc + 15), _MM_HINT_T0);            \
    }
/* C = alpha * tile + beta * C (beta == 0: C not read) */
#define TILE_STORE()                                                            \
    do { const __m256 va = _mm256_set1_ps(alpha), vb = _mm256_set1_ps(beta);     \
         STORE_ROW(0); STORE_ROW(1); STORE_ROW(2); STORE_ROW(3); STORE_ROW(4); STORE_ROW(5); } while (0)

void kn_sgemm_ukr_6x16_avx2(int64_t kc, const float *Ap, const float *Bp,
                            float *C, int64_t ldc, float alpha, float beta) {
    TILE_START();
    int64_t k = 0;
    for (; k + 4 <= kc; k += 4) {
        _mm_prefetch((const char *)(Ap + 96), _MM_HINT_T0);
        STEP(); STEP(); STEP(); STEP();
    }
    for (; k < kc; k++) STEP();
    TILE_STORE();
}

/* The same tile with its 6 rows of A read in place, lda apart (gemm.h,
 * kn_sgemm_ukr_direct_fn), from two row pointers plus lda and 2 lda. */
void kn_sgemm_ukr_6x16_direct_avx2(int64_t kc, const float *A, int64_t lda, const float *Bp,
                                   float *C, int64_t ldc, float alpha, float beta) {
    TILE_START();
    const float *a0 = A, *a3 = A + 3 * lda;
    const int64_t l2 = 2 * lda;
    for (int64_t k = 0; k < kc; k++, a0++, a3++, Bp += 16) {
        const __m256 b0 = _mm256_load_ps(Bp), b1 = _mm256_load_ps(Bp + 8);
        ROW_FMA(0, a0); ROW_FMA(1, a0 + lda); ROW_FMA(2, a0 + l2);
        ROW_FMA(3, a3); ROW_FMA(4, a3 + lda); ROW_FMA(5, a3 + l2);
    }
    TILE_STORE();
}
#undef TILE_START
#undef TILE_STORE
#undef ROW_FMA
#undef STEP
#undef STORE_ROW

/* ---- matrix-vector ---------------------------------------------------------- */
/* One row at a time, left to right, four accumulators (independent FMA
 * chains, dot_f32_avx2): the product is bound by reading X, and one
 * sequential stream is what the prefetchers follow (four rows interleaved,
 * sharing each x load, read 14 GB/s on a Zen 4 core where this reads 29;
 * K = 288). */
void kn_sgemv_dot_avx2(int64_t rows, int64_t K, const float *X, int64_t ld,
                       const float *x, float *y) {
    for (int64_t i = 0; i < rows; i++) y[i] = dot_f32_avx2(K, X + i * ld, x);
}

/* y (cols <= a few thousand, stays in L1) += x[k..k+3] * four rows, streaming
 * each row of X once, left to right. */
void kn_sgemv_axpy_avx2(int64_t K, int64_t cols, const float *X, int64_t ld,
                        const float *x, float *y) {
    for (int64_t j = 0; j < cols; j++) y[j] = 0.0f;
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
        const float *r0 = X + k * ld, *r1 = r0 + ld, *r2 = r1 + ld, *r3 = r2 + ld;
        const __m256 x0 = _mm256_set1_ps(x[k]), x1 = _mm256_set1_ps(x[k + 1]);
        const __m256 x2 = _mm256_set1_ps(x[k + 2]), x3 = _mm256_set1_ps(x[k + 3]);
        int64_t j = 0;
        for (; j + 8 <= cols; j += 8) {
            __m256 s = _mm256_loadu_ps(y + j);
            __m256 t = _mm256_mul_ps(x1, _mm256_loadu_ps(r1 + j));
            s = _mm256_fmadd_ps(x0, _mm256_loadu_ps(r0 + j), s);
            t = _mm256_fmadd_ps(x3, _mm256_loadu_ps(r3 + j), t);
            s = _mm256_fmadd_ps(x2, _mm256_loadu_ps(r2 + j), s);
            _mm256_storeu_ps(y + j, _mm256_add_ps(s, t));
        }
        for (; j < cols; j++) y[j] += x[k] * r0[j] + x[k + 1] * r1[j] + x[k + 2] * r2[j] + x[k + 3] * r3[j];
    }
    for (; k < K; k++) {
        const float *r = X + k * ld;
        const __m256 xk = _mm256_set1_ps(x[k]);
        int64_t j = 0;
        for (; j + 8 <= cols; j += 8)
            _mm256_storeu_ps(y + j, _mm256_fmadd_ps(xk, _mm256_loadu_ps(r + j), _mm256_loadu_ps(y + j)));
        for (; j < cols; j++) y[j] += x[k] * r[j];
    }
}

/* ---- transposing pack ---------------------------------------------------------
 * dst[k*dstride + i] = src[i*ld + k] for i < rows, k < kc: packs rows of a
 * row-major operand into k-major micro-panels (op(A) not transposed, op(B)
 * transposed). Groups of 8 (or 6) rows go through an 8x8 register transpose,
 * 8 k at a time; other group sizes and the k tail are scalar. */
static void pack_t_group(const float *src, int64_t ld, int g, int64_t kc, float *dst, int64_t ds) {
    const float *r[8];
    for (int i = 0; i < 8; i++) r[i] = src + (i < g ? i : 0) * ld;
    int64_t k = 0;
    if (g == 8 || g == 6) {
        const __m256 z = _mm256_setzero_ps();
        for (; k + 8 <= kc; k += 8) {
            const __m256 a0 = _mm256_loadu_ps(r[0] + k), a1 = _mm256_loadu_ps(r[1] + k);
            const __m256 a2 = _mm256_loadu_ps(r[2] + k), a3 = _mm256_loadu_ps(r[3] + k);
            const __m256 a4 = _mm256_loadu_ps(r[4] + k), a5 = _mm256_loadu_ps(r[5] + k);
            const __m256 a6 = g == 8 ? _mm256_loadu_ps(r[6] + k) : z;
            const __m256 a7 = g == 8 ? _mm256_loadu_ps(r[7] + k) : z;
            const __m256 t0 = _mm256_unpacklo_ps(a0, a1), t1 = _mm256_unpackhi_ps(a0, a1);
            const __m256 t2 = _mm256_unpacklo_ps(a2, a3), t3 = _mm256_unpackhi_ps(a2, a3);
            const __m256 t4 = _mm256_unpacklo_ps(a4, a5), t5 = _mm256_unpackhi_ps(a4, a5);
            const __m256 t6 = _mm256_unpacklo_ps(a6, a7), t7 = _mm256_unpackhi_ps(a6, a7);
            const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
            const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
            const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
            const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
            __m256 c[8];                     /* c[j] = column k+j: rows 0..7 */
            c[0] = _mm256_permute2f128_ps(s0, s4, 0x20); c[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
            c[1] = _mm256_permute2f128_ps(s1, s5, 0x20); c[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
            c[2] = _mm256_permute2f128_ps(s2, s6, 0x20); c[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
            c[3] = _mm256_permute2f128_ps(s3, s7, 0x20); c[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
            float *d = dst + k * ds;
            if (g == 8) {
                for (int j = 0; j < 8; j++) _mm256_storeu_ps(d + j * ds, c[j]);
            } else {
                for (int j = 0; j < 8; j++) {
                    _mm_storeu_ps(d + j * ds, _mm256_castps256_ps128(c[j]));
                    _mm_storel_pi((__m64 *)(void *)(d + j * ds + 4), _mm256_extractf128_ps(c[j], 1));
                }
            }
        }
    }
    for (; k < kc; k++)
        for (int i = 0; i < g; i++) dst[k * ds + i] = r[i][k];
}

void kn_sgemm_pack_t_avx2(const float *src, int64_t ld, int rows, int64_t kc, float *dst, int64_t dstride) {
    for (int i0 = 0; i0 < rows; i0 += 8)
        pack_t_group(src + i0 * ld, ld, rows - i0 < 8 ? rows - i0 : 8, kc, dst + i0, dstride);
}
