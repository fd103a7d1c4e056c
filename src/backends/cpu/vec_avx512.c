/* vec_avx512.c: AVX-512 (F/BW/VL/DQ) versions of the f32 row kernels in vec.h.
 *
 * The same algorithms and polynomial coefficients as vec_avx2.c, on 16 lanes,
 * with masked loads/stores for every tail (so no scalar tail loops). exp scales
 * with vscalefps instead of building 2^n by hand. The development machine has
 * no AVX-512: this file is compiled there but its tests run only on an AVX-512
 * CPU (tests/test_vec.c runs every path the CPU supports).
 *
 * f32 -> bf16 does not use AVX512_BF16 vcvtneps2bf16: that instruction flushes
 * subnormal inputs to zero, while core/fp16.h (the reference these conversions
 * must match bit for bit) rounds them; the integer rounding below is as fast
 * for this memory-bound loop.
 *
 * Non-goals: gathers, aligned-only fast paths, non-temporal stores.
 */
#include "backends/cpu/vec.h"   // defines: kn_vec_impl, KN_VEC_SUM_BLOCK
#include <immintrin.h>
#include <math.h>

typedef __m512 W;
#define SET1 _mm512_set1_ps
#define LD _mm512_loadu_ps
#define ST _mm512_storeu_ps
#define MLD(m, p) _mm512_maskz_loadu_ps((m), (p))
#define MST(p, m, v) _mm512_mask_storeu_ps((p), (m), (v))

/* ============================================================================
 * Helpers
 * ========================================================================== */

/* Lanes [0, r) set, r in 1..15. */
static inline __mmask16 tail_mask(int64_t r) { return (__mmask16)((1u << r) - 1u); }
static inline W absw(W x) { return _mm512_abs_ps(x); }
static inline W orw(W a, W b) {
    return _mm512_castsi512_ps(_mm512_or_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)));
}
static inline W signw(W x) {
    return _mm512_castsi512_ps(_mm512_and_epi32(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)));
}
static inline __m512d acc_d(__m512d acc, W v) {
    __m256 lo = _mm512_castps512_ps256(v);
    __m256 hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
    acc = _mm512_add_pd(acc, _mm512_cvtps_pd(lo));
    return _mm512_add_pd(acc, _mm512_cvtps_pd(hi));
}

/* ============================================================================
 * Vector math (16 lanes); see vec_avx2.c for the derivations. NaN inputs give
 * NaN: clamps are min/max(constant, x), which return x when x is NaN.
 * ========================================================================== */

