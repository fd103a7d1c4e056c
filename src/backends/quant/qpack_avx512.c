/* qpack_avx512.c: matrix-vector products of 16-row packed Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K
 * weights (qpack.h) with Q16 activations, AVX512-VNNI.
 *
 * Lane r of every vector is weight row r of the group. Per block of 32
 * elements: the weight quants widen to int16 pairs (one vpmovsxbw /
 * vpmovzxbw per 32 bytes), and vpdpwssd adds each row's pair times the
 * broadcast activation pair; four int32 accumulators keep four dependent
 * chains in flight. The block's exact int32 sums then take the scales as in
 * qpack.h, one float vector op or two per block for all 16 rows. No
 * horizontal sums: the 16 results are one store.
 *
 * No sum overflows int32: |sum| <= 32 * 128 * 32767 < 2^31 (Q8_0).
 * Compiled with the Makefile's AVX512 flags (-mavx512vnni among them); only
 * called where kn_cpu() reports AVX512-VNNI (qpack.c).
 */
#include "backends/quant/qpack.h"
#include <immintrin.h>

enum { R = KN_QPACK_ROWS };

static inline __m512i pair(const kn_block_q16 *a, int c) {   /* activations 2c, 2c+1 in every lane */
    int32_t v;
    __builtin_memcpy(&v, &a->qs[2 * c], 4);
    return _mm512_set1_epi32(v);
}
static inline __m512 scales16(const void *p) { return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p)); }

/* the int32 sums of one Q8_0 record's 16 rows x one activation block */
static inline __m512i sum_q8(const uint8_t *q, const kn_block_q16 *a) {
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (int c = 0; c < 16; c += 4) {
        s0 = _mm512_dpwssd_epi32(s0, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c))), pair(a, c));
        s1 = _mm512_dpwssd_epi32(s1, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c + 32))), pair(a, c + 1));
        s2 = _mm512_dpwssd_epi32(s2, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c + 64))), pair(a, c + 2));
        s3 = _mm512_dpwssd_epi32(s3, _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c + 96))), pair(a, c + 3));
    }
    return _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3));
}
/* the same for a Q4 record: chunk c's low nibbles are pair c, high ones pair c + 8 */
static inline __m512i sum_q4(const uint8_t *q, const kn_block_q16 *a) {
    const __m512i m15 = _mm512_set1_epi16(15);
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (int c = 0; c < 8; c += 2) {
        __m512i b0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c)));
        __m512i b1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c + 32)));
        s0 = _mm512_dpwssd_epi32(s0, _mm512_and_si512(b0, m15), pair(a, c));
        s1 = _mm512_dpwssd_epi32(s1, _mm512_srli_epi16(b0, 4), pair(a, c + 8));
        s2 = _mm512_dpwssd_epi32(s2, _mm512_and_si512(b1, m15), pair(a, c + 1));
        s3 = _mm512_dpwssd_epi32(s3, _mm512_srli_epi16(b1, 4), pair(a, c + 9));
    }
    return _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3));
}

/* Q5: the Q4 nibbles with their fifth bits from the plane hp (qpack.h): for
 * chunk c, bit c of each int16 lane of h goes to bit 4 of the low nibble,
 * bit 8 + c to bit 4 of the high one */
static inline __m512i q5_high(const uint8_t *hp) { return _mm512_loadu_si512((const void *)hp); }
static inline __m512i sum_q5(const uint8_t *q, const kn_block_q16 *a) {
    const __m512i m15 = _mm512_set1_epi16(15), b4 = _mm512_set1_epi16(16);
    __m512i h = q5_high(q + R * KN_QK / 2);
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (int c = 0; c < 8; c += 2, h = _mm512_srli_epi16(h, 2)) {
        __m512i b0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c)));
        __m512i b1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c + 32)));
        __m512i h1 = _mm512_srli_epi16(h, 1);
        __m512i lo0 = _mm512_or_si512(_mm512_and_si512(b0, m15), _mm512_and_si512(_mm512_slli_epi16(h, 4), b4));
        __m512i hi0 = _mm512_or_si512(_mm512_srli_epi16(b0, 4), _mm512_and_si512(_mm512_srli_epi16(h, 4), b4));
        __m512i lo1 = _mm512_or_si512(_mm512_and_si512(b1, m15), _mm512_and_si512(_mm512_slli_epi16(h1, 4), b4));
        __m512i hi1 = _mm512_or_si512(_mm512_srli_epi16(b1, 4), _mm512_and_si512(_mm512_srli_epi16(h1, 4), b4));
        s0 = _mm512_dpwssd_epi32(s0, lo0, pair(a, c));
        s1 = _mm512_dpwssd_epi32(s1, hi0, pair(a, c + 8));
        s2 = _mm512_dpwssd_epi32(s2, lo1, pair(a, c + 1));
        s3 = _mm512_dpwssd_epi32(s3, hi1, pair(a, c + 9));
    }
    return _mm512_add_epi32(_mm512_add_epi32(s0, s1), _mm512_add_epi32(s2, s3));
}

