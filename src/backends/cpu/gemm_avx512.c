/* gemm_avx512.c: AVX-512F kernels for gemm.c: the 14x32 micro-kernel and the
 * two matrix-vector forms. Scalar twins: the *_generic functions in gemm.c.
 * Compiled with the AVX-512 flags (Makefile rule for *_avx512.c); only called
 * when kn_cpu() reports AVX-512. Kept deliberately plain: the development
 * machine cannot run it, so every loop mirrors its AVX2 sibling. */
#include "backends/cpu/gemm.h"   // defines: kernel signatures
#include <immintrin.h>

/* ---- micro-kernel ------------------------------------------------------------
 * Per k step: two 16-wide loads of the packed B row, 14 broadcasts of the packed
 * A column (compilers fold them into the FMA as {1to16} memory operands), 28
 * FMAs into c<i>0, c<i>1. Ap holds 14 floats per k, Bp 32. */
/* Accumulators are named registers (c<row><half>), not an array: compilers keep
 * arrays of vectors in memory at -O2. */
/* row i of the tile += the float v times the B row b0, b1 */
#define ROW_FMA(i, v)                                                           \
    do { const __m512 a = _mm512_set1_ps(v);                                    \
         c##i##0 = _mm512_fmadd_ps(a, b0, c##i##0);                             \
         c##i##1 = _mm512_fmadd_ps(a, b1, c##i##1); } while (0)
#define STORE_ROW(i)                                                            \
    do { float *r = C + (i) * ldc;                                              \
         __m512 v0 = _mm512_mul_ps(va, c##i##0), v1 = _mm512_mul_ps(va, c##i##1); \
         if (beta != 0.0f) {                                                    \
             v0 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(r), v0);                  \
             v1 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(r + 16), v1);             \
         }                                                                      \
         _mm512_storeu_ps(r, v0); _mm512_storeu_ps(r + 16, v1); } while (0)
/* The 28 accumulators c<row><half>, zeroed, and the tile's C rows prefetched */
#define TILE_START()                                                            \
    __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, \
           c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, \
           c70 = c00, c71 = c00, c80 = c00, c81 = c00, c90 = c00, c91 = c00, c100 = c00, c101 = c00, \
           c110 = c00, c111 = c00, c120 = c00, c121 = c00, c130 = c00, c131 = c00; \
    for (int i = 0; i < 14; i++) {                                              \
        _mm_prefetch((const char *)(C + i * ldc), _MM_HINT_T0);                 \
        _mm_prefetch((const char *)(C + i * ldc + 31), _MM_HINT_T0);            \
    }
/* C = alpha * tile + beta * C (beta == 0: C not read) */
#define TILE_STORE()                                                            \
    do { const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);     \
         STORE_ROW(0); STORE_ROW(1); STORE_ROW(2);  STORE_ROW(3);  STORE_ROW(4);  STORE_ROW(5);  STORE_ROW(6); \
         STORE_ROW(7); STORE_ROW(8); STORE_ROW(9); STORE_ROW(10); STORE_ROW(11); STORE_ROW(12); STORE_ROW(13); } while (0)

void kn_sgemm_ukr_14x32_avx512(int64_t kc, const float *Ap, const float *Bp,
                               float *C, int64_t ldc, float alpha, float beta) {
    TILE_START();
#define STEP()                                                                  \
    do { const __m512 b0 = _mm512_load_ps(Bp), b1 = _mm512_load_ps(Bp + 16);     \
         ROW_FMA(0, Ap[0]); ROW_FMA(1, Ap[1]); ROW_FMA(2, Ap[2]);  ROW_FMA(3, Ap[3]);  ROW_FMA(4, Ap[4]);   \
         ROW_FMA(5, Ap[5]); ROW_FMA(6, Ap[6]); ROW_FMA(7, Ap[7]);  ROW_FMA(8, Ap[8]);  ROW_FMA(9, Ap[9]);   \
         ROW_FMA(10, Ap[10]); ROW_FMA(11, Ap[11]); ROW_FMA(12, Ap[12]); ROW_FMA(13, Ap[13]);           \
         Ap += 14; Bp += 32; } while (0)
    /* Not unrolled: with 30 of 32 registers live, unrolling makes gcc 12 spill
     * accumulators; the loop overhead is 3 instructions in ~45. */
    for (int64_t k = 0; k < kc; k++) {
        _mm_prefetch((const char *)(Ap + 14 * 8), _MM_HINT_T0);
        STEP();
    }
#undef STEP
    TILE_STORE();
}

/* ---- micro-kernel reading rows of A where they lie -------------------------
 * The same 14x32 tile with its 14 rows of A read in place (lda apart): no
 * packed copy of A (gemm.c uses it when each A panel would serve only a few B
 * panels, so packing costs more than it saves). The rows are reached from
 * five row pointers (rows 0, 3, 6, 9, 12) plus lda and 2 lda, so few
 * registers hold addresses. */