static inline W exp16(W x) {
    x = _mm512_min_ps(SET1(88.8f), x);
    x = _mm512_max_ps(SET1(-104.0f), x);
    W n = _mm512_roundscale_ps(_mm512_mul_ps(x, SET1(1.44269502f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    W r = _mm512_fnmadd_ps(n, SET1(0.693147182f), x);
    r = _mm512_fnmadd_ps(n, SET1(-1.90465432e-09f), r);
    W p = SET1(0.00139485905f);
    p = _mm512_fmadd_ps(p, r, SET1(0.00837513525f));
    p = _mm512_fmadd_ps(p, r, SET1(0.0416662171f));
    p = _mm512_fmadd_ps(p, r, SET1(0.166664153f));
    p = _mm512_fmadd_ps(p, r, SET1(0.5f));
    p = _mm512_fmadd_ps(p, r, SET1(1.0f));
    p = _mm512_fmadd_ps(p, r, SET1(1.0f));
    return _mm512_scalef_ps(p, n);             /* p * 2^n, one rounding, over/underflow ok */
}

static inline W log16(W x) {
    __mmask16 tiny = _mm512_cmp_ps_mask(x, SET1(1.17549435e-38f), _CMP_LT_OQ);
    W xs = _mm512_mask_mul_ps(x, tiny, x, SET1(8388608.0f));         /* subnormals * 2^23 */
    __m512i ix = _mm512_castps_si512(xs);
    __m512i ei = _mm512_sub_epi32(_mm512_srli_epi32(ix, 23), _mm512_set1_epi32(127));
    W m = _mm512_castsi512_ps(_mm512_or_epi32(_mm512_and_epi32(ix, _mm512_set1_epi32(0x007fffff)),
                                              _mm512_set1_epi32(0x3f800000)));
    W e = _mm512_mask_sub_ps(_mm512_cvtepi32_ps(ei), tiny, _mm512_cvtepi32_ps(ei), SET1(23.0f));
    __mmask16 big = _mm512_cmp_ps_mask(m, SET1(1.41421356f), _CMP_GT_OQ);
    m = _mm512_mask_mul_ps(m, big, m, SET1(0.5f));
    e = _mm512_mask_add_ps(e, big, e, SET1(1.0f));
    W f = _mm512_sub_ps(m, SET1(1.0f));
    W s = _mm512_div_ps(f, _mm512_add_ps(SET1(2.0f), f));
    W z = _mm512_mul_ps(s, s);
    W R = _mm512_fmadd_ps(SET1(2.0f / 11), z, SET1(2.0f / 9));
    R = _mm512_fmadd_ps(R, z, SET1(2.0f / 7));
    R = _mm512_fmadd_ps(R, z, SET1(2.0f / 5));
    R = _mm512_fmadd_ps(R, z, SET1(2.0f / 3));
    R = _mm512_mul_ps(R, z);
    W hfsq = _mm512_mul_ps(_mm512_mul_ps(SET1(0.5f), f), f);
    W t = _mm512_fmadd_ps(s, _mm512_add_ps(hfsq, R), _mm512_mul_ps(e, SET1(-1.90465432e-09f)));
    W res = _mm512_fmsub_ps(e, SET1(0.693147182f), _mm512_sub_ps(_mm512_sub_ps(hfsq, t), f));
    W zero = _mm512_setzero_ps();
    res = _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, zero, _CMP_EQ_OQ), SET1(-INFINITY));
    res = _mm512_mask_mov_ps(res, _mm512_cmp_ps_mask(x, zero, _CMP_LT_OQ), SET1(NAN));
    __mmask16 pass = _mm512_cmp_ps_mask(x, SET1(INFINITY), _CMP_EQ_OQ) | _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    return _mm512_mask_mov_ps(res, pass, x);
}

static inline W tanh16(W x) {
    W a = absw(x), z = _mm512_mul_ps(x, x);
    W p = SET1(0.00012176919f);
    p = _mm512_fmadd_ps(p, z, SET1(-0.000842288719f));
    p = _mm512_fmadd_ps(p, z, SET1(0.00308037712f));
    p = _mm512_fmadd_ps(p, z, SET1(-0.0085965246f));
    p = _mm512_fmadd_ps(p, z, SET1(0.0217853282f));
    p = _mm512_fmadd_ps(p, z, SET1(-0.0539532267f));
    p = _mm512_fmadd_ps(p, z, SET1(0.133332014f));
    p = _mm512_fmadd_ps(p, z, SET1(-0.333333284f));
    W small = _mm512_fmadd_ps(_mm512_mul_ps(x, z), p, x);
    small = orw(absw(small), signw(x));                     /* tanh(-0) = -0 */
    W ac = _mm512_min_ps(SET1(9.1f), a);
    W e = exp16(_mm512_add_ps(ac, ac));
    W big = _mm512_sub_ps(SET1(1.0f), _mm512_div_ps(SET1(2.0f), _mm512_add_ps(e, SET1(1.0f))));
    big = orw(big, signw(x));
    return _mm512_mask_mov_ps(big, _mm512_cmp_ps_mask(a, SET1(1.0f), _CMP_LE_OQ), small);
}

static inline W erf16(W x) {
    W a = absw(x), z = _mm512_mul_ps(x, x);
    W p = SET1(7.88249672e-05f);
    p = _mm512_fmadd_ps(p, z, SET1(-0.000801885501f));
    p = _mm512_fmadd_ps(p, z, SET1(0.00518931216f));
    p = _mm512_fmadd_ps(p, z, SET1(-0.0268543288f));
    p = _mm512_fmadd_ps(p, z, SET1(0.112835974f));
    p = _mm512_fmadd_ps(p, z, SET1(-0.37612626f));
    p = _mm512_fmadd_ps(p, z, SET1(1.12837911f));
    W small = _mm512_mul_ps(x, p);
    W ac = _mm512_min_ps(SET1(4.0f), _mm512_max_ps(SET1(1.0f), a));
    W t = _mm512_div_ps(SET1(1.0f), ac);
    W u = _mm512_sub_ps(t, SET1(0.625f));
    W q = SET1(-0.0473638512f);
    q = _mm512_fmadd_ps(q, u, SET1(0.0548653826f));
    q = _mm512_fmadd_ps(q, u, SET1(-0.0247461293f));
    q = _mm512_fmadd_ps(q, u, SET1(-0.0112171127f));
    q = _mm512_fmadd_ps(q, u, SET1(0.0496267565f));
    q = _mm512_fmadd_ps(q, u, SET1(-0.0779847354f));
    q = _mm512_fmadd_ps(q, u, SET1(0.0721013844f));
    q = _mm512_fmadd_ps(q, u, SET1(-0.00129544886f));
    q = _mm512_fmadd_ps(q, u, SET1(-0.171585649f));
    q = _mm512_fmadd_ps(q, u, SET1(0.489524782f));
    W ec = _mm512_mul_ps(_mm512_mul_ps(exp16(_mm512_sub_ps(_mm512_setzero_ps(), _mm512_mul_ps(ac, ac))), t), q);
    W big = orw(_mm512_sub_ps(SET1(1.0f), ec), signw(x));
    return _mm512_mask_mov_ps(big, _mm512_cmp_ps_mask(a, SET1(1.0f), _CMP_LE_OQ), small);
}

/* Stable sigmoid: e = exp(-|x|); sigmoid = (x >= 0 ? 1 : e) / (1 + e). */
static inline W sigmoid_num16(W x, W *den) {
    W e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), absw(x)));
    *den = _mm512_add_ps(SET1(1.0f), e);
    return _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ), SET1(1.0f));
}
static inline W sigmoid16(W x) {
    W den, num = sigmoid_num16(x, &den);
    return _mm512_div_ps(num, den);
}
static inline W silu16(W x) {
    W den, num = sigmoid_num16(x, &den);
    return _mm512_div_ps(_mm512_mul_ps(x, num), den);
}
static inline W gelu_tanh16(W x) {
    W z = _mm512_mul_ps(x, x);
    W m2u = _mm512_mul_ps(x, _mm512_fmadd_ps(SET1(-0.0713548162f), z, SET1(-1.59576917f)));
    return _mm512_div_ps(x, _mm512_add_ps(SET1(1.0f), exp16(m2u)));
}
static inline W gelu_tanh_grad16(W x) {
    x = _mm512_min_ps(SET1(20.0f), _mm512_max_ps(SET1(-20.0f), x));   /* NaN (second operand) passes */
    W z = _mm512_mul_ps(x, x);
    W m2u = _mm512_min_ps(_mm512_mul_ps(x, _mm512_fmadd_ps(SET1(-0.0713548162f), z, SET1(-1.59576917f))), SET1(80.0f));
    W e = exp16(m2u), s = _mm512_div_ps(SET1(1.0f), _mm512_add_ps(SET1(1.0f), e));
    W q = _mm512_mul_ps(_mm512_mul_ps(s, s), e);
    W p = _mm512_fmadd_ps(SET1(0.214064449f), z, SET1(1.59576917f));
    return _mm512_fmadd_ps(_mm512_mul_ps(x, q), p, s);
}
static inline W gelu_erf16(W x) {
    W h = _mm512_mul_ps(SET1(0.5f), x);
    return _mm512_fmadd_ps(h, erf16(_mm512_mul_ps(x, SET1(0.707106769f))), h);
}
static inline W relu16(W x) { return _mm512_max_ps(_mm512_setzero_ps(), x); }
static inline W neg16(W x) {
    return _mm512_castsi512_ps(_mm512_xor_epi32(_mm512_castps_si512(x), _mm512_set1_epi32((int)0x80000000u)));
}
static inline W sqrt16(W x) { return _mm512_sqrt_ps(x); }
static inline W rsqrt16(W x) { return _mm512_div_ps(SET1(1.0f), _mm512_sqrt_ps(x)); }

