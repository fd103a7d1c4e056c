/* vec_avx2.c: AVX2+FMA+F16C versions of the f32 row kernels in vec.h.
 *
 * 8 floats per vector, loops unrolled to 16-32 floats, unaligned loads.
 * Tails: exact ops (add, mul, ...) finish with a scalar loop, which gives the
 * same bits; math ops use _mm256_maskload/maskstore so every element of a row
 * goes through the same polynomial. The math functions (exp8, log8, tanh8,
 * erf8) are written here from range reduction + polynomials whose coefficients
 * were fitted for this file (least squares on Chebyshev nodes); vec.h states
 * the accuracy that tests/test_vec.c checks.
 *
 * Non-goals: gathers, aligned-only fast paths, non-temporal stores.
 */
#include "backends/cpu/vec.h"   // defines: kn_vec_impl, KN_VEC_SUM_BLOCK
#include "core/fp16.h"          // defines: kn_fp32_to_fp16 (scalar tails)
#include <immintrin.h>
#include <math.h>
#include <string.h>

typedef __m256 V;
#define SET1 _mm256_set1_ps
#define LD _mm256_loadu_ps
#define ST _mm256_storeu_ps

/* ============================================================================
 * Helpers
 * ========================================================================== */

/* Lanes [0, r) set, r in 1..7. */
static inline __m256i tail_mask(int64_t r) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)r), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
static inline V absv(V x) { return _mm256_andnot_ps(SET1(-0.0f), x); }
static inline V signv(V x) { return _mm256_and_ps(SET1(-0.0f), x); }

static inline __m256d acc_d(__m256d acc, V v) {
    acc = _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
    return _mm256_add_pd(acc, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}
static inline double hsum4d(__m256d v) {
    __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
    return _mm_cvtsd_f64(_mm_add_sd(s, _mm_unpackhi_pd(s, s)));
}

/* ============================================================================
 * Vector math (8 lanes). NaN inputs give NaN: every clamp is written
 * min/max(constant, x), which returns x when x is NaN.
 * ========================================================================== */

/* exp: n = round(x/ln2), r = x - n*ln2 (two-part ln2, |r| <= 0.347), degree-6
 * polynomial p(r), result p * 2^n.
 * Wide path (any lane |x| > 87 or inf): clamp x to [-104, 88.8] and scale by
 * 2^n in two halves, so subnormal and overflowing results round once, correctly.
 * Fast path (every lane |x| <= 87 or NaN, the usual case): n comes from the
 * magic-number add t = x/ln2 + (1.5*2^23 + 127), whose low mantissa bits hold
 * n + 127, so 2^n is t's bits shifted left by 23; p * 2^n is then normal. */
static inline V exp_poly8(V r) {
    V p = SET1(0.00139485905f);
    p = _mm256_fmadd_ps(p, r, SET1(0.00837513525f));
    p = _mm256_fmadd_ps(p, r, SET1(0.0416662171f));
    p = _mm256_fmadd_ps(p, r, SET1(0.166664153f));
    p = _mm256_fmadd_ps(p, r, SET1(0.5f));
    p = _mm256_fmadd_ps(p, r, SET1(1.0f));
    return _mm256_fmadd_ps(p, r, SET1(1.0f));
}
static V exp8_wide(V x) {
    x = _mm256_min_ps(SET1(88.8f), x);
    x = _mm256_max_ps(SET1(-104.0f), x);
    V n = _mm256_round_ps(_mm256_mul_ps(x, SET1(1.44269502f)),
                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    V r = _mm256_fnmadd_ps(n, SET1(0.693147182f), x);
    r = _mm256_fnmadd_ps(n, SET1(-1.90465432e-09f), r);
    V p = exp_poly8(r);
    __m256i ni = _mm256_cvtps_epi32(n);              /* [-150, 128] */
    __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    V s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, _mm256_set1_epi32(127)), 23));
    V s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, _mm256_set1_epi32(127)), 23));
    return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}
/* Some lane has |x| > 87 (or is infinite): the wide path is needed. */
static inline int any_wide8(V x) {
    return _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(SET1(-0.0f), x), SET1(87.0f), _CMP_GT_OQ));
}
static inline V exp8_fast(V x) {
    const V magic = SET1(12583039.0f);               /* 1.5 * 2^23 + 127 */
    V t = _mm256_fmadd_ps(x, SET1(1.44269502f), magic);
    V n = _mm256_sub_ps(t, magic);
    V r = _mm256_fnmadd_ps(n, SET1(0.693147182f), x);
    r = _mm256_fnmadd_ps(n, SET1(-1.90465432e-09f), r);
    V s = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23));
    return _mm256_mul_ps(exp_poly8(r), s);
}
static inline V exp8(V x) { return any_wide8(x) ? exp8_wide(x) : exp8_fast(x); }

/* log: x = m*2^e with m in [sqrt(1/2), sqrt(2)), f = m-1 (exact),
 * log(1+f) = f - (f^2/2 - s*(f^2/2 + R(s^2))), s = f/(2+f), R the atanh series
 * (2/3 s^2 + 2/5 s^4 + ...; truncation < 3e-9 relative for |s| < 0.172). */