/* Q6_K: a 32-element part's nibbles with their high two bits from the two
 * planes (h0 for the low nibbles' elements 0-15, h1 for the high ones'
 * 16-31: bits 2c, 2c + 1 of each int16 lane), minus 32; the halves have
 * their own scales, so their sums stay apart: lo (elements 0-15), hi */
enum { Q6_PART = R * KN_QK / 2 + 8 * R };
static inline __m512i q6_lo(__m512i b, __m512i h) {
    return _mm512_sub_epi16(_mm512_or_si512(_mm512_and_si512(b, _mm512_set1_epi16(15)),
                                            _mm512_and_si512(_mm512_slli_epi16(h, 4), _mm512_set1_epi16(0x30))),
                            _mm512_set1_epi16(32));
}
static inline __m512i q6_hi(__m512i b, __m512i h) {
    return _mm512_sub_epi16(_mm512_or_si512(_mm512_srli_epi16(b, 4), _mm512_and_si512(_mm512_slli_epi16(h, 4), _mm512_set1_epi16(0x30))),
                            _mm512_set1_epi16(32));
}
static inline void sum_q6(const uint8_t *q, const kn_block_q16 *a, __m512i *lo, __m512i *hi) {
    __m512i h0 = _mm512_loadu_si512((const void *)(q + R * KN_QK / 2)), h1 = _mm512_loadu_si512((const void *)(q + R * KN_QK / 2 + 4 * R));
    __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
    for (int c = 0; c < 8; c += 2) {
        __m512i b0 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c)));
        __m512i b1 = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c + 32)));
        s0 = _mm512_dpwssd_epi32(s0, q6_lo(b0, h0), pair(a, c));
        s2 = _mm512_dpwssd_epi32(s2, q6_hi(b0, h1), pair(a, c + 8));
        h0 = _mm512_srli_epi16(h0, 2); h1 = _mm512_srli_epi16(h1, 2);
        s1 = _mm512_dpwssd_epi32(s1, q6_lo(b1, h0), pair(a, c + 1));
        s3 = _mm512_dpwssd_epi32(s3, q6_hi(b1, h1), pair(a, c + 9));
        h0 = _mm512_srli_epi16(h0, 2); h1 = _mm512_srli_epi16(h1, 2);
    }
    *lo = _mm512_add_epi32(s0, s1);
    *hi = _mm512_add_epi32(s2, s3);
}
static inline __m512 scales8(const uint8_t *p) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p))); }

static void gemv_q8_0(const void *packed, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x, float *y) {
    const int64_t nb = K / KN_QK;
    const size_t rec = 2 * R + R * KN_QK;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++, o += rec) {
            kn_quant_prefetch(o, rec);
            __m512 s = _mm512_cvtepi32_ps(sum_q8(o + 2 * R, &x[b]));
            acc = _mm512_fmadd_ps(_mm512_mul_ps(scales16(o), _mm512_set1_ps(x[b].d)), s, acc);
        }
        _mm512_storeu_ps(y + (g - g0) * R, acc);
    }
}





/* Q4_K: per super-block, the 8 sub-blocks' sums scaled by their 6-bit
 * scales and mins (bytes, widened per lane), then d and dmin once */
/* Q4_0 / Q5_0 (five: the parts carry Q5's bit plane; quants offset 8 / 16) */
static inline void gemv_x0(const void *packed, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x, float *y,
                           const int five) {
    const int64_t nb = K / KN_QK;
    const size_t rec = 2 * R + R * KN_QK / 2 + (five ? 4 * R : 0);
    const float off = five ? 16.0f : 8.0f;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++, o += rec) {
            kn_quant_prefetch(o, rec);
            __m512 s = _mm512_cvtepi32_ps(five ? sum_q5(o + 2 * R, &x[b]) : sum_q4(o + 2 * R, &x[b]));
            /* dw * (da * sum - off * s) */
            acc = _mm512_fmadd_ps(scales16(o), _mm512_fmsub_ps(s, _mm512_set1_ps(x[b].d), _mm512_set1_ps(off * x[b].s)), acc);
        }
        _mm512_storeu_ps(y + (g - g0) * R, acc);
    }
}
/* Q4_1 / Q5_1 */
static inline void gemv_x1(const void *packed, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x, float *y,
                           const int five) {
    const int64_t nb = K / KN_QK;
    const size_t rec = 4 * R + R * KN_QK / 2 + (five ? 4 * R : 0);
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
        __m512 acc = _mm512_setzero_ps(), accm = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++, o += rec) {
            kn_quant_prefetch(o, rec);
            __m512 s = _mm512_cvtepi32_ps(five ? sum_q5(o + 4 * R, &x[b]) : sum_q4(o + 4 * R, &x[b]));
            acc = _mm512_fmadd_ps(_mm512_mul_ps(scales16(o), _mm512_set1_ps(x[b].d)), s, acc);
            accm = _mm512_fmadd_ps(scales16(o + 2 * R), _mm512_set1_ps(x[b].s), accm);   /* mw * s */
        }
        _mm512_storeu_ps(y + (g - g0) * R, _mm512_add_ps(acc, accm));
    }
}
#define GEMV(name, fn, five) \
    static void name(const void *p, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x, float *y) { fn(p, g0, g1, K, x, y, five); }