/* ============================================================================
 * Elementwise
 * ========================================================================== */

#define BINARY(name, vop)                                                               \
    static void name##_avx512(float *y, const float *a, const float *b, int64_t n) {   \
        int64_t i = 0;                                                                  \
        for (; i + 32 <= n; i += 32) {                                                  \
            W a0 = LD(a + i), a1 = LD(a + i + 16), b0 = LD(b + i), b1 = LD(b + i + 16); \
            ST(y + i, vop(a0, b0)); ST(y + i + 16, vop(a1, b1));                        \
        }                                                                               \
        for (; i + 16 <= n; i += 16) ST(y + i, vop(LD(a + i), LD(b + i)));             \
        if (i < n) {                                                                    \
            __mmask16 m = tail_mask(n - i);                                             \
            MST(y + i, m, vop(MLD(m, a + i), MLD(m, b + i)));                           \
        }                                                                               \
    }
BINARY(add, _mm512_add_ps)
BINARY(sub, _mm512_sub_ps)
BINARY(mul, _mm512_mul_ps)
BINARY(div, _mm512_div_ps)

#define SCALAR_OP(name, vop)                                                            \
    static void name##_avx512(float *y, const float *a, float s, int64_t n) {          \
        W vs = SET1(s);                                                                 \
        int64_t i = 0;                                                                  \
        for (; i + 32 <= n; i += 32) {                                                  \
            W v0 = LD(a + i), v1 = LD(a + i + 16);                                      \
            ST(y + i, vop(v0, vs)); ST(y + i + 16, vop(v1, vs));                        \
        }                                                                               \
        for (; i + 16 <= n; i += 16) ST(y + i, vop(LD(a + i), vs));                     \
        if (i < n) { __mmask16 m = tail_mask(n - i); MST(y + i, m, vop(MLD(m, a + i), vs)); } \
    }