static inline V log8(V x) {
    V tiny = _mm256_cmp_ps(x, SET1(1.17549435e-38f), _CMP_LT_OQ);
    V xs = _mm256_blendv_ps(x, _mm256_mul_ps(x, SET1(8388608.0f)), tiny);  /* subnormals * 2^23 */
    __m256i ix = _mm256_castps_si256(xs);
    __m256i ei = _mm256_sub_epi32(_mm256_srli_epi32(ix, 23), _mm256_set1_epi32(127));
    V m = _mm256_castsi256_ps(_mm256_or_si256(_mm256_and_si256(ix, _mm256_set1_epi32(0x007fffff)),
                                              _mm256_set1_epi32(0x3f800000)));
    V e = _mm256_sub_ps(_mm256_cvtepi32_ps(ei), _mm256_and_ps(tiny, SET1(23.0f)));
    V big = _mm256_cmp_ps(m, SET1(1.41421356f), _CMP_GT_OQ);
    m = _mm256_blendv_ps(m, _mm256_mul_ps(m, SET1(0.5f)), big);
    e = _mm256_add_ps(e, _mm256_and_ps(big, SET1(1.0f)));
    V f = _mm256_sub_ps(m, SET1(1.0f));
    V s = _mm256_div_ps(f, _mm256_add_ps(SET1(2.0f), f));
    V z = _mm256_mul_ps(s, s);
    V R = _mm256_fmadd_ps(SET1(2.0f / 11), z, SET1(2.0f / 9));
    R = _mm256_fmadd_ps(R, z, SET1(2.0f / 7));
    R = _mm256_fmadd_ps(R, z, SET1(2.0f / 5));
    R = _mm256_fmadd_ps(R, z, SET1(2.0f / 3));
    R = _mm256_mul_ps(R, z);
    V hfsq = _mm256_mul_ps(_mm256_mul_ps(SET1(0.5f), f), f);
    V t = _mm256_fmadd_ps(s, _mm256_add_ps(hfsq, R), _mm256_mul_ps(e, SET1(-1.90465432e-09f)));
    V res = _mm256_fmsub_ps(e, SET1(0.693147182f), _mm256_sub_ps(_mm256_sub_ps(hfsq, t), f));
    V zero = _mm256_setzero_ps();
    res = _mm256_blendv_ps(res, SET1(-INFINITY), _mm256_cmp_ps(x, zero, _CMP_EQ_OQ));
    res = _mm256_blendv_ps(res, SET1(NAN), _mm256_cmp_ps(x, zero, _CMP_LT_OQ));
    V pass = _mm256_or_ps(_mm256_cmp_ps(x, SET1(INFINITY), _CMP_EQ_OQ), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return _mm256_blendv_ps(res, x, pass);
}

/* tanh: |x| <= 1: x + x^3 P(x^2) (degree-7 fit, 1.2e-8); else
 * sign(x) * (1 - 2/(exp(2|x|)+1)), |x| clamped at 9.1 where tanh rounds to 1. */
static inline V tanh8(V x) {
    V a = absv(x), z = _mm256_mul_ps(x, x);
    V p = SET1(0.00012176919f);
    p = _mm256_fmadd_ps(p, z, SET1(-0.000842288719f));
    p = _mm256_fmadd_ps(p, z, SET1(0.00308037712f));
    p = _mm256_fmadd_ps(p, z, SET1(-0.0085965246f));
    p = _mm256_fmadd_ps(p, z, SET1(0.0217853282f));
    p = _mm256_fmadd_ps(p, z, SET1(-0.0539532267f));
    p = _mm256_fmadd_ps(p, z, SET1(0.133332014f));
    p = _mm256_fmadd_ps(p, z, SET1(-0.333333284f));
    V small = _mm256_fmadd_ps(_mm256_mul_ps(x, z), p, x);
    small = _mm256_or_ps(absv(small), signv(x));           /* tanh(-0) = -0 */
    V ac = _mm256_min_ps(SET1(9.1f), a);
    V e = exp8(_mm256_add_ps(ac, ac));
    V big = _mm256_sub_ps(SET1(1.0f), _mm256_div_ps(SET1(2.0f), _mm256_add_ps(e, SET1(1.0f))));
    big = _mm256_or_ps(big, signv(x));
    return _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, SET1(1.0f), _CMP_LE_OQ));
}

/* erf: |x| <= 1: x P(x^2) (degree 6); else 1 - exp(-x^2) t Q(t - 0.625), t = 1/|x|,
 * |x| clamped to [1, 4] (erf rounds to 1 beyond 3.92), Q degree 9. */