GEMV(gemv_q4_0, gemv_x0, 0) GEMV(gemv_q5_0, gemv_x0, 1) GEMV(gemv_q4_1, gemv_x1, 0) GEMV(gemv_q5_1, gemv_x1, 1)
#undef GEMV

/* Q4_K and Q5_K (five: the parts carry Q5's bit plane) */
static inline void gemv_k45(const void *packed, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x, float *y,
                            const int five) {
    const int64_t nb = K / KN_QK_K;
    const size_t part = R * KN_QK / 2 + (five ? 4 * R : 0), rec = 20 * R + 8 * part;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++, o += rec) {
            kn_quant_prefetch(o, rec);
            const uint8_t *sc = o + 4 * R, *mn = sc + 8 * R, *q = o + 20 * R;
            const kn_block_q16 *a = &x[8 * b];
            __m512 accd = _mm512_setzero_ps(), accm = _mm512_setzero_ps();
            for (int sub = 0; sub < 8; sub++) {
                __m512 s = _mm512_cvtepi32_ps(five ? sum_q5(q + sub * part, &a[sub]) : sum_q4(q + sub * part, &a[sub]));
                __m512 scf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + sub * R))));
                __m512 mf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(mn + sub * R))));
                accd = _mm512_fmadd_ps(s, _mm512_mul_ps(scf, _mm512_set1_ps(a[sub].d)), accd);
                accm = _mm512_fmadd_ps(mf, _mm512_set1_ps(a[sub].s), accm);
            }
            acc = _mm512_fmadd_ps(scales16(o), accd, acc);
            acc = _mm512_fnmadd_ps(scales16(o + 2 * R), accm, acc);
        }
        _mm512_storeu_ps(y + (g - g0) * R, acc);
    }
}
static void gemv_q4_K(const void *p, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x, float *y) { gemv_k45(p, g0, g1, K, x, y, 0); }
static void gemv_q5_K(const void *p, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x, float *y) { gemv_k45(p, g0, g1, K, x, y, 1); }

/* ---- four activation rows a group (prefill, batched decode) ----------------
 * Each widened weight chunk feeds the four rows' vpdpwssd (two accumulators a
 * row: eight chains in flight); per block and row the same float steps as
 * the one-row kernels above, so each output has the same bits as theirs. */
/* Every loop over the rows unrolled: only then do
 * gcc and clang keep the accumulator arrays in registers (a rolled loop left
 * them on the stack: a load and a store around every vpdpwssd, ~5x slower) */
#define UNROLL _Pragma("GCC unroll 16")
enum { XR = 4 };
typedef struct { const kn_block_q16 *a[XR]; } rows4;
static inline rows4 rows_at(const kn_block_q16 *x, int64_t xs, int64_t b) {
    rows4 r;
    UNROLL for (int i = 0; i < XR; i++) r.a[i] = x + i * xs + b;
    return r;
}
static inline void sums4_q8(const uint8_t *q, rows4 r, __m512i out[XR]) {
    __m512i s[2 * XR];
    UNROLL for (int i = 0; i < 2 * XR; i++) s[i] = _mm512_setzero_si512();
    for (int c = 0; c < 16; c += 2) {
        __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c)));
        __m512i w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c + 32)));
        UNROLL for (int i = 0; i < XR; i++) {
            s[2 * i] = _mm512_dpwssd_epi32(s[2 * i], w0, pair(r.a[i], c));
            s[2 * i + 1] = _mm512_dpwssd_epi32(s[2 * i + 1], w1, pair(r.a[i], c + 1));
        }
    }
    UNROLL for (int i = 0; i < XR; i++) out[i] = _mm512_add_epi32(s[2 * i], s[2 * i + 1]);
}
static inline void sums4_q4(const uint8_t *q, rows4 r, __m512i out[XR]) {
    const __m512i m15 = _mm512_set1_epi16(15);
    __m512i s[2 * XR];
    UNROLL for (int i = 0; i < 2 * XR; i++) s[i] = _mm512_setzero_si512();
    for (int c = 0; c < 8; c++) {
        __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c)));
        __m512i lo = _mm512_and_si512(b, m15), hi = _mm512_srli_epi16(b, 4);
        UNROLL for (int i = 0; i < XR; i++) {
            s[2 * i] = _mm512_dpwssd_epi32(s[2 * i], lo, pair(r.a[i], c));
            s[2 * i + 1] = _mm512_dpwssd_epi32(s[2 * i + 1], hi, pair(r.a[i], c + 8));
        }
    }
    UNROLL for (int i = 0; i < XR; i++) out[i] = _mm512_add_epi32(s[2 * i], s[2 * i + 1]);
}