SCALAR_OP(add_scalar, _mm512_add_ps)
SCALAR_OP(mul_scalar, _mm512_mul_ps)

static void fma_scalar_avx512(float *y, const float *a, float s, int64_t n) {
    W vs = SET1(s);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        W v0 = LD(a + i), v1 = LD(a + i + 16);
        ST(y + i, _mm512_fmadd_ps(v0, vs, LD(y + i)));
        ST(y + i + 16, _mm512_fmadd_ps(v1, vs, LD(y + i + 16)));
    }
    for (; i + 16 <= n; i += 16) ST(y + i, _mm512_fmadd_ps(LD(a + i), vs, LD(y + i)));
    if (i < n) {
        __mmask16 m = tail_mask(n - i);
        MST(y + i, m, _mm512_fmadd_ps(MLD(m, a + i), vs, MLD(m, y + i)));
    }
}

static void copy_avx512(float *y, const float *a, int64_t n) {
    if (y == a) return;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) {
        W a0 = LD(a + i), a1 = LD(a + i + 16), a2 = LD(a + i + 32), a3 = LD(a + i + 48);
        ST(y + i, a0); ST(y + i + 16, a1); ST(y + i + 32, a2); ST(y + i + 48, a3);
    }
    for (; i + 16 <= n; i += 16) ST(y + i, LD(a + i));
    if (i < n) { __mmask16 m = tail_mask(n - i); MST(y + i, m, MLD(m, a + i)); }
}

/* ============================================================================
 * Unary
 * ========================================================================== */

#define UNARY_LOOP(F)                                                                   \
    do {                                                                                \
        int64_t i = 0;                                                                  \
        for (; i + 32 <= n; i += 32) {                                                  \
            W x0 = LD(x + i), x1 = LD(x + i + 16);                                      \
            ST(y + i, F(x0)); ST(y + i + 16, F(x1));                                    \
        }                                                                               \
        for (; i + 16 <= n; i += 16) ST(y + i, F(LD(x + i)));                           \
        if (i < n) { __mmask16 m = tail_mask(n - i); MST(y + i, m, F(MLD(m, x + i))); } \
    } while (0)

static void unary_avx512(kn_vec_unary_op op, float *y, const float *x, int64_t n) {
    switch (op) {
    case KN_VU_EXP:       UNARY_LOOP(exp16); break;
    case KN_VU_TANH:      UNARY_LOOP(tanh16); break;
    case KN_VU_SIGMOID:   UNARY_LOOP(sigmoid16); break;
    case KN_VU_SILU:      UNARY_LOOP(silu16); break;
    case KN_VU_GELU_TANH: UNARY_LOOP(gelu_tanh16); break;
    case KN_VU_GELU_TANH_GRAD: UNARY_LOOP(gelu_tanh_grad16); break;
    case KN_VU_GELU_ERF:  UNARY_LOOP(gelu_erf16); break;
    case KN_VU_RELU:      UNARY_LOOP(relu16); break;
    case KN_VU_NEG:       UNARY_LOOP(neg16); break;
    case KN_VU_SQRT:      UNARY_LOOP(sqrt16); break;
    case KN_VU_RSQRT:     UNARY_LOOP(rsqrt16); break;
    case KN_VU_LOG:       UNARY_LOOP(log16); break;
    default: break;
    }
}

/* ============================================================================
 * Reductions: float partial sums over KN_VEC_SUM_BLOCK elements (2 x 16 lanes,
 * each lane adds at most 32 terms), each block added into double lanes.
 * ========================================================================== */