static inline V erf8(V x) {
    V a = absv(x), z = _mm256_mul_ps(x, x);
    V p = SET1(7.88249672e-05f);
    p = _mm256_fmadd_ps(p, z, SET1(-0.000801885501f));
    p = _mm256_fmadd_ps(p, z, SET1(0.00518931216f));
    p = _mm256_fmadd_ps(p, z, SET1(-0.0268543288f));
    p = _mm256_fmadd_ps(p, z, SET1(0.112835974f));
    p = _mm256_fmadd_ps(p, z, SET1(-0.37612626f));
    p = _mm256_fmadd_ps(p, z, SET1(1.12837911f));
    V small = _mm256_mul_ps(x, p);
    V ac = _mm256_min_ps(SET1(4.0f), _mm256_max_ps(SET1(1.0f), a));
    V t = _mm256_div_ps(SET1(1.0f), ac);
    V u = _mm256_sub_ps(t, SET1(0.625f));
    V q = SET1(-0.0473638512f);
    q = _mm256_fmadd_ps(q, u, SET1(0.0548653826f));
    q = _mm256_fmadd_ps(q, u, SET1(-0.0247461293f));
    q = _mm256_fmadd_ps(q, u, SET1(-0.0112171127f));
    q = _mm256_fmadd_ps(q, u, SET1(0.0496267565f));
    q = _mm256_fmadd_ps(q, u, SET1(-0.0779847354f));
    q = _mm256_fmadd_ps(q, u, SET1(0.0721013844f));
    q = _mm256_fmadd_ps(q, u, SET1(-0.00129544886f));
    q = _mm256_fmadd_ps(q, u, SET1(-0.171585649f));
    q = _mm256_fmadd_ps(q, u, SET1(0.489524782f));
    V ec = _mm256_mul_ps(_mm256_mul_ps(exp8(_mm256_sub_ps(_mm256_setzero_ps(), _mm256_mul_ps(ac, ac))), t), q);
    V big = _mm256_or_ps(_mm256_sub_ps(SET1(1.0f), ec), signv(x));
    return _mm256_blendv_ps(big, small, _mm256_cmp_ps(a, SET1(1.0f), _CMP_LE_OQ));
}

/* sigmoid = 1/(1+exp(-x)). When some lane has |x| > 87, exp(-x) could overflow
 * and lose the tiny results, so that vector takes the stable form
 * e = exp(-|x|), sigmoid = (x >= 0 ? 1 : e) / (1 + e). */
static V sigmoid_num8_wide(V x, V *den) {
    V e = exp8_wide(_mm256_sub_ps(_mm256_setzero_ps(), absv(x)));
    *den = _mm256_add_ps(SET1(1.0f), e);
    return _mm256_blendv_ps(e, SET1(1.0f), _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_GE_OQ));
}
static inline V sigmoid8(V x) {
    V den, num;
    if (any_wide8(x)) num = sigmoid_num8_wide(x, &den);
    else { num = SET1(1.0f); den = _mm256_add_ps(num, exp8_fast(_mm256_sub_ps(_mm256_setzero_ps(), x))); }
    return _mm256_div_ps(num, den);
}
static inline V silu8(V x) {
    if (any_wide8(x)) {
        V den, num = sigmoid_num8_wide(x, &den);
        return _mm256_div_ps(_mm256_mul_ps(x, num), den);
    }
    return _mm256_div_ps(x, _mm256_add_ps(SET1(1.0f), exp8_fast(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}
/* x * sigmoid(2u), u = sqrt(2/pi)(x + 0.044715 x^3): -2u = x(-1.5957691 - 0.0713548 x^2) */
static inline V gelu_tanh8(V x) {
    V z = _mm256_mul_ps(x, x);
    V m2u = _mm256_mul_ps(x, _mm256_fmadd_ps(SET1(-0.0713548162f), z, SET1(-1.59576917f)));
    return _mm256_div_ps(x, _mm256_add_ps(SET1(1.0f), exp8(m2u)));
}
/* d gelu_tanh / dx (vec.c's gelu_tanh_grad1 states the form) */
static inline V gelu_tanh_grad8(V x) {
    x = _mm256_min_ps(SET1(20.0f), _mm256_max_ps(SET1(-20.0f), x));   /* NaN (second operand) passes */
    V z = _mm256_mul_ps(x, x);
    V m2u = _mm256_min_ps(_mm256_mul_ps(x, _mm256_fmadd_ps(SET1(-0.0713548162f), z, SET1(-1.59576917f))), SET1(80.0f));
    V e = exp8(m2u), s = _mm256_div_ps(SET1(1.0f), _mm256_add_ps(SET1(1.0f), e));
    V q = _mm256_mul_ps(_mm256_mul_ps(s, s), e);
    V p = _mm256_fmadd_ps(SET1(0.214064449f), z, SET1(1.59576917f));
    return _mm256_fmadd_ps(_mm256_mul_ps(x, q), p, s);
}
static inline V gelu_erf8(V x) {
    V h = _mm256_mul_ps(SET1(0.5f), x);
    return _mm256_fmadd_ps(h, erf8(_mm256_mul_ps(x, SET1(0.707106769f))), h);
}
static inline V relu8(V x) { return _mm256_max_ps(_mm256_setzero_ps(), x); }
static inline V neg8(V x) { return _mm256_xor_ps(SET1(-0.0f), x); }
static inline V sqrt8(V x) { return _mm256_sqrt_ps(x); }
static inline V rsqrt8(V x) { return _mm256_div_ps(SET1(1.0f), _mm256_sqrt_ps(x)); }

/* ============================================================================
 * Elementwise
 * ========================================================================== */

#define BINARY(name, vop, cop)                                                        \
    static void name##_avx2(float *y, const float *a, const float *b, int64_t n) {   \
        int64_t i = 0;                                                                \
        for (; i + 32 <= n; i += 32) {                                                \
            V a0 = LD(a + i), a1 = LD(a + i + 8), a2 = LD(a + i + 16), a3 = LD(a + i + 24); \
            V b0 = LD(b + i), b1 = LD(b + i + 8), b2 = LD(b + i + 16), b3 = LD(b + i + 24); \
            ST(y + i, vop(a0, b0)); ST(y + i + 8, vop(a1, b1));                      \
            ST(y + i + 16, vop(a2, b2)); ST(y + i + 24, vop(a3, b3));                 \
        }                                                                             \
        for (; i + 8 <= n; i += 8) ST(y + i, vop(LD(a + i), LD(b + i)));             \
        for (; i < n; i++) y[i] = a[i] cop b[i];                                      \
    }
BINARY(add, _mm256_add_ps, +)
BINARY(sub, _mm256_sub_ps, -)
BINARY(mul, _mm256_mul_ps, *)
BINARY(div, _mm256_div_ps, /)

static void add_scalar_avx2(float *y, const float *a, float s, int64_t n) {
    V vs = SET1(s);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        V a0 = LD(a + i), a1 = LD(a + i + 8), a2 = LD(a + i + 16), a3 = LD(a + i + 24);
        ST(y + i, _mm256_add_ps(a0, vs)); ST(y + i + 8, _mm256_add_ps(a1, vs));
        ST(y + i + 16, _mm256_add_ps(a2, vs)); ST(y + i + 24, _mm256_add_ps(a3, vs));
    }
    for (; i + 8 <= n; i += 8) ST(y + i, _mm256_add_ps(LD(a + i), vs));
    for (; i < n; i++) y[i] = a[i] + s;
}
static void mul_scalar_avx2(float *y, const float *a, float s, int64_t n) {
    V vs = SET1(s);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        V a0 = LD(a + i), a1 = LD(a + i + 8), a2 = LD(a + i + 16), a3 = LD(a + i + 24);
        ST(y + i, _mm256_mul_ps(a0, vs)); ST(y + i + 8, _mm256_mul_ps(a1, vs));
        ST(y + i + 16, _mm256_mul_ps(a2, vs)); ST(y + i + 24, _mm256_mul_ps(a3, vs));
    }
    for (; i + 8 <= n; i += 8) ST(y + i, _mm256_mul_ps(LD(a + i), vs));
    for (; i < n; i++) y[i] = a[i] * s;
}
static void fma_scalar_avx2(float *y, const float *a, float s, int64_t n) {
    V vs = SET1(s);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        V a0 = LD(a + i), a1 = LD(a + i + 8), a2 = LD(a + i + 16), a3 = LD(a + i + 24);
        ST(y + i, _mm256_fmadd_ps(a0, vs, LD(y + i)));
        ST(y + i + 8, _mm256_fmadd_ps(a1, vs, LD(y + i + 8)));
        ST(y + i + 16, _mm256_fmadd_ps(a2, vs, LD(y + i + 16)));
        ST(y + i + 24, _mm256_fmadd_ps(a3, vs, LD(y + i + 24)));
    }
    for (; i + 8 <= n; i += 8) ST(y + i, _mm256_fmadd_ps(LD(a + i), vs, LD(y + i)));
    if (i < n) {
        __m256i m = tail_mask(n - i);
        V r = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), vs, _mm256_maskload_ps(y + i, m));
        _mm256_maskstore_ps(y + i, m, r);
    }
}
static void copy_avx2(float *y, const float *a, int64_t n) {
    if (y == a) return;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        V a0 = LD(a + i), a1 = LD(a + i + 8), a2 = LD(a + i + 16), a3 = LD(a + i + 24);
        ST(y + i, a0); ST(y + i + 8, a1); ST(y + i + 16, a2); ST(y + i + 24, a3);
    }
    for (; i + 8 <= n; i += 8) ST(y + i, LD(a + i));
    for (; i < n; i++) y[i] = a[i];
}