static inline void sums4_q5(const uint8_t *q, rows4 r, __m512i out[XR]) {
    const __m512i m15 = _mm512_set1_epi16(15), b4 = _mm512_set1_epi16(16);
    __m512i h = q5_high(q + R * KN_QK / 2);
    __m512i s[2 * XR];
    UNROLL for (int i = 0; i < 2 * XR; i++) s[i] = _mm512_setzero_si512();
    for (int c = 0; c < 8; c++, h = _mm512_srli_epi16(h, 1)) {
        __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c)));
        __m512i lo = _mm512_or_si512(_mm512_and_si512(b, m15), _mm512_and_si512(_mm512_slli_epi16(h, 4), b4));
        __m512i hi = _mm512_or_si512(_mm512_srli_epi16(b, 4), _mm512_and_si512(_mm512_srli_epi16(h, 4), b4));
        UNROLL for (int i = 0; i < XR; i++) {
            s[2 * i] = _mm512_dpwssd_epi32(s[2 * i], lo, pair(r.a[i], c));
            s[2 * i + 1] = _mm512_dpwssd_epi32(s[2 * i + 1], hi, pair(r.a[i], c + 8));
        }
    }
    UNROLL for (int i = 0; i < XR; i++) out[i] = _mm512_add_epi32(s[2 * i], s[2 * i + 1]);
}

static void gemm4_q8_0(const void *packed, int64_t g, int64_t K, const kn_block_q16 *x, int64_t xs, float *y, int64_t ldy) {
    const int64_t nb = K / KN_QK;
    const size_t rec = 2 * R + R * KN_QK;
    const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
    __m512 acc[XR];
    UNROLL for (int i = 0; i < XR; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, o += rec) {
        kn_quant_prefetch(o, rec);
        rows4 r = rows_at(x, xs, b);
        __m512i s[XR];
        sums4_q8(o + 2 * R, r, s);
        __m512 dw = scales16(o);
        UNROLL for (int i = 0; i < XR; i++)
            acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(r.a[i]->d)), _mm512_cvtepi32_ps(s[i]), acc[i]);
    }
    UNROLL for (int i = 0; i < XR; i++) _mm512_storeu_ps(y + i * ldy, acc[i]);
}
/* Q4_0 / Q5_0 and Q4_1 / Q5_1, as the one-row kernels */
static inline void gemm4_x0(const void *packed, int64_t g, int64_t K, const kn_block_q16 *x, int64_t xs, float *y,
                            int64_t ldy, const int five) {
    const int64_t nb = K / KN_QK;
    const size_t rec = 2 * R + R * KN_QK / 2 + (five ? 4 * R : 0);
    const float off = five ? 16.0f : 8.0f;
    const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
    __m512 acc[XR];
    UNROLL for (int i = 0; i < XR; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, o += rec) {
        kn_quant_prefetch(o, rec);
        rows4 r = rows_at(x, xs, b);
        __m512i s[XR];
        if (five) sums4_q5(o + 2 * R, r, s);
        else sums4_q4(o + 2 * R, r, s);
        __m512 dw = scales16(o);
        UNROLL for (int i = 0; i < XR; i++)
            acc[i] = _mm512_fmadd_ps(dw, _mm512_fmsub_ps(_mm512_cvtepi32_ps(s[i]), _mm512_set1_ps(r.a[i]->d),
                                                         _mm512_set1_ps(off * r.a[i]->s)), acc[i]);
    }
    UNROLL for (int i = 0; i < XR; i++) _mm512_storeu_ps(y + i * ldy, acc[i]);
}
static inline void gemm4_x1(const void *packed, int64_t g, int64_t K, const kn_block_q16 *x, int64_t xs, float *y,
                            int64_t ldy, const int five) {
    const int64_t nb = K / KN_QK;
    const size_t rec = 4 * R + R * KN_QK / 2 + (five ? 4 * R : 0);
    const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
    __m512 acc[XR], accm[XR];
    UNROLL for (int i = 0; i < XR; i++) acc[i] = accm[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, o += rec) {
        kn_quant_prefetch(o, rec);
        rows4 r = rows_at(x, xs, b);
        __m512i s[XR];
        if (five) sums4_q5(o + 4 * R, r, s);
        else sums4_q4(o + 4 * R, r, s);
        __m512 dw = scales16(o), mw = scales16(o + 2 * R);
        UNROLL for (int i = 0; i < XR; i++) {
            acc[i] = _mm512_fmadd_ps(_mm512_mul_ps(dw, _mm512_set1_ps(r.a[i]->d)), _mm512_cvtepi32_ps(s[i]), acc[i]);
            accm[i] = _mm512_fmadd_ps(mw, _mm512_set1_ps(r.a[i]->s), accm[i]);
        }
    }
    UNROLL for (int i = 0; i < XR; i++) _mm512_storeu_ps(y + i * ldy, _mm512_add_ps(acc[i], accm[i]));
}
#define GEMM4(name, fn, five) \
    static void name(const void *p, int64_t g, int64_t K, const kn_block_q16 *x, int64_t xs, float *y, int64_t ldy) { \
        fn(p, g, K, x, xs, y, ldy, five); \
    }