static double sumd_avx512(const float *x, int64_t n) {
    __m512d acc = _mm512_setzero_pd();
    for (int64_t i0 = 0; i0 < n; i0 += KN_VEC_SUM_BLOCK) {
        int64_t m = n - i0 < KN_VEC_SUM_BLOCK ? n - i0 : KN_VEC_SUM_BLOCK, i = 0;
        const float *p = x + i0;
        W a0 = _mm512_setzero_ps(), a1 = a0;
        for (; i + 32 <= m; i += 32) {
            a0 = _mm512_add_ps(a0, LD(p + i)); a1 = _mm512_add_ps(a1, LD(p + i + 16));
        }
        for (; i + 16 <= m; i += 16) a0 = _mm512_add_ps(a0, LD(p + i));
        if (i < m) a1 = _mm512_add_ps(a1, MLD(tail_mask(m - i), p + i));
        acc = acc_d(acc, _mm512_add_ps(a0, a1));
    }
    return _mm512_reduce_add_pd(acc);
}
static double dotd_avx512(const float *a, const float *b, int64_t n) {
    __m512d acc = _mm512_setzero_pd();
    for (int64_t i0 = 0; i0 < n; i0 += KN_VEC_SUM_BLOCK) {
        int64_t m = n - i0 < KN_VEC_SUM_BLOCK ? n - i0 : KN_VEC_SUM_BLOCK, i = 0;
        const float *p = a + i0, *q = b + i0;
        W a0 = _mm512_setzero_ps(), a1 = a0;
        for (; i + 32 <= m; i += 32) {
            a0 = _mm512_fmadd_ps(LD(p + i), LD(q + i), a0);
            a1 = _mm512_fmadd_ps(LD(p + i + 16), LD(q + i + 16), a1);
        }
        for (; i + 16 <= m; i += 16) a0 = _mm512_fmadd_ps(LD(p + i), LD(q + i), a0);
        if (i < m) {
            __mmask16 k = tail_mask(m - i);
            a1 = _mm512_fmadd_ps(MLD(k, p + i), MLD(k, q + i), a1);
        }
        acc = acc_d(acc, _mm512_add_ps(a0, a1));
    }
    return _mm512_reduce_add_pd(acc);
}
static float sum_avx512(const float *x, int64_t n) { return (float)sumd_avx512(x, n); }
static float dot_avx512(const float *a, const float *b, int64_t n) { return (float)dotd_avx512(a, b, n); }

static float max_avx512(const float *x, int64_t n) {
    W m0 = SET1(-INFINITY), m1 = m0;
    __mmask16 bad = 0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        W v0 = LD(x + i), v1 = LD(x + i + 16);
        bad |= _mm512_cmp_ps_mask(v0, v1, _CMP_UNORD_Q);
        m0 = _mm512_max_ps(m0, v0); m1 = _mm512_max_ps(m1, v1);
    }
    for (; i + 16 <= n; i += 16) {
        W v = LD(x + i);
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m0 = _mm512_max_ps(m0, v);
    }
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        W v = _mm512_mask_loadu_ps(SET1(-INFINITY), k, x + i);
        bad |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m1 = _mm512_max_ps(m1, v);
    }
    if (bad) return NAN;
    return _mm512_reduce_max_ps(_mm512_max_ps(m0, m1));
}

/* ============================================================================
 * Rows: softmax, log_softmax, layer norm, rms norm
 * ========================================================================== */

static double sum_exp_avx512(float *y, const float *x, float mx, int64_t n) {
    W vm = SET1(mx);
    __m512d acc = _mm512_setzero_pd();
    for (int64_t i0 = 0; i0 < n; i0 += KN_VEC_SUM_BLOCK) {
        int64_t m = n - i0 < KN_VEC_SUM_BLOCK ? n - i0 : KN_VEC_SUM_BLOCK, i = 0;
        const float *p = x + i0;
        float *q = y ? y + i0 : NULL;
        W a0 = _mm512_setzero_ps(), a1 = a0;
        for (; i + 32 <= m; i += 32) {
            W e0 = exp16(_mm512_sub_ps(LD(p + i), vm)), e1 = exp16(_mm512_sub_ps(LD(p + i + 16), vm));
            if (q) { ST(q + i, e0); ST(q + i + 16, e1); }
            a0 = _mm512_add_ps(a0, e0); a1 = _mm512_add_ps(a1, e1);
        }
        for (; i + 16 <= m; i += 16) {
            W e = exp16(_mm512_sub_ps(LD(p + i), vm));
            if (q) ST(q + i, e);
            a0 = _mm512_add_ps(a0, e);
        }
        if (i < m) {
            __mmask16 k = tail_mask(m - i);
            W e = _mm512_maskz_mov_ps(k, exp16(_mm512_sub_ps(MLD(k, p + i), vm)));
            if (q) MST(q + i, k, e);
            a1 = _mm512_add_ps(a1, e);
        }
        acc = acc_d(acc, _mm512_add_ps(a0, a1));
    }
    return _mm512_reduce_add_pd(acc);
}