/* ============================================================================
 * Unary
 * ========================================================================== */

#define UNARY_LOOP(F)                                                                 \
    do {                                                                              \
        int64_t i = 0;                                                                \
        for (; i + 16 <= n; i += 16) {                                                \
            V x0 = LD(x + i), x1 = LD(x + i + 8);                                     \
            ST(y + i, F(x0)); ST(y + i + 8, F(x1));                                   \
        }                                                                             \
        for (; i + 8 <= n; i += 8) ST(y + i, F(LD(x + i)));                           \
        if (i < n) {                                                                  \
            __m256i m = tail_mask(n - i);                                             \
            _mm256_maskstore_ps(y + i, m, F(_mm256_maskload_ps(x + i, m)));           \
        }                                                                             \
    } while (0)

static void unary_avx2(kn_vec_unary_op op, float *y, const float *x, int64_t n) {
    switch (op) {
    case KN_VU_EXP:       UNARY_LOOP(exp8); break;
    case KN_VU_TANH:      UNARY_LOOP(tanh8); break;
    case KN_VU_SIGMOID:   UNARY_LOOP(sigmoid8); break;
    case KN_VU_SILU:      UNARY_LOOP(silu8); break;
    case KN_VU_GELU_TANH: UNARY_LOOP(gelu_tanh8); break;
    case KN_VU_GELU_TANH_GRAD: UNARY_LOOP(gelu_tanh_grad8); break;
    case KN_VU_GELU_ERF:  UNARY_LOOP(gelu_erf8); break;
    case KN_VU_RELU:      UNARY_LOOP(relu8); break;
    case KN_VU_NEG:       UNARY_LOOP(neg8); break;
    case KN_VU_SQRT:      UNARY_LOOP(sqrt8); break;
    case KN_VU_RSQRT:     UNARY_LOOP(rsqrt8); break;
    case KN_VU_LOG:       UNARY_LOOP(log8); break;
    default: break;
    }
}