void kn_sgemm_ukr_14x32_direct_avx512(int64_t kc, const float *A, int64_t lda, const float *Bp,
                                      float *C, int64_t ldc, float alpha, float beta) {
    TILE_START();
    const float *a0 = A, *a3 = A + 3 * lda, *a6 = A + 6 * lda, *a9 = A + 9 * lda, *a12 = A + 12 * lda;
    const int64_t l2 = 2 * lda;
    for (int64_t k = 0; k < kc; k++) {
        const __m512 b0 = _mm512_load_ps(Bp), b1 = _mm512_load_ps(Bp + 16);
        ROW_FMA(0, a0[0]);  ROW_FMA(1, a0[lda]);  ROW_FMA(2, a0[l2]);
        ROW_FMA(3, a3[0]);  ROW_FMA(4, a3[lda]);  ROW_FMA(5, a3[l2]);
        ROW_FMA(6, a6[0]);  ROW_FMA(7, a6[lda]);  ROW_FMA(8, a6[l2]);
        ROW_FMA(9, a9[0]);  ROW_FMA(10, a9[lda]); ROW_FMA(11, a9[l2]);
        ROW_FMA(12, a12[0]); ROW_FMA(13, a12[lda]);
        a0++; a3++; a6++; a9++; a12++; Bp += 32;
    }
    TILE_STORE();
}
#undef ROW_FMA
#undef STORE_ROW
#undef TILE_START
#undef TILE_STORE

/* ---- matrix-vector ---------------------------------------------------------- */
/* ---- rows of 8 (attention heads of dimension 8 over a contiguous cache) ----
 * The general kernels give a row of 8 half a register and one horizontal sum
 * each; here a register holds two rows and 16 rows' sums come out of one
 * transposing reduction (unpack, shuffle, then 128-bit lane shuffles):
 * about 2 instructions a row instead of 12. */

/* rows 2j, 2j+1 of X as one register; rows at or past n load as zeros */
static inline __m512 rows8_pair(const float *X, int j, int64_t n) {
    int64_t left = n - 2 * j;
    __mmask16 m = left >= 2 ? 0xffff : left == 1 ? 0x00ff : 0;
    return _mm512_maskz_loadu_ps(m, X + 16 * j);
}
/* y[i] = X[i, 0..8) . x for n rows (16 at a time, the last ones masked) */
static void rows8_dot(int64_t n, const float *X, const float *x, float *y) {
    const __m512 xx = _mm512_broadcast_f32x8(_mm256_loadu_ps(x));
    /* after the three steps, lanes hold rows 0 2 4 6 | 1 3 5 7 | 8 10 12 14 | 9 11 13 15 */
    const __m512i order = _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
    for (int64_t i = 0; i < n; i += 16, X += 128) {
        int64_t m = n - i < 16 ? n - i : 16;
        __m512 p[8];
        for (int j = 0; j < 8; j++) p[j] = _mm512_mul_ps(rows8_pair(X, j, m), xx);
        /* 1: per 128-bit lane, rows 2j and 2j+2 (or 2j+1, 2j+3) interleaved: dims {0,2} and {1,3} summed */
        __m512 a[4];
        for (int j = 0; j < 4; j++)
            a[j] = _mm512_add_ps(_mm512_unpacklo_ps(p[2 * j], p[2 * j + 1]), _mm512_unpackhi_ps(p[2 * j], p[2 * j + 1]));
        /* 2: four rows' sums over 4 dims a lane (lane 0: dims 0-3 of rows 0 2 4 6, lane 1: dims 4-7) */
        __m512 b0 = _mm512_add_ps(_mm512_shuffle_ps(a[0], a[1], 0x44), _mm512_shuffle_ps(a[0], a[1], 0xee));
        __m512 b1 = _mm512_add_ps(_mm512_shuffle_ps(a[2], a[3], 0x44), _mm512_shuffle_ps(a[2], a[3], 0xee));
        /* 3: dims 0-3 + 4-7 (128-bit lanes 0 + 1 and 2 + 3 of each) */
        __m512 c = _mm512_add_ps(_mm512_shuffle_f32x4(b0, b1, 0x88), _mm512_shuffle_f32x4(b0, b1, 0xdd));
        _mm512_mask_storeu_ps(y + i, (__mmask16)((1u << m) - 1u), _mm512_permutexvar_ps(order, c));
    }
}
/* y[0..8) = sum_i x[i] X[i, 0..8): a register holds rows 2j, 2j+1, each
 * half multiplied by its row's weight (x[2j] broadcast over lanes 0-7,
 * x[2j+1] over 8-15); the halves are added at the end */