static void softmax_avx512(float *y, const float *x, int64_t n) {
    if (n <= 0) return;
    float mx = max_avx512(x, n);
    float s = (float)sum_exp_avx512(y, x, mx, n);
    mul_scalar_avx512(y, y, 1.0f / s, n);
}

static void softmax_bwd_avx512(float *ds, const float *p, const float *dp, const float *dcap, float scale, int64_t n) {
    W vd = SET1((float)dotd_avx512(p, dp, n)), vs = SET1(scale);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        W t = _mm512_mul_ps(_mm512_sub_ps(LD(dp + i), vd), LD(p + i));
        if (dcap) t = _mm512_mul_ps(t, LD(dcap + i));
        ST(ds + i, _mm512_mul_ps(t, vs));
    }
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        W t = _mm512_mul_ps(_mm512_sub_ps(MLD(k, dp + i), vd), MLD(k, p + i));
        if (dcap) t = _mm512_mul_ps(t, MLD(k, dcap + i));
        MST(ds + i, k, _mm512_mul_ps(t, vs));
    }
}
static void log_softmax_avx512(float *y, const float *x, int64_t n) {
    if (n <= 0) return;
    float mx = max_avx512(x, n);
    float lse = (float)log(sum_exp_avx512(NULL, x, mx, n));
    W vm = SET1(mx), vl = SET1(lse);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) ST(y + i, _mm512_sub_ps(_mm512_sub_ps(LD(x + i), vm), vl));
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        MST(y + i, k, _mm512_sub_ps(_mm512_sub_ps(MLD(k, x + i), vm), vl));
    }
}

static double sum_sqdev_avx512(const float *x, float c, int64_t n) {
    W vc = SET1(c);
    __m512d acc = _mm512_setzero_pd();
    for (int64_t i0 = 0; i0 < n; i0 += KN_VEC_SUM_BLOCK) {
        int64_t m = n - i0 < KN_VEC_SUM_BLOCK ? n - i0 : KN_VEC_SUM_BLOCK, i = 0;
        const float *p = x + i0;
        W a0 = _mm512_setzero_ps(), a1 = a0;
        for (; i + 32 <= m; i += 32) {
            W d0 = _mm512_sub_ps(LD(p + i), vc), d1 = _mm512_sub_ps(LD(p + i + 16), vc);
            a0 = _mm512_fmadd_ps(d0, d0, a0); a1 = _mm512_fmadd_ps(d1, d1, a1);
        }
        for (; i + 16 <= m; i += 16) { W d = _mm512_sub_ps(LD(p + i), vc); a0 = _mm512_fmadd_ps(d, d, a0); }
        if (i < m) {
            __mmask16 k = tail_mask(m - i);
            W d = _mm512_maskz_sub_ps(k, MLD(k, p + i), vc);
            a1 = _mm512_fmadd_ps(d, d, a1);
        }
        acc = acc_d(acc, _mm512_add_ps(a0, a1));
    }
    return _mm512_reduce_add_pd(acc);
}

static void layer_norm_avx512(float *y, const float *x, const float *w, const float *b, float eps,
                              int64_t n, float *mean_out, float *rstd_out) {
    float mean = n > 0 ? (float)(sumd_avx512(x, n) / (double)n) : 0.0f;
    float var = n > 0 ? (float)(sum_sqdev_avx512(x, mean, n) / (double)n) : 0.0f;
    float rstd = 1.0f / sqrtf(var + eps);
    W vm = SET1(mean), vr = SET1(rstd), one = SET1(1.0f), zero = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        W t = _mm512_mul_ps(_mm512_sub_ps(LD(x + i), vm), vr);
        W wv = w ? LD(w + i) : one, bv = b ? LD(b + i) : zero;
        ST(y + i, _mm512_fmadd_ps(t, wv, bv));
    }
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        W t = _mm512_mul_ps(_mm512_sub_ps(MLD(k, x + i), vm), vr);
        W wv = w ? MLD(k, w + i) : one, bv = b ? MLD(k, b + i) : zero;
        MST(y + i, k, _mm512_fmadd_ps(t, wv, bv));
    }
    if (mean_out) *mean_out = mean;
    if (rstd_out) *rstd_out = rstd;
}