/* ============================================================================
 * Reductions: float partial sums over KN_VEC_SUM_BLOCK elements (4 x 8 lanes,
 * so each lane adds at most 32 terms), each block added into double lanes.
 * ========================================================================== */

static double sumd_avx2(const float *x, int64_t n) {
    __m256d acc = _mm256_setzero_pd();
    for (int64_t i0 = 0; i0 < n; i0 += KN_VEC_SUM_BLOCK) {
        int64_t m = n - i0 < KN_VEC_SUM_BLOCK ? n - i0 : KN_VEC_SUM_BLOCK, i = 0;
        const float *p = x + i0;
        V a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (; i + 32 <= m; i += 32) {
            a0 = _mm256_add_ps(a0, LD(p + i)); a1 = _mm256_add_ps(a1, LD(p + i + 8));
            a2 = _mm256_add_ps(a2, LD(p + i + 16)); a3 = _mm256_add_ps(a3, LD(p + i + 24));
        }
        for (; i + 8 <= m; i += 8) a0 = _mm256_add_ps(a0, LD(p + i));
        if (i < m) a1 = _mm256_add_ps(a1, _mm256_maskload_ps(p + i, tail_mask(m - i)));
        acc = acc_d(acc, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    }
    return hsum4d(acc);
}
static double dotd_avx2(const float *a, const float *b, int64_t n) {
    __m256d acc = _mm256_setzero_pd();
    for (int64_t i0 = 0; i0 < n; i0 += KN_VEC_SUM_BLOCK) {
        int64_t m = n - i0 < KN_VEC_SUM_BLOCK ? n - i0 : KN_VEC_SUM_BLOCK, i = 0;
        const float *p = a + i0, *q = b + i0;
        V a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (; i + 32 <= m; i += 32) {
            a0 = _mm256_fmadd_ps(LD(p + i), LD(q + i), a0);
            a1 = _mm256_fmadd_ps(LD(p + i + 8), LD(q + i + 8), a1);
            a2 = _mm256_fmadd_ps(LD(p + i + 16), LD(q + i + 16), a2);
            a3 = _mm256_fmadd_ps(LD(p + i + 24), LD(q + i + 24), a3);
        }
        for (; i + 8 <= m; i += 8) a0 = _mm256_fmadd_ps(LD(p + i), LD(q + i), a0);
        if (i < m) {
            __m256i k = tail_mask(m - i);
            a1 = _mm256_fmadd_ps(_mm256_maskload_ps(p + i, k), _mm256_maskload_ps(q + i, k), a1);
        }
        acc = acc_d(acc, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    }
    return hsum4d(acc);
}
static float sum_avx2(const float *x, int64_t n) { return (float)sumd_avx2(x, n); }
static float dot_avx2(const float *a, const float *b, int64_t n) { return (float)dotd_avx2(a, b, n); }

static float max_avx2(const float *x, int64_t n) {
    V m0 = SET1(-INFINITY), m1 = m0, bad = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        V v0 = LD(x + i), v1 = LD(x + i + 8);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v0, v1, _CMP_UNORD_Q));
        m0 = _mm256_max_ps(m0, v0); m1 = _mm256_max_ps(m1, v1);
    }
    for (; i + 8 <= n; i += 8) {
        V v = LD(x + i);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m0 = _mm256_max_ps(m0, v);
    }
    if (i < n) {
        __m256i k = tail_mask(n - i);
        V v = _mm256_blendv_ps(SET1(-INFINITY), _mm256_maskload_ps(x + i, k), _mm256_castsi256_ps(k));
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        m1 = _mm256_max_ps(m1, v);
    }
    if (_mm256_movemask_ps(bad)) return NAN;
    V m = _mm256_max_ps(m0, m1);
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* ============================================================================
 * Rows: softmax, log_softmax, layer norm, rms norm
 * ========================================================================== */

/* Sum of exp(x - mx) over the row, blocked like sumd; stores the terms in y if y. */
static double sum_exp_avx2(float *y, const float *x, float mx, int64_t n) {
    V vm = SET1(mx);
    __m256d acc = _mm256_setzero_pd();
    for (int64_t i0 = 0; i0 < n; i0 += KN_VEC_SUM_BLOCK) {
        int64_t m = n - i0 < KN_VEC_SUM_BLOCK ? n - i0 : KN_VEC_SUM_BLOCK, i = 0;
        const float *p = x + i0;
        float *q = y ? y + i0 : NULL;
        V a0 = _mm256_setzero_ps(), a1 = a0;
        for (; i + 16 <= m; i += 16) {
            V e0 = exp8(_mm256_sub_ps(LD(p + i), vm)), e1 = exp8(_mm256_sub_ps(LD(p + i + 8), vm));
            if (q) { ST(q + i, e0); ST(q + i + 8, e1); }
            a0 = _mm256_add_ps(a0, e0); a1 = _mm256_add_ps(a1, e1);
        }
        for (; i + 8 <= m; i += 8) {
            V e = exp8(_mm256_sub_ps(LD(p + i), vm));
            if (q) ST(q + i, e);
            a0 = _mm256_add_ps(a0, e);
        }
        if (i < m) {
            __m256i k = tail_mask(m - i);
            V e = exp8(_mm256_sub_ps(_mm256_maskload_ps(p + i, k), vm));
            e = _mm256_and_ps(e, _mm256_castsi256_ps(k));
            if (q) _mm256_maskstore_ps(q + i, k, e);
            a1 = _mm256_add_ps(a1, e);
        }
        acc = acc_d(acc, _mm256_add_ps(a0, a1));
    }
    return hsum4d(acc);
}