GEMM4(gemm4_q4_0, gemm4_x0, 0) GEMM4(gemm4_q5_0, gemm4_x0, 1) GEMM4(gemm4_q4_1, gemm4_x1, 0) GEMM4(gemm4_q5_1, gemm4_x1, 1)
#undef GEMM4
static inline void gemm4_k45(const void *packed, int64_t g, int64_t K, const kn_block_q16 *x, int64_t xs, float *y,
                             int64_t ldy, const int five) {
    const int64_t nb = K / KN_QK_K;
    const size_t part = R * KN_QK / 2 + (five ? 4 * R : 0), rec = 20 * R + 8 * part;
    const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
    __m512 acc[XR];
    UNROLL for (int i = 0; i < XR; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, o += rec) {
        kn_quant_prefetch(o, rec);
        const uint8_t *sc = o + 4 * R, *mn = sc + 8 * R, *q = o + 20 * R;
        __m512 accd[XR], accm[XR];
        UNROLL for (int i = 0; i < XR; i++) accd[i] = accm[i] = _mm512_setzero_ps();
        for (int sub = 0; sub < 8; sub++) {
            rows4 r = rows_at(x, xs, 8 * b + sub);
            __m512i s[XR];
            if (five) sums4_q5(q + sub * part, r, s);
            else sums4_q4(q + sub * part, r, s);
            __m512 scf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + sub * R))));
            __m512 mf = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(mn + sub * R))));
            UNROLL for (int i = 0; i < XR; i++) {
                accd[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i]), _mm512_mul_ps(scf, _mm512_set1_ps(r.a[i]->d)), accd[i]);
                accm[i] = _mm512_fmadd_ps(mf, _mm512_set1_ps(r.a[i]->s), accm[i]);
            }
        }
        UNROLL for (int i = 0; i < XR; i++) {
            acc[i] = _mm512_fmadd_ps(scales16(o), accd[i], acc[i]);
            acc[i] = _mm512_fnmadd_ps(scales16(o + 2 * R), accm[i], acc[i]);
        }
    }
    UNROLL for (int i = 0; i < XR; i++) _mm512_storeu_ps(y + i * ldy, acc[i]);
}
static void gemm4_q4_K(const void *p, int64_t g, int64_t K, const kn_block_q16 *x, int64_t xs, float *y, int64_t ldy) {
    gemm4_k45(p, g, K, x, xs, y, ldy, 0);
}
static void gemm4_q5_K(const void *p, int64_t g, int64_t K, const kn_block_q16 *x, int64_t xs, float *y, int64_t ldy) {
    gemm4_k45(p, g, K, x, xs, y, ldy, 1);
}