static void rms_norm_avx512(float *y, const float *x, const float *w, float eps, int64_t n,
                            float *rstd_out) {
    float ms = n > 0 ? (float)(dotd_avx512(x, x, n) / (double)n) : 0.0f;
    float rstd = 1.0f / sqrtf(ms + eps);
    W vr = SET1(rstd);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        W t = _mm512_mul_ps(LD(x + i), vr);
        ST(y + i, w ? _mm512_mul_ps(t, LD(w + i)) : t);
    }
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        W t = _mm512_mul_ps(MLD(k, x + i), vr);
        MST(y + i, k, w ? _mm512_mul_ps(t, MLD(k, w + i)) : t);
    }
    if (rstd_out) *rstd_out = rstd;
}

/* norm_bwd: as norm_bwd_avx2, 16 lanes, masked tails */
static void norm_bwd_avx512(float *dx, float *dw, float *db, const float *x, const float *g, const float *w,
                            float eps, bool rms, int64_t n) {
    float mean = n > 0 && !rms ? (float)(sumd_avx512(x, n) / (double)n) : 0.0f;
    float var = n > 0 ? (float)(sum_sqdev_avx512(x, mean, n) / (double)n) : 0.0f;
    float rstd = 1.0f / sqrtf(var + eps);
    W vm = SET1(mean), one = SET1(1.0f), s0 = _mm512_setzero_ps(), s1 = s0, t0 = s0, t1 = s0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        W g0 = _mm512_mul_ps(LD(g + i), w ? LD(w + i) : one), g1 = _mm512_mul_ps(LD(g + i + 16), w ? LD(w + i + 16) : one);
        s0 = _mm512_add_ps(s0, g0); s1 = _mm512_add_ps(s1, g1);
        t0 = _mm512_fmadd_ps(g0, _mm512_sub_ps(LD(x + i), vm), t0);
        t1 = _mm512_fmadd_ps(g1, _mm512_sub_ps(LD(x + i + 16), vm), t1);
    }
    for (; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i < 16 ? n - i : 16);
        W g0 = _mm512_mul_ps(MLD(k, g + i), w ? MLD(k, w + i) : one);
        s0 = _mm512_add_ps(s0, g0);
        t0 = _mm512_fmadd_ps(g0, _mm512_maskz_sub_ps(k, MLD(k, x + i), vm), t0);
    }
    float m1 = rms || n == 0 ? 0.0f : (float)(_mm512_reduce_add_pd(acc_d(_mm512_setzero_pd(), _mm512_add_ps(s0, s1))) / (double)n);
    float m2 = n > 0 ? (float)(_mm512_reduce_add_pd(acc_d(_mm512_setzero_pd(), _mm512_add_ps(t0, t1))) / (double)n) * rstd : 0.0f;
    W vr = SET1(rstd), v1 = SET1(m1), v2 = SET1(m2);
    for (i = 0; i < n; i += 16) {
        __mmask16 k = tail_mask(n - i < 16 ? n - i : 16);
        W xv = MLD(k, x + i), gv = MLD(k, g + i), wv = w ? MLD(k, w + i) : one;
        W xh = _mm512_mul_ps(_mm512_sub_ps(xv, vm), vr);
        MST(dx + i, k, _mm512_mul_ps(vr, _mm512_sub_ps(_mm512_sub_ps(_mm512_mul_ps(gv, wv), v1), _mm512_mul_ps(xh, v2))));
        if (dw) MST(dw + i, k, _mm512_fmadd_ps(gv, xh, MLD(k, dw + i)));
        if (db) MST(db + i, k, _mm512_add_ps(gv, MLD(k, db + i)));
    }
}

/* ============================================================================
 * Conversions, bit-exact with core/fp16.h (see vec_avx2.c for the NaN fixes)
 * ========================================================================== */

static inline __m256i f32_to_f16_16(W v) {
    __m256i h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm256_mask_blend_epi16(nan, h, _mm256_and_si256(h, _mm256_set1_epi16((short)0xfe00)));
}
static void f32_to_f16_avx512(uint16_t *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(y + i), f32_to_f16_16(LD(x + i)));
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        _mm256_mask_storeu_epi16(y + i, k, f32_to_f16_16(MLD(k, x + i)));
    }
}