static void softmax_avx2(float *y, const float *x, int64_t n) {
    if (n <= 0) return;
    float mx = max_avx2(x, n);
    float s = (float)sum_exp_avx2(y, x, mx, n);
    mul_scalar_avx2(y, y, 1.0f / s, n);
}

static void softmax_bwd_avx2(float *ds, const float *p, const float *dp, const float *dcap, float scale, int64_t n) {
    V vd = SET1((float)dotd_avx2(p, dp, n)), vs = SET1(scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        V t = _mm256_mul_ps(_mm256_sub_ps(LD(dp + i), vd), LD(p + i));
        if (dcap) t = _mm256_mul_ps(t, LD(dcap + i));
        ST(ds + i, _mm256_mul_ps(t, vs));
    }
    if (i < n) {
        __m256i k = tail_mask(n - i);
        V t = _mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(dp + i, k), vd), _mm256_maskload_ps(p + i, k));
        if (dcap) t = _mm256_mul_ps(t, _mm256_maskload_ps(dcap + i, k));
        _mm256_maskstore_ps(ds + i, k, _mm256_mul_ps(t, vs));
    }
}
static void log_softmax_avx2(float *y, const float *x, int64_t n) {
    if (n <= 0) return;
    float mx = max_avx2(x, n);
    float lse = (float)log(sum_exp_avx2(NULL, x, mx, n));
    V vm = SET1(mx), vl = SET1(lse);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        V x0 = LD(x + i), x1 = LD(x + i + 8);
        ST(y + i, _mm256_sub_ps(_mm256_sub_ps(x0, vm), vl));
        ST(y + i + 8, _mm256_sub_ps(_mm256_sub_ps(x1, vm), vl));
    }
    for (; i < n; i++) y[i] = (x[i] - mx) - lse;
}

/* Sum of (x - c)^2, blocked. */
static double sum_sqdev_avx2(const float *x, float c, int64_t n) {
    V vc = SET1(c);
    __m256d acc = _mm256_setzero_pd();
    for (int64_t i0 = 0; i0 < n; i0 += KN_VEC_SUM_BLOCK) {
        int64_t m = n - i0 < KN_VEC_SUM_BLOCK ? n - i0 : KN_VEC_SUM_BLOCK, i = 0;
        const float *p = x + i0;
        V a0 = _mm256_setzero_ps(), a1 = a0;
        for (; i + 16 <= m; i += 16) {
            V d0 = _mm256_sub_ps(LD(p + i), vc), d1 = _mm256_sub_ps(LD(p + i + 8), vc);
            a0 = _mm256_fmadd_ps(d0, d0, a0); a1 = _mm256_fmadd_ps(d1, d1, a1);
        }
        for (; i + 8 <= m; i += 8) { V d = _mm256_sub_ps(LD(p + i), vc); a0 = _mm256_fmadd_ps(d, d, a0); }
        if (i < m) {
            __m256i k = tail_mask(m - i);
            V d = _mm256_and_ps(_mm256_sub_ps(_mm256_maskload_ps(p + i, k), vc), _mm256_castsi256_ps(k));
            a1 = _mm256_fmadd_ps(d, d, a1);
        }
        acc = acc_d(acc, _mm256_add_ps(a0, a1));
    }
    return hsum4d(acc);
}

static void layer_norm_avx2(float *y, const float *x, const float *w, const float *b, float eps,
                            int64_t n, float *mean_out, float *rstd_out) {
    float mean = n > 0 ? (float)(sumd_avx2(x, n) / (double)n) : 0.0f;
    float var = n > 0 ? (float)(sum_sqdev_avx2(x, mean, n) / (double)n) : 0.0f;
    float rstd = 1.0f / sqrtf(var + eps);
    V vm = SET1(mean), vr = SET1(rstd), one = SET1(1.0f), zero = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        V t = _mm256_mul_ps(_mm256_sub_ps(LD(x + i), vm), vr);
        V wv = w ? LD(w + i) : one, bv = b ? LD(b + i) : zero;
        ST(y + i, _mm256_fmadd_ps(t, wv, bv));
    }
    if (i < n) {
        __m256i k = tail_mask(n - i);
        V t = _mm256_mul_ps(_mm256_sub_ps(_mm256_maskload_ps(x + i, k), vm), vr);
        V wv = w ? _mm256_maskload_ps(w + i, k) : one, bv = b ? _mm256_maskload_ps(b + i, k) : zero;
        _mm256_maskstore_ps(y + i, k, _mm256_fmadd_ps(t, wv, bv));
    }
    if (mean_out) *mean_out = mean;
    if (rstd_out) *rstd_out = rstd;
}