static void gemm4_q6_K(const void *packed, int64_t g, int64_t K, const kn_block_q16 *x, int64_t xs, float *y, int64_t ldy) {
    const int64_t nb = K / KN_QK_K;
    const size_t rec = 18 * R + 8 * Q6_PART;
    const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
    __m512 acc[XR];
    UNROLL for (int i = 0; i < XR; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++, o += rec) {
        kn_quant_prefetch(o, rec);
        const uint8_t *sc = o + 2 * R, *q = o + 18 * R;
        __m512 accd[XR];
        UNROLL for (int i = 0; i < XR; i++) accd[i] = _mm512_setzero_ps();
        for (int sub = 0; sub < 8; sub++) {
            rows4 r = rows_at(x, xs, 8 * b + sub);
            const uint8_t *qp = q + sub * Q6_PART;
            __m512i h0 = _mm512_loadu_si512((const void *)(qp + R * KN_QK / 2));
            __m512i h1 = _mm512_loadu_si512((const void *)(qp + R * KN_QK / 2 + 4 * R));
            __m512i s[2 * XR];                /* per row: the low half's sum, the high half's */
            UNROLL for (int i = 0; i < 2 * XR; i++) s[i] = _mm512_setzero_si512();
            __m512i u[2 * XR];                /* the one-row kernel's second chains (odd chunks) */
            UNROLL for (int i = 0; i < 2 * XR; i++) u[i] = _mm512_setzero_si512();
            for (int c = 0; c < 8; c += 2) {           /* even chunks into s, odd ones into u */
                __m512i bq = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(qp + 32 * c)));
                __m512i wl = q6_lo(bq, h0), wh = q6_hi(bq, h1);
                UNROLL for (int i = 0; i < XR; i++) {
                    s[2 * i] = _mm512_dpwssd_epi32(s[2 * i], wl, pair(r.a[i], c));
                    s[2 * i + 1] = _mm512_dpwssd_epi32(s[2 * i + 1], wh, pair(r.a[i], c + 8));
                }
                h0 = _mm512_srli_epi16(h0, 2); h1 = _mm512_srli_epi16(h1, 2);
                bq = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(qp + 32 * c + 32)));
                wl = q6_lo(bq, h0); wh = q6_hi(bq, h1);
                UNROLL for (int i = 0; i < XR; i++) {
                    u[2 * i] = _mm512_dpwssd_epi32(u[2 * i], wl, pair(r.a[i], c + 1));
                    u[2 * i + 1] = _mm512_dpwssd_epi32(u[2 * i + 1], wh, pair(r.a[i], c + 9));
                }
                h0 = _mm512_srli_epi16(h0, 2); h1 = _mm512_srli_epi16(h1, 2);
            }
            __m512 sc0 = scales8(sc + 2 * sub * R), sc1 = scales8(sc + (2 * sub + 1) * R);
            UNROLL for (int i = 0; i < XR; i++) {
                __m512i lo = _mm512_add_epi32(s[2 * i], u[2 * i]), hi = _mm512_add_epi32(s[2 * i + 1], u[2 * i + 1]);
                __m512 t = _mm512_fmadd_ps(sc1, _mm512_cvtepi32_ps(hi), _mm512_mul_ps(sc0, _mm512_cvtepi32_ps(lo)));
                accd[i] = _mm512_fmadd_ps(t, _mm512_set1_ps(r.a[i]->d), accd[i]);
            }
        }
        UNROLL for (int i = 0; i < XR; i++) acc[i] = _mm512_fmadd_ps(scales16(o), accd[i], acc[i]);
    }
    UNROLL for (int i = 0; i < XR; i++) _mm512_storeu_ps(y + i * ldy, acc[i]);
}

kn_qpack_gemm4_fn kn_qpack_avx512_gemm4(kn_dtype t) {
    switch (t) {
    case KN_Q8_0: return gemm4_q8_0;
    case KN_Q4_0: return gemm4_q4_0;
    case KN_Q4_1: return gemm4_q4_1;
    case KN_Q5_0: return gemm4_q5_0;
    case KN_Q5_1: return gemm4_q5_1;
    case KN_Q4_K: return gemm4_q4_K;
    case KN_Q5_K: return gemm4_q5_K;
    case KN_Q6_K: return gemm4_q6_K;
    default: return NULL;
    }
}

/* ---- dequantizing a group into W^T panels (prefill's SGEMM operand) --------
 * A widened chunk holds row r's pair at int16 lanes 2r, 2r + 1; split into
 * the pair's two elements as 16-row vectors, each is one 64-byte store of
 * W^T's row (the element) at the group's 16 columns. Same float steps as the
 * scalar kernel (mul, then add / sub: no fused rounding). */