static inline W f16_to_f32_16(__m256i h) {
    __m512i v = _mm512_castps_si512(_mm512_cvtph_ps(h));
    __m512i h32 = _mm512_cvtepu16_epi32(h);
    __mmask16 isnan = _mm512_cmpgt_epi32_mask(_mm512_and_epi32(h32, _mm512_set1_epi32(0x7fff)),
                                              _mm512_set1_epi32(0x7c00));
    __mmask16 sig = _mm512_testn_epi32_mask(h32, _mm512_set1_epi32(0x200));
    v = _mm512_mask_andnot_epi32(v, isnan & sig, _mm512_set1_epi32(0x00400000), v);
    return _mm512_castsi512_ps(v);
}
static void f16_to_f32_avx512(float *y, const uint16_t *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) ST(y + i, f16_to_f32_16(_mm256_loadu_si256((const __m256i *)(x + i))));
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        MST(y + i, k, f16_to_f32_16(_mm256_maskz_loadu_epi16(k, x + i)));
    }
}

static inline __m512i f32_to_bf16_16(W v) {
    __m512i u = _mm512_castps_si512(v);
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i r = _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)),
                                 _mm512_and_epi32(hi, _mm512_set1_epi32(1)));
    r = _mm512_srli_epi32(r, 16);
    __mmask16 isnan = _mm512_cmpgt_epi32_mask(_mm512_and_epi32(u, _mm512_set1_epi32(0x7fffffff)),
                                              _mm512_set1_epi32(0x7f800000));
    return _mm512_mask_mov_epi32(r, isnan, _mm512_or_epi32(hi, _mm512_set1_epi32(0x40)));
}
static void f32_to_bf16_avx512(uint16_t *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(y + i), _mm512_cvtepi32_epi16(f32_to_bf16_16(LD(x + i))));
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        _mm512_mask_cvtepi32_storeu_epi16(y + i, k, f32_to_bf16_16(MLD(k, x + i)));
    }
}
/* Adam: vec.h's sequence, 16 lanes; separate multiplies and adds (no FMA:
 * the scalar twin's bits), IEEE sqrt and divide; a masked tail */
static void adam_avx512(float *p, float *m, float *v, const float *g, int64_t n, const kn_vec_adam_k *k) {
    const __m512 c0 = _mm512_set1_ps(k->c0), c1 = _mm512_set1_ps(k->c1), c2 = _mm512_set1_ps(k->c2);
    const __m512 b1c = _mm512_set1_ps(k->b1c), b2 = _mm512_set1_ps(k->b2), b2c = _mm512_set1_ps(k->b2c);
    const __m512 eps = _mm512_set1_ps(k->eps), l2 = _mm512_set1_ps(k->l2);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 mk = n - i >= 16 ? (__mmask16)0xffff : tail_mask(n - i);
        const __m512 pi = _mm512_maskz_loadu_ps(mk, p + i), mi0 = _mm512_maskz_loadu_ps(mk, m + i);
        const __m512 vi0 = _mm512_maskz_loadu_ps(mk, v + i);
        const __m512 gi = _mm512_add_ps(_mm512_maskz_loadu_ps(mk, g + i), _mm512_mul_ps(l2, pi));
        const __m512 mi = _mm512_add_ps(mi0, _mm512_mul_ps(_mm512_sub_ps(gi, mi0), b1c));
        const __m512 vi = _mm512_add_ps(_mm512_mul_ps(vi0, b2), _mm512_mul_ps(_mm512_mul_ps(gi, gi), b2c));
        const __m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), c2), eps);
        const __m512 pn = _mm512_sub_ps(_mm512_mul_ps(pi, c0), _mm512_mul_ps(_mm512_div_ps(mi, den), c1));
        _mm512_mask_storeu_ps(m + i, mk, mi);
        _mm512_mask_storeu_ps(v + i, mk, vi);
        _mm512_mask_storeu_ps(p + i, mk, pn);
    }
}

static void bf16_to_f32_avx512(float *y, const uint16_t *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i a = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(x + i)));
        ST(y + i, _mm512_castsi512_ps(_mm512_slli_epi32(a, 16)));
    }
    if (i < n) {
        __mmask16 k = tail_mask(n - i);
        __m512i a = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, x + i));
        MST(y + i, k, _mm512_castsi512_ps(_mm512_slli_epi32(a, 16)));
    }
}

const kn_vec_impl kn_vec_impl_avx512 = {
    add_avx512, sub_avx512, mul_avx512, div_avx512,
    add_scalar_avx512, mul_scalar_avx512, fma_scalar_avx512, copy_avx512,
    unary_avx512, sum_avx512, max_avx512, dot_avx512,
    softmax_avx512, log_softmax_avx512, layer_norm_avx512, rms_norm_avx512, norm_bwd_avx512, softmax_bwd_avx512,
    f32_to_f16_avx512, f16_to_f32_avx512, f32_to_bf16_avx512, bf16_to_f32_avx512, adam_avx512,
};