static void rms_norm_avx2(float *y, const float *x, const float *w, float eps, int64_t n,
                          float *rstd_out) {
    float ms = n > 0 ? (float)(dotd_avx2(x, x, n) / (double)n) : 0.0f;
    float rstd = 1.0f / sqrtf(ms + eps);
    V vr = SET1(rstd);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        V t = _mm256_mul_ps(LD(x + i), vr);
        ST(y + i, w ? _mm256_mul_ps(t, LD(w + i)) : t);
    }
    if (i < n) {
        __m256i k = tail_mask(n - i);
        V t = _mm256_mul_ps(_mm256_maskload_ps(x + i, k), vr);
        _mm256_maskstore_ps(y + i, k, w ? _mm256_mul_ps(t, _mm256_maskload_ps(w + i, k)) : t);
    }
    if (rstd_out) *rstd_out = rstd;
}

/* norm_bwd: the statistics as layer_norm_avx2 takes them (double-blocked
 * sums), then one pass for sum(gw) and sum(gw * (x - mean)) in two float
 * vectors each, one for the outputs */
static void norm_bwd_avx2(float *dx, float *dw, float *db, const float *x, const float *g, const float *w,
                          float eps, bool rms, int64_t n) {
    float mean = n > 0 && !rms ? (float)(sumd_avx2(x, n) / (double)n) : 0.0f;
    float var = n > 0 ? (float)(sum_sqdev_avx2(x, mean, n) / (double)n) : 0.0f;
    float rstd = 1.0f / sqrtf(var + eps);
    V vm = SET1(mean), one = SET1(1.0f), s0 = _mm256_setzero_ps(), s1 = s0, t0 = s0, t1 = s0;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        V g0 = _mm256_mul_ps(LD(g + i), w ? LD(w + i) : one), g1 = _mm256_mul_ps(LD(g + i + 8), w ? LD(w + i + 8) : one);
        s0 = _mm256_add_ps(s0, g0); s1 = _mm256_add_ps(s1, g1);
        t0 = _mm256_fmadd_ps(g0, _mm256_sub_ps(LD(x + i), vm), t0);
        t1 = _mm256_fmadd_ps(g1, _mm256_sub_ps(LD(x + i + 8), vm), t1);
    }
    for (; i < n; i += 8) {
        __m256i k = tail_mask(n - i < 8 ? n - i : 8);
        V g0 = _mm256_mul_ps(_mm256_maskload_ps(g + i, k), w ? _mm256_maskload_ps(w + i, k) : one);
        s0 = _mm256_add_ps(s0, g0);
        t0 = _mm256_fmadd_ps(g0, _mm256_and_ps(_mm256_sub_ps(_mm256_maskload_ps(x + i, k), vm), _mm256_castsi256_ps(k)), t0);
    }
    __m256d z = _mm256_setzero_pd();
    float m1 = rms || n == 0 ? 0.0f : (float)(hsum4d(acc_d(z, _mm256_add_ps(s0, s1))) / (double)n);
    float m2 = n > 0 ? (float)(hsum4d(acc_d(z, _mm256_add_ps(t0, t1))) / (double)n) * rstd : 0.0f;
    V vr = SET1(rstd), v1 = SET1(m1), v2 = SET1(m2);
    for (i = 0; i < n; i += 8) {
        bool full = i + 8 <= n;
        __m256i k = tail_mask(full ? 8 : n - i);
        V xv = full ? LD(x + i) : _mm256_maskload_ps(x + i, k), gv = full ? LD(g + i) : _mm256_maskload_ps(g + i, k);
        V wv = w ? (full ? LD(w + i) : _mm256_maskload_ps(w + i, k)) : one;
        V xh = _mm256_mul_ps(_mm256_sub_ps(xv, vm), vr);
        V o = _mm256_mul_ps(vr, _mm256_sub_ps(_mm256_sub_ps(_mm256_mul_ps(gv, wv), v1), _mm256_mul_ps(xh, v2)));
        if (full) ST(dx + i, o); else _mm256_maskstore_ps(dx + i, k, o);
        if (dw) {
            V a = _mm256_fmadd_ps(gv, xh, full ? LD(dw + i) : _mm256_maskload_ps(dw + i, k));
            if (full) ST(dw + i, a); else _mm256_maskstore_ps(dw + i, k, a);
        }
        if (db) {
            V a = _mm256_add_ps(gv, full ? LD(db + i) : _mm256_maskload_ps(db + i, k));
            if (full) ST(db + i, a); else _mm256_maskstore_ps(db + i, k, a);
        }
    }
}

/* ============================================================================
 * Conversions, bit-exact with core/fp16.h
 * ========================================================================== */

/* F16C rounds like fp16.h except NaN: hardware keeps the top payload bits,
 * fp16.h returns sign|0x7e00, so NaN lanes drop bits 0x01ff. */
static inline __m128i f32_to_f16_8(V v) {
    __m128i h = _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
    V nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    __m128i n16 = _mm_packs_epi32(_mm256_castsi256_si128(_mm256_castps_si256(nan)),
                                  _mm256_extractf128_si256(_mm256_castps_si256(nan), 1));
    return _mm_andnot_si128(_mm_and_si128(n16, _mm_set1_epi16(0x01ff)), h);
}
static void f32_to_f16_avx2(uint16_t *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i h0 = f32_to_f16_8(LD(x + i)), h1 = f32_to_f16_8(LD(x + i + 8));
        _mm_storeu_si128((__m128i *)(y + i), h0);
        _mm_storeu_si128((__m128i *)(y + i + 8), h1);
    }
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(y + i), f32_to_f16_8(LD(x + i)));
    for (; i < n; i++) y[i] = kn_fp32_to_fp16(x[i]);
}