static inline void split_pairs(__m512i w16, __m512i *e0, __m512i *e1) {
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    __m512i lo = _mm512_cvtepi16_epi32(_mm512_castsi512_si256(w16));         /* rows 0-7 */
    __m512i hi = _mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(w16, 1));   /* rows 8-15 */
    *e0 = _mm512_permutex2var_epi32(lo, even, hi);
    *e1 = _mm512_permutex2var_epi32(lo, odd, hi);
}
/* one Q4 quant part (32 elements) as ints, element e at q32[e] */
static inline void q4_part(const uint8_t *q, __m512i q32[32]) {
    const __m512i m15 = _mm512_set1_epi16(15);
    for (int c = 0; c < 8; c++) {
        __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c)));
        split_pairs(_mm512_and_si512(b, m15), &q32[2 * c], &q32[2 * c + 1]);
        split_pairs(_mm512_srli_epi16(b, 4), &q32[2 * c + 16], &q32[2 * c + 17]);
    }
}
/* one Q5 quant part (nibbles, then the plane) as ints */
static inline void q5_part(const uint8_t *q, __m512i q32[32]) {
    const __m512i m15 = _mm512_set1_epi16(15), b4 = _mm512_set1_epi16(16);
    __m512i h = q5_high(q + R * KN_QK / 2);
    for (int c = 0; c < 8; c++, h = _mm512_srli_epi16(h, 1)) {
        __m512i b = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(q + 32 * c)));
        split_pairs(_mm512_or_si512(_mm512_and_si512(b, m15), _mm512_and_si512(_mm512_slli_epi16(h, 4), b4)),
                    &q32[2 * c], &q32[2 * c + 1]);
        split_pairs(_mm512_or_si512(_mm512_srli_epi16(b, 4), _mm512_and_si512(_mm512_srli_epi16(h, 4), b4)),
                    &q32[2 * c + 16], &q32[2 * c + 17]);
    }
}
static void deq_q8_0(const void *packed, int64_t g, int64_t K, float *out, int64_t ldo) {
    const int64_t nb = K / KN_QK;
    const size_t rec = 2 * R + R * KN_QK;
    const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
    for (int64_t b = 0; b < nb; b++, o += rec) {
        __m512 d = scales16(o);
        for (int c = 0; c < 16; c++) {
            __m512i e0, e1;
            split_pairs(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(o + 2 * R + 32 * c))), &e0, &e1);
            _mm512_storeu_ps(out + (b * 32 + 2 * c) * ldo, _mm512_mul_ps(d, _mm512_cvtepi32_ps(e0)));
            _mm512_storeu_ps(out + (b * 32 + 2 * c + 1) * ldo, _mm512_mul_ps(d, _mm512_cvtepi32_ps(e1)));
        }
    }
}
/* Q4_0 / Q5_0 (quants offset 8 / 16) and Q4_1 / Q5_1 */
static inline void deq_x0(const void *packed, int64_t g, int64_t K, float *out, int64_t ldo, const int five) {
    const int64_t nb = K / KN_QK;
    const size_t rec = 2 * R + R * KN_QK / 2 + (five ? 4 * R : 0);
    const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
    const __m512i off = _mm512_set1_epi32(five ? 16 : 8);
    for (int64_t b = 0; b < nb; b++, o += rec) {
        __m512 d = scales16(o);
        __m512i q[32];
        if (five) q5_part(o + 2 * R, q);
        else q4_part(o + 2 * R, q);
        for (int e = 0; e < 32; e++)
            _mm512_storeu_ps(out + (b * 32 + e) * ldo, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(q[e], off))));
    }
}
static inline void deq_x1(const void *packed, int64_t g, int64_t K, float *out, int64_t ldo, const int five) {
    const int64_t nb = K / KN_QK;
    const size_t rec = 4 * R + R * KN_QK / 2 + (five ? 4 * R : 0);
    const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
    for (int64_t b = 0; b < nb; b++, o += rec) {
        __m512 d = scales16(o), m = scales16(o + 2 * R);
        __m512i q[32];
        if (five) q5_part(o + 4 * R, q);
        else q4_part(o + 4 * R, q);
        for (int e = 0; e < 32; e++)
            _mm512_storeu_ps(out + (b * 32 + e) * ldo, _mm512_add_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(q[e])), m));
    }
}
#define DEQ(name, fn, five) \
    static void name(const void *p, int64_t g, int64_t K, float *out, int64_t ldo) { fn(p, g, K, out, ldo, five); }