static void rows8_axpy(int64_t n, const float *X, const float *x, float *y) {
    const __m512i half = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    __m512 acc0 = _mm512_setzero_ps(), acc1 = acc0;
    for (int64_t i = 0; i < n; i += 16, X += 128) {
        int64_t m = n - i < 16 ? n - i : 16;
        const __m512 w = _mm512_maskz_loadu_ps((__mmask16)((1u << m) - 1u), x + i);
        for (int j = 0; j < 8; j += 2) {
            __m512 w0 = _mm512_permutexvar_ps(_mm512_add_epi32(half, _mm512_set1_epi32(2 * j)), w);
            __m512 w1 = _mm512_permutexvar_ps(_mm512_add_epi32(half, _mm512_set1_epi32(2 * j + 2)), w);
            acc0 = _mm512_fmadd_ps(rows8_pair(X, j, m), w0, acc0);
            acc1 = _mm512_fmadd_ps(rows8_pair(X, j + 1, m), w1, acc1);
        }
    }
    __m512 acc = _mm512_add_ps(acc0, acc1);
    _mm256_storeu_ps(y, _mm256_add_ps(_mm512_castps512_ps256(acc), _mm512_extractf32x8_ps(acc, 1)));
}

void kn_sgemv_dot_avx512(int64_t rows, int64_t K, const float *X, int64_t ld,
                         const float *x, float *y) {
    if (K == 8 && ld == 8) { rows8_dot(rows, X, x, y); return; }
    /* One row at a time, left to right: the product is bound by reading X,
     * and one sequential stream is what the prefetchers follow. Four rows
     * interleaved (x loaded once for four) read 12 GB/s on a Zen 4 core
     * where this reads 27 (stories15M's K = 288; 22 against 29 at 2048 x 2048). */
    const int64_t k64 = K & ~(int64_t)63, kt = K & ~(int64_t)15;
    const __mmask16 tail = (__mmask16)((1u << (K - kt)) - 1u);
    for (int64_t i = 0; i < rows; i++) {
        const float *r = X + i * ld;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        int64_t k = 0;
        for (; k < k64; k += 64) {
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(r + k), _mm512_loadu_ps(x + k), a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(r + k + 16), _mm512_loadu_ps(x + k + 16), a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(r + k + 32), _mm512_loadu_ps(x + k + 32), a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(r + k + 48), _mm512_loadu_ps(x + k + 48), a3);
        }
        for (; k < kt; k += 16) a0 = _mm512_fmadd_ps(_mm512_loadu_ps(r + k), _mm512_loadu_ps(x + k), a0);
        if (tail) a1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, r + kt), _mm512_maskz_loadu_ps(tail, x + kt), a1);
        y[i] = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    }
}

/* y (in L1) += x[k..k+3] * four rows of X, each row streamed once; a masked
 * load/store finishes the columns. */
void kn_sgemv_axpy_avx512(int64_t K, int64_t cols, const float *X, int64_t ld,
                          const float *x, float *y) {
    if (cols == 8 && ld == 8) { rows8_axpy(K, X, x, y); return; }
    const int64_t jt = cols & ~(int64_t)15;
    const __mmask16 tail = (__mmask16)((1u << (cols - jt)) - 1u);
    for (int64_t j = 0; j < cols; j++) y[j] = 0.0f;
    int64_t k = 0;
    for (; k + 4 <= K; k += 4) {
        const float *r0 = X + k * ld, *r1 = r0 + ld, *r2 = r1 + ld, *r3 = r2 + ld;
        const __m512 x0 = _mm512_set1_ps(x[k]), x1 = _mm512_set1_ps(x[k + 1]);
        const __m512 x2 = _mm512_set1_ps(x[k + 2]), x3 = _mm512_set1_ps(x[k + 3]);
        for (int64_t j = 0; j < jt; j += 16) {
            __m512 s = _mm512_loadu_ps(y + j);
            __m512 t = _mm512_mul_ps(x1, _mm512_loadu_ps(r1 + j));
            s = _mm512_fmadd_ps(x0, _mm512_loadu_ps(r0 + j), s);
            t = _mm512_fmadd_ps(x3, _mm512_loadu_ps(r3 + j), t);
            s = _mm512_fmadd_ps(x2, _mm512_loadu_ps(r2 + j), s);
            _mm512_storeu_ps(y + j, _mm512_add_ps(s, t));
        }
        if (tail) {
            __m512 s = _mm512_maskz_loadu_ps(tail, y + jt);
            __m512 t = _mm512_mul_ps(x1, _mm512_maskz_loadu_ps(tail, r1 + jt));
            s = _mm512_fmadd_ps(x0, _mm512_maskz_loadu_ps(tail, r0 + jt), s);
            t = _mm512_fmadd_ps(x3, _mm512_maskz_loadu_ps(tail, r3 + jt), t);
            s = _mm512_fmadd_ps(x2, _mm512_maskz_loadu_ps(tail, r2 + jt), s);
            _mm512_mask_storeu_ps(y + jt, tail, _mm512_add_ps(s, t));
        }
    }
    for (; k < K; k++) {
        const float *r = X + k * ld;
        const __m512 xk = _mm512_set1_ps(x[k]);
        for (int64_t j = 0; j < jt; j += 16)
            _mm512_storeu_ps(y + j, _mm512_fmadd_ps(xk, _mm512_loadu_ps(r + j), _mm512_loadu_ps(y + j)));
        if (tail)
            _mm512_mask_storeu_ps(y + jt, tail,
                _mm512_fmadd_ps(xk, _mm512_maskz_loadu_ps(tail, r + jt), _mm512_maskz_loadu_ps(tail, y + jt)));
    }
}