/* Hardware may quiet a signaling NaN (sets bit 22); fp16.h keeps it as is. */
static inline V f16_to_f32_8(__m128i h) {
    V v = _mm256_cvtph_ps(h);
    __m256i h32 = _mm256_cvtepu16_epi32(h);
    __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(h32, _mm256_set1_epi32(0x7fff)),
                                       _mm256_set1_epi32(0x7c00));
    __m256i sig = _mm256_cmpeq_epi32(_mm256_and_si256(h32, _mm256_set1_epi32(0x200)), _mm256_setzero_si256());
    __m256i fix = _mm256_and_si256(_mm256_and_si256(isnan, sig), _mm256_set1_epi32(0x00400000));
    return _mm256_castsi256_ps(_mm256_andnot_si256(fix, _mm256_castps_si256(v)));
}
static void f16_to_f32_avx2(float *y, const uint16_t *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        V v0 = f16_to_f32_8(_mm_loadu_si128((const __m128i *)(x + i)));
        V v1 = f16_to_f32_8(_mm_loadu_si128((const __m128i *)(x + i + 8)));
        ST(y + i, v0); ST(y + i + 8, v1);
    }
    for (; i + 8 <= n; i += 8) ST(y + i, f16_to_f32_8(_mm_loadu_si128((const __m128i *)(x + i))));
    for (; i < n; i++) y[i] = kn_fp16_to_fp32(x[i]);
}

/* Integer RNE: (u + 0x7fff + lsb) >> 16; NaN: (u >> 16) | 0x40. Not the
 * hardware converter: AVX512_BF16 flushes subnormal inputs, fp16.h does not. */
static inline __m128i f32_to_bf16_8(V v) {
    __m256i u = _mm256_castps_si256(v);
    __m256i hi = _mm256_srli_epi32(u, 16);
    __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)),
                                 _mm256_and_si256(hi, _mm256_set1_epi32(1)));
    r = _mm256_srli_epi32(r, 16);
    __m256i isnan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),
                                       _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x40)), isnan);
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}
static void f32_to_bf16_avx2(uint16_t *y, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m128i h0 = f32_to_bf16_8(LD(x + i)), h1 = f32_to_bf16_8(LD(x + i + 8));
        _mm_storeu_si128((__m128i *)(y + i), h0);
        _mm_storeu_si128((__m128i *)(y + i + 8), h1);
    }
    for (; i + 8 <= n; i += 8) _mm_storeu_si128((__m128i *)(y + i), f32_to_bf16_8(LD(x + i)));
    for (; i < n; i++) y[i] = kn_fp32_to_bf16(x[i]);
}
/* Adam: vec.h's sequence, 8 lanes (no FMA: the scalar twin's bits); the
 * tail through the scalar loop of the same sequence */
static void adam_avx2(float *p, float *m, float *v, const float *g, int64_t n, const kn_vec_adam_k *k) {
    const __m256 c0 = _mm256_set1_ps(k->c0), c1 = _mm256_set1_ps(k->c1), c2 = _mm256_set1_ps(k->c2);
    const __m256 b1c = _mm256_set1_ps(k->b1c), b2 = _mm256_set1_ps(k->b2), b2c = _mm256_set1_ps(k->b2c);
    const __m256 eps = _mm256_set1_ps(k->eps), l2 = _mm256_set1_ps(k->l2);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 pi = _mm256_loadu_ps(p + i), mi0 = _mm256_loadu_ps(m + i), vi0 = _mm256_loadu_ps(v + i);
        const __m256 gi = _mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_mul_ps(l2, pi));
        const __m256 mi = _mm256_add_ps(mi0, _mm256_mul_ps(_mm256_sub_ps(gi, mi0), b1c));
        const __m256 vi = _mm256_add_ps(_mm256_mul_ps(vi0, b2), _mm256_mul_ps(_mm256_mul_ps(gi, gi), b2c));
        const __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), c2), eps);
        const __m256 pn = _mm256_sub_ps(_mm256_mul_ps(pi, c0), _mm256_mul_ps(_mm256_div_ps(mi, den), c1));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(p + i, pn);
    }
    kn_vec_impl_generic.adam(p + i, m + i, v + i, g + i, n - i, k);
}

static void bf16_to_f32_avx2(float *y, const uint16_t *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256i a = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i)));
        __m256i b = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(x + i + 8)));
        ST(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(a, 16)));
        ST(y + i + 8, _mm256_castsi256_ps(_mm256_slli_epi32(b, 16)));
    }
    for (; i < n; i++) y[i] = kn_bf16_to_fp32(x[i]);
}

const kn_vec_impl kn_vec_impl_avx2 = {
    add_avx2, sub_avx2, mul_avx2, div_avx2,
    add_scalar_avx2, mul_scalar_avx2, fma_scalar_avx2, copy_avx2,
    unary_avx2, sum_avx2, max_avx2, dot_avx2,
    softmax_avx2, log_softmax_avx2, layer_norm_avx2, rms_norm_avx2, norm_bwd_avx2, softmax_bwd_avx2,
    f32_to_f16_avx2, f16_to_f32_avx2, f32_to_bf16_avx2, bf16_to_f32_avx2, adam_avx2,
};