DEQ(deq_q4_0, deq_x0, 0) DEQ(deq_q5_0, deq_x0, 1) DEQ(deq_q4_1, deq_x1, 0) DEQ(deq_q5_1, deq_x1, 1)
#undef DEQ
static inline void deq_k45(const void *packed, int64_t g, int64_t K, float *out, int64_t ldo, const int five) {
    const int64_t nb = K / KN_QK_K;
    const size_t part = R * KN_QK / 2 + (five ? 4 * R : 0), rec = 20 * R + 8 * part;
    const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
    for (int64_t b = 0; b < nb; b++, o += rec) {
        __m512 d = scales16(o), dmin = scales16(o + 2 * R);
        const uint8_t *sc = o + 4 * R, *mn = sc + 8 * R;
        for (int sub = 0; sub < 8; sub++) {
            __m512 ds = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(sc + sub * R)))));
            __m512 dm = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(mn + sub * R)))));
            __m512i q[32];
            if (five) q5_part(o + 20 * R + sub * part, q);
            else q4_part(o + 20 * R + sub * part, q);
            for (int e = 0; e < 32; e++)
                _mm512_storeu_ps(out + (b * 256 + sub * 32 + e) * ldo, _mm512_sub_ps(_mm512_mul_ps(ds, _mm512_cvtepi32_ps(q[e])), dm));
        }
    }
}
static void deq_q4_K(const void *p, int64_t g, int64_t K, float *out, int64_t ldo) { deq_k45(p, g, K, out, ldo, 0); }
static void deq_q5_K(const void *p, int64_t g, int64_t K, float *out, int64_t ldo) { deq_k45(p, g, K, out, ldo, 1); }
static void deq_q6_K(const void *packed, int64_t g, int64_t K, float *out, int64_t ldo) {
    const int64_t nb = K / KN_QK_K;
    const size_t rec = 18 * R + 8 * Q6_PART;
    const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
    for (int64_t b = 0; b < nb; b++, o += rec) {
        __m512 d = scales16(o);
        const uint8_t *sc = o + 2 * R;
        for (int sub = 0; sub < 8; sub++) {
            const uint8_t *qp = o + 18 * R + sub * Q6_PART;
            __m512 ds0 = _mm512_mul_ps(d, scales8(sc + 2 * sub * R)), ds1 = _mm512_mul_ps(d, scales8(sc + (2 * sub + 1) * R));
            __m512i h0 = _mm512_loadu_si512((const void *)(qp + R * KN_QK / 2));
            __m512i h1 = _mm512_loadu_si512((const void *)(qp + R * KN_QK / 2 + 4 * R));
            for (int c = 0; c < 8; c++) {
                __m512i bq = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i *)(qp + 32 * c))), e0, e1, e2, e3;
                split_pairs(q6_lo(bq, h0), &e0, &e1);
                split_pairs(q6_hi(bq, h1), &e2, &e3);
                float *w = out + (b * 256 + sub * 32) * ldo;
                _mm512_storeu_ps(w + (2 * c) * ldo, _mm512_mul_ps(ds0, _mm512_cvtepi32_ps(e0)));
                _mm512_storeu_ps(w + (2 * c + 1) * ldo, _mm512_mul_ps(ds0, _mm512_cvtepi32_ps(e1)));
                _mm512_storeu_ps(w + (16 + 2 * c) * ldo, _mm512_mul_ps(ds1, _mm512_cvtepi32_ps(e2)));
                _mm512_storeu_ps(w + (17 + 2 * c) * ldo, _mm512_mul_ps(ds1, _mm512_cvtepi32_ps(e3)));
                h0 = _mm512_srli_epi16(h0, 2); h1 = _mm512_srli_epi16(h1, 2);
            }
        }
    }
}
kn_qpack_dequant_fn kn_qpack_avx512_dequant(kn_dtype t) {
    switch (t) {
    case KN_Q8_0: return deq_q8_0;
    case KN_Q4_0: return deq_q4_0;
    case KN_Q4_1: return deq_q4_1;
    case KN_Q5_0: return deq_q5_0;
    case KN_Q5_1: return deq_q5_1;
    case KN_Q4_K: return deq_q4_K;
    case KN_Q5_K: return deq_q5_K;
    case KN_Q6_K: return deq_q6_K;
    default: return NULL;
    }
}

/* Q6_K: per super-block, each 32-element part's two half sums times their
 * scales, times the activation block's d; then d once */
static void gemv_q6_K(const void *packed, int64_t g0, int64_t g1, int64_t K, const kn_block_q16 *x, float *y) {
    const int64_t nb = K / KN_QK_K;
    const size_t rec = 18 * R + 8 * Q6_PART;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *o = (const uint8_t *)packed + (size_t)(g * nb) * rec;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++, o += rec) {
            kn_quant_prefetch(o, rec);
            const uint8_t *sc = o + 2 * R, *q = o + 18 * R;
            const kn_block_q16 *a = &x[8 * b];
            __m512 accd = _mm512_setzero_ps();
            for (int sub = 0; sub < 8; sub++) {
                __m512i lo, hi;
                sum_q6(q + sub * Q6_PART, &a[sub], &lo, &hi);
                __m512 t = _mm512_fmadd_ps(scales8(sc + (2 * sub + 1) * R), _mm512_cvtepi32_ps(hi),
                                           _mm512_mul_ps(scales8(sc + 2 * sub * R), _mm512_cvtepi32_ps(lo)));
                accd = _mm512_fmadd_ps(t, _mm512_set1_ps(a[sub].d), accd);
            }
            acc = _mm512_fmadd_ps(scales16(o), accd, acc);
        }
        _mm512_storeu_ps(y + (g - g0) * R, acc);
    }
}

kn_qpack_gemv_fn kn_qpack_avx512_gemv(kn_dtype t) {
    switch (t) {
    case KN_Q8_0: return gemv_q8_0;
    case KN_Q4_0: return gemv_q4_0;
    case KN_Q4_1: return gemv_q4_1;
    case KN_Q5_0: return gemv_q5_0;
    case KN_Q5_1: return gemv_q5_1;
    case KN_Q4_K: return gemv_q4_K;
    case KN_Q5_K: return gemv_q5_K;
    case KN_Q6_K: return gemv_q6_K;
    default: return NULL;
    }
}
